"""What a cluster operator sees, as conditions a scenario waits for or expects.

Each condition reads the node as an operator would: capacity and allocatable,
pod phase, the PodResources answer, allocatedResourcesStatus, the kubelet's
checkpoints, CDI files, the calls and dials the kubelet made. `wait` returns
when all of a step's conditions hold; `throughout` watches them for a span and
stops at the first moment one fails. Both wake on timeline events and are
bounded by their deadline.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from harness.instruments.timeline import Event
from harness.kubelet import checkpoint as dp_checkpoint
from harness.kubelet.podresources import read_pod_resources
from harness.node.fake import FakeNode
from harness.scenarios.outcomes import Inconclusive
from harness.world.cdispecs import defined_devices

if TYPE_CHECKING:
    # The stage as its pod steps see it (Stage is one): conditions look pods up by name.
    from harness.scenarios.pod_steps import PodSteps as Stage

# Events that carry capacity and allocatable as they were at that moment: a "throughout"
# expectation is judged on each of them too, so a change that lasted milliseconds is not missed.
RESOURCE_EVENTS = ("kubelet.devices", "node.status")
PODRESOURCES_TIMEOUT_S = 5.0  # one List and GetAllocatableResources on a local socket


class Conditions:
    def __init__(self, stage: Stage) -> None:
        self.stage, self.env = stage, stage.env

    # -- waiting ------------------------------------------------------------------------------------

    def wait(self, conditions: dict[str, Any], within_s: float) -> tuple[bool, str]:
        """(True, what was seen) as soon as every condition holds; (False, the last sight) after `within_s`."""
        timeline = self.env.timeline
        deadline = time.monotonic() + within_s
        index = len(timeline.events())
        while True:
            ok, seen = self.holds(conditions)
            remaining = deadline - time.monotonic()
            if ok or remaining <= 0:
                return ok, seen
            index += len(timeline.after(index, remaining)[:])

    def throughout(self, conditions: dict[str, Any], span_s: float) -> tuple[bool, str]:
        """(True, ...) when every condition held for all of `span_s`; (False, the breach) at the first that did not."""
        timeline = self.env.timeline
        deadline = time.monotonic() + span_s
        index = len(timeline.events())
        seen = ""
        while True:
            ok, seen = self.holds(conditions)
            if not ok:
                return False, seen
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return True, seen
            new = timeline.after(index, remaining)
            index += len(new)
            for event in new:
                ok, moment = self._at_event(conditions, event)
                if not ok:
                    return False, f"{moment} at {self.env.at(event)}"

    def _at_event(self, conditions: dict[str, Any], event: Event) -> tuple[bool, str]:
        """Capacity and allocatable as a resource event recorded them (the rest is judged live)."""
        if event.kind not in RESOURCE_EVENTS:
            return True, ""
        resource = self.env.spec.resource
        if event.kind == "kubelet.devices":
            if event.get("resource") != resource or event.get("instance") != self._instance():
                return True, ""
            values = {"capacity": event.get("capacity"), "allocatable": event.get("allocatable")}
        else:
            values = dict((event.get("resources") or {}).get(resource) or {})
        for key in ("capacity", "allocatable"):
            if key in conditions and key in values:
                ok, seen = self._count(key, values.get(key) or 0, conditions[key])
                if not ok:
                    return False, seen
        return True, ""

    def _instance(self) -> int | None:
        node = self.env.node
        return node.instance if isinstance(node, FakeNode) else None

    # -- one step's conditions ------------------------------------------------------------------------

    def holds(self, conditions: dict[str, Any]) -> tuple[bool, str]:
        seen = []
        for key, want in conditions.items():
            ok, sight = getattr(self, f"_{key}")(want)
            seen.append(sight)
            if not ok:
                return False, sight
        return True, "; ".join(seen)

    def _not(self, inner: dict[str, Any]) -> tuple[bool, str]:
        ok, seen = self.holds(inner)
        return (not ok), f"not ({seen})"

    def _registered(self, want: Any) -> tuple[bool, str]:
        env, node = self.env, self.env.node
        if not node.running:
            return False, "the kubelet is not running"
        if not isinstance(node, FakeNode) and not self.stage.is_dra:
            capacity = node.capacity(env.spec.resource) or 0
            return capacity > 0, f"the node reports {env.spec.resource} capacity {capacity}"
        # A real kubelet's DRA registrations come from its log, numbered by kubelet instance as the fake's are.
        started = [e for e in env.timeline.events(kind="kubelet.start") if e.get("instance") == node.instance]
        since = started[-1].t_ns if started else 0
        if self.stage.is_dra:
            driver = env.driver  # type: ignore[attr-defined]
            events = [e for e in env.timeline.events(since) if e.kind in ("dra.registered", "dra.deregistered")
                      and e.get("driver") == driver]
            ok = bool(events) and events[-1].kind == "dra.registered"
            return ok, f"driver {driver} {'registered' if ok else 'not registered'} with the running kubelet"
        accepted = [e for e in env.timeline.events(since, "kubelet.register")
                    if e.get("accepted") and e.get("instance") == node.instance]
        return bool(accepted), (f"{len(accepted)} accepted registration(s) with kubelet instance {node.instance}"
                                if accepted else f"no registration with kubelet instance {node.instance}")

    def _capacity(self, want: Any) -> tuple[bool, str]:
        return self._resource("capacity", want)

    def _allocatable(self, want: Any) -> tuple[bool, str]:
        return self._resource("allocatable", want)

    def _resource(self, key: str, want: Any) -> tuple[bool, str]:
        node = self.env.node
        if not node.running:
            return False, f"no {key}: the kubelet is not running"
        got = getattr(node, key)(self.env.spec.resource) or 0
        return self._count(key, got, want)

    def _count(self, what: str, got: int, want: Any) -> tuple[bool, str]:
        op, target = want if isinstance(want, tuple) else _comparison(want)
        n = self._number(target)
        ok = {"equals": got == n, "at_least": got >= n, "at_most": got <= n}[op]
        word = f" ({target})" if isinstance(target, str) else ""
        return ok, f"{what} {got} (wanted {op.replace('_', ' ')} {n}{word})"

    def _number(self, target: Any) -> int:
        if isinstance(target, int):
            return target
        env = self.env
        backend = env.devices
        if target == "healthy" and backend is not None:
            return sum(1 for d in backend.devices() if d.present and d.health == "Healthy")
        if backend is not None:
            return sum(1 for d in backend.devices() if d.present)
        return env.expected_count or len(env.inventory or [])

    def _pod(self, want: dict[str, Any]) -> tuple[bool, str]:
        pod = self.stage._pod(want["name"])
        phase, reason = self._phase(pod)
        ok = want.get("phase", phase) == phase and want.get("reason", "") in reason
        return ok, f"pod {pod.name} {phase}{f' ({reason[:160]})' if reason else ''}"

    def _phase(self, pod: Any) -> tuple[str, str]:
        node = self.env.node
        if not self.stage.is_dra and not isinstance(node, FakeNode) and pod.phase != "Failed":
            return self._real_phase(pod)
        if not self.stage.is_dra or not pod.key:
            return pod.phase, pod.reason
        kinds = {"pod.running": "Running", "pod.sync_failed": "Failed", "pod.deleted": "Deleted",
                 "pod.killing": "Terminating"}
        events = [e for e in self.env.timeline.events() if e.kind in kinds and e.get("pod_uid") == pod.key]
        if not events:
            return pod.phase, pod.reason
        last = events[-1]
        return kinds[last.kind], str(last.get("error") or last.get("reason") or "")

    def _real_phase(self, pod: Any) -> tuple[str, str]:
        """A real node's Pod as the API server last showed it (its `node.pod` events): the kubelet, not
        fakelet, decides whether a running pod is killed after a restart."""
        name = self.env.node.pod_name(pod.key)  # type: ignore[union-attr]
        events = [e for e in self.env.timeline.events(kind="node.pod") if name and e.get("pod") == name]
        if not events:
            return pod.phase, pod.reason
        last = events[-1]
        if last.get("change") == "DELETED":
            return "Deleted", ""
        reason = " ".join(str(x) for x in (last.get("reason"), last.get("message")) if x)
        return str(last.get("phase") or "Pending"), reason

    def _pod_devices(self, want: dict[str, Any]) -> tuple[bool, str]:
        pod = self.stage._pod(want["pod"])
        node = self.env.node
        if not node.running:
            return False, "no PodResources answer: the kubelet is not running"
        devices = [d for ds in self._pod_resources(pod.key).values() for d in ds]
        ok, seen = self._count("devices", len(devices), want["count"])
        return ok, f"PodResources: pod {pod.name} has {seen}"

    def _pod_resources(self, key: str) -> dict[str, list[str]]:
        """The pod's devices as the kubelet's PodResources API answers List (the real node's reads it too)."""
        node = self.env.node
        if not isinstance(node, FakeNode):
            return node.pod_devices(key)
        answer = read_pod_resources(node.pod_resources_socket, PODRESOURCES_TIMEOUT_S)
        out: dict[str, list[str]] = {}
        for pod in answer.get("pods") or []:
            if pod.get("name") != key:
                continue
            for container in pod.get("containers") or []:
                for device in container.get("devices") or []:
                    out.setdefault(device["resource_name"], []).extend(device.get("device_ids") or [])
        return out

    def _resources_status(self, want: dict[str, Any]) -> tuple[bool, str]:
        pod = self.stage._pod(want["pod"])
        node = self.env.node
        if not node.running:
            return False, "no status: the kubelet is not running"
        fake = node if isinstance(node, FakeNode) else None
        if self.stage.is_dra and fake is not None:
            status = fake.claim_resources_status(pod.key)
        elif self.stage.is_dra and pod.api is not None:  # a real node's DRA pod, as the API server shows it
            meta = pod.api["metadata"]
            status = node.allocated_resources_status_of(meta["namespace"], meta["name"])  # type: ignore[union-attr]
        else:
            status = node.allocated_resources_status(pod.key)
        health = [r.get("health") for entries in status.values() for entry in entries
                  for r in (entry.get("resources") or [entry])]
        ok = bool(health) and all(h == want["health"] for h in health)
        return ok, f"allocatedResourcesStatus of {pod.name}: {', '.join(map(str, health)) or 'none'}"

    def _fake_only(self, what: str) -> None:
        """The real kubelet does not show this (its gRPC calls are not on the timeline): no verdict on it."""
        if not isinstance(self.env.node, FakeNode):
            raise Inconclusive(f"{what} cannot be seen on a real kubelet (only the fake kubelet records its calls)")

    def _calls(self, want: dict[str, Any]) -> tuple[bool, str]:
        self._fake_only("the kubelet's calls to the plugin")
        method = want["method"]
        calls = [e for e in self.env.timeline.events(self.stage.began_ns, "grpc.call")
                 if e.source == "kubelet" and e.get("side") == "client"
                 and str(e.get("method", "")).rsplit("/", 1)[-1] == method]
        return self._count(f"{method} calls", len(calls), want["count"])

    def _checkpoint(self, want: dict[str, Any]) -> tuple[bool, str]:
        sandbox = self.env.sandbox
        if "pod" in want:
            pod = self.stage._pod(want["pod"])
            path = sandbox.plugin_dir / dp_checkpoint.CHECKPOINT_NAME
            try:
                entries = dp_checkpoint.read(path, verify=False).entries
            except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
                return self._count("devices in the checkpoint", 0, want["devices"])[0], \
                    f"checkpoint unreadable: {type(err).__name__}"
            node = self.env.node
            uid = pod.key if isinstance(node, FakeNode) else node.pod_uid(pod.key)  # type: ignore[union-attr]
            devices = [d for e in entries if e.pod_uid == uid for d in e.device_ids]
            ok, seen = self._count("devices", len(devices), want["devices"])
            return ok, f"device-manager checkpoint: pod {pod.name} {seen}"
        try:
            claims = self.env.kubelet_claims()  # type: ignore[attr-defined]
        except AssertionError as err:
            raise Inconclusive(str(err)) from None
        except (OSError, ValueError, KeyError, TypeError) as err:
            claims, note = [], f" (unreadable: {type(err).__name__})"
        else:
            note = ""
        results = []
        if "claims" in want:
            results.append(self._count("claims", len(claims), want["claims"]))
        if "devices" in want:
            count = sum(len(devs) for c in claims for devs in c.drivers.values())
            results.append(self._count("devices", count, want["devices"]))
        ok = all(r[0] for r in results)
        return ok, "DRA checkpoint: " + ", ".join(r[1] for r in results) + note

    def _cdi(self, want: dict[str, Any]) -> tuple[bool, str]:
        pod = self.stage._pod(want["pod"])
        if not pod.cdi_ids:
            self.stage.remember_cdi(pod)  # a pod that started after it was made (the kubelet was down)
        ids = [i for ids in pod.cdi_ids.values() for i in ids]
        if not ids:
            return False, f"pod {pod.name}'s claims were prepared with no CDI devices"
        defined = defined_devices(self.env.sandbox.cdi_dir)
        present = [i for i in ids if i in defined]
        ok = bool(present) == want["present"] and (not want["present"] or len(present) == len(ids))
        return ok, f"CDI devices of {pod.name}: {len(present)} of {len(ids)} defined"

    def _dialed(self, want: dict[str, Any]) -> tuple[bool, str]:
        self._fake_only("the sockets the kubelet dialed")
        socket = want["socket"]
        dials = [e for e in self.env.timeline.events(self.stage.began_ns, "kubelet.connect")
                 if str(e.get("endpoint", "")).rsplit("/", 1)[-1] == socket]
        return self._count(f"dials of {socket}", len(dials), want.get("count", {"at_least": 1}))

    def _slices(self, want: dict[str, Any]) -> tuple[bool, str]:
        slices = self.env.slices()  # type: ignore[attr-defined]
        count = sum(len((s.get("spec") or {}).get("devices") or []) for s in slices)
        return self._count("published devices", count, want["devices"])


def _comparison(want: Any) -> tuple[str, Any]:
    if isinstance(want, dict):
        (op, target), = want.items()
        return op, target
    return "equals", want
