"""What `fakelet run` prints of one subject when its checks are done: a line per check in reading order
(failures first, reports/order.py) and last the status with its cause (`=> NOT CONFORMANT (...)`)."""

from __future__ import annotations

from reports.model import ERROR, FAIL, CheckResult, SubjectReport
from reports.order import around_missing

DETAIL_CHARS = 110  # a check's line fits a terminal; the whole detail is in summary.md and report.html


def counts(s: dict) -> str:
    return (f"{s['pass']} pass, {s['fail']} fail, {s['not-exercised']} not exercised, {s['n/a']} n/a, "
            f"{s['skip']} skip, {s['error']} error")


def report_lines(report: SubjectReport) -> list[str]:
    s = report.summary()
    name = report.subject + (f" [defect {report.defect}]" if report.defect else "")
    if report.kind == "dra" and report.api_versions:
        name += " (" + ", ".join(f"{k} {v}" for k, v in report.api_versions.items()) + ")"
    lines = ["", f"{name}: {counts(s)}" + (f", {s['missing']} without a result" if s["missing"] else "")
             + f" ({report.duration_s:.1f}s, profile {report.profile}, seed {report.seed})"]
    before, after = around_missing(report.checks)
    for c in before:
        lines += _check_lines(report, c)
    lines += [f"  {'NO RESULT':13} {check_id:10} {'':6} {report.no_result()}" for check_id in report.missing]
    for c in after:
        lines += _check_lines(report, c)
    lines += [f"  finding: {finding}" for finding in report.findings]
    lines += [f"  to run what was skipped, install: {hint}" for hint in report.install_hints()]
    lines.append(f"  => {report.status_line()}")
    return lines


def _check_lines(report: SubjectReport, c: CheckResult) -> list[str]:
    first = report.check_cause(c) if c.counts_against() else (c.detail.splitlines() or [""])[0]
    lines = [f"  {c.verdict.upper():13} {c.id:10} {c.level:6} {first[:DETAIL_CHARS]}".rstrip()]
    lines += [f"  {'':13} {'':10} {'':6} {note[:DETAIL_CHARS]}" for note in c.notes if note.startswith("slow")]
    if c.verdict in (FAIL, ERROR):
        lines.append(f"        reproduce: {c.repro}")
    return lines
