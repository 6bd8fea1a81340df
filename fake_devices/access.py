"""Which files of the fake hardware a plugin actually reads: facts, not guesses.

`AccessTrace` watches every directory of the materialized tree (ROOT/sys/...
and ROOT/dev/...) with inotify for opens, reads and closes, and counts reads
per file, so the harness can say "the plugin read no health source fakelet
drives" instead of assuming it. New directories (a hot-plugged device arrives
as one renamed-in directory) are watched as they appear; directories renamed
out of the tree are forgotten.

What counts as one read of a file:
- an IN_ACCESS (a read(2) that returned data), or
- an IN_CLOSE_NOWRITE after an IN_OPEN that read nothing (a descriptor opened
  for reading and closed, e.g. a device node opened to probe it).
An open closed with IN_CLOSE_WRITE was a write and counts as nothing. Only
regular names count: the backend writes every value as a dot-named temp file
renamed over the real one, builds devices under ROOT/.staging, and never reads
the tree back (fake_devices.materialize), so none of its own activity is a read.
Directory listings are not reads of a file either.

Limits, inherent to inotify: events carry no pid, so anyone else reading the
tree (a person with `cat`, harness code) counts as the plugin; reads in the
moment between a directory's arrival and its watch are missed (`wait_watching`
tells when a directory is covered); the kernel merges identical consecutive
events, so counts are lower bounds; paths are the real ones (a read through
ROOT/sys/class/drm/card0/device/vendor is reported under
sys/devices/pci0000:00/<bdf>/vendor). If the event queue overflows,
`overflowed` is set and the watches are renewed; reads in the gap are lost.

The timeline gets one `hw.read` event (source "fake_devices") the first time
each file is read, never one per read: plugins poll.
"""

from __future__ import annotations

import os
import re
import select
import threading
import time
from pathlib import Path
from types import TracebackType

from inotify_simple import Event, INotify
from inotify_simple import flags as IN

from harness.instruments.timeline import Timeline

SOURCE = "fake_devices"
READ_EVENT = "hw.read"
TREES = ("sys", "dev")  # the parts of ROOT a plugin reads; ROOT/.staging is the backend's
GROUPS = ("health", "temperature", "inventory", "nodes", "other")
STOP_DEADLINE_S = 2.0  # teardown never waits longer than this for the watcher thread

FILE_EVENTS = IN.OPEN | IN.ACCESS | IN.CLOSE_NOWRITE | IN.CLOSE_WRITE
DIR_EVENTS = IN.CREATE | IN.MOVED_TO | IN.MOVED_FROM
# IN_ONLYDIR and IN_DONT_FOLLOW: a watch is only ever on a real directory; a
# link into another part of the tree is covered by that part's own watch.
WATCH_MASK = FILE_EVENTS | DIR_EVENTS | IN.ONLYDIR | IN.DONT_FOLLOW
ROOT_MASK = IN.CREATE | IN.MOVED_TO | IN.ONLYDIR | IN.DONT_FOLLOW

HEALTH_NAMES = frozenset({"health", "present", "ecc_errors"})
TEMPERATURE_NAME_RE = re.compile(r"^(temperature|temp\d*_(input|crit|max|emergency|label))$")
INVENTORY_NAMES = frozenset({
    "vendor", "device", "model", "uuid", "serial", "numa_node", "pci_address", "memory_mib", "node",
    "class", "subsystem_vendor", "subsystem_device", "local_cpulist", "lmem_total_bytes", "dev", "uevent",
    "revision", "irq", "resource", "modalias",
})
BDF_RE = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")


def classify(rel: str) -> str:
    """The group of a file read, by what it carries; `rel` is relative to ROOT ("sys/class/gpu/gpu-0/health")."""
    parts = rel.split("/")
    name = parts[-1]
    if parts[0] == "dev":
        return "nodes"
    if name in HEALTH_NAMES or parts[:4] == ["sys", "bus", "pci", "drivers"]:
        return "health"
    if name == "uevent" and len(parts) >= 2 and BDF_RE.match(parts[-2]):
        return "health"  # a PCI device's uevent says which driver is bound (DRIVER=), i.e. whether it works
    if TEMPERATURE_NAME_RE.match(name) or any(p.startswith("hwmon") for p in parts):
        return "temperature"
    if name in INVENTORY_NAMES:
        return "inventory"
    return "other"


class AccessTrace:
    def __init__(self, root: Path, timeline: Timeline | None = None) -> None:
        self.root, self.timeline = Path(root), timeline
        self.overflowed = False
        self._cond = threading.Condition()  # guards everything below; notified when watches change
        self._inotify: INotify | None = None
        self._thread: threading.Thread | None = None
        self._wake: tuple[int, int] | None = None
        self._stopped = False
        self._dirs: dict[int, str] = {}  # wd -> directory relative to ROOT ("" is ROOT)
        self._watched: dict[str, tuple[int, int, int]] = {}  # directory -> (wd, st_dev, st_ino)
        self._reads: dict[str, int] = {}
        self._pending: dict[str, int] = {}  # opens not closed yet, per file
        self._accessed: set[str] = set()  # files read since their last close

    # -- lifecycle -----------------------------------------------------------

    def start(self) -> AccessTrace:
        with self._cond:
            if self._inotify is not None or self._stopped:
                return self
            if not self.root.is_dir():
                raise FileNotFoundError(f"access trace: no materialized tree at {self.root}")
            self._inotify = INotify()
            try:
                # ROOT itself only for sys/ or dev/ appearing later; its files are no hardware.
                self._add_watch("", ROOT_MASK)
                for tree in TREES:
                    self._watch_tree(tree)
                self._wake = os.pipe()
            except BaseException:
                self._inotify.close()
                self._inotify = None
                raise
            self._thread = threading.Thread(target=self._run, args=(self._inotify, self._wake[0]),
                                            daemon=True, name="fakelet-access-trace")
            self._thread.start()
        return self

    def stop(self) -> None:
        """Take in what is already queued, then close the watch. Idempotent; bounded by STOP_DEADLINE_S."""
        with self._cond:
            if self._stopped:
                return
            self._stopped = True
            thread, wake, inotify = self._thread, self._wake, self._inotify
        if wake is not None:
            os.write(wake[1], b"x")
        if thread is not None:
            thread.join(STOP_DEADLINE_S)
        with self._cond:
            if inotify is not None:
                inotify.close()  # a thread past its deadline then fails its next read and ends
            self._inotify = None
            if wake is not None:
                for fd in wake:
                    os.close(fd)
            self._wake = None
            self._cond.notify_all()

    def __enter__(self) -> AccessTrace:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    # -- observations --------------------------------------------------------

    def reads(self) -> dict[str, int]:
        """File relative to ROOT -> number of reads seen (a copy)."""
        with self._cond:
            return dict(self._reads)

    def summary(self) -> dict[str, list[str]]:
        """The files read, sorted, grouped by what they carry: health, temperature, inventory, nodes, other."""
        out: dict[str, list[str]] = {group: [] for group in GROUPS}
        for rel in sorted(self.reads()):
            out[classify(rel)].append(rel)
        return out

    def reads_health_source(self) -> bool:
        return bool(self.summary()["health"])

    def reads_temperature_source(self) -> bool:
        return bool(self.summary()["temperature"])

    def watching(self, rel: str) -> bool:
        """Whether the directory now at ROOT/`rel` (this very one, not an earlier one of that name) is watched."""
        rel = rel.strip("/")
        try:
            st = os.stat(self.root / rel)  # stat opens nothing: no event of its own
        except OSError:
            return False
        with self._cond:
            w = self._watched.get(rel)
            return w is not None and (w[1], w[2]) == (st.st_dev, st.st_ino)

    def wait_watching(self, rel: str, timeout_s: float) -> bool:
        """Wait until `watching(rel)`, e.g. for a hot-plugged device's directory; False at the deadline."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while not self.watching(rel):
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._stopped:
                    return False
                self._cond.wait(remaining)
            return True

    # -- mechanics -----------------------------------------------------------

    def _run(self, inotify: INotify, wake_r: int) -> None:
        try:
            while True:
                ready, _, _ = select.select([inotify.fileno(), wake_r], [], [])
                # Read what is queued even when woken to stop: reads that happened
                # before stop() must count.
                self._handle(inotify.read(timeout=0))
                if wake_r in ready:
                    return
        except (OSError, ValueError):
            return  # closed under us after the stop deadline

    def _handle(self, events: list[Event]) -> None:
        first: list[str] = []
        with self._cond:
            for event in events:
                self._handle_one(event.wd, event.mask, event.name, first)
        if self.timeline is not None:
            for rel in first:
                self.timeline.record(READ_EVENT, SOURCE, path=rel, group=classify(rel))

    def _handle_one(self, wd: int, mask: int, name: str, first: list[str]) -> None:
        if mask & IN.Q_OVERFLOW:
            self.overflowed = True
            for tree in TREES:  # directories that came meanwhile; known ones are a no-op
                self._watch_tree(tree)
            return
        base = self._dirs.get(wd)
        if base is None:
            return
        if mask & IN.IGNORED:
            self._drop(wd)
            return
        if not name or name.startswith("."):
            return  # the directory itself, or the backend's temp and staging names
        rel = f"{base}/{name}" if base else name
        if mask & IN.ISDIR:
            if mask & (IN.CREATE | IN.MOVED_TO) and (base or name in TREES):
                self._watch_tree(rel)
            elif mask & IN.MOVED_FROM:
                self._forget_tree(rel)
            return  # opening or listing a directory is not a read of a file
        if not base:
            return  # a file at ROOT is no hardware
        self._file_event(rel, mask, first)

    def _file_event(self, rel: str, mask: int, first: list[str]) -> None:
        counted = 0
        if mask & IN.OPEN:
            self._pending[rel] = self._pending.get(rel, 0) + 1
        if mask & IN.ACCESS:
            counted += 1
            self._accessed.add(rel)
        if mask & (IN.CLOSE_NOWRITE | IN.CLOSE_WRITE):
            if mask & IN.CLOSE_NOWRITE and rel not in self._accessed:
                counted += 1  # opened for reading, read nothing, closed: it still looked
            self._accessed.discard(rel)
            left = self._pending.get(rel, 0) - 1
            if left > 0:
                self._pending[rel] = left
            else:
                self._pending.pop(rel, None)
        if counted:
            if rel not in self._reads:
                first.append(rel)
            self._reads[rel] = self._reads.get(rel, 0) + counted

    def _add_watch(self, rel: str, mask: int) -> None:
        assert self._inotify is not None
        path = self.root / rel if rel else self.root
        try:
            wd = self._inotify.add_watch(str(path), mask)
            st = os.stat(path)
        except OSError:
            return  # gone meanwhile (an unplug racing the plug), or not a directory
        old = self._dirs.get(wd)
        if old is not None and old != rel:
            self._watched.pop(old, None)
        self._dirs[wd] = rel
        self._watched[rel] = (wd, st.st_dev, st.st_ino)
        self._cond.notify_all()

    def _watch_tree(self, rel: str) -> None:
        """Watch ROOT/`rel` and every real directory below it (links are not followed)."""
        top = self.root / rel
        if not top.is_dir() or top.is_symlink():
            return
        self._add_watch(rel, WATCH_MASK)
        for dirpath, dirnames, _ in os.walk(top):
            dirnames[:] = [d for d in dirnames if not d.startswith(".")
                           and not os.path.islink(os.path.join(dirpath, d))]
            for d in dirnames:
                self._add_watch(os.path.relpath(os.path.join(dirpath, d), self.root), WATCH_MASK)

    def _forget_tree(self, rel: str) -> None:
        """A directory renamed out of the tree (an unplug): its watches now describe nothing of ROOT."""
        assert self._inotify is not None
        prefix = rel + "/"
        for wd, d in list(self._dirs.items()):
            if d == rel or d.startswith(prefix):
                self._drop(wd)
                try:
                    self._inotify.rm_watch(wd)
                except OSError:
                    pass  # already gone with its directory
        for f in [f for f in self._pending if f.startswith(prefix)]:
            del self._pending[f]
        self._accessed = {f for f in self._accessed if not f.startswith(prefix)}

    def _drop(self, wd: int) -> None:
        rel = self._dirs.pop(wd, None)
        if rel is not None and self._watched.get(rel, (None,))[0] == wd:
            del self._watched[rel]
            self._cond.notify_all()
