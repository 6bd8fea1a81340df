"""The report model decides conformance; writers only render it."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

from reports.model import (
    CONFORMANT,
    EXIT_CODES,
    HARNESS_ERROR,
    INCOMPLETE,
    NOT_CONFORMANT,
    CheckResult,
    SubjectReport,
    run_status,
)
from reports.writers import markdown, write_all


def result(check_id: str, level: str, verdict: str, required: bool = False, detail: str = "") -> CheckResult:
    return CheckResult(id=check_id, level=level, title=f"title {check_id}", verdict=verdict, duration_s=0.1,
                       detail=detail or ("" if verdict == "pass" else f"expected x; saw y ({verdict})"),
                       repro="" if verdict == "pass" else f"fakelet run --check {check_id}", required=required)


def report(*checks: CheckResult, missing: list[str] | None = None) -> SubjectReport:
    return SubjectReport(subject="s", profile="fast", seed=3, checks=list(checks), missing=missing or [])


def test_empty_run_is_never_conformant() -> None:
    assert report().status() == INCOMPLETE
    assert report(result("A", "MUST", "skip")).conformant() is False
    assert report(result("A", "MUST", "not-exercised")).status() == INCOMPLETE


def test_must_failure_is_not_conformant_and_harness_error_is_an_error() -> None:
    assert report(result("A", "MUST", "pass"), result("B", "MUST", "fail")).status() == NOT_CONFORMANT
    assert report(result("A", "MUST", "pass"), result("B", "SHOULD", "error")).status() == HARNESS_ERROR
    # A failure outranks an error: the plugin's verdict is what a vendor must see first.
    assert report(result("B", "MUST", "fail"), result("C", "SHOULD", "error")).status() == NOT_CONFORMANT


def test_should_failure_and_not_applicable_are_conformant() -> None:
    r = report(result("A", "MUST", "pass"), result("B", "SHOULD", "fail"), result("C", "MUST", "n/a"))
    assert r.conformant() is True
    # A MUST check skipped because something was missing makes the run incomplete, never conformant.
    assert report(result("A", "MUST", "pass"), result("C", "MUST", "skip")).status() == INCOMPLETE


def test_not_exercised_is_reported_as_coverage_and_fails_only_when_required() -> None:
    why = "the plugin read no health source that fakelet drives"
    r = report(result("A", "MUST", "pass"), result("DP-HLT-01", "MUST", "not-exercised", detail=why),
               result("DP-HLT-02", "MUST", "not-exercised", detail=why))
    assert r.status() == CONFORMANT
    assert r.status_line() == f"CONFORMANT (2 MUST checks not exercised: DP-HLT-01, DP-HLT-02: {why})"
    required = report(result("A", "MUST", "pass"), result("DP-HLT-01", "MUST", "not-exercised", required=True))
    assert required.status() == NOT_CONFORMANT


def test_checks_without_a_result_make_the_run_incomplete() -> None:
    r = report(result("A", "MUST", "pass"), missing=["B"])
    assert r.status() == INCOMPLETE and "1 check without a result: B" in r.status_line()
    assert run_status([r, report(result("A", "MUST", "pass"))]) == INCOMPLETE
    assert EXIT_CODES[INCOMPLETE] == 3


def test_writers_render_the_same_tree(tmp_path: Path) -> None:
    r = report(result("DP-A", "MUST", "pass"), result("DP-B", "MUST", "fail"), result("DP-C", "SHOULD", "skip"),
               result("DP-D", "SHOULD", "error"))
    write_all(r, tmp_path)
    doc = json.loads((tmp_path / "report.json").read_text())
    assert doc["summary"] == {"pass": 1, "fail": 1, "not-exercised": 0, "n/a": 0, "skip": 1, "error": 1, "total": 4,
                              "missing": 0, "status": "NOT CONFORMANT", "conformant": False,
                              "not_exercised_must": []}
    assert doc["schema_version"] == "2" and doc["seed"] == 3
    assert SubjectReport.from_dict(doc) == r
    suite = ET.parse(tmp_path / "junit.xml").getroot()
    counts = (suite.get("tests"), suite.get("failures"), suite.get("errors"), suite.get("skipped"))
    assert counts == ("4", "1", "1", "1")
    failure = suite.find("testcase[@name='DP-B title DP-B']/failure")
    assert failure is not None and "fakelet run --check DP-B" in (failure.text or "")
    md = markdown(r)
    assert "NOT CONFORMANT" in md and "| DP-B | MUST | FAIL |" in md and "Reproduce: `fakelet run --check DP-B`" in md


def test_the_status_line_names_the_require_pattern_that_decided_it() -> None:
    why = "the fake hardware has no NVML surface"
    r = report(result("DP-HLT-01", "MUST", "pass"),
               *(result(f"DP-HLT-0{n}", "SHOULD", "not-exercised", required=True, detail=why) for n in (6, 7, 8)),
               result("DP-REG-01", "MUST", "not-exercised", required=True, detail="no device"))
    r.require = ["DP-HLT", "DP-REG-01"]
    assert r.status_line() == ("NOT CONFORMANT (--require DP-HLT: 3 required checks not exercised: DP-HLT-06, "
                               "DP-HLT-07, DP-HLT-08; --require DP-REG-01: 1 required check not exercised: DP-REG-01)")
    assert r.check_cause(r.checks[1]) == f"--require DP-HLT: required check not exercised: {why}"
    # A MUST check named by --require is in the cause once, not again as coverage.
    assert "MUST check not exercised" not in r.status_line()
    # A report written before `require` existed still says that --require decided it.
    old = {k: v for k, v in r.to_dict().items() if k != "require"}
    assert SubjectReport.from_dict(old).status_line().startswith(
        "NOT CONFORMANT (--require: 4 required checks not exercised: DP-HLT-06")
    # Without --require the same checks are coverage, and the run conformant.
    plain = report(result("DP-HLT-01", "MUST", "pass"), result("DP-HLT-06", "SHOULD", "not-exercised", detail=why))
    assert plain.status_line() == CONFORMANT


def test_every_writer_names_the_cause(tmp_path: Path) -> None:
    from reports.bundle import provenance_doc
    from reports.terminal import report_lines

    r = report(result("DP-HLT-01", "MUST", "pass"), result("DP-HLT-06", "SHOULD", "not-exercised", required=True))
    r.require = ["DP-HLT"]
    line = "NOT CONFORMANT (--require DP-HLT: 1 required check not exercised: DP-HLT-06)"
    write_all(r, tmp_path)
    assert json.loads((tmp_path / "report.json").read_text())["require"] == ["DP-HLT"]
    assert f"- verdict: **{line}**" in (tmp_path / "summary.md").read_text()
    suite = ET.parse(tmp_path / "junit.xml").getroot()
    assert suite.find("properties/property[@name='status']").get("value") == line  # type: ignore[union-attr]
    failure = suite.find("testcase[@name='DP-HLT-06 title DP-HLT-06']/failure")
    assert failure is not None and failure.get("message", "").startswith("--require DP-HLT: required check not")
    assert "--require DP-HLT: 1 required check not exercised: DP-HLT-06" in (tmp_path / "report.html").read_text()
    assert report_lines(r)[-1] == f"  => {line}"
    assert provenance_doc([r])["subjects"][0]["status"] == line


def test_every_writer_puts_failures_first(tmp_path: Path) -> None:
    from reports.terminal import report_lines

    # The model's order is the catalog's (by ID): passes first, the failures in the middle and at the end.
    r = report(result("A", "MUST", "pass"), result("B", "MUST", "not-exercised"), result("C", "SHOULD", "fail"),
               result("D", "MUST", "n/a"), result("E", "SHOULD", "error"), result("F", "SHOULD", "skip"),
               result("G", "MUST", "fail"), missing=["H"])
    reading = ["G", "C", "E", "H", "B", "F", "A", "D"]  # a MUST failure before a SHOULD one
    write_all(r, tmp_path)
    suite = ET.parse(tmp_path / "junit.xml").getroot()
    assert [c.get("name", "").split()[0] for c in suite.iter("testcase")] == reading
    table = markdown(r).split("| --- |")[-1]
    assert [row.split(" | ")[0].strip("| ") for row in table.splitlines()[1:len(reading) + 1]] == reading
    terminal = [line.split()[2] if line.startswith("  NO RESULT") else line.split()[1]
                for line in report_lines(r)[2:] if line.startswith("  ") and not line.startswith("   ")][:-1]
    assert terminal == reading
    html = (tmp_path / "report.html").read_text()
    rows = re.findall(r'<tr class="row-[\w-]+"><td class="id">(?:<a href="#check-[^"]+">)?([^<]+)<', html)
    assert rows == reading


def test_the_index_lists_the_worst_subjects_first(tmp_path: Path) -> None:
    from reports.writers import write_index

    good = SubjectReport(subject="good", profile="fast", seed=0, checks=[result("A", "MUST", "pass")])
    bad = SubjectReport(subject="bad", profile="fast", seed=0, checks=[result("A", "MUST", "fail")])
    write_index([good, bad], tmp_path)
    text = (tmp_path / "summary.md").read_text()
    assert text.index("[bad]") < text.index("[good]")
    assert "| NOT CONFORMANT (1 MUST check failed: A) |" in text
    assert [r["subject"] for r in json.loads((tmp_path / "report.json").read_text())["runs"]] == ["good", "bad"]
