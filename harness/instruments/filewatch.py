"""Puts file events of a directory on the timeline (inotify), e.g. sockets appearing."""

from __future__ import annotations

import os
import select
import stat
import threading
from pathlib import Path

from inotify_simple import INotify
from inotify_simple import flags as IN

from harness.instruments.timeline import Timeline


class FileWatch:
    def __init__(self, directory: Path, timeline: Timeline, source: str = "files",
                 ignore: frozenset[str] = frozenset()) -> None:
        """`ignore`: names whose events say nothing about the plugin (the kubelet's own scratch files)."""
        self.directory, self.timeline, self.source, self.ignore = Path(directory), timeline, source, ignore
        self._stop = threading.Event()
        self._wake_r, self._wake_w = os.pipe()
        self._thread: threading.Thread | None = None
        self._inotify: INotify | None = None

    def start(self) -> FileWatch:
        self._inotify = INotify()
        self._inotify.add_watch(str(self.directory), IN.CREATE | IN.DELETE | IN.MOVED_TO | IN.MOVED_FROM)
        self._thread = threading.Thread(target=self._run, daemon=True, name="filewatch")
        self._thread.start()
        return self

    def _run(self) -> None:
        assert self._inotify is not None
        while not self._stop.is_set():
            ready, _, _ = select.select([self._inotify.fileno(), self._wake_r], [], [])
            if self._wake_r in ready:
                return
            for event in self._inotify.read(timeout=0):
                if event.name in self.ignore:
                    continue
                created = bool(event.mask & (IN.CREATE | IN.MOVED_TO))
                path = self.directory / event.name
                self.timeline.record("file.created" if created else "file.deleted", self.source,
                                     name=event.name, socket=created and is_socket(path))

    def stop(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        os.write(self._wake_w, b"x")
        if self._thread is not None:
            self._thread.join(2)
        if self._inotify is not None:
            self._inotify.close()
            self._inotify = None
        os.close(self._wake_r)
        os.close(self._wake_w)


def is_socket(path: Path) -> bool:
    """Whether `path` is a unix socket itself (not followed through a link)."""
    try:
        return stat.S_ISSOCK(os.lstat(path).st_mode)
    except OSError:
        return False
