"""The harness's scheduler for real Pods with ResourceClaims: allocate their claims, reserve, bind.

kube-scheduler's DRA plugin allocates a pod's claims, reserves them for the
pod (`status.reservedFor`) and only then binds the pod to the node. fakelet
does the same in that order, so the kubelet never sees a bound pod whose
claims are not ready, and the resource-claim and device-taint eviction
controllers see exactly the objects a real cluster would have. Pods carry
`schedulerName: fakelet`, so a cluster's own scheduler leaves them alone.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from harness.controlplane.allocator import REQUEST_NAME, AllocationError, Allocator
from harness.controlplane.base import RESOURCE_API
from harness.controlplane.client import ApiError

SCHEDULER_NAME = "fakelet"  # no real scheduler claims pods with this name
PAUSE_IMAGE = "registry.k8s.io/pause:3.10"  # never pulled: the fake kubelet runs no containers
CONTAINER = "main"
TERMINATION_GRACE_S = 1  # the fake containers stop at once; a short grace keeps eviction stories short


@dataclass
class PodClaim:
    """One entry of a pod's spec.resourceClaims: a claim of its own, made for it here."""

    name: str  # the pod-level claim name
    count: int = 1
    tolerations: list[dict[str, Any]] = field(default_factory=list)


def claim_body(namespace: str, name: str, device_class: str, count: int,
               tolerations: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": device_class, "allocationMode": "ExactCount", "count": count}
    if tolerations:
        exactly["tolerations"] = tolerations
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"devices": {"requests": [{"name": REQUEST_NAME, "exactly": exactly}]}}}


def template_body(namespace: str, name: str, device_class: str, count: int,
                  tolerations: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    claim = claim_body(namespace, name, device_class, count, tolerations)
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": namespace}, "spec": {"spec": claim["spec"]}}


def pod_body(namespace: str, name: str, claims: dict[str, str], templates: dict[str, str] | None = None) \
        -> dict[str, Any]:
    """A pod whose one container uses every claim: pod-level claim name -> ResourceClaim name
    (`claims`) or -> ResourceClaimTemplate name (`templates`)."""
    entries = [{"name": k, "resourceClaimName": v} for k, v in claims.items()]
    entries += [{"name": k, "resourceClaimTemplateName": v} for k, v in (templates or {}).items()]
    return {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "schedulerName": SCHEDULER_NAME,
            "terminationGracePeriodSeconds": TERMINATION_GRACE_S,
            "automountServiceAccountToken": False,
            "resourceClaims": entries,
            "containers": [{"name": CONTAINER, "image": PAUSE_IMAGE,
                            "resources": {"claims": [{"name": e["name"]} for e in entries]}}],
        },
    }


class Scheduler:
    """Creates pods with claims of their own and schedules them onto one node."""

    def __init__(self, allocator: Allocator, runnable: Callable[[dict], dict] | None = None) -> None:
        """`runnable` adapts a pod for a node that really runs containers (LocalNode.runnable)."""
        self.allocator = allocator
        self.client = allocator.client
        self.runnable = runnable or (lambda pod: pod)

    def create_pod(self, namespace: str, name: str, device_class: str,
                   claims: list[PodClaim], spec: dict[str, Any] | None = None) -> tuple[dict, list[dict]]:
        """The claims and the (unbound) pod that uses them, created in the API server. `spec` is set in the pod's
        spec last, over what the node made runnable (a scenario's terminationGracePeriodSeconds)."""
        made: dict[str, dict] = {}
        for c in claims:
            body = claim_body(namespace, f"{name}-{c.name}", device_class, c.count, c.tolerations)
            made[c.name] = self.client.create(f"{RESOURCE_API}/namespaces/{namespace}/resourceclaims", body)
        body = self.runnable(pod_body(namespace, name, {k: v["metadata"]["name"] for k, v in made.items()}))
        body["spec"].update(spec or {})
        pod = self.client.create(f"/api/v1/namespaces/{namespace}/pods", body)
        return pod, list(made.values())

    def create_pod_from_template(self, namespace: str, name: str, device_class: str, claim: PodClaim,
                                 timeout_s: float, spec: dict[str, Any] | None = None) -> tuple[dict, list[dict]]:
        """A pod whose claim the resource-claim controller generates from a ResourceClaimTemplate.

        Returns the pod and the generated claim once the controller has recorded it in the pod's
        status.resourceClaimStatuses (a bounded watch); AllocationError when it does not in time."""
        template = f"{name}-{claim.name}"
        self.client.create(f"{RESOURCE_API}/namespaces/{namespace}/resourceclaimtemplates",
                           template_body(namespace, template, device_class, claim.count, claim.tolerations))
        body = self.runnable(pod_body(namespace, name, {}, {claim.name: template}))
        body["spec"].update(spec or {})
        pod = self.client.create(f"/api/v1/namespaces/{namespace}/pods", body)
        generated = self._generated_claim(pod, claim.name, timeout_s)
        return pod, [self.client.get(f"{RESOURCE_API}/namespaces/{namespace}/resourceclaims/{generated}")]

    def _generated_claim(self, pod: dict, pod_claim: str, timeout_s: float) -> str:
        meta = pod["metadata"]
        path = f"/api/v1/namespaces/{meta['namespace']}/pods?fieldSelector=metadata.name={meta['name']}"
        deadline = time.monotonic() + timeout_s
        items, version = self.client.list_with_version(path)
        while True:
            for current in items:
                for status in (current.get("status") or {}).get("resourceClaimStatuses") or []:
                    if status.get("name") == pod_claim and status.get("resourceClaimName"):
                        return str(status["resourceClaimName"])
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AllocationError(f"pod {meta['namespace']}/{meta['name']}: the resource-claim controller "
                                      f"generated no claim for {pod_claim} within {timeout_s:g}s")
            items = []
            for event in self.client.watch(path, version, remaining):
                version = event["object"].get("metadata", {}).get("resourceVersion", version)
                items = [event["object"]]
                break

    def schedule(self, pod: dict, claims: list[dict], node: str, driver: str) -> list[dict]:
        """Allocate and reserve every claim for `pod` on `node`, then bind it. Raises AllocationError."""
        meta = pod["metadata"]
        ref = {"name": meta["name"], "uid": meta["uid"]}
        allocated = [self.allocator.allocate(c, node, driver, ref) for c in claims]
        self.bind(pod, node)
        return allocated

    def bind(self, pod: dict, node: str) -> None:
        meta = pod["metadata"]
        try:
            self.client.create(f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/binding", {
                "apiVersion": "v1", "kind": "Binding",
                "metadata": {"name": meta["name"], "namespace": meta["namespace"], "uid": meta["uid"]},
                "target": {"apiVersion": "v1", "kind": "Node", "name": node},
            })
        except ApiError as err:
            raise AllocationError(f"binding pod {meta['namespace']}/{meta['name']} to node {node} failed: {err}") \
                from err
