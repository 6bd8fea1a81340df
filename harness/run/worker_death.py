"""How a check process (an xdist worker) died, and what of it was left, for the checks it took with it.

A worker that dies mid-check (a crash in fakelet or in a library it uses, a signal from outside) gives
its check no verdict: the check is an ERROR, and its detail says how the process ended, never only
"crashed or interrupted". Its sandbox, cgroup and temp dirs name it as their owner; once it is dead
the reaper (harness/launch/reaper.py) removes them at once, not at the next run.
"""

from __future__ import annotations

import signal
import subprocess
from typing import Any

from harness.launch.reaper import reap

WORKER_EXIT_WAIT_S = 5.0  # its pipe closed: the process is gone or about to be; bound the wait anyway


def exit_status(node: Any) -> int | None:
    """The dead worker's exit status (negative: the signal that killed it), or None when it cannot be had.

    execnet keeps the worker's Popen on its gateway's io (execnet/gateway_io.py Popen2IOMaster.popen)."""
    popen = getattr(getattr(getattr(node, "gateway", None), "_io", None), "popen", None)
    if not isinstance(popen, subprocess.Popen):
        return None
    try:
        return popen.wait(WORKER_EXIT_WAIT_S)
    except subprocess.TimeoutExpired:
        return None


def describe_death(returncode: int | None) -> str:
    if returncode is None:
        return "the check process died"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"the check process died of {name}"
    return f"the check process exited with code {returncode}"


def worker_died(node: Any) -> str:
    """What a check's detail says of its dead worker: how it ended, and what of it was removed."""
    how = describe_death(exit_status(node))
    removed = reap()
    left = f"; its leftovers were removed ({len(removed)}: sandbox, temp dirs, cgroups)" if removed else ""
    return f"no result: {how} before the check's verdict (a harness failure, not a verdict on the plugin){left}"
