"""Inside a fresh private mount namespace: give the plugin a container's view, then run it.

    unshare --mount --propagation private [--pid --fork --kill-child] -- \\
        python -I -S harness/launch/nsexec.py [--bind SRC:DST ...] [--file SRC:DST ...] [--private DIR ...] \\
        [--keep PATH ...] [--shared DIR ...] [--proc] [--init --report-fd N] [--exec PATH] -- PROGRAM ARGS...

- `--private DIR`: an empty, writable tmpfs at DIR (the launcher passes /tmp, /run,
  /var/run/cdi and /etc/cdi, as a container has its own). Symlinks in DIR are
  resolved first, so /var/run on Debian (a symlink to /run) means /run.
- `--bind SRC:DST`: SRC (a sandbox directory) at DST, e.g. over
  /var/lib/kubelet/device-plugins. A DST equal to a private dir replaces it.
- `--file SRC:DST`: the file SRC at DST, read-only, in a directory that otherwise keeps
  what it has (the fake libnvidia-ml.so.1 at /usr/lib/<multiarch>/, where a distribution's
  driver package puts it). When SRC is alone in its directory under DST's name (the NVML
  build cache's layout), DST's directory gets a read-only overlayfs: SRC's directory over
  the original, both layers passed as fds opened before anything is hidden, no upper
  layer, so nothing is written anywhere and it is one mount. Otherwise, or when overlayfs
  is refused (an old kernel in a user namespace), SRC is bound onto an empty file made as
  for `--bind` (a tmpfs copy of the directory whose entries are bound back), then made
  read-only; nsexec says so on stderr.
- `--keep PATH`: PATH stays visible even when a private dir hides it (the plugin
  binary, the interpreter, the sandbox paths the plugin was given): it is bound
  back into place from the original.
- `--shared DIR`: DIR (a private dir or a bind) becomes a shared mount, recursively, once
  everything is in place. The real kubelet wants its root dir shared and, when it is not,
  bind-mounts it onto itself (non-recursively), which would hide the binds under it.
- `--proc`: a fresh procfs at /proc, for a plugin in its own PID namespace.
- `--init`: run PROGRAM under harness/launch/nsinit.py's PID-1 loop instead of exec'ing it.

Nothing is ever created on the host file system: mounts use mount(2) directly
(the `mount` program writes /run/mount/utab), every source is opened before
anything is hidden, and a missing DST or DIR whose parents do not exist is made
on a tmpfs that shadows the deepest existing ancestor and re-exposes that
ancestor's original entries.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

try:
    from harness.launch import nsinit
except ImportError:  # run by path in isolated mode (-I), as the launcher does: the package root is not on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from harness.launch import nsinit

# linux/mount.h (uapi)
MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_NOATIME = 1024
MS_NODIRATIME = 2048
MS_BIND = 4096
MS_RELATIME = 1 << 21
# Flags a bind's read-only remount must repeat: in a user namespace the ones the host set are locked.
LOCKED_FLAGS = MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_NOATIME | MS_NODIRATIME | MS_RELATIME
MS_REC = 16384
MS_PRIVATE = 1 << 18
MS_SHARED = 1 << 20

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]


class NsexecError(SystemExit):
    def __init__(self, message: str) -> None:
        super().__init__(f"nsexec: {message}")


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    def enc(s: str | None) -> bytes | None:
        return None if s is None else os.fsencode(s)
    if _libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data)) != 0:
        err = ctypes.get_errno()
        what = f"tmpfs ({data})" if fstype == "tmpfs" else (fstype or source or "")
        raise NsexecError(f"mount {what} on {target} failed: {os.strerror(err)}")


def fd_path(fd: int, name: str = "") -> str:
    """A path through an open fd: it reaches the original even after something is mounted over it."""
    return f"/proc/self/fd/{fd}" + (f"/{name}" if name else "")


def under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


@dataclass
class Op:
    kind: str  # "private", "bind", "keep" or "file"
    path: str  # where, resolved against the host's view
    source_fd: int | None = None  # bind/keep/file: the original, opened before anything was hidden
    is_dir: bool = True
    layer_fd: int | None = None  # file: SRC's directory, when it can be an overlay layer (SRC alone in it)
    lower_fd: int | None = None  # file: DST's directory as the host has it, when it exists

    @property
    def depth(self) -> int:
        return len(Path(self.path).parts)


class Namespace:
    def __init__(self) -> None:
        self.mounts: list[tuple[str, bool]] = []  # ours, in order: (mount point, is one of our tmpfs)

    def writable(self, path: str) -> bool:
        """Whether making room at `path` writes only to a tmpfs of ours (never through a bind to the host)."""
        # The deepest of our mounts covering it decides (the latest one when two share a mount point).
        covering = [(len(point), n, is_tmpfs) for n, (point, is_tmpfs) in enumerate(self.mounts) if under(path, point)]
        return bool(covering) and max(covering)[2]

    def tmpfs(self, path: str, mode: int) -> None:
        mount("fakelet-private", path, "tmpfs", MS_NOSUID | MS_NODEV, f"mode={mode:o}")
        self.mounts.append((path, True))

    def bind_fd(self, fd: int, name: str, target: str) -> None:
        mount(fd_path(fd, name), target, None, MS_BIND | MS_REC)
        self.mounts.append((target, False))

    def shadow(self, ancestor: str) -> None:
        """Replace `ancestor` with a tmpfs that still shows its original entries."""
        if ancestor == "/":
            raise NsexecError("will not shadow / (a path to create has no existing parent but /)")
        original = os.open(ancestor, os.O_RDONLY | os.O_DIRECTORY)
        entries = list(os.scandir(original))
        self.tmpfs(ancestor, os.stat(original).st_mode & 0o7777)
        for entry in entries:
            target = os.path.join(ancestor, entry.name)
            if entry.is_symlink():
                os.symlink(os.readlink(entry.name, dir_fd=original), target)
                continue
            if entry.is_dir(follow_symlinks=False):
                os.mkdir(target)
            else:
                os.close(os.open(target, os.O_WRONLY | os.O_CREAT, 0o644))
            self.bind_fd(original, entry.name, target)
        # The fd stays open (close-on-exec): the bind mounts hold their sources anyway.

    def make_room(self, path: str, is_dir: bool) -> None:
        """Make `path` exist (a dir, or an empty file to bind a file onto) without writing to the host."""
        if os.path.lexists(path):
            if os.path.isdir(path) != is_dir:
                raise NsexecError(f"{path} exists but is {'not ' if is_dir else ''}a directory")
            return
        ancestor = os.path.dirname(path)
        while not os.path.exists(ancestor):
            ancestor = os.path.dirname(ancestor)
        if not self.writable(ancestor):
            self.shadow(ancestor)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if is_dir:
            os.mkdir(path)
        else:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o644))

    def private(self, path: str) -> None:
        try:
            mode = os.stat(path).st_mode & 0o7777
        except FileNotFoundError:
            mode = 0o755
        self.make_room(path, True)
        self.tmpfs(path, mode)

    def bind(self, op: Op) -> None:
        assert op.source_fd is not None
        self.make_room(op.path, op.is_dir)
        self.bind_fd(op.source_fd, "", op.path)

    def file(self, op: Op) -> None:
        """SRC at DST, read-only: an overlay of DST's directory when possible, else a bind (see --file)."""
        assert op.source_fd is not None
        parent = os.path.dirname(op.path)
        # A directory one of our mounts already covers is not the host's one the lower fd holds.
        if op.layer_fd is not None and op.lower_fd is not None and not any(under(parent, p) for p, _ in self.mounts):
            layers = f"lowerdir={fd_path(op.layer_fd)}:{fd_path(op.lower_fd)}"
            try:
                mount("fakelet-file", parent, "overlay", MS_RDONLY, layers)
                self.mounts.append((parent, False))
                return
            except NsexecError as err:
                print(f"{err}; binding {os.path.basename(op.path)} through a tmpfs copy of {parent} instead",
                      file=sys.stderr)
        self.make_room(op.path, False)
        self.bind_fd(op.source_fd, "", op.path)
        # The plugin must not write through to the host's file: the bind is made read-only.
        locked = os.statvfs(op.path).f_flag & LOCKED_FLAGS
        mount(None, op.path, None, MS_BIND | MS_REMOUNT | MS_RDONLY | locked)


def open_source(path: str) -> int:
    try:
        return os.open(path, os.O_PATH)
    except OSError as err:
        raise NsexecError(f"cannot open {path}: {err.strerror}") from err


def plan_file(src: str, dst: str) -> Op:
    """A --file: SRC opened, and the overlay's two layers when SRC can be one (alone in its dir, DST's name)."""
    real = os.path.realpath(src)
    source = open_source(real)
    if os.path.isdir(fd_path(source)):
        raise NsexecError(f"--file wants a file, and {src} is a directory")
    parent = os.path.realpath(os.path.dirname(dst))
    op = Op("file", os.path.join(parent, os.path.basename(dst)), source, is_dir=False)
    if os.listdir(os.path.dirname(real)) == [os.path.basename(dst)] and os.path.isdir(parent):
        op.layer_fd, op.lower_fd = open_source(os.path.dirname(real)), open_source(parent)
    return op


def plan(binds: Iterable[tuple[str, str]], privates: Iterable[str], keeps: Iterable[str],
         files: Iterable[tuple[str, str]] = ()) -> list[Op]:
    """Every mount to make, parents before children, with every source opened now."""
    bind_ops = {}
    for src, dst in binds:
        fd = open_source(os.path.realpath(src))
        bind_ops[os.path.realpath(dst)] = Op("bind", os.path.realpath(dst), fd, os.path.isdir(fd_path(fd)))
    private_ops = {p: Op("private", p) for p in map(os.path.realpath, privates) if p not in bind_ops}
    hidden = [*bind_ops, *private_ops]
    keep_ops: dict[str, Op] = {}
    for keep in sorted({os.path.realpath(k) for k in keeps if os.path.exists(k)}):
        # Only what a private dir hides needs putting back; a path that contains a
        # hidden dir cannot be put back without un-hiding it, nor can one inside a bind.
        if (not any(under(keep, p) for p in private_ops) or any(under(p, keep) for p in hidden)
                or any(under(keep, b) for b in bind_ops) or any(under(keep, k) for k in keep_ops)):
            continue
        keep_ops[keep] = Op("keep", keep, open_source(keep), os.path.isdir(keep))
    # A file after everything at or above its directory (it sorts one level deeper than it).
    file_ops = [plan_file(src, dst) for src, dst in files]
    return sorted([*bind_ops.values(), *private_ops.values(), *keep_ops.values(), *file_ops], key=lambda op: op.depth)


def setup(binds: Iterable[tuple[str, str]], privates: Iterable[str], keeps: Iterable[str],
          files: Iterable[tuple[str, str]] = ()) -> None:
    # Belt and braces: whatever started us, no mount of ours may propagate to the host.
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    ns = Namespace()
    for op in plan(binds, privates, keeps, files):
        if op.kind == "private":
            ns.private(op.path)
        elif op.kind == "file":
            ns.file(op)
        else:
            ns.bind(op)


def fresh_proc() -> int:
    """Mount a procfs for this PID namespace at /proc; return an fd on the host's procfs (for nsinit)."""
    host = os.open("/proc", os.O_RDONLY | os.O_DIRECTORY)
    try:
        mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    except NsexecError as err:
        # E.g. a user namespace where parts of /proc are masked: the plugin sees the host's /proc.
        print(f"{err} (the plugin sees the host's /proc)", file=sys.stderr)
    return host


def parse_bind(spec: str, option: str = "--bind") -> tuple[str, str]:
    src, sep, dst = spec.partition(":")
    if not sep or not src.startswith("/") or not dst.startswith("/"):
        raise NsexecError(f"{option} wants SRC:DST with absolute paths, not {spec!r}")
    return src, dst


def main(args: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nsexec")
    parser.add_argument("--bind", action="append", default=[], metavar="SRC:DST")
    parser.add_argument("--file", action="append", default=[], metavar="SRC:DST")
    parser.add_argument("--private", action="append", default=[], metavar="DIR")
    parser.add_argument("--keep", action="append", default=[], metavar="PATH")
    parser.add_argument("--shared", action="append", default=[], metavar="DIR")
    parser.add_argument("--proc", action="store_true", help="mount a fresh /proc (in a new PID namespace)")
    parser.add_argument("--init", action="store_true", help="run the program under nsinit as PID 1")
    parser.add_argument("--report-fd", type=int, help="nsinit's report pipe")
    parser.add_argument("--exec", dest="exec_path", help="the program's absolute path (argv[0] stays as given)")
    parser.add_argument("argv", nargs=argparse.REMAINDER)
    ns = parser.parse_args(args)
    argv = ns.argv[1:] if ns.argv[:1] == ["--"] else ns.argv
    if not argv:
        raise NsexecError("no program given")
    binds = [parse_bind(b) for b in ns.bind]
    files = [parse_bind(f, "--file") for f in ns.file]
    # Resolved against the host's view, before anything is hidden.
    cwd = os.path.realpath(os.getcwd())
    setup(binds, ns.private, ns.keep, files)
    for path in ns.shared:
        # Peers only within this namespace: / was made private first, so nothing reaches the host.
        mount(None, os.path.realpath(path), None, MS_REC | MS_SHARED)
    # The same directory as the new view shows it (our own process still sits in the
    # old one, which may be hidden now); / as a container's default when it is gone.
    os.chdir(cwd if os.path.isdir(cwd) else "/")
    proc_fd = fresh_proc() if ns.proc and os.getpid() == 1 else None
    if ns.init:
        return nsinit.serve(argv, ns.exec_path, ns.report_fd, proc_fd)
    try:
        if ns.exec_path:
            os.execv(ns.exec_path, argv)
        os.execvp(argv[0], argv)
    except OSError as err:
        raise NsexecError(f"cannot exec {ns.exec_path or argv[0]}: {err}") from err
    return nsinit.EXEC_FAILED


if __name__ == "__main__":
    sys.exit(main())
