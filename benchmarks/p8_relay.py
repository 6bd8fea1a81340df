"""P8: what the relay (harness/node/relay, fakelet between a real kubelet and a plugin) adds to the wire.

One in-process device plugin serves its socket; the relay puts its copy in a kubelet directory, recording
every call on a timeline as it does on a real node. The same client then calls the plugin directly and
through the relay, alternately, so that machine noise hits both alike:

- unary: Allocate, N times each way; the figure is p50/p99 of each and of the paired difference;
- stream: two ListAndWatch streams open at once, one direct and one through the relay; the plugin sends each
  message to both at the same instant, and the figure is how much later the relayed copy arrives.

Target: p99 added under 1 ms for both. It prints figures; it is not a test.

    python benchmarks/p8_relay.py [--calls 500] [--messages 500] [--devices 8]
"""

from __future__ import annotations

import argparse
import os
import queue
import statistics
import sys
import tempfile
import threading
import time
from concurrent import futures
from pathlib import Path

os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

import grpc

from harness.instruments.grpcutil import insecure_unix_channel, wait_ready
from harness.instruments.timeline import Timeline
from harness.node.relay.dp import DevicePluginRelay
from harness.wire import dp, dp_grpc

TARGET_MS = 1.0  # the goal: the relay's added p99, per unary call and per stream message
READY_S = 10.0
CALL_TIMEOUT_S = 10.0
ENDPOINT = "bench.sock"


class Plugin(dp_grpc.DevicePluginServicer):
    """Answers Allocate at once; sends each pushed list on every open stream."""

    def __init__(self, devices: int) -> None:
        self.devices = [dp.Device(ID=f"dev-{i}", health="Healthy") for i in range(devices)]
        self._streams: list[queue.SimpleQueue] = []
        self._lock = threading.Lock()
        self.opened = threading.Semaphore(0)

    def Allocate(self, request, context):  # noqa: N802
        return dp.AllocateResponse(container_responses=[dp.ContainerAllocateResponse(envs={"X": "1"})
                                                        for _ in request.container_requests])

    def ListAndWatch(self, request, context):  # noqa: N802
        q: queue.SimpleQueue = queue.SimpleQueue()
        context.add_callback(lambda: q.put(None))
        with self._lock:
            self._streams.append(q)
        self.opened.release()
        while (item := q.get()) is not None:
            yield item

    def push(self) -> None:
        message = dp.ListAndWatchResponse(devices=self.devices)
        with self._lock:
            for q in self._streams:
                q.put(message)

    def end(self) -> None:
        with self._lock:
            for q in self._streams:
                q.put(None)


def pct(samples: list[float], p: int) -> float:
    return statistics.quantiles(samples, n=100, method="inclusive")[p - 1] if len(samples) > 1 else samples[0]


def line(label: str, samples: list[float]) -> str:
    return f"  {label:34} p50 {pct(samples, 50):7.3f} ms   p99 {pct(samples, 99):7.3f} ms"


def unary(direct: dp_grpc.DevicePluginStub, relayed: dp_grpc.DevicePluginStub, calls: int) -> dict[str, list[float]]:
    request = dp.AllocateRequest(container_requests=[dp.ContainerAllocateRequest(devices_ids=["dev-0"])])
    times: dict[str, list[float]] = {"direct": [], "relay": []}
    for i in range(calls):
        order = (("direct", direct), ("relay", relayed)) if i % 2 else (("relay", relayed), ("direct", direct))
        for name, stub in order:
            t0 = time.perf_counter()
            stub.Allocate(request, timeout=CALL_TIMEOUT_S)
            times[name].append((time.perf_counter() - t0) * 1000)
    times["added"] = [r - d for r, d in zip(times["relay"], times["direct"], strict=True)]
    return times


def streams(plugin: Plugin, direct: dp_grpc.DevicePluginStub, relayed: dp_grpc.DevicePluginStub,
            messages: int) -> list[float]:
    arrivals: dict[str, list[float]] = {"direct": [], "relay": []}
    calls = {"direct": direct.ListAndWatch(dp.Empty()), "relay": relayed.ListAndWatch(dp.Empty())}
    for _ in calls:
        if not plugin.opened.acquire(timeout=READY_S):
            raise SystemExit("a ListAndWatch stream did not open")
    got = threading.Semaphore(0)

    def read(name: str) -> None:
        try:
            for _ in calls[name]:
                arrivals[name].append(time.perf_counter())
                got.release()
        except grpc.RpcError:
            pass  # cancelled at the end

    readers = [threading.Thread(target=read, args=(n,), daemon=True) for n in calls]
    for t in readers:
        t.start()
    for _ in range(messages):
        plugin.push()
        for _ in calls:  # one message in flight at a time: each is timed alone
            if not got.acquire(timeout=CALL_TIMEOUT_S):
                raise SystemExit("a ListAndWatch message did not arrive")
    for call in calls.values():
        call.cancel()
    return [(r - d) * 1000 for r, d in zip(arrivals["relay"], arrivals["direct"], strict=True)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--messages", type=int, default=500)
    parser.add_argument("--devices", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=30)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="fakelet-p8-") as tmp:
        root = Path(tmp)
        plugin_dir, kubelet_dir = root / "plugin", root / "kubelet"
        plugin_dir.mkdir()
        kubelet_dir.mkdir()
        timeline = Timeline()
        relay = DevicePluginRelay(timeline, plugin_dir, kubelet_dir, root / "relay", lambda: 1).start()
        plugin = Plugin(args.devices)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        dp_grpc.add_DevicePluginServicer_to_server(plugin, server)
        server.add_insecure_port(f"unix://{plugin_dir / ENDPOINT}")
        server.start()
        try:
            timeline.wait_for(lambda e: e.kind == "relay.mirror" and e.get("name") == ENDPOINT, READY_S,
                              "the relay's copy of the plugin's socket")
            channels = [insecure_unix_channel(str(d / ENDPOINT)) for d in (plugin_dir, kubelet_dir)]
            for channel in channels:
                if not wait_ready(channel, READY_S):
                    raise SystemExit("a channel did not connect")
            direct, relayed = (dp_grpc.DevicePluginStub(c) for c in channels)
            unary(direct, relayed, args.warmup)
            times = unary(direct, relayed, args.calls)
            stream_added = streams(plugin, direct, relayed, args.messages)
            load = os.getloadavg()[0]
            print(f"P8 the relay's added latency ({args.calls} Allocate calls each way, {args.messages} "
                  f"ListAndWatch messages of {args.devices} devices; load {load:.2f} on {os.cpu_count()} CPUs)")
            print(line("Allocate, direct", times["direct"]))
            print(line("Allocate, through the relay", times["relay"]))
            print(line("Allocate, added (paired)", times["added"]))
            print(line("ListAndWatch message, added", stream_added))
            worst = max(pct(times["added"], 99), pct(stream_added, 99))
            verdict = "met" if worst < TARGET_MS else "NOT met"
            print(f"  target: p99 added under {TARGET_MS:g} ms: {verdict} (worst p99 {worst:.3f} ms)")
            for channel in channels:
                channel.close()
        finally:
            plugin.end()
            server.stop(grace=0).wait(5)
            relay.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
