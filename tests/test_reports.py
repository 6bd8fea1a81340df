"""The report model decides conformance; writers only render it."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

from reports.model import CheckResult, SubjectReport
from reports.writers import markdown, write_all


def result(check_id: str, level: str, verdict: str, applicable: bool = True) -> CheckResult:
    return CheckResult(id=check_id, level=level, title=f"title {check_id}", verdict=verdict, duration_s=0.1,
                       detail="" if verdict == "pass" else f"expected x; saw y ({verdict})",
                       repro="" if verdict == "pass" else f"fakelet run --check {check_id}", applicable=applicable)


def report(*checks: CheckResult) -> SubjectReport:
    return SubjectReport(subject="s", profile="fast", seed=3, checks=list(checks))


def test_empty_run_is_never_conformant() -> None:
    assert report().conformant() is False
    assert report(result("A", "MUST", "skip")).conformant() is False


def test_must_failure_and_harness_error_are_not_conformant() -> None:
    assert report(result("A", "MUST", "pass"), result("B", "MUST", "fail")).conformant() is False
    assert report(result("A", "MUST", "pass"), result("B", "SHOULD", "error")).conformant() is False


def test_should_failure_and_not_applicable_must_skip_are_conformant() -> None:
    r = report(result("A", "MUST", "pass"), result("B", "SHOULD", "fail"),
               result("C", "MUST", "skip", applicable=False))
    assert r.conformant() is True
    # A MUST check skipped because something was missing is not satisfied.
    assert report(result("A", "MUST", "pass"), result("C", "MUST", "skip")).conformant() is False


def test_writers_render_the_same_tree(tmp_path: Path) -> None:
    r = report(result("DP-A", "MUST", "pass"), result("DP-B", "MUST", "fail"), result("DP-C", "SHOULD", "skip"),
               result("DP-D", "SHOULD", "error"))
    write_all(r, tmp_path)
    doc = json.loads((tmp_path / "report.json").read_text())
    assert doc["summary"] == {"pass": 1, "fail": 1, "skip": 1, "error": 1, "total": 4, "conformant": False}
    assert doc["schema_version"] == "1" and doc["seed"] == 3
    assert SubjectReport.from_dict(doc) == r
    suite = ET.parse(tmp_path / "junit.xml").getroot()
    counts = (suite.get("tests"), suite.get("failures"), suite.get("errors"), suite.get("skipped"))
    assert counts == ("4", "1", "1", "1")
    failure = suite.find("testcase[@name='DP-B title DP-B']/failure")
    assert failure is not None and "fakelet run --check DP-B" in (failure.text or "")
    md = markdown(r)
    assert "NOT CONFORMANT" in md and "| DP-B | MUST | FAIL |" in md and "Reproduce: `fakelet run --check DP-B`" in md
