"""The kubelet's PodResources API v1, served from a provider, with upstream v1.36 semantics.

Upstream: pkg/kubelet/apis/podresources (server_v1.go, constants.go, types.go)
and kubelet.go ListenAndServePodResources / kubeletPodsProvider. Node agents
(device plugin monitors, NUMA-aware schedulers' exporters) read which devices
and DRA claims each running pod holds, and what the node can allocate.

The provider stands for the kubelet's pod manager and resource managers; the
server only turns its answers into wire messages. As upstream, List and Get
leave out pods that are no longer active (`PodEntry.terminated`): List goes
through GetActivePods (KubeletPodResourcesListUseActivePods, on by default
since 1.34) and Get through GetPodByName, which applies the same filter, so a
terminated pod is "not found". CPU and memory assignments are served empty:
fakelet models no CPU or memory manager. Upstream's rate limit (100 qps,
burst 10, one bucket for all clients) is applied before each handler, as
upstream's interceptor does, and fakelet's own reads keep under it (ratelimit.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

import grpc
from google.protobuf.message import Message

from harness.instruments.grpcutil import SERVER_OPTIONS, insecure_unix_channel, status_of, unix_target
from harness.instruments.timeline import Timeline
from harness.kubelet.ratelimit import LIMIT_EXCEEDED, TokenBucket, pace
from harness.wire import podresources, podresources_grpc

SOCKET_DIR_NAME = "pod-resources"  # kubeletconfig defaults.go DefaultKubeletPodResourcesDirName
# podresources constants.go Socket ("kubelet"); kubelet util LocalEndpoint appends ".sock".
SOCKET_NAME = "kubelet.sock"
SOCKET_DIR_MODE = 0o750  # kubelet.go setupDataDirs: os.MkdirAll(kl.getPodResourcesDir(), 0750)
# server_v1.go Get returns this as a plain Go error, which grpc-go sends as code UNKNOWN (not NOT_FOUND).
ERR_POD_NOT_FOUND = "pod {name} in namespace {namespace} not found"
NOT_FOUND_CODE = grpc.StatusCode.UNKNOWN
STOP_GRACE_S = 1.0  # in-flight unary calls are short; a stuck one must not hold up teardown


def socket_path(root_dir: Path | str) -> Path:
    """Where the kubelet serves the API: <root-dir>/pod-resources/kubelet.sock."""
    return Path(root_dir) / SOCKET_DIR_NAME / SOCKET_NAME


@dataclass
class DeviceEntry:
    """Devices of one device plugin resource (ContainerDevices).

    An empty `numa_nodes` serves no topology at all, as upstream does for a
    plugin that reports none. Upstream's device manager emits one entry per
    device and NUMA node; how to group is the provider's choice.
    """

    resource_name: str
    device_ids: list[str]
    numa_nodes: list[int] = field(default_factory=list)


@dataclass
class ClaimResourceEntry:
    """One allocated DRA device of a claim (ClaimResource)."""

    cdi_devices: list[str]
    driver_name: str
    pool_name: str
    device_name: str


@dataclass
class DynamicEntry:
    """One DRA claim as a container uses it (DynamicResource)."""

    claim_name: str
    claim_namespace: str
    claim_resources: list[ClaimResourceEntry] = field(default_factory=list)


@dataclass
class ContainerEntry:
    """Restartable init containers first, then the regular ones, as upstream lists them."""

    name: str
    devices: list[DeviceEntry] = field(default_factory=list)
    dynamic_resources: list[DynamicEntry] = field(default_factory=list)


@dataclass
class PodEntry:
    name: str
    namespace: str
    containers: list[ContainerEntry] = field(default_factory=list)
    # Known terminated, or terminal and not being torn down (kubelet_pods.go isPodInactive).
    terminated: bool = False


class PodResourcesProvider(Protocol):
    """What the server answers from; called on gRPC worker threads, once per call."""

    def pods(self) -> list[PodEntry]: ...

    def allocatable(self) -> list[DeviceEntry]: ...


# Called with the method name and the response about to be sent; returns what is sent instead.
Translate = Callable[[str, Message], Message]


class PodResourcesServer:
    """PodResourcesLister v1 on a unix socket, recording each call as `podresources.call`."""

    def __init__(self, socket: Path | str, provider: PodResourcesProvider, timeline: Timeline,
                 translate: Translate | None = None, source: str = "kubelet") -> None:
        self.socket, self.provider, self.timeline = Path(socket), provider, timeline
        self.translate, self.source = translate, source
        self._server: grpc.Server | None = None
        self.limiter = TokenBucket()  # server.go ListenAndServePodResources: apisgrpc.WithRateLimiter

    def start(self) -> PodResourcesServer:
        self.socket.parent.mkdir(mode=SOCKET_DIR_MODE, parents=True, exist_ok=True)
        # cri-client util_unix.go CreateListener unlinks a socket left by an earlier kubelet.
        self.socket.unlink(missing_ok=True)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="podresources"),
                             options=SERVER_OPTIONS)
        podresources_grpc.add_PodResourcesListerServicer_to_server(_Servicer(self), server)
        try:
            server.add_insecure_port(unix_target(str(self.socket)))
            server.start()
        except BaseException:
            server.stop(None)
            raise
        self._server = server
        self.timeline.record("podresources.start", self.source, socket=str(self.socket))
        return self

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        server.stop(grace=STOP_GRACE_S).wait(STOP_GRACE_S + 4)
        self.timeline.record("podresources.stop", self.source, socket=str(self.socket))

    def __enter__(self) -> PodResourcesServer:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    # -- handlers ----------------------------------------------------------

    def _list(self) -> podresources.ListPodResourcesResponse:
        return podresources.ListPodResourcesResponse(
            pod_resources=[_pod_message(p) for p in self.provider.pods() if not p.terminated])

    def _allocatable(self) -> podresources.AllocatableResourcesResponse:
        return podresources.AllocatableResourcesResponse(
            devices=[_device_message(d) for d in self.provider.allocatable()])

    def _get(self, name: str, namespace: str) -> podresources.GetPodResourcesResponse:
        for pod in self.provider.pods():
            if pod.name == name and pod.namespace == namespace and not pod.terminated:
                return podresources.GetPodResourcesResponse(pod_resources=_pod_message(pod))
        raise _PodNotFound(ERR_POD_NOT_FOUND.format(name=name, namespace=namespace))

    def _serve(self, method: str, request: Message, context: grpc.ServicerContext,
               answer: Callable[[], Message]) -> Message:
        fields: dict[str, Any] = {}
        if isinstance(request, podresources.GetPodResourcesRequest):
            fields["pod"] = f"{request.pod_namespace}/{request.pod_name}"
        if not self.limiter.allow():
            code = grpc.StatusCode.RESOURCE_EXHAUSTED
            self._record(method, f"{code.name}: {LIMIT_EXCEEDED}", fields)
            context.abort(code, LIMIT_EXCEEDED)
        try:
            response = answer()
            if self.translate is not None:
                response = self.translate(method, response)
        except _PodNotFound as err:
            self._record(method, f"{NOT_FOUND_CODE.name}: {err}", fields)
            context.abort(NOT_FOUND_CODE, str(err))
        except BaseException as err:
            self._record(method, status_of(err), fields)
            raise
        self._record(method, "OK", {**fields, **_summary(response)})
        return response

    def _record(self, method: str, outcome: str, fields: dict[str, Any]) -> None:
        self.timeline.record("podresources.call", self.source, method=method, outcome=outcome, **fields)


class _PodNotFound(LookupError):
    pass


class _Servicer(podresources_grpc.PodResourcesListerServicer):
    def __init__(self, server: PodResourcesServer) -> None:
        self._server = server

    def List(self, request: podresources.ListPodResourcesRequest,  # noqa: N802 (gRPC method name)
             context: grpc.ServicerContext) -> Message:
        return self._server._serve("List", request, context, self._server._list)

    def GetAllocatableResources(self, request: podresources.AllocatableResourcesRequest,  # noqa: N802
                                context: grpc.ServicerContext) -> Message:
        return self._server._serve("GetAllocatableResources", request, context, self._server._allocatable)

    def Get(self, request: podresources.GetPodResourcesRequest,  # noqa: N802 (gRPC method name)
            context: grpc.ServicerContext) -> Message:
        return self._server._serve("Get", request, context,
                                   lambda: self._server._get(request.pod_name, request.pod_namespace))


def _summary(response: Message) -> dict[str, Any]:
    """What a call answered, in short: pods as namespace/name, devices as resource -> ID count."""
    if isinstance(response, podresources.ListPodResourcesResponse):
        return {"pods": [f"{p.namespace}/{p.name}" for p in response.pod_resources]}
    if isinstance(response, podresources.GetPodResourcesResponse):
        containers = response.pod_resources.containers
        return {"containers": [c.name for c in containers],
                "claims": sorted({f"{d.claim_namespace}/{d.claim_name}"
                                  for c in containers for d in c.dynamic_resources}),
                "devices": _count(d for c in containers for d in c.devices)}
    if isinstance(response, podresources.AllocatableResourcesResponse):
        return {"devices": _count(response.devices)}
    return {}


def _count(devices: Any) -> dict[str, int]:
    counts: dict[str, int] = {}
    for d in devices:
        counts[d.resource_name] = counts.get(d.resource_name, 0) + len(d.device_ids)
    return counts


# -- entries to wire -------------------------------------------------------


def _device_message(entry: DeviceEntry) -> podresources.ContainerDevices:
    message = podresources.ContainerDevices(resource_name=entry.resource_name, device_ids=entry.device_ids)
    if entry.numa_nodes:
        message.topology.nodes.extend(podresources.NUMANode(ID=n) for n in entry.numa_nodes)
    return message


def _dynamic_message(entry: DynamicEntry) -> podresources.DynamicResource:
    return podresources.DynamicResource(
        claim_name=entry.claim_name, claim_namespace=entry.claim_namespace,
        claim_resources=[podresources.ClaimResource(
            cdi_devices=[podresources.CDIDevice(name=n) for n in r.cdi_devices],
            driver_name=r.driver_name, pool_name=r.pool_name, device_name=r.device_name)
            for r in entry.claim_resources])


def _pod_message(entry: PodEntry) -> podresources.PodResources:
    return podresources.PodResources(
        name=entry.name, namespace=entry.namespace,
        containers=[podresources.ContainerResources(
            name=c.name, devices=[_device_message(d) for d in c.devices],
            dynamic_resources=[_dynamic_message(d) for d in c.dynamic_resources])
            for c in entry.containers])


# -- the reading agent -----------------------------------------------------


def read_pod_resources(socket_path: Path | str, timeout_s: float) -> dict[str, Any]:
    """List and GetAllocatableResources from a PodResources socket, as plain dicts.

    {"pods": [pod], "allocatable": {"devices", "cpu_ids", "memory"}}. A device is
    {"resource_name", "device_ids", "numa_nodes"} (the DeviceEntry fields); a pod
    and a container carry every wire field, with topology flattened to
    `numa_nodes` and an unset share_id as None. One deadline covers both calls,
    and waits for a socket that is not served yet. gRPC errors propagate.
    """
    deadline = time.monotonic() + timeout_s
    channel = insecure_unix_channel(str(socket_path))
    try:
        stub = podresources_grpc.PodResourcesListerStub(channel)
        pace(str(socket_path), deadline)
        listed = stub.List(podresources.ListPodResourcesRequest(), wait_for_ready=True,
                           timeout=max(deadline - time.monotonic(), 0))
        pace(str(socket_path), deadline)
        allocatable = stub.GetAllocatableResources(podresources.AllocatableResourcesRequest(), wait_for_ready=True,
                                                   timeout=max(deadline - time.monotonic(), 0))
    finally:
        channel.close()
    return {"pods": [_pod_dict(p) for p in listed.pod_resources],
            "allocatable": {"devices": [_device_dict(d) for d in allocatable.devices],
                            "cpu_ids": list(allocatable.cpu_ids),
                            "memory": [_memory_dict(m) for m in allocatable.memory]}}


def get_pod_resources(socket_path: Path | str, namespace: str, name: str, timeout_s: float) -> dict[str, Any]:
    """Get for one pod, as the dict `read_pod_resources` gives for a listed pod. gRPC errors propagate: an
    unknown pod is code UNKNOWN with ERR_POD_NOT_FOUND's text (upstream's plain Go error), and a kubelet
    without the KubeletPodResourcesGet feature gate answers "PodResources API Get method disabled"."""
    deadline = time.monotonic() + timeout_s
    channel = insecure_unix_channel(str(socket_path))
    try:
        stub = podresources_grpc.PodResourcesListerStub(channel)
        pace(str(socket_path), deadline)
        got = stub.Get(podresources.GetPodResourcesRequest(pod_name=name, pod_namespace=namespace),
                       wait_for_ready=True, timeout=max(deadline - time.monotonic(), 0))
    finally:
        channel.close()
    return _pod_dict(got.pod_resources)


def _pod_dict(pod: podresources.PodResources) -> dict[str, Any]:
    return {
        "name": pod.name,
        "namespace": pod.namespace,
        "containers": [{
            "name": c.name,
            "devices": [_device_dict(d) for d in c.devices],
            "cpu_ids": list(c.cpu_ids),
            "memory": [_memory_dict(m) for m in c.memory],
            "dynamic_resources": [{
                "claim_name": d.claim_name,
                "claim_namespace": d.claim_namespace,
                "claim_resources": [{
                    "cdi_devices": [x.name for x in r.cdi_devices],
                    "driver_name": r.driver_name,
                    "pool_name": r.pool_name,
                    "device_name": r.device_name,
                    "share_id": r.share_id if r.HasField("share_id") else None,
                } for r in d.claim_resources],
            } for d in c.dynamic_resources],
        } for c in pod.containers],
        "cpu_ids": list(pod.cpu_ids),
        "memory": [_memory_dict(m) for m in pod.memory],
    }


def _device_dict(d: podresources.ContainerDevices) -> dict[str, Any]:
    return {"resource_name": d.resource_name, "device_ids": list(d.device_ids),
            "numa_nodes": [n.ID for n in d.topology.nodes]}


def _memory_dict(m: podresources.ContainerMemory) -> dict[str, Any]:
    return {"memory_type": m.memory_type, "size": m.size, "numa_nodes": [n.ID for n in m.topology.nodes]}
