"""Subject launchers: start an unmodified plugin, watch it, restart it, stop it.

Each launcher is one lifecycle object: configured up front, `start()` returns
self, `stop()` is idempotent, and a failed start cleans up after itself.

The plugin runs in its own PID namespace, as in a container: a small PID-1
helper of ours (harness/launch/nsinit.py) starts the plugin's argv as the *main
process*, adopts every orphan, forwards SIGTERM to the main process and
reports when it exits. Nothing the plugin starts can escape (a wrapper that
forks a `setsid` daemon and exits, children in new sessions): SIGKILL of the
helper makes the kernel kill the whole namespace. Where no PID namespace can
be had, the plugin runs in its own session instead and the timeline says why.

Timeline events (source = the subject's name; `pid` is always the pid the
harness sees for the subject, the outer process):
- `process.start` (pid, start), `process.signal` (pid, signal),
- `process.main_exit` (pid, main_pid, returncode, signalled, detached:
  [{pid, ns_pid, cmd}]) when the main process exits, with the processes it left,
- `process.orphan_exit` (pid, ns_pid, returncode) when a process the main one left
  (a daemon) exits; a wrapper's daemon that served is judged by this one,
- `process.exit` (pid, returncode = the main process's) once nothing of the
  subject is left, so a daemon that keeps serving holds it back,
- `process.containment` (pid_namespace: false, reason) when there is no PID namespace.
"""

from __future__ import annotations

import copy
import fcntl
import functools
import json
import os
import select
import shutil
import signal
import struct
import subprocess
import sys
import termios
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness.instruments.timeline import Timeline
from harness.launch import cgroups
from harness.launch.nsinit import ProcView

HOST_DEVICE_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"  # deviceplugin v1beta1 constants.go DevicePluginPath
KILL_GRACE_S = 1.0  # teardown: after SIGTERM, how long before SIGKILL (DP-ROB-01 measures exits itself)
HELPER_READY_S = 10.0  # a signal waits this long for the PID-1 helper to run (Python start-up on a loaded machine)
THREAD_JOIN_S = 2.0  # the subject is gone: its report and output pipes are at EOF, or about to be
PROBE_S = 10.0  # `unshare ... true`
# Per log file, across the subject's starts (a check that restarts a flooding plugin adds nothing past it):
# a chatty plugin's 200 MB of output is not kept whole.
LOG_CAP_BYTES = 8 * 1024 * 1024
LOG_TAIL_BYTES = 64 * 1024  # the newest output of a start, kept past the cap, and what a tail reads
LOG_TAILS_BYTES = 1024 * 1024  # room past the cap for those: the file stays under the sum, however many starts
# What a container has of its own (kubelet mounts none of these from the host unless a
# pod asks): a plugin writing there must not write into the host.
CONTAINER_PRIVATE_DIRS = ("/tmp", "/run", "/var/run", "/var/run/cdi", "/etc/cdi")
HELPER_DIR = Path(__file__).resolve().parent


def die_with_parent(cmd: list[str], sig: str = "KILL") -> list[str]:
    """Prefix `setpriv --pdeathsig SIGNAL` so that a hard-killed harness takes the subject down too.

    The subject runs in its own session, so it misses the terminal's Ctrl-C;
    the harness's teardown stops it, and this is the backstop when there is no
    teardown at all (SIGKILL). setpriv execs, so the pid stays the subject's.
    (A preexec_fn would do the same from Python, but forking a threaded
    process and running Python before exec can deadlock or abort.)
    TERM instead of KILL lets a child that tears down itself (fakelet's check run) do so.
    """
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", sig, "--", *cmd] if setpriv else cmd


def _helper(script: str) -> list[str]:
    # Isolated (-I -S): only the standard library and its own package, so that nothing on
    # the plugin's PYTHONPATH can shadow it and it works without an installed harness.
    return [sys.executable, "-I", "-S", str(HELPER_DIR / script)]


class LaunchError(RuntimeError):
    """The subject could not be started at all (bad command, missing privilege)."""


@functools.cache
def _probe(flags: tuple[str, ...]) -> str | None:
    """None when `unshare FLAGS true` works here, else why not."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return "'unshare' (util-linux) not found"
    try:
        proc = subprocess.run([unshare, *flags, "--", "true"], capture_output=True, text=True, timeout=PROBE_S)
    except (OSError, subprocess.TimeoutExpired) as err:
        return str(err)
    return None if proc.returncode == 0 else (proc.stderr.strip() or f"exit code {proc.returncode}")


def unshare_prefix(mount: bool, pid: bool) -> list[str]:
    """How to enter new namespaces here (as root, else through a user namespace), or a clear error why not."""
    unshare = shutil.which("unshare")
    if unshare is None:
        raise LaunchError("'unshare' (util-linux) not found")
    flags = ["--mount", "--propagation", "private"] if mount else []
    if pid:
        # --kill-child: when unshare dies, so does the helper, and with it the namespace.
        flags += ["--pid", "--fork", "--kill-child"]
    if os.geteuid() == 0 and _probe(tuple(flags)) is None:
        return [unshare, *flags]
    user = ["--user", "--map-root-user", *flags]
    why = _probe(tuple(user))
    if why is not None:
        raise LaunchError(f"needs root or unprivileged user namespaces (unshare {' '.join(user)} failed: {why})")
    return [unshare, *user]


def namespace_prefix() -> list[str]:
    """How to enter a private mount namespace here, or a clear error why not."""
    try:
        return unshare_prefix(mount=True, pid=False)
    except LaunchError as err:
        raise LaunchError(f"mount-namespace launcher {err}") from err


CONTAINMENT_ENV = "FAKELET_CONTAINMENT"
# Joins every cgroup dir given before `--`, then execs the rest (sh: no Python between fork and exec).
CGROUP_JOIN = 'while [ "$1" != -- ]; do echo $$ > "$1/cgroup.procs" || exit 126; shift; done; shift; exec "$@"'


class _LogPump(threading.Thread):
    """Copies one start's output into the log while the file is under LOG_CAP_BYTES; past that keeps only the
    newest bytes, written at the end while the file has room (LOG_TAILS_BYTES)."""

    def __init__(self, fd: int, path: Path, name: str) -> None:
        super().__init__(daemon=True, name=f"log-{name}")
        self.fd = fd
        self.cut = False
        self.dropped = 0  # bytes past the cap; the newest kept in memory (recent) and, room allowing, at the end
        self.tail_kept = 0
        self._last = b"\n"
        self._recent = bytearray()
        self._lock = threading.Lock()  # one copier at a time: this thread, or a reader asking for a tail
        self._out = open(path, "ab", buffering=0)  # run() closes it when the pipe is done
        self._written = os.fstat(self._out.fileno()).st_size  # earlier starts' output counts: the cap is the file's
        self._closed = False

    def run(self) -> None:
        poller = select.poll()
        poller.register(self.fd, select.POLLIN)
        try:
            while True:
                # Until the subject writes or is gone: as long as it lives, like any reader of its output.
                events = poller.poll()
                with self._lock:
                    # Nothing pending after a wake-up: a tail reader copied it, or the writers are gone.
                    if not self._copy() and any(ev & (select.POLLHUP | select.POLLNVAL) for _, ev in events):
                        break
        finally:
            with self._lock:
                if self.cut:
                    room = max(LOG_CAP_BYTES + LOG_TAILS_BYTES - os.fstat(self._out.fileno()).st_size - 200, 0)
                    tail = bytes(self._recent[-room:]) if room else b""
                    self._out.write(f"[fakelet: {self.dropped} more bytes dropped; the last {len(tail)} follow"
                                    f"{'' if len(tail) == len(self._recent) else ' (the log is full)'}]\n".encode())
                    self._out.write(tail)
                    self.tail_kept = len(tail)
                self._out.close()
                os.close(self.fd)
                self._closed = True

    def _copy(self) -> bool:
        """Copy what the pipe holds now, without blocking; False when it held nothing. Under the lock."""
        pending = struct.unpack("i", fcntl.ioctl(self.fd, termios.FIONREAD, b"\0" * 4))[0]
        if not pending:
            return False
        chunk = os.read(self.fd, pending)
        room = max(LOG_CAP_BYTES - self._written, 0)
        if room:
            self._out.write(chunk[:room])
            self._written += min(room, len(chunk))
            self._last = chunk[:room][-1:] or self._last
        if len(chunk) > room:
            if not self.cut:
                self.cut = True
                self._out.write(b"" if self._last == b"\n" else b"\n")
                self._out.write(f"[fakelet: output cut at {LOG_CAP_BYTES} bytes]\n".encode())
            self.dropped += len(chunk) - room
            self._recent += chunk[room:]
            del self._recent[:-LOG_TAIL_BYTES]
        return True

    def drain(self) -> None:
        """Bring the log up to everything the subject has written so far."""
        with self._lock:
            if not self._closed:
                self._copy()

    def recent(self) -> bytes:
        with self._lock:
            return bytes(self._recent)


class _Run:
    """One start of the subject: its outer process, its helper's reports, its output."""

    def __init__(self, number: int, proc: subprocess.Popen[bytes], pump: _LogPump, log_offset: int,
                 report_fd: int | None) -> None:
        self.number, self.proc, self.pump, self.log_offset = number, proc, pump, log_offset
        self.report_fd = report_fd
        self.contained = report_fd is not None
        self.helper_pid: int | None = None
        self.main_pid: int | None = None
        self.main_exit: dict[str, Any] | None = None
        self.start_mounts: int | None = None  # mounts in the plugin's namespace when it started
        self.returncode: int | None = None
        self.killed = False  # the launcher sent SIGKILL
        self.ready = threading.Event()  # the helper reported in, or never will
        self.done = threading.Event()  # process.exit is on the timeline
        self.threads: list[threading.Thread] = []


class ProcessLauncher:
    def __init__(self, name: str, argv: Sequence[str], env: dict[str, str], log_path: Path,
                 timeline: Timeline, cwd: Path | None = None) -> None:
        self.name, self.argv, self.env = name, list(argv), dict(env)
        self.log_path, self.timeline, self.cwd = log_path, timeline, cwd
        self.starts = 0
        self.main_exits: list[dict[str, Any]] = []  # every start's main-process exit, as the helper reported it
        self._run: _Run | None = None
        self._pumps: list[_LogPump] = []  # every start's, for what the log file did not keep
        self._ns: tuple[list[str], bool] | None = None
        self._no_pid_ns: str | None = None  # why the subject runs without a PID namespace
        self._cgroup: cgroups.Cgroup | None = None  # the current start's
        self.cgroup_note: str | None = None  # what cgroup the subject gets, or why none
        self.limit_hits = cgroups.LimitHits()
        self.limits = cgroups.Limits()

    # -- how to run it ---------------------------------------------------------

    def _namespaces(self) -> tuple[list[str], bool]:
        """(the unshare prefix, whether it brings a PID namespace); without one, the reason is kept.

        A mount namespace too, with nothing hidden or bound: the plugin sees the host's files as
        they are, but a mount it makes (a tmpfs of its own) dies with it instead of staying on the host.
        """
        try:
            prefix = unshare_prefix(mount=True, pid=True)
            # Said to the plugin, so that a test plugin that mounts knows it is safe to (hostile.py).
            self.env[CONTAINMENT_ENV] = "pid,mount"
            return prefix, True
        except LaunchError:
            pass
        try:
            return unshare_prefix(mount=False, pid=True), True
        except LaunchError as err:
            self._no_pid_ns = str(err)
            return [], False

    @property
    def namespaces(self) -> tuple[list[str], bool]:
        if self._ns is None:
            self._ns = self._namespaces()
        return self._ns

    @property
    def contained(self) -> bool:
        """Whether the subject runs in its own PID namespace under the helper."""
        return self.namespaces[1]

    def command(self, program: str | None = None, report_fd: int | None = None) -> list[str]:
        """The full command line: the plugin's argv under the helper in its own PID namespace."""
        prefix, contained = self.namespaces
        if not contained:
            return self.argv
        return [*prefix, "--", *_helper("nsinit.py"), *self._helper_args(program, report_fd), "--", *self.argv]

    @staticmethod
    def _helper_args(program: str | None, report_fd: int | None) -> list[str]:
        args = ["--report-fd", str(report_fd)] if report_fd is not None else []
        return args + (["--exec", program] if program else [])

    def program(self) -> str:
        """The plugin binary's absolute path, looked up as exec would with the plugin's PATH."""
        argv0 = self.argv[0]
        if "/" in argv0:
            candidate = os.path.abspath(os.path.join(self.cwd or os.getcwd(), argv0))
            path = candidate if os.path.isfile(candidate) else None
        else:
            path = shutil.which(argv0, path=self.env.get("PATH", os.defpath))
        if path is None:
            raise LaunchError(f"subject {self.name}: command not found: {argv0}")
        if not os.access(path, os.X_OK):
            raise LaunchError(f"subject {self.name}: cannot start {argv0}: {path} is not executable")
        return path

    # -- lifecycle ---------------------------------------------------------------

    def start(self) -> ProcessLauncher:
        if self.running:
            return self
        program = self.program()
        contained = self.contained
        if not contained and self.starts == 0:
            self.timeline.record("process.containment", self.name, pid_namespace=False,
                                 reason=self._no_pid_ns or "no PID namespace")
        report_r, report_w = os.pipe() if contained else (None, None)
        log_r, log_w = os.pipe()
        try:
            cmd = self._in_cgroup(self.command(program, report_w))
            with open(self.log_path, "ab") as log:
                log.write(f"--- start {self.starts + 1}: {' '.join(self.argv)}\n".encode())
                offset = log.tell()
            try:
                proc = subprocess.Popen(die_with_parent(cmd), env=self.env, stdout=log_w, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, cwd=self.cwd, start_new_session=True,
                                        pass_fds=(report_w,) if report_w is not None else ())
            except OSError as err:
                raise LaunchError(f"subject {self.name}: cannot start {self.argv[0]}: {err}") from err
        except BaseException:
            for fd in (report_r, log_r):
                if fd is not None:
                    os.close(fd)
            self._release_cgroup()
            raise
        finally:
            # Only the subject holds the write ends now: EOF means it is gone.
            for fd in (report_w, log_w):
                if fd is not None:
                    os.close(fd)
        self.starts += 1
        run = _Run(self.starts, proc, _LogPump(log_r, self.log_path, self.name), offset, report_r)
        self._pumps.append(run.pump)
        self._run = run
        self.timeline.record("process.start", self.name, pid=proc.pid, start=self.starts)
        run.threads.append(run.pump)
        if report_r is not None:
            run.threads.append(threading.Thread(target=self._read_reports, args=(run, report_r), daemon=True,
                                                name=f"reports-{self.name}"))
        else:
            run.ready.set()
        run.threads.append(threading.Thread(target=self._watch, args=(run,), daemon=True, name=f"watch-{self.name}"))
        for thread in run.threads:
            thread.start()
        return self

    def _in_cgroup(self, cmd: list[str]) -> list[str]:
        """`cmd` joining a new cgroup of its own before it runs anything, or `cmd` as it is when
        there is no cgroup to be had here (the reason is kept for the report)."""
        try:
            cgroup = cgroups.create(self.name, self.limits)
            cgroup.apply_limits()
        except (cgroups.CgroupUnavailable, OSError) as err:
            self.cgroup_note = f"no cgroup: {err}"
            return cmd
        self._cgroup = cgroup
        self.cgroup_note = cgroup.describe()
        # The shell joins before it execs: nothing the plugin starts can be outside the cgroup.
        return ["/bin/sh", "-c", CGROUP_JOIN, "fakelet-cgroup", *cgroup.paths, "--", *cmd]

    def _release_cgroup(self) -> None:
        """After a start has ended: kill what is left in its cgroup, count the limits hit, remove it."""
        cgroup, self._cgroup = self._cgroup, None
        if cgroup is None:
            return
        left = cgroup.kill()
        if left:
            self.timeline.record("process.cgroup_sweep", self.name, killed=len(left))
        self.limit_hits.add(cgroup.hits())
        cgroup.remove()

    def limits_finding(self) -> list[str]:
        """Findings for the cgroup limits the plugin ran into."""
        out, hits = [], self.limit_hits
        if hits.pids_max:
            out.append(f"the plugin hit the cgroup's pids limit of {self.limits.pids_max} "
                       f"({hits.pids_max} forks refused)")
        if hits.oom_kills:
            out.append(f"the kernel OOM-killed {hits.oom_kills} plugin process(es) at the cgroup's memory limit of "
                       f"{cgroups.format_bytes(self.limits.memory_max)}")
        return out

    def _read_reports(self, run: _Run, fd: int) -> None:
        try:
            with os.fdopen(fd, "rb") as reports:
                for line in reports:
                    try:
                        msg = json.loads(line)
                    except ValueError:
                        continue
                    if msg.get("event") == "start":
                        run.helper_pid, run.main_pid = msg.get("pid"), msg.get("main_pid")
                        run.start_mounts = msg.get("mounts")
                        run.ready.set()
                    elif msg.get("event") == "main_exit":
                        msg["start"], msg["start_mounts"] = run.number, run.start_mounts
                        run.main_exit = msg
                        self.main_exits.append(msg)
                        self.timeline.record("process.main_exit", self.name, pid=run.proc.pid,
                                             main_pid=run.main_pid, returncode=msg.get("returncode"),
                                             signalled=msg.get("signalled", False), detached=msg.get("detached", []),
                                             start=run.number)
                    elif msg.get("event") == "exit":
                        self.timeline.record("process.orphan_exit", self.name, pid=run.proc.pid,
                                             ns_pid=msg.get("ns_pid"), returncode=msg.get("returncode"),
                                             start=run.number)
        finally:
            run.ready.set()

    def _watch(self, run: _Run) -> None:
        code = run.proc.wait()
        if run.contained:
            # The main process's exit and the last output land before the exit does. (Without a
            # PID namespace a leftover child may hold the output open for as long as it lives.)
            for thread in run.threads:
                if thread is not threading.current_thread():
                    thread.join(THREAD_JOIN_S)
        if run.main_exit is not None:
            run.returncode = run.main_exit["returncode"]
        else:
            # The main process died with its namespace: by our SIGKILL (unshare then exits 1), or
            # the helper failed before it ran (its own exit code says why).
            run.returncode = -signal.SIGKILL if run.killed and run.contained else code
        self.timeline.record("process.exit", self.name, pid=run.proc.pid, returncode=run.returncode)
        run.done.set()

    @property
    def running(self) -> bool:
        return self._run is not None and self._run.proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self._run.proc.pid if self._run is not None else None

    @property
    def main_pid(self) -> int | None:
        """The plugin's own process (the main process) as the host sees it, e.g. to read its CPU time."""
        run = self._run
        if run is None:
            return None
        if not run.contained:
            return run.proc.pid
        run.ready.wait(HELPER_READY_S)  # known once the helper has started it
        return run.main_pid

    @property
    def proc(self) -> subprocess.Popen[bytes] | None:
        """The outer process of the current start."""
        return self._run.proc if self._run is not None else None

    def socket_owner(self, name: str) -> dict[str, Any] | None:
        """The subject's process holding the unix socket whose path ends in /`name` (the one that serves it):
        {pid, ns_pid, cmd, main}; None when no live process of this start holds it."""
        run = self._run
        if run is None or not name:
            return None
        inodes = unix_socket_inodes(name)
        procs = ProcView()
        try:
            for pid in [run.proc.pid, *procs.descendants(run.proc.pid)]:
                if pid != run.helper_pid and holds_socket(pid, inodes):
                    return {"pid": pid, "ns_pid": procs.ns_pid(pid), "cmd": procs.cmd(pid),
                            "main": pid == run.main_pid}
        finally:
            os.close(procs.fd)
        return None

    def signal(self, sig: int) -> None:
        """As a runtime signals a container: SIGKILL ends everything, other signals go to the main process."""
        run = self._run
        if run is None or not self.running:
            return
        self.timeline.record("process.signal", self.name, pid=run.proc.pid, signal=signal.Signals(sig).name)
        try:
            if not run.contained:
                os.killpg(run.proc.pid, sig)
                return
            # The helper forwards to the main process; SIGKILL of the helper kills the namespace.
            run.killed = run.killed or sig == signal.SIGKILL
            run.ready.wait(HELPER_READY_S)
            os.kill(run.helper_pid if run.helper_pid is not None else run.proc.pid, sig)
        except ProcessLookupError:
            pass

    def wait_exit(self, timeout_s: float) -> int | None:
        """The main process's exit code once nothing of the subject is left, or None after `timeout_s`."""
        run = self._run
        if run is None:
            return None
        return run.returncode if run.done.wait(timeout_s) else None

    def kill(self) -> None:
        """SIGKILL, as a crash would: no cleanup by the subject."""
        self.signal(signal.SIGKILL)
        self.wait_exit(KILL_GRACE_S)
        self._reap_group()
        self._release_cgroup()

    def stop(self, grace_s: float = KILL_GRACE_S) -> None:
        run = self._run
        if run is None:
            return
        if self.running:
            self.signal(signal.SIGTERM)
            if self.wait_exit(grace_s) is None:
                self.signal(signal.SIGKILL)
                self.wait_exit(KILL_GRACE_S)
        self._reap_group()
        self._release_cgroup()
        for thread in run.threads:
            thread.join(THREAD_JOIN_S)

    def _reap_group(self) -> None:
        # Without a PID namespace, children the subject left behind in its session go too.
        # (With one they died with it, and the group id may be free for reuse.)
        run = self._run
        if run is not None and not run.contained:
            try:
                os.killpg(run.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def twin(self) -> ProcessLauncher:
        """A second instance of the same plugin with a run of its own: the new pod of a DaemonSet rolling update."""
        other = copy.copy(self)
        other.starts, other.main_exits, other._run, other._cgroup = 0, [], None, None
        other.limit_hits = cgroups.LimitHits()
        return other

    def restart(self, crash: bool = False) -> None:
        """The plugin-restart fault: stop (or kill) and start again."""
        self.timeline.record("fault.plugin_restart", "harness", subject=self.name, crash=crash)
        if crash:
            self.kill()
        else:
            self.stop()
        self.start()

    # -- what it left and said ----------------------------------------------------

    def cleanup(self) -> list[str]:
        """What fakelet's containment had to clean up after the plugin, start by start."""
        out = []
        for e in self.main_exits:
            when = f" (start {e['start']})" if self.starts > 1 else ""
            left = e.get("detached") or []
            if left:
                own = sum(1 for p in left if p.get("own_session"))
                sessions = f", {own} of them in sessions of their own" if own else ""
                out.append(f"killed {len(left)} process{'es' if len(left) != 1 else ''} still running when the "
                           f"plugin's main process exited{when}{sessions}, with its PID namespace")
            mounts, before = e.get("mounts"), e.get("start_mounts")
            if isinstance(mounts, int) and isinstance(before, int) and mounts > before:
                out.append(f"dropped {mounts - before} mount{'s' if mounts - before != 1 else ''} the plugin made"
                           f"{when}, with its mount namespace")
        return out

    def detached_finding(self) -> str | None:
        """A finding when a main process exited on its own and left processes running."""
        left = [e for e in self.main_exits if e.get("detached") and not e.get("signalled")]
        if not left:
            return None
        first = left[0]
        procs = first["detached"]
        # Pids as the plugin's namespace numbers them: the same from run to run, unlike the host's.
        shown = ", ".join(f"pid {p.get('ns_pid') or p['pid']} {p['cmd']!r}" for p in procs[:5])
        shown += ", …" if len(procs) > 5 else ""
        again = f" (and after {len(left) - 1} more start{'s' if len(left) > 2 else ''})" if len(left) > 1 else ""
        return (f"the main process exited {first['returncode']} and left {len(procs)} detached "
                f"process{'es' if len(procs) != 1 else ''}: [{shown}]{again}; "
                "in a DaemonSet the container would have ended with its main process")

    @property
    def log_dropped(self) -> int:
        """Bytes of the subject's output, over all its starts, that its log file did not keep."""
        return sum(p.dropped - p.tail_kept for p in self._pumps)

    def log_tail(self, lines: int = 20) -> str:
        """The last lines of the current start's output (stdout and stderr, merged)."""
        run = self._run
        if run is None:
            return ""
        run.pump.drain()
        if run.pump.cut:  # the newest output is in memory: the file may have had no room left for it
            data = run.pump.recent()
        else:
            try:
                with open(self.log_path, "rb") as log:
                    size = log.seek(0, os.SEEK_END)
                    log.seek(max(run.log_offset, size - LOG_TAIL_BYTES))
                    data = log.read()
            except OSError:
                return ""
        return "\n".join(data.decode(errors="replace").splitlines()[-lines:])

    def stderr_tail(self, lines: int = 20) -> str:
        """What a plugin that exits early said last (its stderr is merged into the log)."""
        return self.log_tail(lines)

    def __enter__(self) -> ProcessLauncher:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def kill_working_in(directory: Path, grace_s: float) -> list[int]:
    """SIGKILL every process whose working directory is `directory` or under it, and wait (at most `grace_s`
    each) until they are gone: those a stop signal left unrecorded (it can land after a Popen, before its result
    is kept), which would otherwise go on writing into a directory about to be removed. The pids killed."""
    inside = str(Path(directory).resolve())
    killed = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            pidfd = os.pidfd_open(int(entry.name))  # first: the cwd read next is then this process's
        except OSError:
            continue
        try:
            cwd = os.readlink(f"/proc/{entry.name}/cwd")
            if cwd == inside or cwd.startswith(inside + "/"):
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
                killed.append(int(entry.name))
                select.select([pidfd], [], [], grace_s)  # readable once it has exited
        except OSError:
            pass  # gone meanwhile, or not ours to read
        finally:
            os.close(pidfd)
    return killed


def unix_socket_inodes(name: str) -> set[str]:
    """Inodes of the unix sockets bound at a path ending in /`name` (in this network namespace, the plugin's)."""
    try:
        lines = Path("/proc/net/unix").read_text(errors="replace").splitlines()[1:]
    except OSError:
        return set()
    # Num RefCount Protocol Flags Type St Inode Path
    return {f[6] for f in (line.split() for line in lines) if len(f) >= 8 and f[7].endswith("/" + name)}


def holds_socket(pid: int, inodes: set[str]) -> bool:
    """Whether `pid` has a descriptor open on one of these socket inodes."""
    targets = {f"socket:[{i}]" for i in inodes}
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") in targets:
                return True
        except OSError:
            continue
    return False
