"""What a cluster operator sees, as conditions a scenario waits for or expects.

Each condition reads the node as an operator would: capacity and allocatable,
pod phase, the PodResources answer, allocatedResourcesStatus, the kubelet's
checkpoints, CDI files, the calls and dials the kubelet made. `wait` returns
when all of a step's conditions hold; `throughout` watches them for a span and
stops at the first moment one fails. Both wake on timeline events and are
bounded by their deadline.

A state an operator sees (capacity, allocatable, registration, a pod's phase, PodResources, checkpoints,
CDI files, slices) counts only once it has held for one and a half node-status periods (HOLD_S), as the DP-NODE
checks' `wait_held` does: a real kubelet posts node status once a period, so a state that lasted 2 ms
never reaches an operator, and the fake kubelet, which sees every change, is held to the same. A step
that wants the first moment asks for it (`glimpse: true`). Counts of events (`calls`, `dialed`,
`held`) are judged when they are reached: what happened stays happened.

A condition whose read failed (a PodResources call rejected by the kubelet's rate limit or timed out, the API
server not answering) is neither true nor false this time (`Unread`): `not` of it does not hold either, and the
step judges again after UNREAD_RETRY_S. A step that ends on an unread condition has no verdict (inconclusive).

The calls and dials are read off the timeline: the fake kubelet records its side
of the plugin wire, and so does the relay in front of a real kubelet. Where
nobody recorded that wire, `calls` and `dialed` say Inconclusive instead of
counting 0 (`wire_recorded`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import grpc

from harness.controlplane.client import ApiError
from harness.controlplane.taints import BLOCKING, NO_EXECUTE, describe_taint, device_taints, rule_matches
from harness.instruments.dials import DIAL
from harness.instruments.grpcutil import status_of
from harness.instruments.interceptors import method_name
from harness.instruments.timeline import Event
from harness.kubelet import checkpoint as dp_checkpoint
from harness.kubelet.podresources import get_pod_resources, read_pod_resources
from harness.node.fake import FakeNode
from harness.node.real.cluster import NAMESPACE as CLUSTER_NAMESPACE
from harness.node.real.configs import STATE_HOLD_S
from harness.scenarios.outcomes import Inconclusive
from harness.scenarios.vocabulary import TAINT_SOURCES
from harness.world.cdispecs import defined_devices, left_for_claim

if TYPE_CHECKING:
    # The stage as its pod steps see it (Stage is one): conditions look pods up by name.
    from harness.scenarios.pod_steps import PodSteps as Stage

# Events that carry capacity and allocatable as they were at that moment: a "throughout"
# expectation is judged on each of them too, so a change that lasted milliseconds is not missed.
RESOURCE_EVENTS = ("kubelet.devices", "node.status")
HOLD_S = STATE_HOLD_S  # a state counts once it outlasted a node-status period, as in the DP-NODE checks
# Conditions that count events on the timeline: judged when reached, never held (see is_state).
COUNTED = frozenset({"calls", "dialed", "held"})
PODRESOURCES_TIMEOUT_S = 5.0  # one List and GetAllocatableResources on a local socket
# How soon a step judges again after a read failed: no event may come to wake it, and a rate-limited kubelet
# has its burst back within 0.1 s (ratelimit.py).
UNREAD_RETRY_S = 1.0
HTTP_NOT_FOUND = 404
# What reading a condition itself puts on the timeline (the fake PodResources server records each call): no
# reason to judge again, or a condition that reads PodResources would wake itself in a loop until its deadline.
OWN_EVENTS = frozenset({"podresources.call"})
# A kubelet's calls to a plugin as the timeline holds them: unary calls, and streams (ListAndWatch,
# NodeWatchResources) as they are opened.
CALL_EVENTS = ("grpc.call", "grpc.stream_open")
# How a kubelet without the KubeletPodResourcesGet feature gate answers Get (pkg/features/kube_features.go: alpha and
# off by default until 1.34, beta and on from 1.34, GA and locked on from 1.36).
GET_DISABLED = "Get method disabled"


def wire_recorded(env: Any, since_ns: int) -> bool:
    """Whether the kubelet's side of the plugin wire is on the timeline: always for the fake kubelet; for any
    other when its environment says a relay records it (`env.wire_recorded`, set by whoever starts the relay),
    or when the timeline shows such a recording since `since_ns` (a dial, or a call the kubelet made)."""
    if isinstance(env.node, FakeNode) or getattr(env, "wire_recorded", False):
        return True
    return any(e.kind == DIAL or (e.kind in CALL_EVENTS and e.get("side") == "client")
               for e in env.timeline.events(since_ns) if e.source == "kubelet")


def live_endpoints(events: list[Event]) -> set[str]:
    """The endpoints a driver is registered at, from its `dra.registered` and `dra.deregistered` events in order.

    The kubelet keeps one plugin per registration (dra_plugin_manager.go), so a rolling update's old instance
    going away leaves the new one registered: a deregistration removes its own endpoint, never the driver. An
    endpoint has two names on a real node, the driver's (`endpoint`, as the relay records it) and the kubelet's
    (`kubelet_endpoint`; the kubelet's log names that one when it deregisters): either one matches. The fake
    kubelet's `replaced` are endpoints a newer registration on the same socket took over. A deregistration that
    names no endpoint falls back to the count of plugins it left."""
    live: dict[str, set[str]] = {}  # the endpoint as the kubelet sees it -> each of its names

    def names(event: Event) -> set[str]:
        return {str(n) for n in (event.get("endpoint"), event.get("kubelet_endpoint")) if n}

    for event in events:
        if event.kind == "dra.registered":
            gone = set(event.get("replaced") or [])
            live = {k: v for k, v in live.items() if not v & gone}
            live[str(event.get("kubelet_endpoint") or event.get("endpoint") or "")] = names(event)
        elif names(event):
            live = {k: v for k, v in live.items() if not v & names(event)}
        elif not event.get("plugins"):
            live = {}
    return set(live)


class Unread(Exception):
    """A condition could not be read this time: the answer it needed was not had."""


class Conditions:
    def __init__(self, stage: Stage) -> None:
        self.stage, self.env = stage, stage.env
        self.unread = ""  # why the last judgement had no answer; "" when it had one
        self._round: dict[str, Any] | None = None  # what the judgement under way read, shared by its conditions
        # `since: step` counts from here: the step that holds these conditions began.
        self.step_began_ns = getattr(stage, "step_began_ns", stage.began_ns)

    # -- waiting ------------------------------------------------------------------------------------

    def wait(self, conditions: dict[str, Any], within_s: float) -> tuple[bool, str]:
        """(True, what was seen) as soon as every condition holds; (False, the last sight) after `within_s`.

        The first moment counts (a glimpse): `settle` is the wait that asks the states to last."""
        ok, seen, _index = self._reach(conditions, time.monotonic() + within_s)
        return ok, seen

    def settle(self, conditions: dict[str, Any], within_s: float, hold_s: float = HOLD_S) -> tuple[bool, str]:
        """(True, what was seen) once every condition holds and its states (is_state) keep holding for `hold_s`
        from there; (False, the last sight, and the last glimpse if there was one) when that never began
        within `within_s`. As wait_held in suites/dp/test_node.py: the state must be reached within the bound,
        its hold may run past it, and a hold that breaks after the bound is a failure."""
        states = {key: want for key, want in conditions.items() if is_state(key, want)}
        deadline = time.monotonic() + within_s
        glimpse = ""
        while True:
            ok, seen, index = self._reach(conditions, deadline)
            if not ok:
                return False, seen + (f"; {glimpse}" if glimpse else "")
            if not states or hold_s <= 0:
                return True, seen
            began = self.env.timeline.now()
            held, breach, broke_ns = self._throughout(states, hold_s, index)
            if held:
                return True, f"{seen}; held {hold_s:g}s"
            lasted = max((broke_ns or self.env.timeline.now()) - began, 0) / 1e9
            glimpse = (f"it was only glimpsed: {seen} from {self._at_ns(began)}, for {_short(lasted)} "
                       f"(under the {hold_s:g}s it must hold), then {breach}")
            if time.monotonic() >= deadline:
                return False, glimpse

    def throughout(self, conditions: dict[str, Any], span_s: float) -> tuple[bool, str]:
        """(True, ...) when every condition held for all of `span_s`; (False, the breach) at the first that did not."""
        ok, seen, _at = self._throughout(conditions, span_s, len(self.env.timeline.events()))
        return ok, seen

    def _reach(self, conditions: dict[str, Any], deadline: float) -> tuple[bool, str, int]:
        """(ok, sight, the timeline index judged up to) at the first moment every condition holds, or at the
        deadline."""
        index = len(self.env.timeline.events())
        while True:
            ok, seen = self.holds(conditions)
            if ok or deadline - time.monotonic() <= 0:
                return ok, seen, index
            retry = min(deadline, time.monotonic() + UNREAD_RETRY_S) if self.unread else deadline
            index += len(self._changes(index, retry))

    def _throughout(self, conditions: dict[str, Any], span_s: float, index: int) -> tuple[bool, str, int | None]:
        """(held, the last sight or the breach, the breach's timeline time when an event showed it), judging
        the events after `index` too: a change that lasted milliseconds is seen in the event that recorded it."""
        deadline = time.monotonic() + span_s
        seen = ""
        while True:
            ok, seen = self.holds(conditions)
            if not ok:
                return False, seen, None
            if deadline - time.monotonic() <= 0:
                return True, seen, None
            new = self._changes(index, deadline)
            index += len(new)
            for event in new:
                ok, moment = self._at_event(conditions, event)
                if not ok:
                    return False, f"{moment} at {self.env.at(event)}", event.t_ns

    def _at_ns(self, t_ns: int) -> str:
        """A timeline time as the narration writes an event's (`env.at`)."""
        return f"+{(t_ns - self.env.timeline.origin_ns) / 1e9:.3f}s"

    def _changes(self, index: int, deadline: float) -> list[Event]:
        """The events after `index` up to the first that is not one of the conditions' own reads (those
        change nothing; judging again on them would wake itself until the deadline); [] at the deadline."""
        timeline = self.env.timeline
        got: list[Event] = []
        while (remaining := deadline - time.monotonic()) > 0:
            new = timeline.after(index + len(got), remaining)
            got.extend(new)
            if any(e.kind not in OWN_EVENTS for e in new):
                return got
        return []

    def _at_event(self, conditions: dict[str, Any], event: Event) -> tuple[bool, str]:
        """Capacity and allocatable as a resource event recorded them (the rest is judged live)."""
        if event.kind not in RESOURCE_EVENTS:
            return True, ""
        for key in ("capacity", "allocatable"):
            if key not in conditions:
                continue
            resource, want = self._resource_want(conditions[key])
            if event.kind == "kubelet.devices":
                if event.get("resource") != resource or event.get("instance") != self._instance():
                    continue
                values = {"capacity": event.get("capacity"), "allocatable": event.get("allocatable")}
            else:
                values = dict((event.get("resources") or {}).get(resource) or {})
            if key in values:
                ok, seen = self._count(self._resource_word(key, resource), values.get(key) or 0, want)
                if not ok:
                    return False, seen
        return True, ""

    def _resource_want(self, want: Any) -> tuple[str, Any]:
        """(resource, count) of a capacity or allocatable condition: `{resource: R, count: C}` or the subject's
        resource and the count itself."""
        if isinstance(want, dict) and "resource" in want:
            return want["resource"], want["count"]
        return self.env.spec.resource, want

    def _resource_word(self, key: str, resource: str) -> str:
        return key if resource == self.env.spec.resource else f"{key} of {resource}"

    def _instance(self) -> int | None:
        node = self.env.node
        return node.instance if isinstance(node, FakeNode) else None

    # -- one step's conditions ------------------------------------------------------------------------

    def holds(self, conditions: dict[str, Any]) -> tuple[bool, str]:
        """(every condition holds, what was seen); False with `unread` set when one could not be read."""
        self.unread, self._round = "", {}
        try:
            return self._all(conditions)
        except Unread as err:
            self.unread = str(err)
            return False, self.unread
        finally:
            self._round = None

    def _once(self, what: str, read: Callable[[], Any]) -> Any:
        """`read()`, once per judgement: a `not` and its positive judge the same answer, and a kubelet's rate
        limit sees one call."""
        if self._round is None:
            return read()
        if what not in self._round:
            self._round[what] = read()
        return self._round[what]

    def _all(self, conditions: dict[str, Any]) -> tuple[bool, str]:
        seen = []
        for key, want in conditions.items():
            ok, sight = getattr(self, f"_{key}")(want)
            seen.append(sight)
            if not ok:
                return False, sight
        return True, "; ".join(seen)

    def _not(self, inner: dict[str, Any]) -> tuple[bool, str]:
        try:
            ok, seen = self._all(inner)
        except Unread as err:
            raise Unread(f"not ({err})") from None  # unknown either way: not of it does not hold
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
            live = live_endpoints(events)
            ok = bool(live)
            return ok, (f"driver {driver} registered with the running kubelet at {len(live)} endpoint(s)" if ok
                        else f"driver {driver} not registered with the running kubelet")
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
        resource, count = self._resource_want(want)
        what = self._resource_word(key, resource)
        if not node.running:
            return False, f"no {what}: the kubelet is not running"
        got = getattr(node, key)(resource) or 0
        return self._count(what, got, count)

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
        gave_up = f"; its create step: {pod.created}" if pod.created else ""
        return ok, f"pod {pod.name}: {self._phase_words(phase, reason)}{gave_up}"

    def phase_of(self, pod: Any) -> str:
        """The pod's phase as the node reports it, in words (the narration's, and a condition's)."""
        return self._phase_words(*self._phase(pod))

    def _phase_words(self, phase: str, reason: str) -> str:
        if not phase:
            return "on no node (no kubelet holds it)"
        whose = "the fake kubelet reports" if isinstance(self.env.node, FakeNode) else "the node reports"
        return f"phase {phase}{f' ({reason[:160]})' if reason else ''}, as {whose} it"

    def _phase(self, pod: Any) -> tuple[str, str]:
        """(phase, reason) as the node holds it: a real node's Pod as the API server shows it; the fake DRA
        kubelet's pod worker; the fake device-plugin kubelet's own record of the pod."""
        if not isinstance(self.env.node, FakeNode):
            return self._real_phase(pod)
        if not self.stage.is_dra or not pod.key:
            return pod.phase, pod.reason
        kinds = {"pod.running": "Running", "pod.sync_failed": "Failed", "pod.deleted": "Deleted",
                 "pod.killing": "Terminating"}
        events = [e for e in self.env.timeline.events() if e.kind in kinds and e.get("pod_uid") == pod.key]
        if not events:
            return pod.phase, pod.reason
        # Gone from the API server is final, whatever the kubelet still does for the pod: a delete with grace period
        # 0 removes it before the kubelet has stopped it, so its pod.killing comes after.
        gone = [e for e in events if e.kind == "pod.deleted"]
        last = gone[-1] if gone else events[-1]
        return kinds[last.kind], str(last.get("error") or last.get("reason") or "")

    def _real_phase(self, pod: Any) -> tuple[str, str]:
        """A real node's Pod as the API server last showed it (its `node.pod` events): the kubelet, not
        fakelet, decides whether a pod runs, waits or is killed. The reason is the Pod's, else its containers'
        waiting reasons (ContainerCreating, CreateContainerError), as `kubectl get pod` shows them."""
        node: Any = self.env.node
        uid = (pod.key if self.stage.is_dra else node.pod_uid(pod.key)) if pod.key else None
        timeline = self.env.timeline
        shown = [e for e in timeline.events(kind="node.pod") if uid and e.get("pod_uid") == uid]
        if not shown:
            return pod.phase, pod.reason
        last = shown[-1]
        if last.get("change") == "DELETED":
            return "Deleted", ""
        if any(e.get("pod_uid") == uid for e in timeline.events(kind="pod.killing")):
            return "Terminating", ""  # being deleted: its phase stays what it was until the kubelet is done
        waiting = [str(((c.get("state") or {}).get("waiting") or {}).get("reason") or "")
                   for c in last.get("containers") or []]
        reason = " ".join(str(x) for x in (last.get("reason"), last.get("message")) if x) or \
            ", ".join(w for w in waiting if w)
        return str(last.get("phase") or "Pending"), reason

    def _pod_devices(self, want: dict[str, Any]) -> tuple[bool, str]:
        pod = self.stage._pod(want["pod"])
        node = self.env.node
        if not node.running:
            return False, "no PodResources answer: the kubelet is not running"
        # The pod as the kubelet's PodResources API answers List, on either kubelet: every resource's devices.
        found = self._pod_answer(pod, "List", self._pod_resources_socket()) or {}
        count = sum(len(d.get("device_ids") or []) for c in found.get("containers") or []
                    for d in c.get("devices") or [])
        ok, seen = self._count("devices", count, want["count"])
        return ok, f"PodResources: pod {pod.name} has {seen}"

    def _pod_resources_socket(self) -> Any:
        node = self.env.node
        socket = getattr(node, "pod_resources_socket", None)
        if socket is None:
            raise Inconclusive(f"the {type(node).__name__}'s PodResources socket is out of fakelet's reach")
        return socket

    def _pod_resources(self, want: dict[str, Any]) -> tuple[bool, str]:
        """What the kubelet's PodResources API answers now: List or Get for one pod, GetAllocatableResources."""
        node = self.env.node
        if not node.running:
            return False, "no PodResources answer: the kubelet is not running"
        socket = self._pod_resources_socket()
        if "allocatable" in want:
            resource = want["allocatable"]
            answer = self._pod_resources_answer(socket)
            count = sum(len(d["device_ids"]) for d in answer["allocatable"]["devices"]
                        if d["resource_name"] == resource)
            ok, seen = self._count("devices", count, want["devices"])
            return ok, f"PodResources GetAllocatableResources: {resource} {seen}"
        pod = self.stage._pod(want["pod"])
        via = want.get("via", "List")
        resource = want.get("resource") or (self.env.driver if self.stage.is_dra  # type: ignore[attr-defined]
                                            else self.env.spec.resource)
        found = self._pod_answer(pod, via, socket)
        results = []
        if "present" in want:
            results.append(((found is not None) == want["present"],
                            "listed" if found is not None else "not listed" if via == "List" else "not found"))
        if "devices" in want:
            results.append(self._count(f"{resource} devices", _devices_in(found, resource), want["devices"]))
        return all(r[0] for r in results), f"PodResources {via}: pod {pod.name} " + ", ".join(r[1] for r in results)

    def _pod_resources_answer(self, socket: Any) -> dict[str, Any]:
        """List and GetAllocatableResources as the kubelet answers them, read once per judgement (a `not` and
        its positive read the same answer, and keep under the kubelet's rate limit)."""
        try:
            return self._once("pod_resources",  # type: ignore[no-any-return]
                              lambda: read_pod_resources(socket, PODRESOURCES_TIMEOUT_S))
        except grpc.RpcError as err:
            raise Unread(f"PodResources List or GetAllocatableResources failed: {status_of(err)}") from None

    def _pod_answer(self, pod: Any, via: str, socket: Any) -> dict[str, Any] | None:
        """The pod as PodResources answers List or Get for it, or None when it is not there."""
        identity = self._pod_identity(pod)
        if identity is None:
            return None  # never made on the node: no kubelet can list it
        namespace, name = identity
        if via == "List":
            listed = self._pod_resources_answer(socket)["pods"]
            return next((p for p in listed if p["name"] == name and p["namespace"] == namespace), None)
        try:
            return get_pod_resources(socket, namespace, name, PODRESOURCES_TIMEOUT_S)
        except grpc.RpcError as err:
            details = (err.details() if hasattr(err, "details") else "") or ""
            if GET_DISABLED in details:
                raise Inconclusive("PodResources Get is disabled on this kubelet (feature gate KubeletPodResourcesGet, "
                                   "off by default before 1.34): " + details) from None
            if err.code() == grpc.StatusCode.UNKNOWN and details.endswith(" not found"):  # type: ignore[attr-defined]
                return None  # upstream's answer for a pod it does not hold (a plain error, code Unknown)
            raise Unread(f"PodResources Get failed: {status_of(err)}") from None

    def _pod_identity(self, pod: Any) -> tuple[str, str] | None:
        """(namespace, name) of the pod as the kubelet knows it: a DRA pod's API object; on the fake kubelet a
        device-plugin pod's key, with no namespace (its pods are admitted by hand); on a real one, the Pod it
        created in its namespace."""
        if pod.api is not None:
            meta = pod.api["metadata"]
            return str(meta.get("namespace") or ""), str(meta["name"])
        node = self.env.node
        if isinstance(node, FakeNode):
            return ("", pod.key) if pod.key else None
        name = node.pod_name(pod.key) if pod.key else None  # type: ignore[union-attr]
        return (CLUSTER_NAMESPACE, name) if name else None

    def _resources_status(self, want: dict[str, Any]) -> tuple[bool, str]:
        pod = self.stage._pod(want["pod"])
        node = self.env.node
        if not node.running:
            return False, "no status: the kubelet is not running"
        env: Any = self.env
        if self.stage.is_dra and pod.api is not None and getattr(env, "client", None) is not None:
            # What the kubelet posted, as the API server shows it, on either kubelet: the fake one posts when a
            # real one does (a health message that changed a device, a pod sync), never when it is read.
            meta = pod.api["metadata"]
            try:
                got = env.client.get(f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}")
            except ApiError as err:
                return self._status_not_read(pod.name, err)
            status = {c.get("name", ""): c.get("allocatedResourcesStatus") or []
                      for c in (got.get("status") or {}).get("containerStatuses") or []}
        elif self.stage.is_dra:
            return False, f"no status: pod {pod.name} was never made on the node ({pod.created})"
        else:
            try:
                status = node.allocated_resources_status(pod.key)
            except ApiError as err:
                return self._status_not_read(pod.name, err)
        health = [r.get("health") for entries in status.values() for entry in entries
                  for r in (entry.get("resources") or [entry])]
        if not health and self.stage.is_dra and (off := _no_health_status(node)):
            raise Inconclusive(f"resources_status of {pod.name}: {off}")
        ok = bool(health) and all(h == want["health"] for h in health)
        return ok, f"allocatedResourcesStatus of {pod.name}: {', '.join(map(str, health)) or 'none'}"

    @staticmethod
    def _status_not_read(pod: str, err: ApiError) -> tuple[bool, str]:
        """A pod the API server no longer has shows no status; any other error leaves the status unread."""
        if err.status != HTTP_NOT_FOUND:
            raise Unread(f"pod {pod}'s status not read: {err}")
        return False, f"no status: pod {pod} is gone ({err})"

    def _wire(self, what: str) -> None:
        """No verdict on the kubelet's side of the plugin wire where nobody recorded it: a count there would
        be 0 whatever the kubelet did."""
        if not wire_recorded(self.env, self.stage.began_ns):
            raise Inconclusive(f"{what} cannot be seen: the real kubelet's wire was not recorded (no relay "
                               "between it and the plugin, and no dial or call of it on the timeline)")

    def _since(self, want: dict[str, Any]) -> int:
        return self.step_began_ns if want.get("since") == "step" else self.stage.began_ns

    def _calls(self, want: dict[str, Any]) -> tuple[bool, str]:
        self._wire("the kubelet's calls to the plugin")
        # The short name, however the file wrote it ("Allocate", "v1beta1.DevicePlugin/Allocate"): the
        # timeline keeps the short one.
        method = method_name(want["method"])
        calls = [e for e in self.env.timeline.events(self._since(want))
                 if e.kind in CALL_EVENTS and e.source == "kubelet" and e.get("side") == "client"
                 and method_name(str(e.get("method", ""))) == method]
        return self._count(f"{method} calls", len(calls), want["count"])

    def _checkpoint(self, want: dict[str, Any]) -> tuple[bool, str]:
        sandbox = self.env.sandbox
        if "pod" in want:
            pod = self.stage._pod(want["pod"])
            path = sandbox.plugin_dir / dp_checkpoint.CHECKPOINT_NAME
            try:
                entries = dp_checkpoint.read(path, verify=False).entries
            except OSError as err:
                # A file fakelet cannot read is no count of 0: the kubelet may hold entries in it.
                raise Inconclusive(f"the device-manager checkpoint cannot be read from here: {err}") from None
            except (ValueError, KeyError, TypeError, AttributeError) as err:
                # One the kubelet cannot decode either: it goes on without its entries (devicemanager manager.go
                # Start, "Continue after failing to read checkpoint file").
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
        except OSError as err:
            # Missing is an empty checkpoint (kubelet_claims); any other failure to read it says nothing of it.
            raise Inconclusive(f"the kubelet's DRA checkpoint cannot be read from here: {err}") from None
        except (ValueError, KeyError, TypeError) as err:
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
        cdi_dir = self.env.sandbox.cdi_dir
        defined = defined_devices(cdi_dir)
        present = [i for i in ids if i in defined]
        if want["present"]:
            return len(present) == len(ids), f"CDI devices of {pod.name}: {len(present)} of {len(ids)} defined"
        # Gone means the claims' own devices are gone: a device every claim shares (dra-example-driver's
        # `gpu=common`) or a driver's static spec may stay, as DRA-TNT-04 judges it (cdispecs.left_for_claim).
        left = {c: f for uid, claim_ids in pod.cdi_ids.items()
                for c, f in left_for_claim(cdi_dir, uid, claim_ids, defined).items()}
        shared = len(present) - len(left)
        return not left, (f"CDI devices of {pod.name}'s own claims still defined: {len(left)} of {len(ids)}"
                          + (f" ({', '.join(sorted(left))})" if left else "")
                          + (f"; {shared} shared device(s) stay, as they may" if shared else ""))

    def _dialed(self, want: dict[str, Any]) -> tuple[bool, str]:
        self._wire("the sockets the kubelet dialed")
        socket = want["socket"]
        dials = [e for e in self.env.timeline.events(self._since(want), DIAL)
                 if e.source == "kubelet" and socket in (e.get("name"), e.get("socket"))]
        what = f"dials of {socket}"
        if "plugin_instance" in want:
            number = want["plugin_instance"]
            serving = self._plugin_instances()
            dials = [e for e in dials if e.get("plugin_instance", _serving(serving, e.t_ns)) == number]
            what += f" while plugin instance {number} served"
        return self._count(what, len(dials), want.get("count", {"at_least": 1}))

    def _plugin_instances(self) -> list[tuple[int, int, int | None]]:
        """(number, started, exited or None) of each process of the subject, numbered by start from 1 over the
        whole run: a restart is the next number, and so is a rolling update's second instance (its own
        process under the same name)."""
        env = self.env
        mine = [e for e in env.timeline.events() if e.kind in ("process.start", "process.exit") and env.is_mine(e)]
        out: list[tuple[int, int, int | None]] = []
        open_runs: list[tuple[int, Event]] = []
        for event in mine:
            if event.kind == "process.start":
                open_runs.append((len(out) + len(open_runs) + 1, event))
                continue
            # An exit ends the run with its pid (the kind launcher knows none: then its oldest running one).
            pid = event.get("pid")
            match = next((r for r in open_runs if pid is not None and r[1].get("pid") == pid), None)
            match = match or (open_runs[0] if open_runs and pid is None else None)
            if match is not None:
                open_runs.remove(match)
                out.append((match[0], match[1].t_ns, event.t_ns))
        out.extend((number, start.t_ns, None) for number, start in open_runs)
        return sorted(out)

    def _held(self, want: dict[str, Any]) -> tuple[bool, str]:
        """A call `hold` armed, in flight now: received by a kubelet that holds it unanswered."""
        method = want["call"]
        hold = getattr(self.stage, "held_calls", {}).get(method)
        if hold is None:
            raise Inconclusive(f"held: no {method} was armed (hold: {{call: {method}}} first)")
        holding = hold.in_flight()
        if holding is not None:
            return True, f"{method} held in flight by kubelet instance {holding[0]}"
        if hold.released:
            return False, f"{method} released"
        return False, (f"the {method} held ended: {hold.ended()}" if hold.received()
                       else f"no {method} received yet")

    def _published(self) -> list[dict[str, Any]]:
        """The node's ResourceSlices as the API server lists them."""
        try:
            return self._once("slices", self.env.slices)  # type: ignore[attr-defined,no-any-return]
        except ApiError as err:
            raise Unread(f"the node's ResourceSlices not listed: {err}") from None

    def _slices(self, want: dict[str, Any]) -> tuple[bool, str]:
        slices = self._published()
        count = sum(len((s.get("spec") or {}).get("devices") or []) for s in slices)
        return self._count("published devices", count, want["devices"])

    def _device_health(self, want: dict[str, Any]) -> tuple[bool, str]:
        """Each device's health in the kubelet's DRAResourceHealth cache (healthinfo.go getHealthInfo: Unknown once
        absent or timed out), as a pod's allocatedResourcesStatus reads it: the fake kubelet's alone."""
        node = self.env.node
        if not node.running:
            return False, "no device health: the kubelet is not running"
        cache = health_cache_of(node)
        if cache is None:
            raise Inconclusive("device_health reads the kubelet's DRAResourceHealth cache: the fake kubelet's own, "
                               "or the DRA relay's copy from the wire in front of a real one; this node has neither")
        env: Any = self.env
        pools = {d.get("name"): str(((sl.get("spec") or {}).get("pool") or {}).get("name", ""))
                 for sl in self._published() for d in (sl.get("spec") or {}).get("devices") or []}
        seen = []
        for key, health in (("healthy", "Healthy"), ("unhealthy", "Unhealthy")):
            for ref in want.get(key, []):
                device = self.stage.device(ref)  # type: ignore[attr-defined]
                got = cache.get(env.driver, pools.get(device, env.node_name), device).health
                seen.append(f"{device} {got or 'Unknown'}")
                if got != health:
                    earlier = ", ".join(seen[:-1])
                    return False, (f"the kubelet holds {device} {got or 'Unknown'} (wanted {health})"
                                   + (f"; {earlier}" if earlier else ""))
        source = "" if isinstance(node, FakeNode) else " (the relay's copy of the real kubelet's cache)"
        return True, "device health: " + ", ".join(seen) + source

    def _taints(self, want: dict[str, Any]) -> tuple[bool, str]:
        """The taints that keep claims away, on the devices allowed only: the driver's own by default
        (DRA-TNT-01: that device only, NoExecute only when critical), DeviceTaintRules' with from: rules, either
        with from: both (what the scheduler and the eviction controller act on)."""
        source = want.get("from", TAINT_SOURCES[0])
        taints = self._device_taints(source)
        for key, effects in (("only", BLOCKING), ("no_execute", (NO_EXECUTE,))):
            if key not in want:
                continue
            allowed = {self.stage.device(ref) for ref in want[key]}  # type: ignore[attr-defined]
            wrong = sorted(d for d, ts in taints.items()
                           if d not in allowed and any(t.get("effect") in effects for t in ts))
            if wrong:
                shown = "; ".join(f"{d}: {', '.join(_whose_taint(t) for t in taints[d] if t.get('effect') in effects)}"
                                  for d in wrong)
                what = "NoExecute taints" if key == "no_execute" else "taints"
                return False, f"{what} on {shown} (allowed only on {', '.join(sorted(allowed)) or 'none'})"
        tainted = sorted(d for d, ts in taints.items() if any(t.get("effect") in BLOCKING for t in ts))
        whose = {"driver": "the driver's taints", "rules": "DeviceTaintRules' taints",
                 "both": "taints (the driver's and DeviceTaintRules')"}[source]
        return True, f"{whose} on {', '.join(tainted) or 'no device'}"

    def _device_taints(self, source: str) -> dict[str, list[dict[str, Any]]]:
        """Device name -> its taints from `source` (TAINT_SOURCES), each rule's marked with the rule's name. The
        devices are those the driver publishes; a rule selects one by driver, pool and name, as the eviction
        controller matches it."""
        env: Any = self.env
        slices = self._published()
        published = device_taints(slices)
        out = {d: list(ts) if source != "rules" else [] for d, ts in published.items()}
        if source == "driver":
            return out
        if env.taint_rules is None:
            raise Inconclusive("taints from DeviceTaintRules need an API server")
        try:
            rules = env.taint_rules.in_cluster()  # none where no version is served: no rule can exist there
        except ApiError as err:
            raise Unread(f"DeviceTaintRules not listed: {err}") from None
        for sl in slices:
            spec = sl.get("spec") or {}
            driver, pool = spec.get("driver", ""), str((spec.get("pool") or {}).get("name", ""))
            for device in spec.get("devices") or []:
                name = device.get("name", "")
                out[name] += [{**r["spec"]["taint"], "rule": r["metadata"]["name"]} for r in rules
                              if rule_matches(r, driver, pool, name)]
        return out


def _whose_taint(taint: dict[str, Any]) -> str:
    return describe_taint(taint) + (f" (DeviceTaintRule {taint['rule']})" if "rule" in taint else "")


def health_cache_of(node: Any) -> Any:
    """The DRAResourceHealth cache that stands for the kubelet's: the fake kubelet's, or on a real node the one
    the DRA relay keeps from the health streams it carries (the same code, fed the same messages)."""
    if isinstance(node, FakeNode):
        return node.dra.health_cache if node.dra is not None else None
    relay = getattr(getattr(node, "shell", None), "dra_relay", None)
    return relay.health_cache if relay is not None else None


def _no_health_status(node: Any) -> str:
    """Why this kubelet posts no allocatedResourcesStatus for a DRA pod at all, where that is known: the fake
    kubelet's DRA manager without the ResourceHealthStatus gate (kube_features.go: alpha, off by default, until
    1.36; kubelet_pods.go posts the field only with it on). "" where it may post one."""
    dra = node.dra if isinstance(node, FakeNode) else None
    if dra is None or dra.health_services:
        return ""
    return (f"kubelet {node.kubelet_version.name} posts no allocatedResourcesStatus: its ResourceHealthStatus "
            "feature gate is off")


def is_state(key: str, want: Any) -> bool:
    """Whether a condition is a state an operator sees (held for HOLD_S unless a glimpse is asked for) rather
    than a count of events (judged when reached). A `not` is a state when it holds one."""
    if key == "not":
        return isinstance(want, dict) and any(is_state(k, v) for k, v in want.items())
    return key not in COUNTED


def _short(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms" if seconds < 1 else f"{seconds:.2f}s"


def _comparison(want: Any) -> tuple[str, Any]:
    if isinstance(want, dict):
        (op, target), = want.items()
        return op, target
    return "equals", want


def _serving(runs: list[tuple[int, int, int | None]], t_ns: int) -> int | None:
    """The plugin instance that served a socket at `t_ns`: the newest started then and not yet exited (a newer
    instance on the same socket replaced the older one's; on a socket of its own, the kubelet dials the newer
    one once it registers). None when none ran."""
    running = [number for number, start, end in runs if start <= t_ns and (end is None or end > t_ns)]
    return max(running) if running else None


def _devices_in(pod: dict[str, Any] | None, resource: str) -> int:
    """A PodResources pod's devices of `resource`: a device plugin's device IDs of that resource name, and a DRA
    claim's devices of the driver of that name."""
    if pod is None:
        return 0
    count = 0
    for container in pod.get("containers") or []:
        count += sum(len(d.get("device_ids") or []) for d in container.get("devices") or []
                     if d.get("resource_name") == resource)
        count += sum(1 for dyn in container.get("dynamic_resources") or [] for r in dyn.get("claim_resources") or []
                     if r.get("driver_name") == resource)
    return count
