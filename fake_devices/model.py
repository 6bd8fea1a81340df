"""The fake hardware as data: one `Device` per piece of hardware, an `Inventory` of them.

An inventory is a YAML file with top-level `seed` (what generated it, or null)
and `devices` (one mapping per device, keyed by the `Device` field names). The
legacy minimal format of fixtures/inventories/basic.yaml
(`devices: [{id, numa, health, dev}]`) loads too: missing fields get defaults
derived from the device's id and position, so a legacy file always loads to the
same inventory.
"""

from __future__ import annotations

import math
import os
import re
import tempfile
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from fake_devices.capacity import check_sharing
from fake_devices.fabric import check_fabric
from fake_devices.partitions import Partition, check_layout, partitions_of
from harness.instruments.userinput import UserInputError, read_user_text

CLASSES = ("gpu", "nic", "fpga", "generic")
HEALTHY, UNHEALTHY = "Healthy", "Unhealthy"  # deviceplugin v1beta1 constants.go
HEALTH_VALUES = (HEALTHY, UNHEALTHY)
DEFAULT_TEMPERATURE_C = 40.0

# Ids and node names become directory and file names under the materialized
# tree (and device IDs on the wire), so they must be a single safe path part.
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
PCI_RE = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-1][0-9a-f]\.[0-7]$")
# The legacy format names the device node `dev`; the full format calls it `node`.
LEGACY_NODE_KEY = "dev"
TOP_LEVEL_KEYS = ("seed", "devices")
OPTIONAL_FIELDS = ("driver", "partitions", "sharing", "fabric")  # dumped only when set


@dataclass
class Device:
    id: str
    cls: str = "generic"
    vendor: str = "Fakelet"
    model: str = "Generic Device"
    serial: str = ""
    uuid: str = ""
    pci_address: str = "0000:01:00.0"
    numa: int = 0
    memory_mib: int = 0
    temperature_c: float = DEFAULT_TEMPERATURE_C
    health: str = HEALTHY
    present: bool = True
    ecc_errors: int = 0
    node: str = ""
    # The kernel driver bound to the device (sysfs `driver` link); "" means the
    # skin's default. Optional, so inventories written before it load unchanged.
    driver: str = ""
    # MIG-style partitions (fake_devices/partitions.py): {slices, profiles}, or None for a device that has none.
    # Optional like `driver`: inventories without it load and dump unchanged.
    partitions: dict[str, Any] | None = None
    # Consumable capacity (fake_devices/capacity.py): capacity name -> {total, step}, or None for a device that
    # serves one user at a time. Optional like `partitions`.
    sharing: dict[str, dict[str, str]] | None = None
    # Fabric-attached (fake_devices/fabric.py): {interface, mac, ips, attach_ms, attach_error}, or None for a
    # device usable on its node as soon as it is allocated. Optional like `sharing`.
    fabric: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        # Derived defaults: a hand-built Device(id="gpu-0") is as complete as a loaded one.
        if not self.node:
            self.node = default_node(self.id)
        if not self.uuid:
            self.uuid = default_uuid(self.id)
        if not self.serial:
            self.serial = default_serial(self.id)

    def to_dict(self) -> dict[str, Any]:
        """Field name -> value, in declaration order (the YAML key order).

        An unset `driver` is left out, so inventories that never name one dump
        byte for byte as they did before the field existed.
        """
        return {f.name: getattr(self, f.name) for f in fields(self)
                if f.name not in OPTIONAL_FIELDS or getattr(self, f.name)}

    def partition_list(self) -> list[Partition]:
        """The device's partitions, every placement of every profile ([] without a `partitions` layout)."""
        return partitions_of(self.id, self.node, self.uuid, self.memory_mib, self.partitions)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], index: int = 0) -> Device:
        """A device from one inventory mapping, full or legacy format.

        `index` is the device's position in its inventory; legacy entries derive
        their PCI address from it so that every device gets a distinct one.
        Raises ValueError naming the device and the offending field.
        """
        if not isinstance(data, Mapping):
            raise ValueError(f"device #{index}: expected a mapping, got {type(data).__name__}")
        label = f"device {data['id']!r}" if isinstance(data.get("id"), str) else f"device #{index}"
        known = {f.name for f in fields(cls)}
        unknown = sorted(str(k) for k in data if k not in known and k != LEGACY_NODE_KEY)
        if unknown:
            raise ValueError(f"{label}: unknown field(s) {unknown}; known: {sorted(known)}")
        if LEGACY_NODE_KEY in data and "node" in data:
            raise ValueError(f"{label}: both 'node' and legacy 'dev' given; use 'node'")
        if "id" not in data:
            raise ValueError(f"{label}: missing required field 'id'")
        values = dict(data)
        if LEGACY_NODE_KEY in values:
            values["node"] = values.pop(LEGACY_NODE_KEY)
        values.setdefault("pci_address", default_pci_address(index))
        for f in fields(cls):
            if f.name in values:
                values[f.name] = _check_field(label, f.name, values[f.name])
        return cls(**values)


@dataclass
class Inventory:
    seed: int | None = None
    devices: list[Device] = field(default_factory=list)

    def get(self, device_id: str) -> Device:
        for device in self.devices:
            if device.id == device_id:
                return device
        raise KeyError(unknown_device_message(device_id, [d.id for d in self.devices]))

    def ids(self) -> list[str]:
        return [d.id for d in self.devices]

    def to_dict(self) -> dict[str, Any]:
        return {"seed": self.seed, "devices": [d.to_dict() for d in self.devices]}

    def to_yaml(self) -> str:
        # sort_keys=False keeps field order; the same inventory always dumps to the same bytes.
        return yaml.safe_dump(self.to_dict(), sort_keys=False, default_flow_style=False, allow_unicode=True)

    def save(self, path: Path | str) -> None:
        """Write atomically, so a plugin watching the file never reads half an inventory."""
        atomic_write_text(Path(path), self.to_yaml())

    @classmethod
    def from_dict(cls, doc: Any, where: str = "<inventory>") -> Inventory:
        if not isinstance(doc, Mapping):
            raise ValueError(f"{where}: expected a mapping with a 'devices' list, got {type(doc).__name__}")
        unknown = sorted(str(k) for k in doc if k not in TOP_LEVEL_KEYS)
        if unknown:
            raise ValueError(f"{where}: unknown top-level key(s) {unknown}; known: {list(TOP_LEVEL_KEYS)}")
        seed = doc.get("seed")
        if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
            raise ValueError(f"{where}: 'seed' must be an integer or null, got {seed!r}")
        raw = doc.get("devices")
        if not isinstance(raw, list):
            raise ValueError(f"{where}: expected a 'devices' list, got {type(raw).__name__}")
        devices = []
        for index, entry in enumerate(raw):
            try:
                devices.append(Device.from_dict(entry, index))
            except ValueError as e:
                raise ValueError(f"{where}: {e}") from None
        _check_unique(where, devices)
        return cls(seed=seed, devices=devices)

    @classmethod
    def from_yaml(cls, text: str, where: str = "<inventory>") -> Inventory:
        try:
            doc = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise ValueError(f"{where}: not valid YAML: {e}") from None
        if doc is None:
            raise ValueError(f"{where}: empty inventory (expected a 'devices' list)")
        return cls.from_dict(doc, where)

    @classmethod
    def load(cls, path: Path | str) -> Inventory:
        path = Path(path)
        try:
            text = read_user_text(path)
        except UserInputError as e:
            raise ValueError(f"{e.where}: cannot read inventory: {e.problem.removeprefix('cannot read: ')}") from None
        return cls.from_yaml(text, str(path))


def unknown_device_message(device_id: str, known: list[str]) -> str:
    return f"unknown device {device_id!r}; known devices: {', '.join(known) or 'none'}"


def default_node(device_id: str) -> str:
    """gpu-0 -> fakegpu0: the naming basic.yaml uses for its device nodes."""
    return "fake" + re.sub(r"[^A-Za-z0-9]", "", device_id)


def default_uuid(device_id: str) -> str:
    # Derived, not random: a legacy inventory must load to the same devices every time.
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"fakelet:device:{device_id}"))


def default_serial(device_id: str) -> str:
    return "FKL-" + re.sub(r"[^A-Za-z0-9]", "", device_id).upper()


def default_pci_address(index: int) -> str:
    """A distinct address per position: bus 1.. with 32 device slots per bus."""
    bus, slot = divmod(index, 32)
    return f"0000:{(bus + 1) % 256:02x}:{slot:02x}.0"


def atomic_write_text(path: Path, text: str) -> None:
    """Write via a temp file in the same directory and os.replace: readers see old or new, never half."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; sysfs-like values are world-readable
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def _check_field(label: str, name: str, value: Any) -> Any:
    """The value, normalized, or a ValueError saying which field of which device is wrong."""
    def bad(expected: str) -> ValueError:
        return ValueError(f"{label}: field {name!r}: expected {expected}, got {value!r}")

    if name == "driver" and value == "":
        return value
    if name == "partitions":
        return None if value is None else check_layout(label, value)
    if name == "sharing":
        return None if value is None else check_sharing(label, value)
    if name == "fabric":
        return None if value is None else check_fabric(label, value)
    if name in ("id", "node", "driver"):
        if not isinstance(value, str) or not NAME_RE.match(value):
            raise bad("a name of letters, digits, '.', '_' or '-' (no '/')")
        return value
    if name in ("vendor", "model", "serial", "uuid"):
        if not isinstance(value, str) or "\n" in value:
            raise bad("a single-line string")
        return value
    if name == "cls":
        if value not in CLASSES:
            raise bad(f"one of {list(CLASSES)}")
        return value
    if name == "health":
        if value not in HEALTH_VALUES:
            raise bad(f"one of {list(HEALTH_VALUES)}")
        return value
    if name == "pci_address":
        if not isinstance(value, str) or not PCI_RE.match(value):
            raise bad("a PCI address like '0000:3b:00.0'")
        return value
    if name in ("numa", "memory_mib", "ecc_errors"):
        # bool is an int in Python; `numa: true` is a typo, not NUMA node 1.
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise bad("a non-negative integer")
        return value
    if name == "temperature_c":
        if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
            raise bad("a number (degrees C)")
        return float(value)
    if name == "present":
        if not isinstance(value, bool):
            raise bad("true or false")
        return value
    raise AssertionError(f"unhandled field {name}")  # a Device field added without validation


def _check_unique(where: str, devices: list[Device]) -> None:
    for attr in ("id", "node"):
        seen: set[str] = set()
        for d in devices:
            value = getattr(d, attr)
            if value in seen:
                raise ValueError(f"{where}: device {d.id!r}: duplicate {attr} {value!r}")
            seen.add(value)
    _check_partitions(where, devices)


def _check_partitions(where: str, devices: list[Device]) -> None:
    """Partitions are a GPU's, each slice holds memory, and their IDs and nodes are nobody else's."""
    ids, nodes = {d.id for d in devices}, {d.node for d in devices}
    for d in devices:
        if d.partitions and d.sharing:
            raise ValueError(f"{where}: device {d.id!r}: partitions and sharing are two ways to split a device; "
                             f"give one")
        if not d.partitions:
            continue
        if d.cls != "gpu":
            raise ValueError(f"{where}: device {d.id!r}: only a gpu has partitions (it is a {d.cls})")
        if d.memory_mib < d.partitions["slices"]:
            raise ValueError(f"{where}: device {d.id!r}: memory_mib {d.memory_mib} cannot be cut into "
                             f"{d.partitions['slices']} slices")
        for p in d.partition_list():
            for attr, seen in (("id", ids), ("node", nodes)):
                value = getattr(p, attr)
                if value in seen:
                    raise ValueError(f"{where}: device {d.id!r}: partition {p.id!r}: duplicate {attr} {value!r}")
                seen.add(value)
