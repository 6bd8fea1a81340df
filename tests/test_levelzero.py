"""The Level-Zero health sidecar fakelet serves: its wire bytes, and every control moving what it answers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from fake_devices.backend import DeviceBackend
from fake_devices.levelzero import MEMORY_OFFSET_C, ZE_RESULT_ERROR_INVALID_ARGUMENT, LevelZeroSidecar
from fake_devices.model import Inventory
from harness.instruments.grpcutil import unix_target
from harness.spec.subjects import fixtures_dir, load_yaml
from harness.wire import levelzero as lz
from harness.wire import levelzero_grpc as lz_grpc


def test_the_wire_is_intels() -> None:
    """Field numbers and types from the wire facts, byte for byte (the RPC paths have no package)."""
    health = lz.DeviceHealth(memory_ok=True, bus_ok=True, soc_ok=False, error=lz.Error(description="x", errorcode=5))
    # memory_ok=1 (varint), bus_ok=2, soc_ok=3 (false: absent), error=42 (length-delimited: tag 0xd2 0x02)
    assert health.SerializeToString() == b"\x08\x01\x10\x01\xd2\x02\x05\n\x01x\x10\x05"
    temps = lz.DeviceTemperature(**{"global": 1.0}, gpu=2.0, memory=3.0)
    assert temps.SerializeToString()[:1] == b"\x09"  # global = 1, a double (fixed64)
    assert lz.DeviceIndices(indices=[0, 1]).SerializeToString() == b"\x0a\x02\x00\x01"  # packed uint32 = 1
    assert lz.DeviceMemoryAmount(memory_size=1).SerializeToString() == b"\x08\x01"  # uint64 = 1
    assert lz.DeviceId(bdfAddress="a").SerializeToString() == b"\x0a\x01a"  # string = 1
    methods = {m.name: m.full_name for m in lz.DESCRIPTOR.services_by_name["Levelzero"].methods}
    assert methods == {"GetDeviceHealth": "Levelzero.GetDeviceHealth",
                       "GetDeviceTemperature": "Levelzero.GetDeviceTemperature",
                       "GetIntelIndices": "Levelzero.GetIntelIndices",
                       "GetDeviceMemoryAmount": "Levelzero.GetDeviceMemoryAmount"}


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[DeviceBackend, LevelZeroSidecar, lz_grpc.LevelzeroStub]]:
    inventory = Inventory.from_dict(load_yaml(fixtures_dir() / "inventories" / "gpus-only.yaml").data, "gpus-only")
    backend = DeviceBackend(tmp_path / "hw", inventory, skin="drm").start()
    sidecar = LevelZeroSidecar(backend.surface_view, tmp_path / "lz" / "server.sock").start()
    channel = grpc.insecure_channel(unix_target(str(sidecar.socket_path)))
    try:
        yield backend, sidecar, lz_grpc.LevelzeroStub(channel)
    finally:
        channel.close()
        sidecar.stop()
        backend.stop()


def test_every_control_moves_what_the_sidecar_answers(served) -> None:
    backend, sidecar, stub = served
    gpu = backend.devices()[0]
    bdf = lz.DeviceId(bdfAddress=gpu.pci_address)
    assert stub.GetIntelIndices(lz.GetIntelIndicesMessage()).indices == list(range(len(backend.devices())))
    assert stub.GetDeviceMemoryAmount(bdf).memory_size == gpu.memory_mib << 20
    ok = stub.GetDeviceHealth(bdf)
    assert (ok.memory_ok, ok.bus_ok, ok.soc_ok, ok.error.errorcode) == (True, True, True, 0)
    backend.fail(gpu.id)
    failed = stub.GetDeviceHealth(bdf)
    assert (failed.bus_ok, failed.soc_ok, failed.memory_ok) == (False, False, True)
    backend.recover(gpu.id)
    backend.ecc(gpu.id)
    assert (stub.GetDeviceHealth(bdf).memory_ok, stub.GetDeviceHealth(bdf).bus_ok) == (False, True)
    backend.heat(gpu.id, 97.0)
    temps = stub.GetDeviceTemperature(bdf)
    assert (getattr(temps, "global"), temps.gpu, temps.memory) == (97.0, 97.0, 97.0 - MEMORY_OFFSET_C)
    backend.unplug(gpu.id)
    gone = stub.GetDeviceHealth(bdf)
    assert not gone.bus_ok and gone.error.errorcode == ZE_RESULT_ERROR_INVALID_ARGUMENT
    assert sidecar.reads("health") and sidecar.reads("temperature")


def test_a_stopped_sidecar_is_gone_and_a_restarted_one_answers(served) -> None:
    backend, sidecar, stub = served
    bdf = lz.DeviceId(bdfAddress=backend.devices()[0].pci_address)
    sidecar.stop()
    assert not sidecar.socket_path.exists()
    with pytest.raises(grpc.RpcError) as err:
        stub.GetDeviceHealth(bdf, timeout=2)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    sidecar.restart()
    assert stub.GetDeviceHealth(bdf, timeout=5, wait_for_ready=True).bus_ok
