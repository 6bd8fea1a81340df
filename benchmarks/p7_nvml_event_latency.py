"""P7: from a backend change to the NVML consumer's nvmlEventSetWait returning it.

A consumer process (ctypes on fakelet's libnvidia-ml.so.1, as NVML-based
plugins do) registers every fake GPU for XID events and waits; this script
raises N XIDs through the fake backend (`DeviceBackend.xid`, what `fakelet
devices xid` does), one at a time, each once the consumer has reported the last.
Both processes read CLOCK_MONOTONIC, so each latency is the consumer's return
time minus the moment just before the backend call. It prints p50, p99 and max
against the target, and the same for a baseline in the same run: the time
from writing one byte to a pipe to the consumer reading it (the floor any
cross-process wake-up has here). It prints figures; it is not a test.

    python benchmarks/p7_nvml_event_latency.py [--events 200] [--target-ms 50]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fake_devices.backend import DeviceBackend
from fake_devices.model import Inventory
from fake_devices.nvml.build import library
from harness.spec.subjects import fixtures_dir, load_yaml

CONSUMER = r"""
import ctypes, os, sys, time
lib = ctypes.CDLL("libnvidia-ml.so.1")
assert lib.nvmlInit_v2() == 0
count = ctypes.c_uint(); lib.nvmlDeviceGetCount_v2(ctypes.byref(count))
event_set = ctypes.c_void_p(); lib.nvmlEventSetCreate(ctypes.byref(event_set))
for i in range(count.value):
    h = ctypes.c_void_p(); lib.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(h))
    lib.nvmlDeviceRegisterEvents(h, ctypes.c_ulonglong(0x8), event_set)
class Data(ctypes.Structure):
    _fields_ = [("device", ctypes.c_void_p), ("type", ctypes.c_ulonglong), ("data", ctypes.c_ulonglong),
                ("gi", ctypes.c_uint), ("ci", ctypes.c_uint)]
print("ready", flush=True)
mode, n = sys.argv[1], int(sys.argv[2])
for _ in range(n):
    if mode == "pipe":
        os.read(0, 1)
    else:
        d = Data()
        assert lib.nvmlEventSetWait_v2(event_set, ctypes.byref(d), 10000) == 0
    print(time.monotonic_ns(), flush=True)
"""


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def measure(backend: DeviceBackend, env: dict[str, str], mode: str, events: int) -> list[float]:
    proc = subprocess.Popen([sys.executable, "-c", CONSUMER, mode, str(events)], env=env, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        assert proc.stdout.readline().strip() == "ready"
        out = []
        gpu = backend.ids()[0]
        for _ in range(events):
            began = time.monotonic_ns()
            if mode == "pipe":
                proc.stdin.write("x")
                proc.stdin.flush()
            else:
                backend.xid(gpu, 13)
            out.append((int(proc.stdout.readline()) - began) / 1e6)
        return out
    finally:
        proc.kill()
        proc.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=200)
    parser.add_argument("--target-ms", type=float, default=50.0, help="p99 target")
    args = parser.parse_args()
    print(f"load average at start: {os.getloadavg()}")
    inventory = Inventory.from_dict(load_yaml(fixtures_dir() / "inventories" / "gpus-only.yaml").data, "gpus-only")
    with tempfile.TemporaryDirectory(prefix="fakelet-p7-") as tmp, \
            DeviceBackend(Path(tmp) / "hw", inventory, skin="nvml") as backend:
        assert backend.nvml is not None
        env = dict(os.environ, LD_LIBRARY_PATH=str(library().parent), **backend.nvml.env)
        rows = {"pipe (floor)": measure(backend, env, "pipe", args.events),
                "XID -> nvmlEventSetWait": measure(backend, env, "nvml", args.events)}
    for name, values in rows.items():
        print(f"{name:26s} p50 {statistics.median(values):6.2f} ms  p99 {percentile(values, 0.99):6.2f} ms  "
              f"max {max(values):6.2f} ms  ({len(values)} events)")
    p99 = percentile(rows["XID -> nvmlEventSetWait"], 0.99)
    ratio = statistics.median(rows["XID -> nvmlEventSetWait"]) / max(statistics.median(rows["pipe (floor)"]), 1e-6)
    print(f"median ratio to the floor: {ratio:.1f}x; target p99 <= {args.target_ms:g} ms: "
          f"{'met' if p99 <= args.target_ms else 'NOT met'}")
    print(f"load average at end: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
