"""The reference device plugin's Level-Zero health source: what Intel's GPU plugin does with its sidecar.

The GPUs themselves come from the sysfs tree (the drm skin's device dirs, each with
its PCI address); their health and temperature come from the Level-Zero sidecar
over its unix socket (harness/wire/levelzero), by BDF: a device is Unhealthy when
the sidecar says its bus, SoC or memory is not OK, or answers with an error. The
sidecar has no events: the plugin asks it every POLL_S, and whenever sysfs changes.
An unreachable sidecar makes every device Unhealthy (nothing vouches for them).

Mutant (harness/reference/defects.py): `sidecar-down-keeps-healthy` (while the
sidecar is unreachable it keeps reporting what sysfs says, healthy GPUs included).
Benign: `late-sidecar-client` (its sidecar client is ready only LATE_CLIENT_S after
start, as Intel's, whose first poll comes one 5 s period in: until then it lists the
GPUs as sysfs shows them, and asks nothing).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import replace
from pathlib import Path

import grpc

from fake_devices.model import HEALTHY, UNHEALTHY
from harness.instruments.grpcutil import unix_target
from harness.reference.sources import SeenDevice, SysfsSource
from harness.spec import composition
from harness.wire import levelzero as lz
from harness.wire import levelzero_grpc as lz_grpc

log = logging.getLogger("reference-dp")

ZE_RESULT_ERROR_INVALID_ARGUMENT = 0x78000004  # level-zero ze_api.h: what the sidecar says of an unknown BDF
POLL_S = 1.0  # how often the sidecar is asked, besides on sysfs changes
CALL_TIMEOUT_S = 2.0
LATE_CLIENT_S = 5.0  # late-sidecar-client: Intel's GPU plugin first asks its sidecar one 5 s poll period in


class LevelZeroSource(SysfsSource):
    def __init__(self, root: Path, socket_path: Path, defect: str | None = None) -> None:
        super().__init__(root)
        self.defect = defect
        self.channel = grpc.insecure_channel(unix_target(str(socket_path)))
        self.stub = lz_grpc.LevelzeroStub(self.channel)
        self._stop = threading.Event()
        late = defect == "late-sidecar-client"
        self._client_ready_at = time.monotonic() + (LATE_CLIENT_S if late else 0.0)
        self.wake_r, self._wake_w = os.pipe()  # the plugin's loop reads this: "look again"
        self._thread = threading.Thread(target=self._poll, daemon=True, name="levelzero-poll")
        self._thread.start()

    def _read_one(self, d: Path) -> SeenDevice:
        seen = super()._read_one(d)
        if time.monotonic() < self._client_ready_at:
            return seen  # its client is still connecting in the background: nothing to ask yet
        bdf = (d / "pci_address").read_text().strip()
        try:
            health = self.stub.GetDeviceHealth(lz.DeviceId(bdfAddress=bdf), timeout=CALL_TIMEOUT_S)
            temps = self.stub.GetDeviceTemperature(lz.DeviceId(bdfAddress=bdf), timeout=CALL_TIMEOUT_S)
        except grpc.RpcError as err:
            log.warning("Level-Zero sidecar unreachable for %s: %s", bdf, err.code())
            if composition.has(self.defect, "sidecar-down-keeps-healthy"):
                return seen
            return replace(seen, health=UNHEALTHY, temperature_c=None)
        if health.error.errorcode == ZE_RESULT_ERROR_INVALID_ARGUMENT:
            return replace(seen, present=False)  # Level Zero knows no such device: it is going away
        ok = health.bus_ok and health.soc_ok and health.memory_ok and not health.error.errorcode
        hottest = max(getattr(temps, "global"), temps.gpu, temps.memory)
        return replace(seen, health=HEALTHY if ok else UNHEALTHY,
                       temperature_c=None if temps.error.errorcode else hottest)

    def _poll(self) -> None:
        while not self._stop.wait(POLL_S):
            try:
                os.write(self._wake_w, b"x")
            except OSError:
                return

    def close(self) -> None:
        self._stop.set()
        self.channel.close()
