"""Where the reference device plugin learns about its devices, and how it watches them.

Two sources: a plain inventory YAML (fixtures/inventories), or the sysfs-like
tree the fake device backend materializes (fake_devices, "neutral" layout:
ROOT/sys/class/<class>/<id>/{health,temperature,numa_node,present,...} and
ROOT/dev/<node>). Both are watched with inotify. An inventory change means
re-read it all; in the tree, a file event inside a device directory names the
one device to re-read (SysfsSource.device_of), and anything above that level
(a device or class appearing or going: hot-plug) means re-read it all.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml
from inotify_simple import Event, INotify
from inotify_simple import flags as IN

HEALTHY, UNHEALTHY = "Healthy", "Unhealthy"  # deviceplugin v1beta1 constants.go
TREE_EVENTS = IN.CREATE | IN.DELETE | IN.MOVED_TO | IN.MOVED_FROM | IN.CLOSE_WRITE
# Inside a device dir these only ever replace or add a value: re-reading that device is enough. A value file
# deleted or moved away may take the device's `health` with it (then it is no device dir at all), and a subdir
# is structure, not a value: those re-read everything.
VALUE_EVENTS = IN.CREATE | IN.MOVED_TO | IN.CLOSE_WRITE
ALL_DEVICES = "all"  # device_of's answer for an event that may change which devices there are


@dataclass(frozen=True)
class SeenDevice:
    id: str
    numa: int
    health: str  # what the hardware says
    temperature_c: float | None
    present: bool
    host_path: str


class InventorySource:
    def __init__(self, path: Path, dev_dir: Path) -> None:
        self.path, self.dev_dir = path, dev_dir
        self._wds: set[int] = set()

    def read(self) -> list[SeenDevice]:
        doc = yaml.safe_load(self.path.read_text()) or {}
        devices = doc.get("devices")
        if not isinstance(devices, list):
            raise ValueError(f"{self.path}: expected a 'devices' list")
        return [SeenDevice(id=str(d["id"]), numa=int(d.get("numa", 0)), health=str(d.get("health", HEALTHY)),
                           temperature_c=None, present=bool(d.get("present", True)),
                           host_path=str(self.dev_dir / d["dev"]) if d.get("dev") else "/dev/null")
                for d in devices]

    def watch(self, inotify: INotify) -> None:
        self._wds.add(inotify.add_watch(str(self.path.parent), IN.CLOSE_WRITE | IN.MOVED_TO))

    def owns(self, wd: int, name: str) -> bool:
        return wd in self._wds and name == self.path.name


class SysfsSource:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.class_root = root / "sys" / "class"
        self._wds: set[int] = set()
        self._device_wds: dict[int, Path] = {}  # watch -> the device dir it watches (the level below a class)

    def _device_dirs(self) -> list[Path]:
        if not self.class_root.is_dir():
            return []
        # Only the vendor-neutral layout: a device dir has a health file.
        return sorted(d for c in self.class_root.iterdir() if c.is_dir()
                      for d in c.iterdir() if (d / "health").is_file())

    def read(self) -> list[SeenDevice]:
        out = []
        for d in self._device_dirs():
            try:
                out.append(self._read_one(d))
            except (OSError, ValueError):
                continue  # half-removed during a hot-unplug: it is going away
        return out

    def read_one(self, d: Path) -> SeenDevice | None:
        """One device dir again, or None when it is no device (now): no health file, or half-removed."""
        if not (d / "health").is_file():
            return None
        try:
            return self._read_one(d)
        except (OSError, ValueError):
            return None

    def _read_one(self, d: Path) -> SeenDevice:
        def value(name: str, default: str = "") -> str:
            f = d / name
            return f.read_text().strip() if f.is_file() else default

        milli = value("temperature")
        node = value("node")
        return SeenDevice(id=d.name, numa=int(value("numa_node", "0") or 0), health=value("health", HEALTHY),
                          temperature_c=int(milli) / 1000 if milli else None,
                          present=value("present", "1") not in ("0", "false"),
                          host_path=str(self.root / "dev" / node) if node else "/dev/null")

    def watch(self, inotify: INotify) -> None:
        """(Re)watch every level; watching an already watched dir is a no-op."""
        dirs = [self.root, self.root / "sys", self.class_root]
        devices: set[Path] = set()
        if self.class_root.is_dir():
            classes = [c for c in self.class_root.iterdir() if c.is_dir()]
            dirs += classes
            devices = {d for c in classes for d in c.iterdir() if d.is_dir()}
        for d in dirs + sorted(devices):
            try:
                wd = inotify.add_watch(str(d), TREE_EVENTS)
            except OSError:
                continue  # vanished meanwhile
            self._wds.add(wd)
            if d in devices:
                self._device_wds[wd] = d
            else:
                self._device_wds.pop(wd, None)

    def owns(self, wd: int, name: str) -> bool:
        return wd in self._wds

    def device_of(self, event: Event) -> Path | str | None:
        """What an owned event asks to re-read: that device's dir, ALL_DEVICES, or None (nothing that is read).

        The materializer replaces a value through a dot-named temp file: its create, close and move away
        say nothing yet; the move onto the value's name does.
        """
        if event.mask & IN.IGNORED:  # the watch is gone with its dir; the level above reports the dir going
            self._wds.discard(event.wd)
            self._device_wds.pop(event.wd, None)
            return None
        d = self._device_wds.get(event.wd)
        if d is None or event.mask & IN.ISDIR:
            return ALL_DEVICES
        if event.name.startswith("."):
            return None
        if event.mask & VALUE_EVENTS:
            return d
        return ALL_DEVICES
