"""The Markdown a CI job page shows for a run: GitHub's `$GITHUB_STEP_SUMMARY`.

When that variable names a file, `fakelet run` and `fakelet merge` append this summary to it (GitHub
shows every step's summary on the job's page). A reader there wants the verdict and what to do about
it before anything else, so the order is fixed: the run's status with its cause and exit code, then
per subject the failures (FAIL), harness errors and checks without a result, each with its first
detail line and the command that reproduces it, then what was not exercised or skipped with why, and
last the passes (and n/a), folded in a <details> block. Like every writer, it only renders the
model: the status and its cause come from reports.model.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

from reports.model import (
    ERROR,
    EXIT_CODES,
    FAIL,
    NOT_APPLICABLE,
    NOT_EXERCISED,
    PASS,
    SEVERITY,
    SKIP,
    CheckResult,
    SubjectReport,
    run_status,
)
from reports.order import by_verdict

ENV = "GITHUB_STEP_SUMMARY"
DETAIL_CHARS = 300  # one detail line is a sentence or two; a longer one is in the report itself


def first_line(text: str) -> str:
    line = (text.splitlines() or [""])[0].strip()
    return line if len(line) <= DETAIL_CHARS else line[:DETAIL_CHARS - 3] + "..."


def inline(text: str) -> str:
    """Text for one Markdown line: nothing in it may open markup the line does not close."""
    return text.replace("\\", "\\\\").replace("`", "\\`").replace("<", "&lt;").replace("|", "\\|")


def code(text: str) -> str:
    """A code span that holds any command, backticks included (CommonMark: a longer fence)."""
    fence = "``" if "`" in text else "`"
    return f"{fence} {text} {fence}" if fence == "``" else f"`{text}`"


def _item(report: SubjectReport, c: CheckResult, repro: bool) -> list[str]:
    detail = first_line(report.check_cause(c) if c.counts_against() else c.detail)
    lines = [f"- **{c.id}** ({c.level}) {inline(c.title)}" + (f": {inline(detail)}" if detail else "")]
    if repro and c.repro:
        lines.append(f"  reproduce: {code(c.repro)}")
    return lines


def _section(report: SubjectReport, title: str, checks: list[CheckResult], repro: bool = False) -> list[str]:
    if not checks:
        return []
    return [f"#### {title} ({len(checks)})", "", *(line for c in checks for line in _item(report, c, repro)), ""]


def subject_lines(report: SubjectReport) -> list[str]:
    by = by_verdict(report.checks)
    s = report.summary()
    name = report.subject + (f" (defect {report.defect})" if report.defect else "")
    status = report.status()
    lines = [f"### {inline(name)}: {status}", "",
             f"{inline(report.cause())}. {s['pass']} pass, {s['fail']} fail, {s['error']} error, "
             f"{s['not-exercised']} not exercised, {s['skip']} skip, {s['n/a']} n/a"
             + (f", {s['missing']} without a result" if s["missing"] else "")
             + f"; profile `{report.profile}`, seed {report.seed}, {report.duration_s:.1f}s.", ""]
    lines += _section(report, "Failed", by[FAIL], repro=True)
    lines += _section(report, "Errors (fakelet's own failures)", by[ERROR], repro=True)
    if report.missing:
        lines += [f"#### Without a result ({len(report.missing)})", "", *(f"- **{m}**" for m in report.missing), ""]
    lines += _section(report, "Not exercised", by[NOT_EXERCISED])
    lines += _section(report, "Skipped (could not run here)", by[SKIP])
    hints = report.install_hints()
    if hints:
        lines += ["To run what was skipped: " + ", ".join(code(h) for h in hints), ""]
    folded = by[PASS] + by[NOT_APPLICABLE]
    if folded:
        label = f"{len(by[PASS])} passed" + (f", {len(by[NOT_APPLICABLE])} n/a" if by[NOT_APPLICABLE] else "")
        # GitHub renders Markdown inside <details> only with a blank line after <summary>.
        lines += ["<details>", f"<summary>{label}</summary>", "",
                  *(f"- {c.id} ({c.level}) {inline(c.title)}: {c.verdict}" for c in folded), "", "</details>", ""]
    return lines


def step_summary(reports: list[SubjectReport], command: str = "run", out: Path | None = None) -> str:
    """The whole summary of one `fakelet run` or `fakelet merge`: the worst subjects first."""
    status = run_status(reports)  # an interrupted run's reports are each marked interrupted
    lines = [f"## fakelet {command}: {status} (exit {EXIT_CODES[status]})", ""]
    if len(reports) > 1:
        lines += [f"- {inline(r.subject)}: {r.status()}, {inline(r.cause())}" for r in reports] + [""]
    elif not reports:
        lines += ["No subject reported a result.", ""]
    if out is not None:
        lines += [f"Report directory: `{out}` (report.html, junit.xml, and a scenario per failure under repro/)", ""]
    rank = {s: n for n, s in enumerate(SEVERITY)}
    for report in sorted(reports, key=lambda r: rank[r.status()]):  # stable: equals keep the run's order
        lines += subject_lines(report)
    return "\n".join(lines) + "\n"


def append_step_summary(reports: list[SubjectReport], out: Path | None = None, command: str = "run",
                        environ: Mapping[str, str] = os.environ) -> Path | None:
    """Append the summary to the file `$GITHUB_STEP_SUMMARY` names, if it names one; the file written, or None.

    Appended, never overwritten: GitHub gives each step one file, and a step may hold several commands
    (a merge after its shards' runs). A file that cannot be written is a warning on stderr, never a
    change to the run's exit code: the verdict is the report's, not the job page's.
    """
    target = environ.get(ENV)
    if not target:
        return None
    path = Path(target)
    try:
        with path.open("a", encoding="utf-8") as f:
            f.write(step_summary(reports, command, out))
    except OSError as err:
        print(f"fakelet: cannot write the step summary to {path} (${ENV}): {err.strerror or err}", file=sys.stderr)
        return None
    return path
