"""The report tree: one model, many writers. Writers never decide a status.

Three outcomes stay apart: a conformance failure of the subject (fail), an
error of the harness (error), and an empty run (no checks), which is never
conformant.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

SCHEMA_VERSION = "1"
VERDICTS = ("pass", "fail", "skip", "error")


@dataclass
class CheckResult:
    id: str
    level: str
    title: str
    verdict: str
    duration_s: float
    detail: str = ""
    repro: str = ""
    applicable: bool = True


@dataclass
class SubjectReport:
    subject: str
    profile: str
    seed: int
    defect: str | None = None
    kind: str = "device-plugin"
    fakelet_version: str = "0"
    api_versions: dict[str, str] = field(default_factory=dict)
    timings: dict[str, Any] = field(default_factory=dict)
    fault_plan: list[str] = field(default_factory=list)
    started_at: str = ""
    duration_s: float = 0.0
    checks: list[CheckResult] = field(default_factory=list)
    schema_version: str = SCHEMA_VERSION

    def summary(self) -> dict[str, Any]:
        counts = {v: sum(1 for c in self.checks if c.verdict == v) for v in VERDICTS}
        return {**counts, "total": len(self.checks), "conformant": self.conformant()}

    def conformant(self) -> bool:
        """Every MUST check passed (or was not applicable), no harness error, and something ran."""
        if not any(c.verdict == "pass" for c in self.checks):
            return False
        for c in self.checks:
            if c.verdict == "error":
                return False
            if c.level == "MUST" and c.verdict != "pass" and not (c.verdict == "skip" and not c.applicable):
                return False
        return True

    def failed_ids(self) -> list[str]:
        return sorted(c.id for c in self.checks if c.verdict == "fail")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["summary"] = self.summary()
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SubjectReport:
        d = {k: v for k, v in d.items() if k != "summary"}
        d["checks"] = [CheckResult(**c) for c in d.get("checks", [])]
        return cls(**d)
