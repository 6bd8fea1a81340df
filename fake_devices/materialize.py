"""Lay the fake hardware out on disk, the way plugins expect to find real hardware.

Layouts ("skins"), all under one root that a plugin gets as its sysfs/dev prefix:

neutral
    ROOT/sys/class/<cls>/<id>/{uuid,health,temperature,numa_node,vendor,model,
    serial,pci_address,present,ecc_errors,memory_mib,node}: one value per file,
    newline-terminated; `temperature` in millidegrees C like Linux hwmon;
    `present` 1 or 0; `node` names the device node, ROOT/dev/<node>.
drm
    The neutral files, plus for each gpu-class device N (its index among the
    inventory's gpus) the DRM layout Intel's GPU plugin scans with -prefix:
    ROOT/sys/class/drm/card<N>/device/{vendor,device,numa_node,uevent},
    ROOT/sys/class/drm/card<N>/device/drm/{card<N>,renderD<128+N>}/ and the
    nodes ROOT/dev/dri/card<N>, ROOT/dev/dri/renderD<128+N>.

Watchers must never see half a device:
- a value file is replaced atomically (temp file in the same directory, then
  os.replace), so inotify reports IN_MOVED_TO with the complete content;
- a new device directory is built complete in ROOT/.staging and renamed into
  place in one step, after its device nodes exist;
- a removed device directory is first renamed out of the tree, then deleted.
Unchanged values are not rewritten, so every file event means a real change.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
import threading
import zlib
from pathlib import Path

from fake_devices.model import Device, Inventory, atomic_write_text

SKINS = ("neutral", "drm")
STAGING = ".staging"
RENDER_BASE = 128  # DRM render nodes are renderD128 + card index
# The PCI vendor ID Intel's GPU plugin requires in device/vendor before it
# considers a card at all; the drm skin exists to satisfy that plugin.
DRM_VENDOR_ID = "0x8086"
DRM_DRIVER = "i915"
# Nodes are char devices with /dev/null's numbers, as Intel's own fake-device
# generator makes them: a container that opens one gets a harmless fd.
NODE_MAJOR, NODE_MINOR = 1, 3
NODE_MODE = 0o666


class Materializer:
    def __init__(self, root: Path, skin: str = "neutral") -> None:
        if skin not in SKINS:
            raise ValueError(f"unknown skin {skin!r}; known: {list(SKINS)}")
        self.root, self.skin = Path(root), skin
        self.mknod_error: str | None = None  # why nodes are regular files, once that is known
        self._char_devices: bool | None = None  # probed lazily: constructing touches no disk
        self._cards: dict[str, int] = {}
        self._lock = threading.RLock()

    # -- where things live ---------------------------------------------------

    @property
    def char_devices(self) -> bool:
        """Whether device nodes are real char devices (mknod worked) or regular-file stand-ins."""
        with self._lock:
            if self._char_devices is None:
                self._probe_mknod()
            assert self._char_devices is not None
            return self._char_devices

    def device_dir(self, device: Device) -> Path:
        return self.root / "sys" / "class" / device.cls / device.id

    def node_path(self, device: Device) -> Path:
        return self.root / "dev" / device.node

    def card_index(self, device: Device) -> int | None:
        """The DRM card number of a gpu under the drm skin, else None."""
        if self.skin != "drm" or device.cls != "gpu":
            return None
        with self._lock:
            if device.id not in self._cards:
                # Not in the inventory write_all saw: take the lowest free number.
                used = set(self._cards.values())
                self._cards[device.id] = next(n for n in range(len(used) + 1) if n not in used)
            return self._cards[device.id]

    def card_dir(self, device: Device) -> Path | None:
        n = self.card_index(device)
        return None if n is None else self.root / "sys" / "class" / "drm" / f"card{n}"

    def drm_node_paths(self, device: Device) -> list[Path]:
        n = self.card_index(device)
        if n is None:
            return []
        return [self.root / "dev" / "dri" / f"card{n}", self.root / "dev" / "dri" / f"renderD{RENDER_BASE + n}"]

    # -- writing -------------------------------------------------------------

    def write_all(self, inventory: Inventory) -> None:
        """Materialize every present device; make sure absent ones are not in the tree."""
        with self._lock:
            # Card numbers follow inventory order, absent gpus included, so a
            # replugged gpu gets its old card back.
            gpus = [d for d in inventory.devices if d.cls == "gpu"]
            self._cards = {d.id: n for n, d in enumerate(gpus)}
            (self.root / "sys" / "class").mkdir(parents=True, exist_ok=True)
            (self.root / "dev").mkdir(parents=True, exist_ok=True)
            for device in inventory.devices:
                if device.present:
                    self.write_device(device)
                else:
                    self.remove_device(device)

    def write_device(self, device: Device) -> None:
        """Create the device's files and nodes, or bring existing ones up to date."""
        with self._lock:
            self._make_node(self.node_path(device))
            for node in self.drm_node_paths(device):
                self._make_node(node)
            self._write_dir(self.device_dir(device), neutral_files(device))
            card = self.card_dir(device)
            if card is not None:
                n = self.card_index(device)
                assert n is not None
                self._write_dir(card, drm_files(device, n))

    def remove_device(self, device: Device) -> None:
        """Hot-unplug: the sysfs entries go first (the device vanishes), then its nodes."""
        with self._lock:
            for d in (self.device_dir(device), self.card_dir(device)):
                if d is not None:
                    self._remove_dir(d)
            for node in (self.node_path(device), *self.drm_node_paths(device)):
                try:
                    node.unlink()
                except FileNotFoundError:
                    pass

    def remove_all(self, inventory: Inventory) -> None:
        with self._lock:
            for device in inventory.devices:
                self.remove_device(device)
            shutil.rmtree(self.root / STAGING, ignore_errors=True)

    # -- mechanics -----------------------------------------------------------

    def _write_dir(self, target: Path, files: dict[str, str]) -> None:
        """`files` (relative path -> content; a trailing '/' means a directory) under `target`."""
        if target.is_dir():
            for rel, content in files.items():
                path = target / rel
                if rel.endswith("/"):
                    path.mkdir(parents=True, exist_ok=True)
                    continue
                path.parent.mkdir(parents=True, exist_ok=True)
                try:
                    if path.read_text() == content:
                        continue
                except FileNotFoundError:
                    pass
                atomic_write_text(path, content)
            return
        # New: build it complete out of sight, then one rename makes it appear.
        staging = self.root / STAGING
        staging.mkdir(parents=True, exist_ok=True)
        build = Path(tempfile.mkdtemp(dir=staging, prefix=f"{target.name}."))
        try:
            for rel, content in files.items():
                path = build / rel
                if rel.endswith("/"):
                    path.mkdir(parents=True, exist_ok=True)
                    continue
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(content)
            for d in (build, *(p for p in build.rglob("*") if p.is_dir())):
                d.chmod(0o755)  # mkdtemp makes 0700; plugins may run as another user
            target.parent.mkdir(parents=True, exist_ok=True)
            os.rename(build, target)
        except BaseException:
            shutil.rmtree(build, ignore_errors=True)
            raise

    def _remove_dir(self, target: Path) -> None:
        if not target.is_dir():
            return
        staging = self.root / STAGING
        staging.mkdir(parents=True, exist_ok=True)
        # A rename to a fresh name; mkdtemp reserves it, rename replaces the empty dir.
        gone = Path(tempfile.mkdtemp(dir=staging, prefix=f"{target.name}.gone."))
        os.rename(target, gone)
        shutil.rmtree(gone, ignore_errors=True)

    def _make_node(self, path: Path) -> None:
        if os.path.lexists(path):
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        if self.char_devices:
            tmp = path.parent / f".{path.name}.{os.getpid()}.{threading.get_ident()}.node"
            try:
                os.mknod(tmp, stat.S_IFCHR | NODE_MODE, os.makedev(NODE_MAJOR, NODE_MINOR))
                os.chmod(tmp, NODE_MODE)  # mknod's mode is filtered by the umask
                os.replace(tmp, path)
                return
            except PermissionError as e:
                # Probed fine but refused now (e.g. a different filesystem): fall back from here on.
                self._char_devices, self.mknod_error = False, f"mknod {tmp}: {e.strerror or e}"
                try:
                    tmp.unlink()
                except FileNotFoundError:
                    pass
        atomic_write_text(path, "")

    def _probe_mknod(self) -> None:
        dev = self.root / "dev"
        dev.mkdir(parents=True, exist_ok=True)
        probe = dev / f".mknod-probe.{os.getpid()}.{threading.get_ident()}"
        try:
            os.mknod(probe, stat.S_IFCHR | 0o600, os.makedev(NODE_MAJOR, NODE_MINOR))
        except PermissionError as e:
            # Unprivileged, or a user namespace without CAP_MKNOD: regular files
            # still give plugins a path to stat and hand to the kubelet.
            self._char_devices, self.mknod_error = False, f"mknod in {dev}: {e.strerror or e}"
            return
        try:
            probe.unlink()
        except FileNotFoundError:
            pass
        self._char_devices = True


def neutral_files(device: Device) -> dict[str, str]:
    values = {
        "uuid": device.uuid,
        "health": device.health,
        # Millidegrees, an integer, like /sys/class/hwmon/*/temp*_input.
        "temperature": str(round(device.temperature_c * 1000)),
        "numa_node": str(device.numa),
        "vendor": device.vendor,
        "model": device.model,
        "serial": device.serial,
        "pci_address": device.pci_address,
        "present": "1" if device.present else "0",
        "ecc_errors": str(device.ecc_errors),
        "memory_mib": str(device.memory_mib),
        "node": device.node,
    }
    return {name: value + "\n" for name, value in values.items()}


def drm_device_id(device: Device) -> str:
    """A stable made-up PCI device ID per model (0xf000-0xffff, unassigned-looking)."""
    return f"0x{0xf000 | (zlib.crc32(device.model.encode()) & 0x0fff):04x}"


def drm_files(device: Device, n: int) -> dict[str, str]:
    render = f"renderD{RENDER_BASE + n}"
    pci_id = f"{DRM_VENDOR_ID[2:]}:{drm_device_id(device)[2:]}".upper()
    uevent = (f"DRIVER={DRM_DRIVER}\nPCI_CLASS=30000\nPCI_ID={pci_id}\n"
              f"PCI_SLOT_NAME={device.pci_address}\n")
    return {
        "lmem_total_bytes": f"{device.memory_mib * 1024 * 1024}\n",
        "device/vendor": f"{DRM_VENDOR_ID}\n",
        "device/device": f"{drm_device_id(device)}\n",
        "device/numa_node": f"{device.numa}\n",
        "device/uevent": uevent,
        f"device/drm/card{n}/": "",
        f"device/drm/{render}/": "",
    }
