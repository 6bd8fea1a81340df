"""The explorer's rules: each a fault or action fakelet already has, as the scenario steps that carry it out.

A rule says when it can run (its model precondition, and what the subject must observe for it to
mean anything), which steps it is (scenario vocabulary, harness/scenarios/vocabulary.py: the
engine carries them out, so a shrunk sequence is a scenario file as it stands), and how it moves
the model. Choices inside a rule (which device, how long an outage) are drawn through `Draw`, so
hypothesis generates and shrinks them with the sequence.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from harness.explore.model import DP, DRA, MAX_PODS, POD_DEVICES, Model, Pod
from harness.spec.profiles import DIAL_TIMEOUT_S, DRA_HEALTH_RETRY_S

T = TypeVar("T")
Draw = Callable[[Sequence[T]], T]  # picks one of the candidates (hypothesis: sampled_from, shrinking to the first)
Steps = list[dict[str, Any]]

# Outages the kubelet-outage rule holds the kubelet down for: one under the bounded-retry mutant's 2 s
# (harness/reference/device_plugin.py BOUNDED_RETRY_S) and one well past it; neither is a sync point.
OUTAGES_S = (1, 8)
# XIDs the device-xid rule raises: 79 (GPU fallen off the bus) is critical; 13 (graphics engine exception) is
# an application XID that NVIDIA's device plugin ignores by default (harness/reference/nvml_source.py
# APPLICATION_XIDS), so a correct plugin keeps the GPU healthy after it.
CRITICAL_XID, APPLICATION_XID = 79, 13
# How long plugin-before-kubelet keeps the kubelet away after the plugin starts: a moment (a plugin that exits
# for want of kubelet.sock has done so), or DP-REG-06's window, longer than the kubelet's 10 s dial timeout
# (harness/spec/profiles.py DIAL_TIMEOUT_S), which plugins copy: one that gives up after it is caught too.
# A fault's duration, not a sync point.
KUBELET_ABSENT_S = (1.0, DIAL_TIMEOUT_S + 2.0)
# The call the kubelet-reject rule has the next kubelet refuse once (scenario step `reject`, the fake kubelet's
# FaultPlan, as DP-REG-07 arms it): the device plugin's registration with the kubelet.
REJECTED_CALL = "Register"
# The key of the DeviceTaintRule the taint-eviction rule writes (suites/dra/test_taints.py EVICT_KEY's kind: the
# harness's own key, which no pod tolerates).
EVICT_KEY = "fakelet.example.com/explore-evict"
# What device-heat draws for a DRA driver: past its limit (hot), or a degree under it (warm: DRA-TNT-01's warning
# temperature, where a driver may taint NoSchedule but never NoExecute).
HOT, WARM = "hot", "warm"
EVICTION = "eviction"  # Context.observes: the node evicts pods from NoExecute-tainted devices
UNDO_WEIGHT = 4
DEFAULT_MAX_STEPS = 8  # rules per example: a kubelet restart amid a flap amid an admission fits; shrinks fast
THERMAL_MARGIN_C = 10.0  # heat this far past the plugin's own limit, cool this far under limit less hysteresis


@dataclass(frozen=True)
class Context:
    """What the rules need to know of the subject: its kind, what it observes, its thermal limit."""

    kind: str
    # health, temperature, hotplug; nvml when the skin offers NVML; eviction for a DRA driver, whose node has
    # kube-controller-manager's device-taint eviction controller (explorer.py takes it away when it runs none)
    observes: frozenset[str]
    thermal: tuple[float, float]  # (threshold, hysteresis) in degrees C, from the subject profile


@dataclass(frozen=True)
class Rule:
    name: str
    what: str
    kinds: tuple[str, ...]
    needs: str | None  # a capability of Context.observes, or None
    enabled: Callable[[Model], bool]
    act: Callable[[Model, Context, Draw[Any]], Steps]  # the steps; moves the model
    undoes: bool = False  # ends a fault (recover, cool, plug, start): drawn more often while it can run

    def weight(self) -> int:
        """How many times it is among the candidates: a fault and its end in one example (fail, then recover
        with the plugin up) is where plugins break, and with every rule drawn alike it came too rarely."""
        return UNDO_WEIGHT if self.undoes else 1

    def applies(self, ctx: Context) -> bool:
        return ctx.kind in self.kinds and (self.needs is None or self.needs in ctx.observes)


def _ref(i: int) -> str:
    return f"@{i}"


def _pick(draw: Draw[int], model: Model, keep: Callable[[Any], bool]) -> int:
    return draw([i for i, d in enumerate(model.devices) if keep(d)])


# -- kubelet ------------------------------------------------------------------------------------------------


def _kubelet_restart(model: Model, ctx: Context, draw: Draw[Any]) -> Steps:
    return [{"kubelet": "restart"}]


def _kubelet_stop(model: Model, ctx: Context, draw: Draw[Any]) -> Steps:
    model.kubelet_up = False
    return [{"kubelet": "stop"}]


def _kubelet_start(model: Model, ctx: Context, draw: Draw[Any]) -> Steps:
    model.kubelet_up = True
    return [{"kubelet": "start"}]


def _kubelet_outage(model: Model, ctx: Context, draw: Draw[Any]) -> Steps:
    return [{"kubelet": "stop"}, {"hold": f"{draw(OUTAGES_S)}s"}, {"kubelet": "start"}]


def _kubelet_rejects(model: Model, ctx: Context, draw: Draw[Any]) -> Steps:
    # A kubelet that starts and refuses the plugin's first Register (a Go kubelet's Register returning an error,
    # gRPC UNKNOWN: not UNAVAILABLE, which would say no kubelet is there), then accepts the next. A correct plugin
    # retries and is registered within T (EXP-DP-REGISTERED, judged against the new kubelet instance only, so an
    # earlier registration cannot stand in for it). Upstream's plugins retry a failed Register; DP-REG-07 also
    # allows exiting non-zero, and the `kubelet: start` that follows starts such a plugin again, as its DaemonSet
    # would (harness/scenarios/wire_steps.py _after_rejection).
    steps: Steps = [] if not model.kubelet_up else [{"kubelet": "stop"}]
    model.kubelet_up = True
    return [*steps, {"reject": {"call": REJECTED_CALL}}, {"kubelet": "start"}]


def _plugin_first(model: Model, ctx: Context, draw: Draw[Any]) -> Steps:
    # The start-up order the boot never takes: the plugin starts while no kubelet runs and kubelet.sock is gone
    # (deleted as a reboot's tmpfs wipe does), and the kubelet comes a while later. DP-REG-06 (MUST): a plugin
    # started before the kubelet registers once kubelet.sock appears. The kubelet stays away one of
    # KUBELET_ABSENT_S: a fault's duration, not a sync point.
    start = "restart" if model.plugin_up else "start"
    model.kubelet_up = model.plugin_up = True
    return [{"kubelet": "stop"}, {"socket": {"delete": "kubelet"}}, {"plugin": start},
            {"hold": f"{draw(KUBELET_ABSENT_S):g}s"}, {"kubelet": "start"}]


# -- plugin -------------------------------------------------------------------------------------------------


def _plugin(op: str, up: bool) -> Callable[[Model, Context, Draw[Any]], Steps]:
    def act(model: Model, ctx: Context, draw: Draw[Any]) -> Steps:
        model.plugin_up = up
        return [{"plugin": op}]

    return act


# -- devices ------------------------------------------------------------------------------------------------


def _lose_pods(model: Model) -> None:
    """A device failed or overheated, maybe under a pod (the model does not know which device a pod got): a
    driver that taints it NoExecute, as DRA-TNT-01 allows, has the pod evicted; one that does not keeps it. Either
    is correct, so nothing about those pods is judged from here on."""
    if model.kind == DRA:
        for pod in model.live_pods():
            pod.lost = True


def _fail(model: Model, ctx: Context, draw: Draw[Any]) -> Steps:
    i = _pick(draw, model, lambda d: d.present and not d.failed)
    model.devices[i].failed, model.devices[i].xid = True, False
    _lose_pods(model)
    return [{"device": {"fail": _ref(i)}}]


def _recover(model: Model, ctx: Context, draw: Draw[Any]) -> Steps:
    i = _pick(draw, model, lambda d: d.failed)
    model.devices[i].failed, model.devices[i].xid = False, False
    return [{"device": {"recover": _ref(i)}}]


def _heat(model: Model, ctx: Context, draw: Draw[Any]) -> Steps:
    i = _pick(draw, model, lambda d: d.present and not d.hot)
    # Device plugins know no warning temperature; a DRA driver may taint a warm device NoSchedule, never NoExecute.
    if ctx.kind == DRA and not model.devices[i].warm and draw((HOT, WARM)) == WARM:
        model.devices[i].warm = True
        return [{"device": {"heat": _ref(i), "to": ctx.thermal[0] - 1}}]
    model.devices[i].hot, model.devices[i].warm = True, False
    _lose_pods(model)
    return [{"device": {"heat": _ref(i), "to": ctx.thermal[0] + THERMAL_MARGIN_C}}]


def _cool(model: Model, ctx: Context, draw: Draw[Any]) -> Steps:
    i = _pick(draw, model, lambda d: d.hot or d.warm)
    model.devices[i].hot = model.devices[i].warm = False
    return [{"device": {"cool": _ref(i), "to": ctx.thermal[0] - ctx.thermal[1] - THERMAL_MARGIN_C}}]


def _unplug(model: Model, ctx: Context, draw: Draw[Any]) -> Steps:
    i = _pick(draw, model, lambda d: d.present)
    model.devices[i].present = False
    return [{"device": {"unplug": _ref(i)}}]


def _plug(model: Model, ctx: Context, draw: Draw[Any]) -> Steps:
    i = _pick(draw, model, lambda d: not d.present)
    model.devices[i].present = True
    return [{"device": {"plug": _ref(i)}}]


def _xid(model: Model, ctx: Context, draw: Draw[Any]) -> Steps:
    i = _pick(draw, model, lambda d: d.present)
    code = draw((APPLICATION_XID, CRITICAL_XID))
    if code == CRITICAL_XID:
        model.devices[i].xid = True
    return [{"device": {"xid": _ref(i), "code": code}}]


# -- pods and claims ----------------------------------------------------------------------------------------


def _pod_admitted(model: Model, ctx: Context, draw: Draw[Any]) -> Steps:
    # Judged only when it must run: the plugin up and a free healthy device whichever devices the kubelet chose.
    # DRA: not while a device is failed or hot either: a claim allocated before its driver's NoExecute taint is
    # published may land on it, and the taint then evicts the pod (correctly).
    runs = model.plugin_up and model.free_healthy() >= POD_DEVICES and not any(d.xid for d in model.devices)
    if ctx.kind == DRA:
        runs = runs and not any(d.present and (d.failed or d.hot) for d in model.devices)
    name = model.new_pod_name()

    model.pods[name] = Pod(name, POD_DEVICES, runs)
    return [{"pod": {"create": name, "devices": POD_DEVICES}}]


def _pod_deleted(model: Model, ctx: Context, draw: Draw[Any]) -> Steps:
    name = draw([p.name for p in model.live_pods()])
    pod = model.pods[name]
    if ctx.kind == DRA and pod.running and not pod.lost:
        pod.deleted = True  # its claims were prepared: they must be unprepared (EXP-DRA-UNPREPARED)
    else:
        del model.pods[name]
    return [{"pod": {"delete": name}}]


def _can_delete(model: Model) -> bool:
    # A DRA pod's deletion waits for the kubelet to unprepare its claims: that needs the kubelet and the driver (a
    # lost pod that was evicted is gone already: the pod step says so and goes on).
    return bool(model.live_pods()) and model.kubelet_up and (model.kind == DP or model.plugin_up)


def _evicted(model: Model, ctx: Context, draw: Draw[Any]) -> Steps:
    # DRA-TNT-02's story as one step: an admin's NoExecute DeviceTaintRule on the device of a running pod that
    # tolerates nothing. kube-controller-manager's device-taint eviction controller deletes the pod; the kubelet
    # unprepares its claim and finishes the deletion (EXP-DRA-EVICTED, EXP-DRA-UNPREPARED). The rule stays for the
    # rest of the example (the env removes it when it closes), so the device stays away from new claims. The rule
    # selects this example's own node's pool and device: no other node (example) is touched.
    name = draw([p.name for p in model.judged_pods()])
    pod = model.pods[name]
    pod.deleted = pod.evicted = True
    model.blocked += 1
    return [{"taint": {"device": f"@pod:{name}", "effect": "NoExecute", "key": EVICT_KEY}}]


def _can_evict(model: Model) -> bool:
    return bool(model.judged_pods()) and model.kubelet_up and model.plugin_up


def _drop_health_stream(model: Model, ctx: Context, draw: Draw[Any]) -> Steps:
    # The kubelet's NodeWatchResources stream ends as a broken connection ends it; the kubelet clears what it held
    # and opens the next stream 5 s later (dra_plugin_manager.go add(): wait.UntilWithContext's period). A correct
    # driver serves the new stream: the devices' health is back within T plus that retry.
    model.grace_s = DRA_HEALTH_RETRY_S
    return [{"kubelet": "drop-health-stream"}]


RULES: dict[str, Rule] = {r.name: r for r in (
    Rule("kubelet-restart", "the kubelet restarts and deletes the plugin sockets", (DP, DRA), None,
         lambda m: m.kubelet_up, _kubelet_restart),
    Rule("kubelet-stop", "the kubelet stops (its sockets stay)", (DP, DRA), None,
         lambda m: m.kubelet_up, _kubelet_stop),
    Rule("kubelet-start", "the kubelet starts again (deleting the plugin sockets)", (DP, DRA), None,
         lambda m: not m.kubelet_up, _kubelet_start, undoes=True),
    Rule("kubelet-outage", "the kubelet is down for a while (1 s or 8 s), then starts", (DP, DRA), None,
         lambda m: m.kubelet_up, _kubelet_outage),
    # Device plugins only: the DRA registration's rejection is another call (NotifyRegistrationStatus).
    Rule("kubelet-reject", "the kubelet (re)starts and rejects the plugin's first Register, then accepts",
         (DP,), None, lambda m: m.plugin_up, _kubelet_rejects),
    # Device plugins only: a DRA driver registers through the kubelet's plugin watcher, not with kubelet.sock.
    Rule("plugin-before-kubelet", "the kubelet stops and kubelet.sock goes; the plugin (re)starts, then the "
         "kubelet (1 s or 12 s later)", (DP,), None, lambda m: m.kubelet_up, _plugin_first),
    Rule("plugin-kill", "the plugin is SIGKILLed and stays down", (DP, DRA), None,
         lambda m: m.plugin_up, _plugin("kill", False)),
    Rule("plugin-stop", "the plugin gets SIGTERM and stays down", (DP, DRA), None,
         lambda m: m.plugin_up, _plugin("stop", False)),
    Rule("plugin-start", "the plugin starts again (its DaemonSet pod)", (DP, DRA), None,
         lambda m: not m.plugin_up, _plugin("start", True), undoes=True),
    Rule("plugin-restart", "the plugin gets SIGTERM and starts again", (DP, DRA), None,
         lambda m: m.plugin_up, _plugin("restart", True)),
    Rule("plugin-crash", "the plugin is SIGKILLed and starts again", (DP, DRA), None,
         lambda m: m.plugin_up, _plugin("crash", True)),
    Rule("device-fail", "a device turns unhealthy", (DP, DRA), "health",
         lambda m: any(d.present and not d.failed for d in m.devices), _fail),
    Rule("device-recover", "a failed device turns healthy again", (DP, DRA), "health",
         lambda m: any(d.failed for d in m.devices), _recover, undoes=True),
    Rule("device-heat", "a device heats past the plugin's limit (DRA: or to a degree under it, warm)", (DP, DRA),
         "temperature",
         lambda m: any(d.present and not d.hot for d in m.devices), _heat),
    Rule("device-cool", "a hot device cools under the plugin's limit less its hysteresis", (DP, DRA), "temperature",
         lambda m: any(d.hot or d.warm for d in m.devices), _cool, undoes=True),
    Rule("device-unplug", "a device is unplugged", (DP, DRA), "hotplug",
         lambda m: sum(d.present for d in m.devices) > 1, _unplug),
    Rule("device-plug", "an unplugged device is plugged in again", (DP, DRA), "hotplug",
         lambda m: any(not d.present for d in m.devices), _plug, undoes=True),
    Rule("device-xid", "an NVML XID event on a GPU: critical (79) or an application one (13)", (DP,), "nvml",
         lambda m: any(d.present for d in m.devices), _xid),
    Rule("pod-admitted", "a pod asking for one device is admitted (device plugins: Allocate; DRA: its claim "
         "prepared)", (DP, DRA), None,
         lambda m: m.kubelet_up and len(m.live_pods()) < MAX_PODS, _pod_admitted),
    Rule("pod-deleted", "a pod is deleted (DRA: its claim unprepared)", (DP, DRA), None, _can_delete, _pod_deleted),
    Rule("health-stream-drop", "the kubelet's NodeWatchResources stream to the driver drops; the kubelet re-opens "
         "it 5 s later", (DRA,), "health", lambda m: m.kubelet_up and m.plugin_up, _drop_health_stream),
    Rule("taint-eviction", "an admin's NoExecute DeviceTaintRule on a running pod's device: the pod is evicted and "
         "its claim unprepared", (DRA,), EVICTION, _can_evict, _evicted),
)}


def applicable(ctx: Context, chosen: Sequence[str] | None = None) -> list[Rule]:
    """The rules that mean something for this subject, or the `chosen` ones (every name must exist and apply)."""
    if chosen is None:
        return [r for r in RULES.values() if r.applies(ctx)]
    unknown = [n for n in chosen if n not in RULES]
    if unknown:
        raise ValueError(f"--rules: unknown rule(s) {', '.join(unknown)}; known: {', '.join(RULES)}")
    idle = [n for n in chosen if not RULES[n].applies(ctx)]
    if idle:
        why = "; ".join(f"{n} needs a {'/'.join(RULES[n].kinds)} subject"
                        + (f" that observes {RULES[n].needs}" if RULES[n].needs else "") for n in idle)
        raise ValueError(f"--rules: not for this subject: {why}")
    return [RULES[n] for n in dict.fromkeys(chosen)]


def context_of(spec: Any) -> Context:
    """The rules' view of a subject profile (harness/spec/subjects.py SubjectSpec)."""
    observes = set(spec.observes) if spec.backend else set()
    if spec.backend and spec.backend.get("skin") == "nvml":
        observes.add("nvml")
    if spec.is_dra:
        observes.add(EVICTION)
    return Context(DRA if spec.is_dra else DP, frozenset(observes), tuple(spec.thermal))  # type: ignore[arg-type]
