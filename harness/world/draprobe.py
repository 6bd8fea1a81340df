"""A direct client to a DRA plugin: calls and connections the kubelet would not make.

Checks use it to ask for a version the kubelet did not negotiate, to send a
claim twice, to open a second health stream, or to look for a health service
on a socket the plugin did not register. Its calls land on the timeline under
the source "probe".
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc
from google.protobuf.json_format import MessageToDict

from harness.instruments.grpcutil import CHANNEL_OPTIONS, unix_target
from harness.instruments.interceptors import RecordingClientInterceptor
from harness.instruments.timeline import Timeline
from harness.kubelet.dramanager import results_to_dict
from harness.wire import (
    dra_v1,
    dra_v1_grpc,
    dra_v1beta1,
    dra_v1beta1_grpc,
    drahealth_v1alpha1,
    drahealth_v1alpha1_grpc,
    reg,
    reg_grpc,
)

CALL_TIMEOUT_S = 10.0  # a probe call that takes longer than this is a hung plugin

# GetInfo version string -> (request module, stub class)
SERVICES: dict[str, tuple[Any, Any]] = {
    "v1.DRAPlugin": (dra_v1, dra_v1_grpc.DRAPluginStub),
    "v1beta1.DRAPlugin": (dra_v1beta1, dra_v1beta1_grpc.DRAPluginStub),
}
HEALTH: dict[str, tuple[Any, Any]] = {"v1alpha1": (drahealth_v1alpha1, drahealth_v1alpha1_grpc.DRAResourceHealthStub)}
try:  # dra-health v1 arrived with k8s.io/kubelet v0.37
    from harness.wire import drahealth_v1, drahealth_v1_grpc  # type: ignore[attr-defined]

    HEALTH = {"v1": (drahealth_v1, drahealth_v1_grpc.DRAResourceHealthStub), **HEALTH}
except ImportError:  # pragma: no cover - the stubs are committed
    pass

Claim = tuple[str, str, str]  # namespace, uid, name


class DRAProbe:
    """One connection to one socket of a DRA plugin."""

    def __init__(self, socket_path: str, timeline: Timeline) -> None:
        self.socket_path = socket_path
        self._raw = grpc.insecure_channel(unix_target(socket_path), options=CHANNEL_OPTIONS)
        self.channel = grpc.intercept_channel(self._raw, RecordingClientInterceptor(timeline, "probe"))

    def get_info(self, timeout_s: float = CALL_TIMEOUT_S) -> reg.PluginInfo:
        return reg_grpc.RegistrationStub(self.channel).GetInfo(reg.InfoRequest(), timeout=timeout_s,
                                                                wait_for_ready=True)

    def prepare(self, version: str, claims: list[Claim], timeout_s: float = CALL_TIMEOUT_S) -> dict[str, dict]:
        module, stub = SERVICES[version]
        request = module.NodePrepareResourcesRequest(
            claims=[module.Claim(namespace=ns, uid=uid, name=name) for ns, uid, name in claims])
        response = stub(self.channel).NodePrepareResources(request, timeout=timeout_s, wait_for_ready=True)
        return results_to_dict(response, unprepare=False)

    def unprepare(self, version: str, claims: list[Claim], timeout_s: float = CALL_TIMEOUT_S) -> dict[str, dict]:
        module, stub = SERVICES[version]
        request = module.NodeUnprepareResourcesRequest(
            claims=[module.Claim(namespace=ns, uid=uid, name=name) for ns, uid, name in claims])
        response = stub(self.channel).NodeUnprepareResources(request, timeout=timeout_s, wait_for_ready=True)
        return results_to_dict(response, unprepare=True)

    def watch_health(self, version: str, timeout_s: float) -> Iterator[list[dict[str, Any]]]:
        """The plugin's NodeWatchResources messages, each as a list of devices, until `timeout_s`.

        The call's own deadline bounds the stream: iterating ends with
        DEADLINE_EXCEEDED, which the caller treats as the end of observation.
        """
        module, stub = HEALTH[version]
        call = stub(self.channel).NodeWatchResources(module.NodeWatchResourcesRequest(), timeout=timeout_s,
                                                    wait_for_ready=True)
        try:
            for message in call:
                yield [health_entry(d) for d in message.devices]
        except grpc.RpcError as err:
            if err.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
                raise
        finally:
            call.cancel()

    def serves(self, method: str, timeout_s: float = 2.0) -> bool:
        """Whether the socket implements a fully qualified method (UNIMPLEMENTED or not)."""
        call = self.channel.unary_stream(method, request_serializer=lambda _: b"", response_deserializer=bytes)
        try:
            for _ in call(b"", timeout=timeout_s, wait_for_ready=True):
                return True
        except grpc.RpcError as err:
            return err.code() not in (grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.UNAVAILABLE)
        return True

    def close(self) -> None:
        self._raw.close()

    def __enter__(self) -> DRAProbe:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def health_entry(device: Any) -> dict[str, Any]:
    as_dict = MessageToDict(device, preserving_proto_field_name=True)
    return {"pool": device.device.pool_name, "device": device.device.device_name,
            "health": type(device).DESCRIPTOR.fields_by_name["health"].enum_type.values_by_number[
                device.health].name,
            "timeout_s": int(as_dict.get("health_check_timeout_seconds", 0)), "message": device.message}
