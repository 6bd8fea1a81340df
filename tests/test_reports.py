"""The report model decides conformance; writers only render it."""

from __future__ import annotations

import json
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
    assert r.coverage_line() == f"CONFORMANT (2 MUST checks not exercised: DP-HLT-01, DP-HLT-02: {why})"
    required = report(result("A", "MUST", "pass"), result("DP-HLT-01", "MUST", "not-exercised", required=True))
    assert required.status() == NOT_CONFORMANT


def test_checks_without_a_result_make_the_run_incomplete() -> None:
    r = report(result("A", "MUST", "pass"), missing=["B"])
    assert r.status() == INCOMPLETE and "1 check without a result: B" in r.coverage_line()
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
