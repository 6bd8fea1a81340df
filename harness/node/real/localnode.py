"""LocalNode: the Node interface on a real kubelet, against the local control plane's API server.

The kubelet (built from fixtures/go/kubernetes, like kube-apiserver) and containerd 2 (built
from fixtures/go/containerd, runtime.py; Debian's containerd 1.6 where it cannot be built) run
in a namespace of their own (namespace.py) where:

- /var/lib/kubelet, /var/lib/containerd, /run/containerd and /var/log/{pods,containers}
  are private tmpfs mounts, so the host's are never touched;
- the kubelet's device-plugins directory is one of its own, bound at
  /var/lib/kubelet/device-plugins, and the relay (harness/node/relay/dp.py) keeps it
  and the plugin's (the sandbox's) as one: the kubelet's own socket deletion on start
  is the real one and reaches the plugin, and every call on the wire is recorded;
- the kubelet's plugins_registry and plugins dirs are its own too, bound at
  /var/lib/kubelet/...; the DRA relay (harness/node/relay/dra.py) mirrors the driver's
  registration sockets (the sandbox's) into the kubelet's registry and gives the kubelet
  an endpoint of its own in its plugins dir, so every DRA call is recorded; the CDI dir
  stays shared (the driver writes, the runtime reads);
- the kubelet's PodResources socket is bound out to the sandbox, for the harness.

`LocalShell` is that node's shell (cluster.py's `NodeShell`): local processes in
the namespace, the runtime read with `ctr`. Everything a check reads goes
through the API server, as for any real node (cluster.py's `ClusterNode`).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inotify_simple import INotify
from inotify_simple import flags as IN

from harness.controlplane.base import ControlPlaneUnavailable
from harness.controlplane.client import KubeClient
from harness.controlplane.local import _free_port as free_port
from harness.controlplane.local import find_kube_binary
from harness.instruments import inotify_budget
from harness.instruments.doctor import machine_lacks
from harness.instruments.faults import FaultPlan
from harness.instruments.progress import Progress
from harness.instruments.timeline import Timeline
from harness.launch.owners import owner_tag
from harness.launch.sandbox import Sandbox
from harness.node.real import configs, image, runtime
from harness.node.real.cgroups import CGROUP_PREFIX, make_cgroups, reap_cgroups, remove_cgroups
from harness.node.real.cluster import NAMESPACE, ClusterNode, NotOnRealKubelet
from harness.node.real.namespace import Daemon, NamespaceError, NodeNamespace
from harness.node.real.releases import ReleaseUnavailable, module_for
from harness.node.real.view import ContainerView
from harness.node.relay.dp import DevicePluginRelay
from harness.node.relay.dra import DRARelay
from harness.spec.profiles import Profile

__all__ = ["NAMESPACE", "LocalNode", "LocalShell", "NodeAccess", "NotOnRealKubelet", "RealNodeUnavailable",
           "find_kubelet", "unavailable"]

KUBELET_PACKAGE = "k8s.io/kubernetes/cmd/kubelet"
HOST_KUBELET_ROOT = "/var/lib/kubelet"  # kubelet --root-dir default; device-plugins under it is fixed
# Where the node's runtime reads CDI specs (the sandbox's CDI dir, bound there): container-device-interface's
# DefaultDynamicDir, one of containerd's default cdi_spec_dirs.
NODE_CDI_DIR = "/var/run/cdi"
# /tmp too: the runtime creates a bind mount's missing source directory (a plugin's Allocate answer
# naming /tmp/<device> in its own private /tmp, as the upstream sample plugin's does) in the node's.
PRIVATE_DIRS = ["/var/lib/kubelet", "/var/lib/containerd", "/run/containerd", "/var/log/pods",
                "/var/log/containers", "/tmp"]
RELAY_MIRROR_TIMEOUT_S = 5.0  # the kubelet's new kubelet.sock to appear in the plugin's directory (ms here)
RUNTIME_READY_TIMEOUT_S = 30.0  # containerd to answer `ctr version` (about 1 s here)
CTR_TIMEOUT_S = 30.0  # one ctr call (an image import included)
KUBELET_STOP_GRACE_S = 10.0
KUBELET_READY_TIMEOUT_S = 60.0  # start to kubelet.sock: about 0.8 s here
IMPORT_QUIET_S = 5.0  # the pods' image is a few MB: imported in well under a second on an idle machine
EXIT_CHECK_S = 0.5  # while waiting for kubelet.sock, how often to see whether the kubelet died instead
# Lines of the kubelet's log (at --v 3) that say what the fake kubelet records as events:
LOG_EVENTS = (
    # cm/devicemanager/plugin/v1beta1/server.go Register()
    (re.compile(r'"Got registration request from device plugin with resource" resourceName="(?P<resource>[^"]+)"'),
     "kubelet.register_received"),
    # cm/devicemanager/plugin/v1beta1/handler.go connectClient (V(2)): the kubelet dialed the plugin and
    # called GetDevicePluginOptions, so the registration is accepted
    (re.compile(r'"Connected to new client" resource="(?P<resource>[^"]+)"'), "kubelet.connected"),
    # cm/devicemanager/manager.go Start(): the checkpoint did not read back (DP-ROB-02)
    (re.compile(r'"Continue after failing to read checkpoint file[^"]*"(?P<error>.*)'),
     "kubelet.checkpoint_unreadable"),
    # The registrations themselves are on the DRA relay's record (harness/node/relay/dra.py); what the
    # wire does not show, the kubelet's log says. cm/dra/plugin/dra_plugin_manager.go HandleConn (V(2)):
    # its one gRPC connection to a driver came up or went down.
    (re.compile(r'"Connection changed".*driverName="(?P<driver>[^"]+)".*endpoint="(?P<endpoint>[^"]*)"'
                r'.*connected=(?P<connected>true|false)'), "dra.connection"),
    # dra_plugin_manager.go remove() (V(3)): the plugin watcher deregistered the driver (its socket went away)
    (re.compile(r'"Unregistered DRA plugin".*driverName="(?P<driver>[^"]+)".*endpoint="(?P<endpoint>[^"]*)"'),
     "dra.deregistered"),
    # dra_plugin_manager.go add() (V(3)): the service version the kubelet chose for the driver
    (re.compile(r'"Registered DRA plugin".*driverName="(?P<driver>[^"]+)".*endpoint="(?P<endpoint>[^"]*)"'
                r'.*chosenService="(?P<service>[^"]*)"'), "dra.service_chosen"),
    # dra_plugin_manager.go wipeResourceSlices (V(3)): the node's ResourceSlices deleted, at the kubelet's
    # start (every driver's) or once a driver stayed away for the wiping delay
    (re.compile(r'"Deleted ResourceSlices".*fieldSelector="?(?P<selector>[^"]*)"?'), "dra.wipe"),
)
# V(3) for the DRA lines above that V(2) does not log (kubelet cm/dra/plugin/dra_plugin_manager.go).
KUBELET_VERBOSITY = "3"
TOOLS = {"containerd": "Debian package containerd", "ctr": "Debian package containerd",
         "containerd-shim-runc-v2": "Debian package containerd", "runc": "Debian package runc",
         "nsenter": "util-linux"}


class RealNodeUnavailable(RuntimeError):
    """This machine cannot run a real kubelet: checks on it skip with this one-line reason."""


def unavailable() -> str | None:
    """Why a real kubelet cannot run here, in one line, or None."""
    why = _lacking()
    return machine_lacks(why) if why is not None else None


def _lacking() -> str | None:
    if os.geteuid() != 0:
        return "the real kubelet needs root (it mounts, creates cgroups and device nodes)"
    missing = missing_tools()
    if missing:
        tool, package = missing[0]
        return f"{tool} not found ({package})"
    try:
        image.find_busybox()
    except image.ImageError as err:
        return str(err)
    return None


def missing_tools() -> list[tuple[str, str]]:
    """The real node's tools this machine lacks, with the package of each (`fakelet doctor` lists them all).
    Debian's containerd is the fallback: with containerd 2 in the cache, only runc and nsenter are needed."""
    built = runtime.cached() is not None
    return [(tool, package) for tool, package in TOOLS.items()
            if not (built and tool in runtime.COMMANDS)
            and shutil.which(tool) is None and not Path("/usr/sbin", tool).exists()]


def find_kubelet(release: str | None = None) -> tuple[Path, str | None]:
    """The real kubelet of `release` ("1.35": its newest patch, "1.35.4"; None: the default module's),
    built on first use (releases.py); ControlPlaneUnavailable naming the release when it cannot be."""
    try:
        module = module_for(release) if release is not None else None
    except (ReleaseUnavailable, ValueError) as err:
        # The type every caller of a kube build already turns into a skip (prepare, prebuild, tests);
        # the reason names the release (most of releases.py's already do).
        raise ControlPlaneUnavailable(str(err) if release in str(err) else f"kubelet {release}: {err}") from None
    return find_kube_binary("kubelet", KUBELET_PACKAGE, module, why="for the real node")


@dataclass(frozen=True)
class NodeAccess:
    """Where a real kubelet joins: the API server's kubeconfig (the kubelet's own credentials) and a client."""

    kubeconfig: Path
    client: KubeClient


class LocalShell:
    """One real kubelet (restartable) and its container runtime, in a namespace of their own, for one sandbox."""

    def __init__(self, sandbox: Sandbox, timeline: Timeline, kubeconfig: Path, node_name: str,
                 release: str | None = None, translate: Callable[[str], str] | None = None) -> None:
        """`release`: the kubelet release to build (harness/node/real/releases.py); None: the default module's.
        `translate`: a path a DRA driver names (its mount namespace's view) -> the harness's."""
        self.sandbox, self.timeline, self.kubeconfig, self.node_name = sandbox, timeline, Path(kubeconfig), node_name
        self.release, self.translate = release, translate
        self.workdir = sandbox.path / "node"
        self.podres_dir = self.workdir / "pod-resources"
        self.kubelet_plugin_dir = self.workdir / "device-plugins"  # the kubelet's; the relay joins it to the plugin's
        self.relay: DevicePluginRelay | None = None
        # The kubelet's own plugins_registry and plugins dirs; the DRA relay joins them to the driver's.
        self.kubelet_registry_dir = self.workdir / "plugins_registry"
        self.kubelet_plugins_dir = self.workdir / "plugins"
        self.dra_relay: DRARelay | None = None
        self.runtime_socket = self.workdir / "containerd.sock"
        # The owner tag lets the next run remove what a SIGKILLed one left (reap_cgroups).
        self.cgroup_root = f"/{CGROUP_PREFIX}{owner_tag()}-{secrets.token_hex(3)}"
        self.namespace: NodeNamespace | None = None
        self.containerd: Daemon | None = None
        self.kubelet: Daemon | None = None
        self.starts = 0
        self._start_ns = 0  # when the running kubelet was started (timeline time)
        self.kubelet_binary: Path | None = None
        self.kubelet_version: str | None = None
        self.runtime: runtime.NodeRuntime | None = None
        self.pod_image = image.IMAGE_REF

    @property
    def kubelet_socket(self) -> Path:
        """The kubelet's own kubelet.sock (the plugin's directory has the relay's)."""
        return self.kubelet_plugin_dir / "kubelet.sock"

    @property
    def pod_resources_socket(self) -> Path:
        return self.podres_dir / "kubelet.sock"

    @property
    def running(self) -> bool:
        return self.kubelet is not None and self.kubelet.running

    def prepare(self) -> None:
        """The namespace, and containerd in it with the pods' image."""
        if self.namespace is not None:
            return
        why = unavailable() or inotify_budget.shortage(inotify_budget.NEEDED_REAL_NODE)
        if why:
            raise RealNodeUnavailable(why)
        try:
            self.kubelet_binary, self.kubelet_version = find_kubelet(self.release)
        except ControlPlaneUnavailable as err:
            raise RealNodeUnavailable(str(err).splitlines()[0]) from None
        # containerd 2 when it builds; Debian's otherwise, which `fakelet run` has said in one line.
        self.runtime = runtime.find()
        self.timeline.record("node.runtime", "node", containerd=self.runtime.label, cdi=self.runtime.cdi,
                             reason=self.runtime.reason)
        reap_cgroups()
        self.workdir.mkdir(mode=0o700, exist_ok=True)
        self.podres_dir.mkdir(mode=0o750, exist_ok=True)
        self.kubelet_plugin_dir.mkdir(mode=0o750, exist_ok=True)
        self.kubelet_registry_dir.mkdir(mode=0o755, exist_ok=True)  # pluginwatcher's own mode (0755)
        self.kubelet_plugins_dir.mkdir(mode=0o750, exist_ok=True)
        binds = {str(self.kubelet_plugin_dir): f"{HOST_KUBELET_ROOT}/device-plugins",
                 str(self.kubelet_registry_dir): f"{HOST_KUBELET_ROOT}/plugins_registry",
                 str(self.kubelet_plugins_dir): f"{HOST_KUBELET_ROOT}/plugins",
                 str(self.podres_dir): f"{HOST_KUBELET_ROOT}/pod-resources",
                 str(self.sandbox.cdi_dir): NODE_CDI_DIR}
        try:
            # The sandbox, the API server's kubeconfig and the node's binaries (a $FAKELET_CACHE under /tmp)
            # stay visible under the private /tmp.
            keep = [str(self.sandbox.path), str(self.kubeconfig.parent), *self._binary_dirs()]
            self.namespace = NodeNamespace(binds, PRIVATE_DIRS, [HOST_KUBELET_ROOT],
                                           self.workdir / "namespace.log", keep=keep).start()
            self._start_runtime()
            self.relay = DevicePluginRelay(self.timeline, self.sandbox.plugin_dir, self.kubelet_plugin_dir,
                                           self.workdir / "relay", lambda: self.starts).start()
            self.dra_relay = DRARelay(self.timeline, self.sandbox.registry_dir, self.sandbox.plugins_dir,
                                      self.kubelet_registry_dir, self.kubelet_plugins_dir,
                                      f"{HOST_KUBELET_ROOT}/plugins", self.workdir / "relay-dra",
                                      lambda: self.starts, self.translate,
                                      # One fault plan per kubelet instance on the wire, the DP relay's: a hold
                                      # armed for the kubelet applies to the DRA calls it makes too.
                                      lambda: self.relay.faults if self.relay is not None else None).start()
        except (NamespaceError, image.ImageError, OSError, subprocess.SubprocessError) as err:
            self.close()
            raise RealNodeUnavailable(f"the real node's runtime did not start: {err}") from None

    def _binary_dirs(self) -> list[str]:
        """The folders of the kubelet's and the runtime's binaries, for the namespace to keep in reach."""
        assert self.runtime is not None and self.kubelet_binary is not None
        paths = [self.kubelet_binary, Path(self.runtime.containerd), Path(self.runtime.ctr)]
        if self.runtime.shim:
            paths.append(Path(self.runtime.shim))
        return sorted({str(Path(os.path.abspath(p)).parent) for p in paths})

    def _start_runtime(self) -> None:
        assert self.namespace is not None and self.runtime is not None
        config = self.workdir / "containerd.toml"
        if self.runtime.cdi:
            assert self.runtime.shim is not None
            config.write_text(configs.containerd2_toml(self.runtime_socket, image.IMAGE_REF, NODE_CDI_DIR,
                                                       self.runtime.shim))
        else:
            config.write_text(configs.containerd_toml(self.runtime_socket, image.IMAGE_REF))
        self.containerd = self.namespace.enter("containerd", [self.runtime.containerd, "--config", str(config)],
                                               self.workdir / "containerd.log")
        deadline = time.monotonic() + RUNTIME_READY_TIMEOUT_S
        while self._ctr(["version"], check=False).returncode != 0:
            if not self.containerd.running or time.monotonic() > deadline:
                raise NamespaceError(f"containerd did not serve {self.runtime_socket}: "
                                     f"{(self.workdir / 'containerd.log').read_text(errors='replace')[-300:]}")
            time.sleep(0.05)  # bounded by the deadline: containerd's socket has no readiness event
        archive = self.workdir / "image.tar"
        with Progress(image.IMAGE_REF, doing="building image", done="built image", quiet_s=IMPORT_QUIET_S,
                      detail=" from the host's static busybox, into the real node's containerd"):
            image.write_archive(archive)
            self._ctr(["-n", "k8s.io", "images", "import", str(archive)])
        archive.unlink()

    def _ctr(self, args: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
        ctr = self.runtime.ctr if self.runtime is not None else "ctr"
        proc = subprocess.run([ctr, "--address", str(self.runtime_socket), *args], capture_output=True,
                              text=True, timeout=CTR_TIMEOUT_S)
        if check and proc.returncode != 0:
            raise NamespaceError(f"ctr {' '.join(args[:3])} failed: {proc.stderr.strip()[-300:]}")
        return proc

    def container_spec(self, container_id: str) -> dict[str, Any]:
        """The container's OCI spec as containerd holds it."""
        info = json.loads(self._ctr(["-n", "k8s.io", "containers", "info", container_id]).stdout)
        return info.get("Spec") or {}

    def start_kubelet(self) -> None:
        assert self.namespace is not None and self.kubelet_binary is not None
        make_cgroups(self.cgroup_root)
        config = self.workdir / "kubelet.json"
        config.write_text(configs.kubelet_config(self.runtime_socket, self.cgroup_root, free_port()))
        self.starts += 1
        # Watched before the kubelet runs: its start deletes every socket there, then serves a new kubelet.sock.
        with INotify() as inotify:
            inotify.add_watch(self.kubelet_plugin_dir, IN.CREATE | IN.MOVED_TO)
            self._start_ns = self.timeline.now()
            self.kubelet = self.namespace.enter("kubelet", [
                str(self.kubelet_binary), "--config", str(config), "--kubeconfig", str(self.kubeconfig),
                "--hostname-override", self.node_name, "--node-ip", "127.0.0.1", "--v", KUBELET_VERBOSITY,
            ], self.workdir / "kubelet.log", on_line=self._on_log)
            self.timeline.record("kubelet.start", "kubelet", instance=self.starts, real=True,
                                 socket=str(self.kubelet_socket), pid=self.kubelet.pid)
            watcher = threading.Thread(target=self._watch_exit, args=(self.kubelet, self.starts), daemon=True,
                                       name=f"realnode-kubelet-{self.starts}")
            watcher.start()
            self._wait_serving(inotify, self.kubelet)

    def _wait_serving(self, inotify: INotify, kubelet: Daemon) -> None:
        """Return once the kubelet serves its new kubelet.sock, as the fake kubelet's start does: a plugin
        started earlier would lose its socket to the kubelet's start-up cleanup."""
        deadline = time.monotonic() + KUBELET_READY_TIMEOUT_S
        while True:
            remaining = deadline - time.monotonic()
            if not kubelet.running or remaining <= 0:
                why = "exited" if not kubelet.running else f"served no kubelet.sock within {KUBELET_READY_TIMEOUT_S:g}s"
                raise RealNodeUnavailable(f"the real kubelet {why}:\n{self.kubelet_log_tail(8)}")
            # inotify's own timeout, in milliseconds; a short one so that an exit is noticed too.
            events = inotify.read(timeout=int(min(remaining, EXIT_CHECK_S) * 1000))
            if any(e.name == "kubelet.sock" for e in events):
                self._wait_mirrored()
                self.timeline.record("kubelet.serving", "kubelet", instance=self.starts, real=True)
                return

    def _wait_mirrored(self) -> None:
        """The kubelet serves once the plugin's directory has the relay's kubelet.sock too."""
        if self.relay is None:
            return
        self.timeline.wait_for(
            lambda e: e.kind == "relay.mirror" and e.get("name") == "kubelet.sock" and e.get("what") == "created",
            RELAY_MIRROR_TIMEOUT_S, "the relay to give the plugin the kubelet's new kubelet.sock", self._start_ns)

    def _on_log(self, line: str) -> None:
        """The real kubelet's own word for what the fake kubelet records of registrations."""
        for pattern, kind in LOG_EVENTS:
            match = pattern.search(line)
            if match:
                fields: dict[str, Any] = dict(match.groupdict())
                if "connected" in fields:
                    fields["connected"] = fields["connected"] == "true"
                self.timeline.record(kind, "kubelet", instance=self.starts, real=True, **fields, line=line[:300])

    def _watch_exit(self, kubelet: Daemon, instance: int) -> None:
        """A kubelet that exits on its own is on the timeline with its last words: waits end on it."""
        code = kubelet.outer.wait()
        if self.relay is not None and (self.kubelet is None or kubelet is self.kubelet):
            self.relay.kubelet_stopped()
        if kubelet is self.kubelet:
            self.timeline.record("kubelet.exit", "kubelet", instance=instance, real=True, returncode=code,
                                 log=self.kubelet_log_tail(8))

    def stop_kubelet(self, remove_socket: bool = False) -> None:
        kubelet, self.kubelet = self.kubelet, None
        if kubelet is None:
            return
        code = kubelet.stop(grace_s=KUBELET_STOP_GRACE_S)
        if self.relay is not None:
            self.relay.kubelet_stopped()
        if remove_socket:
            self.kubelet_socket.unlink(missing_ok=True)
        self.timeline.record("kubelet.stop", "kubelet", instance=self.starts, real=True, returncode=code)

    def close(self) -> None:
        self.stop_kubelet()
        if self.relay is not None:
            self.relay.close()
            self.relay = None
        if self.dra_relay is not None:
            self.dra_relay.close()
            self.dra_relay = None
        if self.containerd is not None:
            self.containerd.stop()
            self.containerd = None
        if self.namespace is not None:
            self.namespace.stop()
            self.namespace = None
        left = remove_cgroups(self.cgroup_root)
        if left:
            self.timeline.record("node.cleanup_failed", "node", cgroups=left)

    def kubelet_file(self, name: str) -> Path | None:
        """The private /var/lib/kubelet/<name> through the namespace's PID 1 (its /proc root sees the
        namespace's mounts): the kubelet's checkpoints that are not in a directory bound to the sandbox."""
        if self.namespace is None or self.namespace.init_pid is None:
            return None
        return Path(f"/proc/{self.namespace.init_pid}/root{HOST_KUBELET_ROOT}") / name

    def power_off_pods(self) -> int:
        """Every container task of every pod killed and deleted, as a power cut leaves them: containerd keeps
        its records (they are on disk), so the kubelet that starts next finds dead sandboxes and makes new ones."""
        if self.containerd is None:
            return 0
        tasks = self._ctr(["-n", "k8s.io", "tasks", "ls", "-q"]).stdout.split()
        for task in tasks:
            # delete --force kills the task's processes and returns once they are gone.
            self._ctr(["-n", "k8s.io", "tasks", "delete", "--force", task], check=False)
        left = self._ctr(["-n", "k8s.io", "tasks", "ls", "-q"]).stdout.split()
        if left:
            raise NamespaceError(f"pods' tasks survived a forced delete: {', '.join(left[:4])}")
        self.timeline.record("node.power_off_pods", "node", tasks=len(tasks))
        return len(tasks)

    def kubelet_log_tail(self, lines: int = 15) -> str:
        try:
            text = (self.workdir / "kubelet.log").read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


class RelayArm:
    """What a check's `arm` gets on the real node, in place of the fake kubelet's device manager: its fault plan
    on the wire (the relay's, for the next kubelet instance). Anything else is the fake kubelet's alone."""

    def __init__(self, faults: FaultPlan) -> None:
        object.__setattr__(self, "faults", faults)

    def __getattr__(self, name: str) -> Any:
        raise NotOnRealKubelet(f"the fake kubelet's own {name!r} (a real kubelet's faults are those on the wire: "
                               "a rejected or held call)")

    def __setattr__(self, name: str, value: Any) -> None:
        self.__getattr__(name)


class LocalNode(ClusterNode):
    """The real kubelet on this machine (LocalShell), joined to the run's own API server."""

    def __init__(self, sandbox: Sandbox, timeline: Timeline, profile: Profile, kubeconfig: Path,
                 client: KubeClient, node_name: str | None = None, release: str | None = None,
                 translate: Callable[[str], str] | None = None) -> None:
        node_name = node_name or f"fakelet-real-{secrets.token_hex(4)}"
        self.sandbox, self.kubeconfig = sandbox, Path(kubeconfig)
        self.shell: LocalShell = LocalShell(sandbox, timeline, kubeconfig, node_name, release, translate)
        super().__init__(self.shell, timeline, profile, client, node_name)

    @property
    def kubelet_socket(self) -> Path:
        return self.shell.kubelet_socket

    def start_kubelet(self, arm: Callable[..., object] | None = None, **faults: Any) -> None:
        """As ClusterNode's; `arm` may set faults on the wire (the relay's FaultPlan, as `m.faults`), which the
        next kubelet instance's registration socket applies."""
        if arm is None or any(faults.values()):
            super().start_kubelet(None, **faults)
            return
        if self.running:
            return
        self.prepare()
        if self.shell.relay is None:
            raise NotOnRealKubelet("faults on the wire need the relay, which this node does not run")
        arm(RelayArm(self.shell.relay.arm()))
        self.shell.start_kubelet()

    def restart_kubelet(self, arm: Callable[..., object] | None = None, **faults: Any) -> None:
        if arm is None or any(faults.values()):
            super().restart_kubelet(None, **faults)
            return
        self.stop_kubelet()
        self.start_kubelet(arm)

    @property
    def workdir(self) -> Path:
        return self.shell.workdir

    def container_view(self, pod: str) -> ContainerView:
        """As ClusterNode's, saying whether the runtime applied the CDI devices the kubelet named (containerd 2)."""
        view = super().container_view(pod)
        view.cdi_applied = self.shell.runtime is not None and self.shell.runtime.cdi
        return view
