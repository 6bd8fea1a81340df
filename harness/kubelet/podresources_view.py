"""What the fake kubelet answers on its PodResources socket: its managers' view of pods and devices.

Upstream builds the answer from the pod manager and the device and DRA
managers (kubelet.go kubeletPodsProvider, cm.GetDevices, cm.GetDynamicResources).
The fake kubelet has the same three sources: the device manager's container
assignments, the DRA manager's prepared claims and the pods it prepared them
for. A device-plugin pod admitted by hand is known by the name the check gave it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from harness.kubelet.podresources import ClaimResourceEntry, ContainerEntry, DeviceEntry, DynamicEntry, PodEntry

if TYPE_CHECKING:
    from harness.kubelet.devicemanager import DeviceManager
    from harness.kubelet.dramanager import DRAManager

MAIN_CONTAINER = "main"  # the one container of the harness's DRA pods (controlplane/scheduler.py)


class NodeResourcesView:
    """A PodResourcesProvider over one kubelet instance's managers."""

    def __init__(self, devices: Callable[[], DeviceManager | None], dra: Callable[[], DRAManager | None]) -> None:
        self.devices, self.dra = devices, dra

    def pods(self) -> list[PodEntry]:
        pods: dict[str, PodEntry] = {}
        containers: dict[tuple[str, str], ContainerEntry] = {}

        def container(uid: str, name: str, namespace: str, cname: str) -> ContainerEntry:
            pod = pods.setdefault(uid, PodEntry(name, namespace))
            if (uid, cname) not in containers:
                containers[(uid, cname)] = ContainerEntry(cname)
                pod.containers.append(containers[(uid, cname)])
            return containers[(uid, cname)]

        manager = self.devices()
        for entry in manager.allocations() if manager is not None else []:
            container(entry.pod_uid, entry.pod_uid, "", entry.container).devices.append(
                DeviceEntry(entry.resource, list(entry.device_ids)))
        dra = self.dra()
        if dra is not None:
            known = dra.pods()
            for claim in dra.claims().values():
                resources = [ClaimResourceEntry(list(d.cdi_ids), driver, d.pool, d.device)
                             for driver, devices in sorted(claim.devices.items()) for d in devices]
                for uid in sorted(claim.pods):
                    pod = known.get(uid, {"name": uid, "namespace": claim.namespace})
                    container(uid, pod.get("name", uid), pod.get("namespace", ""), MAIN_CONTAINER) \
                        .dynamic_resources.append(DynamicEntry(claim.name, claim.namespace, resources))
        return list(pods.values())

    def allocatable(self) -> list[DeviceEntry]:
        manager = self.devices()
        if manager is None:
            return []
        out = []
        for resource in manager.resources():
            healthy = sorted(d for d, health in manager.devices(resource).items() if health == "Healthy")
            if healthy:
                out.append(DeviceEntry(resource, healthy))
        return out

