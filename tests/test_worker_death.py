"""A check process that dies (a crash, a signal): its checks say how, and what it left goes at once (issue 39)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness.run.worker_death import describe_death, worker_died

# A worker's stand-in: it makes a sandbox (owned by it, as a check's is) and dies of SIGSEGV mid-check.
_CRASHING_WORKER = """
import os, signal
from harness.launch.sandbox import Sandbox
print(Sandbox().path, flush=True)
os.kill(os.getpid(), signal.SIGSEGV)
"""


@pytest.mark.parametrize(("returncode", "said"), [
    (-11, "the check process died of SIGSEGV"),
    (-9, "the check process died of SIGKILL"),
    (3, "the check process exited with code 3"),
    (None, "the check process died"),
])
def test_describe_death_names_the_signal(returncode: int | None, said: str) -> None:
    assert describe_death(returncode) == said


def test_a_worker_that_died_of_sigsegv_is_named_and_its_sandbox_reaped(tmp: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    proc = subprocess.Popen([sys.executable, "-c", _CRASHING_WORKER], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "TMPDIR": str(tmp)})
    assert proc.stdout is not None
    sandbox = Path(proc.stdout.readline().strip())
    proc.stdout.close()
    assert sandbox.parent == tmp and sandbox.is_dir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))  # the reaper looks where the worker made its dirs
    # execnet's shape: the worker's Popen on its gateway's io.
    node = SimpleNamespace(gateway=SimpleNamespace(_io=SimpleNamespace(popen=proc)))
    said = worker_died(node)
    assert "the check process died of SIGSEGV" in said
    assert "leftovers were removed" in said
    assert not sandbox.exists()
