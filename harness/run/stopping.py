"""Ctrl-C and SIGTERM: the first one stops the run, and nothing after it cuts the stop short.

A stop tears down subjects, sandboxes and cgroups and then writes an INTERRUPTED report.
Any later signal (an impatient second Ctrl-C, a CI runner's SIGTERM after its SIGINT, the
SIGINT execnet sends an xdist worker that is still tearing down) once raised in the middle
of that clean-up and left sandboxes, tracebacks and ERROR reports behind: here it is only
noted. Work that must finish once begun (a report being written, the report directory
being swapped in) runs `shielded()`: a first signal during it is noted too, and the caller
reads `requested` afterwards to call the run interrupted.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopSignals:
    """SIGINT and SIGTERM for one process: at most one KeyboardInterrupt, ever."""

    def __init__(self, on_again: Callable[[int], None] | None = None,
                 on_first: Callable[[int], None] | None = None) -> None:
        self.requested = False  # a stop signal arrived (raised or only noted)
        self.raised = False  # the one KeyboardInterrupt has been raised
        self._shields = 0
        self._on_again, self._on_first = on_again, on_first

    def install(self) -> StopSignals:
        # Python delivers signals to the main thread only, and only it may set handlers.
        if threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        again = self.requested
        self.requested = True
        if not again and self._on_first is not None:
            self._on_first(signum)
        if self.raised or self._shields:
            if again and self._on_again is not None:
                self._on_again(signum)
            return
        self.raised = True
        raise KeyboardInterrupt

    @contextmanager
    def shielded(self) -> Iterator[None]:
        """Run the block to its end: a stop signal meanwhile is only noted in `requested`."""
        self._shields += 1
        try:
            yield
        finally:
            self._shields -= 1

    def raise_if_requested(self) -> None:
        """Raise the KeyboardInterrupt a signal during a shielded block did not, once that block is done."""
        if self.requested and not self.raised:
            self.raised = True
            raise KeyboardInterrupt


# argv: the parent's pid, the check run's process group (its leader's pid), the grace in seconds.
_WATCHDOG = """
import os, select, signal, sys
parent, group, grace = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
leader = os.pidfd_open(group)
try:
    ready = select.select([os.pidfd_open(parent), leader], [], [])[0]
except ProcessLookupError:
    ready = []
if leader not in ready and not select.select([leader], [], [], grace)[0]:
    os.killpg(group, signal.SIGKILL)
"""


class OrphanBackstop:
    """A check run whose `fakelet run` died outright (SIGKILL, OOM) gets SIGTERM from the kernel (its parent-death
    signal) and tears down; nobody is left to kill it if that teardown hangs, as `fakelet run` would after its
    grace. So on a stop signal with its parent gone, the run's whole process group (itself and its xdist workers)
    is killed once the grace has passed; what it leaves, the next run's reaper removes."""

    def __init__(self, grace_s: float) -> None:
        self.grace_s = grace_s
        self.parent = os.getppid()

    def __call__(self, signum: int) -> None:
        if os.getppid() == self.parent:
            return  # `fakelet run` is alive: it stops the check run itself, bounded by the same grace
        timer = threading.Timer(self.grace_s, os.killpg, args=(os.getpgrp(), signal.SIGKILL))
        timer.daemon = True
        timer.start()

    def watch(self) -> None:
        """Also arm when the parent dies, from a watchdog process of its own (only a check run's controller, the
        process group's leader, calls this). A Python thread would not do: CI's orphan hung in the interpreter's
        finalization (grpc's threads in futex waits, the signal handlers already reset), where no Python thread
        runs again. The watchdog waits on two pidfds and exits with the controller."""
        subprocess.Popen([sys.executable, "-I", "-c", _WATCHDOG, str(self.parent), str(os.getpgrp()),
                          str(self.grace_s)], start_new_session=True, stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
