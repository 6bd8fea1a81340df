"""Lay the fake hardware out on disk, the way plugins expect to find real hardware.

Layouts ("skins"), all under one root that a plugin gets as its sysfs/dev prefix:

neutral
    ROOT/sys/class/<cls>/<id>/{uuid,health,temperature,numa_node,vendor,model,
    serial,pci_address,present,ecc_errors,memory_mib,node}: one value per file,
    newline-terminated; `temperature` in millidegrees C like Linux hwmon;
    `present` 1 or 0; `node` names the device node, ROOT/dev/<node> (a char
    device with /dev/null's numbers, or a regular file, see below). A gpu
    with an inventory `partitions` layout adds partitions/slices and one
    partitions/<partition id>/ dir per partition (fake_devices/partitions.py),
    each partition's node beside the GPU's in ROOT/dev. A device with an inventory
    `sharing` key adds sharing/<capacity>/{total,step} (fake_devices/capacity.py).
drm
    The neutral files, plus for each gpu-class device N (its index among the
    inventory's gpus) what Linux sysfs shows for a PCI GPU bound to a DRM driver,
    which is what Intel's GPU plugin scans with -prefix ROOT:

    ROOT/sys/devices/pci0000:00/<bdf>/          the PCI device (bdf: dddd:bb:dd.f)
        vendor device subsystem_vendor subsystem_device class numa_node
        local_cpulist uevent (DRIVER=, PCI_ID=, PCI_SLOT_NAME=, ...)
        driver -> ../../../bus/pci/drivers/<driver>   (inventory `driver`, default i915)
        subsystem -> ../../../bus/pci
        drm/card<N>/{dev,uevent,lmem_total_bytes}, drm/renderD<128+N>/{dev,uevent}
        drm/*/device -> ../../../<bdf>, drm/*/subsystem -> ../../../../../class/drm
    ROOT/sys/class/drm/card<N>, renderD<128+N> -> ../../devices/pci0000:00/<bdf>/drm/...
    ROOT/sys/bus/pci/devices/<bdf> -> ../../../devices/pci0000:00/<bdf>
    ROOT/sys/bus/pci/drivers/<driver>/<bdf> -> ../../../../devices/pci0000:00/<bdf>
    ROOT/dev/dri/card<N>, renderD<128+N>        DRM nodes, major 226, minors N and 128+N
    ROOT/dev/dri/by-path/pci-<bdf>-card -> ../card<N>, pci-<bdf>-render -> ../renderD<128+N>

    So `readlink -f ROOT/sys/class/drm/card0/device` ends in the bdf, and the
    driver's name is the basename of `device/driver`, as on Linux.
nvml
    The neutral tree; the backend adds the NVML surface (fake_devices/nvml/).
drm+nvml
    The drm tree, with the NVML surface too: one device answers through sysfs,
    the Level-Zero sidecar and NVML at once, so a test can watch one change
    reach every surface. The PCI tree stays the drm skin's (Intel's vendor ID,
    what the sidecar-based plugin requires), while NVML names the same GPU an
    NVIDIA one: a harness construct, not a machine that exists.

Every link is relative and stays inside ROOT/sys (or ROOT/dev/dri), so the tree
is valid wherever ROOT/sys as a whole is seen. What a launcher must bind for a
plugin that hard-codes /sys and /dev inside a private mount namespace:
- ROOT/sys over /sys, and ROOT/dev/dri over /dev/dri. That is the supported
  form: the plugin's whole /sys is then the fake one.
- Binding ROOT/sys/class/drm alone over /sys/class/drm is NOT enough: its links
  climb to ../../devices/... and would resolve against the real /sys/devices,
  i.e. nowhere, or to a real GPU at the same address. A launcher that must keep
  the rest of the real /sys binds all of ROOT/sys/class/drm -> /sys/class/drm,
  ROOT/sys/devices -> /sys/devices and ROOT/sys/bus/pci -> /sys/bus/pci
  (the `driver` links go through bus/pci).
A plugin given ROOT as a prefix (Intel's -prefix) needs no bind at all.

Device nodes are real char devices where mknod is permitted (root, not in a
user namespace without CAP_MKNOD), regular files otherwise; `char_devices` says
which, and `mknod_error` why they are regular files. Neutral nodes carry
/dev/null's numbers (harmless to open); DRM nodes carry the real DRM numbers,
so that plugins which check major/minor accept them. Opening one reaches the
host's DRM driver if the host has a GPU with that minor, and fails with ENXIO
otherwise; fakelet itself never opens them.

Watchers must never see half a device:
- a value file is replaced atomically (temp file in the same directory, then
  os.replace), so inotify reports IN_MOVED_TO with the complete content; a
  changed link is replaced the same way;
- a new device directory (neutral, or the PCI device dir with its drm/ subdirs
  and links) is built complete in ROOT/.staging and renamed into place in one
  step, after its device nodes exist;
- on plug the order is: nodes, by-path links, the neutral dir, the PCI dir,
  bus/pci links, and last the sys/class/drm links: whoever finds the card
  through its class link finds everything behind it;
- on unplug the reverse: class links first (the device vanishes), then bus
  links, the directories (renamed out of the tree, then deleted), by-path links,
  and the nodes last.
Unchanged values are not rewritten, so every file event means a real change;
whether a value changed is decided from what was written, never by reading the
tree back, so the materializer itself causes no open or read events there
(fake_devices.access counts those as the plugin's).
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
import threading
import zlib
from dataclasses import dataclass
from pathlib import Path

from fake_devices.capacity import sharing_files
from fake_devices.fabric import fabric_files
from fake_devices.model import Device, Inventory, atomic_write_text

# nvml: the neutral tree plus the NVML surface (fake_devices/nvml/). A combined skin is the union of
# its parts: drm+nvml is the drm tree (and its Level-Zero sidecar) plus NVML, one model behind all.
SKINS = ("neutral", "drm", "nvml", "drm+nvml")
STAGING = ".staging"
# drm_drv.c: minors are allocated per type in blocks of 64; render minors are
# type DRM_MINOR_RENDER (2), hence renderD128 + card index.
RENDER_BASE = 128
# Documentation/admin-guide/devices.txt: "226 char  DRI - Direct Rendering
# Infrastructure"; libdrm names it DRM_MAJOR.
DRM_MAJOR = 226
# The PCI vendor ID Intel's GPU plugin requires in device/vendor before it
# considers a card at all; the drm skin exists to satisfy that plugin.
DRM_VENDOR_ID = "0x8086"
DRM_DRIVER = "i915"  # the default when the inventory names no driver
# include/linux/pci_ids.h PCI_CLASS_DISPLAY_VGA (0x0300), as the 24-bit
# class/subclass/prog-if code sysfs shows in `class`.
PCI_CLASS_DISPLAY_VGA = 0x030000
PCI_HOST_BRIDGE = "pci0000:00"  # one root complex; every fake device hangs off it directly
# Neutral nodes are char devices with /dev/null's numbers, as Intel's own
# fake-device generator makes them: a container that opens one gets a harmless fd.
NODE_MAJOR, NODE_MINOR = 1, 3
NODE_MODE = 0o666


@dataclass(frozen=True)
class Link:
    """A symlink in a directory spec; `target` is stored as given (relative, see the module docstring)."""

    target: str


Spec = dict[str, str | Link]  # relative path -> content, a Link, or "" with a trailing '/' for a directory


def pci_bdf(address: str) -> str:
    """`address` in the dddd:bb:dd.f form sysfs names PCI devices by ("3B:00.0" -> "0000:3b:00.0")."""
    text = address.strip().lower()
    parts = text.split(":")
    if len(parts) == 2:
        parts.insert(0, "0000")  # lspci's short form leaves out domain 0
    try:
        domain, bus, rest = parts
        slot, function = rest.split(".")
        values = int(domain, 16), int(bus, 16), int(slot, 16), int(function, 16)
    except ValueError:
        raise ValueError(f"not a PCI address: {address!r} (expected dddd:bb:dd.f)") from None
    if not (values[0] <= 0xffff and values[1] <= 0xff and values[2] <= 0x1f and values[3] <= 7):
        raise ValueError(f"PCI address out of range: {address!r}")
    return "{:04x}:{:02x}:{:02x}.{:x}".format(*values)


def skin_parts(skin: str) -> frozenset[str]:
    """The parts a skin is made of ("drm+nvml" -> {drm, nvml}); callers ask for a part, never compare skins."""
    if skin not in SKINS:
        raise ValueError(f"unknown skin {skin!r}; known: {list(SKINS)}")
    return frozenset(skin.split("+"))


def has_drm(skin: str) -> bool:
    """Whether the skin lays out the DRM tree (and so comes with the Level-Zero sidecar)."""
    return "drm" in skin_parts(skin)


def has_nvml(skin: str) -> bool:
    """Whether the skin feeds the NVML surface."""
    return "nvml" in skin_parts(skin)


class Materializer:
    def __init__(self, root: Path, skin: str = "neutral") -> None:
        if skin not in SKINS:
            raise ValueError(f"unknown skin {skin!r}; known: {list(SKINS)}")
        self.root, self.skin = Path(root), skin
        self.drm = has_drm(skin)
        self.mknod_error: str | None = None  # why nodes are regular files, once that is known
        self._char_devices: bool | None = None  # probed lazily: constructing touches no disk
        self._cards: dict[str, int] = {}
        self._numa_nodes = 1
        # What this materializer last wrote per file: "unchanged" is decided
        # from this, because reading the tree back would look like a plugin read.
        self._written: dict[Path, str] = {}
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

    def partition_node_paths(self, device: Device) -> list[Path]:
        """ROOT/dev/<node> of each of the device's partitions (fake_devices/partitions.py), none without any."""
        return [self.root / "dev" / p.node for p in device.partition_list()]

    def card_index(self, device: Device) -> int | None:
        """The DRM card number of a gpu under the drm skin, else None."""
        if not self.drm or device.cls != "gpu":
            return None
        with self._lock:
            if device.id not in self._cards:
                # Not in the inventory write_all saw: take the lowest free number.
                used = set(self._cards.values())
                self._cards[device.id] = next(n for n in range(len(used) + 1) if n not in used)
            return self._cards[device.id]

    def card_dir(self, device: Device) -> Path | None:
        """ROOT/sys/class/drm/card<N> (a link into the PCI device dir), or None outside the drm skin."""
        n = self.card_index(device)
        return None if n is None else self.root / "sys" / "class" / "drm" / f"card{n}"

    def pci_dir(self, device: Device) -> Path | None:
        """ROOT/sys/devices/pci0000:00/<bdf> of a gpu under the drm skin, else None."""
        if self.card_index(device) is None:
            return None
        return self.root / "sys" / "devices" / PCI_HOST_BRIDGE / pci_bdf(device.pci_address)

    def driver_name(self, device: Device) -> str:
        return device.driver or DRM_DRIVER

    def drm_node_paths(self, device: Device) -> list[Path]:
        n = self.card_index(device)
        if n is None:
            return []
        return [self.root / "dev" / "dri" / f"card{n}", self.root / "dev" / "dri" / f"renderD{RENDER_BASE + n}"]

    def by_path_links(self, device: Device) -> dict[Path, str]:
        """ROOT/dev/dri/by-path/pci-<bdf>-{card,render} -> their relative targets (udev's names)."""
        n = self.card_index(device)
        if n is None:
            return {}
        by_path = self.root / "dev" / "dri" / "by-path"
        bdf = pci_bdf(device.pci_address)
        return {by_path / f"pci-{bdf}-card": f"../card{n}",
                by_path / f"pci-{bdf}-render": f"../renderD{RENDER_BASE + n}"}

    def class_links(self, device: Device) -> dict[Path, str]:
        """ROOT/sys/class/drm/{card<N>,renderD<128+N>} -> their relative targets."""
        n = self.card_index(device)
        if n is None:
            return {}
        drm = self.root / "sys" / "class" / "drm"
        bdf = pci_bdf(device.pci_address)
        return {drm / name: f"../../devices/{PCI_HOST_BRIDGE}/{bdf}/drm/{name}"
                for name in (f"card{n}", f"renderD{RENDER_BASE + n}")}

    def bus_links(self, device: Device) -> dict[Path, str]:
        """ROOT/sys/bus/pci/devices/<bdf> and drivers/<driver>/<bdf> -> their relative targets."""
        if self.card_index(device) is None:
            return {}
        pci = self.root / "sys" / "bus" / "pci"
        bdf = pci_bdf(device.pci_address)
        return {pci / "devices" / bdf: f"../../../devices/{PCI_HOST_BRIDGE}/{bdf}",
                pci / "drivers" / self.driver_name(device) / bdf: f"../../../../devices/{PCI_HOST_BRIDGE}/{bdf}"}

    # -- writing -------------------------------------------------------------

    def write_all(self, inventory: Inventory) -> None:
        """Materialize every present device; make sure absent ones are not in the tree."""
        with self._lock:
            # Card numbers follow inventory order, absent gpus included, so a
            # replugged gpu gets its old card back.
            gpus = [d for d in inventory.devices if d.cls == "gpu"]
            self._cards = {d.id: n for n, d in enumerate(gpus)}
            self._numa_nodes = max([d.numa + 1 for d in inventory.devices] or [1])
            if self.drm:
                _check_distinct_bdfs(gpus)
            (self.root / "sys" / "class").mkdir(parents=True, exist_ok=True)
            (self.root / "dev").mkdir(parents=True, exist_ok=True)
            for device in inventory.devices:
                if device.present:
                    self.write_device(device)
                else:
                    self.remove_device(device)

    def write_device(self, device: Device) -> None:
        """Create the device's files, links and nodes, or bring existing ones up to date."""
        with self._lock:
            self._make_node(self.node_path(device), NODE_MAJOR, NODE_MINOR)
            for node in self.partition_node_paths(device):
                self._make_node(node, NODE_MAJOR, NODE_MINOR)
            n = self.card_index(device)
            if n is not None:
                card, render = self.drm_node_paths(device)
                self._make_node(card, DRM_MAJOR, n)
                self._make_node(render, DRM_MAJOR, RENDER_BASE + n)
                for link, target in self.by_path_links(device).items():
                    self._link(link, target)
            self._write_dir(self.device_dir(device), neutral_files(device))
            pci = self.pci_dir(device)
            if n is None or pci is None:
                return
            driver = self.driver_name(device)
            # The driver dir first: the PCI dir's `driver` link resolves the moment it appears.
            (self.root / "sys" / "bus" / "pci" / "drivers" / driver).mkdir(parents=True, exist_ok=True)
            self._numa_nodes = max(self._numa_nodes, device.numa + 1)
            self._write_dir(pci, pci_files(device, n, driver, local_cpulist(device.numa, self._numa_nodes)))
            for link, target in self.bus_links(device).items():
                self._link(link, target)
            self._unlink_stale_driver_links(pci.name, keep=driver)
            for link, target in self.class_links(device).items():
                self._link(link, target)

    def remove_device(self, device: Device) -> None:
        """Hot-unplug: the sysfs entries go first (the device vanishes), then its nodes."""
        with self._lock:
            for link in self.class_links(device):
                _unlink(link)
            self._remove_dir(self.device_dir(device))
            pci = self.pci_dir(device)
            if pci is not None:
                _unlink(self.root / "sys" / "bus" / "pci" / "devices" / pci.name)
                self._unlink_stale_driver_links(pci.name, keep=None)
                self._remove_dir(pci)
            for link in self.by_path_links(device):
                _unlink(link)
            for node in (self.node_path(device), *self.drm_node_paths(device), *self.partition_node_paths(device)):
                _unlink(node)

    def remove_all(self, inventory: Inventory) -> None:
        with self._lock:
            for device in inventory.devices:
                self.remove_device(device)
            shutil.rmtree(self.root / STAGING, ignore_errors=True)
            self._written.clear()

    def make_node(self, name: str, major: int, minor: int) -> None:
        """ROOT/dev/<name>: a char device node where mknod is allowed, else a regular file (said in the report)."""
        with self._lock:
            self._make_node(self.root / "dev" / name, major, minor)

    # -- mechanics -----------------------------------------------------------

    def _write_dir(self, target: Path, files: Spec) -> None:
        """`files` (relative path -> content or Link; a trailing '/' means a directory) under `target`."""
        if target.is_dir() and not target.is_symlink():
            for rel, content in files.items():
                path = target / rel
                if rel.endswith("/"):
                    path.mkdir(parents=True, exist_ok=True)
                    continue
                path.parent.mkdir(parents=True, exist_ok=True)
                if isinstance(content, Link):
                    self._link(path, content.target)
                elif self._written.get(path) != content or not path.is_file():
                    atomic_write_text(path, content)
                    self._written[path] = content
            return
        # New: build it complete out of sight, then one rename makes it appear.
        staging = self.root / STAGING
        staging.mkdir(parents=True, exist_ok=True)
        build = Path(tempfile.mkdtemp(dir=staging, prefix=f"{target.name}."))
        try:
            made = [build]
            for rel, content in files.items():
                path = build / rel
                folder = path if rel.endswith("/") else path.parent
                for d in reversed([folder, *folder.parents]):
                    if d.is_relative_to(build) and not d.exists():
                        d.mkdir()
                        made.append(d)
                if isinstance(content, Link):
                    os.symlink(content.target, path)  # dangles until the rename: relative to its final place
                elif not rel.endswith("/"):
                    path.write_text(content)
            for d in made:
                d.chmod(0o755)  # mkdtemp makes 0700, mkdir obeys the umask; plugins may run as another user
            target.parent.mkdir(parents=True, exist_ok=True)
            os.rename(build, target)
        except BaseException:
            shutil.rmtree(build, ignore_errors=True)
            raise
        for rel, content in files.items():
            if isinstance(content, str) and not rel.endswith("/"):
                self._written[target / rel] = content

    def _remove_dir(self, target: Path) -> None:
        if target.is_symlink() or not target.is_dir():
            _unlink(target)
            return
        staging = self.root / STAGING
        staging.mkdir(parents=True, exist_ok=True)
        # A rename to a fresh name; mkdtemp reserves it, rename replaces the empty dir.
        gone = Path(tempfile.mkdtemp(dir=staging, prefix=f"{target.name}.gone."))
        os.rename(target, gone)
        shutil.rmtree(gone, ignore_errors=True)
        self._written = {p: v for p, v in self._written.items() if not p.is_relative_to(target)}

    def _link(self, path: Path, target: str) -> None:
        """Make `path` a symlink to `target`; an existing different entry is replaced in one rename."""
        try:
            if os.readlink(path) == target:
                return
        except FileNotFoundError:
            path.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.symlink(target, path)  # creating a link is atomic: watchers see it whole
                return
            except FileExistsError:
                pass  # raced with another writer: replace below
        except OSError:
            # Not a link (a directory from an older layout, or a file): it must go.
            if path.is_dir() and not path.is_symlink():
                self._remove_dir(path)
        tmp = path.parent / f".{path.name}.{os.getpid()}.{threading.get_ident()}.link"
        _unlink(tmp)
        os.symlink(target, tmp)
        os.replace(tmp, path)

    def _unlink_stale_driver_links(self, bdf: str, keep: str | None) -> None:
        drivers = self.root / "sys" / "bus" / "pci" / "drivers"
        if not drivers.is_dir():
            return
        for driver in drivers.iterdir():
            if driver.name != keep:
                _unlink(driver / bdf)

    def _node_ok(self, path: Path, major: int, minor: int) -> bool:
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return False
        if stat.S_ISCHR(st.st_mode):
            return st.st_rdev == os.makedev(major, minor)
        return stat.S_ISREG(st.st_mode) and not self.char_devices

    def _make_node(self, path: Path, major: int, minor: int) -> None:
        if self._node_ok(path, major, minor):
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        if self.char_devices:
            tmp = path.parent / f".{path.name}.{os.getpid()}.{threading.get_ident()}.node"
            try:
                os.mknod(tmp, stat.S_IFCHR | NODE_MODE, os.makedev(major, minor))
                os.chmod(tmp, NODE_MODE)  # mknod's mode is filtered by the umask
                os.replace(tmp, path)
                return
            except PermissionError as e:
                # Probed fine but refused now (e.g. a different filesystem): fall back from here on.
                self._char_devices, self.mknod_error = False, f"mknod {tmp}: {e.strerror or e}"
                _unlink(tmp)
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
        _unlink(probe)
        self._char_devices = True


def _unlink(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass


def _check_distinct_bdfs(gpus: list[Device]) -> None:
    seen: dict[str, str] = {}
    for d in gpus:
        bdf = pci_bdf(d.pci_address)
        if bdf in seen:
            raise ValueError(f"device {d.id!r}: PCI address {bdf} is also {seen[bdf]!r}'s; "
                             "the drm skin needs one PCI device dir per gpu")
        seen[bdf] = d.id


def neutral_files(device: Device) -> Spec:
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
    files: Spec = {name: value + "\n" for name, value in values.items()}
    if device.partitions:
        files.update(partition_files(device))
    if device.sharing:
        files.update(sharing_files(device.sharing))
    if device.fabric:
        files.update(fabric_files(device.fabric))
    return files


def partition_files(device: Device) -> Spec:
    """partitions/slices, and partitions/<partition id>/{profile,start,size,memory_mib,uuid,node}: one value per
    file, as the rest of the device dir (a MIG-capable driver reads the same facts from NVML)."""
    files: Spec = {"partitions/": "", "partitions/slices": f"{device.partitions['slices']}\n"}  # type: ignore[index]
    for p in device.partition_list():
        files[f"partitions/{p.id}/"] = ""
        for name, value in (("profile", p.profile), ("start", p.start), ("size", p.size),
                            ("memory_mib", p.memory_mib), ("uuid", p.uuid), ("node", p.node)):
            files[f"partitions/{p.id}/{name}"] = f"{value}\n"
    return files


def drm_device_id(device: Device) -> str:
    """A stable made-up PCI device ID per model (0xf000-0xffff, unassigned-looking)."""
    return f"0x{0xf000 | (zlib.crc32(device.model.encode()) & 0x0fff):04x}"


def local_cpulist(numa: int, numa_nodes: int) -> str:
    """The host's CPUs cut into `numa_nodes` equal blocks; block `numa`, in sysfs's list form ("0-3")."""
    cpus = os.cpu_count() or 1
    nodes = max(numa_nodes, numa + 1)
    first, last = numa * cpus // nodes, (numa + 1) * cpus // nodes - 1
    if last < first:  # more nodes than CPUs: share one rather than list none
        first = last = numa % cpus
    return f"{first}\n" if first == last else f"{first}-{last}\n"


def pci_files(device: Device, n: int, driver: str, cpulist: str) -> Spec:
    """The PCI device dir of gpu `device`, DRM card `n`, relative to ROOT/sys/devices/pci0000:00/<bdf>."""
    bdf = pci_bdf(device.pci_address)
    vendor, dev_id = DRM_VENDOR_ID, drm_device_id(device)
    v, d = vendor[2:].upper(), dev_id[2:].upper()
    cls = PCI_CLASS_DISPLAY_VGA
    uevent = (f"DRIVER={driver}\nPCI_CLASS={cls:X}\nPCI_ID={v}:{d}\nPCI_SUBSYS_ID={v}:{d}\n"
              f"PCI_SLOT_NAME={bdf}\nMODALIAS=pci:v0000{v}d0000{d}sv0000{v}sd0000{d}"
              f"bc{cls >> 16:02X}sc{(cls >> 8) & 0xff:02X}i{cls & 0xff:02X}\n")
    files: Spec = {
        "vendor": f"{vendor}\n",
        "device": f"{dev_id}\n",
        "subsystem_vendor": f"{vendor}\n",
        "subsystem_device": f"{dev_id}\n",
        "class": f"0x{cls:06x}\n",
        "numa_node": f"{device.numa}\n",
        "local_cpulist": cpulist,
        "uevent": uevent,
        # From ROOT/sys/devices/pci0000:00/<bdf>: three levels up is ROOT/sys.
        "driver": Link(f"../../../bus/pci/drivers/{driver}"),
        "subsystem": Link("../../../bus/pci"),
        "drm/": "",
    }
    for name, minor in ((f"card{n}", n), (f"renderD{RENDER_BASE + n}", RENDER_BASE + n)):
        files[f"drm/{name}/"] = ""
        files[f"drm/{name}/dev"] = f"{DRM_MAJOR}:{minor}\n"
        files[f"drm/{name}/uevent"] = f"MAJOR={DRM_MAJOR}\nMINOR={minor}\nDEVNAME=dri/{name}\nDEVTYPE=drm_minor\n"
        # From .../<bdf>/drm/<name>: three up is pci0000:00, five up is ROOT/sys.
        files[f"drm/{name}/device"] = Link(f"../../../{bdf}")
        files[f"drm/{name}/subsystem"] = Link("../../../../../class/drm")
    files[f"drm/card{n}/lmem_total_bytes"] = f"{device.memory_mib * 1024 * 1024}\n"
    return files
