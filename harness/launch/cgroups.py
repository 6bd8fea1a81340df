"""A cgroup per subject process tree: limits, a membership list nothing escapes, a sure kill.

The PID namespace already ends every process of a plugin when its helper dies.
A cgroup adds what a namespace cannot: limits that stop a fork bomb or a leak
before they hurt the machine (pids.max, a memory limit), the kernel's own
count of when a limit was hit (pids.events, OOM kills), and a list of member
processes that no setsid or double fork leaves, for the sweep at teardown
(and, where there is no PID namespace, the only way to find every descendant).

Layout, in every hierarchy used: `<base>/fakelet/<run-id>/<subject>-<n>`.
cgroupfs holds no files of ours, so the owner marker is the run-id itself:
`<pid>-<start ticks>` of the process that made it (harness/launch/owners.py's
`owner_tag`), and the next fakelet start removes the cgroups of dead owners
(`reap_dead`), killing what they still hold first.

Where: cgroup v2 (one hierarchy) when the pids and memory controllers can be
enabled for a child of its root; else the v1 pids and memory hierarchies
(plus freezer, for a race-free kill), nested under fakelet's own cgroup there
so that the machine's limits on fakelet hold for the plugin too; else none,
with the reason (`CgroupUnavailable`), which is a note, never an error.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from harness.launch.owners import owner_tag, tag_alive

# A plugin's processes and threads (gRPC serves from a thread pool, and pids.max counts
# threads) stay in the tens; 4096 is far above any real plugin, yet a fork bomb stops
# there, long before the host's pid_max (32768 by default) runs out for everyone else.
PIDS_MAX = 4096
# Device plugins and DRA drivers live in tens of MiB (DaemonSets commonly limit them to a
# few hundred); 4 GiB lets a leaking plugin show it in the report, not take the host down.
MEMORY_MAX = 4 << 30
ROOT_NAME = "fakelet"
V2_CONTROLLERS = ("pids", "memory")
V1_CONTROLLERS = ("pids", "memory")  # required; freezer is used when it is there
FREEZER = "freezer"
KILL_S = 10.0  # emptying a cgroup at teardown: SIGKILL is quick, but a loaded 2-core machine is not
REMOVE_S = 5.0  # rmdir is refused (EBUSY) while the last killed processes are still exiting
FREEZE_S = 1.0  # a task in uninterruptible sleep may keep a cgroup FREEZING; kill it anyway after this
POLL_FIRST_S, POLL_MAX_S = 0.002, 0.05  # waits on cgroupfs poll with a deadline (it has no event fd for v1)
MOUNTINFO = "/proc/self/mountinfo"
OWN_CGROUPS = "/proc/self/cgroup"

_lock = threading.Lock()  # a run dir is never removed while another thread of ours creates a subject in it
_serial = itertools.count(1)


class CgroupUnavailable(RuntimeError):
    """No cgroup for the subject here; the message says why (for the report's note)."""


@dataclass(frozen=True)
class Limits:
    pids_max: int = PIDS_MAX
    memory_max: int = MEMORY_MAX  # bytes

    def describe(self) -> str:
        return f"pids.max {self.pids_max}, memory {format_bytes(self.memory_max)}"


@dataclass
class LimitHits:
    """What the kernel counted: forks refused at pids.max, processes OOM-killed at the memory limit."""

    pids_max: int = 0
    oom_kills: int = 0

    def add(self, other: LimitHits) -> None:
        self.pids_max += other.pids_max
        self.oom_kills += other.oom_kills


def format_bytes(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} bytes"


# -- where the hierarchies are ------------------------------------------------------


@dataclass(frozen=True)
class Hierarchy:
    version: int  # 1 or 2
    controller: str  # v1: the controller it is for; v2: ""
    mount: Path  # where it is mounted
    root: str  # the hierarchy path mounted there ("/" unless bind-mounted from inside)
    base: Path  # where fakelet/ goes

    def rel(self, path: Path) -> str:
        """`path` as /proc/PID/cgroup names it."""
        parts = [self.root.strip("/"), *path.relative_to(self.mount).parts]
        return "/" + "/".join(p for p in parts if p)


def _unescape(field: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def parse_mountinfo(text: str) -> list[dict[str, str]]:
    """mountinfo lines as {id, root, point, fstype, source, options} (the super options)."""
    out = []
    for line in text.splitlines():
        head, sep, tail = line.partition(" - ")
        fields, rest = head.split(), tail.split()
        if not sep or len(fields) < 5 or len(rest) < 2:
            continue
        out.append({"id": fields[0], "root": _unescape(fields[3]), "point": _unescape(fields[4]),
                    "fstype": rest[0], "source": _unescape(rest[1]), "options": rest[2] if len(rest) > 2 else ""})
    return out


def parse_own_cgroups(text: str) -> dict[str, str]:
    """/proc/self/cgroup as controller -> path ("" for the v2 hierarchy)."""
    own: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        for controller in controllers.split(",") if controllers else [""]:
            own.setdefault(controller, path)
    return own


def _below(mount: Path, root: str, own: str | None) -> Path:
    """fakelet's own cgroup in this hierarchy as a directory, or the mount when it lies outside."""
    if own is None:
        return mount
    root = root.rstrip("/") + "/"
    if not (own + "/").startswith(root):
        return mount
    return mount / own[len(root):].strip("/")


def find_hierarchies(mountinfo: str | None = None, own: str | None = None) -> tuple[Hierarchy | None,
                                                                                      dict[str, Hierarchy]]:
    """The v2 hierarchy (if mounted) and the v1 ones by controller (pids, memory, freezer)."""
    mounts = parse_mountinfo(mountinfo if mountinfo is not None else _read_text(MOUNTINFO))
    cgroups = parse_own_cgroups(own if own is not None else _read_text(OWN_CGROUPS))
    v2: Hierarchy | None = None
    v1: dict[str, Hierarchy] = {}
    for m in mounts:
        point = Path(m["point"])
        if m["fstype"] == "cgroup2" and v2 is None:
            # Its root: enabling controllers in a non-root cgroup that holds processes is refused.
            v2 = Hierarchy(2, "", point, m["root"], point)
        elif m["fstype"] == "cgroup":
            options = set(m["options"].split(","))
            for controller in (*V1_CONTROLLERS, FREEZER):
                if controller in options and controller not in v1:
                    base = _below(point, m["root"], cgroups.get(controller))
                    v1[controller] = Hierarchy(1, controller, point, m["root"], base)
    return v2, v1


def _read_text(path: str | Path) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def _write(path: Path, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _poll(done: Callable[[], bool], timeout_s: float) -> bool:
    """Whether `done()` became true before the deadline (cgroupfs offers no event to wait on in v1)."""
    deadline = time.monotonic() + timeout_s
    pause = POLL_FIRST_S
    while not done():
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(pause, left))
        pause = min(pause * 2, POLL_MAX_S)
    return True


# -- one subject's cgroup ------------------------------------------------------------


class Cgroup:
    """One subject's cgroup, in one (v2) or several (v1: pids, memory, freezer) hierarchies."""

    def __init__(self, dirs: dict[Hierarchy, Path], limits: Limits) -> None:
        self.dirs, self.limits = dirs, limits
        self.version = next(iter(dirs)).version

    def _dir(self, controller: str) -> Path | None:
        return next((d for h, d in self.dirs.items() if h.controller == controller), None)

    @property
    def paths(self) -> list[str]:
        """The directories a process joins (writing to their cgroup.procs)."""
        return [str(d) for d in self.dirs.values()]

    def describe(self) -> str:
        first = next(iter(self.dirs))
        where = first.rel(self.dirs[first])
        if self.version == 2:
            return f"cgroup v2 {where}: {self.limits.describe()}"
        names = ", ".join(h.controller for h in self.dirs)
        return f"cgroup v1 ({names}) {where}: {self.limits.describe()}"

    def procs(self) -> set[int]:
        pids: set[int] = set()
        for d in self.dirs.values():
            pids |= {int(p) for p in _read_text(d / "cgroup.procs").split()}
        return pids

    # -- limits and what the kernel counted ------------------------------------

    def apply_limits(self) -> None:
        if self.version == 2:
            (d,) = self.dirs.values()
            _write(d / "pids.max", str(self.limits.pids_max))
            _write(d / "memory.max", str(self.limits.memory_max))
            # Swap would let a leak run on past the limit instead of meeting the OOM killer.
            with contextlib.suppress(OSError):
                _write(d / "memory.swap.max", "0")
            return
        _write(self._dir("pids") / "pids.max", str(self.limits.pids_max))  # type: ignore[operator]
        memory = self._dir("memory")
        assert memory is not None
        _write(memory / "memory.limit_in_bytes", str(self.limits.memory_max))
        with contextlib.suppress(OSError):  # only with swap accounting; it must not be below the memory limit
            _write(memory / "memory.memsw.limit_in_bytes", str(self.limits.memory_max))

    def hits(self) -> LimitHits:
        if self.version == 2:
            (d,) = self.dirs.values()
            return LimitHits(pids_max=_counter(d / "pids.events", "max"),
                             oom_kills=_counter(d / "memory.events", "oom_kill"))
        pids, memory = self._dir("pids"), self._dir("memory")
        return LimitHits(pids_max=_counter(pids / "pids.events", "max") if pids else 0,
                         oom_kills=_counter(memory / "memory.oom_control", "oom_kill") if memory else 0)

    # -- the sweep -------------------------------------------------------------------

    def kill(self, timeout_s: float = KILL_S) -> set[int]:
        """SIGKILL every process in the cgroup until it is empty (bounded); the pids found in it."""
        deadline = time.monotonic() + timeout_s
        seen: set[int] = set()
        while pids := self.procs():
            if time.monotonic() >= deadline:
                break
            seen |= pids
            if not self._kill_v2():
                with self._frozen(deadline):
                    for pid in self.procs():  # frozen: nobody forks or exits between the read and the kill
                        seen.add(pid)
                        self._sigkill(pid)
            _poll(lambda: not self.procs(), min(FREEZE_S, max(deadline - time.monotonic(), 0)))
        return seen

    def _kill_v2(self) -> bool:
        """cgroup.kill (Linux 5.14+): the kernel kills every member, forks in flight included."""
        if self.version != 2:
            return False
        (d,) = self.dirs.values()
        try:
            _write(d / "cgroup.kill", "1")
        except OSError:
            return False
        return True

    @contextlib.contextmanager
    def _frozen(self, deadline: float) -> Iterator[None]:
        """Freeze the cgroup where a freezer exists, so that a fork loop cannot outrun the kill."""
        if self.version == 2:
            (d,) = self.dirs.values()
            state, freeze, thaw = d / "cgroup.freeze", "1", "0"
            frozen = lambda: "frozen 1" in _read_text(d / "cgroup.events")  # noqa: E731
        else:
            freezer = self._dir(FREEZER)
            if freezer is None:
                yield
                return
            state, freeze, thaw = freezer / "freezer.state", "FROZEN", "THAWED"
            frozen = lambda: _read_text(state).strip() == "FROZEN"  # noqa: E731
        try:
            _write(state, freeze)
        except OSError:
            yield
            return
        try:
            _poll(frozen, min(FREEZE_S, max(deadline - time.monotonic(), 0)))
            yield
        finally:
            # Killed frozen tasks die when thawed.
            with contextlib.suppress(OSError):
                _write(state, thaw)

    def _sigkill(self, pid: int) -> None:
        # Through a pidfd, and only once the pinned process is seen in our cgroup: a pid read
        # from cgroup.procs may have been reused by someone else's process since.
        try:
            fd = os.pidfd_open(pid)
        except OSError:
            return
        try:
            if self._member(pid):
                signal.pidfd_send_signal(fd, signal.SIGKILL)
        except OSError:
            pass
        finally:
            os.close(fd)

    def _member(self, pid: int) -> bool:
        h, d = next(iter(self.dirs.items()))
        own = parse_own_cgroups(_read_text(f"/proc/{pid}/cgroup"))
        return own.get(h.controller) == h.rel(d)

    def remove(self, timeout_s: float = REMOVE_S) -> list[str]:
        """rmdir in every hierarchy (and the run dir once empty); what could not be removed, and why."""
        errors = []
        for d in self.dirs.values():
            why = _rmdir(d, timeout_s)
            if why:
                errors.append(f"{d}: {why}")
        with _lock:
            for d in self.dirs.values():
                with contextlib.suppress(OSError):  # another subject of this run still there
                    d.parent.rmdir()
        return errors


def _counter(path: Path, key: str) -> int:
    for line in _read_text(path).splitlines():
        name, _, value = line.partition(" ")
        if name == key and value.strip().isdigit():
            return int(value)
    return 0


def _rmdir(d: Path, timeout_s: float) -> str | None:
    """None once `d` is gone, else why not."""
    why: list[str] = []

    def settled() -> bool:
        try:
            d.rmdir()
        except FileNotFoundError:
            pass
        except OSError as err:
            why[:] = [err.strerror or str(err)]
            return err.errno != errno.EBUSY  # busy: its last processes are still exiting
        why.clear()
        return True

    _poll(settled, timeout_s)
    return why[0] if why else None


# -- making one ----------------------------------------------------------------------


def _subtree(parent: Path, controllers: tuple[str, ...]) -> None:
    """Enable `controllers` for the children of a v2 cgroup."""
    enabled = _read_text(parent / "cgroup.subtree_control").split()
    wanted = [c for c in controllers if c not in enabled]
    if wanted:
        _write(parent / "cgroup.subtree_control", " ".join(f"+{c}" for c in wanted))


def _mkdirs(h: Hierarchy, run: str, leaf: str) -> Path:
    """base/fakelet/run/leaf, enabling the v2 controllers on the way down; the leaf is new."""
    if not os.access(h.base, os.W_OK):
        raise CgroupUnavailable(f"{h.base} not writable")
    parent = h.base
    for name in (ROOT_NAME, run):
        if h.version == 2:
            _subtree(parent, V2_CONTROLLERS)
        parent = parent / name
        parent.mkdir(exist_ok=True)
    if h.version == 2:
        _subtree(parent, V2_CONTROLLERS)
    leaf_dir = parent / leaf
    leaf_dir.mkdir()
    return leaf_dir


def _create_in(hierarchies: list[Hierarchy], leaf: str, limits: Limits) -> Cgroup:
    dirs: dict[Hierarchy, Path] = {}
    try:
        with _lock:
            for h in hierarchies:
                dirs[h] = _mkdirs(h, owner_tag(), leaf)
        cgroup = Cgroup(dirs, limits)
        cgroup.apply_limits()
        return cgroup
    except (OSError, CgroupUnavailable) as err:
        for d in dirs.values():
            with contextlib.suppress(OSError):
                d.rmdir()
        if isinstance(err, CgroupUnavailable):
            raise
        raise CgroupUnavailable(f"{err.filename or 'cgroupfs'}: {err.strerror or err}") from err


def _v2(h: Hierarchy, leaf: str, limits: Limits) -> Cgroup:
    available = _read_text(h.base / "cgroup.controllers").split()
    missing = [c for c in V2_CONTROLLERS if c not in available]
    if missing:
        raise CgroupUnavailable(f"cgroup v2 at {h.mount} lacks the {' and '.join(missing)} controller"
                                f"{'s' if len(missing) > 1 else ''}")
    return _create_in([h], leaf, limits)


def _v1(hierarchies: dict[str, Hierarchy], leaf: str, limits: Limits) -> Cgroup:
    missing = [c for c in V1_CONTROLLERS if c not in hierarchies]
    if missing:
        raise CgroupUnavailable(f"no cgroup v1 {' or '.join(missing)} hierarchy")
    wanted = [hierarchies[c] for c in (*V1_CONTROLLERS, FREEZER) if c in hierarchies]
    return _create_in(wanted, leaf, limits)


def leaf_name(subject: str) -> str:
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", subject)[:64] or "subject"
    return f"{safe}-{next(_serial)}"


def create(subject: str, limits: Limits | None = None) -> Cgroup:
    """A new cgroup for one start of `subject`: v2, else v1, else CgroupUnavailable saying why."""
    limits = limits or Limits()
    v2, v1 = find_hierarchies()
    if v2 is None and not v1:
        raise CgroupUnavailable("no cgroup file system mounted")
    leaf = leaf_name(subject)
    why = []
    if v2 is not None:
        try:
            return _v2(v2, leaf, limits)
        except CgroupUnavailable as err:
            why.append(str(err))
    if v1:
        try:
            return _v1(v1, leaf, limits)
        except CgroupUnavailable as err:
            why.append(f"cgroup v1: {err}" if why else str(err))
    raise CgroupUnavailable("; ".join(why))


def available(limits: Limits | None = None) -> str | None:
    """None when a subject can get a cgroup here, else why not (one line)."""
    try:
        cgroup = create("probe", limits)
    except CgroupUnavailable as err:
        return str(err)
    cgroup.remove()
    return None


# -- leftovers of dead runs ----------------------------------------------------------------


def _run_dirs() -> dict[tuple[int, str], dict[Hierarchy, Path]]:
    """Every fakelet run dir in every hierarchy, by (version, run-id)."""
    v2, v1 = find_hierarchies()
    found: dict[tuple[int, str], dict[Hierarchy, Path]] = {}
    for h in [*([v2] if v2 else []), *v1.values()]:
        for base in dict.fromkeys([h.base, h.mount]):
            try:
                runs = list((base / ROOT_NAME).iterdir())
            except OSError:
                continue
            for run in runs:
                if run.is_dir() and re.fullmatch(r"\d+-\d+", run.name):
                    found.setdefault((h.version, run.name), {})[h] = run
    return found


def reap_dead() -> list[tuple[Path, int]]:
    """Remove the cgroups of dead owners, killing what they still hold; (run dir, processes killed) removed."""
    removed = []
    for (_, run), dirs in sorted(_run_dirs().items(), key=lambda kv: kv[0]):
        if tag_alive(run) is not False:
            continue
        killed = 0
        leaves = sorted({leaf.name for d in dirs.values() for leaf in d.iterdir() if leaf.is_dir()})
        for leaf in leaves:
            cgroup = Cgroup({h: d / leaf for h, d in dirs.items() if (d / leaf).is_dir()}, Limits())
            killed += len(cgroup.kill())
            cgroup.remove()
        for d in dirs.values():
            with contextlib.suppress(OSError):
                d.rmdir()
            if not d.exists():
                removed.append((d, killed))
    return removed
