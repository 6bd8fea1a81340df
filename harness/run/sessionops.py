"""A live session's cluster controls: taints and pods, for `fakelet taint` and `fakelet pods`.

They answer on the session's control socket beside the device controls, so an
engineer at `fakelet up` drives the taint-eviction story by hand, one step at a
time, with every step printed by the session as it happens.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from harness.controlplane.allocator import AllocationError
from harness.controlplane.client import ApiError
from harness.controlplane.scheduler import PodClaim
from harness.controlplane.taints import BLOCKING, NO_EXECUTE, TaintRulesUnavailable, device_taints
from harness.world.draenv import DRAEnv

MANUAL_KEY = "fakelet.example.com/manual"  # the taint key of rules made by hand
MAX_PODS = 64  # one `pods create` call; more is a benchmark, not a session
CLUSTER_OPS = ("taint_add", "taint_remove", "pods_create", "pods_list")  # the control socket's ops of this module
MAX_TOLERATION_S = 3600  # as a scenario's taint-eviction story: longer is a soak, and unchecked it reaches the API


def unavailable(env: object) -> dict[str, Callable[[dict[str, Any]], dict[str, Any]]]:
    """What the cluster controls answer in a session that has none, so that `fakelet taint` or `fakelet pods` there
    says why instead of "unknown op 'taint_add'"."""
    why = ("this session has no API server (--control-plane none?)" if isinstance(env, DRAEnv) else
           "taints and pods act on a DRA driver's devices through the API server; this session runs a device plugin")
    return {op: (lambda _request: {"ok": False, "error": why}) for op in CLUSTER_OPS}


class ClusterOps:
    def __init__(self, env: DRAEnv) -> None:
        self.env = env

    def handlers(self) -> dict[str, Callable[[dict[str, Any]], dict[str, Any]]]:
        ops = {"taint_add": self.taint_add, "taint_remove": self.taint_remove, "pods_create": self.pods_create,
               "pods_list": self.pods_list}
        return {name: self._guard(ops[name]) for name in CLUSTER_OPS}

    def _guard(self, op: Callable[[dict[str, Any]], dict[str, Any]]) -> Callable[[dict[str, Any]], dict[str, Any]]:
        def answer(request: dict[str, Any]) -> dict[str, Any]:
            if self.env.client is None:
                return {"ok": False, "error": "this session has no API server (--control-plane none?)"}
            try:
                return op(request)
            except (ApiError, AllocationError, TaintRulesUnavailable, AssertionError) as err:
                return {"ok": False, "error": str(err).splitlines()[0]}
        return answer

    def _pool_of(self, device: str) -> str:
        found = self.env.timeline.find(lambda e: e.kind == "api.slices")
        for s in (found[-1].get("slices") or []) if found else []:
            if any(d.get("name") == device for d in s["spec"].get("devices") or []):
                return str(s["spec"]["pool"]["name"])
        known = sorted(device_taints(found[-1].get("slices") or [])) if found else []
        raise AssertionError(f"no published device {device!r}; the driver publishes: {', '.join(known) or 'none'}")

    def taint_add(self, request: dict[str, Any]) -> dict[str, Any]:
        device, effect = str(request.get("device") or ""), str(request.get("effect") or NO_EXECUTE)
        if effect not in BLOCKING and effect != "None":
            return {"ok": False, "error": f"effect must be one of {', '.join((*BLOCKING, 'None'))}, got {effect!r}"}
        assert self.env.taint_rules is not None
        pool = self._pool_of(device)
        rule = self.env.taint_rules.add(f"{self.env.node_name}-{device}-{effect.lower()}",
                                        {"key": str(request.get("key") or MANUAL_KEY), "effect": effect},
                                        driver=self.env.driver, pool=pool, device=device)
        self.env.timeline.record("fault.taint_added", "harness", device=device, effect=effect,
                                 rule=rule["metadata"]["name"], time_added=rule["spec"]["taint"].get("timeAdded"))
        return {"ok": True, "rule": rule["metadata"]["name"], "timeAdded": rule["spec"]["taint"].get("timeAdded")}

    def taint_remove(self, request: dict[str, Any]) -> dict[str, Any]:
        device = str(request.get("device") or "")
        assert self.env.taint_rules is not None
        mine = [n for n in self.env.taint_rules.created if n.startswith(f"{self.env.node_name}-{device}-")]
        if not mine:
            return {"ok": False, "error": f"no taint rule of this session on {device!r}"}
        for name in mine:
            self.env.taint_rules.remove(name)
        self.env.timeline.record("fault.taint_removed", "harness", device=device, rules=mine)
        return {"ok": True, "removed": mine}

    def pods_create(self, request: dict[str, Any]) -> dict[str, Any]:
        count, tolerate = request.get("count", 1), request.get("toleration_seconds")
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_PODS:
            return {"ok": False, "error": f"count must be 1 to {MAX_PODS}, got {count!r}"}
        if tolerate is not None and (isinstance(tolerate, bool) or not isinstance(tolerate, int)
                                     or not 0 <= tolerate <= MAX_TOLERATION_S):
            return {"ok": False, "error": f"toleration_seconds must be a whole number from 0 to {MAX_TOLERATION_S}, "
                                          f"got {tolerate!r}"}
        tolerations = [{"operator": "Exists", "effect": NO_EXECUTE, "tolerationSeconds": tolerate}] \
            if tolerate is not None else []
        made = []
        for _ in range(count):
            pod, claims = self.env.run_pod([PodClaim("gpu", tolerations=tolerations)], "pod")
            made.append({"pod": pod["metadata"]["name"],
                         "devices": [d for c in claims for _, d in self.env.allocated_devices(c, self.env.driver)]})
        return {"ok": True, "pods": made}

    def pods_list(self, request: dict[str, Any]) -> dict[str, Any]:
        assert self.env.client is not None
        worker = self.env.node.pod_worker
        states = worker.pods() if worker is not None else {}
        pods = self.env.client.list(f"/api/v1/namespaces/{self.env.node_name}/pods")
        return {"ok": True, "pods": [{
            "pod": p["metadata"]["name"], "node": p["spec"].get("nodeName") or "",
            "phase": (p.get("status") or {}).get("phase", ""), "deleting": bool(p["metadata"].get("deletionTimestamp")),
            "kubelet": states.get(p["metadata"]["name"], "")} for p in pods]}
