"""Leftovers of dead runs: every temp dir a run makes names its owner; the next run removes the dead ones.

A run killed outright (SIGKILL, a lost CI machine) cannot clean up after
itself. Its processes die with it (parent-death signals, PID namespaces), but
its directories stay: sandboxes with stale sockets, pytest's temp root, the
local control plane's workdir. Each records its owner (pid and the process's
start time, so that a reused pid is not mistaken for the owner) in
OWNER_FILE; `reap()` removes those whose owner is gone and says what it removed.

Cgroups (harness/cgroups.py) cannot hold a file of ours: their owner is in
their name (`owner_tag()`, `<pid>-<start ticks>`), and `reap()` removes those
of dead owners too, killing the processes still in them first.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from pathlib import Path

OWNER_FILE = ".fakelet-owner"
# Every temp dir fakelet makes starts with this (sandboxes, pytest's root, control-plane workdirs).
PREFIX = "fakelet-"


def start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22), or None if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its closing one.
    return stat.rsplit(")", 1)[1].split()[19]


def claim(directory: Path, pid: int | None = None) -> None:
    """Record that the process `pid` (default: this one) owns `directory`."""
    pid = os.getpid() if pid is None else pid
    (Path(directory) / OWNER_FILE).write_text(json.dumps({"pid": pid, "start": start_time(pid)}))


def owner_alive(directory: Path) -> bool | None:
    """True or False for a claimed directory; None when it names no owner (not ours, or being made)."""
    try:
        owner = json.loads((Path(directory) / OWNER_FILE).read_text())
        pid, started = int(owner["pid"]), owner.get("start")
    except (OSError, ValueError, KeyError, TypeError):
        return None
    now = start_time(pid)
    return now is not None and (started is None or now == started)


def owner_tag(pid: int | None = None) -> str:
    """The owner marker for things that cannot hold OWNER_FILE (cgroups): `<pid>-<start ticks>`."""
    pid = os.getpid() if pid is None else pid
    return f"{pid}-{start_time(pid)}"


def tag_alive(tag: str) -> bool | None:
    """True or False for an owner tag; None when `tag` is not one."""
    match = re.fullmatch(r"(\d+)-(\d+)", tag)
    if match is None:
        return None
    return start_time(int(match.group(1))) == match.group(2)


def reap(base: Path | None = None, cgroups: bool | None = None) -> list[Path]:
    """Remove the fakelet temp dirs under `base` whose owner is dead; return what was removed.

    With `cgroups` (default: when `base` is the system's temp dir, i.e. for a real run)
    fakelet's cgroups of dead owners go too, after the processes still in them.
    """
    cgroups = base is None if cgroups is None else cgroups
    base = Path(base or tempfile.gettempdir())
    removed = []
    for directory in sorted(base.glob(PREFIX + "*")):
        if directory.is_symlink() or not directory.is_dir() or owner_alive(directory) is not False:
            continue
        shutil.rmtree(directory, ignore_errors=True)
        if not directory.exists():
            removed.append(directory)
    if cgroups:
        from harness import cgroups as cg  # it uses this module's owner tags

        removed += [path for path, _ in cg.reap_dead()]
    return removed
