"""The plain model beside the real subject: what a correct plugin and kubelet show after each step.

The model never looks at the subject. It is moved by the rules (rules.py) as the hardware and
the kubelet are, and `expectations` turns it into the invariants the next `expect` step holds
the subject to, each under the kubelet's own bound (harness/spec/profiles.py). The invariants
are what the node shows an operator (registration, capacity, allocatable, a pod's phase,
published slices, CDI files), judged as the scenario engine judges every `expect`: the state
must be reached within the bound and then hold for a node-status period (conditions.py HOLD_S).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from harness.spec.profiles import DRA_CALL_TIMEOUT_S, DRA_HEALTH_RETRY_S, DRA_HEALTH_TIMEOUT_S, REREGISTER_BOUND_S

DP, DRA = "device-plugin", "dra"
# What the kubelet's devicemanager reports once a plugin's stream ends (endpoint.go: every device of a stopped
# endpoint turns unhealthy), and what a DRA pod's claim holds: one device each, as the scenario engine's pods.
POD_DEVICES = 1
MAX_PODS = 2  # pods alive at once: enough to make allocation and re-admission matter, few enough to stay fast


@dataclass(frozen=True)
class Invariant:
    """One thing a correct node shows, with the upstream bound it is held to."""

    id: str  # EXP-..., the check ID a finding is reported under
    title: str
    bound: str  # the upstream bound, as a person reads it
    kinds: tuple[str, ...]


INVARIANTS: dict[str, Invariant] = {i.id: i for i in (
    Invariant("EXP-DP-REGISTERED", "a running plugin is registered with the running kubelet",
              f"T = {REREGISTER_BOUND_S:g} s (re-registration after a kubelet restart, device_plugin_test.go)", (DP,)),
    Invariant("EXP-DP-CAPACITY", "capacity equals the devices present",
              f"T = {REREGISTER_BOUND_S:g} s (the device plugin's reaction bound)", (DP,)),
    Invariant("EXP-DP-ALLOCATABLE", "allocatable equals the devices present, healthy and not over temperature",
              f"T = {REREGISTER_BOUND_S:g} s (the device plugin's reaction bound)", (DP,)),
    Invariant("EXP-DP-STOPPED", "a stopped plugin's devices are not allocatable",
              f"T = {REREGISTER_BOUND_S:g} s (endpoint.go: a stopped endpoint's devices turn unhealthy)", (DP,)),
    # Running means its container was created: the runtime refuses an Allocate answer runc cannot carry out
    # (harness/node/real/view.py access_refusals), as the real node's pod stays in CreateContainerError.
    Invariant("EXP-DP-POD", "a pod admitted with free healthy devices runs (its container created from the "
              "Allocate answer), and keeps running",
              f"T = {REREGISTER_BOUND_S:g} s (fakelet's bound on Allocate, which the kubelet calls without one)",
              (DP,)),
    Invariant("EXP-DRA-REGISTERED", "a running driver is registered with the running kubelet",
              f"T = {REREGISTER_BOUND_S:g} s (registration; GetInfo within the kubelet's 1 s)", (DRA,)),
    Invariant("EXP-DRA-SLICES", "the driver publishes every device present",
              f"T = {REREGISTER_BOUND_S:g} s (the driver's reaction bound)", (DRA,)),
    Invariant("EXP-DRA-PREPARED", "a running pod's claims have their CDI devices defined",
              f"{DRA_CALL_TIMEOUT_S:g} s (dra_plugin.go defaultClientCallTimeout) within T", (DRA,)),
    Invariant("EXP-DRA-UNPREPARED", "a deleted (or evicted) pod's claims leave no CDI devices behind",
              f"{DRA_CALL_TIMEOUT_S:g} s (dra_plugin.go defaultClientCallTimeout) within T", (DRA,)),
    # DRA-HLT-01/02's judgement, on what the kubelet holds: a pod on the device reads the same in its status.
    Invariant("EXP-DRA-HEALTH", "a driver that streams health (the subject profile observes health) has the kubelet "
              "hold each device present Healthy, or Unhealthy while failed or over the driver's limit, never "
              "Unknown",
              f"T = {REREGISTER_BOUND_S:g} s; refreshed within the kubelet's {DRA_HEALTH_TIMEOUT_S:g} s health "
              f"timeout (healthinfo.go DefaultHealthTimeout); after a dropped stream, T plus the kubelet's "
              f"{DRA_HEALTH_RETRY_S:g} s retry (dra_plugin_manager.go add())", (DRA,)),
    # DRA-TNT-01's "that device only, NoExecute only when critical, removed on recovery": a driver need not taint
    # at all (a driver without taints passes), but one that does keeps them off healthy devices.
    Invariant("EXP-DRA-TAINTS", "the driver's own taints (NoSchedule, NoExecute) are only on failed, hot or warm "
              "devices, and NoExecute only on failed or hot ones",
              f"T = {REREGISTER_BOUND_S:g} s (the driver's reaction bound)", (DRA,)),
    Invariant("EXP-DRA-EVICTED", "a pod whose device an admin's DeviceTaintRule taints NoExecute is evicted and "
              "its deletion finishes (its claim unprepared)",
              f"T, the {DRA_CALL_TIMEOUT_S:g} s NodeUnprepareResources (dra_plugin.go defaultClientCallTimeout) "
              "within it", (DRA,)),
)}


# Invariants that say what must not appear (a taint on a healthy device): at the first moment after a step they
# hold whatever the subject does, since it has not reacted yet. Each step holds them for a node-status period.
HELD = frozenset({"EXP-DRA-TAINTS"})


@dataclass
class Device:
    present: bool = True
    failed: bool = False
    hot: bool = False
    warm: bool = False  # DRA: past the driver's warning temperature, under its limit: healthy, NoSchedule allowed
    xid: bool = False  # an XID was raised: whether it stays unhealthy is the plugin's policy (reference-nvml-go:
    # healthy again a second later), so the model holds it to nothing until it fails or recovers

    def healthy(self) -> bool:
        """Healthy as the kubelet should list it: present, not failed, not over the plugin's limit."""
        return self.present and not self.failed and not self.hot


@dataclass
class Pod:
    name: str
    devices: int
    running: bool  # the model is sure it runs; False: its phase is not judged (it may have failed to admit)
    deleted: bool = False
    evicted: bool = False  # DRA: a NoExecute DeviceTaintRule on its device: the eviction controller deletes it
    lost: bool = False  # DRA: its device may have failed or overheated under it: a driver that taints NoExecute
    # (optional) has it evicted, one that does not keeps it: nothing about it is judged, nor is it deleted


@dataclass
class Model:
    kind: str
    devices: list[Device]
    kubelet_up: bool = False
    plugin_up: bool = False
    pods: dict[str, Pod] = field(default_factory=dict)
    made: int = 0  # pods made so far: the next one's name
    health: bool = False  # DRA: the driver streams health (the subject profile observes health): judged
    blocked: int = 0  # DRA: devices a DeviceTaintRule keeps away from claims (an evicted pod's, for the example)
    grace_s: float = 0.0  # added to the next judgement's bound (the kubelet's retry after a dropped health stream)

    def live_pods(self) -> list[Pod]:
        return [p for p in self.pods.values() if not p.deleted]

    def free_healthy(self) -> int:
        """Healthy devices no live pod may hold (every live pod counted as holding its devices: the model does
        not know which devices the kubelet chose). A warm device may carry a NoSchedule taint (DRA) and one under a
        DeviceTaintRule does: neither counts."""
        held = sum(p.devices for p in self.live_pods()) + self.blocked
        return sum(1 for d in self.devices if d.healthy() and not d.warm) - held

    def judged_pods(self) -> list[Pod]:
        """Live pods the model is sure run."""
        return [p for p in self.live_pods() if p.running and not p.lost]

    def new_pod_name(self) -> str:
        self.made += 1
        return f"explore-{self.made}"


def expectations(model: Model) -> list[tuple[str, dict[str, Any]]]:
    """(invariant ID, the conditions it holds) for the node as the model says it is now; [] when the node shows
    nothing to judge (no kubelet runs)."""
    if not model.kubelet_up:
        return []
    return _dp(model) if model.kind == DP else _dra(model)


def _dp(model: Model) -> list[tuple[str, dict[str, Any]]]:
    out: list[tuple[str, dict[str, Any]]] = []
    if model.plugin_up:
        present = sum(1 for d in model.devices if d.present)
        sure = sum(1 for d in model.devices if d.healthy() and not d.xid)
        maybe = sum(1 for d in model.devices if d.healthy() and d.xid)
        out.append(("EXP-DP-REGISTERED", {"registered": True}))
        out.append(("EXP-DP-CAPACITY", {"capacity": present}))
        out.append(("EXP-DP-ALLOCATABLE", {"allocatable": {"at_least": sure} if maybe else sure}))
    else:
        out.append(("EXP-DP-STOPPED", {"allocatable": 0}))
    for pod in model.live_pods():
        if pod.running:
            out.append(("EXP-DP-POD", {"pod": {"name": pod.name, "phase": "Running"}}))
    return out


def _dra(model: Model) -> list[tuple[str, dict[str, Any]]]:
    out: list[tuple[str, dict[str, Any]]] = []
    if model.plugin_up:
        present = sum(1 for d in model.devices if d.present)
        out.append(("EXP-DRA-REGISTERED", {"registered": True}))
        out.append(("EXP-DRA-SLICES", {"slices": {"devices": present}}))
        out.append(("EXP-DRA-TAINTS", {"taints": _taints(model)}))
        if model.health:
            out.append(("EXP-DRA-HEALTH", {"device_health": _health(model)}))
    for pod in model.pods.values():
        if pod.lost:
            continue
        if pod.evicted:
            out.append(("EXP-DRA-EVICTED", {"pod": {"name": pod.name, "phase": "Deleted"}}))
        if pod.deleted:
            out.append(("EXP-DRA-UNPREPARED", {"cdi": {"pod": pod.name, "present": False}}))
        elif pod.running:
            out.append(("EXP-DRA-PREPARED", {"cdi": {"pod": pod.name, "present": True}}))
    return out


def _refs(model: Model, keep: Any) -> list[str]:
    return [f"@{i}" for i, d in enumerate(model.devices) if keep(d)]


def _taints(model: Model) -> dict[str, list[str]]:
    # An unplugged device is in no slice: whatever the model says of it, it carries nothing.
    return {"only": _refs(model, lambda d: d.present and (d.failed or d.hot or d.warm)),
            "no_execute": _refs(model, lambda d: d.present and (d.failed or d.hot))}


def _health(model: Model) -> dict[str, list[str]]:
    out = {"healthy": _refs(model, lambda d: d.healthy()),
           "unhealthy": _refs(model, lambda d: d.present and (d.failed or d.hot))}
    return {k: v for k, v in out.items() if v}


def merged(expected: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """The conditions of one `expect` step. Two invariants on one condition key (two pods) cannot share a
    mapping; the later ones are left to their own step (see split)."""
    out: dict[str, Any] = {}
    for _id, conditions in expected:
        for key, value in conditions.items():
            out.setdefault(key, value)
    return out


def split(expected: list[tuple[str, dict[str, Any]]]) -> list[list[tuple[str, dict[str, Any]]]]:
    """The invariants grouped into as few `expect` steps as their condition keys allow (a mapping has each key
    once: two pods' phases are two steps)."""
    groups: list[list[tuple[str, dict[str, Any]]]] = []
    for item in expected:
        for group in groups:
            if not any(key in conditions for _id, conditions in group for key in item[1]):
                group.append(item)
                break
        else:
            groups.append([item])
    return groups
