"""Writers for the report tree: JSON, JUnit XML, Markdown."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

from reports.html import write_html
from reports.model import CONFORMANT, INTERRUPTED, SEVERITY, CheckResult, SubjectReport, run_status
from reports.order import around_missing
from reports.provenance import lines as provenance_lines

ICONS = {"pass": "PASS", "fail": "FAIL", "not-exercised": "NOT EXERCISED", "n/a": "N/A", "skip": "SKIP",
         "error": "ERROR"}


def write_json(report: SubjectReport, path: Path) -> None:
    path.write_text(json.dumps(report.to_dict(), indent=2) + "\n")


def write_junit(report: SubjectReport, path: Path) -> None:
    s = report.summary()
    required_unexercised = sum(len(ids) for ids in report.required_unexercised().values())
    # A named suite keeps its own name (kep5970: the name the KEP's suite can adopt), the subject a property.
    suite_name = report.suite or f"fakelet.{report.subject}"
    case_class = f"{report.suite}.{report.subject}" if report.suite else suite_name
    suite = ET.Element("testsuite", name=suite_name, tests=str(s["total"]),
                       failures=str(s["fail"] + required_unexercised),
                       errors=str(s["error"] + s["missing"]),
                       skipped=str(s["skip"] + s["n/a"] + s["not-exercised"]),
                       time=f"{report.duration_s:.3f}")
    props = ET.SubElement(suite, "properties")
    for name, value in (("subject", report.subject), ("defect", report.defect or ""),
                        ("profile", report.profile), ("seed", str(report.seed)),
                        ("fakelet_version", report.fakelet_version), ("status", report.status_line()),
                        ("require", " ".join(report.require)),
                        ("fakelet_commit", str(report.provenance.get("fakelet", {}).get("commit", ""))),
                        ("catalog_sha256", str(report.provenance.get("catalog", {}).get("sha256", "")))):
        ET.SubElement(props, "property", name=name, value=value)
    # Failures first (reports/order.py): a CI page that lists testcases in file order shows them on top.
    before, after = around_missing(report.checks)
    for c in before:
        _testcase(suite, case_class, report, c)
    for check_id in report.missing:
        case = ET.SubElement(suite, "testcase", classname=case_class, name=check_id, time="0")
        ET.SubElement(case, "error", message=f"no result: {report.no_result()}")
    for c in after:
        _testcase(suite, case_class, report, c)
    ET.ElementTree(suite).write(path, encoding="unicode", xml_declaration=True)


def _testcase(suite: ET.Element, case_class: str, report: SubjectReport, c: CheckResult) -> None:
    case = ET.SubElement(suite, "testcase", classname=f"{case_class}.{c.level}",
                         name=f"{c.id} {c.title}", time=f"{c.duration_s:.3f}")
    if c.verdict in ("fail", "error") or c.counts_against():
        tag = "error" if c.verdict == "error" else "failure"
        # A required check not exercised fails because of --require: its message says so, not only the reason.
        node = ET.SubElement(case, tag, message=report.check_cause(c))
        node.text = f"{c.detail}\n\nreproduce: {c.repro}"
    elif c.verdict in ("skip", "n/a", "not-exercised"):
        ET.SubElement(case, "skipped", message=f"{c.verdict}: {c.detail}")


def markdown(report: SubjectReport) -> str:
    s = report.summary()
    title = report.subject + (f" (defect: {report.defect})" if report.defect else "")
    lines = [
        f"# fakelet conformance: {title}", "",
        f"- verdict: **{report.status_line()}**",
        f"- checks: {s['pass']} pass, {s['fail']} fail, {s['not-exercised']} not exercised, {s['n/a']} n/a, "
        f"{s['skip']} skip, {s['error']} error" + (f", {s['missing']} without a result" if s["missing"] else ""),
        f"- profile `{report.profile}`, seed {report.seed}, {report.duration_s:.1f}s, fakelet {report.fakelet_version}"
        + (f", `--require {' '.join(report.require)}`" if report.require else ""),
        f"- API versions: {', '.join(f'{k} {v}' for k, v in report.api_versions.items()) or 'n/a'}",
        *(f"- {line}" for line in provenance_lines(report.provenance)), "",
    ]
    lines += scenario_lines(report.facts.get("scenario"))
    before, after = around_missing(report.checks)
    if before:
        lines += ["## Failures", ""]
        for c in before:
            lines += [f"### {c.id} ({c.level}): {c.title}", "", "```", c.detail, "```", "",
                      f"Reproduce: `{c.repro}`", ""]
    lines += ["## Checks", "", "| check | level | verdict | time | detail |", "| --- | --- | --- | --- | --- |"]
    lines += [_row(report, c) for c in before]
    lines += [f"| {check_id} | | NO RESULT | | {report.no_result()} |" for check_id in report.missing]
    lines += [_row(report, c) for c in after]
    hints = report.install_hints()
    if hints:
        lines += ["", "## To run what was skipped", ""] + [f"- `{h}`" for h in hints]
    notes = [(c.id, n) for c in report.checks for n in c.notes]
    if report.facts or report.findings or report.cleanup or notes:
        lines += ["", "## Facts and notes", ""]
        lines += [f"- {k}: {v}" for k, v in report.facts.items() if k != "scenario"]
        lines += [f"- finding: {f}" for f in report.findings]
        lines += [f"- cleaned up: {c}" for c in report.cleanup]
        lines += [f"- {cid}: {n}" for cid, n in notes]
    return "\n".join(lines) + "\n"


def _row(report: SubjectReport, c: CheckResult) -> str:
    first = report.check_cause(c) if c.counts_against() else (c.detail.splitlines() or [""])[0]
    cell = first.replace("|", "\\|")
    return f"| {c.id} | {c.level} | {ICONS[c.verdict]} | {c.duration_s:.2f}s | {cell} |"


def scenario_lines(scenario: dict | None) -> list[str]:
    """A scenario run's own outcome (fakelet scenario run): reproduced, not reproduced or inconclusive."""
    if not scenario:
        return []
    runs = scenario.get("runs", 1)
    tally = f" ({scenario.get('reproduced', 0)} of {runs} runs reproduced it)" if runs > 1 else ""
    return [f"## Scenario `{scenario.get('name')}`: **{str(scenario.get('outcome', '')).upper()}**{tally}", "",
            f"- report: {scenario.get('upstream') or 'none (a failed check, replayed)'}",
            f"- {scenario.get('title')}",
            f"- correct: {scenario.get('correct')}",
            f"- the bug: {scenario.get('bug')}", ""]


def write_markdown(report: SubjectReport, path: Path) -> None:
    path.write_text(markdown(report))


def write_all(report: SubjectReport, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    write_json(report, out / "report.json")
    write_junit(report, out / "junit.xml")
    write_markdown(report, out / "summary.md")
    write_html(report, out)


def write_index(reports: list[SubjectReport], out: Path, interrupted: bool = False) -> None:
    status = INTERRUPTED if interrupted else run_status(reports)
    index = {"schema_version": reports[0].schema_version if reports else "1",
             "runs": [r.to_dict() for r in reports],
             "summary": {"subjects": len(reports), "status": status, "conformant": status == CONFORMANT}}
    (out / "report.json").write_text(json.dumps(index, indent=2) + "\n")
    lines = ["# fakelet conformance", "", f"**{status}**", "",
             "| subject | pass | fail | not exercised | n/a | skip | error | verdict |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    rank = {status: n for n, status in enumerate(SEVERITY)}
    for r in sorted(reports, key=lambda r: rank[r.status()]):  # the worst subjects first; equals keep the run's order
        s = r.summary()
        lines.append(f"| [{r.subject}]({r.subject}/summary.md) | {s['pass']} | {s['fail']} | {s['not-exercised']} | "
                     f"{s['n/a']} | {s['skip']} | {s['error']} | {r.status_line()} |")
    (out / "summary.md").write_text("\n".join(lines) + "\n")
