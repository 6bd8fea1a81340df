"""The NVML surface of the fake hardware: what libnvml.c reads, written from the backend's live state.

The backend (fake_devices/backend.py) calls `apply(op, device, ...)` after every
change, so one `fakelet devices heat` moves hwmon in sysfs and NVML at once.
The library reads two files under ROOT/nvml (FAKELET_NVML_STATE):

- `state`, rewritten atomically on every change: one `device` line per
  inventory GPU, in inventory order (a device's slot, its handle, never moves),
  with present, lost, temperature, threshold, ECC counts, NUMA node, minor,
  memory, PCI ids, bus id, UUID, serial and name;
- `events`, appended to: `<sequence> <slot> <event type hex> <data>`, what
  nvmlEventSetWait hands out (XID critical errors with their XID, double-bit ECC).

What an NVML consumer sees of each backend operation (NVIDIA's documented XIDs):
`fail` raises XID 79 (the GPU has fallen off the bus) and the device's handle
calls answer GPU-is-lost until `recover`; `ecc` raises a double-bit ECC event and
XID 48 and bumps the counters; `heat`/`cool` set the temperature (and the thermal
clock-event reasons past the slowdown threshold); `unplug`/`plug` take the
device out of enumeration and back; `xid N` raises any XID (13, 31, 43, 45, 68
and 109 are the application XIDs NVML-based plugins are expected to ignore).
It also creates the device nodes NVIDIA's driver makes: /dev/nvidiactl,
/dev/nvidia-uvm and /dev/nvidiaN (major 195).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

from fake_devices.model import UNHEALTHY, Device

STATE_ENV = "FAKELET_NVML_STATE"  # where libnvml.c finds the state, events and call log
NVIDIA_MAJOR = 195  # drivers/char: the NVIDIA character device major (nvidiaN, nvidiactl = 255)
NVIDIACTL_MINOR = 255
UVM_MAJOR = 511  # nvidia-uvm's major is dynamic on a real host; any fixed one serves a fake
PCI_DEVICE_ID = 0x233010DE  # nvmlPciInfo_t.pciDeviceId: device 0x2330 << 16 | vendor 0x10DE (NVIDIA)
DRIVER_VERSION = "580.65.06"
DEFAULT_SHUTDOWN_C = 85.0
XID_FALLEN_OFF_BUS = 79
XID_DBE = 48  # double-bit ECC error
NVML_ERROR_UNKNOWN = 999  # nvmlReturn_t
NVML_ERROR_DRIVER_NOT_LOADED = 9
EVENT_DBE = 0x2  # nvmlEventTypeDoubleBitEccError
EVENT_XID = 0x8  # nvmlEventTypeXidCriticalError
APPLICATION_XIDS = (13, 31, 43, 45, 68, 109)  # what NVIDIA's device plugin ignores by default
# What a plugin calls when it watches each capability through NVML (the coverage facts).
CAPABILITY_CALLS = {
    "health": ("nvmlDeviceRegisterEvents", "nvmlEventSetWait", "nvmlEventSetWait_v2"),
    "temperature": ("nvmlDeviceGetTemperature", "nvmlDeviceGetCurrentClocksEventReasons",
                    "nvmlDeviceGetCurrentClocksThrottleReasons"),
    "hotplug": ("nvmlDeviceGetCount", "nvmlDeviceGetCount_v2"),
    "init": ("nvmlInit", "nvmlInit_v2", "nvmlInitWithFlags"),
}


def nvidia_uuid(device: Device) -> str:
    return f"GPU-{device.uuid}"


def nvidia_name(device: Device) -> str:
    return device.model if device.model.startswith("NVIDIA") else f"NVIDIA {device.model}"


class NvmlSurface:
    def __init__(self, root: Path, threshold_c: float = DEFAULT_SHUTDOWN_C) -> None:
        self.dir = Path(root) / "nvml"
        self.threshold_c = threshold_c
        self._lock = threading.Lock()
        self._sequence = 0
        self.init_error = 0  # an NVML return code nvmlInit answers with (0: it works)
        self.wait_error = 0  # likewise for nvmlEventSetWait

    @property
    def env(self) -> dict[str, str]:
        return {STATE_ENV: str(self.dir)}

    def gpus(self, devices: list[Device]) -> list[Device]:
        return [d for d in devices if d.cls == "gpu"] or list(devices)

    def start(self, devices: list[Device], make_node: Callable[[str, int, int], None]) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "events").touch()
        self.write(devices)
        self.make_nodes(devices, make_node)

    def make_nodes(self, devices: list[Device], make_node: Callable[[str, int, int], None]) -> None:
        """The driver's nodes, through Materializer.make_node (a name under dev/, major, minor)."""
        make_node("nvidiactl", NVIDIA_MAJOR, NVIDIACTL_MINOR)
        make_node("nvidia-uvm", UVM_MAJOR, 0)
        for minor, _ in enumerate(self.gpus(devices)):
            make_node(f"nvidia{minor}", NVIDIA_MAJOR, minor)

    def write(self, devices: list[Device]) -> None:
        lines = [f"driver {DRIVER_VERSION}"]
        if self.init_error:
            lines.append(f"init_error {self.init_error}")
        if self.wait_error:
            lines.append(f"wait_error {self.wait_error}")
        for minor, d in enumerate(self.gpus(devices)):
            lost = int(d.health == UNHEALTHY)
            ecc = d.ecc_errors
            lines.append(f"device {int(d.present)} {lost} {round(d.temperature_c)} {round(self.threshold_c)} 0 {ecc} "
                         f"{max(d.numa, 0)} {minor} {d.memory_mib} {PCI_DEVICE_ID:x} {d.pci_address} "
                         f"{nvidia_uuid(d)} {d.serial or '0'} {nvidia_name(d)}")
        with self._lock:
            partial = self.dir / ".state.partial"
            partial.write_text("\n".join(lines) + "\n")
            os.replace(partial, self.dir / "state")

    def event(self, devices: list[Device], device: Device, event_type: int, data: int) -> None:
        slot = next(n for n, d in enumerate(self.gpus(devices)) if d.id == device.id)
        with self._lock:
            line = f"{self._sequence} {slot} {event_type:x} {data}\n"
            self._sequence += 1
            with open(self.dir / "events", "a") as f:
                f.write(line)

    def apply(self, op: str, devices: list[Device], device: Device, value: int | None = None) -> None:
        """The NVML side of one backend operation, after the model changed."""
        if device not in self.gpus(devices):
            return
        self.write(devices)
        if op == "fail":
            self.event(devices, device, EVENT_XID, XID_FALLEN_OFF_BUS)
        elif op == "ecc":
            self.event(devices, device, EVENT_DBE, 0)
            self.event(devices, device, EVENT_XID, XID_DBE)
        elif op == "xid":
            self.event(devices, device, EVENT_XID, int(value or 0))

    def reads(self, capability: str) -> bool:
        """Whether the plugin used NVML for `capability` (health, temperature, hotplug), by the call log."""
        return bool(set(self.calls()) & set(CAPABILITY_CALLS[capability]))

    def summary(self) -> str:
        """The call log, counted: "nvmlEventSetWait_v2 x12, nvmlDeviceGetCount_v2 x1" (most called first)."""
        counts: dict[str, int] = {}
        for name in self.calls():
            counts[name] = counts.get(name, 0) + 1
        return ", ".join(f"{n} x{c}" for n, c in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))

    def calls(self) -> list[str]:
        """The NVML entry points called so far, in order (the library's call log)."""
        try:
            return (self.dir / "calls").read_text().split()
        except OSError:
            return []
