"""Who owns what a run leaves: an owner file in each temp dir, an owner tag in each cgroup's name.

The owner is a pid and that process's start time, so that a reused pid is not
mistaken for the owner. The reaper (reaper.py) removes what dead owners left.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
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


def remove_owned(directory: Path | str) -> None:
    """Remove an owned directory with its owner file last, so that a removal cut short (the process killed
    mid-way: a run's teardown outlasting its grace) leaves a directory the reaper still knows is a dead owner's.
    Removed in one go, a directory that lost its owner file first would be nobody's, and never reaped."""
    directory = Path(directory)
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return
    for entry in entries:
        if entry.name == OWNER_FILE:
            continue
        path = Path(entry.path)
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                path.unlink()
    shutil.rmtree(directory, ignore_errors=True)


def owned_dir(prefix: str, parent: Path | str | None = None) -> Path:
    """A new private directory (0700) under `parent` (default the temp dir), claimed by this process.

    tempfile.mkdtemp cannot be used here: an interrupt that arrives after its mkdir and before it
    returns leaves a directory nobody knows the name of and nobody claimed, so neither the
    interrupted run nor the reaper ever removes it. Here the name is known before the mkdir, and
    an interrupt at any point removes what was made.
    """
    parent = Path(parent or tempfile.gettempdir())
    for _ in range(tempfile.TMP_MAX):
        path = parent / f"{prefix}{secrets.token_hex(4)}"
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            continue
        except BaseException:
            with contextlib.suppress(OSError):
                os.rmdir(path)  # made just before the interrupt: empty, and ours
            raise
        try:
            claim(path)
        except BaseException:
            remove_owned(path)
            raise
        return path
    raise FileExistsError(f"no free name for a {prefix}* directory in {parent}")
