"""The report tree: one model, many writers. Writers never decide a status.

Outcomes stay apart. For one check:

- pass / fail: the plugin was exercised and met the check, or did not;
- not-exercised: the check found nothing to test (no device, no device mapped
  to the inventory, a health source fakelet does not drive): never a pass;
- n/a: an optional API feature the plugin does not advertise
  (GetPreferredAllocation, PreStartContainer);
- skip: the check could not run on this machine (a component is missing);
- error: fakelet's own failure, never the plugin's.

For a run (`status()`): CONFORMANT, NOT CONFORMANT, INCOMPLETE (a MUST check
could not run here, or checks are missing), ERROR (fakelet failed), and
INTERRUPTED. An empty run is never conformant.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

SCHEMA_VERSION = "2"
PASS, FAIL, NOT_EXERCISED, NOT_APPLICABLE, SKIP, ERROR = "pass", "fail", "not-exercised", "n/a", "skip", "error"
VERDICTS = (PASS, FAIL, NOT_EXERCISED, NOT_APPLICABLE, SKIP, ERROR)

CONFORMANT, NOT_CONFORMANT, INCOMPLETE = "CONFORMANT", "NOT CONFORMANT", "INCOMPLETE"
HARNESS_ERROR, INTERRUPTED = "ERROR", "INTERRUPTED"
# Exit codes of `fakelet run` per status (2 is also bad input, 130 is Ctrl-C's convention).
EXIT_CODES = {CONFORMANT: 0, NOT_CONFORMANT: 1, HARNESS_ERROR: 2, INCOMPLETE: 3, INTERRUPTED: 130}
# Most severe first: a run's status is the first that applies to any of its subjects.
SEVERITY = (INTERRUPTED, NOT_CONFORMANT, HARNESS_ERROR, INCOMPLETE, CONFORMANT)
NO_VERDICT_INTERRUPTED = "interrupted before its verdict"  # a selected check a stop signal left without a result


@dataclass
class CheckResult:
    id: str
    level: str
    title: str
    verdict: str
    duration_s: float
    detail: str = ""
    repro: str = ""
    # Facts worth reading on any verdict: a slow but in-bound reaction, the device mapping used.
    notes: list[str] = field(default_factory=list)
    # The one command that installs what a skipped check needed, when fakelet knows it.
    install: str = ""
    required: bool = False  # --require: not exercised fails the run
    # Reaction times the check measured, in seconds (registration, re-registration, health): `fakelet fidelity`
    # sets the fake kubelet's beside the real one's.
    measured: dict[str, float] = field(default_factory=dict)
    # Every run's measured time when the check ran more than once (--repeat): the spread `fakelet compare` uses.
    samples: dict[str, list[float]] = field(default_factory=dict)

    def counts_against(self) -> bool:
        """Whether this verdict makes the run NOT CONFORMANT."""
        return (self.level == "MUST" and self.verdict == FAIL) or (self.required and self.verdict == NOT_EXERCISED)


@dataclass
class SubjectReport:
    subject: str
    profile: str
    seed: int
    defect: str | None = None
    kind: str = "device-plugin"
    node: str = "fake"  # whose kubelet: fakelet's, or a real one (--node real)
    fakelet_version: str = "0"
    api_versions: dict[str, str] = field(default_factory=dict)
    timings: dict[str, Any] = field(default_factory=dict)
    fault_plan: list[str] = field(default_factory=list)
    started_at: str = ""
    duration_s: float = 0.0
    checks: list[CheckResult] = field(default_factory=list)
    # Check IDs selected for the run that have no result (a crashed worker, an interrupt).
    missing: list[str] = field(default_factory=list)
    interrupted: bool = False
    # Subject-level facts: what the plugin read of the fake hardware, the device mapping, findings.
    facts: dict[str, Any] = field(default_factory=dict)
    findings: list[str] = field(default_factory=list)
    # What fakelet's containment had to clean up after the plugin (processes, mounts, files).
    cleanup: list[str] = field(default_factory=list)
    schema_version: str = SCHEMA_VERSION
    # What produced these verdicts (fakelet, catalog, subject, kubelet, components, host): reports/provenance.py.
    provenance: dict[str, Any] = field(default_factory=dict)
    # A named suite (`fakelet run --suite kep5970`) instead of the subject kind's own checks: JUnit's testsuite name.
    suite: str | None = None
    # --require as given (check IDs and areas): a receiver sees which pattern made a not-exercised check fail the run.
    # Reports written before this field have it empty; their checks' `required` still decides the status.
    require: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        counts = {v: sum(1 for c in self.checks if c.verdict == v) for v in VERDICTS}
        return {**counts, "total": len(self.checks), "missing": len(self.missing), "status": self.status(),
                "conformant": self.conformant(), "not_exercised_must": self.not_exercised_must()}

    def status(self) -> str:
        if self.interrupted:
            return INTERRUPTED
        if any(c.counts_against() for c in self.checks):
            return NOT_CONFORMANT
        if any(c.verdict == ERROR for c in self.checks):
            return HARNESS_ERROR
        if self.missing or not any(c.verdict == PASS for c in self.checks):
            return INCOMPLETE  # an empty run, or checks without a result, is never conformant
        if any(c.level == "MUST" and c.verdict == SKIP for c in self.checks):
            return INCOMPLETE
        return CONFORMANT

    def conformant(self) -> bool:
        """Every exercised MUST check passed, no harness error, nothing missing, and something ran."""
        return self.status() == CONFORMANT

    def not_exercised_must(self) -> list[str]:
        return sorted(c.id for c in self.checks if c.level == "MUST" and c.verdict == NOT_EXERCISED)

    def causes(self) -> list[str]:
        """Why the status is what it is, one clause each, the deciding ones first; then what a status leaves
        uncovered (MUST checks not exercised). Every writer and `fakelet verify` render these, never their own."""
        parts: list[str] = []
        if self.interrupted:
            parts.append("stopped by a signal" if self.checks else "stopped by a signal before any check's verdict")
        failed = [c.id for c in self.checks if c.level == "MUST" and c.verdict == FAIL]
        if failed:
            parts.append(f"{_count(failed, 'MUST check')} failed: {', '.join(failed)}")
        for pattern, ids in self.required_unexercised().items():
            parts.append(f"{pattern}: {_count(ids, 'required check')} not exercised: {', '.join(ids)}")
        errors = [c.id for c in self.checks if c.verdict == ERROR]
        if errors:
            parts.append(f"fakelet itself failed in {', '.join(errors)}")
        if self.missing:
            parts.append(f"{_count(self.missing, 'check')} without a result: {', '.join(self.missing)}")
        skipped = [c for c in self.checks if c.level == "MUST" and c.verdict == SKIP]
        if skipped:
            parts.append(f"{_count(skipped, 'MUST check')} could not run here: {_why(skipped)}")
        if not parts and not any(c.verdict == PASS for c in self.checks):
            parts.append("no check passed" if self.checks else "no check ran")
        unexercised = [c for c in self.checks if c.level == "MUST" and c.verdict == NOT_EXERCISED and not c.required]
        if unexercised:
            parts.append(f"{_count(unexercised, 'MUST check')} not exercised: {_why(unexercised)}")
        return parts

    def cause(self) -> str:
        """The causes as one sentence; a status nothing qualifies says what it rests on."""
        return "; ".join(self.causes()) or "every exercised MUST check passed"

    def status_line(self) -> str:
        """The status with its cause, e.g. 'NOT CONFORMANT (--require DP-HLT: 4 required checks not exercised:
        DP-HLT-06, ...)' or 'CONFORMANT (3 MUST checks not exercised: ...)'."""
        causes = self.causes()
        return f"{self.status()} ({'; '.join(causes)})" if causes else self.status()

    def required_unexercised(self) -> dict[str, list[str]]:
        """The required checks not exercised, by the --require pattern that named them ('--require DP-HLT')."""
        out: dict[str, list[str]] = {}
        for c in self.checks:
            if c.required and c.verdict == NOT_EXERCISED:
                out.setdefault(self.required_by(c.id), []).append(c.id)
        return out

    def required_by(self, check_id: str) -> str:
        """'--require PATTERN' for the first pattern that names the check; a report without `require` (written
        before the field) says only '--require'."""
        pattern = next((r for r in self.require if requires(r, check_id)), None)
        return f"--require {pattern}" if pattern else "--require"

    def check_cause(self, c: CheckResult) -> str:
        """One check's part in the status, for a line about that check alone (a JUnit failure message)."""
        first = (c.detail.splitlines() or [""])[0]
        if c.required and c.verdict == NOT_EXERCISED:
            return f"{self.required_by(c.id)}: required check not exercised" + (f": {first}" if first else "")
        return first or c.verdict

    def no_result(self) -> str:
        """What a check without a result (`missing`) says in every writer."""
        return NO_VERDICT_INTERRUPTED if self.interrupted else "the check never reported a verdict"

    def install_hints(self) -> list[str]:
        return sorted({c.install for c in self.checks if c.verdict == SKIP and c.install})

    def failed_ids(self) -> list[str]:
        return sorted(c.id for c in self.checks if c.verdict == FAIL)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["summary"] = self.summary()
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SubjectReport:
        d = {k: v for k, v in d.items() if k != "summary"}
        d["checks"] = [CheckResult(**c) for c in d.get("checks", [])]
        return cls(**d)


def requires(pattern: str, check_id: str) -> bool:
    """Whether a --require pattern names a check: its ID, or an area it is in (`DP-HLT` names DP-HLT-01)."""
    return check_id == pattern or check_id.startswith(pattern.rstrip("-") + "-")


def _count(items: list[Any], noun: str) -> str:
    return f"{len(items)} {noun}{'s' * (len(items) != 1)}"


def _why(checks: list[CheckResult]) -> str:
    """Check IDs grouped by their reason, shortest first: 'DP-HLT-01, DP-HLT-02: the plugin read no ...'."""
    by_reason: dict[str, list[str]] = {}
    for c in checks:
        by_reason.setdefault((c.detail.splitlines() or [""])[0], []).append(c.id)
    return "; ".join(f"{', '.join(ids)}: {reason}" if reason else ", ".join(ids) for reason, ids in by_reason.items())


COUNTED = re.compile(r"(\S+) x(\d+)")  # one entry of a counted fact: "nvmlEventSetWait_v2 x12"
NOTHING = ("none", "never")  # how a fact says a check saw nothing of it ("none: the plugin never called NVML")


def merge_fact(old: Any, new: Any) -> Any:
    """One subject-level fact from two checks' (or runs') values, never first-wins: groups of files are united,
    counted lists ("GetDeviceHealth x8, ...") add up per entry, other texts are kept once each, and a "none" or
    "never" gives way to what another check did see."""
    if old is None or old == new:
        return new
    if isinstance(old, dict) and isinstance(new, dict):
        return {k: sorted(set(old.get(k, [])) | set(new.get(k, []))) for k in sorted(set(old) | set(new))}
    if not (isinstance(old, str) and isinstance(new, str)):
        return old if new is None else new
    seen = [v for v in (old, new) if not v.startswith(NOTHING)]
    if len(seen) < 2:
        return seen[0] if seen else old
    counted = [_counts(v) for v in seen]
    if all(c is not None for c in counted):
        return _counted_text(counted)  # type: ignore[arg-type]
    parts = [p for v in seen for p in v.split("; ")]
    return "; ".join(dict.fromkeys(parts))


def _counts(text: str) -> dict[str, int] | None:
    out: dict[str, int] = {}
    for part in text.split(", "):
        match = COUNTED.fullmatch(part.strip())
        if match is None:
            return None
        out[match[1]] = out.get(match[1], 0) + int(match[2])
    return out


def _counted_text(counts: list[dict[str, int]]) -> str:
    total: dict[str, int] = {}
    for c in counts:
        for name, n in c.items():
            total[name] = total.get(name, 0) + n
    return ", ".join(f"{n} x{c}" for n, c in sorted(total.items(), key=lambda kv: (-kv[1], kv[0])))


def merge_facts(into: dict[str, Any], new: dict[str, Any]) -> None:
    for name, fact in new.items():
        into[name] = merge_fact(into.get(name), fact)


def run_status(reports: list[SubjectReport]) -> str:
    statuses = {r.status() for r in reports} or {INCOMPLETE}
    return next(s for s in SEVERITY if s in statuses)
