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
  plugin:  start | stop | kill | restart | crash | rolling-update [args: [ARG, ...]] [defect: NAME | none]
           (rolling-update: a second instance, its command plus args, registers before the first stops; the
            reference DRA driver's args: [--pod-uid, UID] give it sockets of its own, <driver>-UID-reg.sock and
            dra-UID.sock, as upstream kubeletplugin.RollingUpdate does; defect: NAME runs the new instance as
            that mutant of the subject (one of its defects, as --defect NAME would), none as the subject without
            one: an upgrade from a correct plugin to a buggy one, or back; not given: the same as the old one;
            kill and crash take during: CALL, e.g. Allocate: SIGKILL as the kubelet sends that call; a
            plugin that answers within microseconds may get its answer out first, then its next call fails)
  pod:     {create: NAME, devices: N, [grace_period: S], [tolerations: [TOLERATION, ...]], [timeout: S]}
           | {delete: NAME, [grace_period: S], [timeout: S]}
           (a DRA pod gets one claim for N devices. grace_period: on create the Pod's
            spec.terminationGracePeriodSeconds, on delete the DeleteOptions' gracePeriodSeconds (0 removes the
            Pod from the API server at once: kubectl delete --grace-period=0 --force); TOLERATION is
            {key: K, operator: Equal | Exists, value: V, effect: E, toleration_seconds: N}: a DRA pod's claim's
            device tolerations (what tolerates a DeviceTaintRule or a taint its driver publishes), a device-plugin
            pod's spec.tolerations; timeout bounds the step's wait for the pod to run or to be gone (not given:
            a DRA pod's is the reaction bound plus the DRA call timeout, 75 s; a device-plugin pod's on the real
            node 60 s). A node that cannot honour a key makes the run inconclusive, saying why (the fake
            kubelet's device-plugin pods are no Pod objects); a pod created again after its delete step gets its
            old names in the API server, as a manifest applied again does)
  device:  {fail|recover|unplug|plug: DEV} | {heat|cool: DEV, to: C} | {ecc: DEV, count: N} | {xid: DEV, code: N}
           | {nvml-init-error: CODE} | {nvml-wait-error: CODE}      (NVML return codes; 0 works again)
  script:  {flap: DEV, period: S, cycles: N} | {ramp: DEV, from: C, to: C, step: C, period: S}
           | {unplug-replug: DEV, down: S} | {ecc-burst: DEV, count: N, period: S}
  taint:   {device: DEV, effect: NoExecute | NoSchedule | None, key: K, [name: R]}   (DRA: a DeviceTaintRule on one
             device: its driver, pool and name. None informs only (API servers from 1.35): nothing is kept away
             or evicted; the step narrates what the eviction controller posts on the rule, what NoExecute would
             evict)
           | {selector: {[driver: D], [pool: P], [device: DEV]}, effect, key, [name: R]}
             a DeviceTaintRule with that deviceSelector (resource.k8s.io v1beta2 DeviceTaintSelector): every key
             optional, each one given narrows it; `selector: {}` is the empty selector, which matches every device
             of every driver in the cluster (types.go: "The empty selector matches all devices"). D: a driver name
             or @driver (the subject's); P: a pool name or @node (the pool named after the run's node); DEV as
             below. name: R names the rule for untaint (made unique per run: <node>-R)
  untaint: {device: DEV} | {rule: R} | {selector: {...}}   the rules an earlier taint made for that device, of that
             name, or with that same selector
  hold:    S          (a fault's duration, e.g. the kubelet stays down 5 s; never a sync point)
  hold:    {call: CALL}   the next CALL of the kubelet's is held in flight: the running kubelet's, or, if none
                      runs or it gets none, the next one started's. Register (device plugins), the call the kubelet
                      serves, is held unanswered: the plugin waits. Allocate (device plugins), NodePrepareResources
                      and NodeUnprepareResources (DRA), calls the kubelet makes, reach the plugin, and its answer
                      is held back from the kubelet: the plugin has done its part (allocated, prepared: its CDI spec
                      written) and the kubelet has not heard, the window a kubelet restart or a pod deletion hits
                      in the reported bugs (kubernetes#116411). A held call stays held until `release`, until the
                      kubelet holding it stops (its call dies with it) or, for the DRA calls, until the kubelet's
                      own deadline on the call passes (45 s, dra_plugin.go defaultClientCallTimeout; Allocate has
                      none). `wait: {held: {call: CALL}}` waits for it. On the fake kubelet it is its fault plan
                      (its device manager's and its DRA manager's client), on the real node the relay's, on the wire.
                      A pod step whose pod meets a held call returns once the call is held: the pod waits, Pending.
  release: {call: CALL}   the held call goes on: the kubelet answers the Register, or gets the plugin's answer (a
                      no-op, narrated, when the call has ended since: its kubelet stopped, or its deadline passed)
  reject:  {call: Register}   (device plugins) the kubelet rejects the next Register it receives with an error, as
                      a kubelet that refuses a registration does: the running kubelet's, or, if none runs, the
                      first one the next kubelet started receives (that start then waits for the rejection
                      and the plugin's reaction, and starts a plugin that exited non-zero again: its DaemonSet)
  socket:  {delete: kubelet | plugin | NAME}   (device plugins) a manual `rm` of a socket in the device-plugins
                      directory: kubelet (kubelet.sock, the kubelet's), plugin (the socket the plugin last
                      registered as its endpoint), or NAME (a socket file name there). The servers keep running
                      on the deleted path, as after a real rm; on the real node the kubelet's and the plugin's
                      directories are joined by the relay, which mirrors the deletion to the other side.
           {delete: registration | service | NAME}   (DRA) the same for a DRA driver: registration (its socket in
                      plugins_registry, which the kubelet's plugin watcher sees go and deregisters the driver),
                      service (the endpoint it last registered, its dra.sock), or NAME (a socket file name in
                      plugins_registry or in the driver's plugins/<driver> directory). On the real node the DRA
                      relay mirrors the deletion into the kubelet's directories.
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
  taints: {[only: [DEV, ...]], [no_execute: [DEV, ...]], [from: driver | rules | both]}
                   the taints that keep claims away (NoSchedule, NoExecute; None keeps nothing away) are on those
                   devices only; NoExecute ones on those of no_execute only. from: whose taints: driver (default:
                   those it publishes in its ResourceSlices), rules (every DeviceTaintRule in the cluster that
                   selects the device), both (what the scheduler and the eviction controller act on)
  device_health: {[healthy: [DEV, ...]], [unhealthy: [DEV, ...]]}
                   each device's health as the kubelet holds it from DRAResourceHealth (Unknown once its health
                   timed out or its driver's stream ended): what a pod's allocatedResourcesStatus shows at its next
                   post (fake: the kubelet's cache; real: the relay's copy, fed the same stream messages)
  held: {call: CALL}                           a call that `hold` armed is in flight now, held (not yet released,
                                               its kubelet running, its deadline not passed)
  not: CONDITIONS                              holds when those do not all hold
calls and dialed read the kubelet's side of the plugin wire: the fake kubelet records it, and so does the
relay in front of a real kubelet; without one they are inconclusive, never 0.
"""

from __future__ import annotations

import re
from typing import Any

from fake_devices.backend import MAX_ECC_BURST, MAX_XID, TEMPERATURE_RANGE_C
from harness.scenarios.step import Step
from harness.spec.names import (
    DNS1123_LABEL_MAX_LENGTH,
    is_dns1123_label,
    is_dns1123_subdomain,
    qualified_name_errors,
)

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
TAINT_EFFECTS = ("NoExecute", "NoSchedule", "None")  # controlplane/taints.py: None from 1.35 on
TAINT_SOURCES = ("driver", "rules", "both")  # the taints condition's `from:`; driver first, the default
DEFAULT_TAINT_KEY = "fakelet.example.com/scenario"  # a taint step's key when it names none
STORIES = ("taint-eviction",)
PHASES = ("Running", "Failed", "Pending", "Terminating", "Deleted")
HEALTH = ("Healthy", "Unhealthy", "Unknown")
# The calls a kubelet makes to a plugin, as `calls:` counts them: the unary ones above, the streams it opens,
# and the plugins_registry handshake.
KUBELET_CALLS = (*PLUGIN_CALLS, "ListAndWatch", "NodeWatchResources", "GetInfo", "NotifyRegistrationStatus")
CONDITIONS = ("registered", "capacity", "allocatable", "pod", "pod_devices", "pod_resources", "resources_status",
              "calls", "checkpoint", "cdi", "dialed", "slices", "taints", "device_health", "held", "not")
DRA_ONLY = {"cdi", "slices", "taints", "device_health", "taint", "untaint", "story"}
DP_ONLY = {"pod_devices", "capacity", "allocatable"}  # conditions
DP_ONLY_ACTIONS = {"reject"}
# The calls `hold` can keep in flight, and whose they are: the call the kubelet serves (v1beta1.Registration/
# Register: held before the kubelet answers it), and the calls it makes to a plugin (v1beta1.DevicePlugin/Allocate,
# v1 and v1beta1 DRAPlugin/NodePrepareResources and NodeUnprepareResources: the plugin's answer held back from the
# kubelet). The kubelet's fault plan applies both, the fake kubelet's and the relay's in front of a real one.
CALL_KINDS = {"Register": "device-plugin", "Allocate": "device-plugin", "NodePrepareResources": "dra",
              "NodeUnprepareResources": "dra"}
HOLDABLE_CALLS = tuple(CALL_KINDS)
SERVED_CALLS = ("Register",)  # of those, the kubelet's own service's
REJECTABLE_CALLS = ("Register",)  # what `reject` can refuse: the kubelet's own answer
NO_DEFECT = "none"  # a rolling update's `defect: none`: the new instance runs without the old one's defect
DEFECT_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")  # a subject's defect, as its subject file names it
KUBELET_SOCKET_WORDS = ("kubelet", "plugin")  # socket: {delete: ...}, besides a file name
# A DRA driver's: its registration socket in plugins_registry, and the endpoint (dra.sock) it registered.
DRA_SOCKET_WORDS = ("registration", "service")
SOCKET_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,100}")  # a file in the device-plugins directory, no path
# A DeviceTaintRule's deviceSelector (k8s.io/api resource/v1beta2 types.go DeviceTaintSelector: driver, pool,
# device; the DeviceClass and CEL selectors were tombstoned in 1.35). What each value takes is what the API
# server's validation accepts (pkg/apis/resource/validation/validation.go validateDeviceTaintSelector), checked
# by _selector_value so that a file is refused when it loads, not by the API server midway through a run.
TAINT_SELECTOR_KEYS = ("driver", "pool", "device")
# Words for what a file cannot spell (the subject's driver, a run's own node name); '@' is in no valid name.
SELECTOR_WORDS = {"driver": "@driver", "pool": "@node"}
DRIVER_NAME_MAX = 63  # pkg/apis/resource/types.go DriverNameMaxLength (ValidateCSIDriverName checks it)
POOL_NAME_MAX = 253  # pkg/apis/resource/types.go PoolNameMaxLength (validation.DNS1123SubdomainMaxLength)
TAINT_KEYS = ("device", "selector", "effect", "key", "name")
UNTAINT_KEYS = ("device", "rule", "selector")
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
# pod: {create: NAME, ...} and {delete: NAME, ...}: the keys each form takes.
POD_CREATE_KEYS = ("create", "devices", "grace_period", "tolerations", "timeout")
POD_DELETE_KEYS = ("delete", "grace_period", "timeout")
MAX_GRACE_PERIOD_S = int(MAX_DURATION_S)  # a grace period no step could wait out is no reproduction's
# A toleration as a scenario writes it; the API's field for each key (core/v1 Toleration and resource/v1
# DeviceToleration name them alike).
TOLERATION_KEYS = {"key": "key", "operator": "operator", "value": "value", "effect": "effect",
                   "toleration_seconds": "tolerationSeconds"}
TOLERATION_OPERATORS = ("Equal", "Exists")  # core/v1 TolerationOperator, resource/v1 DeviceTolerationOperator
# The effects a toleration may name: a pod's (core/v1 types.go TaintEffect) and a device request's (resource/v1
# types.go DeviceToleration.Effect: "When specified, allowed values are NoSchedule and NoExecute").
POD_TOLERATION_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
DEVICE_TOLERATION_EFFECTS = ("NoSchedule", "NoExecute")
MAX_TOLERATION_S = 3600  # as story: taint-eviction's toleration_seconds
MAX_TOLERATIONS = 16  # a list longer than any reported bug needs is a mistake, not a reproduction
# apimachinery validation.go IsValidLabelValue: at most 63 characters, alphanumerics at both ends.
LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
LABEL_VALUE_MAX = 63  # apimachinery validation.go LabelValueMaxLength

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
    "taints": {"only": "devices", "no_execute": "devices", "from": TAINT_SOURCES},
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
    problem = _no_options(options, ("args", "defect"))
    if problem:
        return problem
    args = options.get("args", [])
    if not (isinstance(args, list) and all(isinstance(a, str) for a in args)):
        return "args", "a list of strings: arguments added to the new instance's command (its new pod spec)"
    defect = options.get("defect", NO_DEFECT)
    if not (isinstance(defect, str) and DEFECT_NAME.fullmatch(defect)):
        return "defect", (f"a defect of the subject (fakelet subjects lists them) for the new instance to run as, "
                          f"or {NO_DEFECT} (the subject without one)")
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
    allowed = POD_CREATE_KEYS if "create" in arg else POD_DELETE_KEYS
    extra = sorted(set(arg) - set(allowed), key=str)
    if extra:
        return f"pod.{extra[0]}", f"unknown key; known: {', '.join(allowed)}"
    count = arg.get("devices", 1)
    if "create" in arg and not (_whole(count) and 0 <= count <= 64):
        return "pod.devices", "a number from 0 to 64"
    grace = arg.get("grace_period", 0)
    if not (_whole(grace) and 0 <= grace <= MAX_GRACE_PERIOD_S):
        return "pod.grace_period", (f"a whole number of seconds from 0 to {MAX_GRACE_PERIOD_S} (0: the Pod leaves "
                                    "the API server at once)")
    if "timeout" in arg and not duration_s(arg["timeout"]):
        return "pod.timeout", f"a positive duration up to {MAX_DURATION_S:g}s (5, '5s', '500ms')"
    if "tolerations" in arg:
        return _tolerations(arg["tolerations"], kind)
    return None


def _tolerations(value: Any, kind: str) -> Problem:
    """A pod's tolerations as the API server validates them (core/v1 ValidateTolerations for a pod's, resource/v1
    validateDeviceToleration for a DRA claim's), so a file is refused when it loads, not by the API server midway."""
    effects = DEVICE_TOLERATION_EFFECTS if kind == "dra" else POD_TOLERATION_EFFECTS
    if not (isinstance(value, list) and 1 <= len(value) <= MAX_TOLERATIONS):
        return "pod.tolerations", (f"a list of 1 to {MAX_TOLERATIONS} tolerations, each {{key: K, operator: "
                                   "Equal | Exists, value: V, effect: E, toleration_seconds: N}")
    for n, toleration in enumerate(value):
        where = f"pod.tolerations[{n}]"
        if not isinstance(toleration, dict) or not toleration:
            return where, "a mapping: {key: K, operator: Equal | Exists, value: V, effect: E, toleration_seconds: N}"
        extra = sorted(set(toleration) - set(TOLERATION_KEYS), key=str)
        if extra:
            return f"{where}.{extra[0]}", f"unknown key; known: {', '.join(TOLERATION_KEYS)}"
        key, matched = toleration.get("key", ""), toleration.get("value", "")
        operator = toleration.get("operator", "Equal")  # the API's default
        if operator not in TOLERATION_OPERATORS:
            return f"{where}.operator", f"one of {', '.join(TOLERATION_OPERATORS)} (default Equal)"
        if not isinstance(key, str):
            return f"{where}.key", "a label name, such as example.com/gpu-broken"
        if key and qualified_name_errors(key):
            return f"{where}.key", f"a label name, such as example.com/gpu-broken: {qualified_name_errors(key)[0]}"
        if not key and operator != "Exists":
            return f"{where}.key", "required unless operator is Exists (no key and Exists tolerates every taint)"
        if not (isinstance(matched, str) and len(matched) <= LABEL_VALUE_MAX and LABEL_VALUE.fullmatch(matched)):
            return f"{where}.value", (f"a label value: at most {LABEL_VALUE_MAX} alphanumerics, '-', '_' or '.', "
                                      "alphanumerics at both ends")
        if matched and operator == "Exists":
            return f"{where}.value", "none with operator Exists (it tolerates every value of the key)"
        effect = toleration.get("effect", "")
        if effect and effect not in effects:
            whose = "a device toleration's: " if kind == "dra" else ""
            return f"{where}.effect", f"{whose}one of {', '.join(effects)} (not given: every effect)"
        if "toleration_seconds" in toleration:
            seconds = toleration["toleration_seconds"]
            if not (_whole(seconds) and 0 <= seconds <= MAX_TOLERATION_S):
                return f"{where}.toleration_seconds", f"a whole number of seconds from 0 to {MAX_TOLERATION_S}"
            if effect != "NoExecute":
                return f"{where}.toleration_seconds", ("goes with effect: NoExecute (how long a pod stays "
                                                       "bound once the taint is there)")
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
    if not isinstance(arg, dict) or ("device" in arg) == ("selector" in arg):
        return "taint", ("{device: DEV, effect: NoExecute, key: example.com/key} or {selector: {driver: D, pool: P, "
                         "device: DEV}, effect: ..., key: ...}: exactly one of device and selector")
    extra = sorted(set(arg) - set(TAINT_KEYS), key=str)
    if extra:
        return f"taint.{extra[0]}", f"unknown key; known: {', '.join(TAINT_KEYS)}"
    if "device" in arg and not _device_ref(arg["device"]):
        return "taint.device", "an inventory device ID, '@N' or '@pod:NAME'"
    problem = _selector(arg, "taint")
    if problem:
        return problem
    if arg.get("effect", "NoExecute") not in TAINT_EFFECTS:
        return "taint.effect", f"one of {', '.join(TAINT_EFFECTS)}"
    if "key" in arg:
        # The taint's key is a label name (validation.go validateDeviceTaint: ValidateLabelName).
        key = arg["key"]
        errors = qualified_name_errors(key) if isinstance(key, str) and key else ["it is empty"]
        if errors:
            return "taint.key", f"a label name like example.com/maintenance: {errors[0]}"
    return _rule_name(arg, "taint")


def _selector(arg: dict[str, Any], action: str) -> Problem:
    """A taint's or untaint's `selector:` mapping, each value as the API server would accept it."""
    if "selector" not in arg:
        return None
    selector = arg["selector"]
    if not isinstance(selector, dict):
        return f"{action}.selector", ("a mapping of driver, pool and device, each optional ({} selects every device "
                                      "in the cluster)")
    extra = sorted(set(selector) - set(TAINT_SELECTOR_KEYS), key=str)
    if extra:
        return f"{action}.selector.{extra[0]}", (f"unknown key; known: {', '.join(TAINT_SELECTOR_KEYS)} (the "
                                                 "DeviceClass and CEL selectors were removed from the API in 1.35)")
    for key in TAINT_SELECTOR_KEYS:
        if key in selector:
            why = _selector_value(key, selector[key])
            if why:
                return f"{action}.selector.{key}", why
    return None


def _selector_value(key: str, value: Any) -> str:
    """Why the API would refuse `value` as the selector's `key` ("" when it would not). Upstream's rules, from
    pkg/apis/resource/validation/validation.go: driver is ValidateCSIDriverName (a DNS-1123 subdomain, compared
    lower-cased, of at most DriverNameMaxLength), pool is validatePoolName (at most PoolNameMaxLength, each
    '/'-separated part a DNS-1123 subdomain), device is ValidateDNS1123Label."""
    word = SELECTOR_WORDS.get(key)
    if value == word:
        return ""
    if key == "device":
        if isinstance(value, str) and value.startswith("@"):
            return "" if _device_ref(value) else "an inventory device ID, '@N' or '@pod:NAME'"
        if isinstance(value, str) and is_dns1123_label(value):
            return ""
        return (f"an inventory device ID, '@N' or '@pod:NAME'; a device name must be a DNS-1123 label (lower-case "
                f"letters, digits and '-', at most {DNS1123_LABEL_MAX_LENGTH}), as the API requires")
    also = f", or {word} ({'the subject' if key == 'driver' else 'the run'}'s own)"
    if not isinstance(value, str) or not value:
        return f"a {key} name{also}"
    if key == "driver":
        if len(value) > DRIVER_NAME_MAX or not is_dns1123_subdomain(value.lower()):
            return f"a driver name: a DNS-1123 subdomain of at most {DRIVER_NAME_MAX} characters{also}"
        return ""
    if len(value) > POOL_NAME_MAX or not all(is_dns1123_subdomain(part) for part in value.split("/")):
        return (f"a pool name: at most {POOL_NAME_MAX} characters, each '/'-separated part a DNS-1123 subdomain"
                f"{also}")
    return ""


def _rule_name(arg: dict[str, Any], action: str, key: str = "name") -> Problem:
    """A rule's name in the scenario (the object is named <node>-NAME, so that runs sharing an API server never
    meet): the last part of a DNS-1123 subdomain, which a label fits."""
    if key in arg and not (isinstance(arg[key], str) and is_dns1123_label(arg[key])):
        return f"{action}.{key}", (f"a rule name: lower-case letters, digits and '-', at most "
                                   f"{DNS1123_LABEL_MAX_LENGTH} (a DNS-1123 label)")
    return None


def _untaint(arg: Any, options: dict[str, Any], kind: str) -> Problem:
    problem = _no_options(options)
    if problem:
        return problem
    if not isinstance(arg, dict) or len(arg) != 1 or next(iter(arg)) not in UNTAINT_KEYS:
        return "untaint", "{device: DEV}, {rule: NAME} or {selector: {...}}: exactly one of them"
    if "device" in arg and not _device_ref(arg["device"]):
        return "untaint.device", "an inventory device ID, '@N' or '@pod:NAME'"
    return _selector(arg, "untaint") or _rule_name(arg, "untaint", "rule")


def _hold(arg: Any, options: dict[str, Any], kind: str) -> Problem:
    if isinstance(arg, dict):
        return _call(arg, "hold", kind) or _no_options(options)
    if duration_s(arg) is None:
        return "hold", (f"a duration up to {MAX_DURATION_S:g}s (5, '5s', '500ms'), or {{call: CALL}} "
                        f"(a call held in flight: {', '.join(_calls_of(kind))})")
    return _no_options(options)


def _calls_of(kind: str, calls: tuple[str, ...] = HOLDABLE_CALLS) -> tuple[str, ...]:
    return tuple(c for c in calls if CALL_KINDS[c] == kind)


def _call(arg: Any, action: str, kind: str, calls: tuple[str, ...] = HOLDABLE_CALLS) -> Problem:
    """{call: NAME}: a call of the kubelet's that `hold` can keep in flight (one it serves or one it makes to a plugin
    of this kind), or that `reject` can refuse (`calls`)."""
    mine = _calls_of(kind, calls)
    if not isinstance(arg, dict) or "call" not in arg:
        return action, f"{{call: {' | '.join(mine)}}}"
    extra = sorted(set(arg) - {"call"}, key=str)
    if extra:
        return f"{action}.{extra[0]}", "unknown key; known: call"
    call = arg["call"]
    if call in calls and CALL_KINDS[call] != kind:
        whose = "a device plugin's call (kind: device-plugin)" if CALL_KINDS[call] == "device-plugin" else \
            "a DRA driver's call (kind: dra)"
        return f"{action}.call", f"{call} is {whose}; this scenario's: {', '.join(mine)}"
    if call not in calls:
        served = [c for c in mine if c in SERVED_CALLS]
        made = [c for c in mine if c not in SERVED_CALLS]
        said = [f"{', '.join(served)} (the kubelet serves it)"] if served else []
        said += [f"{', '.join(made)} (the kubelet makes it to the plugin)"] if made else []
        return f"{action}.call", f"a call of the kubelet's: {'; '.join(said)}"
    return None


def _release(arg: Any, options: dict[str, Any], kind: str) -> Problem:
    return _call(arg, "release", kind) or _no_options(options)


def _reject(arg: Any, options: dict[str, Any], kind: str) -> Problem:
    return _call(arg, "reject", kind, REJECTABLE_CALLS) or _no_options(options)


def _socket(arg: Any, options: dict[str, Any], kind: str) -> Problem:
    problem = _no_options(options)
    if problem:
        return problem
    dra = kind == "dra"
    words, other = (DRA_SOCKET_WORDS, KUBELET_SOCKET_WORDS) if dra else (KUBELET_SOCKET_WORDS, DRA_SOCKET_WORDS)
    if not isinstance(arg, dict) or set(arg) != {"delete"}:
        return "socket", f"{{delete: {' | '.join(words)} | NAME}}"
    target = arg["delete"]
    if target in words:
        return None
    if target in other:
        whose = "device plugins (kind: device-plugin)" if dra else "DRA drivers (kind: dra)"
        return "socket.delete", f"{target} is for {whose}; this scenario's: {', '.join(words)} or a NAME"
    if not (isinstance(target, str) and SOCKET_NAME.fullmatch(target)) or target in (".", ".."):
        if dra:
            return "socket.delete", ("registration (its plugins_registry socket), service (its registered endpoint), "
                                     "or a socket's file name in plugins_registry or plugins/<driver> (no path)")
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
        if key == "held":
            problem = _under_key(_call(value, "held", kind)) if isinstance(value, dict) else ("", "a mapping")
        else:
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
    problem = _shape(value, CONDITION_SHAPES[key])
    if problem:
        return problem
    missing = [r for r in CONDITION_REQUIRED.get(key, ()) if r not in value]
    if missing:
        return missing[0], "required"
    if key in ("taints", "device_health") and not {k for k, v in CONDITION_SHAPES[key].items() if v == "devices"} & \
            set(value):
        keys = " and ".join(f"{k}: [DEV, ...]" for k, v in CONDITION_SHAPES[key].items() if v == "devices")
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
