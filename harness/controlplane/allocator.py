"""The Allocator plays kube-scheduler's DRA part: it allocates ResourceClaims from ResourceSlices.

It follows the structured-parameters allocator's rules that a conformance
check can observe (k8s.io/dynamic-resource-allocation structured/): devices
come only from complete pools (the newest generation, all resourceSliceCount
slices present) that list each device once, a device allocated to another claim
is not handed out again (but to a request for admin access, which holds none:
harness/controlplane/admin.py), and a device with a NoSchedule or NoExecute taint is
skipped unless the request tolerates it, and a device that consumes shared
counters (partitionable devices) only while its pool's counter sets still hold
them (harness/controlplane/counters.py), and a device that allows multiple
allocations to several claims at once, each a share of its capacity
(harness/controlplane/capacity.py); a device's binding conditions go into its
result, pools without any tried first (harness/controlplane/binding.py). Device classes are matched by driver
only: the harness creates its classes with the one selector
`device.driver == "<driver>"`, and evaluating arbitrary CEL is out of scope.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from harness.controlplane import admin, binding, capacity, counters
from harness.controlplane.base import RESOURCE_API
from harness.controlplane.client import ApiError, KubeClient
from harness.controlplane.taints import TaintRules, TaintRulesUnavailable, rule_matches
from harness.instruments.timeline import Timeline

REQUEST_NAME = "req-0"  # the one request create_claim makes (harness/DRA-CONTRACTS.md)
# k8s.io/api resource/v1 types.go DeviceAllocationMode values
ALLOCATION_EXACT_COUNT = "ExactCount"
ALLOCATION_ALL = "All"
# k8s.io/api resource/v1 types.go DeviceTaintEffect values that keep a device from being allocated
BLOCKING_TAINT_EFFECTS = frozenset({"NoSchedule", "NoExecute"})
NODE_NAME_FIELD = "metadata.name"  # what the scheduler's nodeSelector matchFields name a node by
CLAIM_FINALIZER = "resource.kubernetes.io/delete-protection"  # k8s.io/api resource/v1 Finalizer
CONFLICT_RETRIES = 3  # status writes race other writers of the same claim; re-read and try again


class AllocationError(RuntimeError):
    """The claim cannot be allocated; str(err) is a one-line reason."""



def _allocated_nodes(allocation: dict) -> set[str]:
    """The nodes an allocation's nodeSelector names by metadata.name (as this allocator writes it); none for an
    allocation without one."""
    names: set[str] = set()
    for term in (allocation.get("nodeSelector") or {}).get("nodeSelectorTerms") or []:
        for field in term.get("matchFields") or []:
            if field.get("key") == NODE_NAME_FIELD and field.get("operator") == "In":
                names.update(field.get("values") or [])
    return names


def _listed_twice(slices: list[dict]) -> str | None:
    """The first device name that a pool's slices list more than once (the pool is invalid then), or None."""
    seen: set[str] = set()
    for s in slices:
        for device in s["spec"].get("devices") or []:
            if device.get("name") in seen:
                return str(device.get("name"))
            seen.add(device.get("name"))
    return None


def _meta(obj: dict) -> dict:
    return obj.get("metadata") or {}


def _tolerates(toleration: dict, taint: dict) -> bool:
    # k8s.io/dynamic-resource-allocation resourceclaim/devicetoleration.go ToleratesTaint
    if toleration.get("effect") and toleration.get("effect") != taint.get("effect"):
        return False
    if toleration.get("key") and toleration.get("key") != taint.get("key"):
        return False
    operator = toleration.get("operator") or "Equal"
    if operator == "Equal":
        return (toleration.get("value") or "") == (taint.get("value") or "")
    return operator == "Exists"


def _blocking_taint(taints: list[dict], tolerations: list[dict]) -> dict | None:
    """The first taint that keeps the device out (unknown effects and None are ignored, as upstream)."""
    for taint in taints:
        if taint.get("effect") in BLOCKING_TAINT_EFFECTS and not any(_tolerates(t, taint) for t in tolerations):
            return taint
    return None


class Allocator:
    def __init__(self, client: KubeClient, timeline: Timeline | None = None) -> None:
        self.client, self.timeline = client, timeline
        self._taint_rules: TaintRules | None = None  # probes the served version once

    # -- objects the checks need around a claim ----------------------------------------------

    def _ensure(self, collection: str, body: dict) -> dict:
        try:
            return self.client.create(collection, body)
        except ApiError as err:
            if err.status != 409:
                raise
        return self.client.get(f"{collection}/{_meta(body)['name']}")

    def ensure_namespace(self, name: str) -> None:
        self._ensure("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
        # The ServiceAccount admission plugin refuses pods whose service account does not exist; no
        # service-account controller runs beside a local API server to create "default".
        self._ensure(f"/api/v1/namespaces/{name}/serviceaccounts", {
            "apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default", "namespace": name},
            "automountServiceAccountToken": False})

    def ensure_node(self, name: str) -> dict:
        # Only the object: there is no kubelet behind it, so it never turns Ready.
        return self._ensure("/api/v1/nodes", {
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        })

    def ensure_device_class(self, name: str, driver: str) -> dict:
        path = f"{RESOURCE_API}/deviceclasses"
        spec = {"selectors": [{"cel": {"expression": f'device.driver == "{driver}"'}}]}
        current = self._ensure(path, {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
                                      "metadata": {"name": name}, "spec": spec})
        if current.get("spec", {}).get("selectors") != spec["selectors"]:
            current["spec"] = spec
            current = self.client.replace(f"{path}/{name}", current)
        return current

    def slices(self, driver: str, node: str) -> list[dict]:
        return self.client.list(f"{RESOURCE_API}/resourceslices",
                                field_selector=f"spec.driver={driver},spec.nodeName={node}")

    def create_claim(self, namespace: str, name: str, device_class: str, count: int = 1,
                     capacity_requests: dict[str, str] | None = None, admin_access: bool = False) -> dict:
        """`capacity_requests`: capacity name -> quantity the device must provide (consumable capacity).
        `admin_access`: the request asks for admin access (harness/controlplane/admin.py: its namespace must allow
        it)."""
        exactly: dict[str, Any] = {"deviceClassName": device_class, "allocationMode": ALLOCATION_EXACT_COUNT,
                                   "count": count}
        if admin_access:
            exactly["adminAccess"] = True
        if capacity_requests:
            exactly["capacity"] = {"requests": dict(capacity_requests)}
        return self.client.create(f"{RESOURCE_API}/namespaces/{namespace}/resourceclaims", {
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"devices": {"requests": [{"name": REQUEST_NAME, "exactly": exactly}]}},
        })

    def delete_claim(self, namespace: str, name: str) -> None:
        self.client.delete(f"{RESOURCE_API}/namespaces/{namespace}/resourceclaims/{name}")

    # -- allocation --------------------------------------------------------------------------

    def _complete_pools(self, driver: str, node: str) -> list[tuple[str, list[dict]]]:
        """(pool name, slices of its newest generation) for every complete pool, by name."""
        slices = self.slices(driver, node)
        if not slices:
            raise AllocationError(f"no ResourceSlice of driver {driver} on node {node}")
        by_pool: dict[str, list[dict]] = defaultdict(list)
        for s in slices:
            by_pool[str(s["spec"]["pool"]["name"])].append(s)
        complete, incomplete = [], []
        for pool, members in sorted(by_pool.items()):
            newest = max(int(s["spec"]["pool"].get("generation", 0)) for s in members)
            current = sorted((s for s in members if int(s["spec"]["pool"].get("generation", 0)) == newest),
                             key=lambda s: _meta(s).get("name", ""))
            expected = {int(s["spec"]["pool"].get("resourceSliceCount", 0)) for s in current}
            if len(expected) == 1 and len(current) == expected.pop():
                complete.append((pool, current))
            else:
                counts = "/".join(str(int(s["spec"]["pool"].get("resourceSliceCount", 0))) for s in current)
                incomplete.append(f"pool {pool} generation {newest}: slices say resourceSliceCount={counts}, "
                                  f"found {len(current)}")
        if not complete:
            raise AllocationError(f"no complete pool of driver {driver} on node {node}: {'; '.join(incomplete)}")
        invalid = [f"pool {pool}: device {name} is listed twice" for pool, current in complete
                   if (name := _listed_twice(current)) is not None]
        invalid += [f"pool {pool}: {why}" for pool, current in complete
                    if (why := counters.invalid_reason(current)) is not None]
        if invalid:
            # Measured: kube-scheduler allocates nothing while it sees such a pool, and says "1 invalid resource
            # pools were encountered" (reference-dra's bad-slice mutant, on the local control plane).
            raise AllocationError(f"{len(invalid)} invalid resource pools were encountered: {'; '.join(invalid)}")
        return complete

    def _others(self, except_uid: str, node: str) -> list[tuple[tuple[str, str, str], dict]]:
        """(device, allocation result) of every device other claims hold. A claim this allocator placed on another
        node does not count: the checks sharing one API server are each a node of their own world, and a driver
        that names its pool the same on every node (pydra's) would otherwise find its one device taken by a check
        running beside it."""
        held: list[tuple[tuple[str, str, str], dict]] = []
        for claim in self.client.list(f"{RESOURCE_API}/resourceclaims"):
            if _meta(claim).get("uid") == except_uid:
                continue
            allocation = (claim.get("status") or {}).get("allocation") or {}
            nodes = _allocated_nodes(allocation)
            if nodes and node not in nodes:
                continue
            for r in (allocation.get("devices") or {}).get("results") or []:
                held.append(((r.get("driver", ""), r.get("pool", ""), r.get("device", "")), r))
        return held

    def _rules(self) -> list[dict]:
        """Every DeviceTaintRule (cluster-wide taints, feature gate DRADeviceTaintRules); none where the server
        serves no version of them."""
        if self._taint_rules is None:
            self._taint_rules = TaintRules(self.client)
        try:
            return self.client.list(self._taint_rules.path())
        except TaintRulesUnavailable:
            return []

    def allocate(self, claim: dict, node: str, driver: str, pod: dict, only: set[str] | None = None) -> dict:
        """Allocate `claim` on `node` from `driver`'s devices and reserve it for `pod` {"name", "uid"}. With `only`,
        just from the devices of those names, as a selector matching exactly them would in a cluster."""
        ns, name = _meta(claim)["namespace"], _meta(claim)["name"]
        path = f"{RESOURCE_API}/namespaces/{ns}/resourceclaims/{name}"
        for attempt in range(CONFLICT_RETRIES):
            current = self.client.get(path)
            if CLAIM_FINALIZER not in _meta(current).get("finalizers", []):
                # The scheduler protects a claim it allocates (dynamicresources.go bindClaim): the resource
                # claim controller deallocates it and drops the finalizer once no pod uses it.
                current["metadata"]["finalizers"] = [*_meta(current).get("finalizers", []), CLAIM_FINALIZER]
                try:
                    current = self.client.replace(path, current)
                except ApiError as err:
                    if err.status == 409 and attempt < CONFLICT_RETRIES - 1:
                        continue
                    raise AllocationError(f"claim {ns}/{name}: adding the finalizer failed: {err}") from err
            status = current.setdefault("status", {})
            reservation = {"resource": "pods", "name": pod["name"], "uid": pod["uid"]}
            reserved = status.setdefault("reservedFor", [])
            if not status.get("allocation"):
                # allocationTimestamp when a device has binding conditions (harness/controlplane/binding.py)
                status["allocation"] = binding.stamp(self._allocation(current, node, driver, only))
            if not any(r.get("uid") == pod["uid"] for r in reserved):
                reserved.append(reservation)
            try:
                updated = self.client.replace_status(path, current)
            except ApiError as err:
                if err.status == 409 and attempt < CONFLICT_RETRIES - 1:
                    continue
                raise AllocationError(f"claim {ns}/{name}: writing status.allocation failed: {err}") from err
            results = updated["status"]["allocation"]["devices"]["results"]
            if self.timeline is not None:
                self.timeline.record("api.allocate", "api", claim=f"{ns}/{name}", uid=_meta(updated).get("uid"),
                                     node=node, pod=pod["name"],
                                     devices=[f"{r['pool']}/{r['device']}" for r in results])
            return updated
        raise AssertionError("unreachable")  # the loop returns or raises

    def _allocation(self, claim: dict, node: str, driver: str, only: set[str] | None = None) -> dict[str, Any]:
        ns, name = _meta(claim)["namespace"], _meta(claim)["name"]
        pools = binding.unbound_first(self._complete_pools(driver, node))  # as upstream's GatherPools
        held = admin.ordinary(self._others(_meta(claim).get("uid", ""), node))  # admin access holds nothing
        used = {key for key, r in held if not r.get("shareID")}
        mine: set[tuple[str, str, str]] = set()  # what this claim is given: admin access skips only these
        shares = capacity.CapacityLedger((key, r) for key, r in held if r.get("shareID"))
        rules = self._rules()
        ledgers = {pool: counters.Ledger(pool_slices, {d for drv, p, d in used if drv == driver and p == pool})
                   for pool, pool_slices in pools}
        results: list[dict[str, Any]] = []
        for request in (claim.get("spec") or {}).get("devices", {}).get("requests") or []:
            exactly = request.get("exactly")
            if exactly is None:
                raise AllocationError(f"claim {ns}/{name}: request {request.get('name')} has no 'exactly' "
                                      "(firstAvailable is not supported by fakelet's allocator)")
            mode = exactly.get("allocationMode") or ALLOCATION_EXACT_COUNT
            want = int(exactly.get("count") or 1) if mode == ALLOCATION_EXACT_COUNT else None
            tolerations = exactly.get("tolerations") or []
            wanted = capacity.requested(exactly)
            picked: list[dict[str, Any]] = []
            skipped: list[str] = []
            for pool, pool_slices in pools:
                for s in pool_slices:
                    if counters.is_counter_slice(s):
                        continue  # a slice of counter sets: the allocator reads no devices there
                    for device in s["spec"].get("devices") or []:
                        key = (driver, pool, device["name"])
                        if only is not None and device["name"] not in only:
                            continue
                        if key in (mine if admin.requested(exactly) else used):
                            skipped.append(f"{pool}/{device['name']} (allocated to "
                                           f"{'this' if key in mine else 'another'} claim)")
                            continue
                        taints = [*(device.get("taints") or []),
                                  *(r["spec"]["taint"] for r in rules if rule_matches(r, driver, pool, device["name"]))]
                        taint = _blocking_taint(taints, tolerations)
                        if taint is not None:
                            skipped.append(f"{pool}/{device['name']} (taint {taint.get('key')}="
                                           f"{taint.get('value', '')}:{taint.get('effect')})")
                            continue
                        if want is not None and len(picked) == want:
                            continue
                        # Upstream skips the counters of a multi-allocatable device a share already holds
                        # (allocator_incubating.go allocateDevice skipCounterCheck): they were counted once.
                        counted = capacity.multi_allocatable(device) and shares.holds(key)
                        share = shares.take(key, device, wanted)
                        if isinstance(share, str):
                            skipped.append(f"{pool}/{device['name']} ({share})")
                            continue
                        short = None if counted else ledgers[pool].take(device)
                        if short is not None:
                            shares.release(key, device, share)
                            skipped.append(f"{pool}/{device['name']} ({short})")
                            continue
                        result: dict[str, Any] = {"request": request["name"], "driver": driver, "pool": pool,
                                                  "device": device["name"]}
                        if capacity.multi_allocatable(device):
                            result = capacity.share_result(result, share)
                        result.update(binding.result_fields(device))  # bindingConditions, as upstream
                        if admin.requested(exactly):
                            result["adminAccess"] = True
                        if tolerations:
                            # The eviction controller reads tolerations from the result, not the request
                            # (structured allocator: DeviceRequestAllocationResult.Tolerations).
                            result["tolerations"] = tolerations
                        picked.append(result)
                        if not capacity.multi_allocatable(device):
                            used.add(key)
                            mine.add(key)
            if not picked or (want is not None and len(picked) < want):
                why = f"; skipped {', '.join(skipped)}" if skipped else ""
                raise AllocationError(f"claim {ns}/{name}: request {request['name']} wants "
                                      f"{want if want is not None else 'all'} device(s) of driver {driver} on node "
                                      f"{node}, {len(picked)} available{why}")
            results.extend(picked)
        if not results:
            raise AllocationError(f"claim {ns}/{name} has no device requests")
        return {
            "devices": {"results": results},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                {"key": NODE_NAME_FIELD, "operator": "In", "values": [node]}]}]},
        }
