"""$GITHUB_STEP_SUMMARY: the job page's summary puts the status and its cause first, then failures, errors,
not exercised, and the passes folded away; it is appended only when the variable names a file."""

from __future__ import annotations

from pathlib import Path

from reports.model import CheckResult, SubjectReport
from reports.stepsummary import append_step_summary, step_summary


def result(check_id: str, verdict: str, level: str = "MUST", detail: str = "", required: bool = False) -> CheckResult:
    return CheckResult(id=check_id, level=level, title=f"title of {check_id}", verdict=verdict, duration_s=0.1,
                       detail=detail or ("" if verdict == "pass" else f"expected x; saw y ({verdict})\nsecond line"),
                       repro="" if verdict == "pass" else f"fakelet run --subject s --check {check_id}",
                       required=required)


def report(*checks: CheckResult, subject: str = "s", defect: str | None = None,
           missing: list[str] | None = None) -> SubjectReport:
    return SubjectReport(subject=subject, profile="fast", seed=3, defect=defect, checks=list(checks),
                         missing=missing or [])


def positions(text: str, *needles: str) -> list[int]:
    return [text.index(n) for n in needles]  # a ValueError names the one missing


def test_failures_come_first_and_passes_are_folded() -> None:
    # The model's order is the catalog's: a pass first, the failure in the middle.
    r = report(result("DP-A", "pass"), result("DP-B", "not-exercised", detail="no device mapped"),
               result("DP-C", "fail"), result("DP-D", "error", level="SHOULD"), result("DP-E", "n/a"),
               result("DP-F", "skip", level="SHOULD", detail="needs go"), defect="no-reregister")
    text = step_summary([r], out=Path("fakelet-report"))
    head, fail, error, unexercised, skipped, folded = positions(
        text, "## fakelet run: NOT CONFORMANT (exit 1)", "- **DP-C** (MUST) title of DP-C: expected x; saw y (fail)",
        "- **DP-D** (SHOULD)", "- **DP-B** (MUST) title of DP-B: no device mapped", "- **DP-F**", "<details>")
    assert head < fail < error < unexercised < skipped < folded
    assert "second line" not in text  # the first detail line only; the rest is in the report
    assert "  reproduce: `fakelet run --subject s --check DP-C`" in text
    assert "reproduce: `fakelet run --subject s --check DP-B`" not in text  # not exercised: nothing to reproduce
    # Passes and n/a sit inside the fold, with a blank line so that GitHub renders the list in it.
    fold = text[folded:]
    assert "<summary>1 passed, 1 n/a</summary>\n\n- DP-A (MUST)" in fold and "- DP-E (MUST)" in fold
    assert "s (defect no-reregister): NOT CONFORMANT" in text
    # The cause names every reason, the deciding one first.
    assert "1 MUST check failed: DP-C; fakelet itself failed in DP-D; 1 MUST check not exercised: DP-B" in text
    assert "`fakelet-report`" in text


def cause(r: SubjectReport) -> str:
    return r.cause()


def test_the_cause_names_what_decided_the_status() -> None:
    assert cause(report(result("A", "pass"), result("B", "not-exercised", required=True))) == (
        "--require: 1 required check not exercised: B")
    assert cause(report(result("A", "pass"), result("B", "error"))) == "fakelet itself failed in B"
    assert cause(report(result("A", "pass"), missing=["B"])) == "1 check without a result: B"
    assert cause(report(result("A", "skip", detail="kube-apiserver could not be built"))).startswith(
        "1 MUST check could not run here: A: kube-apiserver could not be built")
    assert cause(report()) == "no check ran"
    assert cause(report(result("A", "pass"))) == "every exercised MUST check passed"
    assert cause(report(result("A", "pass"), result("B", "not-exercised", detail="no health source"))) == (
        "1 MUST check not exercised: B: no health source")
    stopped = report(result("A", "pass"), missing=["B"])
    stopped.interrupted = True
    assert cause(stopped) == "stopped by a signal; 1 check without a result: B"
    assert step_summary([stopped]).startswith("## fakelet run: INTERRUPTED (exit 130)")


def test_several_subjects_worst_first_and_a_line_each() -> None:
    good = report(result("A", "pass"), subject="good")
    bad = report(result("A", "pass"), result("B", "fail"), subject="bad")
    text = step_summary([good, bad], command="merge")
    assert text.startswith("## fakelet merge: NOT CONFORMANT (exit 1)")
    assert "- good: CONFORMANT, every exercised MUST check passed" in text
    assert text.index("### bad: NOT CONFORMANT") < text.index("### good: CONFORMANT")
    assert "No subject reported a result." in step_summary([])


def test_markup_in_details_is_escaped_and_long_lines_are_cut() -> None:
    r = report(result("A", "fail", detail="saw <script> | `x` " + "y" * 400))
    r.checks[0].repro = "fakelet run --plugin-cmd 'echo `id`'"
    text = step_summary([r])
    assert "&lt;script> \\| \\`x\\`" in text and "<script>" not in text
    line = next(x for x in text.splitlines() if x.startswith("- **A**"))
    assert line.endswith("...") and len(line) < 400
    assert "reproduce: `` fakelet run --plugin-cmd 'echo `id`' ``" in text


def test_appended_only_when_the_variable_names_a_file(tmp_path: Path, capsys) -> None:
    r = report(result("A", "pass"), result("B", "fail"))
    assert append_step_summary([r], environ={}) is None
    target = tmp_path / "step_summary"
    target.write_text("earlier step\n")
    assert append_step_summary([r], environ={"GITHUB_STEP_SUMMARY": str(target)}) == target
    assert append_step_summary([r], command="merge", environ={"GITHUB_STEP_SUMMARY": str(target)}) == target
    text = target.read_text()
    assert text.startswith("earlier step\n## fakelet run: NOT CONFORMANT") and "## fakelet merge:" in text
    # A file that cannot be written costs a warning, not the run's exit code.
    missing = tmp_path / "no-such-dir" / "summary"
    assert append_step_summary([r], environ={"GITHUB_STEP_SUMMARY": str(missing)}) is None
    assert "cannot write the step summary" in capsys.readouterr().err


def test_a_required_check_not_exercised_says_require_made_it_count() -> None:
    r = report(result("DP-HLT-01", "pass"), result("DP-HLT-06", "not-exercised", level="SHOULD", required=True,
                                                   detail="no NVML surface"))
    r.require = ["DP-HLT"]
    text = step_summary([r])
    assert "--require DP-HLT: 1 required check not exercised: DP-HLT-06." in text
    assert "- **DP-HLT-06** (SHOULD) title of DP-HLT-06: --require DP-HLT: required check not exercised: " \
           "no NVML surface" in text
