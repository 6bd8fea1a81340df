"""A direct DevicePlugin client for the harness: calls the kubelet would not make.

Checks use it to send an unknown device ID, several container requests at
once, or sixteen concurrent Allocates. Its calls are on the timeline too,
under the source "probe".
"""

from __future__ import annotations

import grpc

from harness.instruments.grpcutil import CHANNEL_OPTIONS, unix_target
from harness.instruments.interceptors import RecordingClientInterceptor
from harness.instruments.timeline import Timeline
from harness.wire import dp, dp_grpc

CALL_TIMEOUT_S = 10.0  # a probe call that takes longer than this is a hung plugin


class ProbeClient:
    def __init__(self, socket_path: str, timeline: Timeline) -> None:
        self._raw = grpc.insecure_channel(unix_target(socket_path), options=CHANNEL_OPTIONS)
        self.stub = dp_grpc.DevicePluginStub(
            grpc.intercept_channel(self._raw, RecordingClientInterceptor(timeline, "probe")))

    def options(self, timeout_s: float = CALL_TIMEOUT_S, wait_for_ready: bool = False) -> dp.DevicePluginOptions:
        """`wait_for_ready`: a socket that has just appeared may not listen yet; wait (bounded) for it."""
        return self.stub.GetDevicePluginOptions(dp.Empty(), timeout=timeout_s, wait_for_ready=wait_for_ready)

    def allocate(self, containers: list[list[str]], timeout_s: float = CALL_TIMEOUT_S) -> dp.AllocateResponse:
        request = dp.AllocateRequest(container_requests=[dp.ContainerAllocateRequest(devices_ids=ids)
                                                         for ids in containers])
        return self.stub.Allocate(request, timeout=timeout_s)

    def preferred(self, available: list[str], must_include: list[str], size: int,
                  timeout_s: float = CALL_TIMEOUT_S) -> dp.PreferredAllocationResponse:
        request = dp.PreferredAllocationRequest(container_requests=[dp.ContainerPreferredAllocationRequest(
            available_deviceIDs=available, must_include_deviceIDs=must_include, allocation_size=size)])
        return self.stub.GetPreferredAllocation(request, timeout=timeout_s)

    def pre_start(self, device_ids: list[str], timeout_s: float) -> dp.PreStartContainerResponse:
        return self.stub.PreStartContainer(dp.PreStartContainerRequest(devices_ids=device_ids), timeout=timeout_s)

    def close(self) -> None:
        self._raw.close()

    def __enter__(self) -> ProbeClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
