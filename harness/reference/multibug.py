"""Reference plugins with two or three independent bugs at once, which explore's kill rate is measured on.

Issue 38: beside the single mutants, explore must report each bug of a plugin that has several, not only the
first it meets. Each bug here is a mutant of the reference plugin's or driver's catalogue
(harness/reference/defects.py, harness/reference/dra_defects.py), switched on together as `--defect a+b[+c]`
(harness/spec/composition.py).

No bug hides another from explore: each shows after a rule of its own (a kubelet restart, a failed device,
an unplug, a crash, a pod), so an example that reaches one bug's rule need not get past another bug first.
stuck-unhealthy and all-unhealthy-on-one are kept apart for that reason: beside the second, the failure that
starts the first's example already fails the invariant, and the recovery that would show the first is never
judged.

For each bug: the explore invariant expected to report it (harness/explore/model.py INVARIANTS), the rules
that reach it (harness/explore/rules.py RULES), and a check of the kill matrix that it fails on its own
(its `kills` in the subject file) and still fails with the other bugs beside it.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.spec.composition import SEPARATOR


@dataclass(frozen=True)
class Bug:
    defect: str  # one mutant of the subject's catalogue
    invariant: str  # EXP-...: what explore reports it under
    rules: tuple[str, ...]  # explore's rules that show it, in the order an example takes them
    check: str  # a check it fails, alone and beside the others


@dataclass(frozen=True)
class MultiBug:
    subject: str
    bugs: tuple[Bug, ...]

    @property
    def defect(self) -> str:
        """The composed defect, as `fakelet run --defect` and `fakelet explore --defect` take it."""
        return SEPARATOR.join(b.defect for b in self.bugs)

    def invariants(self) -> dict[str, str]:
        """Each part of the composed defect -> the invariant expected to report it."""
        return {b.defect: b.invariant for b in self.bugs}


MULTI_BUG: tuple[MultiBug, ...] = (
    # Issue 38's three: never re-registers, one failed GPU takes the others with it (allocatable passes through
    # n - 1 on its way to 0: only the settled state tells), and a device set frozen at start.
    MultiBug("reference-dp", (
        Bug("no-reregister", "EXP-DP-REGISTERED", ("kubelet-restart",), "DP-RST-01"),
        Bug("all-unhealthy-on-one", "EXP-DP-ALLOCATABLE", ("device-fail",), "DP-NODE-03"),
        Bug("no-hotplug", "EXP-DP-CAPACITY", ("device-unplug",), "DP-HLT-05"),
    )),
    # Cached health (a device that failed and recovered stays Unhealthy) and a crash on its own stale socket.
    MultiBug("reference-dp", (
        Bug("stuck-unhealthy", "EXP-DP-ALLOCATABLE", ("device-fail", "device-recover"), "DP-HLT-02"),
        Bug("stale-socket-crash", "EXP-DP-CAPACITY", ("plugin-crash",), "DP-RST-05"),
    )),
    MultiBug("reference-dra", (
        Bug("one-kubelet-only", "EXP-DRA-REGISTERED", ("kubelet-restart",), "DRA-RST-01"),
        Bug("no-hotplug", "EXP-DRA-SLICES", ("device-unplug",), "DRA-RS-02"),
    )),
    MultiBug("reference-dra", (
        Bug("stale-health", "EXP-DRA-HEALTH", ("device-fail",), "DRA-HLT-01"),
        Bug("wrong-cdi-id", "EXP-DRA-PREPARED", ("pod-admitted",), "DRA-PRP-01"),
    )),
)
