"""P5: N pods on M devices, every device tainted NoExecute at once: how long until the last unprepare.

The reference DRA driver publishes M fake GPUs; M claims are allocated, one a
device, and N pods share them (N/M pods a claim, as pods of one job share a
claim), all running under the fake kubelet's pod worker against the real local
kube-apiserver and kube-controller-manager. One DeviceTaintRule then taints
every device NoExecute. Three clocks, measured in the same run:

- the controller's own eviction: when an independent API watch (this script's,
  not fakelet's) sees each pod's deletionTimestamp appear;
- the kubelet's reaction: when fakelet's pod worker starts killing each pod;
- the end: the last NodeUnprepareResources (one per claim, when its last pod goes)
  and the last pod deletion finished.

It prints the taint-to-last-unprepare time, fakelet's added latency over the
controller's (kubelet reaction minus controller eviction, p50/p99), their
ratio, and the CPU each party used in the window (fakelet's process, the
driver, kube-controller-manager, kube-apiserver) as shares. It prints
figures; it is not a test.

    python benchmarks/p5_taint_eviction.py [--pods 50] [--devices 8]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

from harness.controlplane import open_control_plane
from harness.controlplane.allocator import AllocationError
from harness.controlplane.scheduler import pod_body
from harness.controlplane.taints import NO_EXECUTE
from harness.spec.profiles import FAST
from harness.spec.subjects import load_subject
from harness.world.draenv import DRAEnv

TICKS = os.sysconf("SC_CLK_TCK")
WAIT_S = 120.0  # every wait of the benchmark is bounded by this


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process and its reaped children (/proc/PID/stat)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(fields[i]) for i in (11, 12, 13, 14)) / TICKS


def inventory(devices: int, directory: Path) -> Path:
    path = directory / "inventory.yaml"
    lines = ["devices:"] + [f"  - {{id: gpu-{i}, numa: {i % 2}, health: Healthy, dev: fakegpu{i}}}"
                            for i in range(devices)]
    path.write_text("\n".join(lines) + "\n")
    return path


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def watch_deletions(env: DRAEnv, names: set[str], seen: dict[str, float], stop: threading.Event) -> None:
    """The controller's evictions as an outside API client sees them: deletionTimestamp appearing."""
    assert env.client is not None
    path = f"/api/v1/namespaces/{env.node_name}/pods"
    _, version = env.client.list_with_version(path)
    while not stop.is_set() and len(seen) < len(names):
        for event in env.client.watch(path, version, 2.0):
            meta = event["object"].get("metadata", {})
            version = meta.get("resourceVersion", version)
            if meta.get("name") in names and meta.get("deletionTimestamp") and meta["name"] not in seen:
                seen[meta["name"]] = time.monotonic()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=50)
    parser.add_argument("--devices", type=int, default=8)
    args = parser.parse_args()
    if not (1 <= args.devices <= args.pods <= 500):
        parser.error("need 1 <= --devices <= --pods <= 500")
    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    work = Path(tempfile.mkdtemp(prefix="fakelet-p5-"))
    spec = load_subject("reference-dra")
    spec = dataclasses.replace(spec, backend={**(spec.backend or {}), "inventory": str(inventory(args.devices, work))})
    plane = open_control_plane("local").start()
    env = DRAEnv(spec, FAST, control_plane=plane)
    try:
        env.start()
        env.wait_allocatable(args.devices)
        assert env.allocator is not None and env.scheduler is not None and env.client is not None
        env.allocator.ensure_device_class(env.device_class, env.driver)
        claims = [env.allocator.create_claim(env.node_name, f"shared-{i}", env.device_class)
                  for i in range(args.devices)]
        pods = []
        for i in range(args.pods):
            claim = claims[i % args.devices]
            body = pod_body(env.node_name, f"job-{i}", {"gpu": claim["metadata"]["name"]})
            pods.append(env.client.create(f"/api/v1/namespaces/{env.node_name}/pods", body))
        began = env.now()
        for i, pod in enumerate(pods):
            try:
                env.scheduler.schedule(pod, [claims[i % args.devices]], env.node_name, env.driver)
            except AllocationError as err:
                raise SystemExit(f"scheduling {pod['metadata']['name']}: {err}") from None
        for pod in pods:
            env.wait_pod("pod.running", pod, began, f"{pod['metadata']['name']} running", WAIT_S)
        print(f"{args.pods} pods running on {args.devices} devices in {(env.now() - began) / 1e9:.2f}s")

        names = {p["metadata"]["name"] for p in pods}
        evicted: dict[str, float] = {}
        stop = threading.Event()
        watcher = threading.Thread(target=watch_deletions, args=(env, names, evicted, stop), daemon=True)
        watcher.start()
        etcd, apiserver, kcm = plane.pids()  # type: ignore[attr-defined]
        pids = {"fakelet": os.getpid(), "driver": env.subject.pid, "kube-controller-manager": kcm,
                "kube-apiserver": apiserver, "etcd": etcd}
        cpu0 = {k: cpu_s(p) for k, p in pids.items() if p}
        assert env.taint_rules is not None
        t0 = env.now()
        t0_mono = time.monotonic()
        env.taint_rules.add(f"{env.node_name}-p5", {"key": "fakelet.example.com/p5", "effect": NO_EXECUTE},
                            driver=env.driver, pool=env.node_name)
        for pod in pods:
            env.wait_pod("pod.deleted", pod, t0, f"{pod['metadata']['name']} deleted", WAIT_S)
        end = time.monotonic()
        cpu = {k: cpu_s(p) - cpu0[k] for k, p in pids.items() if p}
        stop.set()
        watcher.join(5)
        unprepares = env.timeline.find(lambda e: e.kind == "dra.unprepare", t0)
        killing = {e.get("pod"): e.t_ns for e in env.timeline.find(lambda e: e.kind == "pod.killing", t0)}
        mono_offset = time.monotonic() - env.now() / 1e9
        added = [killing[n] / 1e9 + mono_offset - evicted[n] for n in names if n in killing and n in evicted]
        last_unprepare = max(e.t_ns for e in unprepares) / 1e9 + mono_offset - t0_mono
        last_eviction = max(evicted.values()) - t0_mono if evicted else float("nan")
        print(f"taint -> last eviction seen by an API watch (the controller): {last_eviction * 1000:8.0f} ms")
        print(f"taint -> last NodeUnprepareResources ({len(unprepares)} calls):   {last_unprepare * 1000:8.0f} ms")
        print(f"taint -> last pod deletion finished:                 {(end - t0_mono) * 1000:8.0f} ms")
        if added:
            print(f"fakelet's added latency per pod (kubelet kill - controller eviction): "
                  f"p50 {statistics.median(added) * 1000:.1f} ms, p99 {percentile(added, 0.99) * 1000:.1f} ms")
            print(f"ratio last unprepare / last eviction: {last_unprepare / last_eviction:.2f}")
        total = sum(cpu.values()) or 1.0
        print("CPU in the window: " + ", ".join(f"{k} {v:.2f}s ({v / total:.0%})" for k, v in cpu.items()))
        print(f"load average at end: {os.getloadavg()[0]:.2f}")
    finally:
        env.close()
        plane.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
