"""One timed `fakelet run` in a subprocess, for the benchmarks that time whole runs (p1_ratio.py, p1b_hostile.py).

Ctrl-C or SIGTERM to the benchmark stops the run's whole process group (its checks and plugins with it).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ABORT_GRACE_S = 30.0  # a stopped run's own clean-up before it is killed
_WARNED: list[bool] = []  # the bytecode warning, once per benchmark


@dataclass
class TimedRun:
    wall_s: float
    code: int
    report: dict[str, Any]
    load: float  # the 1-minute load average, mean of the start's and the end's


def bytecode_warning() -> str | None:
    """With PYTHONDONTWRITEBYTECODE set, every process of a run compiles every module it imports (about 2 s of CPU
    each, on 2 cores): a whole-run timing would measure the compiler. tox never passes the variable on."""
    if os.environ.get("PYTHONDONTWRITEBYTECODE"):
        return ("warning: PYTHONDONTWRITEBYTECODE is set, so each process of the run compiles what it imports; "
                "unset it (env -u PYTHONDONTWRITEBYTECODE ...) to time what users run")
    return None


def timed_run(run_args: list[str], verbose: bool, prefix: str) -> TimedRun:
    """`fakelet run RUN_ARGS --out TMP`: its wall time, exit code, report.json and the machine's load."""
    if (warning := bytecode_warning()) and not _WARNED:
        _WARNED.append(True)
        print(warning, file=sys.stderr, flush=True)
    out = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        argv = [sys.executable, "-m", "harness.run.cli", "run", *run_args, "--out", str(out)]
        load = os.getloadavg()[0]
        t0 = time.monotonic()
        proc = subprocess.Popen(argv, stdout=None if verbose else subprocess.DEVNULL, start_new_session=True)
        try:
            code = proc.wait()
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGINT)
                try:
                    proc.wait(ABORT_GRACE_S)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
        wall = time.monotonic() - t0
        report = json.loads((out / "report.json").read_text())
        return TimedRun(wall, code, report, (load + os.getloadavg()[0]) / 2)
    finally:
        shutil.rmtree(out, ignore_errors=True)
