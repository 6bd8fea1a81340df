"""Extended resources backed by DRA (KEP-5004, DRAExtendedResource) for fakelet's scheduler.

What kube-scheduler 1.36 does when a pod asks for an extended resource (`resources.requests["example.com/gpu"]`)
that a DeviceClass maps to (the gate is beta and on by default in 1.36; alpha and off in 1.34 and 1.35,
k8s.io/kubernetes pkg/features/kube_features.go):

- a DeviceClass maps its `spec.extendedResourceName`, and always the implicit
  `deviceclass.resource.kubernetes.io/<class name>`; two classes naming the same resource: the newer one wins,
  the lower name on a tie (k8s.io/dynamic-resource-allocation deviceclass/extendedresourcecache
  updateResourceName2class);
- per node (dynamicresources extendeddynamicresources.go filterExtendedResources): a node whose allocatable has
  the resource (a device plugin advertises it) serves it by the device plugin, the noderesources plugin counting
  it; a node with none of it, by DRA when a class maps the resource; neither: the pod does not fit. The KEP adds
  that one node must not have both for one resource name ("either the resource is advertised through
  ResourceSlice, or Node's status.capacity", keps/sig-scheduling/5004-dra-extended-resource);
- for DRA, one claim per pod for all such resources, created in PreBind (createExtendedResourceClaimInAPI):
  generateName `<pod>-extended-resources-`, the pod as its controller owner, the annotation
  `resource.kubernetes.io/extended-resource-claim: "true"`, no config; one ExactCount request per container and
  resource, named `container-<i>-request-<j>` (i: the container's index in initContainers + containers; j: the
  resource's index among the container's request names, sorted), for the container's count
  (createRequestsAndMappings); requests sorted by name;
- the pod's `status.extendedResourceClaimStatus` names the claim and maps each (container, resource) to its
  request (patchPodExtendedResourceClaimStatus). The kubelet prepares that claim like any other (cm/dra
  manager.go PrepareResources) and gives a container the CDI devices of the devices whose request names include
  its mapped requests, or that name no request (claiminfo.go cdiDevicesAsList); its device manager skips a
  resource so mapped (devicemanager manager.go isDRAExtendedResource).

Non-sidecar init containers reuse what later containers request (upstream's shortLived handling) and are
modelled too; pod-level resources are not.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from harness.controlplane.allocator import CONFLICT_RETRIES
from harness.controlplane.base import RESOURCE_API
from harness.controlplane.client import ApiError

ANNOTATION = "resource.kubernetes.io/extended-resource-claim"  # k8s.io/api resource/v1 ExtendedResourceClaimAnnotation
CLASS_PREFIX = "deviceclass.resource.kubernetes.io/"  # k8s.io/api resource/v1 ResourceDeviceClassPrefix
POD_CLAIM_ANNOTATION = "resource.kubernetes.io/pod-claim-name"  # k8s.io/api resource/v1 PodResourceClaimAnnotation
GENERATE_NAME_SUFFIX = "-extended-resources-"  # extendeddynamicresources.go preFilterExtendedResources
REQUEST_NAME = "container-{}-request-{}"  # extendeddynamicresources.go createResourceRequestAndMappings
DEVICE_PLUGIN, DRA = "device plugin", "DRA"

# k8s.io/apimachinery validation IsQualifiedName: [prefix/]name, name 1-63 alphanumerics, '-', '_', '.'
_QUALIFIED_NAME = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def is_extended_resource_name(name: str) -> bool:
    """k8s.io/kubernetes pkg/apis/core/v1/helper IsExtendedResourceName: not native (it has a domain, and not
    kubernetes.io's), and `requests.<name>` a qualified name."""
    if "/" not in name or "kubernetes.io/" in name:
        return False
    prefix, _, short = f"requests.{name}".rpartition("/")
    return (0 < len(prefix) <= 253 and bool(_DNS_SUBDOMAIN.fullmatch(prefix))
            and len(short) <= 63 and bool(_QUALIFIED_NAME.fullmatch(short)))


def is_dra_name(name: str) -> bool:
    """kube-scheduler pkg/scheduler/util IsDRAExtendedResourceName."""
    return is_extended_resource_name(name) or name.startswith(CLASS_PREFIX)


def implicit_name(device_class: str) -> str:
    return CLASS_PREFIX + device_class


def resolve(classes: Iterable[dict[str, Any]], resource: str) -> dict[str, Any] | None:
    """The DeviceClass `resource` maps to (extendedresourcecache GetDeviceClass), or None."""
    best: dict[str, Any] | None = None
    for c in classes:
        meta = c.get("metadata") or {}
        if resource == implicit_name(str(meta.get("name", ""))):
            return c
        if (c.get("spec") or {}).get("extendedResourceName") != resource:
            continue
        if best is None:
            best = c
            continue
        # RFC 3339 timestamps in UTC sort as strings.
        mine, theirs = str(meta.get("creationTimestamp", "")), str(best["metadata"].get("creationTimestamp", ""))
        if mine > theirs or (mine == theirs and meta.get("name", "") < best["metadata"].get("name", "")):
            best = c
    return best


def backing(allocatable: dict[str, Any], resource: str, mapped: bool) -> str | None:
    """Who serves `resource` on a node with this allocatable: DEVICE_PLUGIN, DRA, or None (the pod does not fit)."""
    count = _count(allocatable.get(resource, "0"))
    if mapped and count == 0:
        return DRA
    return DEVICE_PLUGIN if resource in allocatable else None


def _count(value: Any) -> int:
    text = str(value)
    return int(text) if text.isdigit() else 0  # an extended resource is a whole count


def _container_request(index: int, container: dict[str, Any], resource: str, device_class: str,
                       reusable: list[dict[str, Any] | None]) -> tuple[dict[str, Any] | None, list[dict[str, str]]]:
    """createResourceRequestAndMappings."""
    requests = (container.get("resources") or {}).get("requests") or {}
    want = _count(requests.get(resource, "0"))
    if resource not in requests or want == 0:
        return None, []
    mappings = []
    have = 0
    for r in reusable:
        if r is None:
            continue
        have += int(r["exactly"]["count"])
        mappings.append({"containerName": container["name"], "resourceName": resource, "requestName": r["name"]})
        if have >= want:
            return None, mappings
    name = REQUEST_NAME.format(index, sorted(requests).index(resource))
    request = {"name": name, "exactly": {"deviceClassName": device_class, "allocationMode": "ExactCount",
                                         "count": want - have}}
    mappings.append({"containerName": container["name"], "resourceName": resource, "requestName": name})
    return request, mappings


def requests_and_mappings(spec: dict[str, Any], resources: dict[str, str]) \
        -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    """createRequestsAndMappings: the claim's requests and the pod status's requestMappings for `resources`
    (extended resource name -> the class it maps to, the ones served by DRA on the node)."""
    inits = list(spec.get("initContainers") or [])
    containers = inits + list(spec.get("containers") or [])
    short_lived = [i for i, c in enumerate(inits) if c.get("restartPolicy") != "Always"]
    long_lived = [i for i in range(len(containers)) if i not in short_lived]
    requests: list[dict[str, Any]] = []
    mappings: list[dict[str, str]] = []
    for resource in sorted(resources):
        device_class = resources[resource]
        per_container: list[dict[str, Any] | None] = [None] * len(containers)
        long_maps: list[dict[str, str]] = []
        for i in long_lived:
            per_container[i], made = _container_request(i, containers[i], resource, device_class, [])
            long_maps += made
        largest: dict[str, Any] | None = None
        short_names: set[str] = set()
        short_maps: list[dict[str, str]] = []
        for i in short_lived:
            request, made = _container_request(i, containers[i], resource, device_class, per_container[i:])
            if request is not None:
                short_names.add(request["name"])
                if largest is None or largest["exactly"]["count"] < request["exactly"]["count"]:
                    largest = request
            short_maps += made
        if largest is not None and len(short_names) > 1:
            short_names.discard(largest["name"])
            for m in short_maps:
                if m["requestName"] in short_names:
                    m["requestName"] = largest["name"]
        if largest is not None:
            requests.append(largest)
        requests += [r for r in per_container if r is not None]
        mappings += long_maps + short_maps
    return sorted(requests, key=lambda r: r["name"]), mappings


def pod_requests(spec: dict[str, Any]) -> dict[str, int]:
    """The pod's extended resource requests by DRA-capable name: the larger of the containers' sum and any init
    container's (component-helpers resource PodRequests, for whole counts)."""
    total: dict[str, int] = {}
    for c in spec.get("containers") or []:
        for name, value in ((c.get("resources") or {}).get("requests") or {}).items():
            if is_dra_name(name):
                total[name] = total.get(name, 0) + _count(value)
    for c in spec.get("initContainers") or []:
        for name, value in ((c.get("resources") or {}).get("requests") or {}).items():
            if is_dra_name(name):
                total[name] = max(total.get(name, 0), _count(value))
    return {k: v for k, v in total.items() if v}


def claim_body(pod: dict[str, Any], requests: list[dict[str, Any]]) -> dict[str, Any]:
    """The special claim kube-scheduler creates for the pod (preFilterExtendedResources, then Filter's requests)."""
    meta = pod["metadata"]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"generateName": meta["name"] + GENERATE_NAME_SUFFIX, "namespace": meta["namespace"],
                         "annotations": {ANNOTATION: "true"},
                         "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": meta["name"],
                                              "uid": meta["uid"], "controller": True}]},
            "spec": {"devices": {"requests": requests}}}


class NotServedByDRA(RuntimeError):
    """The node serves none of the pod's extended resources by DRA; str(err) says who does."""


def place(client: Any, pod: dict[str, Any], node: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, str]]]:
    """What kube-scheduler's Filter and PreBind do for the pod's extended resources on `node`: the special claim,
    created in the API server (not allocated yet), and the request mappings. NotServedByDRA when the node's
    allocatable serves them all (a device plugin does), ValueError when a resource is neither."""
    classes = client.list(f"{RESOURCE_API}/deviceclasses")
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    by_dra: dict[str, str] = {}
    served: list[str] = []
    for resource in sorted(pod_requests(pod["spec"])):
        found = resolve(classes, resource)
        who = backing(allocatable, resource, found is not None)
        if who is None:
            raise ValueError(f"{resource}: no device plugin on node {node['metadata']['name']} advertises it and "
                             f"no DeviceClass maps it")
        if who == DRA and found is not None:
            by_dra[resource] = found["metadata"]["name"]
        else:
            served.append(f"{resource}: {allocatable.get(resource)} allocatable (a device plugin)")
    if not by_dra:
        raise NotServedByDRA("; ".join(served) or "the pod asks for no extended resource a DeviceClass maps")
    requests, mappings = requests_and_mappings(pod["spec"], by_dra)
    claim = client.create(f"{RESOURCE_API}/namespaces/{pod['metadata']['namespace']}/resourceclaims",
                          claim_body(pod, requests))
    return claim, mappings


def record_status(client: Any, pod: dict[str, Any], claim: dict[str, Any], mappings: list[dict[str, str]]) -> dict:
    """patchPodExtendedResourceClaimStatus: the claim and its request mappings in the pod's status."""
    path = f"/api/v1/namespaces/{pod['metadata']['namespace']}/pods/{pod['metadata']['name']}"
    for attempt in range(CONFLICT_RETRIES):
        current = client.get(path)
        current.setdefault("status", {})["extendedResourceClaimStatus"] = {
            "requestMappings": mappings, "resourceClaimName": claim["metadata"]["name"]}
        try:
            return dict(client.replace_status(path, current))
        except ApiError as err:  # another writer of the pod's status came first: read it again
            if err.status != 409 or attempt == CONFLICT_RETRIES - 1:
                raise
    raise AssertionError("unreachable")  # the loop returns or raises


def container_cdi_ids(status: dict[str, Any], container: str, prepared: list[dict[str, Any]]) -> list[str]:
    """The CDI devices the kubelet gives `container` from the prepared extended-resource claim (its Devices, as
    NodePrepareResources returned them): those of every device whose request names include one of the
    container's mapped requests, or that names none (cm/dra manager.go GetResources, claiminfo.go
    cdiDevicesAsList)."""
    wanted = [m["requestName"] for m in status.get("requestMappings") or [] if m.get("containerName") == container]
    out: list[str] = []
    for request in wanted:
        for d in prepared:
            names = d.get("requests") or []
            if not names or request in names:
                out += list(d.get("cdi_ids") or [])
    return out
