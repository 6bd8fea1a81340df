"""A private mount and PID namespace for a real node's kubelet and container runtime.

    unshare --mount --propagation private --pid --fork --kill-child -- \\
        nsexec.py --private ... --bind ... --shared /var/lib/kubelet --proc --init -- sleep

Its PID 1 (harness/launch/nsinit.py) keeps it alive and reaps. Daemons enter it with
`nsenter --mount --pid`, so the runtime's shims and the containers' processes
all live inside: when the namespace's PID 1 dies, the kernel kills every one
of them, whatever happened to the harness (unshare runs under pdeathsig, and
--kill-child takes PID 1 down with it).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

from harness.launch.process import _helper, die_with_parent, unshare_prefix

READY_TIMEOUT_S = 10.0  # nsinit reports in once the mounts are made (milliseconds here)
CHILD_TIMEOUT_S = 5.0  # nsenter forks its child at once; this bounds finding it
CHILD_POLL_S = 0.005
STOP_GRACE_S = 10.0  # SIGTERM, then SIGKILL


class NamespaceError(RuntimeError):
    """The namespace or a process in it could not be started."""


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except (OSError, ValueError):
        return []


def _pump(stream: IO[bytes], log: Path, on_line: Callable[[str], None]) -> None:
    """Copy a daemon's output to its log, line by line, handing each line on; ends at EOF (its exit)."""
    with stream, open(log, "ab") as out:
        for raw in stream:
            out.write(raw)
            out.flush()
            on_line(raw.decode(errors="replace").rstrip("\n"))


class Daemon:
    """A process started inside the namespace: `pid` is its host PID (nsenter's child)."""

    def __init__(self, name: str, outer: subprocess.Popen[bytes], pid: int, log: Path) -> None:
        self.name, self.outer, self.pid, self.log = name, outer, pid, log

    @property
    def running(self) -> bool:
        return self.outer.poll() is None

    def send(self, sig: int) -> None:
        try:
            os.kill(self.pid, sig)
        except ProcessLookupError:
            pass

    def wait(self, timeout_s: float) -> int | None:
        """nsenter waits for its child and exits with its status."""
        try:
            return self.outer.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, sig: int = signal.SIGTERM, grace_s: float = STOP_GRACE_S) -> int | None:
        if not self.running:
            return self.outer.returncode
        self.send(sig)
        code = self.wait(grace_s)
        if code is None:
            self.send(signal.SIGKILL)
            code = self.wait(grace_s)
        return code


class NodeNamespace:
    def __init__(self, binds: dict[str, str], private: list[str], shared: list[str], log: Path,
                 keep: list[str] | None = None) -> None:
        """`keep`: paths that stay visible under a private dir (the sandbox under a private /tmp)."""
        self.binds, self.private, self.shared, self.log = binds, private, shared, log
        self.keep = list(keep or [])
        self.holder: subprocess.Popen[bytes] | None = None
        self.init_pid: int | None = None

    def start(self) -> NodeNamespace:
        nsenter = shutil.which("nsenter")
        if nsenter is None:
            raise NamespaceError("'nsenter' (util-linux) not found")
        self.nsenter = nsenter
        args = [f"--bind={src}:{dst}" for src, dst in self.binds.items()]
        args += [f"--private={p}" for p in self.private] + [f"--shared={p}" for p in self.shared]
        args += [f"--keep={p}" for p in self.keep]
        report_r, report_w = os.pipe()
        sleep = shutil.which("sleep") or "/bin/sleep"
        cmd = [*unshare_prefix(mount=True, pid=True), "--", *_helper("nsexec.py"), *args, "--proc", "--init",
               "--report-fd", str(report_w), "--", sleep, "infinity"]
        with open(self.log, "ab") as out:
            self.holder = subprocess.Popen(die_with_parent(cmd), stdout=out, stderr=subprocess.STDOUT,
                                           stdin=subprocess.DEVNULL, start_new_session=True, pass_fds=(report_w,))
        os.close(report_w)
        with os.fdopen(report_r, "rb") as reports:
            # The first line is nsinit's start report; EOF (no line) means it failed.
            line = reports.readline()
        try:
            self.init_pid = int(json.loads(line)["pid"])
        except (ValueError, KeyError, TypeError):
            self.stop()
            tail = self.log.read_text(errors='replace')[-500:]
            raise NamespaceError(f"the node's namespace did not start: {tail}") from None
        return self

    def enter(self, name: str, argv: list[str], log: Path, on_line: Callable[[str], None] | None = None) -> Daemon:
        """Start `argv` inside the namespace, its output appended to `log` (and each line to `on_line`)."""
        assert self.init_pid is not None
        cmd = [self.nsenter, f"--target={self.init_pid}", "--mount", "--pid", "--", *argv]
        with open(log, "ab") as out:
            out.write(f"--- {' '.join(argv)}\n".encode())
            out.flush()
            outer = subprocess.Popen(cmd, stdout=out if on_line is None else subprocess.PIPE,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        if on_line is not None:
            assert outer.stdout is not None
            threading.Thread(target=_pump, args=(outer.stdout, log, on_line), daemon=True,
                             name=f"realnode-log-{name}").start()
        deadline = time.monotonic() + CHILD_TIMEOUT_S
        while True:
            children = _children(outer.pid)
            if children:
                return Daemon(name, outer, children[0], log)
            if outer.poll() is not None or time.monotonic() > deadline:
                outer.kill()
                raise NamespaceError(f"{name} did not start in the node's namespace (nsenter exit "
                                     f"{outer.poll()}): {log.read_text(errors='replace')[-300:]}")
            time.sleep(CHILD_POLL_S)

    def run(self, argv: list[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
        """Run a short command inside the namespace and return its output."""
        assert self.init_pid is not None
        return subprocess.run([self.nsenter, f"--target={self.init_pid}", "--mount", "--pid", "--", *argv],
                              capture_output=True, text=True, timeout=timeout_s)

    def stop(self) -> None:
        """Kill the namespace's PID 1: the kernel kills everything left inside."""
        holder, self.holder = self.holder, None
        if holder is None:
            return
        if self.init_pid is not None:
            try:
                os.kill(self.init_pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            # unshare reaps its child (the namespace's PID 1, which the kernel lets go only once
            # everything inside is gone) and exits: killing it first would orphan that zombie.
            holder.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            holder.kill()
            holder.wait(STOP_GRACE_S)
