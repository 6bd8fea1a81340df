"""The reference device plugin reads only the devices inotify names (P3), and still sees everything.

In-process and fast: a fake device backend's tree, the plugin's own event handling (on_events) fed by a real
inotify watch, no gRPC and no kubelet. After every change the plugin's list must equal what a full read of
the tree makes of it, and a health change must have read the one device it touched.
"""

from __future__ import annotations

import argparse
import random
import select
from collections.abc import Iterator
from pathlib import Path

import pytest
from inotify_simple import Event, INotify
from inotify_simple import flags as IN

from fake_devices.backend import DeviceBackend
from fake_devices.generate import generate
from harness.reference.device_plugin import ReferencePlugin, parse_args
from harness.reference.sources import ALL_DEVICES, SeenDevice, SysfsSource

DEVICES = 16
EVENT_WAIT_S = 5.0  # bound on the kernel delivering a write's events
World = tuple[DeviceBackend, argparse.Namespace, INotify]


class Counting(SysfsSource):
    """Counts the device dirs read, to tell a one-device read from a full one."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.reads: list[str] = []

    def _read_one(self, d: Path) -> SeenDevice:
        self.reads.append(d.name)
        return super()._read_one(d)


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    backend = DeviceBackend(tmp_path / "hw", generate(seed=1, counts={"gpu": DEVICES})).start()
    args = parse_args(["--plugin-dir", str(tmp_path), "--sysfs-root", str(tmp_path / "hw"),
                       "--dev-dir", str(tmp_path / "hw" / "dev")])
    watcher = INotify()
    yield backend, args, watcher
    watcher.close()
    backend.stop()


def make(args: argparse.Namespace, defect: str | None = None) -> ReferencePlugin:
    args.defect = defect
    plugin = ReferencePlugin(args)
    plugin.source = Counting(plugin.source.root)  # type: ignore[union-attr]
    plugin.refresh()
    return plugin


def drain(plugin: ReferencePlugin, watcher: INotify) -> None:
    """Feed the plugin every event the last write caused (they are queued when the write returns)."""
    ready, _, _ = select.select([watcher.fileno()], [], [], EVENT_WAIT_S)
    assert ready, f"no inotify event within {EVENT_WAIT_S} s"
    plugin.on_events(watcher.read(timeout=0), watcher, None)


def full_read(args: argparse.Namespace) -> list[dict]:
    return ReferencePlugin(args).devices


def test_a_health_change_reads_one_device(world: World) -> None:
    backend, args, watcher = world
    plugin = make(args)
    plugin.source.watch(watcher)
    plugin.source.reads.clear()
    backend.fail("gpu-3")
    drain(plugin, watcher)
    assert plugin.source.reads == ["gpu-3"]
    assert [d["id"] for d in plugin.devices if d["health"] == "Unhealthy"] == ["gpu-3"]
    assert plugin.devices == full_read(args)


def test_hotplug_and_overflow_read_everything(world: World) -> None:
    backend, args, watcher = world
    plugin = make(args)
    plugin.source.watch(watcher)
    backend.unplug("gpu-5")
    drain(plugin, watcher)
    assert "gpu-5" not in {d["id"] for d in plugin.devices}
    plugin.source.reads.clear()
    backend.plug("gpu-5")
    drain(plugin, watcher)
    assert len(plugin.source.reads) >= DEVICES - 1  # a full read, not one device
    assert plugin.devices == full_read(args)
    # The queue overflowed: the devices that changed are unknown, so all are read.
    plugin.source.reads.clear()
    plugin.on_events([Event(wd=-1, mask=IN.Q_OVERFLOW, cookie=0, name="")], watcher, None)
    assert len(plugin.source.reads) == DEVICES


def test_temp_files_are_not_read(world: World) -> None:
    _, args, watcher = world
    plugin = make(args)
    plugin.source.watch(watcher)
    d = plugin.source.class_root / "gpu" / "gpu-2"
    wd = next(w for w, p in plugin.source._device_wds.items() if p == d)
    assert plugin.source.device_of(Event(wd, IN.CREATE, 0, ".health.x.tmp")) is None
    assert plugin.source.device_of(Event(wd, IN.MOVED_TO, 0, "health")) == d
    assert plugin.source.device_of(Event(wd, IN.DELETE, 0, "health")) == ALL_DEVICES
    assert plugin.source.device_of(Event(wd, IN.CREATE | IN.ISDIR, 0, "sub")) == ALL_DEVICES


def test_one_failure_marks_every_device_unhealthy(world: World) -> None:
    """all-unhealthy-on-one: the failed device is reported, so only the others' health tells the bug."""
    backend, args, watcher = world
    plugin = make(args, "all-unhealthy-on-one")
    plugin.source.watch(watcher)
    backend.fail("gpu-3")
    drain(plugin, watcher)
    assert {d["health"] for d in plugin.devices} == {"Unhealthy"} and len(plugin.devices) == DEVICES
    backend.recover("gpu-3")
    drain(plugin, watcher)
    assert {d["health"] for d in plugin.devices} == {"Healthy"}


@pytest.mark.parametrize("defect", [None, "stuck-unhealthy", "no-hotplug", "ignore-temperature", "all-unhealthy-on-one",
                                    "stuck-unhealthy+no-hotplug"])
def test_partial_reads_agree_with_full_reads(world: World, defect: str | None) -> None:
    """A random run of fails, recoveries, heat, cool, unplugs and plugs: each step's list equals a full read's."""
    backend, args, watcher = world
    plugin = make(args, defect)
    plugin.source.watch(watcher)
    twin = make(args, defect)  # the same defect's state, moved by full reads only
    rng = random.Random(7)
    ids = backend.ids()
    for _ in range(40):
        device = rng.choice(ids)
        present = backend.state(device)["present"]
        op = rng.choice(["fail", "recover", "heat", "cool", "unplug"] if present else ["plug"])
        value = {"heat": 95.0, "cool": 40.0}.get(op)
        before = backend.state(device)
        backend.apply(op, device, value)
        if backend.state(device) == before:
            continue  # nothing written, no event to wait for
        drain(plugin, watcher)
        twin.refresh()
        assert plugin.devices == twin.devices, f"after {op} {device}"
        # The wire messages too: the plugin's reuse those of unchanged devices, the twin's are all built afresh.
        assert plugin.device_list() == twin.device_list(), f"after {op} {device}"


def test_a_burst_of_flips_ends_in_the_last_state(world: World) -> None:
    """Flips written back to back, read as one batch: the list ends where the backend ended (P3's final view)."""
    backend, args, watcher = world
    plugin = make(args)
    plugin.source.watch(watcher)
    rng = random.Random(3)
    for _ in range(30):
        device = rng.choice(["gpu-1", "gpu-2", "gpu-3"])
        (backend.recover if backend.state(device)["health"] == "Unhealthy" else backend.fail)(device)
    drain(plugin, watcher)
    assert {d["id"]: d["health"] for d in plugin.devices} == {d.id: d.health for d in backend.devices()}
    assert plugin.devices == full_read(args)
