"""`fakelet up` runs a live session that `fakelet devices` drives from outside."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

LINE_TIMEOUT_S = 30.0


class Lines:
    """The session's stdout, line by line, read on a thread so waits can be bounded."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.q: queue.Queue[str] = queue.Queue()
        assert proc.stdout is not None
        threading.Thread(target=lambda: [self.q.put(line) for line in proc.stdout], daemon=True).start()  # type: ignore[union-attr]

    def wait(self, needle: str) -> str:
        while True:
            try:
                line = self.q.get(timeout=LINE_TIMEOUT_S)
            except queue.Empty:
                raise AssertionError(f"no line containing {needle!r} within {LINE_TIMEOUT_S}s") from None
            if needle in line:
                return line


def devices(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "harness.run.cli", "devices", *args], capture_output=True,
                          text=True, timeout=30)


def test_devices_command_drives_a_live_session(tmp: Path) -> None:
    env = dict(os.environ, TMPDIR=str(tmp))
    proc = subprocess.Popen([sys.executable, "-m", "harness.run.cli", "up", "--for", "120"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        lines = Lines(proc)
        sock = lines.wait("control socket:").split(":", 1)[1].strip()
        lines.wait("ListAndWatch gpu-0=Healthy, gpu-1=Healthy")
        done = devices("--socket", sock, "fail", "gpu-1")
        assert done.returncode == 0 and "gpu-1: Unhealthy" in done.stdout, done
        lines.wait("ListAndWatch gpu-0=Healthy, gpu-1=Unhealthy")
        lines.wait("allocatable=3")
        assert devices("--socket", sock, "recover", "gpu-1").returncode == 0
        lines.wait("ListAndWatch gpu-0=Healthy, gpu-1=Healthy")
        bad = devices("--socket", sock, "fail", "gpu-9")
        assert bad.returncode == 2 and "unknown device 'gpu-9'" in bad.stderr
        # A device-plugin session has no cluster controls: it says why ("unknown op 'taint_add'" before).
        taint = subprocess.run([sys.executable, "-m", "harness.run.cli", "taint", "--socket", sock, "add", "gpu-0"],
                               capture_output=True, text=True, timeout=30)
        assert taint.returncode != 0 and "this session runs a device plugin" in taint.stderr, taint
        assert "unknown op" not in taint.stderr, taint
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert list(tmp.iterdir()) == []


def test_devices_without_a_session_is_a_clear_error() -> None:
    env = {k: v for k, v in os.environ.items() if k != "FAKELET_CONTROL_SOCKET"}
    proc = subprocess.run([sys.executable, "-m", "harness.run.cli", "devices", "fail", "gpu-0"], capture_output=True,
                          text=True, timeout=30, env=env)
    assert proc.returncode == 2
    assert "no session" in proc.stderr


def test_artifacts_that_cannot_be_written_never_leave_the_sandbox_behind(tmp_path: Path) -> None:
    # `fakelet up --out FILE` used to leave the whole sandbox in /tmp when keeping its artifacts failed.
    from harness.spec.profiles import FAST
    from harness.spec.subjects import load_subject
    from harness.world.env import DPEnv

    (tmp_path / "afile").write_text("someone's\n")
    env = DPEnv(load_subject("reference-dp"), FAST, artifacts=tmp_path / "afile")
    try:
        with pytest.raises(FileExistsError):
            env.close()
        left_behind = env.sandbox.path.exists()
    finally:
        env.sandbox.close()  # idempotent: only here so that a failing run of this test cleans up too
    assert not left_behind
    assert (tmp_path / "afile").read_text() == "someone's\n"
