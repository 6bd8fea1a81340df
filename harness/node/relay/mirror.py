"""Two directories kept as one: what happens in one (a socket created or deleted, a file written) is told to
the relay, which repeats it in the other; the relay's own repeats are echoes and are not told back.

One inotify instance watches both, so the events of each directory come in the order they happened.
"""

from __future__ import annotations

import os
import select
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from inotify_simple import INotify
from inotify_simple import flags as IN

CREATED, DELETED, WRITTEN = "created", "deleted", "written"
WATCHED = IN.CREATE | IN.DELETE | IN.MOVED_TO | IN.MOVED_FROM | IN.CLOSE_WRITE

OnChange = Callable[[str, str, str], None]  # (side, name, what)


class DirMirror:
    """Calls `on_change(side, name, what)` for each change in the watched directories that the relay did not
    make itself (`expect_echo` before each of its own)."""

    def __init__(self, dirs: dict[str, Path], on_change: OnChange, name: str = "relay-mirror") -> None:
        self.dirs, self.on_change, self.name = dirs, on_change, name
        self._echoes: Counter[tuple[str, str, str]] = Counter()
        self._lock = threading.Lock()
        self._inotify = INotify()
        self._sides = {self._inotify.add_watch(str(path), WATCHED): side for side, path in dirs.items()}
        self._wake_r, self._wake_w = os.pipe()
        self._thread = threading.Thread(target=self._run, daemon=True, name=name)
        self._stopped = False

    def start(self) -> DirMirror:
        self._thread.start()
        return self

    def watch(self, side: str, path: Path) -> None:
        """Watch one more directory as `side` (a DRA driver's endpoint directory, known once it registers). A
        directory watched already keeps its side: inotify gives one watch per inode, so it could not have two."""
        with self._lock:
            if self._stopped:
                return
            wd = self._inotify.add_watch(str(path), WATCHED)
            self._sides.setdefault(wd, side)

    def expect_echo(self, side: str, name: str, what: str) -> None:
        """The relay is about to make this change itself: its event is not a change to repeat."""
        with self._lock:
            self._echoes[(side, name, what)] += 1

    def _is_echo(self, key: tuple[str, str, str]) -> bool:
        with self._lock:
            if self._echoes[key] > 0:
                self._echoes[key] -= 1
                return True
            return False

    def _run(self) -> None:
        while True:
            try:
                ready, _, _ = select.select([self._inotify.fileno(), self._wake_r], [], [])
                if self._wake_r in ready:
                    return
                events = self._inotify.read(timeout=0)
            except (OSError, ValueError):
                return  # closed under it: stop() gave up waiting
            for event in events:
                side = self._sides.get(event.wd)
                if side is None or not event.name:
                    continue
                if event.mask & (IN.CREATE | IN.MOVED_TO):
                    what = CREATED
                elif event.mask & (IN.DELETE | IN.MOVED_FROM):
                    what = DELETED
                else:
                    what = WRITTEN
                if not self._is_echo((side, event.name, what)):
                    self.on_change(side, event.name, what)

    def stop(self) -> None:
        with self._lock:  # no watch() is added to an inotify being closed
            if self._stopped:
                return
            self._stopped = True
        os.write(self._wake_w, b"x")
        if self._thread.is_alive():
            self._thread.join(5)
        self._inotify.close()
        os.close(self._wake_r)
        os.close(self._wake_w)
