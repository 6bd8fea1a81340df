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

The library logs every call to `calls` (one line each: the entry point, then
key=value fields; `@load` lines say where a process's loader found the library).
With a timeline, `CallFollower` puts that log on it as the library writes it
(inotify on the file, no polling): an `nvml.load` event per process that loads
the library, and an `nvml.call` event (source "nvml") the first time a process
makes a call (per device, for a device call) and whenever its answer (rc, value)
changes since, never one per call: plugins poll. So a temperature read that saw a `heat` is one event
carrying the new value, after the backend's `device.heat`.
"""

from __future__ import annotations

import os
import select
import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from inotify_simple import INotify
from inotify_simple import flags as IN

from fake_devices.model import UNHEALTHY, Device
from harness.instruments.timeline import Timeline

STATE_ENV = "FAKELET_NVML_STATE"  # where libnvml.c finds the state, events and call log
PROC_GPUS = "proc/driver/nvidia/gpus"  # the NVIDIA kernel module's per-GPU procfs dir
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
# Capabilities whose calls are an enumeration: every plugin counts its GPUs once at start, so only a process that
# calls again (a poll) is watching; one call at start says nothing of hotplug.
POLLED = ("hotplug",)
POLL_CALLS = frozenset(c for capability in POLLED for c in CAPABILITY_CALLS[capability])
SOURCE = "nvml"  # the timeline source of the library's calls
CALL_EVENT, LOAD_EVENT = "nvml.call", "nvml.load"
LOAD_LINE = "@load"  # a call-log line that is no call: where a process's loader found the library
STOP_DEADLINE_S = 2.0  # teardown never waits longer than this for the follower thread


def nvidia_uuid(device: Device) -> str:
    return f"GPU-{device.uuid}"


def nvidia_name(device: Device) -> str:
    return device.model if device.model.startswith("NVIDIA") else f"NVIDIA {device.model}"


class NvmlSurface:
    def __init__(self, root: Path, threshold_c: float = DEFAULT_SHUTDOWN_C) -> None:
        self.dir = Path(root) / "nvml"
        # The driver's per-GPU proc files, under the same root a plugin gets as its prefix.
        self.proc_gpus = Path(root) / PROC_GPUS
        self.threshold_c = threshold_c
        self._lock = threading.Lock()
        self._sequence = 0
        self.init_error = 0  # an NVML return code nvmlInit answers with (0: it works)
        self.wait_error = 0  # likewise for nvmlEventSetWait
        self.slots: list[str] = []  # inventory device ID per library slot, as last written
        self._follower: CallFollower | None = None

    @property
    def env(self) -> dict[str, str]:
        return {STATE_ENV: str(self.dir)}

    def gpus(self, devices: list[Device]) -> list[Device]:
        return [d for d in devices if d.cls == "gpu"] or list(devices)

    def start(self, devices: list[Device], make_node: Callable[[str, int, int], None],
              timeline: Timeline | None = None) -> None:
        """Write the state; with a timeline, follow the call log onto it from here on."""
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "events").touch()
        (self.dir / "calls").touch()  # so that it can be watched before the first call
        self.write(devices)
        self.make_nodes(devices, make_node)
        if timeline is not None and self._follower is None:
            self._follower = CallFollower(self, timeline).start()

    def stop(self) -> None:
        """Stop following the call log (what is already logged is taken in first). Idempotent."""
        follower, self._follower = self._follower, None
        if follower is not None:
            follower.stop()

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
        self.slots = [d.id for d in self.gpus(devices)]
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
        self.write_proc(devices)

    def write_proc(self, devices: list[Device]) -> None:
        """ROOT/proc/driver/nvidia/gpus/<bdf>/information for each present GPU, in the driver's layout
        (nv-procfs.c: "Model:", "GPU UUID:", "Bus Location:", "Device Minor:"); gone once it is unplugged."""
        gpus = self.gpus(devices)
        present = {d.pci_address: (minor, d) for minor, d in enumerate(gpus) if d.present and d.pci_address}
        self.proc_gpus.mkdir(parents=True, exist_ok=True)
        for old in self.proc_gpus.iterdir():
            if old.name not in present:
                shutil.rmtree(old, ignore_errors=True)
        for bdf, (minor, d) in present.items():
            folder = self.proc_gpus / bdf
            folder.mkdir(exist_ok=True)
            (folder / "information").write_text(
                f"Model: \t\t {nvidia_name(d)}\nIRQ:   \t\t 0\nGPU UUID: \t {nvidia_uuid(d)}\n"
                f"Video BIOS: \t ??.??.??.??.??\nBus Type: \t PCIe\nDMA Size: \t 47 bits\n"
                f"DMA Mask: \t 0x7fffffffffff\nBus Location: \t {bdf}\nDevice Minor: \t {minor}\n"
                f"GPU Excluded:\t No\n")

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
        """Whether the plugin used NVML for `capability` (health, temperature, hotplug), by the call log;
        a POLLED capability only when one process made its calls more than once."""
        wanted = set(CAPABILITY_CALLS[capability])
        if capability not in POLLED:
            return bool(set(self.calls()) & wanted)
        per_process: dict[str | None, int] = {}
        for name, fields in self.log():
            if name in wanted:
                pid = fields.get("pid")
                per_process[pid] = per_process.get(pid, 0) + 1
        return any(n > 1 for n in per_process.values())

    def summary(self) -> str:
        """The call log, counted: "nvmlEventSetWait_v2 x12, nvmlDeviceGetCount_v2 x1" (most called first)."""
        counts: dict[str, int] = {}
        for name in self.calls():
            counts[name] = counts.get(name, 0) + 1
        return ", ".join(f"{n} x{c}" for n, c in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))

    def calls(self) -> list[str]:
        """The NVML entry points called so far, in order (the library's call log)."""
        return [name for name, _ in self.log() if name != LOAD_LINE]

    def loads(self) -> list[dict[str, str]]:
        """Every load of the library: {pid, ns, path}, the path as the process's loader found it."""
        return [fields for name, fields in self.log() if name == LOAD_LINE]

    def log(self) -> list[tuple[str, dict[str, str]]]:
        """The call log, parsed: (entry point or "@load", its fields)."""
        try:
            text = (self.dir / "calls").read_text(errors="replace")
        except OSError:
            return []
        return [parse_line(line) for line in text.splitlines() if line.strip()]

    def device_id(self, slot: str | None) -> str | None:
        """The inventory device behind a library slot (slots never move), or None."""
        try:
            return self.slots[int(slot)] if slot is not None and int(slot) >= 0 else None
        except (ValueError, IndexError):
            return None


def parse_line(line: str) -> tuple[str, dict[str, str]]:
    """`name k=v k=v ...` -> (name, {k: v}); a `path=` field is last and runs to the end (it may hold spaces)."""
    name, _, rest = line.strip().partition(" ")
    fields: dict[str, str] = {}
    while rest:
        key, sep, value = rest.partition("=")
        if not sep:
            break
        if key == "path":
            fields[key] = value
            break
        fields[key], _, rest = value.partition(" ")
    return name, fields


def _int(text: str | None) -> int | None:
    try:
        return None if text is None else int(text)
    except ValueError:
        return None


class CallFollower:
    """The library's call log onto the timeline, as it is written (inotify on the file; see the module doc)."""

    def __init__(self, surface: NvmlSurface, timeline: Timeline) -> None:
        self.surface, self.timeline = surface, timeline
        self.path = surface.dir / "calls"
        self._offset = self.path.stat().st_size  # calls of an earlier start are not this one's
        self._partial = b""
        self._last: dict[tuple[str, str | None, str | None], tuple[str | None, str | None]] = {}
        self._polled: set[tuple[str, str | None, str | None]] = set()  # POLLED calls whose repeat is recorded
        self._inotify = INotify()
        self._wake_r, self._wake_w = os.pipe()
        self._thread = threading.Thread(target=self._run, daemon=True, name="fakelet-nvml-calls")

    def start(self) -> CallFollower:
        self._inotify.add_watch(str(self.path), IN.MODIFY)
        self._thread.start()
        return self

    def stop(self) -> None:
        os.write(self._wake_w, b"x")
        self._thread.join(STOP_DEADLINE_S)
        self._inotify.close()  # a thread past its deadline then fails its next read and ends
        for fd in (self._wake_r, self._wake_w):
            os.close(fd)

    def _run(self) -> None:
        try:
            while True:
                ready, _, _ = select.select([self._inotify.fileno(), self._wake_r], [], [])
                self._inotify.read(timeout=0)
                # Read what is logged even when woken to stop: calls made before stop() count.
                self._take()
                if self._wake_r in ready:
                    return
        except (OSError, ValueError):
            return  # closed under us after the stop deadline

    def _take(self) -> None:
        with open(self.path, "rb") as log:
            log.seek(self._offset)
            data = log.read()
        self._offset += len(data)
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()  # a line being written is taken in once complete
        for raw in lines:
            if raw.strip():
                self._record(*parse_line(raw.decode(errors="replace")))

    def _record(self, name: str, fields: dict[str, str]) -> None:
        pid, when = _int(fields.get("pid")), _int(fields.get("ns"))
        if name == LOAD_LINE:
            self.timeline.record(LOAD_EVENT, SOURCE, pid=pid, path=fields.get("path"), call_ns=when)
            return
        slot = fields.get("slot")
        key, answer = (name, fields.get("pid"), slot), (fields.get("rc"), fields.get("value"))
        repeat = key in self._last
        if self._last.get(key, ()) == answer:
            if name not in POLL_CALLS or key in self._polled:
                return  # the same answer to the same caller as last time: a poll, not news
            self._polled.add(key)  # its first repeat is news: coverage waits for it (NvmlSurface.reads)
        self._last[key] = answer
        data: dict[str, Any] = {"call": name, "pid": pid}
        if repeat and name in POLL_CALLS:
            data["repeat"] = True
        if slot is not None:
            data["device"] = self.surface.device_id(slot)
        for field in ("rc", "value"):
            if fields.get(field) is not None:
                data[field] = _int(fields[field])
        data["call_ns"] = when  # when the library was called (CLOCK_MONOTONIC, the timeline's clock)
        self.timeline.record(CALL_EVENT, SOURCE, **data)
