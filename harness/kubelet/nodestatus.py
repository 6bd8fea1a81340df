"""The fake kubelet as a Node in the API server: the Node object, its status and its lease.

A real kubelet registers its Node, posts node status on a timer and renews a
Lease in kube-node-lease so that the node lifecycle controller sees it alive.
The fake kubelet does the same for each instance it runs (a stopped kubelet
stops renewing, as a real one does). Capacity and allocatable carry the
extended resources of the device manager, so a device plugin's resources show
on the Node exactly where an operator looks for them.
"""

from __future__ import annotations

import contextlib
import datetime
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from harness.controlplane.client import ApiError
from harness.instruments.timeline import Timeline

if TYPE_CHECKING:
    from harness.controlplane.client import KubeClient

NODE_STATUS_UPDATE_S = 10.0  # kubelet config nodeStatusUpdateFrequency default
NODE_LEASE_DURATION_S = 40  # kubelet config nodeLeaseDurationSeconds default
LEASE_RENEW_FRACTION = 0.25  # pkg/kubelet/kubelet.go nodeLeaseRenewIntervalFraction
LEASE_NAMESPACE = "kube-node-lease"  # k8s.io/api core/v1 NamespaceNodeLease
RETRY_S = 1.0  # after a failed status write: the API server may be restarting
# What a small node reports besides extended resources; nothing schedules on these here.
BASE_CAPACITY = {"cpu": "2", "memory": "4Gi", "pods": "110"}
HOSTNAME_LABEL = "kubernetes.io/hostname"  # k8s.io/api core/v1 LabelHostname


def micro_time(now: datetime.datetime | None = None) -> str:
    """metav1.MicroTime's wire format (RFC 3339 with microseconds)."""
    now = now or datetime.datetime.now(datetime.UTC)
    return now.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def rfc3339(now: datetime.datetime | None = None) -> str:
    now = now or datetime.datetime.now(datetime.UTC)
    return now.strftime("%Y-%m-%dT%H:%M:%SZ")


def _ready_conditions(now: str) -> list[dict[str, str]]:
    # pkg/kubelet/nodestatus/setters.go: the pressure conditions and Ready as a healthy kubelet posts them.
    def cond(kind: str, status: str, reason: str, message: str) -> dict[str, str]:
        return {"type": kind, "status": status, "reason": reason, "message": message,
                "lastHeartbeatTime": now, "lastTransitionTime": now}

    return [
        cond("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
        cond("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
        cond("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
        cond("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
    ]


class NodeStatus:
    """One kubelet instance's Node registration, status loop and lease loop."""

    def __init__(self, client: KubeClient, node_name: str, timeline: Timeline,
                 extended: Callable[[], dict[str, tuple[int, int]]] | None = None,
                 status_period_s: float = NODE_STATUS_UPDATE_S) -> None:
        """`extended()` gives {resource: (capacity, allocatable)} of the device manager."""
        self.client, self.node_name, self.timeline = client, node_name, timeline
        self.extended = extended or dict
        self.status_period_s = status_period_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_resources: dict[str, Any] | None = None

    def start(self) -> NodeStatus:
        if self._thread is None:
            self.register()
            self._thread = threading.Thread(target=self._run, daemon=True, name=f"node-status-{self.node_name}")
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=RETRY_S + 5)
            self._thread = None

    # -- registration -------------------------------------------------------------------------

    def register(self) -> dict:
        """registerWithAPIServer: create the Node, or take over the existing one (a kubelet restart)."""
        body = {"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": self.node_name, "labels": {HOSTNAME_LABEL: self.node_name}}}
        try:
            node = self.client.create("/api/v1/nodes", body)
            created = True
        except ApiError as err:
            if err.status != 409:
                raise
            node = self.client.get(f"/api/v1/nodes/{self.node_name}")
            created = False
        self.timeline.record("node.registered", "kubelet", node=self.node_name, created=created)
        self.post_status()
        return node

    # -- loops --------------------------------------------------------------------------------

    def _run(self) -> None:
        renew_s = NODE_LEASE_DURATION_S * LEASE_RENEW_FRACTION
        next_lease = 0.0
        next_status = time.monotonic() + self.status_period_s  # register() has just posted it
        while not self._stop.is_set():
            now = time.monotonic()
            try:
                if now >= next_lease:
                    self.renew_lease()
                    next_lease = now + renew_s
                if now >= next_status:
                    self.post_status()
                    next_status = now + self.status_period_s
            except (ApiError, OSError) as err:
                self.timeline.record("api.error", "kubelet", what="node status", error=str(err))
                next_status = next_lease = now + RETRY_S
            self._stop.wait(max(0.0, min(next_status, next_lease) - time.monotonic()))

    def _resources(self) -> dict[str, Any]:
        capacity, allocatable = dict(BASE_CAPACITY), dict(BASE_CAPACITY)
        for resource, (cap, alloc) in sorted(self.extended().items()):
            capacity[resource], allocatable[resource] = str(cap), str(alloc)
        return {"capacity": capacity, "allocatable": allocatable}

    def post_status(self) -> None:
        now = rfc3339()
        resources = self._resources()
        status = {**resources, "conditions": _ready_conditions(now),
                  "addresses": [{"type": "InternalIP", "address": "127.0.0.1"},
                                {"type": "Hostname", "address": self.node_name}],
                  "nodeInfo": {"kubeletVersion": "fakelet", "operatingSystem": "linux", "architecture": "amd64",
                               "machineID": "", "systemUUID": "", "bootID": "", "kernelVersion": "",
                               "osImage": "", "containerRuntimeVersion": "fakelet://0", "kubeProxyVersion": ""}}
        self.client.patch(f"/api/v1/nodes/{self.node_name}/status", {"status": status})
        if resources != self._last_resources:
            self._last_resources = resources
            self.timeline.record("node.status", "kubelet", node=self.node_name, **resources)

    def renew_lease(self) -> None:
        path = f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NAMESPACE}/leases"
        spec = {"holderIdentity": self.node_name, "leaseDurationSeconds": NODE_LEASE_DURATION_S,
                "renewTime": micro_time()}
        try:
            self.client.patch(f"{path}/{self.node_name}", {"spec": spec})
        except ApiError as err:
            if err.status != 404:
                raise
            with contextlib.suppress(ApiError):  # 409: another instance created it first
                self.client.create(path, {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                                          "metadata": {"name": self.node_name, "namespace": LEASE_NAMESPACE},
                                          "spec": spec})

