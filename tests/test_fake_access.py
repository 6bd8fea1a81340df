"""AccessTrace: which files of the fake hardware a reader actually reads, and nothing the backend does."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fake_devices.access import READ_EVENT, SOURCE, STOP_DEADLINE_S, AccessTrace, classify
from fake_devices.backend import DeviceBackend
from fake_devices.generate import generate
from harness.instruments.timeline import Event, Timeline

WAIT_S = 5.0  # upper bound for anything asynchronous; passing runs take milliseconds


@pytest.fixture(params=["neutral", "drm"])
def backend(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[DeviceBackend]:
    b = DeviceBackend(tmp_path / "hw", generate(3, {"gpu": 2, "nic": 1}), Timeline(), skin=request.param)
    try:
        yield b.start()
    finally:
        b.stop()


@pytest.fixture
def trace(backend: DeviceBackend) -> Iterator[AccessTrace]:
    assert backend.timeline is not None
    t = AccessTrace(backend.root, backend.timeline).start()
    try:
        yield t
    finally:
        t.stop()


def rel(backend: DeviceBackend, path: Path) -> str:
    return os.path.relpath(os.path.realpath(path), os.path.realpath(backend.root))


def cat(*paths: Path) -> str:
    """Another process reads, as a plugin would."""
    return subprocess.run(["cat", *map(str, paths)], check=True, capture_output=True, text=True,
                          timeout=WAIT_S).stdout


def first_read(backend: DeviceBackend, path: str) -> Event:
    assert backend.timeline is not None
    return backend.timeline.wait_for(lambda e: e.kind == READ_EVENT and e.get("path") == path, WAIT_S,
                                     f"a {READ_EVENT} of {path}")


def test_a_reader_of_health_and_temperature_is_seen(backend: DeviceBackend, trace: AccessTrace) -> None:
    gpu = backend.devices()[0]
    d = backend.materializer.device_dir(gpu)
    health, temperature = rel(backend, d / "health"), rel(backend, d / "temperature")
    assert not trace.reads() and not trace.reads_health_source()
    cat(d / "health", d / "temperature")
    event = first_read(backend, temperature)  # the second file: the first was handled before it
    assert event.source == SOURCE and event.get("group") == "temperature"
    assert first_read(backend, health).get("group") == "health"
    assert trace.reads_health_source() and trace.reads_temperature_source()
    summary = trace.summary()
    assert summary["health"] == [health] and summary["temperature"] == [temperature]
    assert set(summary) == {"health", "temperature", "inventory", "nodes", "other"}
    assert trace.reads()[health] >= 1 and trace.reads()[temperature] >= 1


def test_only_the_first_read_of_a_file_goes_on_the_timeline(backend: DeviceBackend, trace: AccessTrace) -> None:
    assert backend.timeline is not None
    d = backend.materializer.device_dir(backend.devices()[0])
    for _ in range(3):
        cat(d / "ecc_errors")
    cat(d / "serial")  # a sentinel: inotify delivers in order, so once it is seen the polls were too
    first_read(backend, rel(backend, d / "serial"))
    ecc = rel(backend, d / "ecc_errors")
    # Three opens, each read once: the kernel merges only identical consecutive events, and these alternate.
    assert trace.reads()[ecc] == 3
    assert len([e for e in backend.timeline.events(kind=READ_EVENT) if e.get("path") == ecc]) == 1


def test_the_backends_own_writes_are_not_reads(backend: DeviceBackend, trace: AccessTrace) -> None:
    gpu, other = backend.devices()[0], backend.devices()[1]
    backend.fail(gpu.id)
    backend.heat(gpu.id, 95.0)
    backend.ecc(gpu.id, 3)
    backend.recover(gpu.id)
    backend.unplug(other.id)
    backend.plug(other.id)
    backend.cool(gpu.id, 40.0)
    sentinel = backend.materializer.device_dir(backend.devices()[2]) / "uuid"
    cat(sentinel)
    first_read(backend, rel(backend, sentinel))
    assert trace.reads() == {rel(backend, sentinel): 1}
    assert not trace.reads_health_source() and not trace.reads_temperature_source()


def test_writing_is_not_reading(backend: DeviceBackend, trace: AccessTrace) -> None:
    d = backend.materializer.device_dir(backend.devices()[0])
    with open(d / "model", "w") as f:  # open + write + close-write: a writer, not a reader
        f.write("tampered\n")
    cat(d / "uuid")
    first_read(backend, rel(backend, d / "uuid"))
    assert list(trace.reads()) == [rel(backend, d / "uuid")]


def test_opening_a_node_counts_as_reading_it(backend: DeviceBackend, trace: AccessTrace) -> None:
    node = backend.materializer.node_path(backend.devices()[0])
    cat(node)  # a /dev/null-like node (or an empty file): opened, nothing read, closed
    event = first_read(backend, rel(backend, node))
    assert event.get("group") == "nodes" and trace.summary()["nodes"] == [rel(backend, node)]


def test_a_hot_plugged_devices_new_dir_is_watched(backend: DeviceBackend, trace: AccessTrace) -> None:
    gpu = backend.devices()[1]
    d = backend.materializer.device_dir(gpu)
    assert trace.watching(rel(backend, d))
    backend.unplug(gpu.id)
    backend.fail(gpu.id)
    backend.plug(gpu.id)
    # Not just "a watch of that name": the watch of the directory that is there now.
    assert trace.wait_watching(rel(backend, d), WAIT_S)
    assert cat(d / "health") == "Unhealthy\n"
    assert first_read(backend, rel(backend, d / "health")).get("group") == "health"
    pci = backend.materializer.pci_dir(gpu)
    if pci is None:
        return  # the neutral skin has no PCI dir
    assert trace.wait_watching(rel(backend, pci), WAIT_S)
    card = backend.materializer.card_dir(gpu)
    assert card is not None
    cat(card / "device" / "vendor", card / "device" / "uevent")
    # Reported under the real path, whatever link it was read through.
    assert first_read(backend, f"{rel(backend, pci)}/uevent").get("group") == "health"
    assert trace.summary()["inventory"] == [f"{rel(backend, pci)}/vendor"]


def test_sys_and_dev_made_after_start_are_watched(tmp_path: Path) -> None:
    tl = Timeline()
    root = tmp_path / "hw"
    root.mkdir()
    with AccessTrace(root, tl) as trace:
        b = DeviceBackend(root, generate(1, {"gpu": 1}), tl).start()
        try:
            d = b.materializer.device_dir(b.devices()[0])
            assert trace.wait_watching(os.path.relpath(d, root), WAIT_S)
            cat(d / "present")
            tl.wait_for(lambda e: e.kind == READ_EVENT, WAIT_S, "a read of present")
            assert trace.reads_health_source()
        finally:
            b.stop()


def test_stop_is_bounded_idempotent_and_keeps_what_was_seen(backend: DeviceBackend) -> None:
    trace = AccessTrace(backend.root, backend.timeline).start()
    d = backend.materializer.device_dir(backend.devices()[0])
    cat(d / "temperature")
    began = time.monotonic()
    trace.stop()  # queued events are taken in before the watch closes
    trace.stop()
    assert time.monotonic() - began < STOP_DEADLINE_S
    assert trace.reads_temperature_source()
    assert not [t for t in threading.enumerate() if t.name == "fakelet-access-trace" and t.is_alive()]
    cat(d / "health")  # after stop: nothing is watching any more
    assert not trace.reads_health_source()
    assert trace.start() is trace and not trace.reads_health_source()  # a stopped trace stays stopped


def test_a_missing_tree_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no materialized tree"):
        AccessTrace(tmp_path / "nope").start()


@pytest.mark.parametrize(("path", "group"), [
    ("sys/class/gpu/gpu-0/health", "health"),
    ("sys/class/gpu/gpu-0/present", "health"),
    ("sys/class/nic/nic-0/ecc_errors", "health"),
    ("sys/devices/pci0000:00/0000:3b:00.0/uevent", "health"),
    ("sys/bus/pci/drivers/i915/bind", "health"),
    ("sys/class/gpu/gpu-0/temperature", "temperature"),
    ("sys/class/hwmon/hwmon3/temp1_input", "temperature"),
    ("sys/devices/pci0000:00/0000:3b:00.0/hwmon/hwmon2/name", "temperature"),
    ("sys/class/gpu/gpu-0/uuid", "inventory"),
    ("sys/devices/pci0000:00/0000:3b:00.0/vendor", "inventory"),
    ("sys/devices/pci0000:00/0000:3b:00.0/drm/card0/uevent", "inventory"),
    ("sys/devices/pci0000:00/0000:3b:00.0/drm/card0/lmem_total_bytes", "inventory"),
    ("dev/dri/renderD128", "nodes"),
    ("dev/fakegpu0", "nodes"),
    ("sys/class/gpu/gpu-0/firmware_version", "other"),
])
def test_classify(path: str, group: str) -> None:
    assert classify(path) == group
