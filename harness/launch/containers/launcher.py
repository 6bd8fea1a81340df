"""The container launcher: a plugin's image run the way its DaemonSet runs it, on testcontainers.

A device plugin's DaemonSet mounts the kubelet's device-plugins directory
(a DRA driver's: plugins_registry, plugins and the CDI directory) as hostPaths
and runs the image's entrypoint. `ContainerLauncher` does the same with a
testcontainers `DockerContainer`: the sandbox's directories bound at the
kubelet's host paths, the sandbox itself at its own path (so that `{dev_dir}`,
`{sysfs_root}` and the fake hardware mean the same inside), host networking (a
DRA driver reaches the local API server on 127.0.0.1, as a hostNetwork pod
would), and the subject's `private_dirs` as tmpfs. Its readiness wait strategy
is the plugin's socket appearing, woken by inotify, bounded, and cut short
when the container exits.

It has the process launcher's lifecycle and events (`process.start`,
`process.signal`, `process.exit` with the container's exit code), so every
check runs unchanged. Faults: `signal` (docker kill), `stop` (SIGTERM, then
SIGKILL after the grace), `kill`, and `restart`, which, as the kubelet does
when a pod's container restarts, starts a new container from the image. The
container's output is kept in the subject log and streamed onto the timeline
(`container.log`, one event a line, up to LOG_EVENT_LINES a start); a
container that exits when nobody asked it to is a finding with its last lines.

Every container carries fakelet's owner label: `stop()` removes it on every
exit path, and the next run's sweep (engine.sweep) removes one whose run was
killed outright.
"""

from __future__ import annotations

import os
import select
import signal
import stat
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inotify_simple import INotify
from inotify_simple import flags as IN
from testcontainers.core.container import DockerContainer
from testcontainers.core.waiting_utils import WaitStrategy

from harness.instruments.timeline import Timeline
from harness.launch import cgroups
from harness.launch.containers import engine
from harness.launch.process import KILL_GRACE_S, LOG_CAP_BYTES, LaunchError

READY_TIMEOUT_S = 30.0  # the reaction bound T: a plugin not serving by then fails registration anyway
WAIT_CHUNK_S = 30  # one `docker wait` request; the watcher renews it until the container exits
LOG_EVENT_LINES = 1000  # container.log events per start; the log file keeps more (LOG_CAP_BYTES)
THREAD_JOIN_S = 5.0
NETWORK_MODE = "host"  # a device-plugin or DRA DaemonSet pod with hostNetwork: loopback reaches the API server


@dataclass
class _Start:
    """One container: what the kubelet would call one container restart."""

    number: int
    container: DockerContainer
    id: str = ""
    pid: int | None = None
    returncode: int | None = None
    oom_killed: bool = False
    asked: bool = False  # fakelet signalled or stopped it: its exit is no finding
    done: threading.Event = field(default_factory=threading.Event)
    exit_r: int = -1  # readable once the container has exited (for the readiness wait)
    exit_w: int = -1
    threads: list[threading.Thread] = field(default_factory=list)


class _SocketAppears(WaitStrategy):
    """Ready once a unix socket is created in one of `dirs`; not ready when the container exits first.

    `arm()` starts watching before the container starts: a plugin serves within milliseconds of
    its start, before a watch set up afterwards would see it. A socket an earlier start left
    does not count: only one created by this start.
    """

    def __init__(self, launcher: ContainerLauncher, dirs: Sequence[Path], timeout_s: float) -> None:
        super().__init__()
        self.launcher, self.dirs = launcher, [Path(d) for d in dirs]
        self.with_startup_timeout(int(timeout_s))
        self.timeout_s = timeout_s
        self._watch: INotify | None = None

    def arm(self) -> None:
        self.disarm()
        self._watch = INotify()
        for d in self.dirs:
            self._watch.add_watch(str(d), IN.CREATE | IN.MOVED_TO)

    def disarm(self) -> None:
        if self._watch is not None:
            self._watch.close()
            self._watch = None

    def wait_until_ready(self, container: Any) -> None:
        run = self.launcher._started(container)
        watch = self._watch
        assert watch is not None, "arm() before the container starts"
        began = time.monotonic()
        try:
            found = self._created(watch)
            while found is None:
                left = self.timeout_s - (time.monotonic() - began)
                if left <= 0:
                    self.launcher._not_ready(run, f"no socket in {', '.join(d.name for d in self.dirs)} "
                                                  f"within {self.timeout_s:g} s")
                    return
                ready, _, _ = select.select([watch.fileno(), run.exit_r], [], [], left)
                if run.exit_r in ready:
                    self.launcher._not_ready(run, f"the container exited with code {run.returncode}")
                    return
                found = self._created(watch)
        finally:
            self.disarm()
        self.launcher.timeline.record("container.ready", self.launcher.name, start=run.number, socket=found,
                                      after_s=round(time.monotonic() - began, 3))

    def _created(self, watch: INotify) -> str | None:
        for event in watch.read(timeout=0):
            for d in self.dirs:
                try:
                    if stat.S_ISSOCK(os.lstat(d / event.name).st_mode):
                        return event.name
                except OSError:
                    continue
        return None


class ContainerLauncher:
    """Runs `image` (with `args` for its entrypoint) as the subject; the process launcher's interface."""

    def __init__(self, name: str, image: str, args: Sequence[str], env: dict[str, str], log_path: Path,
                 timeline: Timeline, *, binds: dict[str, str], read_only: Sequence[str] = (),
                 private_dirs: Sequence[str] = (),
                 privileged: bool = False, ready_dirs: Sequence[Path] = (),
                 ready_timeout_s: float = READY_TIMEOUT_S, files: dict[str, str] | None = None) -> None:
        """`binds`: host path -> path in the container (read-write, as a DaemonSet's hostPath);
        `read_only`: host paths the plugin was given, bound read-only at the same path;
        `files`: host file -> path in the container, read-only (the fake libnvidia-ml.so.1 where the
        NVIDIA container toolkit would inject the host's, /usr/lib/<multiarch>/)."""
        self.name, self.image, self.args, self.env = name, image, list(args), dict(env)
        self.log_path, self.timeline = log_path, timeline
        self.binds, self.private_dirs, self.privileged = dict(binds), list(private_dirs), privileged
        self.read_only = [p for p in dict.fromkeys(read_only) if p not in self.binds]
        self.files = dict(files or {})
        self.ready_dirs, self.ready_timeout_s = list(ready_dirs), ready_timeout_s
        self.starts = 0
        self.limits = cgroups.Limits()
        self.cgroup_note = f"the container's own cgroup (Docker): {self.limits.describe()}"
        self._run: _Start | None = None
        self._runs: list[_Start] = []
        self._log_bytes = 0

    # -- lifecycle ---------------------------------------------------------------

    def _container(self) -> DockerContainer:
        engine.prepare_testcontainers()
        container = DockerContainer(self.image, command=self.args or None, env=self.env,
                                    docker_client_kw={"timeout": int(engine.API_TIMEOUT_S)},
                                    network_mode=NETWORK_MODE, labels=engine.labels(self.name),
                                    pids_limit=self.limits.pids_max, mem_limit=self.limits.memory_max,
                                    privileged=self.privileged)
        for host, inside in self.binds.items():
            container.with_volume_mapping(host, inside, "rw")
        for path in self.read_only:
            container.with_volume_mapping(path, path, "ro")
        for host, inside in self.files.items():
            # A file bind: the engine makes the mount point in the container's own layer, not on the host.
            container.with_volume_mapping(host, inside, "ro")
        for d in self.private_dirs:
            container.with_tmpfs_mount(d)
        return container

    def start(self) -> ContainerLauncher:
        if self.running:
            return self
        ready = _SocketAppears(self, self.ready_dirs, self.ready_timeout_s)
        container = self._container().waiting_for(ready)
        with open(self.log_path, "ab") as log:
            log.write(f"--- start {self.starts + 1}: {self.image} {' '.join(self.args)}\n".encode())
        ready.arm()
        try:
            container.start()
        except Exception as err:
            ready.disarm()
            # The engine refused (no such image, a bad mount): nothing of this start may stay.
            self._remove(container)
            run = self._run
            if run is not None and run.container is container:
                self._finish(run)
            raise LaunchError(f"subject {self.name}: cannot start image {self.image}: {err}") from err
        return self

    def _started(self, container: DockerContainer) -> _Start:
        """Called by the wait strategy once the engine started the container: watch it from now on."""
        wrapped = container.get_wrapped_container()
        wrapped.reload()
        self.starts += 1
        run = _Start(self.starts, container, id=wrapped.id, pid=wrapped.attrs.get("State", {}).get("Pid") or None)
        run.exit_r, run.exit_w = os.pipe()
        self._run = run
        self._runs.append(run)
        # The cap is the log file's, across starts, as the process launcher's.
        self._log_bytes = self.log_path.stat().st_size if self.log_path.exists() else 0
        self.timeline.record("process.start", self.name, pid=run.pid, start=run.number, container=run.id[:12],
                             image=self.image)
        run.threads = [threading.Thread(target=self._follow_logs, args=(run,), daemon=True, name=f"logs-{self.name}"),
                       threading.Thread(target=self._watch, args=(run,), daemon=True, name=f"watch-{self.name}")]
        for thread in run.threads:
            thread.start()
        return run

    def _not_ready(self, run: _Start, why: str) -> None:
        # Not an error of fakelet's: the checks judge a plugin that never serves.
        self.timeline.record("container.not_ready", self.name, start=run.number, reason=why)

    def _watch(self, run: _Start) -> None:
        from docker.errors import DockerException
        from requests.exceptions import ConnectionError as RequestsConnectionError
        from requests.exceptions import ReadTimeout

        wrapped = run.container.get_wrapped_container()
        code: int | None = None
        while code is None:
            try:
                code = int(wrapped.wait(timeout=WAIT_CHUNK_S)["StatusCode"])
            except (ReadTimeout, RequestsConnectionError):
                continue  # still running: ask again
            except DockerException:
                code = -1  # removed under us (a stop): it is gone either way
        try:
            wrapped.reload()
            state = wrapped.attrs.get("State", {})
            run.oom_killed = bool(state.get("OOMKilled"))
        except DockerException:
            pass
        for thread in run.threads:
            if thread is not threading.current_thread():
                thread.join(THREAD_JOIN_S)  # the last output lands before the exit does
        run.returncode = code
        self.timeline.record("process.exit", self.name, pid=run.pid, returncode=code, container=run.id[:12],
                             asked=run.asked)
        os.write(run.exit_w, b"x")
        run.done.set()

    def _follow_logs(self, run: _Start) -> None:
        from docker.errors import DockerException

        lines = 0
        pending = b""
        try:
            stream = run.container.get_wrapped_container().logs(stream=True, follow=True, stdout=True, stderr=True)
            with open(self.log_path, "ab", buffering=0) as log:
                for chunk in stream:
                    room = max(LOG_CAP_BYTES - self._log_bytes, 0)
                    if room:
                        log.write(chunk[:room])
                        self._log_bytes += min(room, len(chunk))
                    pending += chunk
                    *complete, pending = pending.split(b"\n")
                    for line in complete:
                        lines += 1
                        if lines <= LOG_EVENT_LINES:
                            self.timeline.record("container.log", self.name, start=run.number,
                                                 line=line.decode(errors="replace")[:500])
                        elif lines == LOG_EVENT_LINES + 1:
                            self.timeline.record("container.log_cut", self.name, start=run.number,
                                                 after_lines=LOG_EVENT_LINES)
                    pending = pending[-4096:]
        except (DockerException, OSError, ValueError):
            pass  # the container is gone; what it said is in the log

    @property
    def running(self) -> bool:
        return self._run is not None and not self._run.done.is_set()

    @property
    def pid(self) -> int | None:
        return self._run.pid if self._run is not None else None

    @property
    def main_pid(self) -> int | None:
        return self.pid

    @property
    def proc(self) -> None:
        return None  # no process of ours: the engine runs it

    def signal(self, sig: int) -> None:
        run = self._run
        if run is None or not self.running:
            return
        from docker.errors import DockerException

        run.asked = True
        self.timeline.record("process.signal", self.name, pid=run.pid, signal=signal.Signals(sig).name)
        try:
            run.container.get_wrapped_container().kill(signal=signal.Signals(sig).name)
        except DockerException:
            pass  # it exited meanwhile

    def wait_exit(self, timeout_s: float) -> int | None:
        run = self._run
        if run is None:
            return None
        return run.returncode if run.done.wait(timeout_s) else None

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        self.signal(signal.SIGKILL)
        self.wait_exit(KILL_GRACE_S)
        self._finish_current()

    def stop(self, grace_s: float = KILL_GRACE_S) -> None:
        run = self._run
        if run is None:
            return
        if self.running:
            self.signal(signal.SIGTERM)
            if self.wait_exit(grace_s) is None:
                self.signal(signal.SIGKILL)
                self.wait_exit(KILL_GRACE_S)
        self._finish_current()

    def _finish_current(self) -> None:
        run = self._run
        if run is not None:
            self._remove(run.container)
            self._finish(run)

    def _finish(self, run: _Start) -> None:
        run.asked = run.asked or not run.done.is_set()
        for thread in run.threads:
            thread.join(THREAD_JOIN_S)
        for fd in (run.exit_r, run.exit_w):
            if fd >= 0:
                os.close(fd)
        run.exit_r = run.exit_w = -1

    @staticmethod
    def _remove(container: DockerContainer) -> None:
        from docker.errors import DockerException

        try:
            container.stop(force=True)  # remove, whatever state it is in
        except (DockerException, OSError):
            pass

    def restart(self, crash: bool = False) -> None:
        """The plugin-restart fault: as the kubelet restarts a pod's container, a new one from the image."""
        self.timeline.record("fault.plugin_restart", "harness", subject=self.name, crash=crash)
        if crash:
            self.kill()
        else:
            self.stop()
        self.start()

    # -- what it left and said -------------------------------------------------------

    def cleanup(self) -> list[str]:
        return []  # the engine removes what the container made with it

    def detached_finding(self) -> str | None:
        return None  # a container ends with its main process

    def limits_finding(self) -> list[str]:
        killed = sum(1 for r in self._runs if r.oom_killed)
        if not killed:
            return []
        return [f"the kernel OOM-killed the container {killed} time(s) at its memory limit of "
                f"{cgroups.format_bytes(self.limits.memory_max)}"]

    def exit_findings(self) -> list[str]:
        """A container that exited while nobody had asked it to, with its last lines."""
        out = []
        for run in self._runs:
            if run.done.is_set() and not run.asked:
                when = f" (start {run.number})" if self.starts > 1 else ""
                out.append(f"the container exited with code {run.returncode}{when} while fakelet had not stopped it"
                           f"; its last lines: {self.log_tail(5) or '(none)'}")
        return out

    def log_tail(self, lines: int = 20) -> str:
        try:
            with open(self.log_path, "rb") as log:
                size = log.seek(0, os.SEEK_END)
                log.seek(max(0, size - 64 * 1024))
                data = log.read()
        except OSError:
            return ""
        text = data.decode(errors="replace").split("\n--- start ")[-1]
        return "\n".join(text.splitlines()[1:][-lines:])

    def stderr_tail(self, lines: int = 20) -> str:
        return self.log_tail(lines)

    def __enter__(self) -> ContainerLauncher:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
