"""The fake-kubelet backend of the Node interface (harness.node.interface).

`FakeNode` implements `Node` with this harness's kubelet.

With a `registry_dir`, each kubelet instance also runs a plugin watcher on it
(handlers DevicePlugin and DRAPlugin) and a DRA manager speaking the DRA
services of `kubelet_version`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from harness.instruments.timeline import Event, Timeline
from harness.kubelet.devicemanager import (
    AdmissionError,
    ContainerAllocation,
    DeviceManager,
)
from harness.kubelet.dramanager import DRAManager, KubeletWouldNotStart, PreparedClaim
from harness.kubelet.nodestatus import NodeStatus
from harness.kubelet.pluginwatcher import DEVICE_PLUGIN, DRA_PLUGIN, DevicePluginHandler, PluginWatcher
from harness.kubelet.podresources import PodResourcesServer
from harness.kubelet.podresources import socket_path as podresources_socket
from harness.kubelet.podresources_view import NodeResourcesView
from harness.kubelet.podworker import PodWorker
from harness.kubelet.versions import KubeletVersion
from harness.kubelet.versions import default as default_kubelet_version
from harness.node.interface import NodeApi
from harness.node.real.view import ContainerView, runtime_refusals, view_of_responses
from harness.spec.profiles import Profile

if TYPE_CHECKING:
    pass

class FakeNode:
    """fakelet's kubelet. Each start is a new kubelet instance sharing the sandbox."""

    def __init__(self, plugin_dir: Path, state_dir: Path, timeline: Timeline, profile: Profile, *,
                 registry_dir: Path | None = None, kubelet_version: KubeletVersion | None = None,
                 translate: Callable[[str], str] | None = None, dra_health: bool | None = None,
                 wipe_slices: Callable[[str], None] | None = None, api: NodeApi | None = None,
                 cdi_dir: Path | None = None) -> None:
        """`api` makes each kubelet instance a Node in that API server, with a pod worker for its Pods;
        `translate` maps a path a plugin names (its mount namespace's view) to the harness's;
        `dra_health` forces the ResourceHealthStatus gate (None: the release's default);
        `wipe_slices(driver)` deletes the node's ResourceSlices of a driver ("" = all) when upstream would;
        `cdi_dir`, where the node's runtime reads CDI specs: a container whose CDI devices no spec there defines is
        refused, as containerd 2 refuses it (None: CDI devices are not looked at)."""
        self.plugin_dir, self.timeline, self.profile = Path(plugin_dir), timeline, profile
        self.state_dir = Path(state_dir)
        self.registry_dir = Path(registry_dir) if registry_dir is not None else None
        self.kubelet_version = kubelet_version or default_kubelet_version()
        self.translate, self.dra_health, self.wipe_slices = translate, dra_health, wipe_slices
        self.cdi_dir = Path(cdi_dir) if cdi_dir is not None else None
        self.manager: DeviceManager | None = None
        self.dra: DRAManager | None = None
        self.watcher: PluginWatcher | None = None
        self.api = api
        self.node_status: NodeStatus | None = None
        self.pod_worker: PodWorker | None = None
        self.pod_resources: PodResourcesServer | None = None
        self._admitted: dict[str, list[ContainerAllocation]] = {}

    @property
    def kubelet_socket(self) -> Path:
        return self.plugin_dir / "kubelet.sock"

    @property
    def pod_resources_socket(self) -> Path:
        return podresources_socket(self.plugin_dir.parent)

    @property
    def running(self) -> bool:
        return self.manager is not None

    @property
    def instance(self) -> int | None:
        return self.manager.instance if self.manager is not None else None

    def start_kubelet(self, arm: Callable[[DeviceManager], object] | None = None, *,
                      arm_dra: Callable[[DRAManager], object] | None = None,
                      arm_watcher: Callable[[PluginWatcher], object] | None = None) -> None:
        """Start a kubelet instance; `arm`, `arm_dra`, `arm_watcher` may set up faults before it serves."""
        if self.manager is not None:
            return
        manager = DeviceManager(self.plugin_dir, self.state_dir, self.timeline, self.profile, self.kubelet_version)
        if arm is not None:
            arm(manager)
        self.manager = manager.start()
        if self.registry_dir is None:
            self._start_api_agents()
            return
        # One fault plan per kubelet instance, as on the real node's wire: a hold armed on the kubelet applies to
        # the Register it serves and to the DRA calls it makes alike.
        dra = DRAManager(self.state_dir, self.timeline, self.profile, self.kubelet_version, health=self.dra_health,
                         wipe_slices=self.wipe_slices, translate=self.translate, kubelet_instance=manager.instance,
                         faults=manager.faults)
        if arm_dra is not None:
            arm_dra(dra)
        try:
            self.dra = dra.start()
        except KubeletWouldNotStart:
            # The whole kubelet fails to start, its device manager included.
            manager.stop()
            self.manager = None
            raise
        watcher = PluginWatcher(self.registry_dir, self.timeline, self.profile,
                                {DEVICE_PLUGIN: DevicePluginHandler(manager), DRA_PLUGIN: dra}, manager.instance)
        if arm_watcher is not None:
            arm_watcher(watcher)
        # Last: its first scan registers the plugins already there, into managers that serve.
        self.watcher = watcher.start()
        self._start_api_agents()

    def _extended_resources(self) -> dict[str, tuple[int, int]]:
        manager = self.manager
        if manager is None:
            return {}
        out = {}
        for resource in manager.resources():
            capacity, allocatable = manager.capacity(resource), manager.allocatable(resource)
            if capacity is not None:
                out[resource] = (capacity, allocatable or 0)
        return out

    def _start_api_agents(self) -> None:
        # The kubelet's root dir holds device-plugins/ and pod-resources/ side by side.
        view = NodeResourcesView(lambda: self.manager, lambda: self.dra)
        self.pod_resources = PodResourcesServer(podresources_socket(self.plugin_dir.parent), view,
                                                self.timeline).start()
        if self.api is None:
            return
        self.node_status = NodeStatus(self.api.client, self.api.node_name, self.timeline,
                                      self._extended_resources).start()
        self.pod_worker = PodWorker(self.api.client, self.api.node_name, self.timeline, self.profile,
                                    lambda: self.dra).start()

    def stop_kubelet(self, remove_socket: bool = False) -> None:
        # An answer a scenario holds never reaches a kubelet that goes away: its call fails now, before the pod
        # worker below waits for the sync it blocks.
        if self.manager is not None:
            self.manager.faults.end_answers()
        # The pod worker first: no pod sync may start in a kubelet that is going away.
        for agent in (self.pod_worker, self.node_status, self.pod_resources):
            if agent is not None:
                agent.stop()
        self.pod_worker = self.node_status = self.pod_resources = None
        # The watcher next, so no registration lands in a manager that is going away.
        watcher, self.watcher = self.watcher, None
        if watcher is not None:
            watcher.stop()
        dra, self.dra = self.dra, None
        if dra is not None:
            dra.stop()
        manager, self.manager = self.manager, None
        if manager is not None:
            manager.stop()
        if remove_socket:
            self.kubelet_socket.unlink(missing_ok=True)
            self.timeline.record("fault.kubelet_socket_removed", "harness")

    def restart_kubelet(self, arm: Callable[[DeviceManager], object] | None = None, *,
                        arm_dra: Callable[[DRAManager], object] | None = None,
                        arm_watcher: Callable[[PluginWatcher], object] | None = None) -> None:
        """Stop, then start: the new instance deletes the sockets and recreates kubelet.sock;
        its plugin watcher re-scans plugins_registry and its DRA manager reloads dra_manager_state."""
        self.timeline.record("fault.kubelet_restart", "harness")
        self.stop_kubelet()
        self.start_kubelet(arm, arm_dra=arm_dra, arm_watcher=arm_watcher)

    def _require_dra(self) -> DRAManager:
        if self.dra is None:
            raise RuntimeError("the fake kubelet is not running with a plugins registry (no DRA manager)")
        return self.dra

    def prepare_pod(self, pod: dict, claims: list[dict]) -> dict[str, PreparedClaim]:
        """PrepareResources for a pod's allocated, reserved claims (one pod sync; raises PrepareError)."""
        return self._require_dra().prepare_pod(pod, claims)

    def unprepare_pod(self, pod: dict | str) -> None:
        self._require_dra().unprepare_pod(pod)

    def claim_resources_status(self, pod: str) -> dict[str, list[dict]]:
        """The DRA part of the pod's allocatedResourcesStatus, by "claim:<claim>/<request>"."""
        return self._require_dra().allocated_resources_status(pod)

    def _require(self) -> DeviceManager:
        if self.manager is None:
            raise RuntimeError("the fake kubelet is not running")
        return self.manager

    def capacity(self, resource: str) -> int | None:
        return self._require().capacity(resource)

    def allocatable(self, resource: str) -> int | None:
        return self._require().allocatable(resource)

    def devices(self, resource: str) -> dict[str, str]:
        return self._require().devices(resource)

    def admit_pod(self, pod: str, requests: dict[str, int], container: str = "main") -> list[ContainerAllocation]:
        manager = self._require()
        allocations = [manager.admit(pod, container, resource, n) for resource, n in requests.items()]
        self._admitted.setdefault(pod, []).extend(allocations)
        return allocations

    def container_view(self, pod: str) -> ContainerView:
        """What this kubelet hands the runtime for the pod's container: the Allocate responses merged
        (upstream devicemanager DeviceRunContainerOptions), device nodes by the major:minor of their host path.

        What containerd and runc would refuse of it (view.py runtime_refusals) means no container:
        AdmissionError, as the real node reports CreateContainerError."""
        responses = [a.response for a in self._admitted.get(pod, [])]
        refused = runtime_refusals(responses, self.cdi_dir)
        if refused:
            raise AdmissionError(f"CreateContainerError: the runtime refuses the container: {'; '.join(refused)}")
        return view_of_responses(responses)

    def delete_pod(self, pod: str) -> None:
        self._admitted.pop(pod, None)
        if self.manager is not None:
            self.manager.remove_pod(pod)

    def wait_resource(self, resource: str, test: Callable[[int | None, int | None], bool], since_ns: int,
                      timeout_s: float, awaiting: str) -> Event:
        """The first change after `since_ns`, by the running kubelet instance, that leaves capacity and
        allocatable of `resource` passing `test`."""
        instance = self.instance
        return self.timeline.wait_for(
            lambda e: e.kind == "kubelet.devices" and e.get("resource") == resource
            and e.get("instance") == instance and test(e.get("capacity"), e.get("allocatable")),
            timeout_s, awaiting, since_ns, relevant=("kubelet.devices", "kubelet.register", "kubelet.start",
                                                     "kubelet.stop", "kubelet.stream_end"))

    def start_pod(self, pod: str) -> None:
        """Start the pod's containers: the kubelet calls PreStartContainer where required."""
        self._require().start_containers(pod)

    def pod_devices(self, pod: str) -> dict[str, list[str]]:
        return self._require().pod_devices(pod)

    def allocated_resources_status(self, pod: str) -> dict[str, list[dict]]:
        """The pod's containers' allocatedResourcesStatus, by container name."""
        return self._require().allocated_resources_status(pod)

    def close(self) -> None:
        self.stop_kubelet()
