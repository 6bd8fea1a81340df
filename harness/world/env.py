"""One check's world: a sandbox, the fake kubelet, the subject, one timeline.

`DPEnv` wires the pieces together and offers the waits the checks need
(registration, the first device list, a process exit), each bounded and each
aborting early when the timeline shows the awaited thing cannot come.
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fake_devices.access import READ_EVENT, AccessTrace
from fake_devices.backend import DeviceBackend
from fake_devices.levelzero import CAPABILITY_METHODS, LevelZeroSidecar
from fake_devices.levelzero import DEFAULT_SOCKET as LEVELZERO_SOCKET
from fake_devices.model import Inventory
from fake_devices.nvml.surface import CALL_EVENT as NVML_CALL_EVENT
from fake_devices.nvml.surface import CAPABILITY_CALLS, POLLED
from harness.instruments import artifacts, logtail
from harness.instruments.bounds import megabytes
from harness.instruments.filewatch import FileWatch
from harness.instruments.teardown import run_all
from harness.instruments.timeline import Event, Timeline, WaitTimeout
from harness.kubelet import checkpoint
from harness.kubelet.versions import KubeletVersion
from harness.kubelet.versions import default as default_kubelet_version
from harness.launch.namespace import NamespaceLauncher, paths_in
from harness.launch.process import HOST_DEVICE_PLUGIN_DIR, LOG_CAP_BYTES, ProcessLauncher
from harness.launch.sandbox import Sandbox
from harness.node.fake import FakeNode
from harness.node.real.cluster import ClusterNode
from harness.node.real.localnode import LocalNode, NodeAccess
from harness.spec.checks import expect, not_exercised
from harness.spec.profiles import Profile
from harness.spec.subjects import (
    EMPTY_OK,
    ProfileError,
    SubjectSpec,
    empty_placeholders,
    fixtures_dir,
    free_port,
    load_yaml,
    passed_env,
    render,
)
from harness.world.devicemap import DeviceMap, HardwareDevice, map_devices
from harness.world.listing import HEALTHY, UNHEALTHY, Listing, wait_settled
from harness.world.probe import ProbeClient

if TYPE_CHECKING:
    from harness.launch.containers.launcher import ContainerLauncher
    from harness.node.kind.cluster import KindAccess
    from harness.node.kind.launcher import DaemonSetLauncher

REGISTRATION_KINDS = ("kubelet.register", "kubelet.register_received", "kubelet.start", "kubelet.stop",
                      "process.exit", "fault.fired")
READ_NOTES = {
    "levelzero": "the plugin asked the Level-Zero sidecar for {capability}, so it is held to it",
    "nvml": "the plugin watched the fake GPUs' {capability} through NVML, so it is held to it",
    "sysfs": "the plugin read the fake hardware's {capability} source, so it is held to it",
}
SERVER_FOLLOW_WAKE_S = 0.5  # the server follower checks this often whether the check has ended
COVERAGE_POLLS = 2  # poll periods coverage waits for a first read, when the subject declares its period
# Rejections no retry can fix: the plugin asked for something the kubelet never accepts.
PERMANENT_REJECTIONS = ("is not supported by kubelet", "is invalid")
# The plugin's last output a failure's detail quotes: enough for a stack trace's end, bounded for the report.
LAST_OUTPUT_LINES = 20
LAST_OUTPUT_BYTES = 2048
OUTPUT_LINE_CHARS = 300


def reads_event(event: Event, capability: str, surface: str | None = None) -> bool:
    """Whether `event` is the plugin reading `capability` through `surface` (or any): each surface puts its
    first read of a source on the timeline (hw.read, nvml.call, levelzero.call)."""
    if event.kind == READ_EVENT and surface in (None, "sysfs"):
        return capability == "hotplug" or event.get("group") == capability
    if event.kind == NVML_CALL_EVENT and surface in (None, "nvml"):
        return event.get("call") in CAPABILITY_CALLS[capability] and (capability not in POLLED
                                                                       or bool(event.get("repeat")))
    if event.kind == "levelzero.call" and surface in (None, "levelzero"):
        return event.get("method") == CAPABILITY_METHODS.get(capability)
    return False


class SubjectUnavailable(RuntimeError):
    """The subject cannot run on this machine (binary missing): the check skips."""


class DPEnv:
    def __init__(self, spec: SubjectSpec, profile: Profile, defect: str | None = None, seed: int = 0,
                 binary: str | None = None, artifacts: Path | None = None, *, real_node: NodeAccess | None = None,
                 kind: KindAccess | None = None, kubelet_version: KubeletVersion | None = None,
                 partitioned_inventory: str | None = None, shared_inventory: str | None = None,
                 fabric_inventory: str | None = None) -> None:
        """`real_node` puts the checks on a real kubelet (harness/node/real) joined to that API server;
        `kind`, on a kind cluster's node, with the subject's image as a DaemonSet (harness/node/kind);
        `partitioned_inventory` (fixtures/-relative), the fake backend's inventory instead of the subject's when
        that one has no partitioned device (a check that needs partitions); `shared_inventory`, the same for a check
        that needs a shareable device (fake_devices/capacity.py)."""
        error = spec.defect_error(defect) if defect is not None else None
        if error is not None:
            raise ProfileError(error)
        self.spec, self.profile, self.defect, self.seed = spec, profile, defect, seed
        self.partitioned_inventory = partitioned_inventory
        self.shared_inventory = shared_inventory
        self.fabric_inventory = fabric_inventory  # the same for a check that needs a fabric-attached device
        if kubelet_version is not None or not hasattr(self, "kubelet_version"):  # DRAEnv sets its own first
            self.kubelet_version = kubelet_version or default_kubelet_version()
        self.binary, self.artifacts = binary, artifacts
        self.real_node, self.kind = real_node, kind
        self.timeline = Timeline()
        self.inventory: list[dict[str, Any]] | None = None
        self.devices: DeviceBackend | None = None
        self.stop_scripts = threading.Event()  # ends fault scripts still running at teardown
        # What the check learned besides its verdict, handed to the report at teardown.
        self.notes: list[str] = []  # per check: slow reactions, the device mapping used
        self.measured: dict[str, float] = {}  # per check: reaction times, seconds (the fidelity table's)
        self.facts: dict[str, Any] = {}  # per subject: files read, mapping, device nodes
        self.findings: list[str] = []  # per subject: e.g. detached processes
        self.cleanup: list[str] = []  # what containment had to clean up after the plugin
        # The run's artifacts dir, bounded as a whole (harness/instruments/artifacts.py); default: artifacts' parent.
        self.artifacts_root: Path | None = None
        self._device_map: DeviceMap | None = None
        self._closing = threading.Event()
        self._server_follower: threading.Thread | None = None  # finds who serves the plugin's socket
        self.access: AccessTrace | None = None  # what the plugin reads of the fake hardware
        self.levelzero: LevelZeroSidecar | None = None  # the drm skins' Level-Zero health sidecar
        self.nvml_offered: list[str] = []  # where the plugin could find the NVML library (the report's fact)
        # The subject's rendered placeholders ({plugin_dir}, ...), kept so that a scenario's templates (a rolling
        # update's args) render against the same sandbox: computing them again would start a second backend.
        self.placeholders: dict[str, str] = {}
        self.sandbox = Sandbox()
        # From here on whatever stops the constructor (an interrupt included) must not leave the sandbox or
        # the fake hardware behind: no fixture holds this object yet to close it.
        try:
            self.node = self._make_node()
            self.subject = self._make_launcher()
            self.expected_ids, self.expected_count = spec.expected_devices(self.inventory)
            # The checkpoint's scratch file comes and goes on every admission: two events that woke every waiter.
            self.files = FileWatch(self.sandbox.plugin_dir, self.timeline,
                                   ignore=frozenset({checkpoint.SCRATCH_NAME})).start()
        except BaseException:
            run_all([*([self.levelzero.stop] if self.levelzero is not None else []),
                     *([self.devices.stop] if self.devices is not None else []), self.sandbox.close])
            raise

    # -- setup -------------------------------------------------------------

    def _make_node(self) -> FakeNode | ClusterNode:
        if self.kind is not None:
            from harness.node.kind.cluster import KindShell

            shell = KindShell(self.kind.tier, self.timeline, self.kind.pod_image)
            return ClusterNode(shell, self.timeline, self.profile, self.kind.client, self.kind.node_name)
        if self.real_node is not None:
            return LocalNode(self.sandbox, self.timeline, self.profile, self.real_node.kubeconfig,
                             self.real_node.client, release=self.kubelet_version.name)
        return FakeNode(self.sandbox.plugin_dir, self.sandbox.state_dir, self.timeline, self.profile,
                        kubelet_version=self.kubelet_version, cdi_dir=self.sandbox.cdi_dir)

    def _namespace_binds(self) -> dict[str, str]:
        """Sandbox directory -> the host path a mount-namespace subject sees it at."""
        return {str(self.sandbox.plugin_dir): HOST_DEVICE_PLUGIN_DIR, **self._sidecar_binds()}

    def _sidecar_binds(self) -> dict[str, str]:
        if self.levelzero is None:
            return {}
        return {str(self.levelzero.socket_path.parent): str(Path(LEVELZERO_SOCKET).parent)}

    def _placeholders(self) -> dict[str, str]:
        values = {
            "python": sys.executable, "plugin_dir": str(self.sandbox.plugin_dir),
            "kubelet_socket": str(self.sandbox.kubelet_socket), "dev_dir": str(self.sandbox.dev_dir),
            "sandbox": str(self.sandbox.path), "resource": self.spec.resource,
            "free_port": str(free_port()), "defect": self.defect or "",
            "bin": self.binary or "", "inventory": "", "sysfs_root": "", "levelzero_socket": "",
            # The sandbox is at its own path inside a namespace or container too; DRAEnv binds it at /var/run/cdi.
            "cdi_dir": str(self.sandbox.cdi_dir),
        }
        if self.spec.host_view:
            # Inside the namespace (or container) the plugin sees the sandbox at the host path.
            values["plugin_dir"] = HOST_DEVICE_PLUGIN_DIR
            values["kubelet_socket"] = f"{HOST_DEVICE_PLUGIN_DIR}/kubelet.sock"
        values.update(self._more_placeholders())
        if self.spec.inventory:
            values["inventory"] = str(self._install_inventory())
        if self.spec.backend:
            root = self._start_backend()
            values["sysfs_root"], values["dev_dir"] = str(root), str(root / "dev")
            if self.levelzero is not None:
                # Inside a namespace or container the sidecar's dir is bound at its host path.
                here = str(self.levelzero.socket_path)
                values["levelzero_socket"] = LEVELZERO_SOCKET if self.spec.host_view else here
            # {inventory} of a backend-only subject: the backend's starting inventory.
            values["inventory"] = values["inventory"] or str(self.sandbox.path / "inventory.yaml")
        return values

    def _more_placeholders(self) -> dict[str, str]:
        return {}

    def _start_backend(self) -> Path:
        """Materialize the fake hardware for the subject, under the sandbox."""
        assert self.spec.backend is not None
        # Loaded specs carry absolute paths; hand-built ones may still name fixtures/-relative ones.
        source = fixtures_dir() / self.spec.backend["inventory"]
        if not source.is_file():
            raise ProfileError(f"{self.spec.source}: inventory {source} not found")
        try:
            inventory = Inventory.from_dict(load_yaml(source).data, str(source))
            if self.partitioned_inventory and not any(d.partitions for d in inventory.devices):
                own, source = source, fixtures_dir() / self.partitioned_inventory
                inventory = Inventory.from_dict(load_yaml(source).data, str(source))
                self.note(f"fake hardware: {self.partitioned_inventory} (partitioned GPUs), as the subject's "
                          f"{own.name} has no partitions")
            elif self.shared_inventory and not any(d.sharing for d in inventory.devices):
                own, source = source, fixtures_dir() / self.shared_inventory
                inventory = Inventory.from_dict(load_yaml(source).data, str(source))
                self.note(f"fake hardware: {self.shared_inventory} (a shareable GPU), as the subject's "
                          f"{own.name} has no shareable device")
            elif self.fabric_inventory and not any(d.fabric for d in inventory.devices):
                own, source = source, fixtures_dir() / self.fabric_inventory
                inventory = Inventory.from_dict(load_yaml(source).data, str(source))
                self.note(f"fake hardware: {self.fabric_inventory} (fabric-attached NICs), as the subject's "
                          f"{own.name} has no fabric-attached device")
        except ValueError as err:
            raise ProfileError(str(err)) from None
        shutil.copyfile(source, self.sandbox.path / "inventory.yaml")
        root = self.sandbox.path / "hw"
        self.devices = DeviceBackend(root, inventory, self.timeline, skin=self.spec.backend.get("skin", "neutral"))
        if self.devices.nvml is not None:
            self.devices.nvml.threshold_c = self.spec.thermal[0]  # NVML's shutdown threshold: the subject's
        self.devices.start()
        if self.devices.drm:
            # Intel's GPU plugin asks its Level-Zero sidecar for health: fakelet serves it from the same model
            # (under drm+nvml, the same model NVML answers from).
            socket = self.sandbox.path / "levelzero" / "server.sock"
            self.levelzero = LevelZeroSidecar(self.devices.surface_view, socket, self.timeline).start()
        self.inventory = [{"id": d.id, "numa": d.numa} for d in self.devices.devices() if d.present]
        return root

    def _install_inventory(self) -> Path:
        source = fixtures_dir() / self.spec.inventory  # type: ignore[operator]
        if not source.is_file():
            raise ProfileError(f"{self.spec.source}: inventory {self.spec.inventory} not found under {fixtures_dir()}")
        target = self.sandbox.dev_dir / "inventory.yaml"
        shutil.copyfile(source, target)
        self.inventory = load_yaml(target).data["devices"]
        for device in self.inventory:
            if device.get("dev"):
                (self.sandbox.dev_dir / device["dev"]).touch()
        return target

    def _nvml_library(self) -> Path | None:
        """Our libnvidia-ml.so.1 when the skin has NVML (built on first use), else None."""
        if self.devices is None or self.devices.nvml is None:
            return None
        from fake_devices.nvml.build import NvmlBuildError, library

        try:
            return library()
        except NvmlBuildError as err:
            raise SubjectUnavailable(str(err)) from None

    def _surface_env(self) -> dict[str, str]:
        """What a plugin needs to reach the fake hardware's vendor surfaces: under an nvml skin, our
        libnvidia-ml.so.1 on its library path and the state it reads."""
        lib = self._nvml_library()
        if lib is None or self.devices is None or self.devices.nvml is None:
            return {}
        self.nvml_offered.append(f"LD_LIBRARY_PATH={lib.parent}")
        return {"LD_LIBRARY_PATH": str(lib.parent), **self.devices.nvml.env}

    def _surface_files(self) -> dict[str, str]:
        """Host file -> where a namespace or container plugin finds it: our libnvidia-ml.so.1 at the distribution's
        path too, for plugins that dlopen it by that path (NVIDIA's looks in the driver's lib dirs) or ignore
        LD_LIBRARY_PATH. Only in the plugin's own mount namespace: never on the host's /usr/lib."""
        lib = self._nvml_library()
        if lib is None:
            return {}
        from fake_devices.nvml.build import distribution_path

        self.nvml_offered.append(f"{distribution_path()} (in the plugin's mount namespace)")
        return {str(lib): distribution_path()}

    def _ready_dirs(self) -> list[Path]:
        """Where the plugin's socket appears once it serves (a container's readiness)."""
        return [self.sandbox.plugin_dir]

    def _container_launcher(self, argv: list[str], env: dict[str, str], log: Path,
                            values: dict[str, str]) -> ContainerLauncher:
        """The image as its DaemonSet runs it: the kubelet's dirs at their host paths, the sandbox (fake
        hardware) at its own, and any other host path the plugin was given, read-only."""
        from harness.launch.containers.launcher import ContainerLauncher

        assert self.spec.image is not None
        binds = {**self._namespace_binds(), str(self.sandbox.path): str(self.sandbox.path)}
        binds.update({render(host, values, self.spec.source): inside for inside, host in self.spec.mounts.items()})
        sandbox = str(self.sandbox.path) + "/"
        given = [p for p in paths_in([*argv, *env.values()])
                 if os.path.exists(p) and not (p + "/").startswith(sandbox)]
        return ContainerLauncher(self.spec.name, self.spec.image, argv, env, log, self.timeline, binds=binds,
                                 read_only=given, private_dirs=self.spec.private_dirs,
                                 privileged=self.spec.privileged, ready_dirs=self._ready_dirs(),
                                 ready_timeout_s=self.profile.reaction_s, files=self._surface_files())

    def _make_launcher(self) -> ProcessLauncher | ContainerLauncher | DaemonSetLauncher:
        if self.kind is not None:
            from harness.node.kind.launcher import DaemonSetLauncher

            assert self.spec.image is not None
            return DaemonSetLauncher(self.spec, self.spec.image, self.kind.client, self.timeline,
                                     self.sandbox.logs_dir / f"{self.spec.name}.log", self.kind.node_name)
        if "{bin}" in " ".join(self.spec.command) and not self.binary:
            raise SubjectUnavailable(f"subject {self.spec.name}: no binary built (needs Go to build it)")
        for name in self.spec.dev_files:
            (self.sandbox.dev_dir / name).touch()
        values = self.placeholders = self._placeholders()
        used = [*self.spec.command, *(self.spec.defect_args if self.defect else []), *self.spec.env.values()]
        for name in empty_placeholders(used, values, self.spec.source):
            self.timeline.record("subject.placeholder_empty", "harness", placeholder=name, why=EMPTY_OK[name])
        argv = [render(a, values, self.spec.source) for a in self.spec.command]
        if self.defect:
            argv += [render(a, values, self.spec.source) for a in self.spec.defect_args]
        given = {**self._surface_env(), **passed_env(self.spec),
                 **{k: render(v, values, self.spec.source) for k, v in self.spec.env.items()}}
        log = self.sandbox.logs_dir / f"{self.spec.name}.log"
        if self.spec.launcher == "container":
            # The image brings its own environment; the plugin gets only what the subject gives it.
            return self._container_launcher(argv, given, log, values)
        # A minimal environment, so that a run does not depend on who started it; pass_env is the way out.
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(self.sandbox.path),
               "PYTHONPATH": str(Path(__file__).resolve().parents[2]), "GRPC_VERBOSITY": "ERROR", **given}
        if self.spec.launcher == "mount-namespace":
            # The launcher gives the plugin a container's private /tmp, /run and CDI dirs (plus the
            # subject's private_dirs); the sandbox paths the plugin is given stay visible inside.
            keep = [str(self.sandbox.path), *(v for v in values.values() if v.startswith("/"))]
            return NamespaceLauncher(self.spec.name, argv, env, log, self.timeline, binds=self._namespace_binds(),
                                     private_dirs=self.spec.private_dirs, keep=keep, files=self._surface_files())
        # Scratch files a plugin leaves in its temp dir stay in the sandbox, as they would in a
        # container's own /tmp, and go with it (the mount-namespace launcher gives a private /tmp).
        scratch = self.sandbox.path / "tmp"
        scratch.mkdir(exist_ok=True)
        env.setdefault("TMPDIR", str(scratch))
        return ProcessLauncher(self.spec.name, argv, env, log, self.timeline)

    # -- lifecycle ---------------------------------------------------------

    def start_kubelet(self) -> None:
        self.node.start_kubelet()

    def start_subject(self) -> None:
        if self.devices is not None and self.access is None:
            # Before the plugin starts, so that its first scan is seen too.
            self.access = AccessTrace(self.devices.root, self.timeline).start()
        self.subject.start()
        if self._server_follower is None and hasattr(self.subject, "socket_owner"):
            self._server_follower = threading.Thread(target=self._follow_server, daemon=True,
                                                     name="fakelet-server-follower")
            self._server_follower.start()

    def start(self) -> DPEnv:
        self.start_kubelet()
        self.start_subject()
        return self

    def close(self) -> None:
        self._closing.set()
        # Every step runs whatever an earlier one raised (an interrupt, a huge timeline failing to write):
        # a step skipped here would leave the subject's processes, the kubelet's sockets or the sandbox behind.
        run_all([self.subject.stop, self._gather_facts, self.stop_scripts.set, self.node.close, self.files.stop,
                 *([self.levelzero.stop] if self.levelzero is not None else []),
                 *([self.devices.stop] if self.devices is not None else []),
                 self._keep_artifacts, self.sandbox.close])

    def _keep_artifacts(self) -> None:
        if self.artifacts is None:
            return
        logs = {"subject.log": self.subject.log_path,
                **{log: self.sandbox.path / "node" / log for log in ("kubelet.log", "containerd.log")}}  # a real node's
        root = self.artifacts_root or self.artifacts.parent
        said = artifacts.keep_check(self.artifacts, root, self.timeline, logs)
        dropped = getattr(self.subject, "log_dropped", 0)
        if dropped:
            said.insert(0, f"subject.log cut: the plugin's output past the log's {LOG_CAP_BYTES // 2**20} MiB cap, "
                           f"{megabytes(dropped)}, not kept")
        where = self.artifacts.relative_to(root) if self.artifacts.is_relative_to(root) else self.artifacts
        for line in said:
            # On the check, and as a run fact: the report says what its artifacts lack, and where.
            self.note(f"artifacts: {line}")
            before = self.facts.get("artifacts cut")
            self.facts["artifacts cut"] = f"{before}; {where}/{line}" if before else f"{where}/{line}"

    def _gather_facts(self) -> None:
        """Subject-level facts for the report: what it read of the fake hardware, what it left running."""
        if self.access is not None:
            self.access.stop()
            self.facts["fake hardware read"] = self.access.summary()
        if self.levelzero is not None:
            self.facts["Level-Zero sidecar calls"] = self.levelzero.summary() or "none: the plugin never asked it"
        if self.devices is not None and self.devices.nvml is not None:
            self.facts["NVML calls"] = self.devices.nvml.summary() or "none: the plugin never called NVML"
            self.facts["NVML library"] = self._nvml_library_fact()
        if self.devices is not None and not self.devices.char_devices:
            self.facts["device nodes"] = f"regular files: {self.devices.materializer.mknod_error or 'no mknod'}"
        self.cleanup += getattr(self.subject, "cleanup", list)()
        self.findings += getattr(self.subject, "limits_finding", list)()
        note = getattr(self.subject, "cgroup_note", None)
        if note:
            self.facts["cgroup"] = note
        self.cleanup += self._leftover_files()
        finding = getattr(self.subject, "detached_finding", lambda: None)()
        if finding:
            self.findings.append(finding)
        self.findings += getattr(self.subject, "exit_findings", list)()
        # What the fake kubelet noticed that the plugin did to it (messages over its limits, ...).
        for event in self.timeline.events():
            noticed = event.get("finding")
            if noticed and noticed not in self.findings:
                self.findings.append(noticed)

    def _nvml_library_fact(self) -> str:
        """Where the plugin's processes loaded libnvidia-ml.so.1 from, as their dynamic loader named it (the
        library logs it when loaded), or where it was offered when nothing loaded it."""
        assert self.devices is not None and self.devices.nvml is not None
        paths: dict[str, int] = {}
        for load in self.devices.nvml.loads():
            path = load.get("path", "?")
            paths[path] = paths.get(path, 0) + 1
        if not paths:
            offered = "; ".join(self.nvml_offered) or "nowhere"
            return f"never loaded (offered: {offered})"
        return "loaded from " + ", ".join(f"{p} ({n} process{'es' if n != 1 else ''})" for p, n in paths.items())

    def _leftover_files(self) -> list[str]:
        """Files the stopped plugin left in the device-plugins directory, which the sandbox removes."""
        kubelet_files = {"kubelet.sock", checkpoint.CHECKPOINT_NAME, checkpoint.SCRATCH_NAME}
        try:
            left = sorted(p.name for p in self.sandbox.plugin_dir.iterdir() if p.name not in kubelet_files)
        except OSError:
            return []
        if not left or self.subject.running:
            return []
        shown = ", ".join(left[:5]) + (f" and {len(left) - 5} more" if len(left) > 5 else "")
        return [f"removed {len(left)} file{'s' if len(left) != 1 else ''} the plugin left in the device-plugins "
                f"directory: {shown}"]

    def __enter__(self) -> DPEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- observations --------------------------------------------------------

    def is_mine(self, event: Event) -> bool:
        return event.source == self.spec.name

    def _exit_abort(self, event: Event) -> bool:
        # Only the current process's exit ends a wait: a restart's killed predecessor does not.
        return event.kind == "process.exit" and self.is_mine(event) and event.get("pid") == self.subject.pid

    def current_start(self) -> Event | None:
        """The start of the plugin's current (or last) process."""
        starts = self.timeline.find(lambda e: e.kind == "process.start" and self.is_mine(e))
        return starts[-1] if starts else None

    def _starting_up(self, since_ns: int) -> bool:
        """Whether a wait since `since_ns` under a shortened reaction bound began before the plugin's current
        process started: it then awaits that process's start-up, which the shortened bound does not cover (a
        loaded machine starts a process late; `--reaction-bound` must not read that as a plugin that never
        registers). Under the kubelet's own bounds, T counts from the start, as it always did; on kind, whose
        kubelet fakelet sees only through the API, there is no start-up event to wait for."""
        start = self.current_start()
        return self.profile.shortened and self.kind is None and start is not None and since_ns <= start.t_ns

    def wait_started(self, since_ns: int = 0) -> bool:
        """Whether a wait since `since_ns` awaits the plugin's start-up (`_starting_up`); if so, first that
        start-up: its first Register call, within the start-up bound. Raises WaitTimeout when none came, or
        the process exited first."""
        if not self._starting_up(since_ns):
            return False
        self._register_arrival(since_ns, None)
        return True

    def _register_arrival(self, since_ns: int, timeout_s: float | None) -> Event:
        """The first Register call to reach the kubelet since `since_ns`; within the start-up bound when the
        wait is for the plugin's start-up."""
        bound = timeout_s or (self.profile.startup_s if self._starting_up(since_ns) else self.profile.reaction_s)
        return self.timeline.wait_for(
            lambda e: e.kind == "kubelet.register_received", bound,
            "a Register call on kubelet.sock", since_ns, abort=self._exit_abort, relevant=REGISTRATION_KINDS)

    def wait_register_call(self, since_ns: int = 0, timeout_s: float | None = None) -> Event:
        """The kubelet's answer to the first Register call to reach it, accepted or not."""
        arrived = self._register_arrival(since_ns, timeout_s)
        # Inside Register the kubelet dials (its 10 s) and calls GetDevicePluginOptions (bounded by T).
        answer = self.timeline.wait_for(
            lambda e: e.kind == "kubelet.register" and e.get("call") == arrived.get("call")
            and e.get("instance") == arrived.get("instance"),
            self.profile.dial_timeout_s + self.profile.reaction_s, "the kubelet's answer to that Register",
            arrived.t_ns, relevant=REGISTRATION_KINDS)
        expect(answer.get("bytes") is None, "a Register call the kubelet can receive",
               f"{answer.get('error')} at {self.at(answer)}")
        return answer

    def wait_registered(self, since_ns: int = 0, timeout_s: float | None = None,
                        instance: int | None = None) -> Event:
        """A Register the kubelet accepted, for the subject's resource; with `instance`, one that kubelet
        instance accepted (a late Register the previous instance accepted just before it stopped is legal,
        and is not the re-registration a restart asks for)."""
        def permanent(e: Event) -> bool:
            return self._exit_abort(e) or (
                e.kind == "kubelet.register" and not e.get("accepted")
                and any(p in e.get("error", "") for p in PERMANENT_REJECTIONS))
        which = f" with kubelet instance {instance}" if instance is not None else ""
        # The reaction bound runs from the process's first Register call, not from its start.
        start_up = timeout_s is None and self.wait_started(since_ns)
        reg = self.timeline.wait_for(
            lambda e: e.kind == "kubelet.register" and bool(e.get("accepted"))
            and (instance is None or e.get("instance") == instance),
            timeout_s or self.profile.reaction_s, f"an accepted registration of {self.spec.resource}{which}",
            since_ns, abort=permanent, relevant=REGISTRATION_KINDS)
        if since_ns:
            self.timed(reg, since_ns, "registered", self.profile.startup_s if start_up else None)
        return reg

    def settled(self, reg: Event, since_ns: int | None = None) -> Listing:
        """The plugin's device list as the kubelet holds it once it stops changing (harness/world/listing.py)."""
        # Messages are keyed by the registration's endpoint; the first may come before the
        # Register call's own event is recorded (the kubelet dials and streams inside Register).
        since = 0 if since_ns is None else since_ns
        listing = wait_settled(self.timeline, reg.get("endpoint_id"), self.profile.reaction_s, since,
                               abort=self._exit_abort)
        if listing.event is not None:
            self.timed(listing.event, since or reg.t_ns, "the device list settled")
        return listing

    def registered_and_listed(self, since_ns: int = 0, instance: int | None = None) -> tuple[Event, Listing]:
        reg = self.wait_registered(since_ns, instance=instance)
        return reg, self.settled(reg)

    def need_devices(self, listing: Listing, count: int = 1, healthy: bool = True) -> list[str]:
        """The listed (healthy) device IDs, or end the check as not exercised when there are too few."""
        ids = listing.healthy if healthy else listing.ids
        odd = sorted({h for h in listing.devices.values() if h not in (HEALTHY, UNHEALTHY)})
        if healthy and len(ids) < count and odd:
            # Not a lack of devices: health values the kubelet does not know count as unhealthy.
            raise AssertionError(f"expected device health 'Healthy' or 'Unhealthy'; saw {odd} in "
                                 f"{listing.describe()}: the kubelet counts those devices unhealthy")
        if len(ids) < count:
            what = "healthy devices" if healthy else "devices"
            not_exercised(f"the plugin listed {len(ids)} {what} ({listing.describe()}); this check needs {count}")
        return ids

    def timed(self, event: Event, since_ns: int, what: str, bound_s: float | None = None) -> None:
        """Note a reaction slower than the profile's budget (it passed: it was within `bound_s`, by default the
        reaction bound)."""
        took = (event.t_ns - max(since_ns, self.timeline.origin_ns)) / 1e9
        bound_s = bound_s or self.profile.reaction_s
        if self.profile.slow(took):
            self.note(f"slow: {what} after {took:.1f}s, within the kubelet's {bound_s:g}s bound "
                      f"(the {self.profile.name} profile's budget is {self.profile.budget_s:g}s)")

    def exit_report(self) -> str:
        """When the plugin exited on its own during the check: its exit and its last output lines."""
        exits = [e for e in self.timeline.events(kind="process.exit") if self.is_mine(e)]
        signalled = {e.get("pid") for e in self.timeline.events(kind="process.signal") if self.is_mine(e)}
        own = [e for e in exits if e.get("pid") not in signalled]
        if not own:
            return ""
        first = own[0]
        judged = self.plugin_exit(first)
        # A wrapper that daemonized the plugin exits 0 at once: what counts is the exit of what it left.
        what = judged[1] if judged is not None and "its wrapper" in judged[1] else \
            f"the plugin exited with code {first.get('returncode')} at {self.at(first)}"
        return f"{what}; its last output:\n{self.last_output()}"

    def failure_output(self, failure: BaseException | None) -> str:
        """What a failed check's detail adds of the plugin: its exit and last output when it exited; its last
        output when the check waited in vain (a WaitTimeout, raised or behind the failure), as the plugin may
        have said why ("Retrying in 30s")."""
        exited = self.exit_report()
        if exited:
            return exited
        cause = failure
        while cause is not None and not isinstance(cause, WaitTimeout):
            cause = cause.__cause__ or cause.__context__
        return f"the plugin's last output:\n{self.last_output()}" if cause is not None else ""

    def last_output(self) -> str:
        """The plugin's last output lines, stdout and stderr as its log has them across its starts (a start that
        said nothing hides nothing an earlier one said), indented and bounded for a detail."""
        newest = self.subject.log_tail(LAST_OUTPUT_LINES).strip()  # drains the plugin's pipe into the log first
        text = logtail.tail(self.subject.log_path, LAST_OUTPUT_LINES, LAST_OUTPUT_BYTES).strip()
        if newest and not text.endswith(newest.splitlines()[-1]):
            # Past the log's cap the newest output is only in memory: it is the one that tells.
            text = "\n".join(logtail.cut_lines(newest, LAST_OUTPUT_BYTES))
        return "\n".join("    " + line[:OUTPUT_LINE_CHARS] for line in text.splitlines()) if text else "    (no output)"

    # -- the process that serves, not its wrapper -----------------------------------

    def _follow_server(self) -> None:
        """Find the socket's owner whenever a socket appears, a Register arrives or a wrapper exits: while the
        serving process lives (a daemon may exit right after a rejected Register)."""
        index = 0
        while not self._closing.is_set():
            events = self.timeline.after(index, SERVER_FOLLOW_WAKE_S)
            index += len(events)
            if any(self._may_move_server(e) for e in events):
                self.server()

    def _may_move_server(self, event: Event) -> bool:
        """Whether `event` may mean another process serves the socket now. Of the plugin dir's files only a socket
        appearing counts: the kubelet's checkpoint, written on every admission, removal and device list, made each
        write look the owner up (/proc/net/unix, the process tree and two scans of the whole timeline: 0.6 ms, and
        1.3 ms at 5,000 events), the GIL taken from the admission beside it (P2's added latency nearly doubled)."""
        return ((event.kind == "file.created" and bool(event.get("socket")))
                or event.kind == "kubelet.register_received"
                or (event.kind == "process.main_exit" and self.is_mine(event)))

    def _socket_name(self) -> str | None:
        if self.spec.socket:
            return self.spec.socket
        received = self.timeline.find(lambda e: e.kind == "kubelet.register_received" and e.get("endpoint"))
        if received:
            return Path(str(received[-1].get("endpoint"))).name
        created = self.timeline.find(lambda e: e.kind == "file.created" and e.get("socket")
                                     and e.get("name") != "kubelet.sock")
        return str(created[-1].get("name")) if created else None

    def server(self) -> dict[str, Any] | None:
        """The subject's process serving its socket now ({pid, ns_pid, cmd, main}); put on the timeline as
        `subject.server` when it is news."""
        owner = getattr(self.subject, "socket_owner", None)
        name = self._socket_name()
        found = owner(name) if owner is not None and name else None
        if found is not None:
            last = self.timeline.find(lambda e: e.kind == "subject.server")
            if not last or last[-1].get("pid") != found["pid"]:
                self.timeline.record("subject.server", self.spec.name, socket=name, **found)
        return found

    def _server_ns_pid(self) -> int | None:
        """The namespace pid of the process a wrapper left that serves the socket, once its owner was seen."""
        servers = [e for e in self.timeline.events(kind="subject.server") if not e.get("main")]
        return servers[-1].get("ns_pid") if servers else None

    def plugin_exit(self, event: Event) -> tuple[int, str] | None:
        """(exit code, what exited) when `event` is the exit of the process judged as the plugin: the one that
        serves the socket, not a wrapper that started it and exited; None for any other event."""
        if not self.is_mine(event) or event.kind not in ("process.main_exit", "process.orphan_exit", "process.exit"):
            return None
        main_exits = [e for e in self.timeline.events(kind="process.main_exit")
                      if self.is_mine(e) and e.t_ns <= event.t_ns]
        code = event.get("returncode")
        if not main_exits:  # uncontained: no helper reports, the exit is the main process's
            return (code, f"the plugin exited with code {code}") if event.kind == "process.exit" else None
        wrapper = main_exits[-1]
        left = bool(wrapper.get("detached")) and not wrapper.get("signalled")
        if event.kind == "process.main_exit":
            servers = self.timeline.events(kind="subject.server")
            serves = not left or (bool(servers) and bool(servers[-1].get("main")))
            return (code, f"the plugin exited with code {code}") if serves else None
        if not left:
            return None  # judged at the main process's exit
        if event.kind == "process.orphan_exit":
            if event.get("ns_pid") != self._server_ns_pid():
                return None
            return code, self._wrapped_exit(wrapper, event, "the server its wrapper left")
        # The namespace emptied: the server's exit if it was seen, else the last process the wrapper left.
        orphans = [e for e in self.timeline.events(wrapper.t_ns, kind="process.orphan_exit")
                   if self.is_mine(e) and e.t_ns <= event.t_ns]
        if not orphans:
            return None
        server = [e for e in orphans if e.get("ns_pid") == self._server_ns_pid()]
        last = (server or orphans)[-1]
        what = "the server its wrapper left" if server else "the last process its wrapper left"
        return last.get("returncode"), self._wrapped_exit(wrapper, last, what)

    def _wrapped_exit(self, wrapper: Event, exit_: Event, what: str) -> str:
        """Both exits, the server's (the one judged) and its wrapper's, for a detail."""
        ns_pid = exit_.get("ns_pid")
        known = [e for e in self.timeline.events(kind="subject.server") if e.get("ns_pid") == ns_pid]
        left = [d for d in wrapper.get("detached") or [] if d.get("ns_pid") == ns_pid]
        who = known[-1] if known else (left[0] if left else None)
        name = f"pid {who.get('pid')}: {who.get('cmd')}" if who is not None else f"pid {ns_pid} in its namespace"
        return (f"{what} ({name}) exited with code {exit_.get('returncode')} at {self.at(exit_)}; the wrapper (the "
                f"main process) had exited {wrapper.get('returncode')} at {self.at(wrapper)}")

    def measure(self, what: str, event: Event, since_ns: int) -> float:
        """Keep how long `what` took, from `since_ns` to `event`, for the report."""
        took = round((event.t_ns - since_ns) / 1e9, 3)
        self.measured[what] = took
        return took

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    # -- the fake hardware as the plugin names it ----------------------------------

    def hardware(self) -> list[HardwareDevice]:
        if self.devices is None:
            return [HardwareDevice(d["id"]) for d in self.inventory or []]
        out = []
        for d in self.devices.devices():
            if not d.present:
                continue
            paths = [str(self.devices.materializer.node_path(d))]
            paths += [str(p) for p in self.devices.materializer.drm_node_paths(d)]
            out.append(HardwareDevice(d.id, tuple(paths), (d.uuid, d.serial, d.pci_address)))
        return out

    def device_map(self, reg: Event, listing: Listing) -> DeviceMap:
        """Plugin device ID <-> inventory device (harness/world/devicemap.py), learned once per check and reported."""
        if self._device_map is None:
            def allocate(device_id: str) -> Any:
                with self.probe(reg) as probe:
                    return probe.allocate([[device_id]]).container_responses[0]
            explicit = getattr(self.spec, "device_map", None)
            self._device_map = map_devices(listing.ids, self.hardware(), explicit, allocate, self.spec.opaque_ids)
            self.facts["device mapping"] = self._device_map.describe()
        return self._device_map

    @property
    def mapping(self) -> DeviceMap:
        """The mapping device_map() learned in this check (empty before)."""
        return self._device_map or DeviceMap()

    def drives(self, capability: str) -> bool:
        """Whether fakelet can drive `capability` (health, temperature, hotplug) for this plugin.

        Yes when the subject says the plugin observes it, or, when the subject declares nothing, when a surface
        shows the plugin read that source of the fake hardware (then it is held to it). Known now, without waiting.
        """
        if self.devices is None:
            return False
        if capability in self.spec.observes:
            return True
        if self.spec.observes_from:
            return False  # what the subject declares wins over what fakelet would infer
        via = self.read_via(capability)
        if via is not None:
            self.note(READ_NOTES[via].format(capability=capability))
        return via is not None

    def read_via(self, capability: str, surface: str | None = None) -> str | None:
        """The surface ("levelzero", "nvml", "sysfs") through which the plugin has read `capability` so far,
        or None; with `surface`, only that one counts."""
        if self.devices is None:
            return None
        sources: dict[str, Callable[[], bool]] = {}
        if self.levelzero is not None:
            sources["levelzero"] = lambda: self.levelzero is not None and self.levelzero.reads(capability)
        if self.devices.nvml is not None:
            sources["nvml"] = lambda: self.devices is not None and self.devices.nvml is not None \
                and self.devices.nvml.reads(capability)
        if self.access is not None:
            trace = self.access
            sources["sysfs"] = {"health": trace.reads_health_source, "temperature": trace.reads_temperature_source,
                                "hotplug": lambda: bool(trace.reads())}[capability]
        return next((name for name, read in sources.items() if (surface is None or name == surface) and read()),
                    None)

    def coverage_window_s(self) -> float:
        """How long coverage waits for the plugin's first read of a source: T, or two of the poll periods its
        subject declares when that is shorter (a client that connects in the background polls a period late)."""
        poll = self.spec.poll_s
        if poll is None:
            return self.profile.reaction_s
        return min(self.profile.reaction_s, COVERAGE_POLLS * poll)

    def coverage_window(self) -> str:
        """The coverage wait, said with where it comes from (for a not-exercised detail)."""
        window, poll = self.coverage_window_s(), self.spec.poll_s
        if poll is not None and window < self.profile.reaction_s:
            return f"{window:g}s ({COVERAGE_POLLS} of its {poll:g}s poll periods, from {self.spec.where('backend')})"
        return f"{window:g}s (T, the kubelet's reaction bound)"

    def await_read(self, capability: str, surface: str | None = None, since_ns: int | None = None) -> str | None:
        """Wait for the plugin's first read of `capability` (through `surface`, or any), up to the coverage window
        counted from `since_ns` (default now); it ends at once on that read, or when the plugin exits.
        The surface it read through, or None."""
        scan_from = self.now()
        via = self.read_via(capability, surface)
        if via is not None:
            return via
        start = scan_from if since_ns is None else since_ns
        remaining = (start - scan_from) / 1e9 + self.coverage_window_s()
        if remaining > 0:
            # Judged by the event alone: the wait holds the timeline's lock, which a surface's own lock
            # must never be taken under (the sidecar records while holding its lock).
            self.timeline.wait_quiet(lambda e: self._exit_abort(e) or reads_event(e, capability, surface),
                                     remaining, scan_from)
        return self.read_via(capability, surface)

    def read_summary(self) -> str:
        """What the plugin read of the fake hardware, through every surface it has: sysfs files, NVML calls,
        Level-Zero sidecar calls."""
        parts = []
        if self.devices is not None and self.devices.nvml is not None:
            parts.append(f"its NVML calls: {self.devices.nvml.summary() or 'none'}")
        if self.levelzero is not None:
            parts.append(f"its Level-Zero sidecar calls: {self.levelzero.summary() or 'none'}")
        read = self.access.summary() if self.access is not None else {}
        files = sorted(f for group in read.values() for f in group)
        if files:
            parts.append(f"files it read: {', '.join(files[:6])}{' ...' if len(files) > 6 else ''}")
        elif not parts:
            parts.append("it read none of the fake hardware's files")
        else:
            parts.append("no fake hardware file")
        return "; ".join(parts)

    def require_drive(self, capability: str, since_ns: int | None = None) -> None:
        """Go on when fakelet drives `capability` for this plugin; else, once the coverage window from `since_ns`
        (default now) has passed without the plugin reading it, end the check as not exercised."""
        if self.drives(capability):
            return
        if self.devices is None:
            not_exercised("fakelet drives no fake hardware for this subject (give it --inventory or a backend)")
        if self.spec.observes_from:
            declared = ", ".join(self.spec.observes) or "nothing"
            not_exercised(f"the subject declares it does not watch {capability} ({self.spec.observes_from}: "
                          f"[{declared}])")
        self.await_read(capability, since_ns=since_ns)
        if self.drives(capability):
            return
        not_exercised(f"the plugin read no {capability} source that fakelet drives in the {self.coverage_window()} "
                      f"fakelet waited for its first read ({self.read_summary()})")

    def require_surface_read(self, capability: str, surface: str, what: str) -> None:
        """As require_drive, through one vendor surface ("nvml", "levelzero"): `what` names the missing read."""
        if self.await_read(capability, surface) is None:
            not_exercised(f"{what} in the {self.coverage_window()} fakelet waited for its first read "
                          f"({self.read_summary()})")

    def thermal(self) -> tuple[float, float]:
        """The plugin's overtemperature limit and hysteresis (C), noted for the check and kept as a fact, with
        where the limit came from: a check heats past the plugin's own limit, never past fakelet's."""
        limit = self.spec.thermal_limit()
        self.note(f"overtemperature limit: {limit}")
        self.facts["overtemperature limit"] = limit
        return self.spec.thermal

    def any_inventory_device(self, reg: Event, listing: Listing) -> str:
        """An inventory device to change: a mapped one if any, else the first present one."""
        mapping = self.device_map(reg, listing)
        for plugin_id in listing.healthy:
            if mapping.inventory_id(plugin_id) is not None:
                return mapping.pairs[plugin_id]
        return self.hardware()[0].id

    def probe(self, register: Event) -> ProbeClient:
        """A direct client to the endpoint the plugin registered, for calls the kubelet would not make."""
        from harness.kubelet.devicemanager import go_join
        return ProbeClient(go_join(self.sandbox.plugin_dir, register.get("endpoint")), self.timeline)

    def now(self) -> int:
        return self.timeline.now()

    @property
    def wire_recorded(self) -> bool:
        """Whether the kubelet's side of the plugin wire is on the timeline: the fake kubelet's own record, or the
        relay's in front of a real kubelet (harness/node/relay)."""
        if isinstance(self.node, FakeNode):
            return True
        return getattr(getattr(self.node, "shell", None), "relay", None) is not None

    @staticmethod
    def allocatable_in(event: Event, resource: str) -> int | None:
        """The allocatable count of `resource` an event reports: the fake kubelet's device change
        (`kubelet.devices`) or a real kubelet's Node status (`node.status`); None for any other event."""
        if event.kind == "kubelet.devices" and event.get("resource") == resource:
            return event.get("allocatable")
        if event.kind == "node.status":
            return ((event.get("resources") or {}).get(resource) or {}).get("allocatable")
        return None

    def at(self, event: Event) -> str:
        """When an event happened, relative to the start of this check."""
        return f"+{(event.t_ns - self.timeline.origin_ns) / 1e9:.3f}s"

    def wait_file(self, name: str, created: bool, since_ns: int, timeout_s: float | None = None) -> Event:
        kind = "file.created" if created else "file.deleted"
        return self.timeline.wait_for(
            lambda e: e.kind == kind and e.get("name") == name, timeout_s or self.profile.reaction_s,
            f"{name} to be {'created' if created else 'deleted'} in the device-plugins directory",
            since_ns, relevant=("file.created", "file.deleted", "kubelet.register", "process.exit"))

    def outage(self, seconds: float) -> None:
        """Hold a fault for a fixed time (the kubelet stays down): a duration, not a sync point."""
        self.timeline.record("fault.outage", "harness", seconds=seconds)
        self.timeline.wait_quiet(lambda e: False, seconds)
