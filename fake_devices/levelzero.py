"""The Level-Zero health sidecar, served by fakelet from the fake device backend.

Intel's GPU device plugin asks a sidecar over a unix socket (by default
/var/lib/levelzero/server.sock; harness/wire/levelzero/api.proto) for a GPU's
health and temperatures by its PCI BDF address. fakelet serves that service from
the same model that feeds sysfs and NVML, so one control moves every surface:

- `fail` clears the bus and SoC flags (`recover` sets them again);
- `ecc` clears the memory flag while the device has ECC errors;
- `heat`/`cool` move all three temperatures (memory runs MEMORY_OFFSET_C cooler);
- `unplug` makes the BDF unknown: every flag false and a Level-Zero error.

A sidecar that is down (`stop()`) and one that restarts (`restart()`) are faults
of their own: the socket goes, and comes back.

Every answer is counted (`calls`, the report's facts) and, with a timeline,
recorded as a `levelzero.call` event (method, bdf, device, answer) the first
time a method is asked about a BDF and whenever its answer changes since, never
one per call: plugins poll. So a temperature asked after a `heat` is one event
carrying the new temperature, after the backend's `device.heat`.
"""

from __future__ import annotations

import threading
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

from fake_devices.model import UNHEALTHY, Device
from harness.instruments.grpcutil import unix_target
from harness.instruments.timeline import Timeline
from harness.wire import levelzero as lz
from harness.wire import levelzero_grpc as lz_grpc

DEFAULT_SOCKET = "/var/lib/levelzero/server.sock"  # intel-device-plugins cmd/internal/levelzero DefaultUnixSocketPath
ZE_RESULT_ERROR_INVALID_ARGUMENT = 0x78000004  # level-zero ze_api.h ze_result_t
MEMORY_OFFSET_C = 5.0  # the fake's memory sensor reads this much below the GPU's
SOURCE = "levelzero"
# What a plugin asks the sidecar when it watches each capability (the coverage facts).
CAPABILITY_METHODS = {"health": "GetDeviceHealth", "temperature": "GetDeviceTemperature"}


class _Service(lz_grpc.LevelzeroServicer):
    def __init__(self, sidecar: LevelZeroSidecar) -> None:
        self.sidecar = sidecar

    def _device(self, bdf: str) -> Device | None:
        wanted = bdf.strip().lower()
        return next((d for d in self.sidecar.devices() if d.present and d.pci_address.lower() == wanted), None)

    @staticmethod
    def _unknown(bdf: str) -> lz.Error:
        return lz.Error(description=f"ZE_RESULT_ERROR_INVALID_ARGUMENT: no device at {bdf!r}",
                        errorcode=ZE_RESULT_ERROR_INVALID_ARGUMENT)

    def GetDeviceHealth(self, request: lz.DeviceId, context: grpc.ServicerContext) -> lz.DeviceHealth:  # noqa: N802
        d = self._device(request.bdfAddress)
        if d is None:
            return self.sidecar.answered("GetDeviceHealth", request.bdfAddress, None,
                                         lz.DeviceHealth(error=self._unknown(request.bdfAddress)))
        failed = d.health == UNHEALTHY
        return self.sidecar.answered("GetDeviceHealth", request.bdfAddress, d, lz.DeviceHealth(
            memory_ok=d.ecc_errors == 0, bus_ok=not failed, soc_ok=not failed, error=lz.Error()))

    def GetDeviceTemperature(self, request: lz.DeviceId,  # noqa: N802
                             context: grpc.ServicerContext) -> lz.DeviceTemperature:
        d = self._device(request.bdfAddress)
        if d is None:
            return self.sidecar.answered("GetDeviceTemperature", request.bdfAddress, None,
                                         lz.DeviceTemperature(error=self._unknown(request.bdfAddress)))
        t = d.temperature_c
        # `global` is a Python keyword: the field is set by name.
        return self.sidecar.answered("GetDeviceTemperature", request.bdfAddress, d, lz.DeviceTemperature(
            **{"global": t}, gpu=t, memory=t - MEMORY_OFFSET_C, error=lz.Error()))

    def GetIntelIndices(self, request: lz.GetIntelIndicesMessage,  # noqa: N802
                        context: grpc.ServicerContext) -> lz.DeviceIndices:
        gpus = [d for d in self.sidecar.devices() if d.cls == "gpu" and d.present]
        return self.sidecar.answered("GetIntelIndices", None, None,
                                     lz.DeviceIndices(indices=list(range(len(gpus))), error=lz.Error()))

    def GetDeviceMemoryAmount(self, request: lz.DeviceId,  # noqa: N802
                              context: grpc.ServicerContext) -> lz.DeviceMemoryAmount:
        d = self._device(request.bdfAddress)
        if d is None:
            return self.sidecar.answered("GetDeviceMemoryAmount", request.bdfAddress, None,
                                         lz.DeviceMemoryAmount(error=self._unknown(request.bdfAddress)))
        return self.sidecar.answered("GetDeviceMemoryAmount", request.bdfAddress, d,
                                     lz.DeviceMemoryAmount(memory_size=d.memory_mib << 20, error=lz.Error()))


class LevelZeroSidecar:
    """The sidecar's gRPC server on `socket_path`, answering from `devices()` (the backend's snapshots)."""

    def __init__(self, devices: object, socket_path: Path, timeline: Timeline | None = None) -> None:
        self._devices = devices
        self.socket_path = Path(socket_path)
        self.timeline = timeline
        self.server: grpc.Server | None = None
        self.calls: dict[str, int] = {}  # method -> calls: what the plugin asked the sidecar
        self._answers: dict[tuple[str, str | None], dict[str, Any]] = {}  # (method, bdf) -> last answer recorded
        self._lock = threading.Lock()

    def devices(self) -> list[Device]:
        return self._devices()  # type: ignore[operator]

    def answered(self, method: str, bdf: str | None, device: Device | None, reply: Any) -> Any:
        """Count a call and return its `reply`; on the timeline when the answer is news (see the module doc)."""
        answer = _answer(reply)
        with self._lock:
            self.calls[method] = self.calls.get(method, 0) + 1
            key = (method, bdf)
            news = self._answers.get(key) != answer
            self._answers[key] = answer
            # Recorded under the lock: two callers' events are in the order their answers were decided.
            if news and self.timeline is not None:
                self.timeline.record("levelzero.call", SOURCE, method=method, bdf=bdf,
                                     device=device.id if device is not None else None, answer=answer)
        return reply

    @property
    def running(self) -> bool:
        return self.server is not None

    def start(self) -> LevelZeroSidecar:
        if self.server is not None:
            return self
        self.socket_path.parent.mkdir(parents=True, exist_ok=True)
        self.socket_path.unlink(missing_ok=True)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="levelzero"))
        lz_grpc.add_LevelzeroServicer_to_server(_Service(self), server)
        server.add_insecure_port(unix_target(str(self.socket_path)))
        server.start()
        self.server = server
        self._record("levelzero.start", socket=str(self.socket_path))
        return self

    def stop(self) -> None:
        server, self.server = self.server, None
        if server is None:
            return
        server.stop(grace=None).wait(5)
        self.socket_path.unlink(missing_ok=True)
        self._record("levelzero.stop", socket=str(self.socket_path))

    def restart(self) -> None:
        self._record("fault.levelzero_restart", socket=str(self.socket_path))
        self.stop()
        self.start()

    def reads(self, capability: str) -> bool:
        """Whether the plugin asked the sidecar about `capability` (health, temperature)."""
        method = CAPABILITY_METHODS.get(capability)
        with self._lock:
            return method is not None and self.calls.get(method, 0) > 0

    def summary(self) -> str:
        with self._lock:
            if not self.calls:
                return ""
            return ", ".join(f"{k} x{v}" for k, v in sorted(self.calls.items()))

    def _record(self, kind: str, **data: object) -> None:
        if self.timeline is not None:
            self.timeline.record(kind, SOURCE, **data)


def _answer(reply: Any) -> dict[str, Any]:
    """A reply's fields as plain values (the error only when there is one), for the timeline."""
    out: dict[str, Any] = {}
    # Every field, not ListFields(): proto3 leaves out false and zero, and bus_ok=False is the news.
    for field in reply.DESCRIPTOR.fields:
        value = getattr(reply, field.name)
        if field.name == "error":
            if value.errorcode or value.description:
                out["error"] = value.description or f"code {value.errorcode:#x}"
        elif isinstance(value, bool | int | float | str | bytes):
            out[field.name] = value
        else:
            out[field.name] = list(value)  # a repeated field (the only other kind this API answers)
    return out
