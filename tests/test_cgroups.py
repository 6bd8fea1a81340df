"""A cgroup per plugin start (harness/launch/cgroups.py through process.py): limits, findings, a sure sweep."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from harness.instruments.filewatch import FileWatch
from harness.instruments.timeline import Timeline
from harness.launch import cgroups
from harness.launch.process import ProcessLauncher

WHY = cgroups.available()
pytestmark = pytest.mark.skipif(WHY is not None, reason=f"no cgroup here: {WHY}")
EXIT_S = 20.0  # generous on 2 busy cores

# Forks until the kernel refuses, then reports how many it got and waits to be stopped.
FORK_BOMB = """
import os, signal, sys, time
kids = 0
while kids < 10000:
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        signal.pause()
        os._exit(0)
    kids += 1
print("forked", kids, flush=True)
open(sys.argv[1] + ".tmp", "w").write(str(kids))
os.rename(sys.argv[1] + ".tmp", sys.argv[1])  # appears whole
signal.pause()
"""
EAT = "x = bytearray(256 << 20); x[::4096] = b'x' * len(x[::4096])"


def launcher(tmp_path: Path, code: str, *args: str, limits: cgroups.Limits) -> ProcessLauncher:
    proc = ProcessLauncher("cg-test", [sys.executable, "-c", code, *args], dict(os.environ), tmp_path / "log",
                           Timeline())
    proc.limits = limits
    return proc


def test_pids_limit_is_a_finding_and_the_sweep_leaves_nothing(tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    done = tmp_path / "out" / "forked"
    proc = launcher(tmp_path, FORK_BOMB, str(done), limits=cgroups.Limits(pids_max=32))
    files = FileWatch(tmp_path / "out", proc.timeline).start()
    proc.start()
    try:
        assert proc.cgroup_note and "pids.max 32" in proc.cgroup_note
        proc.timeline.wait_for(lambda e: e.kind == "file.created" and e.get("name") == done.name, EXIT_S,
                               "the fork loop to end")
        members = proc._cgroup.procs() if proc._cgroup else set()
        assert len(members) >= int(done.read_text()), "everything it started is in its cgroup"
    finally:
        proc.stop()
        files.stop()
    assert int(done.read_text()) < 32
    assert any("pids limit of 32" in f for f in proc.limits_finding())
    assert all(not Path(f"/proc/{pid}").exists() or _zombie(pid) for pid in members)


def test_memory_limit_oom_is_a_finding(tmp_path: Path) -> None:
    proc = launcher(tmp_path, EAT, limits=cgroups.Limits(memory_max=64 << 20))
    proc.start()
    code = proc.wait_exit(EXIT_S)
    proc.stop()
    assert code is not None and code != 0
    assert any("OOM-killed" in f and "64 MiB" in f for f in proc.limits_finding())


def test_no_cgroup_is_left_after_stop(tmp_path: Path) -> None:
    proc = launcher(tmp_path, "import signal; signal.pause()", limits=cgroups.Limits())
    proc.start()
    paths = proc._cgroup.paths if proc._cgroup else []
    assert paths
    proc.stop()
    assert not any(Path(p).exists() for p in paths)


def _zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat[stat.rfind(")") + 2] == "Z"


def test_reaper_removes_cgroups_of_dead_owners(tmp_path: Path) -> None:
    from harness.launch import reaper

    v2, v1 = cgroups.find_hierarchies()
    hierarchies = [v2] if v2 is not None else [h for c, h in v1.items() if c in ("pids", "memory", "freezer")]
    dead = "4194303-1"  # above any pid_max: an owner that cannot be alive
    for h in hierarchies:
        (h.base / cgroups.ROOT_NAME / dead / "leaf-1").mkdir(parents=True)
    removed = reaper.reap(tmp_path, cgroups=True)
    assert not any((h.base / cgroups.ROOT_NAME / dead).exists() for h in hierarchies)
    assert any(dead in str(p) for p in removed)
