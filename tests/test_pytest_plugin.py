"""harness/run/pytest_plugin.py end to end: what a failed check's detail carries of the plugin."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def test_a_failed_wait_quotes_the_running_plugins_own_words(tmp_path: Path) -> None:
    """Defect 9 of issue 39: a wait in vain said "saw instead: ..." and not what the plugin, still running, had said
    (DP-REG-07 on a vendor's plugin: its "Retrying in 30s"). stuck-unhealthy logs the change it reported last."""
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "harness.run.cli", "run", "--subject", "reference-dp", "--defect",
                           "stuck-unhealthy", "--check", "DP-HLT-02", "--reaction-bound", "2", "--out", str(out)],
                          capture_output=True, text=True, timeout=120)
    (check,) = json.loads((out / "report.json").read_text())["checks"]
    assert check["verdict"] == "fail", (check["detail"], proc.stderr[-2000:])
    detail = check["detail"]
    assert detail.startswith("expected gpu-0 reported Healthy again"), detail
    said = detail.partition("\nthe plugin's last output:\n")[2]
    assert "reference-dp INFO devices changed: gpu-0=Unhealthy" in said, detail
    assert all(line.startswith("    ") for line in said.splitlines()), detail


def _collector_with(interrupted: bool, died: dict[str, str]) -> object:
    from harness.config.runconfig import RunConfig
    from harness.run.pytest_plugin import PENDING, Collector
    from reports.model import CheckResult

    ids = ["DP-ALC-01", "DP-REG-02", "DP-RST-04"]
    collector = Collector(RunConfig.build(subject="reference-dp", checks=ids))
    collector.selected = ids
    for check_id, verdict in (("DP-REG-02", "pass"), ("DP-RST-04", PENDING), ("DP-ALC-01", PENDING)):
        collector.results[check_id] = CheckResult(id=check_id, level="MUST", title=check_id, verdict=verdict,
                                                  duration_s=1.0)
    collector.interrupted, collector.died = interrupted, died
    return collector


def test_a_check_a_stop_cut_off_has_no_result_and_one_whose_worker_crashed_is_an_error() -> None:
    """Defect 5 of issue 39: a check whose call a graceful stop cut off was an ERROR ("no result ... crashed or
    interrupted"), listed under Failures; a worker that really died keeps its ERROR and its cause."""
    from reports.model import EXIT_CODES, INTERRUPTED

    crash = "no result: the check process died of SIGSEGV before the check's verdict"
    report = _collector_with(True, {"DP-ALC-01": crash}).subject_report()  # type: ignore[attr-defined]
    verdicts = {c.id: (c.verdict, c.detail) for c in report.checks}
    assert verdicts == {"DP-REG-02": ("pass", ""), "DP-ALC-01": ("error", crash)}
    assert report.missing == ["DP-RST-04"] and report.no_result() == "interrupted before its verdict"
    assert report.status() == INTERRUPTED and EXIT_CODES[report.status()] == 130
    unstopped = _collector_with(False, {}).subject_report()  # type: ignore[attr-defined]
    assert {c.id: c.verdict for c in unstopped.checks} == {"DP-REG-02": "pass", "DP-RST-04": "error",
                                                           "DP-ALC-01": "error"}
    assert unstopped.missing == []
