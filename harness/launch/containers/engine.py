"""The Docker engine the container launcher talks to: the user's, or a private one for tests and CI.

fakelet never pulls through a registry of its own choosing and never touches a
daemon it did not ask for: `fakelet run --image` uses the engine that
DOCKER_HOST names (else the client's default socket) and says in one line when
none answers. CI and the harness's own tests start a *private* engine
(`PrivateEngine`): Debian's dockerd with the vfs storage driver, iptables and
the default bridge off, and a data root in a temp dir of its own, in a private
mount and PID namespace, so that everything it mounted or started dies with it.

Every container fakelet starts carries OWNER_LABEL (its run's owner tag, as
harness/launch/owners.py makes it); `sweep()` removes those whose owner is dead, so a
run killed outright (SIGKILL) leaves nothing once the next run starts.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from inotify_simple import INotify
from inotify_simple import flags as IN

from harness.instruments.doctor import machine_lacks
from harness.launch.owners import PREFIX, claim, owner_tag, tag_alive

if TYPE_CHECKING:
    import docker

DOCKER_HOST_ENV = "DOCKER_HOST"
DEFAULT_HOST = "unix:///var/run/docker.sock"  # docker/docker client DefaultDockerHost
PING_TIMEOUT_S = 5.0  # an engine that answers at all answers _ping at once
API_TIMEOUT_S = 60.0  # one engine call (create, start, stop with its grace); image pulls included
ENGINE_READY_S = 60.0  # dockerd start to its socket answering: about 1 s here
ENGINE_STOP_S = 10.0
LISTEN_RETRY_S = 0.05  # between connects while dockerd's socket exists but is not yet listened on
OWNER_LABEL = "fakelet.owner"  # the run that owns a container: owners.owner_tag()
SUBJECT_LABEL = "fakelet.subject"
# testcontainers starts its reaper (Ryuk) from an image on Docker Hub; fakelet has its own
# sweep (labels), and a registry may not be reachable.
RYUK_DISABLED_ENV = "TESTCONTAINERS_RYUK_DISABLED"


class EngineUnavailable(RuntimeError):
    """No Docker engine answers; the message says where fakelet looked and how to get one."""


def host() -> str:
    return os.environ.get(DOCKER_HOST_ENV) or DEFAULT_HOST


def _socket_path(address: str) -> Path | None:
    return Path(address[len("unix://"):]) if address.startswith("unix://") else None


def client(timeout_s: float = API_TIMEOUT_S) -> docker.DockerClient:
    """A docker-py client on `host()`; EngineUnavailable when nothing answers there."""
    address = host()
    sock = _socket_path(address)
    if sock is not None and not sock.exists():
        raise EngineUnavailable(machine_lacks(f"no Docker engine at {address} (no such socket); start dockerd "
                                              f"(Debian: apt-get install docker.io) or set {DOCKER_HOST_ENV}"))
    import docker
    from docker.errors import DockerException

    try:
        found = docker.DockerClient(base_url=address, timeout=int(timeout_s))
        found.ping()
    except (DockerException, OSError) as err:
        raise EngineUnavailable(machine_lacks(f"the Docker engine at {address} does not answer: {err}")) from None
    return found


def unavailable() -> str | None:
    """Why no Docker engine can be used here, in one line, or None."""
    try:
        client(PING_TIMEOUT_S).close()
    except EngineUnavailable as err:
        return str(err)
    except ImportError as err:
        return machine_lacks(f"the docker Python package is missing ({err})")
    return None


def prepare_testcontainers() -> None:
    """testcontainers' settings for fakelet: no Ryuk (the sweep stands in), the engine at `host()`."""
    os.environ.setdefault(RYUK_DISABLED_ENV, "true")
    os.environ.setdefault(DOCKER_HOST_ENV, host())


def labels(subject: str) -> dict[str, str]:
    return {OWNER_LABEL: owner_tag(), SUBJECT_LABEL: subject}


def sweep(found: docker.DockerClient | None = None) -> list[str]:
    """Remove fakelet's containers whose owning run is dead; their names. Nothing when no engine answers."""
    try:
        engine = found or client(PING_TIMEOUT_S)
    except (EngineUnavailable, ImportError):
        return []
    from docker.errors import DockerException

    removed = []
    try:
        for container in engine.containers.list(all=True, filters={"label": OWNER_LABEL}):
            if tag_alive(container.labels.get(OWNER_LABEL, "")) is False:
                container.remove(force=True)
                removed.append(container.name)
    except DockerException:
        pass  # best effort: the next run sweeps again
    finally:
        if found is None:
            engine.close()
    return removed


class PrivateEngine:
    """Debian's dockerd for tests and CI, in a temp dir and namespaces of its own.

    `start()` returns once the engine answers and sets DOCKER_HOST for this process
    (and so for the runs it starts); `stop()` kills its PID namespace (containers,
    containerd and shims with it) and removes the directory.
    """

    def __init__(self) -> None:
        self.dir: Path | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self._previous_host: str | None = None

    @staticmethod
    def unavailable() -> str | None:
        """Why no private engine can start here, in one line, or None."""
        if os.geteuid() != 0:
            return "a private Docker engine needs root"
        for tool, package in (("dockerd", "docker.io"), ("unshare", "util-linux")):
            if shutil.which(tool) is None:
                return f"{tool} not found (Debian package {package})"
        return None

    @property
    def host(self) -> str:
        assert self.dir is not None
        return f"unix://{self.dir / 'docker.sock'}"

    def start(self) -> PrivateEngine:
        why = self.unavailable()
        if why is not None:
            raise EngineUnavailable(why)
        self.dir = Path(tempfile.mkdtemp(prefix=f"{PREFIX}dockerd-"))
        claim(self.dir)
        sock = self.dir / "docker.sock"
        dockerd = ["dockerd", "--host", f"unix://{sock}", "--data-root", str(self.dir / "data"),
                   "--exec-root", str(self.dir / "exec"), "--pidfile", str(self.dir / "docker.pid"),
                   "--storage-driver", "vfs", "--iptables=false", "--ip6tables=false", "--bridge=none"]
        # A private /run (so /var/run): containerd's shims put their sockets in /run/containerd/s
        # whatever its state dir, and the host's /run must not see them.
        cmd = ["unshare", "--mount", "--propagation", "private", "--pid", "--fork", "--kill-child", "--mount-proc",
               "--", "/bin/sh", "-c", 'mount -t tmpfs -o mode=0755 fakelet-dockerd-run /run && exec "$@"', "sh",
               *dockerd]
        setpriv = shutil.which("setpriv")
        if setpriv:
            cmd = [setpriv, "--pdeathsig", "KILL", "--", *cmd]  # dies with us, even on SIGKILL
        with INotify() as watch:
            watch.add_watch(str(self.dir), IN.CREATE)
            with open(self.dir / "dockerd.log", "wb") as log:
                self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                             start_new_session=True)
            try:
                self._wait_socket(watch, sock)
            except BaseException:
                self.stop()
                raise
        self._previous_host = os.environ.get(DOCKER_HOST_ENV)
        os.environ[DOCKER_HOST_ENV] = self.host
        return self

    def _wait_socket(self, watch: INotify, sock: Path) -> None:
        assert self.proc is not None and self.dir is not None
        deadline = time.monotonic() + ENGINE_READY_S
        while not sock.exists():
            left = deadline - time.monotonic()
            if self.proc.poll() is not None or left <= 0:
                tail = (self.dir / "dockerd.log").read_text(errors="replace").strip().splitlines()[-3:]
                how = "exited" if self.proc.poll() is not None else f"no socket within {ENGINE_READY_S:g} s"
                raise EngineUnavailable(f"dockerd did not start ({how}): {' | '.join(tail)}")
            # Woken by the socket's creation; the bound only lets a dead dockerd be noticed.
            watch.read(timeout=int(min(left, 1.0) * 1000))
        import docker
        from docker.errors import DockerException

        # dockerd creates its socket a moment before it listens on it: connect until it answers, bounded.
        while True:
            try:
                probe = docker.DockerClient(base_url=f"unix://{sock}", timeout=int(PING_TIMEOUT_S))
                try:
                    probe.ping()
                    return
                finally:
                    probe.close()
            except DockerException as err:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise EngineUnavailable(f"dockerd made {sock} but does not answer on it: {err}") from None
                time.sleep(LISTEN_RETRY_S)  # no event marks listen(); the deadline bounds this

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            # unshare --kill-child: its death SIGKILLs dockerd, the PID namespace's init, and so everything in it.
            os.killpg(proc.pid, signal.SIGKILL)
            try:
                proc.wait(ENGINE_STOP_S)
            except subprocess.TimeoutExpired:
                pass
        if self._previous_host is None:
            os.environ.pop(DOCKER_HOST_ENV, None)
        else:
            os.environ[DOCKER_HOST_ENV] = self._previous_host
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None

    def __enter__(self) -> PrivateEngine:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
