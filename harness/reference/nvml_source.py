"""The reference device plugin's NVML health source: what NVML-based GPU plugins do, through ctypes.

It does what NVIDIA's device plugin does with NVML, correctly: devices are
enumerated by index and named by UUID; a device whose handle calls answer
GPU-is-lost is Unhealthy, and Healthy again once it answers; XID critical-error
and double-bit ECC events are waited for on one event set (nvmlEventSetWait,
bounded), application XIDs (13, 31, 43, 45, 68, 109) are ignored, any other
event makes the plugin look again; the temperature is polled at every wait's
timeout; and when the wait itself fails, every device is reported Unhealthy
until it works again (no healthy capacity on a blind plugin).

Mutants (harness/reference/defects.py): `app-xid-fatal` (an application XID marks
its device unhealthy for good), `wait-error-keeps-healthy` (a failing wait
changes nothing), `init-error-keeps-healthy` (when NVML does not initialize, it
falls back to listing /dev/nvidiaN as healthy GPUs: the node keeps advertising
GPUs nothing watches).
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
from pathlib import Path

from fake_devices.model import HEALTHY, UNHEALTHY
from harness.reference.sources import SeenDevice
from harness.spec import composition

log = logging.getLogger("reference-dp")

LIBRARY = "libnvidia-ml.so.1"
NVML_SUCCESS, NVML_ERROR_TIMEOUT, NVML_ERROR_GPU_IS_LOST = 0, 10, 15
EVENT_DBE, EVENT_XID = 0x2, 0x8  # nvmlEventTypeDoubleBitEccError, nvmlEventTypeXidCriticalError
APPLICATION_XIDS = frozenset((13, 31, 43, 45, 68, 109))  # NVIDIA's device plugin ignores these by default
WAIT_MS = 1000  # one event wait; the temperature is polled at each timeout
UUID_SIZE = 96  # NVML_DEVICE_UUID_V2_BUFFER_SIZE
TEMPERATURE_GPU = 0  # NVML_TEMPERATURE_GPU


class _EventData(ctypes.Structure):
    _fields_ = [("device", ctypes.c_void_p), ("eventType", ctypes.c_ulonglong), ("eventData", ctypes.c_ulonglong),
                ("gpuInstanceId", ctypes.c_uint), ("computeInstanceId", ctypes.c_uint)]


class NvmlError(RuntimeError):
    def __init__(self, call: str, code: int) -> None:
        super().__init__(f"{call}: NVML error {code}")
        self.code = code


class NvmlSource:
    def __init__(self, dev_dir: Path, defect: str | None = None) -> None:
        self.dev_dir, self.defect = dev_dir, defect
        self.lib = ctypes.CDLL(LIBRARY)
        self._call("nvmlInit_v2")
        self.fatal: set[str] = set()  # app-xid-fatal: devices an XID condemned
        self._known: dict[int, str] = {}  # handle address -> UUID, for a device that is lost now
        self.blind = False  # the event wait fails: nothing can be known of any device
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.wake_r, self._wake_w = os.pipe()  # the plugin's loop reads this: "look again"
        self._thread = threading.Thread(target=self._wait_loop, daemon=True, name="nvml-events")
        self._thread.start()

    def _call(self, name: str, *args: object) -> None:
        code = getattr(self.lib, name)(*args)
        if code != NVML_SUCCESS:
            raise NvmlError(name, code)

    def _handles(self) -> list[ctypes.c_void_p]:
        count = ctypes.c_uint()
        self._call("nvmlDeviceGetCount_v2", ctypes.byref(count))
        out = []
        for i in range(count.value):
            handle = ctypes.c_void_p()
            code = self.lib.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(handle))
            if code in (NVML_SUCCESS, NVML_ERROR_GPU_IS_LOST):
                out.append(handle)
        return out

    def _uuid(self, handle: ctypes.c_void_p) -> str | None:
        buf = ctypes.create_string_buffer(UUID_SIZE)
        return buf.value.decode() if self.lib.nvmlDeviceGetUUID(handle, buf, UUID_SIZE) == NVML_SUCCESS else None

    # -- what the plugin reads ---------------------------------------------------------

    def read(self) -> list[SeenDevice]:
        with self._lock:
            seen = []
            for minor, handle in enumerate(self._handles()):
                uuid = self._uuid(handle)
                numa = ctypes.c_uint()
                temp = ctypes.c_uint()
                lost = uuid is None
                if not lost:
                    self.lib.nvmlDeviceGetNumaNodeId(handle, ctypes.byref(numa))
                    lost = self.lib.nvmlDeviceGetTemperature(handle, TEMPERATURE_GPU, ctypes.byref(temp)) != 0
                name = uuid or self._known.get(handle.value or 0, f"GPU-lost-{minor}")
                if uuid:
                    self._known[handle.value or 0] = uuid
                healthy = not lost and not self.blind and name not in self.fatal
                seen.append(SeenDevice(id=name, numa=int(numa.value), health=HEALTHY if healthy else UNHEALTHY,
                                       temperature_c=float(temp.value) if not lost else None, present=True,
                                       host_path=str(self.dev_dir / f"nvidia{minor}")))
            return seen

    def watch(self, inotify: object) -> None:
        """Nothing to watch in files: the event wait wakes the plugin through `wake_r`."""

    def owns(self, wd: int, name: str) -> bool:
        return False

    # -- the event loop ------------------------------------------------------------------

    def _wait_loop(self) -> None:
        event_set = ctypes.c_void_p()
        registered: set[int] = set()
        try:
            self._call("nvmlEventSetCreate", ctypes.byref(event_set))
        except NvmlError as err:
            log.error("NVML events unavailable: %s", err)
            return
        while not self._stop.is_set():
            for handle in self._handles():  # a device plugged since: register it too
                if handle.value not in registered:
                    self.lib.nvmlDeviceRegisterEvents(handle, ctypes.c_ulonglong(EVENT_XID | EVENT_DBE), event_set)
                    registered.add(handle.value or 0)
            data = _EventData()
            code = self.lib.nvmlEventSetWait_v2(event_set, ctypes.byref(data), WAIT_MS)
            if code == NVML_SUCCESS:
                self.blind = False
                self._on_event(data)
            elif code == NVML_ERROR_TIMEOUT:
                self.blind = False
            elif not composition.has(self.defect, "wait-error-keeps-healthy"):
                log.warning("nvmlEventSetWait failed (%d): marking every device unhealthy", code)
                self.blind = True
            self._wake()
        self.lib.nvmlEventSetFree(event_set)

    def _on_event(self, data: _EventData) -> None:
        xid = int(data.eventData)
        app_fatal = composition.has(self.defect, "app-xid-fatal")
        if data.eventType == EVENT_XID and xid in APPLICATION_XIDS and not app_fatal:
            log.info("ignoring application XID %d", xid)
            return
        log.info("NVML event type %#x data %d", data.eventType, xid)
        if app_fatal and data.eventType == EVENT_XID and xid in APPLICATION_XIDS:
            uuid = self._known.get(data.device or 0)
            if uuid:
                self.fatal.add(uuid)

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass

    def close(self) -> None:
        self._stop.set()
        self._thread.join(WAIT_MS / 1000 + 1)
        self.lib.nvmlShutdown()


class DeviceNodeFallback:
    """The init-error-keeps-healthy mutant's source: every /dev/nvidiaN a healthy GPU, whatever NVML says."""

    def __init__(self, dev_dir: Path) -> None:
        self.dev_dir = dev_dir

    def read(self) -> list[SeenDevice]:
        nodes = sorted(p for p in self.dev_dir.glob("nvidia[0-9]*") if p.name[6:].isdigit())
        return [SeenDevice(id=p.name, numa=0, health=HEALTHY, temperature_c=None, present=True, host_path=str(p))
                for p in nodes]

    def watch(self, inotify: object) -> None:
        """Nothing changes what it lists."""

    def owns(self, wd: int, name: str) -> bool:
        return False
