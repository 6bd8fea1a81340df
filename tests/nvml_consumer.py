"""A consumer of the fake NVML library through NVIDIA's own Python binding (nvidia-ml-py's pynvml).

Run as a process of its own, with LD_LIBRARY_PATH and FAKELET_NVML_STATE set (the
dynamic loader reads LD_LIBRARY_PATH when a process starts). It prints one JSON
line per step on stdout, so the test drives the backend between steps:

- `inventory`: what enumeration shows of every device, then exit;
- `events TIMEOUT_MS N`: register every device for XID and double-bit ECC events,
  print {"ready": true}, then print each of the next N waits' results;
- `temperature`: print {"ready": true}, then for each line on stdin (a device index)
  print that device's temperature, until stdin ends: one process, many reads.
"""

from __future__ import annotations

import ctypes
import json
import sys

import pynvml as nv


def device(handle: object) -> dict:
    pci = nv.nvmlDeviceGetPciInfo(handle)
    memory = nv.nvmlDeviceGetMemoryInfo(handle)
    return {
        "uuid": nv.nvmlDeviceGetUUID(handle), "name": nv.nvmlDeviceGetName(handle),
        "serial": nv.nvmlDeviceGetSerial(handle), "minor": nv.nvmlDeviceGetMinorNumber(handle),
        "bus_id": pci.busId.decode() if isinstance(pci.busId, bytes) else pci.busId,
        "pci_device_id": pci.pciDeviceId, "memory_total": memory.total,
        "temperature": nv.nvmlDeviceGetTemperature(handle, nv.NVML_TEMPERATURE_GPU),
        "slowdown": nv.nvmlDeviceGetTemperatureThreshold(handle, nv.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN),
        "throttle": nv.nvmlDeviceGetCurrentClocksEventReasons(handle),
        "dbe": nv.nvmlDeviceGetTotalEccErrors(handle, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC),
        "mig": list(nv.nvmlDeviceGetMigMode(handle)),
        "compute": list(nv.nvmlDeviceGetCudaComputeCapability(handle)),
    }


def address(handle: object) -> int | None:
    return ctypes.cast(handle, ctypes.c_void_p).value


def inventory() -> dict:
    count = nv.nvmlDeviceGetCount()
    out: dict = {"driver": nv.nvmlSystemGetDriverVersion(), "count": count, "devices": []}
    for i in range(count):
        try:
            out["devices"].append(device(nv.nvmlDeviceGetHandleByIndex(i)))
        except nv.NVMLError as err:
            out["devices"].append({"error": str(err)})
    return out


def events(timeout_ms: int, n: int) -> None:
    handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(nv.nvmlDeviceGetCount())]
    uuids = {nv.nvmlDeviceGetUUID(h): h for h in handles}
    event_set = nv.nvmlEventSetCreate()
    for h in handles:
        nv.nvmlDeviceRegisterEvents(h, nv.nvmlEventTypeXidCriticalError | nv.nvmlEventTypeDoubleBitEccError,
                                    event_set)
    print(json.dumps({"ready": True, "devices": len(uuids)}), flush=True)
    for _ in range(n):
        try:
            data = nv.nvmlEventSetWait(event_set, timeout_ms)
        except nv.NVMLError as err:
            print(json.dumps({"error": str(err), "code": err.value}), flush=True)
            continue
        # Handles are pointers: the event's is one of ours (a lost device answers nothing else).
        uuid = next((u for u, h in uuids.items() if address(h) == address(data.device)), None)
        try:
            nv.nvmlDeviceGetUUID(data.device)
            lost = False
        except nv.NVMLError_GpuIsLost:
            lost = True
        print(json.dumps({"type": data.eventType, "xid": data.eventData, "uuid": uuid, "lost": lost}), flush=True)
    nv.nvmlEventSetFree(event_set)


def temperature() -> None:
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        handle = nv.nvmlDeviceGetHandleByIndex(int(line))
        print(json.dumps({"temperature": nv.nvmlDeviceGetTemperature(handle, nv.NVML_TEMPERATURE_GPU)}), flush=True)


def main() -> None:
    nv.nvmlInit()
    try:
        if sys.argv[1] == "inventory":
            print(json.dumps(inventory()), flush=True)
        elif sys.argv[1] == "temperature":
            temperature()
        else:
            events(int(sys.argv[2]), int(sys.argv[3]))
    finally:
        nv.nvmlShutdown()


if __name__ == "__main__":
    main()
