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

from harness.spec.profiles import DRA_CALL_TIMEOUT_S, REREGISTER_BOUND_S

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
    Invariant("EXP-DRA-UNPREPARED", "a deleted pod's claims leave no CDI devices behind",
              f"{DRA_CALL_TIMEOUT_S:g} s (dra_plugin.go defaultClientCallTimeout) within T", (DRA,)),
)}


@dataclass
class Device:
    present: bool = True
    failed: bool = False
    hot: bool = False
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


@dataclass
class Model:
    kind: str
    devices: list[Device]
    kubelet_up: bool = False
    plugin_up: bool = False
    pods: dict[str, Pod] = field(default_factory=dict)
    made: int = 0  # pods made so far: the next one's name

    def live_pods(self) -> list[Pod]:
        return [p for p in self.pods.values() if not p.deleted]

    def free_healthy(self) -> int:
        """Healthy devices no live pod may hold (every live pod counted as holding its devices: the model does
        not know which devices the kubelet chose)."""
        held = sum(p.devices for p in self.live_pods())
        return sum(1 for d in self.devices if d.healthy()) - held

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
    for pod in model.pods.values():
        if pod.deleted:
            out.append(("EXP-DRA-UNPREPARED", {"cdi": {"pod": pod.name, "present": False}}))
        elif pod.running:
            out.append(("EXP-DRA-PREPARED", {"cdi": {"pod": pod.name, "present": True}}))
    return out


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
