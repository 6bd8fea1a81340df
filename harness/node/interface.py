"""The Node interface the suites talk to, and the types it speaks in.

Checks only use `Node`: restart the kubelet, read capacity and allocatable,
admit a pod, read its devices. `FakeNode` (fake.py) implements it with this
harness's kubelet, `ClusterNode` (real/cluster.py) with a real one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from harness.instruments.timeline import Event
from harness.kubelet.devicemanager import AdmissionError, ContainerAllocation, DeviceManager
from harness.kubelet.dramanager import PreparedClaim, PrepareError, UnprepareError
from harness.node.real.view import ContainerView

if TYPE_CHECKING:
    from harness.controlplane.client import KubeClient

__all__ = ["AdmissionError", "ContainerAllocation", "Node", "NodeApi", "PrepareError", "PreparedClaim",
           "UnprepareError"]


@dataclass(frozen=True)
class NodeApi:
    """Where the fake kubelet is a Node: its API server and its node name."""

    client: KubeClient
    node_name: str


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
    def container_view(self, pod: str) -> ContainerView: ...
    def delete_pod(self, pod: str) -> None: ...
    def wait_resource(self, resource: str, test: Callable[[int | None, int | None], bool], since_ns: int,
                      timeout_s: float, awaiting: str) -> Event: ...
