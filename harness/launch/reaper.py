"""Leftovers of dead runs: every temp dir a run makes names its owner; the next run removes the dead ones.

A run killed outright (SIGKILL, a lost CI machine) cannot clean up after
itself. Its processes die with it (parent-death signals, PID namespaces), but
its directories stay: sandboxes with stale sockets, pytest's temp root, the
local control plane's workdir. Each records its owner (pid and the process's
start time, so that a reused pid is not mistaken for the owner) in
OWNER_FILE; `reap()` removes those whose owner is gone and says what it removed.

Cgroups (harness/launch/cgroups.py) cannot hold a file of ours: their owner is in
their name (`owner_tag()`, `<pid>-<start ticks>`), and `reap()` removes those
of dead owners too, killing the processes still in them first.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from harness.launch import cgroups as cg
from harness.launch.owners import PREFIX, owner_alive, remove_owned


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
        remove_owned(directory)  # a reaper cut short leaves it still a dead owner's
        if not directory.exists():
            removed.append(directory)
    if cgroups:
        removed += [path for path, _ in cg.reap_dead()]
    return removed
