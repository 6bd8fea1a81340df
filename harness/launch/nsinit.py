"""PID 1 of a plugin's own PID namespace: run the plugin, reap, forward signals, report.

    unshare --pid --fork --kill-child -- python -I -S harness/launch/nsinit.py \\
        [--report-fd N] [--exec PATH] -- PROGRAM ARGS...

It starts PROGRAM as its child (the plugin's *main process*, as a container's
entrypoint), adopts and reaps every orphan in the namespace, and forwards the
stop signals it receives to the main process, as a container runtime signals
a container's main process; once the main process is gone, to every process
left. It exits when no process is left in the namespace, with the main
process's exit code (128 + signal when a signal ended it). SIGKILL of this
process makes the kernel kill the whole namespace: that is the launcher's
guarantee at teardown.

On the report fd it writes one JSON line per event, for the launcher:
`{"event": "start", "pid": HOST_PID, "main_pid": HOST_PID, "main_ns_pid": N}` once
the main process runs and signals are handled, and
`{"event": "main_exit", "returncode": RC, "signalled": BOOL, "detached": [...]}`
when the main process exits, listing the processes still alive in the namespace.
`{"event": "exit", "ns_pid": PID, "returncode": RC}` when an adopted orphan exits.

Only the standard library: the launcher runs it isolated (-I -S), so nothing on
the plugin's PYTHONPATH can shadow it and it needs no installed harness.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import signal
import sys
from collections.abc import Sequence
from typing import Any

# Forwarded to the plugin as a runtime would (the kubelet stops a container with SIGTERM).
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
STOPPING = (signal.SIGTERM, signal.SIGINT)
WATCHED = {signal.SIGCHLD, *FORWARDED}
# A safety net only: every SIGCHLD already triggers a reap; this bounds each wait
# so that a lost wake-up (coalesced signals) costs at most this long.
REAP_WAKE_S = 2.0
PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h
CMD_MAX = 200  # characters of a detached process's command line in a report
EXEC_FAILED = 127  # the shell's "command not found/not executable" code


def exit_code(returncode: int) -> int:
    """A Popen-style return code (negative = killed by that signal) as a process exit status."""
    return 128 - returncode if returncode < 0 else returncode


class ProcView:
    """Processes as the host's procfs shows them (it may be a different procfs than /proc)."""

    def __init__(self, proc_fd: int | None = None) -> None:
        self.fd = proc_fd if proc_fd is not None else os.open("/proc", os.O_RDONLY | os.O_DIRECTORY)

    def self_pid(self) -> int:
        return int(os.readlink("self", dir_fd=self.fd))

    def _read(self, name: str) -> bytes:
        fd = os.open(name, os.O_RDONLY, dir_fd=self.fd)
        try:
            return os.read(fd, 65536)
        finally:
            os.close(fd)

    def stat(self, pid: int) -> tuple[str, int] | None:
        """(state, ppid), or None when the process is gone."""
        try:
            raw = self._read(f"{pid}/stat").decode(errors="replace")
        except OSError:
            return None
        fields = raw[raw.rfind(")") + 2:].split()  # comm may contain spaces and parentheses
        return fields[0], int(fields[1])

    def session(self, pid: int) -> int | None:
        try:
            raw = self._read(f"{pid}/stat").decode(errors="replace")
        except OSError:
            return None
        return int(raw[raw.rfind(")") + 2:].split()[3])

    def ns_pid(self, pid: int) -> int | None:
        """The pid in its innermost namespace (the last NSpid entry)."""
        try:
            status = self._read(f"{pid}/status").decode(errors="replace")
        except OSError:
            return None
        for line in status.splitlines():
            if line.startswith("NSpid:"):
                return int(line.split()[-1])
        return None

    def cmd(self, pid: int) -> str:
        try:
            argv = self._read(f"{pid}/cmdline").rstrip(b"\0").replace(b"\0", b" ").decode(errors="replace")
            if not argv:
                argv = "[" + self._read(f"{pid}/comm").decode(errors="replace").strip() + "]"
        except OSError:
            return "?"
        return argv if len(argv) <= CMD_MAX else argv[:CMD_MAX - 1] + "…"

    def descendants(self, root: int) -> list[int]:
        """Live (non-zombie) descendants of `root`, in pid order."""
        children: dict[int, list[int]] = {}
        for name in os.listdir(self.fd):
            if name.isdigit():
                st = self.stat(int(name))
                if st is not None and st[0] != "Z":
                    children.setdefault(st[1], []).append(int(name))
        out, todo = [], [root]
        while todo:
            for child in children.get(todo.pop(), []):
                out.append(child)
                todo.append(child)
        return sorted(out)


class Init:
    def __init__(self, argv: Sequence[str], exec_path: str | None, report_fd: int | None,
                 proc_fd: int | None) -> None:
        self.argv, self.exec_path = list(argv), exec_path or argv[0]
        self.report_fd = report_fd
        self.procs = ProcView(proc_fd)
        self.main: int | None = None  # the main process's pid in this namespace
        self.main_rc: int | None = None
        self.signalled = False  # a stop signal reached the main process while it ran
        self.session: int | None = None  # the session the plugin starts in (this process's), as `procs` shows it

    def report(self, **data: Any) -> None:
        if self.report_fd is None:
            return
        try:
            os.write(self.report_fd, (json.dumps(data) + "\n").encode())
        except OSError:
            self.report_fd = None  # the launcher is gone; the namespace dies with it (pdeathsig)

    def spawn(self) -> int:
        pid = os.fork()
        if pid == 0:
            code = EXEC_FAILED
            try:
                # The plugin starts as from a runtime: default dispositions (Python ignores
                # SIGPIPE and SIGXFSZ, and ignored signals survive exec), nothing blocked.
                for sig in signal.valid_signals():
                    if sig not in (signal.SIGKILL, signal.SIGSTOP):
                        try:
                            signal.signal(sig, signal.SIG_DFL)
                        except (OSError, ValueError):
                            pass
                signal.pthread_sigmask(signal.SIG_SETMASK, set())
                os.execve(self.exec_path, self.argv, os.environ)
            except OSError as err:
                os.write(2, f"nsinit: cannot exec {self.exec_path}: {err}\n".encode())
            finally:
                os._exit(code)
        return pid

    def host_pid_of(self, ns_pid: int, among: list[int]) -> int | None:
        return next((p for p in among if self.procs.ns_pid(p) == ns_pid), None)

    def detached(self) -> list[dict[str, Any]]:
        # Sessions as one procfs shows them: os.getsid() answers in this namespace, the host's procfs in its own.
        return [{"pid": p, "ns_pid": self.procs.ns_pid(p), "cmd": self.procs.cmd(p),
                 "own_session": self.procs.session(p) not in (None, self.session)}
                for p in self.procs.descendants(self.procs.self_pid())]

    def kill_rest(self, sig: int) -> None:
        """`sig` to every process left in the namespace but this one."""
        if os.getpid() == 1:
            try:
                os.kill(-1, sig)  # as PID 1 of a namespace: exactly the namespace's other processes
            except ProcessLookupError:
                pass
            return
        for proc in self.detached():
            if proc["ns_pid"] is not None:
                try:
                    os.kill(proc["ns_pid"], sig)
                except ProcessLookupError:
                    pass

    def on_main_exit(self, returncode: int) -> None:
        self.main_rc = returncode
        left = self.detached()
        self.report(event="main_exit", returncode=returncode, signalled=self.signalled, detached=left,
                    mounts=mount_count())
        if left and self.signalled:
            # The runtime was stopping the container: once its main process is gone the
            # container is gone, whatever it left (the kernel kills a container's PID namespace).
            self.kill_rest(signal.SIGKILL)

    def reap(self) -> bool:
        """Reap every exited child; False once no process is left in the namespace."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return False
            if pid == 0:
                return True
            if pid == self.main:
                self.on_main_exit(os.waitstatus_to_exitcode(status))
            else:
                # An orphan we adopted (a daemon a wrapper left): its exit is the plugin's when it served.
                self.report(event="exit", ns_pid=pid, returncode=os.waitstatus_to_exitcode(status))

    def forward(self, sig: int) -> None:
        if self.main_rc is None and self.main is not None:
            if sig in STOPPING:
                self.signalled = True
            try:
                os.kill(self.main, sig)
                return
            except ProcessLookupError:
                pass  # exited, not reaped yet: the rest get it
        self.kill_rest(sig)

    def run(self) -> int:
        for sig in WATCHED:
            # PID 1 of a namespace receives only signals it handles; blocked ones queue
            # for sigtimedwait below, so the handler itself never runs.
            signal.signal(sig, _ignore)
        signal.pthread_sigmask(signal.SIG_BLOCK, WATCHED)
        try:
            os.setsid()  # out of the launcher's process group: only the launcher's own signals reach us
        except OSError:
            pass
        self.session = self.procs.session(self.procs.self_pid())
        if os.getpid() != 1:
            # Run outside a PID namespace (by hand): adopt orphans anyway, so that "no
            # process left" still means every descendant.
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        if self.report_fd is not None:
            os.set_inheritable(self.report_fd, False)  # the plugin must not hold the report pipe open
        self.main = self.spawn()
        me = self.procs.self_pid()
        self.report(event="start", pid=me, main_ns_pid=self.main, mounts=mount_count(),
                    main_pid=self.host_pid_of(self.main, self.procs.descendants(me)))
        while self.reap():
            info = signal.sigtimedwait(WATCHED, REAP_WAKE_S)
            if info is not None and info.si_signo != signal.SIGCHLD:
                self.forward(info.si_signo)
        return exit_code(self.main_rc if self.main_rc is not None else EXEC_FAILED)


def mount_count() -> int | None:
    """Mounts in this (the plugin's) mount namespace: what it adds, it made."""
    try:
        with open("/proc/self/mountinfo", "rb") as info:
            return sum(1 for _ in info)
    except OSError:
        return None


def _ignore(signum: int, frame: object) -> None:
    pass


def serve(argv: Sequence[str], exec_path: str | None = None, report_fd: int | None = None,
          proc_fd: int | None = None) -> int:
    """Run `argv` as this namespace's main process until the namespace is empty; the exit status."""
    return Init(argv, exec_path, report_fd, proc_fd).run()


def parse(args: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="nsinit")
    parser.add_argument("--report-fd", type=int, help="write JSON lines about the main process here")
    parser.add_argument("--exec", dest="exec_path", help="the program's absolute path (argv[0] stays as given)")
    parser.add_argument("argv", nargs=argparse.REMAINDER)
    ns = parser.parse_args(args)
    ns.argv = ns.argv[1:] if ns.argv[:1] == ["--"] else ns.argv
    if not ns.argv:
        parser.error("no program given")
    return ns


def main(args: Sequence[str] | None = None) -> int:
    ns = parse(args)
    return serve(ns.argv, ns.exec_path, ns.report_fd)


if __name__ == "__main__":
    sys.exit(main())
