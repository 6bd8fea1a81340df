"""The step vocabulary of scenario files: what each action and condition accepts.

This module only says what is well formed (the loader calls `check_step`, so a
typo is an error with its line before anything starts); harness/scenarios/stage.py
carries the steps out. The reference for people is `fakelet scenario vocabulary`
(harness/scenarios/manual.py), generated from the tables below (ACTIONS, the ops,
CONDITION_SHAPES, ...); what follows is a summary for readers of this code.

Actions:
  kubelet: start | stop | restart | restart-keep-sockets | reboot   [checkpoint: lost | corrupt]
           | drop-health-stream   (DRA, fake kubelet: its NodeWatchResources stream to the driver ends as a
             broken connection ends it; the kubelet opens the next one 5 s later, dra_plugin_manager.go add())
  plugin:  start | stop | kill | restart | crash | rolling-update [args: [ARG, ...]]
           (rolling-update: a second instance, its command plus args, registers before the first stops; the
            reference DRA driver's args: [--pod-uid, UID] give it sockets of its own, <driver>-UID-reg.sock and
            dra-UID.sock, as upstream kubeletplugin.RollingUpdate does;
            kill and crash take during: CALL, e.g. Allocate: SIGKILL as the kubelet sends that call; a
            plugin that answers within microseconds may get its answer out first, then its next call fails)
  pod:     {create: NAME, devices: N} | {delete: NAME}     (a DRA pod gets one claim for N devices)
  device:  {fail|recover|unplug|plug: DEV} | {heat|cool: DEV, to: C} | {ecc: DEV, count: N} | {xid: DEV, code: N}
           | {nvml-init-error: CODE} | {nvml-wait-error: CODE}      (NVML return codes; 0 works again)
  script:  {flap: DEV, period: S, cycles: N} | {ramp: DEV, from: C, to: C, step: C, period: S}
           | {unplug-replug: DEV, down: S} | {ecc-burst: DEV, count: N, period: S}
  taint:   {device: DEV, effect: NoExecute | NoSchedule, key: K}     (DRA: a DeviceTaintRule)
  untaint: {device: DEV}
  hold:    S          (a fault's duration, e.g. the kubelet stays down 5 s; never a sync point)
  hold:    {call: Register}   (device plugins) the kubelet holds the next Register it receives in flight,
                      unanswered: the running kubelet's, or, if none runs or it gets none, the next one started.
                      It stays held until `release` or until the kubelet holding it stops (a kubelet restart
                      while Register is being answered). `wait: {held: {call: Register}}` waits for it.
  release: {call: Register}   the held call goes on and the kubelet answers it (a no-op, narrated, when the
                      kubelet that held it has stopped since: the call ended with it)
  reject:  {call: Register}   (device plugins) the kubelet rejects the next Register it receives with an error, as
                      a kubelet that refuses a registration does: the running kubelet's, or, if none runs, the
                      first one the next kubelet started receives (that start then waits for the rejection
                      and the plugin's reaction, and starts a plugin that exited non-zero again: its DaemonSet)
  socket:  {delete: kubelet | plugin | NAME}   (device plugins) a manual `rm` of a socket in the device-plugins
                      directory: kubelet (kubelet.sock, the kubelet's), plugin (the socket the plugin last
                      registered as its endpoint), or NAME (a socket file name there). The servers keep running
                      on the deleted path, as after a real rm; on the real node the kubelet's and the plugin's
                      directories are joined by the relay, which mirrors the deletion to the other side.
  wait:    CONDITIONS [within: S] [glimpse: true]   a precondition: if it never holds, the run is inconclusive
  expect:  CONDITIONS [within: S | throughout: S] [glimpse: true]
                      the correct behaviour: if it fails, the bug reproduced
  story:   taint-eviction  [toleration_seconds: N]
  check:   CHECK-ID        run that conformance check on its own environment; its failure is the symptom

DEV is an inventory device ID, `@N` (the subject's N-th inventory device) or `@pod:NAME`
(the device the kubelet gave pod NAME).

Held, not glimpsed. The conditions are of two kinds:
  states   registered, capacity, allocatable, pod, pod_devices, pod_resources, resources_status, checkpoint,
           cdi, slices (and a `not` that holds one of them): what the node shows. A wait or expect is met
           once every condition holds and its states then keep holding for 1.5 node-status periods (1.5 s,
           harness/node/real/configs.py STATE_HOLD_S: a real kubelet posts node status once a period, so a
           state that lasted milliseconds never reaches an operator; the fake kubelet, which sees every
           change, is held to the same, as the DP-NODE checks are). Capacity and allocatable are judged at
           every change the kubelet records during that period, so a change that lasted 1 ms breaks it. The
           state must begin within the step's bound; its hold may run past it. `glimpse: true` takes the
           first moment every condition holds instead (a state that only flickers, on purpose).
  counts   calls, dialed, held: events on the timeline, judged when the count is reached (what happened
           stays happened), never held.
  `throughout: S` holds every condition, counts too, for S instead of the hold.
Each state is judged on what the node shows when it is judged; calls and dialed count timeline events from
the scenario's start (or with `since: step`, from the start of the wait or expect step that holds them):
  registered: true                 the plugin registered with the running kubelet
  capacity / allocatable: COUNT    COUNT = N | all | healthy | {equals|at_least|at_most: N | all | healthy}
                                   (all, healthy: the subject's devices present, healthy)
  capacity / allocatable: {resource: R, count: N | {equals|at_least|at_most: N}}
                                   the same for extended resource R (any resource the node reports)
  pod: {name: NAME, phase: Running | Failed | Pending | Terminating | Deleted, reason: TEXT}
  pod_devices: {pod: NAME, count: COUNT}      what the PodResources API answers for the pod (every resource)
  pod_resources: {pod: NAME, [resource: R], [devices: COUNT], [present: true | false], [via: List | Get]}
                   the kubelet's PodResources answer for the pod (List, or Get for it alone): whether it is
                   there (Get: not "not found") and its devices of R (default: the subject's resource, or
                   a DRA driver's name: its claims' devices); at least one of devices and present
  pod_resources: {allocatable: R, devices: COUNT}   GetAllocatableResources: the node's devices of R
  resources_status: {pod: NAME, health: Healthy | Unhealthy | Unknown}   the pod's allocatedResourcesStatus
  calls: {method: NAME, count: COUNT, [since: scenario | step]}
                   the kubelet's calls to the plugin of that method (Allocate, ListAndWatch, GetInfo, ...;
                   a stream counts once, as it is opened), whatever their outcome
  checkpoint: {pod: NAME, devices: COUNT} | {claims: COUNT, devices: COUNT}   the kubelet's checkpoint (DP, DRA)
  cdi: {pod: NAME, present: true | false}      the CDI spec files of the pod's claims (false: the claims' own
                   devices are gone; a device every claim shares may stay)
  dialed: {socket: NAME, [count: COUNT], [plugin_instance: N], [since: scenario | step]}
                   the kubelet's dials of that socket (its file name, or its whole path), whatever their
                   outcome (count defaults to at_least 1); with plugin_instance, only those made while the
                   subject's N-th process (numbered by start over the run, from 1: a restart is the next
                   number, so is a rolling update's new instance) served it: the newest of its processes
                   running at that moment
  slices: {devices: COUNT}                     the driver's published devices
  taints: {[only: [DEV, ...]], [no_execute: [DEV, ...]]}
                   the taints the driver publishes in its ResourceSlices that keep claims away (NoSchedule,
                   NoExecute) are on those devices only; NoExecute ones on those of no_execute only
  device_health: {[healthy: [DEV, ...]], [unhealthy: [DEV, ...]]}
                   (fake kubelet) each device's health as the kubelet holds it from DRAResourceHealth, what
                   the allocatedResourcesStatus of a pod on it reads (Unknown once its health timed out)
  held: {call: Register}                       (device plugins) a call that `hold` armed is in flight now, held
                                               unanswered by the kubelet (not yet released, its kubelet running)
  not: CONDITIONS                              holds when those do not all hold
calls and dialed read the kubelet's side of the plugin wire: the fake kubelet records it, and so does the
relay in front of a real kubelet; without one they are inconclusive, never 0.
"""

from __future__ import annotations

import re
from typing import Any

from fake_devices.backend import MAX_ECC_BURST, MAX_XID, TEMPERATURE_RANGE_C
from harness.scenarios.step import Step

ACTIONS = ("kubelet", "plugin", "pod", "device", "script", "taint", "untaint", "hold", "release", "reject", "socket",
           "wait", "expect", "story", "check")
KUBELET_OPS = ("start", "stop", "restart", "restart-keep-sockets", "reboot", "drop-health-stream")
DRA_KUBELET_OPS = ("drop-health-stream",)  # the kubelet's NodeWatchResources stream to a DRA driver
CHECKPOINT_FAULTS = ("lost", "corrupt")
PLUGIN_OPS = ("start", "stop", "kill", "restart", "crash", "rolling-update")
# The unary calls a kubelet makes to a plugin: `kill`/`crash` `during:` one of them.
PLUGIN_CALLS = ("GetDevicePluginOptions", "GetPreferredAllocation", "Allocate", "PreStartContainer",
                "NodePrepareResources", "NodeUnprepareResources")
DEVICE_OPS = ("fail", "recover", "unplug", "plug", "heat", "cool", "ecc", "xid", "nvml-init-error", "nvml-wait-error")
DEVICE_VALUE = {"heat": "to", "cool": "to", "ecc": "count", "xid": "code"}  # the op's second key
NVML_CONTROLS = ("nvml-init-error", "nvml-wait-error")  # the value is the NVML return code (0: works again)
SCRIPTS = {"flap": ("period", "cycles"), "ramp": ("from", "to", "step", "period"), "unplug-replug": ("down",),
           "ecc-burst": ("count", "period")}
TAINT_EFFECTS = ("NoExecute", "NoSchedule")
STORIES = ("taint-eviction",)
PHASES = ("Running", "Failed", "Pending", "Terminating", "Deleted")
HEALTH = ("Healthy", "Unhealthy", "Unknown")
# The calls a kubelet makes to a plugin, as `calls:` counts them: the unary ones above, the streams it opens,
# and the plugins_registry handshake.
KUBELET_CALLS = (*PLUGIN_CALLS, "ListAndWatch", "NodeWatchResources", "GetInfo", "NotifyRegistrationStatus")
CONDITIONS = ("registered", "capacity", "allocatable", "pod", "pod_devices", "pod_resources", "resources_status",
              "calls", "checkpoint", "cdi", "dialed", "slices", "taints", "device_health", "held", "not")
DRA_ONLY = {"cdi", "slices", "taints", "device_health", "taint", "untaint", "story"}
DP_ONLY = {"pod_devices", "capacity", "allocatable", "held"}  # conditions
DP_ONLY_ACTIONS = {"release", "reject", "socket"}
# The calls `hold` can keep in flight: those the kubelet serves (the fake kubelet's FaultPlan, and the relay's in
# front of a real kubelet, apply to its registration service: v1beta1.Registration/Register).
HOLDABLE_CALLS = ("Register",)
KUBELET_SOCKET_WORDS = ("kubelet", "plugin")  # socket: {delete: ...}, besides a file name
SOCKET_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,100}")  # a file in the device-plugins directory, no path
SINCE = ("scenario", "step")
PODRESOURCES_VIA = ("List", "Get")
COUNT_WORDS = ("all", "healthy")
COMPARISONS = ("equals", "at_least", "at_most")
MAX_DURATION_S = 600.0  # a step longer than ten minutes is a soak, not a reproduction
DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|s|m)?")
DEVICE_REF = re.compile(r"@\d{1,3}|@pod:[a-z0-9][a-z0-9-]*|[A-Za-z0-9][A-Za-z0-9._:-]*")
POD_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,40}")
# What the fake hardware takes (fake_devices.backend), so that a scenario fails when it loads, not midway.
DEVICE_VALUE_MAX = {"count": MAX_ECC_BURST, "code": MAX_XID}
TEMPERATURES = f"{TEMPERATURE_RANGE_C[0]:g} to {TEMPERATURE_RANGE_C[1]:g}"
MAX_RAMP_STEPS = 1000  # one step per period: more is a soak, and every step is held in memory

# The keys of the conditions that are mappings, and what each takes (`_shape` says how each is checked); the
# validator and `fakelet scenario vocabulary` (manual.py) both read these, so the two cannot disagree.
CONDITION_SHAPES: dict[str, dict[str, Any]] = {
    "pod": {"name": str, "phase": PHASES, "reason": str},
    "pod_devices": {"pod": str, "count": "count"},
    "resources_status": {"pod": str, "health": HEALTH},
    "calls": {"method": str, "count": "count", "since": SINCE},
    "checkpoint": {"pod": str, "devices": "count", "claims": "count"},
    "cdi": {"pod": str, "present": bool},
    "dialed": {"socket": str, "count": "count", "plugin_instance": "instance", "since": SINCE},
    "slices": {"devices": "count"},
    "taints": {"only": "devices", "no_execute": "devices"},
    "device_health": {"healthy": "devices", "unhealthy": "devices"},
}
CONDITION_REQUIRED: dict[str, tuple[str, ...]] = {
    "pod": ("name",), "pod_devices": ("pod", "count"), "resources_status": ("pod", "health"),
    "calls": ("method", "count"), "cdi": ("pod", "present"), "dialed": ("socket",), "slices": ("devices",)}
# pod_resources asks about a pod (List or Get) or the node (GetAllocatableResources): one shape each.
POD_RESOURCES_SHAPES: dict[str, dict[str, Any]] = {
    "pod": {"pod": str, "resource": str, "devices": "count", "present": bool, "via": PODRESOURCES_VIA},
    "allocatable": {"allocatable": str, "devices": "count"},
}
# A resource count: capacity or allocatable of any extended resource the node reports.
RESOURCE_SHAPE: dict[str, Any] = {"resource": str, "count": "number"}

Problem = tuple[str, str] | None  # (field path under the step, message)


def duration_s(value: Any) -> float | None:
    """Seconds from 5, 2.5, "5s", "500ms", "1m"; None when it is not a duration in range."""
    if isinstance(value, bool):
        return None
    if _number(value):
        seconds = float(value)
    elif isinstance(value, str) and (m := DURATION.fullmatch(value.strip())):
        seconds = float(m.group(1)) * {"ms": 0.001, "s": 1.0, "m": 60.0, None: 1.0}[m.group(2)]
    else:
        return None
    return seconds if 0 <= seconds <= MAX_DURATION_S else None


def check_step(step: Step, kind: str) -> Problem:
    """What is wrong with one step, if anything (the loader adds file, line and field)."""
    action, arg, options = step.action, step.arg, step.options
    if action in DRA_ONLY and kind != "dra":
        return "", f"{action} needs a DRA driver (kind: dra)"
    if action in DP_ONLY_ACTIONS and kind == "dra":
        return "", f"{action} is for device plugins (kind: device-plugin)"
    checker = {"kubelet": _kubelet, "plugin": _plugin, "pod": _pod, "device": _device, "script": _script,
               "taint": _taint, "untaint": _untaint, "hold": _hold, "release": _release, "reject": _reject,
               "socket": _socket, "wait": _wait, "expect": _expect, "story": _story, "check": _check}[action]
    return checker(arg, options, kind)


def _no_options(options: dict[str, Any], allowed: tuple[str, ...] = ()) -> Problem:
    extra = sorted(set(options) - set(allowed))
    if extra:
        known = f"; known: {', '.join(allowed)}" if allowed else " (this action has none)"
        return extra[0], f"unknown option{known}"
    return None


def _kubelet(arg: Any, options: dict[str, Any], kind: str) -> Problem:
    if arg not in KUBELET_OPS:
        return "kubelet", f"{arg!r} is not one of {', '.join(KUBELET_OPS)}"
    if arg in DRA_KUBELET_OPS and kind != "dra":
        return "kubelet", f"{arg} needs a DRA driver (kind: dra)"
    problem = _no_options(options, ("checkpoint",))
    if problem:
        return problem
    if "checkpoint" in options:
        if arg not in ("start", "restart", "restart-keep-sockets", "reboot"):
            return "checkpoint", "goes with start, restart or reboot (the kubelet reads it when it starts)"
        if options["checkpoint"] not in CHECKPOINT_FAULTS:
            return "checkpoint", f"one of {', '.join(CHECKPOINT_FAULTS)}"
    return None


def _plugin(arg: Any, options: dict[str, Any], kind: str) -> Problem:
    if arg not in PLUGIN_OPS:
        return "plugin", f"{arg!r} is not one of {', '.join(PLUGIN_OPS)}"
    if arg in ("kill", "crash"):
        problem = _no_options(options, ("during",))
        if problem is None and "during" in options and options["during"] not in PLUGIN_CALLS:
            return "during", f"a call the kubelet makes to the plugin: {', '.join(PLUGIN_CALLS)}"
        return problem
    if arg != "rolling-update":
        return _no_options(options)
    problem = _no_options(options, ("args",))
    if problem:
        return problem
    args = options.get("args", [])
    if not (isinstance(args, list) and all(isinstance(a, str) for a in args)):
        return "args", "a list of strings: arguments added to the new instance's command (its new pod spec)"
    return None


def _pod(arg: Any, options: dict[str, Any], kind: str) -> Problem:
    problem = _no_options(options)
    if problem:
        return problem
    if not isinstance(arg, dict):
        return "pod", "{create: NAME, devices: N} or {delete: NAME}"
    if ("create" in arg) == ("delete" in arg):
        return "pod", "exactly one of create or delete"
    name = arg.get("create", arg.get("delete"))
    if not (isinstance(name, str) and POD_NAME.fullmatch(name)):
        return "pod", f"pod name {name!r}: lower-case letters, digits and '-'"
    count_key = "devices"
    allowed = {"create", count_key} if "create" in arg else {"delete"}
    extra = sorted(set(arg) - allowed)
    if extra:
        return f"pod.{extra[0]}", f"unknown key; known: {', '.join(sorted(allowed))}"
    count = arg.get(count_key, 1)
    if "create" in arg and not (_whole(count) and 0 <= count <= 64):
        return f"pod.{count_key}", "a number from 0 to 64"
    return None


def _device_ref(value: Any) -> bool:
    return isinstance(value, str) and bool(DEVICE_REF.fullmatch(value))


def _whole(value: Any) -> bool:
    """An int that is not a bool (YAML's true is an int to Python)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def chosen(arg: dict[str, Any], choices: Any) -> str:
    """The one key of a well-formed device or script step that names its op (the stage uses it too)."""
    return next(k for k in arg if k in choices)


def _one_of(action: str, arg: Any, choices: Any, example: str, listing: str) -> tuple[str, Problem]:
    """(the op a device or script mapping names, or the problem when it names not exactly one)."""
    if not isinstance(arg, dict):
        return "", (action, f"a mapping like {example}; {listing}: {', '.join(choices)}")
    ops = [k for k in arg if k in choices]
    if len(ops) != 1:
        return "", (action, f"exactly one of {', '.join(choices)}")
    if ops[0] not in NVML_CONTROLS and not _device_ref(arg[ops[0]]):
        return "", (f"{action}.{ops[0]}", "an inventory device ID, '@N' or '@pod:NAME'")
    return ops[0], None


def _device(arg: Any, options: dict[str, Any], kind: str) -> Problem:
    problem = _no_options(options)
    if problem:
        return problem
    op, problem = _one_of("device", arg, DEVICE_OPS, "{fail: gpu-0} or {heat: '@0', to: 95}", "ops")
    if problem:
        return problem
    if op in NVML_CONTROLS:
        code = arg[op]
        if set(arg) != {op} or not (_whole(code) and 0 <= code <= 999):
            return f"device.{op}", "an NVML return code (999: unknown error; 0: works again)"
        return None
    value_key = DEVICE_VALUE.get(op)
    extra = sorted(set(arg) - {op, *([value_key] if value_key else [])})
    if extra:
        return f"device.{extra[0]}", f"unknown key for {op}"
    if op in ("heat", "cool"):
        if not _temperature(arg.get("to")):
            return "device.to", f"{op} needs to: a temperature in degrees C, {TEMPERATURES}"
    elif value_key and value_key in arg:
        value, most = arg[value_key], DEVICE_VALUE_MAX[value_key]
        if not (_whole(value) and 1 <= value <= most):
            return f"device.{value_key}", f"a whole number from 1 to {most}"
    elif op == "xid":
        return "device.code", "xid needs code: the XID number"
    return None


def _script(arg: Any, options: dict[str, Any], kind: str) -> Problem:
    problem = _no_options(options)
    if problem:
        return problem
    name, problem = _one_of("script", arg, SCRIPTS, "{flap: gpu-0, period: 0.5, cycles: 3}", "scripts")
    if problem:
        return problem
    needed = SCRIPTS[name]
    extra = sorted(set(arg) - {name, *needed})
    if extra:
        return f"script.{extra[0]}", f"unknown key; {name} takes {', '.join(needed)}"
    for key in needed:
        value = arg.get(key)
        if key in ("cycles", "count"):
            if not (_whole(value) and 1 <= value <= 1000):
                return f"script.{key}", "a whole number from 1 to 1000"
        elif key in ("period", "down"):
            if duration_s(value) is None or duration_s(value) == 0:
                return f"script.{key}", "a positive duration (seconds, or '500ms')"
        elif not _temperature(value):
            return f"script.{key}", f"a temperature in degrees C, {TEMPERATURES}"
    return _ramp(arg) if name == "ramp" else None


def _ramp(arg: dict[str, Any]) -> Problem:
    """What fake_devices.scripts.temperature_ramp would refuse when the step runs, or a ramp too long to hold."""
    low, high, step = arg["from"], arg["to"], arg["step"]
    if step <= 0:
        return "script.step", "a positive number of degrees C"
    if high < low:
        return "script.to", f"at least from ({low:g} C): a ramp heats up, then cools back"
    if (high - low) / step > MAX_RAMP_STEPS:
        return "script.step", f"at most {MAX_RAMP_STEPS} steps from {low:g} to {high:g} C: take a larger step"
    return None


def _temperature(value: Any) -> bool:
    """A temperature the fake hardware accepts (fake_devices.backend refuses the rest when the step runs)."""
    return _number(value) and TEMPERATURE_RANGE_C[0] <= value <= TEMPERATURE_RANGE_C[1]


def _taint(arg: Any, options: dict[str, Any], kind: str) -> Problem:
    problem = _no_options(options)
    if problem:
        return problem
    if not isinstance(arg, dict) or not _device_ref(arg.get("device")):
        return "taint", "{device: DEV, effect: NoExecute, key: example.com/key}"
    extra = sorted(set(arg) - {"device", "effect", "key"})
    if extra:
        return f"taint.{extra[0]}", "unknown key; known: device, effect, key"
    if arg.get("effect", "NoExecute") not in TAINT_EFFECTS:
        return "taint.effect", f"one of {', '.join(TAINT_EFFECTS)}"
    return None


def _untaint(arg: Any, options: dict[str, Any], kind: str) -> Problem:
    problem = _no_options(options)
    if problem:
        return problem
    if not isinstance(arg, dict) or set(arg) != {"device"} or not _device_ref(arg["device"]):
        return "untaint", "{device: DEV}"
    return None


def _hold(arg: Any, options: dict[str, Any], kind: str) -> Problem:
    if isinstance(arg, dict):
        if kind == "dra":
            return "hold", "{call: ...} is for device plugins (a duration holds a fault for DRA drivers too)"
        return _call(arg, "hold") or _no_options(options)
    if duration_s(arg) is None:
        return "hold", (f"a duration up to {MAX_DURATION_S:g}s (5, '5s', '500ms'), or {{call: Register}} "
                        "(a call held in flight)")
    return _no_options(options)


def _call(arg: Any, action: str) -> Problem:
    """{call: NAME}: a call the kubelet serves, which `hold` can keep in flight and `reject` can refuse."""
    if not isinstance(arg, dict) or "call" not in arg:
        return action, "{call: Register}"
    extra = sorted(set(arg) - {"call"}, key=str)
    if extra:
        return f"{action}.{extra[0]}", "unknown key; known: call"
    if arg["call"] not in HOLDABLE_CALLS:
        return f"{action}.call", f"a call the kubelet serves: {', '.join(HOLDABLE_CALLS)}"
    return None


def _release(arg: Any, options: dict[str, Any], kind: str) -> Problem:
    return _call(arg, "release") or _no_options(options)


def _reject(arg: Any, options: dict[str, Any], kind: str) -> Problem:
    return _call(arg, "reject") or _no_options(options)


def _socket(arg: Any, options: dict[str, Any], kind: str) -> Problem:
    problem = _no_options(options)
    if problem:
        return problem
    if not isinstance(arg, dict) or set(arg) != {"delete"}:
        return "socket", "{delete: kubelet | plugin | NAME}"
    target = arg["delete"]
    if target in KUBELET_SOCKET_WORDS:
        return None
    if not (isinstance(target, str) and SOCKET_NAME.fullmatch(target)) or target in (".", ".."):
        return "socket.delete", ("kubelet (kubelet.sock), plugin (its registered endpoint), or a socket's file "
                                 "name in the device-plugins directory (no path)")
    return None


def _under(action: str, problem: Problem) -> Problem:
    """A condition's problem, with its field path under the action's key (steps[N].wait.pod.phase)."""
    return None if problem is None else (f"{action}.{problem[0]}" if problem[0] else action, problem[1])


def _wait(arg: Any, options: dict[str, Any], kind: str) -> Problem:
    return _under("wait", _conditions(arg, kind)) or _timing(options, ("within", "glimpse"))


def _expect(arg: Any, options: dict[str, Any], kind: str) -> Problem:
    problem = _under("expect", _conditions(arg, kind)) or _timing(options, ("within", "throughout", "glimpse"))
    if problem is None and "within" in options and "throughout" in options:
        return "throughout", "give within (it comes true) or throughout (it stays true), not both"
    if problem is None and "glimpse" in options and "throughout" in options:
        return "glimpse", "throughout holds the conditions for its whole span: a glimpse goes with within"
    return problem


def _story(arg: Any, options: dict[str, Any], kind: str) -> Problem:
    if arg not in STORIES:
        return "story", f"{arg!r} is not one of {', '.join(STORIES)}"
    problem = _no_options(options, ("toleration_seconds",))
    if problem:
        return problem
    value = options.get("toleration_seconds", 0)
    if not (_whole(value) and 0 <= value <= 3600):
        return "toleration_seconds", "a whole number of seconds from 0 to 3600"
    return None


def _check(arg: Any, options: dict[str, Any], kind: str) -> Problem:
    from harness.spec.checks import SUITES, catalog

    known = catalog(SUITES[kind])
    if arg not in known:
        return "check", f"{arg!r} is not a {kind} check (fakelet checks)"
    return _no_options(options)


def _timing(options: dict[str, Any], allowed: tuple[str, ...]) -> Problem:
    problem = _no_options(options, allowed)
    if problem:
        return problem
    if "glimpse" in options and not isinstance(options["glimpse"], bool):
        return "glimpse", "true (the first moment the conditions hold counts) or false (they hold 1 s: the default)"
    for key in allowed:
        if key == "glimpse":
            continue
        if key in options and (duration_s(options[key]) is None or duration_s(options[key]) == 0):
            return key, f"a positive duration up to {MAX_DURATION_S:g}s"
    return None


def count_ok(value: Any) -> bool:
    """N, all, healthy, or {equals|at_least|at_most: one of those}."""
    if isinstance(value, dict):
        return len(value) == 1 and next(iter(value)) in COMPARISONS and count_ok(next(iter(value.values())))
    return value in COUNT_WORDS or (_whole(value) and value >= 0)


def _conditions(arg: Any, kind: str) -> Problem:
    if not isinstance(arg, dict) or not arg:
        return "", f"a mapping of conditions; known: {', '.join(CONDITIONS)}"
    for key, value in arg.items():
        if key not in CONDITIONS:
            return str(key), f"unknown condition; known: {', '.join(CONDITIONS)}"
        if key in DRA_ONLY and kind != "dra":
            return key, "needs a DRA driver (kind: dra)"
        if key in DP_ONLY and kind == "dra":
            return key, "is for device plugins"
        problem = _conditions(value, kind) if key == "not" else _condition(key, value)
        if problem:
            return f"{key}{'.' + problem[0] if problem[0] else ''}", problem[1]
    return None


def _condition(key: str, value: Any) -> Problem:
    count_help = "N, all, healthy, or {equals|at_least|at_most: N}"
    if key == "registered":
        return None if value is True else ("", "true (wait for a registration; its absence is a failed expect)")
    if key in ("capacity", "allocatable"):
        if isinstance(value, dict) and "resource" in value:
            return _resource_count(value)
        return None if count_ok(value) else ("", f"{count_help}, or {{resource: R, count: N}}")
    if not isinstance(value, dict):
        return "", "a mapping"
    if key == "pod_resources":
        return _pod_resources(value)
    if key == "held":
        return _under_key(_call(value, "held"))
    problem = _shape(value, CONDITION_SHAPES[key])
    if problem:
        return problem
    missing = [r for r in CONDITION_REQUIRED.get(key, ()) if r not in value]
    if missing:
        return missing[0], "required"
    if key in ("taints", "device_health") and not value:
        keys = " and ".join(f"{k}: [DEV, ...]" for k in CONDITION_SHAPES[key])
        return "", f"{keys}, or both"
    if key == "checkpoint" and not ({"pod", "claims", "devices"} & set(value)):
        return "", "{pod: NAME, devices: COUNT} (device manager) or {claims: COUNT, devices: COUNT} (DRA)"
    if key == "checkpoint" and "pod" in value and "devices" not in value:
        return "devices", "required with pod"
    if key == "calls" and value["method"].rsplit("/", 1)[-1] not in KUBELET_CALLS:
        return "method", f"a call the kubelet makes to a plugin: {', '.join(KUBELET_CALLS)}"
    return None


def _shape(value: dict[str, Any], shape: dict[str, Any]) -> Problem:
    """Unknown keys and wrong types in a condition's mapping (`shape`: key -> str, bool, "count", "number" (a
    count with no words), "instance", or a tuple of the words it takes)."""
    extra = sorted(set(value) - set(shape), key=str)
    if extra:
        return str(extra[0]), f"unknown key; known: {', '.join(shape)}"
    for name, want in shape.items():
        if name not in value:
            continue
        got = value[name]
        if want == "count" and not count_ok(got):
            return name, "N, all, healthy, or {equals|at_least|at_most: N}"
        if want == "number" and not _number_count(got):
            return name, "N or {equals|at_least|at_most: N} (all and healthy count the subject's devices only)"
        if want == "devices" and not (isinstance(got, list) and all(_device_ref(d) for d in got)):
            return name, "a list of devices: inventory IDs, '@N' or '@pod:NAME'"
        if want == "instance" and not (_whole(got) and got >= 1):
            return name, "a whole number from 1: the subject's N-th process (the first start is 1)"
        if want is str and not (isinstance(got, str) and got):
            return name, "a non-empty string"
        if want is bool and not isinstance(got, bool):
            return name, "true or false"
        if isinstance(want, tuple) and got not in want:
            return name, f"one of {', '.join(want)}"
    return None


def _under_key(problem: Problem) -> Problem:
    """A problem _call placed under "held" (the condition's own key is added by _conditions)."""
    if problem is None:
        return None
    field_path = problem[0].removeprefix("held").removeprefix(".")
    return field_path, problem[1]


def _number_count(value: Any) -> bool:
    """N or {equals|at_least|at_most: N}: a count that names no subject's devices (all, healthy)."""
    if isinstance(value, dict):
        return len(value) == 1 and next(iter(value)) in COMPARISONS and _number_count(next(iter(value.values())))
    return _whole(value) and value >= 0


def _resource_count(value: dict[str, Any]) -> Problem:
    problem = _shape(value, RESOURCE_SHAPE)
    if problem is None and "count" not in value:
        return "count", "required with resource"
    return problem


def _pod_resources(value: dict[str, Any]) -> Problem:
    if ("pod" in value) == ("allocatable" in value):
        return "", ("{pod: NAME, devices: COUNT} (List, or via: Get) or {allocatable: R, devices: COUNT} "
                    "(GetAllocatableResources): exactly one of pod and allocatable")
    if "allocatable" in value:
        problem = _shape(value, POD_RESOURCES_SHAPES["allocatable"])
        if problem is None and "devices" not in value:
            return "devices", "required with allocatable"
        return problem
    problem = _shape(value, POD_RESOURCES_SHAPES["pod"])
    if problem is None and not ({"devices", "present"} & set(value)):
        return "", "say what to expect of the pod: devices: COUNT, present: true | false, or both"
    return problem
