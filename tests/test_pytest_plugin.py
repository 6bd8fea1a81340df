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
