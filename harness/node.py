"""The Node interface the suites talk to, and its fake-kubelet backend.

Checks only use `Node`: restart the kubelet, read capacity and allocatable,
admit a pod, read its devices. `FakeNode` implements it with this harness's
kubelet; a real-kubelet backend can implement the same protocol later.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from harness.kubelet.devicemanager import (
    AdmissionError,
    ContainerAllocation,
    DeviceManager,
)
from harness.profiles import Profile
from harness.timeline import Timeline

__all__ = ["AdmissionError", "ContainerAllocation", "FakeNode", "Node"]


class Node(Protocol):
    def start_kubelet(self, arm: Callable[[DeviceManager], object] | None = None) -> None: ...
    def stop_kubelet(self, remove_socket: bool = False) -> None: ...
    def restart_kubelet(self, arm: Callable[[DeviceManager], object] | None = None) -> None: ...
    def capacity(self, resource: str) -> int | None: ...
    def allocatable(self, resource: str) -> int | None: ...
    def admit_pod(self, pod: str, requests: dict[str, int], container: str = "main") -> list[ContainerAllocation]: ...
    def start_pod(self, pod: str) -> None: ...
    def pod_devices(self, pod: str) -> dict[str, list[str]]: ...
    def allocated_resources_status(self, pod: str) -> dict[str, list[dict]]: ...


class FakeNode:
    """fakelet's kubelet. Each start is a new kubelet instance sharing the sandbox."""

    def __init__(self, plugin_dir: Path, state_dir: Path, timeline: Timeline, profile: Profile) -> None:
        self.plugin_dir, self.timeline, self.profile = Path(plugin_dir), timeline, profile
        self.state_dir = Path(state_dir)
        self.manager: DeviceManager | None = None

    @property
    def kubelet_socket(self) -> Path:
        return self.plugin_dir / "kubelet.sock"

    @property
    def running(self) -> bool:
        return self.manager is not None

    def start_kubelet(self, arm: Callable[[DeviceManager], object] | None = None) -> None:
        """Start a kubelet instance; `arm` may set up its faults before it serves."""
        if self.manager is None:
            manager = DeviceManager(self.plugin_dir, self.state_dir, self.timeline, self.profile)
            if arm is not None:
                arm(manager)
            self.manager = manager.start()

    def stop_kubelet(self, remove_socket: bool = False) -> None:
        manager, self.manager = self.manager, None
        if manager is not None:
            manager.stop()
        if remove_socket:
            self.kubelet_socket.unlink(missing_ok=True)
            self.timeline.record("fault.kubelet_socket_removed", "harness")

    def restart_kubelet(self, arm: Callable[[DeviceManager], object] | None = None) -> None:
        """Stop, then start: the new instance deletes the sockets and recreates kubelet.sock."""
        self.timeline.record("fault.kubelet_restart", "harness")
        self.stop_kubelet()
        self.start_kubelet(arm)

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
        return [manager.admit(pod, container, resource, n) for resource, n in requests.items()]

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
