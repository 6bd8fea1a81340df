"""DRA-EXT: extended resources backed by DRA (KEP-5004, DRAExtendedResource: beta and on by default in 1.36).

A pod that asks for an extended resource (`resources.requests["example.com/gpu"]: 1`, no ResourceClaim) on a node
where no device plugin advertises it is given its devices through DRA: a DeviceClass maps the name (its
`spec.extendedResourceName`, or the implicit `deviceclass.resource.kubernetes.io/<class>`), and kube-scheduler
makes one ResourceClaim for the pod, with requests of its own naming (`container-<i>-request-<j>`), no config,
no ResourceClaimTemplate, the pod as its owner and the annotation `resource.kubernetes.io/extended-resource-claim`,
and records in the pod's `status.extendedResourceClaimStatus` which request is whose. The kubelet prepares that
claim like any other and hands each container the CDI devices of the devices whose request names include its
requests (harness/controlplane/extended.py has the upstream sources). The driver does nothing of its own for
the feature, and that is the contract: it prepares the scheduler's claim as any other, and names each device's
request back, so each container gets the device allocated for it.

fakelet plays the scheduler with upstream's rules (harness/controlplane/extended.py, fakelet's allocator for the
allocation) and calls NodePrepareResources as the kubelet does.

On one node, a resource is served by a device plugin or by DRA, never both: the scheduler sends every request
for it to the device plugin when the node's allocatable has any, and the KEP forbids advertising one name both
ways on one node. What a DRA driver must do beside a device plugin for the same hardware (never publish or
prepare a device the device plugin hands out) is DRA-EXT-02's (suites/dra/test_beside.py).
"""

from __future__ import annotations

from typing import Any

from harness.controlplane import extended
from harness.controlplane.allocator import AllocationError
from harness.controlplane.base import RESOURCE_API
from harness.controlplane.scheduler import PAUSE_IMAGE, SCHEDULER_NAME, TERMINATION_GRACE_S
from harness.spec.checks import MUST, check, expect, not_exercised
from harness.world.cdispecs import edits_of
from harness.world.draenv import DRAEnv, short_id
from suites.dra.common import registered

CHECKS = ("DRA-EXT-01",)
GATE_OFF = ("the API server dropped DeviceClass spec.extendedResourceName: DRAExtendedResource is off there (alpha "
            "and off by default in 1.34 and 1.35, beta and on from 1.36)")


def resource_name(env: DRAEnv) -> str:
    """An extended resource name of this check's own: the API server is shared, and the newest class naming a
    resource wins it."""
    return f"{env.node_name}.fakelet.example.com/gpu"


def mapping_class(env: DRAEnv, name: str) -> dict[str, Any]:
    """The env's DeviceClass, mapping `name` (not exercised when the API server drops the field)."""
    assert env.allocator is not None
    current = env.allocator.ensure_device_class(env.device_class, env.driver)
    current.setdefault("spec", {})["extendedResourceName"] = name
    current = env.need_api().replace(f"{RESOURCE_API}/deviceclasses/{env.device_class}", current)
    if (current.get("spec") or {}).get("extendedResourceName") != name:
        not_exercised(GATE_OFF)
    return current


def pod_asking(env: DRAEnv, asks: list[str]) -> dict[str, Any]:
    """An unscheduled pod with one container per entry of `asks`, each asking for one of that resource (requests
    equal limits, as the API server wants of an extended resource)."""
    name = f"ext-{short_id()}"
    body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": env.node_name},
            "spec": {"schedulerName": SCHEDULER_NAME, "terminationGracePeriodSeconds": TERMINATION_GRACE_S,
                     "automountServiceAccountToken": False,
                     "containers": [{"name": f"c{i}", "image": PAUSE_IMAGE,
                                     "resources": {"requests": {r: "1"}, "limits": {r: "1"}}}
                                    for i, r in enumerate(asks)]}}
    return dict(env.need_api().create(f"/api/v1/namespaces/{env.node_name}/pods", body))


def scheduled(env: DRAEnv, pod: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """What kube-scheduler does for the pod on this node: the special claim, allocated and reserved for the pod,
    and the pod's extendedResourceClaimStatus."""
    client = env.need_api()
    assert env.allocator is not None
    node = client.get(f"/api/v1/nodes/{env.node_name}")
    try:
        claim, mappings = extended.place(client, pod, node)
    except extended.NotServedByDRA as err:
        # The harness's own node has no device plugin: this is fakelet's setup, not the driver's doing.
        raise RuntimeError(f"node {env.node_name} serves the resource by a device plugin: {err}") from None
    meta = pod["metadata"]
    try:
        claim = env.allocator.allocate(claim, env.node_name, env.driver, {"name": meta["name"], "uid": meta["uid"]})
    except AllocationError as err:
        wanted = ", ".join(r["name"] for r in claim["spec"]["devices"]["requests"])
        raise AssertionError(f"expected the driver's ResourceSlices to offer a device for each of the pod's "
                             f"extended resource requests ({wanted}); the scheduler saw: {err}") from None
    status = (extended.record_status(client, pod, claim, mappings).get("status") or {})
    if not status.get("extendedResourceClaimStatus"):
        not_exercised("the API server dropped the pod's status.extendedResourceClaimStatus (DRAExtendedResource off)")
    return claim, status["extendedResourceClaimStatus"]


@check("DRA-EXT-01", MUST, "a pod's extended resource served by DRA: the scheduler's claim is prepared, and each "
                           "container gets the CDI devices of the device allocated for it")
def test_extended_resource_claim_prepared(dra_env: DRAEnv) -> None:
    env = dra_env
    env.need_api()
    registered(env)
    devices = env.wait_allocatable(1).get("devices")
    explicit = resource_name(env)
    mapping_class(env, explicit)
    # Two containers when two devices are published: one asks by the class's extendedResourceName, the other by
    # the implicit name; each gets a request of its own in the one claim.
    asks = [explicit, extended.implicit_name(env.device_class)][:2 if len(devices) >= 2 else 1]
    pod = pod_asking(env, asks)
    claim, status = scheduled(env, pod)
    meta = claim["metadata"]
    requests = [r["name"] for r in claim["spec"]["devices"]["requests"]]
    env.note(f"pod {pod['metadata']['name']} asks for {', '.join(f'{a}: 1' for a in asks)}; the scheduler's claim "
             f"{meta['name']} has requests {', '.join(requests)}")
    uid = meta["uid"]
    result = env.conn().node_prepare([env.claim_ref(claim)], timeout_s=env.profile.dra_call_timeout_s)
    expect(uid in result and not result[uid]["error"],
           f"the scheduler's claim {meta['name']} for the pod's extended resources (requests {', '.join(requests)}, "
           f"no config, annotation {extended.ANNOTATION}: \"true\") prepared", repr(result.get(uid)))
    prepared = result[uid]["devices"]
    results = claim["status"]["allocation"]["devices"]["results"]
    for container in pod["spec"]["containers"]:
        name = container["name"]
        mine = {m["requestName"] for m in status["requestMappings"] if m["containerName"] == name}
        allocated = sorted((r["pool"], r["device"]) for r in results if r["request"] in mine)
        ids = extended.container_cdi_ids(status, name, prepared)
        expect(ids, f"container {name}'s CDI devices: those of the Devices prepared for its request(s) "
                    f"{sorted(mine)} (or naming no request)",
               f"none; the driver named requests {[d.get('requests') for d in prepared]}")
        own = sorted({i for d in prepared if (d["pool"], d["device"]) in allocated for i in d["cdi_ids"]})
        foreign = sorted(set(ids) - set(own))
        expect(not foreign, f"container {name} given only the CDI devices of {['/'.join(a) for a in allocated]}, "
                            f"allocated for its request(s) {sorted(mine)}",
               f"also {foreign}, of devices allocated for another container's requests")
        for i in ids:
            expect(edits_of(env.sandbox.cdi_dir, i), f"a CDI spec in the CDI directory defining {i}", "none")
    env.conn().node_unprepare([env.claim_ref(claim)], timeout_s=env.profile.dra_call_timeout_s)
