"""`fakelet matrix` stopped early (docs/isolation.md, Leftovers): its table still comes, marked INTERRUPTED, with
the cells that ran and every selected check of the others interrupted before its verdict; exit 130."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from test_cli import _processes_naming, _wait_for_plugin_socket, leftovers
from test_interrupts import await_line, start_run, stop

from harness.run import matrix
from reports.model import INTERRUPTED, NO_VERDICT_INTERRUPTED

CHECKS = ["DP-REG-02", "DP-RST-04"]  # DP-RST-04 waits out a long kubelet outage: the stop finds the cell mid-run
SELECTED = ["--subject", "reference-dp", "--kubelet-version", "1.35,1.36", "--node", "fake",
            *(a for c in CHECKS for a in ("--check", c)), "-j", "2"]


def table_of(out: Path) -> dict[str, dict[str, str]]:
    data = json.loads((out / matrix.MATRIX_JSON).read_text())
    assert data["status"] == INTERRUPTED, data
    assert f"**{INTERRUPTED}**" in (out / matrix.MATRIX_MD).read_text()
    return data["subjects"]["reference-dp"]["rows"]


def test_a_stop_while_a_cell_runs_writes_the_table_of_what_ran(tmp: Path, tmp_path: Path) -> None:
    """Before: exit 130 with cells/ alone in a new --out, no matrix.md nor matrix.json."""
    out = tmp_path / "new"
    proc = start_run(tmp, "matrix", *SELECTED, "--out", str(out))
    try:
        _wait_for_plugin_socket(tmp, 120, proc)  # the first cell's checks have begun
        os.killpg(proc.pid, signal.SIGINT)
    finally:
        _, stderr = stop(proc, 120)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr, stderr
    rows = table_of(out)
    assert sorted(rows) == CHECKS
    assert {rows[c]["1.36 fake"] for c in CHECKS} == {NO_VERDICT_INTERRUPTED}  # never ran: never a verdict
    assert rows["DP-RST-04"]["1.35 fake"] == NO_VERDICT_INTERRUPTED  # cut off mid-call: not an error
    assert "| DP-RST-04 | interrupted before its verdict | interrupted before its verdict |" in \
        (out / matrix.MATRIX_MD).read_text()
    assert leftovers(tmp) == [] and _processes_naming(tmp) == []
    assert [p.name for p in tmp_path.iterdir()] == ["new"]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_stop_before_any_cell_still_writes_the_table(tmp: Path, tmp_path: Path, sig: signal.Signals) -> None:
    """Before: a stop while fakelet still imported its commands said only 'interrupted before anything started'."""
    out = tmp_path / "new"
    proc = subprocess.Popen([sys.executable, "-X", "importtime", "-m", "harness.run.cli", "matrix", *SELECTED,
                             "--out", str(out)], env=dict(os.environ, TMPDIR=str(tmp)), start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        await_line(proc, " harness.run.matrix\n", 60)
        os.killpg(proc.pid, sig)
    finally:
        _, stderr = stop(proc, 60)
    assert proc.returncode == 130, stderr[-2000:]
    assert "Traceback" not in stderr and "interrupted before anything started" not in stderr
    rows = table_of(out)
    assert rows == {c: dict.fromkeys(["1.35 fake", "1.36 fake"], NO_VERDICT_INTERRUPTED) for c in CHECKS}
    assert leftovers(tmp) == [] and _processes_naming(tmp) == []
