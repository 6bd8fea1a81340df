"""Leftovers of runs killed outright are removed by the next run, and only those."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.launch.owners import OWNER_FILE, claim, owner_alive
from harness.launch.reaper import reap
from harness.launch.sandbox import Sandbox


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_dead_owners_are_reaped_live_and_foreign_dirs_kept(tmp_path: Path) -> None:
    dead, live, foreign, reused = (tmp_path / f"fakelet-{n}" for n in ("dead", "live", "foreign", "reused"))
    for d in (dead, live, foreign, reused):
        d.mkdir()
        (d / "kubelet.sock").touch()
    claim(dead, dead_pid())
    claim(live)
    # The same pid, but another process (a different start time): its owner is gone.
    (reused / OWNER_FILE).write_text(json.dumps({"pid": os.getpid(), "start": "1"}))
    assert owner_alive(live) is True and owner_alive(foreign) is None
    assert sorted(reap(tmp_path)) == sorted([dead, reused])
    assert live.exists() and foreign.exists() and not dead.exists() and not reused.exists()


def test_a_sandbox_of_a_killed_run_is_reaped(tmp: Path) -> None:
    tmp_path = tmp  # short: sandboxes hold unix sockets
    code = ("from harness.launch.sandbox import Sandbox; from pathlib import Path; "
            f"print(Sandbox(Path({str(tmp_path)!r})).path)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    left = Path(proc.stdout.strip())
    assert left.exists() and owner_alive(left) is False  # its process exited without close()
    assert reap(tmp_path) == [left] and not left.exists()
    with Sandbox(tmp_path) as mine:
        assert reap(tmp_path) == [] and mine.path.exists()


def test_a_removal_cut_short_leaves_a_directory_the_reaper_still_knows(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A teardown killed mid-removal (CI once saw a killed run's sandbox outlive the next run's reaper): the owner
    file goes last, so what is left still names its (dead) owner instead of being nobody's forever."""
    from harness.launch import owners

    directory = owners.owned_dir("fakelet-", tmp_path)
    (directory / "a").mkdir()
    (directory / "a" / "f").write_text("x")
    (directory / "z.sock").write_text("")

    def killed(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(owners.shutil, "rmtree", killed)
    with pytest.raises(KeyboardInterrupt):
        owners.remove_owned(directory)
    assert (directory / owners.OWNER_FILE).exists()
    assert owners.owner_alive(directory) is True
    monkeypatch.undo()
    owners.remove_owned(directory)
    assert not directory.exists()
