"""The order a person reads a subject's checks in, in every writer: what went wrong first, passes last.

A 38-check run's five failures must not be found by scrolling: failures (FAIL), then fakelet's own errors,
then the checks without a result (`SubjectReport.missing`, IDs only), then what was not exercised or
skipped, then the passes and n/a. Within a verdict, the checks that decided the status come first (a MUST
failure before a SHOULD one, a --require'd check not exercised before one not required), then the run's
order (the catalog's).
"""

from __future__ import annotations

from collections.abc import Iterable

from reports.model import ERROR, FAIL, NOT_APPLICABLE, NOT_EXERCISED, PASS, SKIP, CheckResult

FIRST_TO_LAST = (FAIL, ERROR, NOT_EXERCISED, SKIP, PASS, NOT_APPLICABLE)
# The checks without a result come after these verdicts and before the rest.
BEFORE_MISSING = frozenset((FAIL, ERROR))
_RANK = {verdict: n for n, verdict in enumerate(FIRST_TO_LAST)}


def reading_key(c: CheckResult) -> tuple[int, bool]:
    return _RANK.get(c.verdict, len(FIRST_TO_LAST)), not c.counts_against()


def reading_order(checks: Iterable[CheckResult]) -> list[CheckResult]:
    """The checks as a person reads them (a stable sort: equals keep the run's order)."""
    return sorted(checks, key=reading_key)


def around_missing(checks: Iterable[CheckResult]) -> tuple[list[CheckResult], list[CheckResult]]:
    """The checks in reading order, split where the checks without a result belong: (before, after)."""
    ordered = reading_order(checks)
    before = [c for c in ordered if c.verdict in BEFORE_MISSING]
    return before, ordered[len(before):]


def by_verdict(checks: Iterable[CheckResult]) -> dict[str, list[CheckResult]]:
    """The checks of each verdict in reading order, the verdicts too (FIRST_TO_LAST)."""
    ordered = reading_order(checks)
    return {v: [c for c in ordered if c.verdict == v] for v in FIRST_TO_LAST}
