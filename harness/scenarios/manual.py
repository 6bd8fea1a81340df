"""The scenario vocabulary as a reference for people: `fakelet scenario vocabulary [NAME]`.

Every step and condition, its keys, what each takes, its default, and (for conditions) what is
judged or counted, from when, and which kubelets can show it. What a key takes is read off the
validator's own tables in vocabulary.py (the ops, the condition shapes, the ranges), never copied;
what it means is written here, once, and tests/test_scenario_tools.py fails when a step, op,
condition or key of the validator has no meaning here (or this names one the validator does not
know). The same text renders as plain text for the terminal and as Markdown for the docs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from harness.controlplane.taints import NONE_SINCE
from harness.node.real.cluster import POD_START_TIMEOUT_S
from harness.scenarios.pod_steps import PROGRESS_EVERY_S
from harness.scenarios.vocabulary import (
    ACTIONS,
    CALL_KINDS,
    CHECKPOINT_FAULTS,
    COMPARISONS,
    CONDITION_REQUIRED,
    CONDITION_SHAPES,
    CONDITIONS,
    COUNT_WORDS,
    DEFAULT_TAINT_KEY,
    DEVICE_OPS,
    DEVICE_TOLERATION_EFFECTS,
    DEVICE_VALUE,
    DEVICE_VALUE_MAX,
    DP_ONLY,
    DP_ONLY_ACTIONS,
    DRA_ONLY,
    DRA_SOCKET_WORDS,
    DRIVER_NAME_MAX,
    HOLDABLE_CALLS,
    KUBELET_CALLS,
    KUBELET_OPS,
    KUBELET_SOCKET_WORDS,
    MAX_DURATION_S,
    MAX_GRACE_PERIOD_S,
    MAX_RAMP_STEPS,
    MAX_TOLERATION_S,
    MAX_TOLERATIONS,
    NO_DEFECT,
    NVML_CONTROLS,
    PLUGIN_CALLS,
    PLUGIN_OPS,
    POD_CREATE_KEYS,
    POD_DELETE_KEYS,
    POD_RESOURCES_SHAPES,
    POD_TOLERATION_EFFECTS,
    POOL_NAME_MAX,
    REJECTABLE_CALLS,
    RESOURCE_SHAPE,
    SCRIPTS,
    SELECTOR_WORDS,
    STORIES,
    TAINT_EFFECTS,
    TEMPERATURES,
    TOLERATION_OPERATORS,
)
from harness.spec.subjects import PLACEHOLDERS

# -- the terms the entries use ------------------------------------------------------------------------

COUNT = f"N | {' | '.join(COUNT_WORDS)} | {{{'|'.join(COMPARISONS)}: N | {' | '.join(COUNT_WORDS)}}}"
DURATION = f"seconds (5, 2.5) or text ('5s', '500ms', '1m'), at most {MAX_DURATION_S:g}s"
TERMS = {
    "COUNT": f"{COUNT}. A bare value means equals. all: the subject's devices present now; healthy: those "
             "present and healthy (read off the fake hardware when the count is judged).",
    "DEV": "a device: its inventory ID (gpu-0), '@N' (the subject's N-th inventory device, from @0), or "
           "'@pod:NAME' (the device the kubelet gave pod NAME). `fakelet scenario check` looks IDs up in the "
           "inventory of every subject the file names.",
    "S": f"a duration: {DURATION}.",
    "C": f"a temperature in degrees C, {TEMPERATURES}.",
}

# -- what each step, op and key means ---------------------------------------------------------------------

STEP_MEANING = {
    "kubelet": "Start, stop, restart or reboot the kubelet (the fake one, or the real node's).",
    "plugin": "Start, stop, kill or restart the subject, or roll it over to a second instance.",
    "pod": "Create or delete a pod that asks for devices. A pod created while the kubelet is down is admitted "
           "when it starts; a DRA pod gets one claim for N devices, through the real scheduler path. Each wait "
           f"(for the pod to run, to be gone) says its bound and, every {PROGRESS_EVERY_S:g} s while it runs, how "
           "long of it has passed. A pod not running at the bound is narrated as given up and the scenario goes on "
           "(its phase is the node's); a pod not gone at the bound makes the run inconclusive. A pod created "
           "again after its delete step gets its old names in the API server (its old claim deleted first), as a "
           "manifest applied again does. A key the node cannot honour makes the run inconclusive, saying why: the fake "
           "kubelet's device-plugin pods are no Pod objects, so they take no grace_period or tolerations.",
    "device": "Change one fake device (what `fakelet devices` does in a live session), or make the fake NVML "
              "library fail.",
    "script": "A timed fault script on one device: it runs in the background; the next steps go on at once.",
    "taint": "Make a DeviceTaintRule (DRA): for one device (its driver, pool and name), or with a deviceSelector of "
             "your own (driver, pool, device, each optional; {} is the empty selector, which selects every device "
             "of every driver in the cluster, as the API specifies). The kube-controller-manager's device-taint "
             "eviction controller evicts the pods on what a NoExecute rule selects, on either kubelet. A None rule "
             "only informs: nothing is kept away or evicted, and the step waits (within the reaction bound) for "
             "what the eviction controller posts on the rule, what a NoExecute one would evict, and narrates it.",
    "untaint": "Remove DeviceTaintRules an earlier taint step made: those for a device, the one of a name, or those "
               "with the same selector (DRA).",
    "hold": "Let time pass: a fault's duration (the kubelet stays down 5 s). Never a sync point: wait for what "
            "you need instead. With {call: CALL}: keep the kubelet's next call of CALL in flight until a release "
            "step, until the kubelet that holds it stops (its call dies with it), or, for a DRA call, until the "
            "kubelet's own deadline on it passes (45 s, dra_plugin.go defaultClientCallTimeout; Allocate has none), "
            "so that a fault can happen meanwhile. Register, the call the kubelet serves, is held unanswered: the "
            "plugin waits. Allocate, NodePrepareResources and NodeUnprepareResources, calls the kubelet makes, "
            "reach the plugin, and its answer is held back from the kubelet: the plugin has done its part "
            "(allocated; prepared, its CDI spec written) and the kubelet has not heard, the window that a kubelet "
            "restart or a pod deletion hits in the reported bugs (kubernetes#116411). The running kubelet's fault "
            "plan holds it, or, if none runs, the next one started's: on the fake kubelet its own (its registration "
            "service, its device manager's and DRA manager's clients), on a real kubelet the relay's, on the wire. "
            "A pod step whose pod meets the held call returns once it is held, the pod waiting (Pending; "
            "Terminating for a held NodeUnprepareResources).",
    "release": "Let a call held by `hold: {call: ...}` go on: the kubelet answers the held Register, or gets the "
               "plugin's answer to the held call it made. A no-op, narrated, once the call has ended otherwise.",
    "reject": "Make the kubelet refuse the next Register it receives with an error answer, as a kubelet that "
              "rejects a registration does (the running kubelet's fault plan, or, if none runs, the next one "
              "started; on a real kubelet, the relay's, on the wire). A correct plugin retries, or exits non-zero "
              "for its DaemonSet to start it again (DP-REG-07): when the kubelet it was armed for starts, the step "
              "waits for the rejected call and the plugin's reaction, and starts a plugin that exited non-zero "
              "again, as its DaemonSet would.",
    "socket": "Delete a socket, as a bug report's manual `rm` does; whoever serves it keeps serving the deleted "
              "path. A device plugin's: the kubelet's kubelet.sock, the plugin's registered endpoint, or a socket by "
              "file name in the device-plugins directory. A DRA driver's: its registration socket in "
              "plugins_registry (the kubelet's plugin watcher sees it go and deregisters the driver), the endpoint "
              "it registered (its dra.sock: open connections go on, new dials find nothing), or a socket by file "
              "name in plugins_registry or plugins/<driver>. Never outside the sandbox. On a real kubelet the "
              "relay (the DP relay, the DRA relay) mirrors the deletion to the kubelet's side.",
    "wait": "A precondition: wait until every condition holds. If it never holds within the bound, the run is "
            "inconclusive (the scenario could not get where the report starts).",
    "expect": "The correct behaviour: every condition must hold within the bound (or for the whole span of "
              "throughout). If it does not, the bug reproduced.",
    "story": "A scripted story with its own verdict.",
    "check": "Run one conformance check on this scenario's environment; its failure is the symptom.",
}
OP_MEANING = {
    "kubelet": {
        "start": "start the kubelet",
        "stop": "stop it; its sockets stay behind, as a real kubelet's do",
        "restart": "stop it and start a new instance, which deletes the plugin sockets, as the real one does",
        "restart-keep-sockets": "stop and start it, the plugin sockets left in place",
        "reboot": "stop everything, wipe every socket and the CDI dir, keep /var/lib/kubelet and the plugin's own "
                  "state, start the kubelet, re-admit the pods that ran, then start the plugin",
        "drop-health-stream": "DRA, fake kubelet: its NodeWatchResources stream to the driver ends as a broken "
                              "connection ends it (the health it showed is cleared: Unknown); it opens the next one "
                              "after 5 s (dra_plugin_manager.go add(): wait.UntilWithContext)",
    },
    "plugin": {
        "start": "start the subject (before the kubelet, too)",
        "stop": "SIGTERM",
        "kill": "SIGKILL: no cleanup",
        "restart": "SIGTERM, then start it again",
        "crash": "SIGKILL, then start it again (its DaemonSet restarts it)",
        "rolling-update": "a DaemonSet update with surge: a second instance (the command plus args; with defect, "
                          "the subject's command as that mutant) starts and registers while the first serves; then "
                          "the first gets SIGTERM",
    },
    "device": {
        "fail": "the device turns unhealthy", "recover": "it is healthy again",
        "unplug": "it disappears", "plug": "it comes back",
        "heat": "its temperature rises to `to`", "cool": "its temperature falls to `to`",
        "ecc": "`count` uncorrectable ECC errors", "xid": "an NVIDIA XID event with `code`",
        "nvml-init-error": "the fake NVML's nvmlInit returns this NVML code (0: works again)",
        "nvml-wait-error": "its nvmlEventSetWait returns this NVML code (0: works again)",
    },
    "script": {
        "flap": "fail and recover the device `cycles` times, `period` apart",
        "ramp": "heat from `from` to `to` in steps of `step` every `period`, then cool back",
        "unplug-replug": "unplug the device, and plug it back after `down`",
        "ecc-burst": "`count` ECC errors, `period` apart",
    },
    "story": {"taint-eviction": "KEP-5055: a pod's device is tainted NoExecute; the pod is evicted (after its "
                                "toleration), its claim unprepared and its CDI spec removed"},
}
VALUE_KEY_MEANING = {
    "to": ("C", "the temperature"), "count": ("N", "how many"), "code": ("N", "the XID number"),
    "period": ("S", "time between changes"), "cycles": ("N", "how many fail-recover cycles"),
    "from": ("C", "the starting temperature"), "step": ("C", "degrees per change"),
    "down": ("S", "how long the device stays unplugged"),
}
CONDITION_MEANING = {
    "registered": "the plugin registered with the running kubelet instance",
    "capacity": "the node's capacity of the subject's resource (or of `resource`)",
    "allocatable": "the node's allocatable of the subject's resource (or of `resource`)",
    "pod": "a pod's phase and reason",
    "pod_devices": "the devices (of every resource) the kubelet's PodResources List gives a pod",
    "pod_resources": "the PodResources API as a monitoring agent reads it: List (or Get) for one pod, or "
                     "GetAllocatableResources for the node",
    "resources_status": "a pod's allocatedResourcesStatus: the health of every device it was given",
    "calls": "the kubelet's calls to the plugin of one method",
    "checkpoint": "the kubelet's checkpoint: the device manager's entries of a pod, or the DRA manager's claims",
    "cdi": ("whether the CDI spec files define the devices of a pod's claims (gone: its claims' own devices; "
            "a device every claim shares may stay)"),
    "dialed": "the kubelet's dials of one socket",
    "held": "a call held by `hold: {call: ...}` is in flight now: the kubelet's Register unanswered, or the "
            "plugin's answer to a call the kubelet made held back from it (not released, its kubelet running, its "
            "deadline not passed)",
    "slices": "the devices the driver published in its ResourceSlices",
    "device_health": "each device's health as the kubelet holds it from the driver's DRAResourceHealth stream "
                     "(Unknown once timed out or its stream ended): what a pod on that device shows at its "
                     "status's next post",
    "taints": "the taints on the driver's devices that keep claims away (NoSchedule, NoExecute; a None taint keeps "
              "nothing away and is never counted): by default those the driver publishes in its ResourceSlices; "
              "with from: rules those of DeviceTaintRules, with from: both either, which is what the scheduler "
              "and the device-taint eviction controller act on",
    "not": "holds when the conditions under it do not all hold",
}
KEY_MEANING = {
    ("pod", "name"): "the pod (made by a pod step)",
    ("pod", "phase"): "its phase now (Deleted: gone)",
    ("pod", "reason"): "text its reason or message contains",
    ("pod_devices", "pod"): "the pod", ("pod_devices", "count"): "how many devices PodResources lists for it",
    ("resources_status", "pod"): "the pod", ("resources_status", "health"): "the health every device must show",
    ("calls", "method"): f"the call: {', '.join(KUBELET_CALLS)} (a full name such as v1beta1.DevicePlugin/"
                         "Allocate works too)",
    ("calls", "count"): "how many were made, whatever their outcome; a stream counts once, as it is opened",
    ("calls", "since"): "count from the scenario's start, or from the start of this wait or expect step",
    ("checkpoint", "pod"): "a pod's entries in the device-manager checkpoint",
    ("checkpoint", "devices"): "how many devices (of the pod, or of every DRA claim)",
    ("checkpoint", "claims"): "how many claims the DRA checkpoint holds",
    ("cdi", "pod"): "the pod", ("cdi", "present"): "whether its claims' CDI devices are defined",
    ("dialed", "socket"): "the socket's file name, or its whole path",
    ("dialed", "count"): "how many dials, whatever their outcome",
    ("dialed", "plugin_instance"): "only the dials made while the subject's N-th process served the socket "
                                   "(numbered by start over the run, from 1: a restart is the next number, so is "
                                   "a rolling update's new instance)",
    ("dialed", "since"): "count from the scenario's start, or from the start of this wait or expect step",
    ("slices", "devices"): "how many devices the slices list",
    ("device_health", "healthy"): "devices the kubelet must hold Healthy",
    ("device_health", "unhealthy"): "devices the kubelet must hold Unhealthy",
    ("taints", "only"): "the devices that may carry such a taint: any other that does breaks it",
    ("taints", "no_execute"): "the devices that may carry a NoExecute taint: any other that does breaks it",
    ("taints", "from"): "whose taints count: driver (its ResourceSlices' devices[].taints), rules (every "
                        "DeviceTaintRule in the cluster, whoever made it, on the devices its selector selects) or "
                        "both",
    ("held", "call"): "the held call (Register or Allocate for a device plugin; NodePrepareResources or "
                      "NodeUnprepareResources for a DRA driver)",
    ("pod_resources", "pod"): "the pod (List, or Get for it alone)",
    ("pod_resources", "resource"): "whose devices to count",
    ("pod_resources", "devices"): "how many devices of that resource (DRA: the claims' devices of the driver)",
    ("pod_resources", "present"): "whether the pod is listed (Get: not 'not found')",
    ("pod_resources", "via"): "List, or Get (needs the kubelet's KubeletPodResourcesGet feature gate)",
    ("pod_resources", "allocatable"): "GetAllocatableResources: the resource to count the node's devices of",
    ("capacity", "resource"): "any extended resource the node reports", ("capacity", "count"): "its count",
    ("allocatable", "resource"): "any extended resource the node reports", ("allocatable", "count"): "its count",
}
DEFAULTS = {
    ("dialed", "count"): "{at_least: 1}", ("dialed", "since"): "scenario", ("calls", "since"): "scenario",
    ("pod_resources", "via"): "List", ("taints", "from"): "driver",
    ("pod_resources", "resource"): "the subject's resource (a DRA driver: its driver name)",
}
WIRE = ("fake: yes. real: through the relay that records the real kubelet's side of the plugin wire (device "
        "plugins and DRA drivers alike: each connection the kubelet opens is a dial); without one, inconclusive, "
        "never 0")
OBSERVED = {
    "registered": "fake: its accepted Register of this kubelet instance. real: a device plugin's resource in "
                  "the node's capacity; a DRA driver's registrations per endpoint (the relay's record, less "
                  "the endpoints the kubelet's log deregisters): one live endpoint is enough",
    "capacity": "fake and real (the Node's status)", "allocatable": "fake and real (the Node's status)",
    "pod": "fake and real (on the real node, the Pod as the API server shows it)",
    "pod_devices": "fake and real (their PodResources List)",
    "pod_resources": "fake; real when its PodResources socket is in fakelet's reach (else inconclusive)",
    "resources_status": "fake and real (a DRA pod's status as the API server shows it, as the kubelet posted it: "
                        "after a health message that changed a device, or at a pod sync, never when read)",
    "calls": WIRE, "dialed": WIRE,
    "held": "fake and real (the fake kubelet's fault plan; on the real node the relay holds it on the wire: the DP "
            "relay's Register and Allocate, the DRA relay's NodePrepareResources and NodeUnprepareResources)",
    "checkpoint": "fake and real (the real node's own file, read in its private /var/lib/kubelet)",
    "cdi": "fake and real (the CDI dir)", "slices": "fake and real (ResourceSlices on the API server)",
    "taints": "fake and real (ResourceSlices and DeviceTaintRules on the API server)",
    "device_health": "fake and real (the fake kubelet's health cache; on the real node the DRA relay's copy, "
                     "upstream's cache rules applied to the health messages it carries to the kubelet: evidence "
                     "of what the driver sent and when, not of the real kubelet's cache code, whose bugs show "
                     "in resources_status)",
    "not": "as its conditions",
}
COUNTED = {
    "calls": "timeline events: every call of the method the kubelet made to the plugin, counted from the "
             "scenario's start (since: step: from the step's start)",
    "dialed": "timeline events: every dial of the socket the kubelet made, counted from the scenario's start "
              "(since: step: from the step's start)",
    "held": "timeline events: the fault plan's firing on the held call, since the hold step armed it",
}
JUDGED = ("a state, judged on what the node shows: wait and expect judge again at every event on the timeline "
          "until it holds, and it counts once it has kept holding for 1.5 node-status periods (glimpse: true takes "
          "the first moment); expect with throughout judges at every event of the span, capacity and allocatable "
          "also as each recorded change left them, so a change that lasted a millisecond counts")


# -- the entries --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Key:
    name: str
    takes: str
    default: str = ""  # "" when required
    meaning: str = ""


@dataclass(frozen=True)
class Entry:
    name: str
    what: str  # "step" or "condition"
    form: str
    meaning: str
    values: tuple[tuple[str, str], ...] = ()  # a step's ops and what each does
    keys: tuple[Key, ...] = ()
    notes: tuple[str, ...] = field(default_factory=tuple)


def _takes(want: Any) -> str:
    """What a shape's key takes, as vocabulary._shape checks it."""
    if want is str:
        return "text"
    if want is bool:
        return "true | false"
    if isinstance(want, tuple):
        return " | ".join(want)
    return {"count": "COUNT", "number": f"N | {{{'|'.join(COMPARISONS)}: N}}", "instance": "N (from 1)",
            "devices": "[DEV, ...]"}[want]


def _shape_keys(name: str, shape: dict[str, Any], required: tuple[str, ...]) -> tuple[Key, ...]:
    return tuple(Key(k, _takes(v), "" if k in required else DEFAULTS.get((name, k), "(not given: not judged)"),
                     KEY_MEANING[(name, k)]) for k, v in shape.items())


def _only(name: str) -> tuple[str, ...]:
    if name in DRA_ONLY:
        return ("DRA drivers only (kind: dra).",)
    if name in DP_ONLY:
        return ("device plugins only (kind: device-plugin).",)
    return ()


def _holdable() -> str:
    """The calls `hold`, `release` and `held` take, each with the kind of scenario it is for."""
    whose = {"device-plugin": "device plugins", "dra": "DRA"}
    return "; ".join(f"{' | '.join(c for c in HOLDABLE_CALLS if CALL_KINDS[c] == kind)} ({words})"
                     for kind, words in whose.items())


def _only_action(name: str) -> tuple[str, ...]:
    return ("device plugins only (kind: device-plugin).",) if name in DP_ONLY_ACTIONS else ()


TOLERATION_FORM = "{" + ", ".join(f"{k}: {v}" for k, v in (
    ("key", "K"), ("operator", " | ".join(TOLERATION_OPERATORS)), ("value", "V"), ("effect", "E"),
    ("toleration_seconds", "N"))) + "}"
# The pod step's keys, one meaning each (steps() lists them in the validator's order, POD_CREATE_KEYS then
# POD_DELETE_KEYS, so a key the validator takes cannot go undocumented).
POD_KEYS = {
    "create": Key("create", "NAME (lower-case letters, digits, '-')", "(one of create and delete)",
                  "the pod to create"),
    "devices": Key("devices", "N (0 to 64)", "1", "with create: how many devices it asks for"),
    "grace_period": Key(
        "grace_period", f"S, whole seconds (0 to {MAX_GRACE_PERIOD_S})",
        "(not given: the node's own, 1 s; on delete, the pod's)",
        "with create: the Pod's spec.terminationGracePeriodSeconds; with delete: the DeleteOptions' "
        "gracePeriodSeconds (kubectl delete --grace-period). 0 removes the Pod from the API server at once, "
        "before the kubelet has stopped it or unprepared its claims (pkg/registry/core/pod/strategy.go "
        "CheckGracefulDelete), as kubectl delete --grace-period=0 --force does (kubectl alone turns 0 into 1)"),
    "tolerations": Key(
        "tolerations", f"[{TOLERATION_FORM}, ...] (1 to {MAX_TOLERATIONS})", "(not given: none)",
        "with create: what the pod tolerates. A DRA pod's go to its claim's device request "
        "(spec.devices.requests[].exactly.tolerations, resource.k8s.io/v1 DeviceToleration): they let the "
        "scheduler allocate, and the eviction controller leave, a device a DeviceTaintRule or its driver taints; "
        f"effect {' | '.join(DEVICE_TOLERATION_EFFECTS)}. A device-plugin pod's are its spec.tolerations (core/v1 "
        f"Toleration, node taints; effect {' | '.join(POD_TOLERATION_EFFECTS)}), on the real node in place of the "
        "toleration of every taint it gives its pods otherwise. operator defaults to Equal; no key needs Exists; "
        f"Exists takes no value; toleration_seconds (0 to {MAX_TOLERATION_S}, tolerationSeconds) goes with "
        "effect NoExecute; no effect matches every effect"),
    "timeout": Key(
        "timeout", "S", "a DRA pod: the reaction bound plus the DRA call timeout, 30 + 45 = 75 s; a device-plugin "
        f"pod on the real node: {POD_START_TIMEOUT_S:g} s; the fake kubelet's device-plugin pods: nothing waits",
        "the bound of the step's wait: with create, for the pod to run (its claims prepared); with delete, for "
        "the Pod to be gone from the API server"),
    "delete": Key("delete", "NAME", "(one of create and delete)", "the pod to delete"),
}


POD_FORM = {"create": "NAME", "delete": "NAME", "devices": "N", "grace_period": "S", "tolerations": "[...]",
            "timeout": "S"}


def _pod_form(keys: tuple[str, ...]) -> str:
    """{create: NAME, [devices: N], ...}: the form's first key is required, the others optional."""
    return "{" + ", ".join(f"{k}: {POD_FORM[k]}" if n == 0 else f"[{k}: {POD_FORM[k]}]"
                           for n, k in enumerate(keys)) + "}"


def steps() -> list[Entry]:
    within = Key("within", "S", "the reaction bound: the kubelet's 30 s (--reaction-bound shortens it), counted once "
                 "a plugin still starting has started", "how long the conditions have to come true")
    glimpse = Key("glimpse", "true | false", "false", "take the first moment every condition holds, instead of "
                  "asking the states to keep holding for 1.5 node-status periods (not with throughout)")
    placeholders = {kind: ", ".join("{" + p + "}" for p in names) for kind, names in PLACEHOLDERS.items()}
    out = [
        Entry("kubelet", "step", f"kubelet: {' | '.join(KUBELET_OPS)}  [checkpoint: {' | '.join(CHECKPOINT_FAULTS)}]",
              STEP_MEANING["kubelet"], tuple(OP_MEANING["kubelet"].items()),
              (Key("checkpoint", " | ".join(CHECKPOINT_FAULTS), "(not given: the checkpoint as it is)",
                   "with start, restart, restart-keep-sockets or reboot: the device-manager checkpoint is deleted "
                   "(lost) or overwritten with garbage (corrupt) before the kubelet starts"),)),
        Entry("plugin", "step", f"plugin: {' | '.join(PLUGIN_OPS)}  [during: CALL]  [args: [ARG, ...]]  "
              f"[defect: NAME | {NO_DEFECT}]",
              STEP_MEANING["plugin"], tuple(OP_MEANING["plugin"].items()),
              (Key("during", " | ".join(PLUGIN_CALLS), "(not given: it dies at once)",
                   "kill and crash only: SIGKILL as the kubelet sends its next call of this method, before the "
                   "request goes out, so the plugin never answers it"),
               Key("args", "[text, ...]", "[]",
                   "rolling-update only: arguments added to the new instance's command (its new pod spec). "
                   "Placeholders are filled as in the subject's command: device plugins "
                   f"{placeholders['device-plugin']}; DRA drivers also "
                   + ", ".join("{" + p + "}" for p in PLACEHOLDERS["dra"] if p not in PLACEHOLDERS["device-plugin"])
                   + "; an unknown one is an error before the run. {free_port} is a new port. A socket path an "
                   "argument makes (a .sock path or name, a DRA driver's --pod-uid sockets) that a unix socket "
                   "address cannot hold (107 bytes) is an error before the run, with its length."),
               Key("defect", f"NAME | {NO_DEFECT}", "(not given: the old instance's command)",
                   "rolling-update only: the new instance runs as that mutant of the subject (one of its defects, "
                   "as --defect NAME makes one of the first), its command the subject's own plus the defect's "
                   f"arguments and args; {NO_DEFECT}: the subject's command without a defect. An upgrade from a "
                   "correct plugin to a buggy one, or back. `fakelet scenario check` refuses a name that is not a "
                   "defect of every subject the file runs (only subjects with defects, such as the reference ones, "
                   "have any)."))),
        Entry("pod", "step", f"pod: {_pod_form(POD_CREATE_KEYS)} | {_pod_form(POD_DELETE_KEYS)}",
              STEP_MEANING["pod"], (), tuple(POD_KEYS[k] for k in dict.fromkeys((*POD_CREATE_KEYS, *POD_DELETE_KEYS)))),
        Entry("device", "step", "device: {OP: DEV[, KEY: VALUE]}", STEP_MEANING["device"],
              tuple((op, OP_MEANING["device"][op] + (f"; takes {DEVICE_VALUE[op]}: "
                                                      f"{VALUE_KEY_MEANING[DEVICE_VALUE[op]][0]}"
                                                      if op in DEVICE_VALUE else "")
                     + ("; its value is the NVML return code (0 to 999), not a DEV" if op in NVML_CONTROLS else ""))
                    for op in DEVICE_OPS),
              tuple(Key(k, {"to": "C", "count": f"N (1 to {DEVICE_VALUE_MAX['count']})",
                            "code": f"N (1 to {DEVICE_VALUE_MAX['code']})"}[k],
                        "1" if k == "count" else "", VALUE_KEY_MEANING[k][1])
                    for k in dict.fromkeys(DEVICE_VALUE.values()))),
        Entry("script", "step", "script: {NAME: DEV, KEY: VALUE, ...}", STEP_MEANING["script"],
              tuple((name, f"{OP_MEANING['script'][name]} (takes {', '.join(keys)})")
                    for name, keys in SCRIPTS.items()),
              tuple(Key(k, VALUE_KEY_MEANING[k][0] if k not in ("cycles", "count") else "N (1 to 1000)", "",
                        VALUE_KEY_MEANING[k][1]) for k in dict.fromkeys(k for ks in SCRIPTS.values() for k in ks)),
              (f"a ramp has at most {MAX_RAMP_STEPS} steps.",)),
        Entry("taint", "step", "taint: {device: DEV | selector: SELECTOR, effect: EFFECT, key: KEY, [name: NAME]}",
              STEP_MEANING["taint"], (),
              (Key("device", "DEV", "(one of device and selector)",
                   "one device: the rule selects its driver, pool and device name"),
               Key("selector", "{[driver: D], [pool: P], [device: DEV]}", "(one of device and selector)",
                   "the rule's deviceSelector, each key narrowing it; {} is the empty selector (every device in the "
                   f"cluster). D: a driver name or {SELECTOR_WORDS['driver']} (the subject's); P: a pool name or "
                   f"{SELECTOR_WORDS['pool']} (the pool named after the run's node); DEV as in the terms, or a "
                   "device name. Each is checked as the API server checks it (a driver a DNS-1123 subdomain of at "
                   f"most {DRIVER_NAME_MAX}, a pool's '/'-parts DNS-1123 subdomains, at most {POOL_NAME_MAX} in "
                   "all, a device a DNS-1123 label)"),
               Key("effect", " | ".join(TAINT_EFFECTS), TAINT_EFFECTS[0],
                   f"the taint's effect; None (an API server from {NONE_SINCE} on) informs only: no scheduling or "
                   "eviction effect"),
               Key("key", "text", DEFAULT_TAINT_KEY, "the taint's key (a label name)"),
               Key("name", "NAME (a DNS-1123 label)", "(not given: named after the device, or the step)",
                   "the rule's name, for untaint: {rule: NAME} (the object is <node>-NAME)")), _only("taint")),
        Entry("untaint", "step", "untaint: {device: DEV} | {rule: NAME} | {selector: SELECTOR}",
              STEP_MEANING["untaint"], (),
              (Key("device", "DEV", "(one of device, rule and selector)", "the rules made for this device"),
               Key("rule", "NAME", "(one of device, rule and selector)", "the rule a taint step named"),
               Key("selector", "{[driver: D], [pool: P], [device: DEV]}", "(one of device, rule and selector)",
                   "the rules made with this same selector")), _only("untaint")),
        Entry("hold", "step", "hold: S | {call: CALL}", STEP_MEANING["hold"], (),
              (Key("call", _holdable(), "(not given: a duration)", "the call to keep in flight"),)),
        Entry("release", "step", "release: {call: CALL}", STEP_MEANING["release"], (),
              (Key("call", _holdable(), "", "the held call to let go on"),), _only_action("release")),
        Entry("reject", "step", "reject: {call: CALL}", STEP_MEANING["reject"], (),
              (Key("call", " | ".join(REJECTABLE_CALLS), "", "the call to refuse, once"),), _only_action("reject")),
        Entry("socket", "step", f"socket: {{delete: {' | '.join(KUBELET_SOCKET_WORDS)} | NAME}}  (device plugins)  "
              f"| {{delete: {' | '.join(DRA_SOCKET_WORDS)} | NAME}}  (DRA)", STEP_MEANING["socket"], (),
              (Key("delete", f"{' | '.join((*KUBELET_SOCKET_WORDS, *DRA_SOCKET_WORDS))} | NAME", "",
                   "device plugins: kubelet.sock, the plugin's registered endpoint, or a socket's file name in the "
                   "device-plugins directory; DRA drivers: registration (its socket in plugins_registry), service "
                   "(the endpoint it registered), or a socket's file name in plugins_registry or plugins/<driver> "
                   "(no path)"),), _only_action("socket")),
        Entry("wait", "step", "wait: CONDITIONS  [within: S]  [glimpse: true]", STEP_MEANING["wait"], (),
              (within, glimpse),
              (f"CONDITIONS: a mapping of {', '.join(CONDITIONS)} (fakelet scenario vocabulary CONDITION); all "
               "must hold at once.",)),
        Entry("expect", "step", "expect: CONDITIONS  [within: S | throughout: S]  [glimpse: true]",
              STEP_MEANING["expect"], (),
              (within, glimpse,
               Key("throughout", "S", "(not given: within)", "the conditions must hold for the whole span, "
                   "judged at every event, capacity and allocatable as each recorded change left them")),
              ("give within or throughout, not both.",)),
        Entry("story", "step", f"story: {' | '.join(STORIES)}  [toleration_seconds: N]", STEP_MEANING["story"],
              tuple(OP_MEANING["story"].items()),
              (Key("toleration_seconds", "N (0 to 3600)", "(not given: no toleration, evicted at once)",
                   "the pod tolerates the NoExecute taint this long"),), _only("story")),
        Entry("check", "step", "check: CHECK-ID", STEP_MEANING["check"], (), (),
              ("CHECK-ID: a check of the scenario's kind (fakelet checks).",)),
    ]
    return out


def conditions() -> list[Entry]:
    out = []
    for name in CONDITIONS:
        notes = [f"observed on: {OBSERVED[name]}.", f"{COUNTED.get(name, JUDGED)}.", *_only(name)]
        if name == "registered":
            entry = Entry(name, "condition", "registered: true", CONDITION_MEANING[name], (), (), tuple(notes))
        elif name in ("capacity", "allocatable"):
            entry = Entry(name, "condition", f"{name}: COUNT | {{resource: R, count: N}}", CONDITION_MEANING[name],
                          (), _shape_keys(name, RESOURCE_SHAPE, tuple(RESOURCE_SHAPE)), tuple(notes))
        elif name == "held":
            entry = Entry(name, "condition", "held: {call: CALL}", CONDITION_MEANING[name], (),
                          (Key("call", _holdable(), "", KEY_MEANING[("held", "call")]),), tuple(notes))
        elif name == "not":
            entry = Entry(name, "condition", "not: CONDITIONS", CONDITION_MEANING[name], (), (), tuple(notes))
        elif name == "pod_resources":
            pod, node = POD_RESOURCES_SHAPES["pod"], POD_RESOURCES_SHAPES["allocatable"]
            keys = _shape_keys(name, pod, ("pod",)) + _shape_keys(name, {"allocatable": node["allocatable"]},
                                                                  ("allocatable",))
            notes.insert(0, "give pod (with devices, present or both) or allocatable (with devices), not both.")
            entry = Entry(name, "condition", "pod_resources: {pod: NAME, ...} | {allocatable: R, devices: COUNT}",
                          CONDITION_MEANING[name], (), keys, tuple(notes))
        else:
            shape = CONDITION_SHAPES[name]
            form = ", ".join(k if k in CONDITION_REQUIRED.get(name, ()) else f"[{k}]" for k in shape)
            if name == "checkpoint":
                notes.insert(0, "{pod: NAME, devices: COUNT} (device manager) or {claims: COUNT, devices: COUNT} "
                                "(DRA).")
            entry = Entry(name, "condition", f"{name}: {{{form}}}", CONDITION_MEANING[name], (),
                          _shape_keys(name, shape, CONDITION_REQUIRED.get(name, ())), tuple(notes))
        out.append(entry)
    return out


def entries() -> list[Entry]:
    return [*steps(), *conditions()]


def find(name: str) -> list[Entry]:
    """The entries named `name` (a step and a condition may share one: pod)."""
    return [e for e in entries() if e.name == name]


def names() -> list[str]:
    return list(dict.fromkeys([*ACTIONS, *CONDITIONS]))


# -- rendering ----------------------------------------------------------------------------------------


def _default(key: Key) -> str:
    """required, `default X`, or what leaving it out means (a default written in parentheses)."""
    if not key.default:
        return "required"
    return key.default[1:-1] if key.default.startswith("(") else f"default {key.default}"


def text(chosen: list[Entry] | None = None) -> str:
    picked = entries() if chosen is None else chosen
    lines: list[str] = []
    if chosen is None:
        lines += ["Scenario files (fixtures/scenarios/*.yaml): steps, then the conditions wait and expect take.",
                  "Terms:"] + [f"  {k:6} {v}" for k, v in TERMS.items()] + [""]
    for entry in picked:
        lines.append(f"{entry.what} {entry.name}:  {entry.form}")
        lines.append(f"  {entry.meaning}")
        for value, meaning in entry.values:
            lines.append(f"    {value:22} {meaning}")
        for key in entry.keys:
            default = _default(key)
            lines.append(f"    {key.name + ':':22} {key.takes}  ({default})")
            lines.append(f"    {'':22} {key.meaning}")
        lines += [f"  {note}" for note in entry.notes]
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def markdown() -> str:
    def cell(value: str) -> str:
        return value.replace("|", "\\|")

    lines = ["# Scenario vocabulary", "",
             "Generated by `fakelet scenario vocabulary --format markdown` from the validator's own tables.", "",
             "## Terms", ""]
    lines += [f"- **{k}**: {cell(v)}" for k, v in TERMS.items()]
    for title, what in (("Steps", "step"), ("Conditions (for wait and expect)", "condition")):
        lines += ["", f"## {title}"]
        for entry in (e for e in entries() if e.what == what):
            lines += ["", f"### `{entry.name}`", "", f"`{entry.form}`", "", entry.meaning]
            if entry.values:
                lines += ["", "| value | does |", "| --- | --- |"]
                lines += [f"| `{v}` | {cell(m)} |" for v, m in entry.values]
            if entry.keys:
                lines += ["", "| key | takes | default | meaning |", "| --- | --- | --- | --- |"]
                lines += [f"| `{k.name}` | {cell(k.takes)} | {cell(_default(k))} | {cell(k.meaning)} |"
                          for k in entry.keys]
            if entry.notes:
                lines += [""] + [f"- {note}" for note in entry.notes]
    return "\n".join(lines) + "\n"
