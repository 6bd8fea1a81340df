"""Subject launchers: start an unmodified plugin, watch it, restart it, stop it.

Each launcher is one lifecycle object: configured up front, `start()` returns
self, `stop()` is idempotent, and a failed start cleans up after itself. The
process runs in its own session so that stopping it takes its children too.
Exits land on the timeline the moment they happen.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

from harness.timeline import Timeline

HOST_DEVICE_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"  # deviceplugin v1beta1 constants.go DevicePluginPath
KILL_GRACE_S = 1.0  # teardown: after SIGTERM, how long before SIGKILL (DP-ROB-01 measures exits itself)


def _die_with_parent(cmd: list[str]) -> list[str]:
    """Prefix `setpriv --pdeathsig KILL` so that a hard-killed harness takes the subject down too.

    The subject runs in its own session, so it misses the terminal's Ctrl-C;
    the harness's teardown stops it, and this is the backstop when there is no
    teardown at all (SIGKILL). setpriv execs, so the pid stays the subject's.
    (A preexec_fn would do the same from Python, but forking a threaded
    process and running Python before exec can deadlock or abort.)
    """
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "KILL", "--", *cmd] if setpriv else cmd


class LaunchError(RuntimeError):
    """The subject could not be started at all (bad command, missing privilege)."""


class ProcessLauncher:
    def __init__(self, name: str, argv: Sequence[str], env: dict[str, str], log_path: Path,
                 timeline: Timeline, cwd: Path | None = None) -> None:
        self.name, self.argv, self.env = name, list(argv), dict(env)
        self.log_path, self.timeline, self.cwd = log_path, timeline, cwd
        self.proc: subprocess.Popen[bytes] | None = None
        self._watcher: threading.Thread | None = None
        self.starts = 0

    def command(self) -> list[str]:
        return self.argv

    def start(self) -> ProcessLauncher:
        if self.running:
            return self
        cmd = self.command()
        if shutil.which(cmd[0]) is None and not Path(cmd[0]).is_file():
            raise LaunchError(f"subject {self.name}: command not found: {cmd[0]}")
        log = open(self.log_path, "ab")
        try:
            log.write(f"--- start {self.starts + 1}: {' '.join(cmd)}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(_die_with_parent(cmd), env=self.env, stdout=log,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=self.cwd,
                                         start_new_session=True)
        except OSError as err:
            raise LaunchError(f"subject {self.name}: cannot start {cmd[0]}: {err}") from err
        finally:
            log.close()
        self.starts += 1
        self.timeline.record("process.start", self.name, pid=self.proc.pid, start=self.starts)
        self._watcher = threading.Thread(target=self._watch, args=(self.proc,), daemon=True,
                                         name=f"watch-{self.name}")
        self._watcher.start()
        return self

    def _watch(self, proc: subprocess.Popen[bytes]) -> None:
        code = proc.wait()
        self.timeline.record("process.exit", self.name, pid=proc.pid, returncode=code)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def signal(self, sig: int) -> None:
        if self.running and self.proc is not None:
            self.timeline.record("process.signal", self.name, pid=self.proc.pid, signal=signal.Signals(sig).name)
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                pass

    def wait_exit(self, timeout_s: float) -> int | None:
        if self.proc is None:
            return None
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        """SIGKILL, as a crash would: no cleanup by the subject."""
        self.signal(signal.SIGKILL)
        self.wait_exit(KILL_GRACE_S)
        self._reap_group()

    def stop(self, grace_s: float = KILL_GRACE_S) -> None:
        if self.proc is None:
            return
        if self.running:
            self.signal(signal.SIGTERM)
            if self.wait_exit(grace_s) is None:
                self.signal(signal.SIGKILL)
                self.wait_exit(KILL_GRACE_S)
        self._reap_group()
        if self._watcher is not None:
            self._watcher.join(KILL_GRACE_S)

    def _reap_group(self) -> None:
        # Children the subject left behind in its session go too.
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def restart(self, crash: bool = False) -> None:
        """The plugin-restart fault: stop (or kill) and start again."""
        self.timeline.record("fault.plugin_restart", "harness", subject=self.name, crash=crash)
        if crash:
            self.kill()
        else:
            self.stop()
        self.start()

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def __enter__(self) -> ProcessLauncher:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def namespace_prefix() -> list[str]:
    """How to enter a private mount namespace here, or a clear error why not."""
    unshare = shutil.which("unshare")
    if unshare is None:
        raise LaunchError("mount-namespace launcher: 'unshare' (util-linux) not found")
    if os.geteuid() == 0:
        return [unshare, "--mount", "--propagation", "private"]
    probe = subprocess.run([unshare, "--user", "--map-root-user", "--mount", "true"], capture_output=True)
    if probe.returncode != 0:
        raise LaunchError("mount-namespace launcher needs root or unprivileged user namespaces "
                          f"(unshare --user failed: {probe.stderr.decode().strip()})")
    return [unshare, "--user", "--map-root-user", "--mount", "--propagation", "private"]


class NamespaceLauncher(ProcessLauncher):
    """Runs a plugin that hard-codes /var/lib/kubelet/device-plugins.

    The plugin gets a private mount namespace in which the sandbox's plugin
    directory is bind-mounted over that path (harness/nsexec.py). The host's
    real directory is never created or touched, and the mounts vanish with the
    namespace when the plugin exits.
    """

    def __init__(self, name: str, argv: Sequence[str], env: dict[str, str], log_path: Path,
                 timeline: Timeline, binds: dict[str, str], scratch: Path) -> None:
        super().__init__(name, argv, env, log_path, timeline)
        self.binds, self.scratch = binds, scratch
        self._prefix = namespace_prefix()

    def command(self) -> list[str]:
        bind_args = [a for src, dst in self.binds.items() for a in ("--bind", f"{src}:{dst}")]
        return [*self._prefix, sys.executable, "-m", "harness.nsexec", "--scratch", str(self.scratch),
                *bind_args, "--", *self.argv]
