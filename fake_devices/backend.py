"""The fake hardware, live: change a device and the tree and the timeline follow.

Every operation changes the model, writes the change through to the
materialized tree (what the plugin under test watches), and then records a
`device.<op>` event with the device's new state, so a check can measure the
plugin's reaction from the moment the hardware changed. Operations before
start() or after stop() change the model and are recorded, but write nothing:
the tree only exists while the backend runs (start() writes the current model).
"""

from __future__ import annotations

import copy
import math
import threading
from pathlib import Path
from typing import Any

from fake_devices.materialize import Materializer, has_nvml
from fake_devices.model import HEALTHY, UNHEALTHY, Device, Inventory, unknown_device_message
from fake_devices.nvml.surface import NvmlSurface
from harness.instruments.timeline import Timeline

SOURCE = "devices"  # the timeline source of every event the backend records
OPS = ("fail", "recover", "heat", "cool", "unplug", "plug", "ecc", "xid")
MAX_XID = 1_000  # NVIDIA's XIDs are small numbers; past this a control is a typo


class DeviceBackend:
    def __init__(self, root: Path, inventory: Inventory, timeline: Timeline | None = None,
                 skin: str = "neutral") -> None:
        self.root = Path(root)
        # A private copy: the caller's inventory (maybe shared, maybe saved
        # later) never changes behind its back.
        self.inventory = copy.deepcopy(inventory)
        self.timeline = timeline
        self.materializer = Materializer(self.root, skin)
        # The vendor surfaces fed by the same model: NVML under the nvml and drm+nvml skins (the drm
        # skins' Level-Zero sidecar is served by its user from surface_view, see harness/world/env.py).
        self.nvml = NvmlSurface(self.root) if has_nvml(skin) else None
        self._view = [copy.copy(d) for d in self.inventory.devices]  # what the vendor surfaces show
        self._lock = threading.RLock()
        self._running = False

    @property
    def skin(self) -> str:
        return self.materializer.skin

    @property
    def drm(self) -> bool:
        """Whether the tree is the drm layout (skins drm, drm+nvml), which the Level-Zero sidecar serves."""
        return self.materializer.drm

    @property
    def char_devices(self) -> bool:
        return self.materializer.char_devices

    # -- lifecycle -----------------------------------------------------------

    def start(self) -> DeviceBackend:
        with self._lock:
            if not self._running:
                self.materializer.write_all(self.inventory)
                if self.nvml is not None:
                    # With a timeline, the library's calls go onto it too (nvml.call, nvml.load).
                    self.nvml.start(self.inventory.devices, self.materializer.make_node, self.timeline)
                self._running = True
                self._record("devices.start", root=str(self.root), skin=self.skin,
                             devices=[d.id for d in self.inventory.devices if d.present],
                             char_devices=self.materializer.char_devices,
                             mknod_error=self.materializer.mknod_error)
        return self

    def stop(self) -> None:
        """The hardware goes away: remove what start() materialized. Idempotent."""
        with self._lock:
            if not self._running:
                return
            self._running = False
            if self.nvml is not None:
                self.nvml.stop()
            self.materializer.remove_all(self.inventory)
            self._record("devices.stop", root=str(self.root))

    def __enter__(self) -> DeviceBackend:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- observations --------------------------------------------------------

    def devices(self) -> list[Device]:
        """Snapshots, in inventory order; changing one changes nothing."""
        with self._lock:
            return [copy.copy(d) for d in self.inventory.devices]

    def surface_view(self) -> list[Device]:
        """What vendor surfaces (the Level-Zero sidecar) answer from: updated before the tree is written."""
        with self._lock:
            return [copy.copy(d) for d in self._view]

    def state(self, device_id: str) -> dict[str, Any]:
        with self._lock:
            return self._device(device_id).to_dict()

    def ids(self) -> list[str]:
        with self._lock:
            return self.inventory.ids()

    # -- operations ----------------------------------------------------------

    def fail(self, device_id: str) -> dict[str, Any]:
        return self._change("fail", device_id, health=UNHEALTHY)

    def recover(self, device_id: str) -> dict[str, Any]:
        return self._change("recover", device_id, health=HEALTHY)

    def heat(self, device_id: str, temperature_c: float) -> dict[str, Any]:
        # Health stays as it is: deciding that a hot device is unhealthy is the plugin's job.
        return self._change("heat", device_id, temperature_c=_temperature(temperature_c))

    def cool(self, device_id: str, temperature_c: float) -> dict[str, Any]:
        return self._change("cool", device_id, temperature_c=_temperature(temperature_c))

    def unplug(self, device_id: str) -> dict[str, Any]:
        return self._change("unplug", device_id, present=False)

    def plug(self, device_id: str) -> dict[str, Any]:
        return self._change("plug", device_id, present=True)

    def ecc(self, device_id: str, count: int = 1) -> dict[str, Any]:
        if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= MAX_ECC_BURST:
            raise ValueError(f"ecc count must be a positive integer (at most {MAX_ECC_BURST}), got {count!r}")
        with self._lock:
            total = self._device(device_id).ecc_errors + count
            return self._change("ecc", device_id, ecc_errors=total)

    def xid(self, device_id: str, xid: int) -> dict[str, Any]:
        """An NVIDIA XID error on the device (NVML's XID critical-error event); the model does not change."""
        if isinstance(xid, bool) or not isinstance(xid, int) or not 1 <= xid <= MAX_XID:
            raise ValueError(f"xid must be an XID number from 1 to {MAX_XID}, got {xid!r}")
        if self.nvml is None:
            raise ValueError("xid needs the nvml skin (an XID is an NVML event)")
        return self._change("xid", device_id, xid=xid)

    def nvml_init_error(self, code: int) -> None:
        """nvmlInit answers `code` from now on (0: it works): the driver not loaded, a broken install."""
        if self.nvml is None:
            raise ValueError("nvml_init_error needs the nvml skin")
        with self._lock:
            self.nvml.init_error = code
            if self._running:
                self.nvml.write(self.inventory.devices)
            self._record("device.nvml_init_error", code=code)

    def nvml_wait_error(self, code: int) -> None:
        """NVML's event wait fails with `code` from now on (0: it works again): a health source that broke."""
        if self.nvml is None:
            raise ValueError("nvml_wait_error needs the nvml skin")
        with self._lock:
            self.nvml.wait_error = code
            if self._running:
                self.nvml.write(self.inventory.devices)
            self._record("device.nvml_wait_error", code=code)

    def fabric_fault(self, device_id: str, error: str) -> dict[str, Any]:
        """Every attach of the fabric-attached device fails with `error` from now on ("": attaches work again);
        fake_devices/fabric.py. Not one of OPS: only the DRA-BND checks drive it."""
        with self._lock:
            fabric = self._device(device_id).fabric
            if not fabric:
                raise ValueError(f"device {device_id} is not fabric-attached (no `fabric` in the inventory)")
            if "\n" in error:
                raise ValueError("an attach error is one line")
            return self._change("fabric_fault", device_id, fabric={**fabric, "attach_error": error})

    def apply(self, op: str, device_id: str, value: float | None = None) -> dict[str, Any]:
        """One operation by name: what fault scripts and the control API call."""
        if op in ("heat", "cool"):
            if value is None:
                raise ValueError(f"{op} needs a temperature (degrees C)")
            return getattr(self, op)(device_id, value)
        if op == "ecc":
            if value is None:
                return self.ecc(device_id)
            if (isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value)
                    or value != int(value)):
                raise ValueError(f"ecc count must be a positive integer, got {value!r}")
            return self.ecc(device_id, int(value))
        if op == "xid":
            if value is None or isinstance(value, bool) or not isinstance(value, int | float) or value != int(value):
                raise ValueError(f"xid needs an XID number, got {value!r}")
            return self.xid(device_id, int(value))
        if op in OPS:
            return getattr(self, op)(device_id)
        raise ValueError(f"unknown device operation {op!r}; known: {', '.join(OPS)}")

    # -- mechanics -----------------------------------------------------------

    def _device(self, device_id: str) -> Device:
        for device in self.inventory.devices:
            if device.id == device_id:
                return device
        raise KeyError(unknown_device_message(device_id, self.inventory.ids()))

    def _change(self, op: str, device_id: str, **changes: Any) -> dict[str, Any]:
        """All of a change or none of it: the tree is written from a copy, the model updated after."""
        with self._lock:
            device = self._device(device_id)
            xid = changes.pop("xid", None)  # an event, not a change of the model
            changed = copy.copy(device)
            for name, value in changes.items():
                setattr(changed, name, value)
            # The vendor surfaces first: a plugin woken by the tree's change must find them agreeing with it.
            # Only the changed device is copied: the view holds a snapshot of every other one already, and a
            # copy of each device per change was most of a change's cost at 1,024 devices (P3).
            if len(self._view) == len(self.inventory.devices):
                self._view = [copy.copy(changed) if d is device else v
                              for d, v in zip(self.inventory.devices, self._view, strict=True)]
            else:
                self._view = [copy.copy(changed if d is device else d) for d in self.inventory.devices]
            if self.nvml is not None and self._running:
                self.nvml.apply(op, self._view, changed, xid)
            if self._running:
                if changed.present:
                    self.materializer.write_device(changed)
                else:
                    self.materializer.remove_device(changed)
            for name, value in changes.items():
                setattr(device, name, value)
            # Recorded after the write: when the event exists, the tree already shows the change.
            self._record(f"device.{op}", device=device.id, health=device.health,
                         temperature_c=device.temperature_c, present=device.present,
                         ecc_errors=device.ecc_errors, **({"xid": xid} if xid is not None else {}))
            return device.to_dict()

    def _record(self, kind: str, **data: Any) -> None:
        if self.timeline is not None:
            self.timeline.record(kind, SOURCE, **data)


# What a control may set: beyond these no sensor reads, and millidegree files would overflow.
TEMPERATURE_RANGE_C = (-273.15, 1000.0)
MAX_ECC_BURST = 1_000_000


def _temperature(value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"temperature must be a finite number of degrees C, got {value!r}")
    low, high = TEMPERATURE_RANGE_C
    if not low <= value <= high:
        raise ValueError(f"temperature {value:g} C is out of range {low:g}..{high:g} C")
    return float(value)
