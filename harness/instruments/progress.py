"""Progress of long steps on stderr: what runs and why, how long it has taken, when it ended.

A first run builds Kubernetes from the Go module proxy for minutes; a command that says
nothing for that long looks hung. A step is a context manager around the slow part only
(a cache hit never enters one). It announces itself, then shows a spinner with the elapsed
time where a person watches a terminal, or a plain line every PLAIN_EVERY_S where a log
collects the output (CI), and ends with one line that gives the elapsed time.

Progress goes to stderr, never stdout: commands print machine-readable output there. A
process whose sys.stderr is not the person's (pytest captures it, also in xdist workers)
pins the real one first with `pin_real_stderr()`.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import TextIO

PREFIX = "fakelet: "
PLAIN_EVERY_S = 30.0  # a CI log learns the step is alive this often, without drowning in lines
SPIN_EVERY_S = 0.25  # a spinner that turns slower than this looks stuck
FRAMES = "|/-\\"
JOIN_TIMEOUT_S = 1.0  # a ticker stuck writing to a blocked terminal never holds the step up longer
ERASE_LINE = "\r\x1b[K"

_pinned: TextIO | None = None
_pinned_spins = True


def pin_stream(stream: TextIO | None, *, spinner: bool = True) -> TextIO | None:
    """Send later steps' progress to `stream` (None: back to sys.stderr); return the stream pinned before.

    `spinner=False` keeps to plain lines even on a terminal: several processes that share one
    (pytest and its workers) would erase each other's spinner lines.
    """
    global _pinned, _pinned_spins
    before, _pinned, _pinned_spins = _pinned, stream, spinner
    return before


def pin_real_stderr(*, spinner: bool = True) -> Callable[[], None]:
    """Pin a copy of file descriptor 2 as it is now (before pytest captures it); return what undoes that."""
    stream = os.fdopen(os.dup(2), "w", encoding="utf-8", errors="replace")
    before, before_spins = _pinned, _pinned_spins
    pin_stream(stream, spinner=spinner)

    def restore() -> None:
        if _pinned is stream:
            pin_stream(before, spinner=before_spins)
        stream.close()
    return restore


def elapsed_text(seconds: float) -> str:
    """4m12s, 45s, 1h02m03s: as a person reads a duration."""
    total = max(int(seconds), 0)
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m{secs:02d}s"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


def home_relative(path: Path | str) -> str:
    """~/.cache/fakelet/bin rather than /home/someone/.cache/fakelet/bin."""
    text, home = str(path), str(Path.home())
    return "~" + text[len(home):] if home != "/" and (text == home or text.startswith(home + "/")) else text


def _is_terminal(stream: TextIO | None) -> bool:
    if stream is None:
        return False
    try:
        return stream.isatty() and os.environ.get("TERM") != "dumb"
    except (ValueError, OSError):  # closed, or not a file at all
        return False


class Progress:
    """One long step, as a context manager: announced, kept alive on screen, and timed.

    `title` names what the step makes ("kube-apiserver v1.36.3"), `detail` says why and where
    from; `doing` and `done` are the verbs of its lines. A step that ends within `quiet_s`
    prints nothing (0: announce at once). `clock`, `stream`, `spinner` and `background` are
    for tests: without the background thread, nothing happens between lines but `tick()`.
    """

    def __init__(self, title: str, *, detail: str = "", doing: str = "building", done: str = "built",
                 quiet_s: float = 0.0, stream: TextIO | None = None, clock: Callable[[], float] = time.monotonic,
                 spinner: bool | None = None, background: bool = True, every_s: float = PLAIN_EVERY_S) -> None:
        self.title, self.detail, self.doing, self.done = title, detail, doing, done
        self.quiet_s, self.every_s = quiet_s, every_s
        self._stream = stream
        self._clock = clock
        self._spinner = spinner
        self._background = background
        self._started = 0.0
        self._announced = False
        self._last_line = 0.0  # elapsed time of the last plain line
        self._frame = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def stream(self) -> TextIO | None:
        return self._stream or _pinned or sys.stderr  # None when Python runs without a stderr at all

    @property
    def spins(self) -> bool:
        if self._spinner is not None:
            return self._spinner
        if self._stream is None and _pinned is not None and not _pinned_spins:
            return False
        return _is_terminal(self.stream)

    def __enter__(self) -> Progress:
        self._started = self._clock()
        if self.quiet_s <= 0:
            self._announce()
        if self._background:
            self._thread = threading.Thread(target=self._tick_until_stopped, daemon=True,
                                            name=f"progress-{self.title[:30]}")
            self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(JOIN_TIMEOUT_S)
        if not self._announced:
            return
        took = elapsed_text(self.elapsed())
        if kind is None:
            line = f"{self.done} {self.title} in {took}"
        elif issubclass(kind, KeyboardInterrupt):
            line = f"{self.doing} {self.title} stopped after {took}"
        else:
            line = f"{self.doing} {self.title} failed after {took}"
        self._write((ERASE_LINE if self.spins else "") + PREFIX + line + "\n")

    def elapsed(self) -> float:
        return self._clock() - self._started

    def tick(self) -> None:
        """Whatever is due now: the late announcement of a quiet step, a spinner frame, a plain line."""
        if self._stop.is_set():
            return
        elapsed = self.elapsed()
        if not self._announced:
            if elapsed < self.quiet_s:
                return
            self._announce()
        if self.spins:
            self._frame = (self._frame + 1) % len(FRAMES)
            self._write(f"{ERASE_LINE}{FRAMES[self._frame]} {self.doing} {self.title}, {elapsed_text(elapsed)}")
        elif elapsed - self._last_line >= self.every_s:
            self._last_line = elapsed
            self._write(f"{PREFIX}... still {self.doing} {self.title}, {elapsed_text(elapsed)}\n")

    def _announce(self) -> None:
        self._announced = True
        self._last_line = self.elapsed()
        self._write(f"{PREFIX}{self.doing} {self.title}{self.detail} ...\n")

    def _due_in(self) -> float:
        if self.spins:
            return SPIN_EVERY_S
        target = self._last_line + self.every_s if self._announced else self.quiet_s
        return max(target - self.elapsed(), SPIN_EVERY_S)

    def _tick_until_stopped(self) -> None:
        while not self._stop.wait(self._due_in()):
            self.tick()

    def _write(self, text: str) -> None:
        # Progress is a courtesy: a closed or broken stderr never fails the step it reports on.
        stream = self.stream
        if stream is None:
            return
        try:
            stream.write(text)
            stream.flush()
        except (OSError, ValueError):
            pass
