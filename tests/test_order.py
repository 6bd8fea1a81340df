"""The order every writer lists checks in (reports/order.py): failures first, passes last."""

from __future__ import annotations

from reports.model import CheckResult
from reports.order import FIRST_TO_LAST, around_missing, by_verdict, reading_order


def check(check_id: str, verdict: str, level: str = "MUST", required: bool = False) -> CheckResult:
    return CheckResult(id=check_id, level=level, title="t", verdict=verdict, duration_s=0.0, required=required)


def test_what_decided_the_status_comes_first_within_a_verdict() -> None:
    checks = [check("A", "pass"), check("B", "not-exercised"), check("C", "not-exercised", "SHOULD", required=True),
              check("D", "fail", "SHOULD"), check("E", "fail"), check("F", "n/a"), check("G", "skip"),
              check("H", "error")]
    assert [c.id for c in reading_order(checks)] == ["E", "D", "H", "C", "B", "G", "A", "F"]
    before, after = around_missing(checks)
    assert [c.id for c in before] == ["E", "D", "H"] and [c.id for c in after] == ["C", "B", "G", "A", "F"]
    assert list(by_verdict(checks)) == list(FIRST_TO_LAST)
    assert [c.id for c in by_verdict(checks)["not-exercised"]] == ["C", "B"]
