"""Containment: whatever a plugin starts lives and dies in its PID namespace (harness/launch/process.py, nsinit.py)."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from harness.instruments.filewatch import FileWatch
from harness.instruments.timeline import Event, Timeline
from harness.launch import process as launchers
from harness.launch.process import KILL_GRACE_S, LOG_CAP_BYTES, LaunchError, ProcessLauncher

WAIT_S = 10.0  # generous on 2 busy cores; every wait below returns as soon as its event comes

# A child that idles; "stubborn" ones ignore SIGTERM. It writes one byte to its stdout once it runs: its parent
# waits for that byte, because the exec that Popen waits for ends before the kernel shows the new command line in
# /proc (the close-on-exec pipe closes first), and the tests find the children by their command lines.
# Kept short: the detached-process finding quotes a command line up to a cap, and the marker must show in it.
IDLE = "import os,signal as s,sys;sys.argv[1]=='stubborn'and s.signal(15,s.SIG_IGN);os.write(1,b'.');s.pause()"
# One plugin, several bad habits. Readiness is a file created in its ready dir (watched
# through inotify), so the tests wait on events, never on time.
PLUGIN = f"""#!{sys.executable}
import os, signal, subprocess, sys
mode, marker, ready_dir = sys.argv[1], sys.argv[2], sys.argv[3]
IDLE = [sys.executable, "-c", {IDLE!r}]

def ready():
    path = os.path.join(ready_dir, "ready")
    if os.path.exists(path):
        os.unlink(path)  # a restart's readiness is a new file.created
    open(path, "w").close()

if mode == "daemon":
    # The wrapper-script habit: fork, setsid, exec the daemon, exit 0. The close-on-exec
    # pipe reports the exec, so the daemon has its command line when the wrapper exits.
    # The daemon's stdout is a pipe: its first byte says it runs under its own command line.
    r, w = os.pipe()
    if os.fork() == 0:
        os.close(r)
        os.setsid()
        os.dup2(w, 1)
        os.execv(sys.executable, [*IDLE, "plain", marker + "-daemon"])
    os.close(w)
    os.read(r, 1)
    sys.exit(0)
if mode == "sessions":
    children = [subprocess.Popen([*IDLE, "plain", f"{{marker}}-child-{{n}}"], start_new_session=True,
                                 stdout=subprocess.PIPE) for n in range(int(sys.argv[4]))]
    for child in children:
        child.stdout.read(1)
    ready()
    signal.pause()
if mode == "wrapper-with-children":
    # Leaves argv[4] children in its own session and argv[5] that called setsid, and exits 0.
    children = [subprocess.Popen([*IDLE, "plain", f"{{marker}}-child-{{n}}"], stdout=subprocess.PIPE,
                                 start_new_session=n >= int(sys.argv[4]))
                for n in range(int(sys.argv[4]) + int(sys.argv[5]))]
    for child in children:
        child.stdout.read(1)
    sys.exit(0)
if mode == "stubborn":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    ready()
    signal.pause()
if mode == "leaves-children":
    # Exits 7 on SIGTERM without a thought for its children, which ignore SIGTERM.
    children = [subprocess.Popen([*IDLE, "stubborn", f"{{marker}}-child-{{n}}"], stdout=subprocess.PIPE)
                for n in range(2)]
    for child in children:
        child.stdout.read(1)
    signal.signal(signal.SIGTERM, lambda *_: os._exit(7))
    ready()
    signal.pause()
if mode == "chatty":
    out = os.fdopen(1, "wb")
    line = b"x" * 1023 + b"\\n"
    for _ in range(9 * 1024):  # 9 MiB: past the log's cap
        out.write(line)
    out.flush()
    sys.stderr.write("last words before exit 3\\n")
    sys.exit(3)
if mode == "count":
    path = os.path.join(ready_dir, "..", "count")
    n = int(open(path).read()) + 1 if os.path.exists(path) else 1
    open(path, "w").write(str(n))
    print(f"start number {{n}}", flush=True)
    ready()
    signal.pause()
"""


def marker_pids(marker: str) -> list[int]:
    """Live processes whose command line carries `marker` (zombies have none)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                if marker.encode() in f.read():
                    found.append(int(name))
        except OSError:
            continue
    return found


def wait_gone(pids: list[int], timeout_s: float) -> list[int]:
    """Wait for each process to exit (pidfd); the ones still alive at the deadline."""
    deadline = time.monotonic() + timeout_s
    alive = []
    for pid in pids:
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            continue
        try:
            ready, _, _ = select.select([fd], [], [], max(deadline - time.monotonic(), 0))
            if not ready:
                alive.append(pid)
        finally:
            os.close(fd)
    return alive


class Plugin:
    def __init__(self, tmp_path: Path, mode: str, *extra: str) -> None:
        self.marker = f"fakelet-containment-{uuid.uuid4().hex[:12]}"
        script = tmp_path / "plugin.py"
        script.write_text(PLUGIN)
        script.chmod(0o755)
        self.ready_dir = tmp_path / "ready"
        self.ready_dir.mkdir(exist_ok=True)
        self.timeline = Timeline()
        self.files = FileWatch(self.ready_dir, self.timeline).start()
        self.launcher = ProcessLauncher("plugin", [str(script), mode, self.marker, str(self.ready_dir), *extra],
                                        {"PATH": "/usr/bin:/bin"}, tmp_path / "plugin.log", self.timeline)

    def ready(self, since_ns: int = 0) -> Event:
        return self.timeline.wait_for(lambda e: e.kind == "file.created" and e.get("name") == "ready", WAIT_S,
                                      "the plugin to be ready", since_ns,
                                      abort=lambda e: e.kind == "process.exit" and e.get("pid") == self.launcher.pid)

    def exits(self) -> list[Event]:
        return self.timeline.events(kind="process.exit")

    def close(self) -> None:
        self.launcher.stop()
        self.files.stop()
        # Nothing may outlive a test, whatever it asserted.
        for pid in marker_pids(self.marker):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture
def plugin(tmp_path: Path) -> Iterator[Callable[..., Plugin]]:
    made: list[Plugin] = []

    def make(mode: str, *extra: str) -> Plugin:
        made.append(Plugin(tmp_path, mode, *extra))
        return made[-1]

    yield make
    for p in made:
        p.close()


@pytest.fixture(autouse=True)
def _pid_namespaces() -> None:
    try:
        launchers.unshare_prefix(mount=False, pid=True)
    except LaunchError as err:
        pytest.skip(f"no PID namespace here: {err}")


def test_a_daemonizing_wrapper_is_held_until_its_daemon_is_gone(plugin) -> None:
    p = plugin("daemon")
    p.launcher.start()
    main_exit = p.timeline.wait_for(lambda e: e.kind == "process.main_exit", WAIT_S, "the wrapper to exit")
    assert main_exit.get("returncode") == 0 and main_exit.get("pid") == p.launcher.pid
    detached = main_exit.get("detached")
    assert len(detached) == 1 and detached[0]["cmd"].startswith(f"{sys.executable} -c import os,signal")
    daemons = marker_pids(p.marker + "-daemon")
    assert daemons == [detached[0]["pid"]], "the detached list names the daemon by its host pid"
    # The daemon serves on: the subject has not exited, and the finding says what happened.
    assert p.launcher.running and p.exits() == []
    finding = p.launcher.detached_finding()
    assert finding is not None and finding.startswith("the main process exited 0 and left 1 detached process: [pid ")
    assert p.marker in finding
    assert finding.endswith("in a DaemonSet the container would have ended with its main process")
    # Only when the daemon goes is the subject gone, with the wrapper's exit code.
    os.kill(daemons[0], signal.SIGKILL)
    exit_event = p.timeline.wait_for(lambda e: e.kind == "process.exit", WAIT_S, "the subject's exit")
    assert exit_event.get("pid") == p.launcher.pid and exit_event.get("returncode") == 0
    assert exit_event.t_ns > main_exit.t_ns
    assert p.launcher.wait_exit(WAIT_S) == 0


def test_stop_ends_a_detached_daemon(plugin) -> None:
    p = plugin("daemon")
    p.launcher.start()
    p.timeline.wait_for(lambda e: e.kind == "process.main_exit", WAIT_S, "the wrapper to exit")
    assert marker_pids(p.marker)
    p.launcher.stop()
    assert not p.launcher.running
    assert marker_pids(p.marker) == []
    assert [e.get("returncode") for e in p.exits()] == [0]


def test_children_in_new_sessions_all_go_with_stop(plugin) -> None:
    p = plugin("sessions", "20")
    p.launcher.start()
    p.ready()
    assert len(marker_pids(p.marker + "-child-")) == 20
    p.launcher.stop()
    assert marker_pids(p.marker) == []
    # Stopped by SIGTERM: the main process ended, and the rest with it as in a container.
    main_exit = p.timeline.wait_for(lambda e: e.kind == "process.main_exit", 0, "the main exit")
    assert main_exit.get("returncode") == -signal.SIGTERM and main_exit.get("signalled")
    assert len(main_exit.get("detached")) == 20
    assert p.launcher.detached_finding() is None  # a stopped container's leftovers are no finding


@pytest.mark.parametrize(("same", "own"), [(5, 0), (3, 2)])
def test_the_cleanup_note_counts_only_children_that_left_the_plugins_session(plugin, same: int, own: int) -> None:
    """Defect 4 of issue 39: 50 children, none of which called setsid, were said to be "in sessions of their own"
    (their session, as the host's procfs shows it, was compared with nsinit's as its own namespace shows it)."""
    p = plugin("wrapper-with-children", str(same), str(own))
    p.launcher.start()
    main_exit = p.timeline.wait_for(lambda e: e.kind == "process.main_exit", WAIT_S, "the wrapper to exit")
    assert [d["own_session"] for d in main_exit.get("detached")].count(True) == own
    p.launcher.stop()
    (note,) = p.launcher.cleanup()
    assert note.startswith(f"killed {same + own} processes still running when the plugin's main process exited")
    assert (f", {own} of them in sessions of their own," in note) == bool(own), note


def test_sigkill_of_the_outer_process_kills_everything(plugin) -> None:
    p = plugin("sessions", "5")
    p.launcher.start()
    p.ready()
    pids = marker_pids(p.marker)  # the outer process, the helper, the plugin and its children
    assert len(marker_pids(p.marker + "-child-")) == 5 and p.launcher.pid in pids
    assert p.launcher.main_pid in pids and p.launcher.main_pid != p.launcher.pid
    os.kill(p.launcher.pid, signal.SIGKILL)  # as when the harness itself is killed (pdeathsig)
    assert wait_gone(pids, WAIT_S) == []
    assert p.launcher.wait_exit(WAIT_S) == -signal.SIGKILL
    assert marker_pids(p.marker) == []


def test_kill_is_a_crash_of_everything(plugin) -> None:
    p = plugin("sessions", "3")
    p.launcher.start()
    p.ready()
    p.launcher.kill()
    assert not p.launcher.running and marker_pids(p.marker) == []
    assert [e.get("returncode") for e in p.exits()] == [-signal.SIGKILL]
    assert p.timeline.events(kind="process.main_exit") == []  # no one was left to report it


def test_a_plugin_ignoring_sigterm_is_stopped_within_the_grace(plugin) -> None:
    p = plugin("stubborn")
    p.launcher.start()
    p.ready()
    grace = 0.5
    t0 = time.monotonic()
    p.launcher.stop(grace_s=grace)
    took = time.monotonic() - t0
    assert not p.launcher.running and marker_pids(p.marker) == []
    assert took < grace + KILL_GRACE_S, f"stop took {took:.2f}s"
    assert [e.get("signal") for e in p.timeline.events(kind="process.signal")] == ["SIGTERM", "SIGKILL"]
    assert [e.get("returncode") for e in p.exits()] == [-signal.SIGKILL]


def test_sigterm_reaches_the_main_process_and_its_exit_code_is_the_subjects(plugin) -> None:
    """DP-ROB-01's way: signal(SIGTERM), then wait_exit."""
    p = plugin("leaves-children")
    p.launcher.start()
    p.ready()
    assert len(marker_pids(p.marker + "-child-")) == 2
    p.launcher.signal(signal.SIGTERM)
    assert p.launcher.wait_exit(WAIT_S) == 7
    # Its children ignore SIGTERM; they end with their container's main process.
    assert marker_pids(p.marker) == []
    main_exit = p.timeline.wait_for(lambda e: e.kind == "process.main_exit", 0, "the main exit")
    assert main_exit.get("returncode") == 7 and main_exit.get("signalled")
    assert [e.get("returncode") for e in p.exits()] == [7]


def test_output_is_capped_and_the_tail_is_the_end(plugin) -> None:
    p = plugin("chatty")
    p.launcher.start()
    assert p.launcher.wait_exit(WAIT_S) == 3
    assert p.launcher.stderr_tail(1) == "last words before exit 3"
    log = p.launcher.log_path.read_bytes()
    assert f"[fakelet: output cut at {LOG_CAP_BYTES} bytes]".encode() in log
    assert LOG_CAP_BYTES < len(log) < LOG_CAP_BYTES + 2 * launchers.LOG_TAIL_BYTES
    assert log.rstrip().endswith(b"last words before exit 3")


def test_the_tail_is_the_current_starts(plugin) -> None:
    p = plugin("count")
    p.launcher.start()
    p.ready()
    assert p.launcher.log_tail() == "start number 1"
    since = p.timeline.now()
    p.launcher.restart()
    p.ready(since)
    assert p.launcher.starts == 2
    assert p.launcher.stderr_tail() == "start number 2"
    assert "start number 1" in p.launcher.log_path.read_text()  # the log keeps every start


def test_without_pid_namespaces_it_runs_as_before_and_says_why(plugin, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(mount: bool, pid: bool) -> list[str]:
        raise LaunchError("refused by the test")
    monkeypatch.setattr(launchers, "unshare_prefix", refuse)
    p = plugin("sessions", "2")
    p.launcher.start()
    p.ready()
    assert not p.launcher.contained
    event = p.timeline.wait_for(lambda e: e.kind == "process.containment", 0, "the fallback on the timeline")
    assert event.get("pid_namespace") is False and "refused by the test" in event.get("reason")
    p.launcher.stop()
    assert [e.get("returncode") for e in p.exits()] == [-signal.SIGTERM]
    # Children in sessions of their own escape a process-group kill: that is what the namespace is for.
    for pid in marker_pids(p.marker):
        os.kill(pid, signal.SIGKILL)


def test_a_missing_or_unexecutable_program_is_a_launch_error(tmp_path: Path) -> None:
    timeline = Timeline()
    missing = ProcessLauncher("x", ["no-such-plugin-anywhere"], {"PATH": "/usr/bin:/bin"}, tmp_path / "x.log", timeline)
    with pytest.raises(LaunchError, match="command not found"):
        missing.start()
    script = tmp_path / "not-executable"
    script.write_text("#!/bin/sh\n")
    with pytest.raises(LaunchError, match="not executable"):
        ProcessLauncher("x", [str(script)], {}, tmp_path / "x.log", timeline).start()


def test_kill_working_in_takes_down_what_works_in_a_directory_and_nothing_else(tmp_path: Path) -> None:
    """The local control plane's stop: a server a Ctrl-C left unrecorded still works in the workdir."""
    inside, outside = tmp_path / "workdir", tmp_path / "elsewhere"
    (inside / "etcd-0").mkdir(parents=True)
    outside.mkdir()
    code = "import signal; signal.signal(15, signal.SIG_IGN); print(flush=True); signal.pause()"
    procs = [subprocess.Popen([sys.executable, "-c", code], cwd=cwd, stdout=subprocess.PIPE)
             for cwd in (inside, inside / "etcd-0", outside)]
    try:
        for proc in procs:
            assert proc.stdout is not None and proc.stdout.readline() == b"\n"  # running, its cwd set
        killed = launchers.kill_working_in(inside, 10)
        assert sorted(killed) == sorted(p.pid for p in procs[:2])
        assert [p.poll() for p in procs] == [-signal.SIGKILL, -signal.SIGKILL, None]  # reaped-ready at return
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
