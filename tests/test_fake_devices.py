"""The fake hardware backend: seeded inventories, the materialized tree, live
operations, fault scripts, and the control socket and CLI that drive them."""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from inotify_simple import INotify
from inotify_simple import flags as IN

from fake_devices import cli
from fake_devices.backend import DeviceBackend
from fake_devices.control import ControlClient, ControlServer
from fake_devices.generate import generate
from fake_devices.materialize import Materializer, pci_bdf
from fake_devices.model import Device, Inventory
from fake_devices.scripts import (
    Step,
    bad_day,
    describe,
    ecc_burst,
    flap,
    run_script,
    temperature_ramp,
    unplug_replug,
)
from harness.instruments.timeline import Timeline
from harness.spec.subjects import fixtures_dir

INVENTORIES = fixtures_dir() / "inventories"
WAIT_S = 5.0  # upper bound for anything asynchronous; passing runs take milliseconds


@pytest.fixture
def backend(tmp_path: Path) -> Iterator[DeviceBackend]:
    b = DeviceBackend(tmp_path / "hw", generate(1), Timeline())
    try:
        yield b.start()
    finally:
        b.stop()


@pytest.fixture
def backend_drm(tmp_path: Path) -> Iterator[DeviceBackend]:
    b = DeviceBackend(tmp_path / "hw", generate(1), Timeline(), skin="drm")
    try:
        yield b.start()
    finally:
        b.stop()


def read(path: Path) -> str:
    return path.read_text()


# -- model and generation ------------------------------------------------------


def test_same_seed_gives_byte_identical_yaml(tmp_path: Path) -> None:
    generate(7).save(tmp_path / "a.yaml")
    generate(7).save(tmp_path / "b.yaml")
    assert (tmp_path / "a.yaml").read_bytes() == (tmp_path / "b.yaml").read_bytes()
    assert generate(8).to_yaml() != generate(7).to_yaml()
    counts = {"gpu": 2, "nic": 2, "fpga": 1, "generic": 1}
    assert generate(3, counts).to_yaml() == generate(3, dict(reversed(counts.items()))).to_yaml()


def test_the_seed7_fixture_is_generate_7() -> None:
    fixture = INVENTORIES / "gpus-seed7.yaml"
    assert fixture.read_text() == generate(7).to_yaml(), (
        "regenerate: python -c \"from fake_devices.generate import generate; "
        "generate(7).save('fixtures/inventories/gpus-seed7.yaml')\"")


def test_generated_inventory_is_plausible() -> None:
    inv = generate(5, {"gpu": 4, "nic": 2, "fpga": 1, "generic": 1})
    assert inv.seed == 5
    assert [d.id for d in inv.devices] == ["gpu-0", "gpu-1", "gpu-2", "gpu-3", "nic-0", "nic-1", "fpga-0", "generic-0"]
    assert [d.node for d in inv.devices][:2] == ["fakegpu0", "fakegpu1"]
    assert [d.numa for d in inv.devices if d.cls == "gpu"] == [0, 0, 1, 1]
    assert len({d.pci_address for d in inv.devices}) == len({d.uuid for d in inv.devices}) == len(inv.devices)
    assert all(d.health == "Healthy" and d.present and d.ecc_errors == 0 for d in inv.devices)
    assert all(20 < d.temperature_c < 60 for d in inv.devices)
    assert [d.id for d in generate(0).devices] == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
    with pytest.raises(ValueError, match="unknown device class"):
        generate(1, {"tpu": 1})


def test_yaml_round_trip(tmp_path: Path) -> None:
    inv = generate(11, {"gpu": 3, "nic": 1})
    inv.devices[1].health, inv.devices[2].present, inv.devices[0].ecc_errors = "Unhealthy", False, 4
    inv.save(tmp_path / "inv.yaml")
    again = Inventory.load(tmp_path / "inv.yaml")
    assert again == inv
    assert again.get("nic-0").cls == "nic"
    with pytest.raises(KeyError, match="known devices: gpu-0, gpu-1, gpu-2, nic-0"):
        again.get("gpu-9")


def test_legacy_minimal_format_loads_with_defaults() -> None:
    inv = Inventory.load(INVENTORIES / "basic.yaml")
    assert inv.seed is None
    assert [(d.id, d.numa, d.node) for d in inv.devices] == [
        ("gpu-0", 0, "fakegpu0"), ("gpu-1", 0, "fakegpu1"), ("gpu-2", 1, "fakegpu2"), ("gpu-3", 1, "fakegpu3")]
    d = inv.devices[0]
    assert (d.cls, d.present, d.temperature_c, d.health, d.ecc_errors) == ("generic", True, 40.0, "Healthy", 0)
    assert len({x.pci_address for x in inv.devices}) == 4
    assert Inventory.load(INVENTORIES / "basic.yaml") == inv  # defaults are derived, not random


@pytest.mark.parametrize(("text", "match"), [
    ("devices: [\n  {id: gpu-0", "not valid YAML"),
    ("", "empty inventory"),
    ("devices: {id: gpu-0}", "expected a 'devices' list"),
    ("devices: []\ncolor: blue", "unknown top-level key"),
    ("seed: abc\ndevices: []", "'seed' must be an integer"),
    ("devices: [{numa: 0}]", "device #0: missing required field 'id'"),
    ("devices: [{id: gpu-0, health: Sick}]", "device 'gpu-0': field 'health'"),
    ("devices: [{id: gpu-0, pci_address: '3b:00.0'}]", "device 'gpu-0': field 'pci_address'"),
    ("devices: [{id: gpu-0, numa: true}]", "device 'gpu-0': field 'numa'"),
    ("devices: [{id: gpu-0, temperature_c: hot}]", "device 'gpu-0': field 'temperature_c'"),
    ("devices: [{id: gpu-0, cls: tpu}]", "device 'gpu-0': field 'cls'"),
    ("devices: [{id: ../etc, dev: x}]", "field 'id'"),
    ("devices: [{id: gpu-0, dev: ../../etc/passwd}]", "device 'gpu-0': field 'node'"),
    ("devices: [{id: gpu-0, colour: red}]", r"device 'gpu-0': unknown field\(s\) \['colour'\]"),
    ("devices: [{id: gpu-0, dev: a, node: b}]", "both 'node' and legacy 'dev'"),
    ("devices: [{id: gpu-0}, {id: gpu-0}]", "device 'gpu-0': duplicate id"),
    ("devices: [{id: gpu-0, dev: n}, {id: gpu-1, dev: n}]", "device 'gpu-1': duplicate node"),
    ("devices: [7]", "device #0: expected a mapping"),
])
def test_bad_inventories_name_the_file_and_the_field(tmp_path: Path, text: str, match: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match=match) as info:
        Inventory.load(path)
    assert str(info.value).startswith(f"{path}: ")


def test_missing_inventory_file_is_a_value_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cannot read inventory"):
        Inventory.load(tmp_path / "nope.yaml")


# -- the materialized tree -------------------------------------------------------


def test_neutral_layout(tmp_path: Path) -> None:
    inv = generate(2, {"gpu": 2, "nic": 1})
    m = Materializer(tmp_path)
    m.write_all(inv)
    gpu = inv.get("gpu-1")
    d = tmp_path / "sys" / "class" / "gpu" / "gpu-1"
    assert m.device_dir(gpu) == d and m.node_path(gpu) == tmp_path / "dev" / "fakegpu1"
    assert read(d / "health") == "Healthy\n"
    assert read(d / "temperature") == f"{round(gpu.temperature_c * 1000)}\n"
    assert read(d / "numa_node") == f"{gpu.numa}\n" and read(d / "present") == "1\n"
    for name, value in [("uuid", gpu.uuid), ("vendor", gpu.vendor), ("model", gpu.model), ("serial", gpu.serial),
                        ("pci_address", gpu.pci_address), ("ecc_errors", "0"),
                        ("memory_mib", str(gpu.memory_mib)), ("node", "fakegpu1")]:
        assert read(d / name) == value + "\n", name
    assert (tmp_path / "sys" / "class" / "nic" / "nic-0" / "health").is_file()
    assert not (tmp_path / "sys" / "class" / "drm").exists()
    assert sorted(p.name for p in (tmp_path / "dev").iterdir()) == ["fakegpu0", "fakegpu1", "fakenic0"]
    assert not [p for p in tmp_path.rglob(".*") if p.is_file()]  # no temp files left behind


def test_drm_skin_adds_the_drm_layout_for_gpus(tmp_path: Path) -> None:
    inv = generate(2, {"gpu": 2, "nic": 1})
    m = Materializer(tmp_path, skin="drm")
    m.write_all(inv)
    for n, gpu in enumerate(d for d in inv.devices if d.cls == "gpu"):
        card = tmp_path / "sys" / "class" / "drm" / f"card{n}"
        assert m.card_dir(gpu) == card
        assert read(card / "device" / "vendor") == "0x8086\n"
        assert read(card / "device" / "device").startswith("0x")
        assert read(card / "device" / "numa_node") == f"{gpu.numa}\n"
        assert f"PCI_SLOT_NAME={gpu.pci_address}\n" in read(card / "device" / "uevent")
        assert sorted(p.name for p in (card / "device" / "drm").iterdir()) == [f"card{n}", f"renderD{128 + n}"]
        assert (tmp_path / "dev" / "dri" / f"card{n}").exists()
        assert (tmp_path / "dev" / "dri" / f"renderD{128 + n}").exists()
        assert (m.device_dir(gpu) / "health").is_file()  # the neutral files too
    assert sorted(p.name for p in (tmp_path / "sys" / "class" / "drm").iterdir()) == [
        "card0", "card1", "renderD128", "renderD129"]
    m.remove_device(inv.get("gpu-1"))
    assert not os.path.lexists(tmp_path / "sys" / "class" / "drm" / "card1")
    assert not (tmp_path / "dev" / "dri" / "card1").exists() and not (tmp_path / "dev" / "dri" / "renderD129").exists()
    assert not (tmp_path / "sys" / "class" / "gpu" / "gpu-1").exists() and not (tmp_path / "dev" / "fakegpu1").exists()
    m.write_device(inv.get("gpu-1"))  # replugged: the same card number again
    assert read(tmp_path / "sys" / "class" / "drm" / "card1" / "device" / "vendor") == "0x8086\n"
    with pytest.raises(ValueError, match="unknown skin"):
        Materializer(tmp_path, skin="nvidia")


def drm_tree(tmp_path: Path, inv: Inventory | None = None) -> tuple[Materializer, Inventory]:
    inv = inv or generate(2, {"gpu": 2, "nic": 1})
    m = Materializer(tmp_path, skin="drm")
    m.write_all(inv)
    return m, inv


def test_drm_cards_link_into_pci_device_dirs_as_on_linux(tmp_path: Path) -> None:
    m, inv = drm_tree(tmp_path)
    sys_dir = tmp_path / "sys"
    for n, gpu in enumerate(d for d in inv.devices if d.cls == "gpu"):
        bdf = gpu.pci_address
        pci = sys_dir / "devices" / "pci0000:00" / bdf
        assert m.pci_dir(gpu) == pci and pci.is_dir() and not pci.is_symlink()
        for name in (f"card{n}", f"renderD{128 + n}"):
            link = sys_dir / "class" / "drm" / name
            # Relative, and inside ROOT/sys: the tree stays valid wherever ROOT/sys is seen.
            assert os.readlink(link) == f"../../devices/pci0000:00/{bdf}/drm/{name}"
            assert link.resolve() == (pci / "drm" / name).resolve()
            assert (link / "device").resolve() == pci.resolve()
            assert (link / "subsystem").resolve() == (sys_dir / "class" / "drm").resolve()
        # What `readlink -f /sys/class/drm/cardN/device` gives a plugin: the PCI address.
        assert os.path.realpath(sys_dir / "class" / "drm" / f"card{n}" / "device").endswith("/" + bdf)
        assert read(pci / "class") == "0x030000\n"
        assert read(pci / "vendor") == read(pci / "subsystem_vendor") == "0x8086\n"
        assert read(pci / "device") == read(pci / "subsystem_device")
        assert read(pci / "numa_node") == f"{gpu.numa}\n"
        assert read(pci / "local_cpulist").strip()
        uevent = read(pci / "uevent")
        device_id = read(pci / "device").strip()[2:].upper()
        assert "DRIVER=i915\n" in uevent and f"PCI_SLOT_NAME={bdf}\n" in uevent
        assert f"PCI_ID=8086:{device_id}\n" in uevent
        assert read(pci / "drm" / f"card{n}" / "dev") == f"226:{n}\n"
        assert read(pci / "drm" / f"renderD{128 + n}" / "dev") == f"226:{128 + n}\n"
        # The driver: a link to the bus's driver dir, which links back.
        assert os.readlink(pci / "driver") == "../../../bus/pci/drivers/i915"
        assert (pci / "driver").resolve() == (sys_dir / "bus" / "pci" / "drivers" / "i915").resolve()
        assert (sys_dir / "bus" / "pci" / "drivers" / "i915" / bdf).resolve() == pci.resolve()
        assert (sys_dir / "bus" / "pci" / "devices" / bdf).resolve() == pci.resolve()
        # udev's by-path names.
        by_path = tmp_path / "dev" / "dri" / "by-path"
        assert os.readlink(by_path / f"pci-{bdf}-card") == f"../card{n}"
        assert os.readlink(by_path / f"pci-{bdf}-render") == f"../renderD{128 + n}"
        assert (by_path / f"pci-{bdf}-card").resolve() == (tmp_path / "dev" / "dri" / f"card{n}").resolve()
    # Only gpus get a DRM identity; the nic keeps its neutral dir only.
    nic = inv.get("nic-0")
    assert m.pci_dir(nic) is None and not (sys_dir / "devices" / "pci0000:00" / nic.pci_address).exists()
    assert not [p for p in tmp_path.rglob(".*") if p.is_file() or p.is_symlink()]  # no temp files or links


def test_drm_tree_resolves_when_its_sys_is_seen_elsewhere(tmp_path: Path) -> None:
    """The links stay inside ROOT/sys: a copy (as a bind of ROOT/sys over /sys would show it) resolves the same."""
    _, inv = drm_tree(tmp_path / "hw")
    moved = tmp_path / "elsewhere" / "sys"
    shutil.copytree(tmp_path / "hw" / "sys", moved, symlinks=True)
    bdf = inv.get("gpu-1").pci_address
    card = moved / "class" / "drm" / "card1"
    assert os.path.realpath(card / "device") == str(moved / "devices" / "pci0000:00" / bdf)
    assert os.path.basename(os.path.realpath(card / "device" / "driver")) == "i915"
    assert read(card / "device" / "vendor") == "0x8086\n"


def test_drm_tree_resolves_with_root_sys_bound_over_sys(tmp_path: Path) -> None:
    """What the module docstring tells launchers to do, done: ROOT/sys over /sys in a private mount namespace."""
    _, inv = drm_tree(tmp_path)
    unshare = shutil.which("unshare")
    if unshare is None or os.geteuid() != 0:
        pytest.skip("needs root and unshare(1) to bind over /sys in a private mount namespace")
    script = ("mount --bind \"$1\" /sys && readlink -f /sys/class/drm/card1/device "
              "&& readlink -f /sys/class/drm/card1/device/driver && cat /sys/class/drm/card1/device/vendor")
    proc = subprocess.run([unshare, "--mount", "--propagation", "private", "sh", "-c", script, "sh",
                           str(tmp_path / "sys")], capture_output=True, text=True, timeout=WAIT_S)
    if proc.returncode != 0 and ("unshare:" in proc.stderr or "permission denied" in proc.stderr.lower()):
        pytest.skip(f"no private mount namespace here: {proc.stderr.strip()}")
    assert proc.returncode == 0, proc.stderr
    bdf = inv.get("gpu-1").pci_address
    assert proc.stdout.split() == [f"/sys/devices/pci0000:00/{bdf}", "/sys/bus/pci/drivers/i915", "0x8086"]


def test_drm_driver_comes_from_the_inventory(tmp_path: Path) -> None:
    inv = generate(2, {"gpu": 2})
    inv.devices[1].driver = "xe"
    m, _ = drm_tree(tmp_path, inv)
    pci0, pci1 = m.pci_dir(inv.devices[0]), m.pci_dir(inv.devices[1])
    assert pci0 is not None and pci1 is not None
    assert os.path.basename(os.readlink(pci0 / "driver")) == "i915"
    assert os.path.basename(os.readlink(pci1 / "driver")) == "xe"
    assert "DRIVER=xe\n" in read(pci1 / "uevent")
    assert (tmp_path / "sys" / "bus" / "pci" / "drivers" / "xe" / pci1.name).resolve() == pci1.resolve()
    assert not os.path.lexists(tmp_path / "sys" / "bus" / "pci" / "drivers" / "i915" / pci1.name)
    # The field round-trips through YAML, and inventories without it dump as before.
    again = Inventory.from_yaml(inv.to_yaml())
    assert again.devices[1].driver == "xe" and "driver" not in again.devices[0].to_dict()
    with pytest.raises(ValueError, match="field 'driver'"):
        Inventory.from_yaml("devices: [{id: gpu-0, driver: ../i915}]")


def test_drm_skin_normalises_pci_addresses_and_refuses_shared_ones(tmp_path: Path) -> None:
    assert pci_bdf("3B:00.0") == "0000:3b:00.0" and pci_bdf("0000:3b:1f.7") == "0000:3b:1f.7"
    with pytest.raises(ValueError, match="not a PCI address"):
        pci_bdf("3b-00-0")
    gpu = Device(id="gpu-0", cls="gpu", pci_address="3B:00.0")  # hand-built: not validated
    m = Materializer(tmp_path / "a", skin="drm")
    m.write_all(Inventory(devices=[gpu]))
    assert (tmp_path / "a" / "sys" / "devices" / "pci0000:00" / "0000:3b:00.0" / "vendor").is_file()
    twins = Inventory(devices=[Device(id="gpu-0", cls="gpu", pci_address="0000:3b:00.0"),
                               Device(id="gpu-1", cls="gpu", pci_address="0000:3b:00.0")])
    with pytest.raises(ValueError, match=r"'gpu-1': PCI address 0000:3b:00\.0 is also 'gpu-0'"):
        Materializer(tmp_path / "b", skin="drm").write_all(twins)


def test_drm_nodes_carry_the_drm_numbers(tmp_path: Path) -> None:
    m, _ = drm_tree(tmp_path)
    if not m.char_devices:
        pytest.skip(f"mknod is not permitted here ({m.mknod_error}), so nodes are regular files")
    for n in (0, 1):
        for name, minor in ((f"card{n}", n), (f"renderD{128 + n}", 128 + n)):
            st = os.lstat(tmp_path / "dev" / "dri" / name)
            assert stat.S_ISCHR(st.st_mode), name
            assert (os.major(st.st_rdev), os.minor(st.st_rdev)) == (226, minor), name
            assert stat.S_IMODE(st.st_mode) == 0o666
    st = os.lstat(tmp_path / "dev" / "fakegpu0")  # neutral nodes stay harmless: /dev/null's numbers
    assert (os.major(st.st_rdev), os.minor(st.st_rdev)) == (1, 3)


def test_drm_nodes_are_regular_files_with_a_reason_without_mknod(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kw: object) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "mknod", refuse)
    m, _ = drm_tree(tmp_path)
    assert m.char_devices is False and "Operation not permitted" in (m.mknod_error or "")
    assert stat.S_ISREG(os.lstat(tmp_path / "dev" / "dri" / "renderD129").st_mode)


def test_drm_unplug_removes_every_link_and_plug_restores_them(backend_drm: DeviceBackend) -> None:
    m, root = backend_drm.materializer, backend_drm.root
    gpu = backend_drm.devices()[1]
    pci = m.pci_dir(gpu)
    assert pci is not None
    bdf = pci.name
    paths = [*m.class_links(gpu), *m.bus_links(gpu), *m.by_path_links(gpu), *m.drm_node_paths(gpu),
             pci, m.device_dir(gpu), m.node_path(gpu)]
    assert all(os.path.lexists(p) for p in paths)
    with INotify() as inotify:
        inotify.add_watch(str(root / "sys" / "class" / "drm"), IN.CREATE | IN.DELETE | IN.MOVED_TO)
        inotify.add_watch(str(pci.parent), IN.CREATE | IN.MOVED_TO | IN.MOVED_FROM)
        backend_drm.unplug(gpu.id)
        assert not [p for p in paths if os.path.lexists(p)]
        assert sorted(name for name, mask in drain(inotify) if mask & IN.DELETE) == ["card1", "renderD129"]
        assert not os.path.lexists(root / "sys" / "bus" / "pci" / "drivers" / "i915" / bdf)
        backend_drm.fail(gpu.id)  # changed while unplugged
        backend_drm.plug(gpu.id)
        assert all(os.path.lexists(p) for p in paths)
        events = drain(inotify)
        # The PCI dir arrives whole by rename, and the class links come after it.
        assert (bdf, IN.MOVED_TO | IN.ISDIR) in events and (bdf, IN.CREATE | IN.ISDIR) not in events
        order = [name for name, _ in events]
        assert order.index(bdf) < order.index("card1") and order.index(bdf) < order.index("renderD129")
    card = root / "sys" / "class" / "drm" / "card1"  # the same card number again
    assert os.path.realpath(card / "device").endswith("/" + bdf)
    assert read(m.device_dir(gpu) / "health") == "Unhealthy\n"


def test_drm_updates_do_not_rewrite_unchanged_files(backend_drm: DeviceBackend) -> None:
    gpu = backend_drm.devices()[0]
    pci = backend_drm.materializer.pci_dir(gpu)
    assert pci is not None
    with INotify() as inotify:
        for d in (pci, pci / "drm" / "card0", backend_drm.materializer.device_dir(gpu)):
            inotify.add_watch(str(d), IN.CREATE | IN.MOVED_TO | IN.OPEN | IN.ACCESS)
        backend_drm.heat(gpu.id, 88.0)
        events = drain(inotify)
    # One atomic replace of `temperature`; nothing else touched, and nothing opened under its real name.
    assert [name for name, mask in events if mask & IN.MOVED_TO] == ["temperature"]
    assert not [name for name, mask in events if mask & (IN.OPEN | IN.ACCESS) and not name.startswith(".")]


def test_nodes_are_char_devices_or_regular_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    m = Materializer(tmp_path / "a")
    m.write_all(generate(1, {"gpu": 1}))
    mode = os.lstat(tmp_path / "a" / "dev" / "fakegpu0").st_mode
    assert stat.S_ISCHR(mode) if m.char_devices else stat.S_ISREG(mode)
    assert (m.mknod_error is None) == m.char_devices

    def refuse(*args: object, **kw: object) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "mknod", refuse)
    m = Materializer(tmp_path / "b")
    m.write_all(generate(1, {"gpu": 1}))
    assert m.char_devices is False and "Operation not permitted" in (m.mknod_error or "")
    assert stat.S_ISREG(os.lstat(tmp_path / "b" / "dev" / "fakegpu0").st_mode)


def drain(inotify: INotify) -> list[tuple[str, int]]:
    return [(e.name, e.mask) for e in inotify.read(timeout=0)]


def test_writes_are_atomic_and_devices_appear_whole(backend: DeviceBackend) -> None:
    gpu = backend.devices()[0]
    d = backend.materializer.device_dir(gpu)
    with INotify() as inotify:
        inotify.add_watch(str(d), IN.CREATE | IN.MODIFY | IN.CLOSE_WRITE | IN.MOVED_TO)
        inotify.add_watch(str(d.parent), IN.CREATE | IN.MOVED_TO | IN.MOVED_FROM | IN.DELETE)
        backend.fail(gpu.id)
        events = drain(inotify)
        health = [mask for name, mask in events if name == "health"]
        assert health and all(mask & IN.MOVED_TO for mask in health), events  # never written in place
        assert read(d / "health") == "Unhealthy\n"
        assert not [name for name, _ in events if name in ("temperature", "numa_node")]  # unchanged: untouched
        backend.unplug(gpu.id)
        assert (gpu.id, IN.MOVED_FROM | IN.ISDIR) in drain(inotify)
        backend.plug(gpu.id)
        events = drain(inotify)
        # The device dir arrives by rename, complete: never created empty and filled.
        assert (gpu.id, IN.MOVED_TO | IN.ISDIR) in events and (gpu.id, IN.CREATE | IN.ISDIR) not in events
    assert read(d / "health") == "Unhealthy\n"  # it was unplugged while failed, and came back so


# -- the live backend ------------------------------------------------------------


def test_backend_ops_write_through_and_are_recorded(backend: DeviceBackend) -> None:
    tl = backend.timeline
    assert tl is not None
    start = tl.events(kind="devices.start")[0]
    assert start.get("char_devices") == backend.char_devices and len(start.get("devices")) == 4
    gpu = backend.devices()[1]
    d, node = backend.materializer.device_dir(gpu), backend.materializer.node_path(gpu)
    t0 = tl.now()
    backend.fail(gpu.id)
    assert read(d / "health") == "Unhealthy\n"
    backend.recover(gpu.id)
    assert read(d / "health") == "Healthy\n"
    backend.heat(gpu.id, 97.5)
    assert read(d / "temperature") == "97500\n" and backend.state(gpu.id)["health"] == "Healthy"
    backend.cool(gpu.id, 45)
    assert read(d / "temperature") == "45000\n"
    backend.ecc(gpu.id)
    backend.ecc(gpu.id, count=3)
    assert read(d / "ecc_errors") == "4\n"
    backend.unplug(gpu.id)
    assert not d.exists() and not os.path.lexists(node) and backend.state(gpu.id)["present"] is False
    backend.plug(gpu.id)
    assert read(d / "present") == "1\n" and os.path.lexists(node)
    events = [e for e in tl.events(t0) if e.kind.startswith("device.")]
    assert [e.kind for e in events] == ["device.fail", "device.recover", "device.heat", "device.cool", "device.ecc",
                                        "device.ecc", "device.unplug", "device.plug"]
    assert all(e.source == "devices" and e.get("device") == gpu.id for e in events)
    assert events[0].data == {"device": gpu.id, "health": "Unhealthy", "temperature_c": gpu.temperature_c,
                              "present": True, "ecc_errors": 0}
    assert events[2].get("temperature_c") == 97.5 and events[5].get("ecc_errors") == 4
    assert events[6].get("present") is False
    assert backend.devices()[1].present and backend.state(gpu.id)["ecc_errors"] == 4


def test_backend_rejects_unknown_devices_and_bad_values(backend: DeviceBackend) -> None:
    with pytest.raises(KeyError, match="unknown device 'gpu-9'; known devices: gpu-0, gpu-1, gpu-2, gpu-3"):
        backend.fail("gpu-9")
    with pytest.raises(ValueError, match="positive integer"):
        backend.ecc("gpu-0", 0)
    with pytest.raises(ValueError, match="finite number"):
        backend.heat("gpu-0", float("nan"))
    with pytest.raises(ValueError, match="unknown device operation"):
        backend.apply("explode", "gpu-0")
    snapshot = backend.devices()[0]
    snapshot.health = "Unhealthy"  # a snapshot: changing it changes nothing
    assert backend.state("gpu-0")["health"] == "Healthy"


def test_backend_lifecycle(tmp_path: Path) -> None:
    inv = generate(4, {"gpu": 2})
    b = DeviceBackend(tmp_path / "hw", inv)  # no timeline: works, records nothing
    b.fail("gpu-0")  # before start: the model changes, nothing is written
    assert not (tmp_path / "hw").exists() and inv.get("gpu-0").health == "Healthy"  # the caller's copy is untouched
    b.unplug("gpu-1")
    with b:
        assert read(tmp_path / "hw" / "sys" / "class" / "gpu" / "gpu-0" / "health") == "Unhealthy\n"
        assert not (tmp_path / "hw" / "sys" / "class" / "gpu" / "gpu-1").exists()
    assert not list((tmp_path / "hw" / "sys" / "class" / "gpu").iterdir())
    assert not [p for p in (tmp_path / "hw" / "dev").iterdir()]
    b.stop()  # idempotent


def test_backend_is_thread_safe(backend: DeviceBackend) -> None:
    def hammer() -> None:
        for _ in range(25):
            backend.ecc("gpu-2")

    threads = [threading.Thread(target=hammer) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT_S)
    assert backend.state("gpu-2")["ecc_errors"] == 100
    assert read(backend.materializer.device_dir(backend.devices()[2]) / "ecc_errors") == "100\n"


# -- fault scripts -----------------------------------------------------------------


def test_script_shapes() -> None:
    assert flap("gpu-0", 1.0, 2) == [Step(0.0, "fail", "gpu-0"), Step(0.5, "recover", "gpu-0"),
                                     Step(1.0, "fail", "gpu-0"), Step(1.5, "recover", "gpu-0")]
    ramp = temperature_ramp("gpu-1", 40, 52, 5, 0.5)
    assert [(s.op, s.value) for s in ramp] == [("heat", 40), ("heat", 45), ("heat", 50), ("heat", 52),
                                               ("cool", 47), ("cool", 42), ("cool", 40)]
    assert [s.at_s for s in ramp] == [k * 0.5 for k in range(7)]
    assert unplug_replug("nic-0", 2.0) == [Step(0.0, "unplug", "nic-0"), Step(2.0, "plug", "nic-0")]
    assert ecc_burst("gpu-0", 3, 0.1) == [Step(k * 0.1, "ecc", "gpu-0", 1.0) for k in range(3)]
    assert describe(ramp[:1] + ecc_burst("gpu-0", 1, 1) + flap("gpu-0", 1, 1)[:1]) == [
        "+0.000s heat gpu-1 to 40 C", "+0.000s ecc gpu-0 +1 error(s)", "+0.000s fail gpu-0"]
    with pytest.raises(ValueError, match="period_s must be a positive number"):
        flap("gpu-0", 0, 3)
    with pytest.raises(ValueError, match="at most 10000 cycles of 3600s"):
        flap("gpu-0", 1e300, 3)
    with pytest.raises(ValueError, match="unknown op"):
        Step(0.0, "melt", "gpu-0")
    with pytest.raises(ValueError, match="needs a temperature"):
        Step(0.0, "heat", "gpu-0")


@pytest.mark.parametrize("seed", [0, 1, 7, 42, 1234])
def test_bad_day_is_seeded_and_cleans_up_after_itself(seed: int) -> None:
    inv = generate(seed, {"gpu": 4, "nic": 2})
    steps = bad_day(inv, seed, 60.0)
    assert steps == bad_day(inv, seed, 60.0)
    assert steps and [s.at_s for s in steps] == sorted(s.at_s for s in steps)
    assert all(0 <= s.at_s <= 60.0 for s in steps)
    failed: set[str] = set()
    hot: set[str] = set()
    unplugged: set[str] = set()
    for s in steps:
        assert s.device in inv.ids()
        if s.op == "fail":
            assert s.device not in failed
            failed.add(s.device)
        elif s.op == "recover":
            failed.remove(s.device)
        elif s.op == "heat":
            hot.add(s.device)
        elif s.op == "cool":
            hot.remove(s.device)
            assert s.value == inv.get(s.device).temperature_c
        elif s.op == "unplug":
            assert s.device not in unplugged
            unplugged.add(s.device)
        elif s.op == "plug":
            unplugged.remove(s.device)
    assert not failed and not hot and not unplugged


def test_bad_day_differs_by_seed() -> None:
    inv = generate(0, {"gpu": 4, "nic": 2})
    assert len({tuple(bad_day(inv, seed, 60.0)) for seed in range(5)}) > 1


def test_run_script_plays_a_short_flap_in_order(backend: DeviceBackend) -> None:
    tl = backend.timeline
    assert tl is not None
    t0 = tl.now()
    steps = flap("gpu-0", 0.02, 3)
    assert run_script(backend, steps, threading.Event()) == 6
    events = [e for e in tl.events(t0) if e.kind.startswith("device.")]
    assert [e.kind for e in events] == ["device.fail", "device.recover"] * 3
    # A schedule: no step ran before its time. Offsets count from before the script started,
    # so a late first step (a loaded machine) cannot make a later one look early.
    offsets = [(e.t_ns - t0) / 1e9 for e in events]
    assert all(off >= s.at_s for off, s in zip(offsets, steps, strict=True))
    assert backend.state("gpu-0")["health"] == "Healthy"


def test_run_script_stops_early(backend: DeviceBackend) -> None:
    stop = threading.Event()
    stop.set()
    assert run_script(backend, flap("gpu-0", 10.0, 3), stop) == 0
    assert backend.state("gpu-0")["health"] == "Healthy"


# -- control socket and CLI ----------------------------------------------------------


@pytest.fixture
def server(backend: DeviceBackend, tmp_path: Path) -> Iterator[ControlServer]:
    s = ControlServer(backend, tmp_path / "ctl.sock")
    try:
        yield s.start()
    finally:
        s.stop()


def raw_call(path: Path, payload: bytes) -> dict:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(WAIT_S)
        sock.connect(str(path))
        sock.sendall(payload)
        with sock.makefile("rb") as reader:
            return json.loads(reader.readline())


def test_control_round_trip(server: ControlServer, backend: DeviceBackend) -> None:
    client = ControlClient(server.socket_path)
    reply = client.call("fail", "gpu-1")
    assert reply["ok"] and reply["state"]["health"] == "Unhealthy"
    assert backend.state("gpu-1")["health"] == "Unhealthy"
    assert client.call("heat", "gpu-1", value=95.0)["state"]["temperature_c"] == 95.0
    assert client.call("ecc", "gpu-1", value=2)["state"]["ecc_errors"] == 2
    assert client.call("ecc", "gpu-1")["state"]["ecc_errors"] == 3
    assert client.call("state", "gpu-1")["state"] == backend.state("gpu-1")
    listed = client.call("list")
    assert listed["ok"] and [d["id"] for d in listed["devices"]] == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
    assert client.call("unplug", "gpu-3")["state"]["present"] is False
    assert client.call("plug", "gpu-3")["state"]["present"] is True


@pytest.mark.parametrize(("payload", "match"), [
    (b"this is not json\n", "not a JSON request"),
    (b"[1, 2]\n", "must be a JSON object"),
    (b'{"op": "explode", "device": "gpu-0"}\n', "unknown op 'explode'"),
    (b'{"device": "gpu-0"}\n', "unknown op None"),
    (b'{"op": "fail"}\n', "fail needs a 'device'"),
    (b'{"op": "fail", "device": "gpu-9"}\n', "unknown device 'gpu-9'; known devices: gpu-0"),
    (b'{"op": "heat", "device": "gpu-0"}\n', "heat needs a temperature"),
    (b'{"op": "heat", "device": "gpu-0", "value": "hot"}\n', "'value' must be a number"),
    (b'{"op": "ecc", "device": "gpu-0", "value": 1.5}\n', "positive integer"),
    (b'{"op": "flap", "device": "gpu-0", "period_s": -1}\n', "'period_s' must be a positive number"),
    (b'{"op": "flap", "device": "gpu-0", "cycles": 0}\n', "'cycles' must be a positive integer"),
    # A period past what a timer holds killed the flap thread with the device left failed (issue 28);
    # a billion cycles filled memory with steps.
    (b'{"op": "flap", "device": "gpu-0", "period_s": 1e300}\n', "'period_s' must be a positive number (at most"),
    (b'{"op": "flap", "device": "gpu-0", "cycles": 1000000000}\n', "'cycles' must be a positive integer (at most"),
    (b'{"op": "flap", "device": "gpu-9"}\n', "unknown device 'gpu-9'"),
])
def test_control_answers_bad_requests_and_survives(server: ControlServer, payload: bytes, match: str) -> None:
    reply = raw_call(server.socket_path, payload)
    assert reply["ok"] is False and match in reply["error"]
    assert ControlClient(server.socket_path).call("state", "gpu-0")["ok"]  # still serving


def test_control_flap_runs_in_the_background(server: ControlServer, backend: DeviceBackend) -> None:
    tl = backend.timeline
    assert tl is not None
    t0 = tl.now()
    reply = ControlClient(server.socket_path).call("flap", "gpu-2", period_s=0.02, cycles=2)
    assert reply["ok"] and reply["steps"] == 4
    recovers = []
    for _ in range(2):
        recovers.append(tl.wait_for(lambda e: e.kind == "device.recover" and e.get("device") == "gpu-2"
                                    and e not in recovers, WAIT_S, "a flap recovery", t0))
    kinds = [e.kind for e in tl.events(t0) if e.get("device") == "gpu-2"]
    assert kinds == ["device.fail", "device.recover"] * 2


def test_control_stop_cleans_up(backend: DeviceBackend, tmp_path: Path) -> None:
    path = tmp_path / "c.sock"
    server = ControlServer(backend, path).start()
    idle = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # a client that never says anything
    try:
        idle.connect(str(path))
        ControlClient(path).call("flap", "gpu-0", period_s=30.0, cycles=5)  # would run for minutes
        with pytest.raises(FileExistsError, match="already listening"):
            ControlServer(backend, path).start()
    finally:
        server.stop()
        idle.close()
    assert not path.exists()
    assert not [t for t in threading.enumerate() if t.name.startswith("fakelet-control")]
    ControlServer(backend, path).start().stop()  # the path is free again


def test_cli_needs_a_session(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("FAKELET_CONTROL_SOCKET", raising=False)
    assert cli.main(["fail", "gpu-0"]) == 2
    assert "no session: pass --socket or set FAKELET_CONTROL_SOCKET" in capsys.readouterr().err


def test_cli_unreachable_socket(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--socket", str(tmp_path / "gone.sock"), "list"]) == 2
    assert "cannot reach the session" in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "match"), [
    (["heat", "gpu-0"], "heat needs a temperature"),
    (["heat", "gpu-0", "warm"], "must be a number"),
    (["fail"], "fail needs a device id"),
    (["fail", "gpu-0", "3"], "fail takes no value"),
    (["ecc", "gpu-0", "-1"], "ecc count must be a positive integer"),
    (["flap", "gpu-0", "--cycles", "0"], "--cycles must be a positive integer"),
    (["explode", "gpu-0"], "invalid choice"),
    (["list", "gpu-0"], "list takes no device"),
])
def test_cli_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], match: str) -> None:
    assert cli.main(["--socket", str(tmp_path / "x.sock"), *argv]) == 2
    assert match in capsys.readouterr().err


def test_cli_drives_a_session(server: ControlServer, backend: DeviceBackend, monkeypatch: pytest.MonkeyPatch,
                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("FAKELET_CONTROL_SOCKET", str(server.socket_path))
    assert cli.main(["fail", "gpu-0"]) == 0
    assert "gpu-0: Unhealthy" in capsys.readouterr().out
    assert cli.main(["heat", "gpu-1", "99"]) == 0 and backend.state("gpu-1")["temperature_c"] == 99.0
    assert cli.main(["list"]) == 0
    assert len(capsys.readouterr().out.strip().splitlines()) == 5  # heat's line, then four devices
    assert cli.main(["--json", "state", "gpu-0"]) == 0
    assert json.loads(capsys.readouterr().out)["state"]["health"] == "Unhealthy"
    assert cli.main(["recover", "gpu-9"]) == 2
    assert "unknown device 'gpu-9'" in capsys.readouterr().err


def test_device_defaults_are_complete() -> None:
    d = Device(id="nic-3")
    assert (d.node, d.cls, d.health, d.present) == ("fakenic3", "generic", "Healthy", True)
    assert d.uuid and d.serial and Device.from_dict(d.to_dict()) == d


def test_large_inventories_share_pci_buses_and_too_large_is_refused() -> None:
    inv = generate(1, {"gpu": 1000})
    assert len({d.pci_address for d in inv.devices}) == 1000
    with pytest.raises(ValueError, match="no free PCI address left"):
        generate(1, {"gpu": 8000})


@pytest.mark.parametrize(("op", "value", "message"), [
    ("heat", 1e308, "out of range"), ("cool", -300.0, "out of range"), ("ecc", 10**9, "at most")])
def test_out_of_range_controls_change_nothing(tmp_path: Path, op: str, value: float, message: str) -> None:
    from fake_devices.backend import DeviceBackend
    from fake_devices.model import Device, Inventory
    with DeviceBackend(tmp_path / "hw", Inventory(devices=[Device("gpu-0", cls="gpu")])) as backend:
        before = backend.state("gpu-0")
        files = {p: p.read_bytes() for p in (tmp_path / "hw").rglob("*") if p.is_file()}
        with pytest.raises(ValueError, match=message):
            backend.apply(op, "gpu-0", value)
        assert backend.state("gpu-0") == before
        assert {p: p.read_bytes() for p in (tmp_path / "hw").rglob("*") if p.is_file()} == files
