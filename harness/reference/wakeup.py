"""The reference plugins' self-pipe: how a signal wakes their main loop, whichever thread the kernel gave it to.

Python runs a signal handler in the main thread, but the kernel delivers a process-directed signal to any thread
that does not block it: often one of gRPC's. The C-level handler then only sets a flag, and a main thread blocked
in select() without a timeout never sees it: the plugin ignored SIGTERM for as long as nothing else woke it (the
reference DRA driver "did not exit within 30 s of signal 15" under load). signal.set_wakeup_fd makes the C-level
handler write to the loop's pipe from whichever thread it runs in.
"""

from __future__ import annotations

import os
import signal


def self_pipe() -> tuple[int, int]:
    """The loop's pipe (read end, write end); the write end does not block, as set_wakeup_fd needs."""
    read, write = os.pipe()
    os.set_blocking(write, False)
    return read, write


def wake_on_signals(write: int) -> None:
    """From the main thread, once the handlers are installed."""
    signal.set_wakeup_fd(write, warn_on_full_buffer=False)


def wake(write: int) -> None:
    try:
        os.write(write, b"x")
    except BlockingIOError:
        pass  # the pipe is full of wake-ups already: the loop will look


def drain(read: int) -> None:
    """Empty what select() said is there, so that the loop does not spin on old wake-ups."""
    os.read(read, 4096)
