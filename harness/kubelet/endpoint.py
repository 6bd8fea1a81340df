"""The kubelet's client to one registered device plugin (upstream endpoint.go + client.go)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import grpc

from harness.instruments.dials import OK, endpoint_ids, record_dial
from harness.instruments.faults import FaultPlan
from harness.instruments.grpcutil import (
    CHANNEL_OPTIONS,
    FAKELET_MAX_RECV_BYTES,
    KUBELET_MAX_RECV_BYTES,
    over_kubelet_limit,
    status_of,
    unix_target,
)
from harness.instruments.guarded_channel import GuardedChannel
from harness.instruments.interceptors import RecordingClientInterceptor, list_to_dict
from harness.instruments.timeline import Timeline
from harness.wire import dp, dp_grpc


class DialError(RuntimeError):
    pass


class HungCall(RuntimeError):
    """A call the kubelet makes without a deadline did not answer within fakelet's bound."""


class OverLimit(RuntimeError):
    """A message the kubelet's gRPC layer would have refused: above its 4 MiB receive limit."""


def over_limit_error(what: str, size: int) -> str:
    return (f"RESOURCE_EXHAUSTED: {what} of {size} bytes is above the kubelet's {KUBELET_MAX_RECV_BYTES} byte "
            "gRPC receive limit (grpc-go's default, which the kubelet keeps); a real kubelet fails the call here")


def record_over_limit(timeline: Timeline, what: str, size: int, **data: Any) -> str:
    """The event, with the finding the report carries, for a message the kubelet could not receive."""
    error = over_limit_error(what, size)
    timeline.record("kubelet.over_limit", "kubelet", what=what, bytes=size, error=error,
                    finding=f"the plugin sent a {what} of {size} bytes; the kubelet receives at most "
                            f"{KUBELET_MAX_RECV_BYTES} (4 MiB) per gRPC message", **data)
    return error


# How grpc-python words a deadline that expired on the client side.
_LOCAL_DEADLINE_DETAILS = frozenset({"Deadline Exceeded", "Stream removed (Deadline Exceeded)"})


def go_status(err: grpc.RpcError) -> str:
    """Go's %v of a gRPC client error (grpc-go status.Error): what upstream's messages embed."""
    code = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN
    details = (err.details() if hasattr(err, "details") else None) or ""
    name = "Canceled" if code == grpc.StatusCode.CANCELLED else "".join(
        w.capitalize() for w in code.name.split("_"))
    if code == grpc.StatusCode.DEADLINE_EXCEEDED and details in _LOCAL_DEADLINE_DETAILS:
        details = "context deadline exceeded"  # the kubelet's own context deadline fired
    return f"rpc error: code = {name} desc = {details}"


class Endpoint:
    """A connection to a plugin: options fetched once, one ListAndWatch stream.

    The kubelet never re-opens ListAndWatch: when the stream ends the endpoint
    is stopped, and only a new Register brings a new one.
    """

    def __init__(self, resource: str, socket_path: str, timeline: Timeline, hang_bound_s: float,
                 instance: int | None = None, faults: FaultPlan | None = None) -> None:
        """`hang_bound_s`: fakelet's bound on the calls the kubelet makes without a deadline; `instance`: the
        kubelet instance that dials (on its `kubelet.dial` event); `faults`: that kubelet's fault plan, whose holds
        keep a plugin's answer (Allocate's) from it."""
        self.id = next(endpoint_ids)
        self.instance = instance
        self.resource, self.socket_path, self.timeline = resource, socket_path, timeline
        self.hang_bound_s = hang_bound_s
        # Guarded: whichever thread stops the endpoint closes the channel, maybe while this endpoint's
        # ListAndWatch thread or an admission starts a call on it (a crash in grpc-python otherwise).
        self._channel = GuardedChannel(grpc.insecure_channel(unix_target(socket_path), options=CHANNEL_OPTIONS))
        # deadlines=False: the timeouts here are fakelet's hang bound, not the kubelet's (it sets none on
        # Allocate), so a held answer waits for its release, as a real kubelet would wait.
        channel = grpc.intercept_channel(self._channel, RecordingClientInterceptor(timeline, "kubelet", faults,
                                                                               deadlines=False))
        self.stub = dp_grpc.DevicePluginStub(channel)
        self.options = dp.DevicePluginOptions()
        self._stream: grpc.Future | None = None
        self._stopping = threading.Event()
        self.ended = threading.Event()  # its ListAndWatch stream is over
        self._thread: threading.Thread | None = None

    def dial(self, timeout_s: float) -> None:
        """Blocking dial with the kubelet's timeout (client.go dial: grpc.WithBlock)."""
        try:
            grpc.channel_ready_future(self._channel.raw).result(timeout=timeout_s)
        except grpc.FutureTimeoutError:
            self.close()
            # client.go dial: fmt.Errorf(errFailedToDialDevicePlugin+" %v", ctx.Err())
            error = "failed to dial device plugin: context deadline exceeded"
            record_dial(self.timeline, self.socket_path, self.instance, self.id, error)
            raise DialError(error) from None
        record_dial(self.timeline, self.socket_path, self.instance, self.id, OK)

    def fetch_options(self) -> dp.DevicePluginOptions:
        # manager.go PluginConnected calls it with context.Background(), inside Register: a plugin
        # that never answers hangs its own registration for good. fakelet bounds it.
        try:
            options = self.stub.GetDevicePluginOptions(dp.Empty(), timeout=self.hang_bound_s)
        except grpc.RpcError as err:
            self.close()
            if err.code() == grpc.StatusCode.DEADLINE_EXCEEDED:  # type: ignore[attr-defined]
                raise DialError(f"failed to get device plugin options: {self._hung('GetDevicePluginOptions')}; "
                                "the kubelet's Register would never return") from None
            raise DialError(f"failed to get device plugin options: {go_status(err)}") from None
        size = over_kubelet_limit(options)
        if size is not None:
            self.close()
            raise DialError("failed to get device plugin options: "
                            + record_over_limit(self.timeline, "DevicePluginOptions answer", size,
                                                endpoint_id=self.id, resource=self.resource))
        self.options = options
        return self.options

    def _hung(self, method: str) -> str:
        """The error for a call the kubelet makes without a deadline; the report gets a finding too."""
        self.timeline.record("kubelet.hung_call", "kubelet", method=method, endpoint_id=self.id,
                             resource=self.resource, bound_s=self.hang_bound_s,
                             finding=f"the plugin never answered {method}; the kubelet calls it without a deadline, "
                                     "so a real kubelet would have waited forever (fakelet gave up after its bound)")
        return (f"no answer within fakelet's {self.hang_bound_s:g}s bound; the kubelet sets no deadline on this "
                "call, so a real kubelet would wait forever")

    def run(self, on_update: Callable[[Endpoint, dp.ListAndWatchResponse, dict], None],
            on_end: Callable[[Endpoint, str], None]) -> None:
        """Watch ListAndWatch on a thread: `on_update` gets each message, and its dict as the timeline has it
        (read-only: the event's own), `on_end` the reason the stream ended."""
        self._thread = threading.Thread(target=self._watch, args=(on_update, on_end),
                                        name=f"law-{self.resource}-{self.id}", daemon=True)
        self._thread.start()

    def _watch(self, on_update: Callable[[Endpoint, dp.ListAndWatchResponse, dict], None],
               on_end: Callable[[Endpoint, str], None]) -> None:
        reason = "stream ended by plugin"
        try:
            self._stream = self.stub.ListAndWatch(dp.Empty())
            for response in self._stream:
                size = over_kubelet_limit(response)
                if size is not None:
                    # The kubelet's stream fails on this message: the endpoint stops, as on any stream end.
                    reason = record_over_limit(self.timeline, "ListAndWatch message", size,
                                               endpoint_id=self.id, resource=self.resource)
                    self._stream.cancel()
                    break
                message = list_to_dict(response)
                self.timeline.record("grpc.stream_msg", "kubelet", side="client", method="ListAndWatch",
                                     endpoint_id=self.id, resource=self.resource, message=message)
                on_update(self, response, message)
        except grpc.RpcError as err:
            reason = "stopped by kubelet" if self._stopping.is_set() else status_of(err)
            if err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:  # type: ignore[attr-defined]
                # Past even fakelet's own receive limit: grpc says how large in its details.
                self.timeline.record("kubelet.over_limit", "kubelet", what="ListAndWatch message", error=reason,
                                     endpoint_id=self.id, resource=self.resource,
                                     finding=f"the plugin sent a ListAndWatch message above fakelet's own "
                                             f"{FAKELET_MAX_RECV_BYTES} byte limit ({reason})")
        if self._stopping.is_set():
            reason = "stopped by kubelet"
        self.ended.set()
        on_end(self, reason)

    # Upstream calls Allocate and GetPreferredAllocation with context.Background() (plugin/v1beta1
    # client.go): a plugin that never answers hangs pod admission for good. fakelet bounds them by
    # hang_bound_s and says so in the error, so a hung plugin gets a verdict, not a hung run.
    def allocate(self, device_ids: list[str]) -> dp.AllocateResponse:
        request = dp.AllocateRequest(container_requests=[dp.ContainerAllocateRequest(devices_ids=device_ids)])
        return self._unbounded(self.stub.Allocate, request)

    def preferred(self, available: list[str], must_include: list[str], size: int) -> list[str]:
        request = dp.PreferredAllocationRequest(container_requests=[dp.ContainerPreferredAllocationRequest(
            available_deviceIDs=available, must_include_deviceIDs=must_include, allocation_size=size)])
        response = self._unbounded(self.stub.GetPreferredAllocation, request)
        return list(response.container_responses[0].deviceIDs) if response.container_responses else []

    def pre_start(self, device_ids: list[str], timeout_s: float) -> None:
        self.stub.PreStartContainer(dp.PreStartContainerRequest(devices_ids=device_ids), timeout=timeout_s)

    def _unbounded(self, call: Callable, request: object) -> Any:
        try:
            response = call(request, timeout=self.hang_bound_s)
        except grpc.RpcError as err:
            if err.code() == grpc.StatusCode.DEADLINE_EXCEEDED:  # type: ignore[attr-defined]
                method = type(request).__name__.removesuffix("Request")
                raise HungCall(f"{self._hung(method)} (the pod hangs in admission)") from None
            raise
        size = over_kubelet_limit(response)
        if size is not None:
            raise OverLimit(record_over_limit(self.timeline, f"{type(response).__name__}", size,
                                              endpoint_id=self.id, resource=self.resource))
        return response

    @property
    def stopped_by_kubelet(self) -> bool:
        return self._stopping.is_set()

    def close(self) -> None:
        self._stopping.set()
        if self._stream is not None:
            self._stream.cancel()
        self._channel.close()

    def join(self, timeout_s: float) -> None:
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)
