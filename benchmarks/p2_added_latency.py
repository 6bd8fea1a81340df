"""P2: the latency the harness adds to a plugin's Allocate.

Two reference plugins run side by side, each under its own fake kubelet in its
own sandbox: one answers Allocate at once, the other `--allocate-delay-ms D`
late (the injected fault). K pods are admitted through the kubelet path on
each (`FakeNode.admit_pod`: GetPreferredAllocation, Allocate, checkpoint),
alternating between the two so that machine noise hits both alike, and
measured end to end. The figure is measured minus injected at p50/p95/p99;
the requirement is <= 5 ms at p99.

A second part times Allocate on the delay-0 plugin through a plain gRPC stub
and through the fake kubelet's endpoint (whose channel carries the recording
interceptor), alternated, and prints the ratio: the interceptor's cost.

It prints figures; it is not a test.

    python benchmarks/p2_added_latency.py [--calls 300] [--delay-ms 20] [--warmup 20]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import statistics
import sys
import time
from collections.abc import Callable

# grpc reads this once, at import: keep its core's INFO lines (a GOAWAY at teardown) off the figures.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

import grpc

from harness.instruments.grpcutil import insecure_unix_channel, wait_ready
from harness.instruments.timeline import Event
from harness.kubelet.endpoint import Endpoint
from harness.spec.profiles import FAST
from harness.spec.subjects import load_subject
from harness.wire import dp, dp_grpc
from harness.world.env import DPEnv

TARGET_MS = 5.0  # P2: measured minus injected, at p99
CALL_TIMEOUT_S = 10.0  # a single call taking longer than this is a hang, not a latency
QUANTILES = (50, 95, 99)


def _term_to_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def pct(samples: list[float], p: int) -> float:
    """The p-th percentile, linear interpolation between closest ranks."""
    if len(samples) == 1:
        return samples[0]
    return statistics.quantiles(samples, n=100, method="inclusive")[p - 1]


def row(label: str, samples: list[float], unit: str = "ms") -> str:
    cells = "".join(f"{pct(samples, p):9.3f}" for p in QUANTILES)
    return f"  {label:34}{cells}{max(samples):9.3f}  {unit}"


def header() -> str:
    return f"  {'':34}" + "".join(f"{'p' + str(p):>9}" for p in QUANTILES) + f"{'max':>9}"


class Bench:
    """One reference plugin with a given Allocate delay, under its own fake kubelet."""

    def __init__(self, delay_ms: int) -> None:
        base = load_subject("reference-dp")
        spec = dataclasses.replace(base, command=[*base.command, "--allocate-delay-ms", str(delay_ms)])
        self.delay_ms = delay_ms
        self.resource = spec.resource
        self.env = DPEnv(spec, FAST)
        self.pods = 0

    def start(self) -> None:
        """Start kubelet and plugin; return once the kubelet has healthy devices to give."""
        self.env.start()
        reg = self.env.wait_registered()
        self.env.timeline.wait_for(
            lambda e: e.kind == "kubelet.devices" and e.get("resource") == self.resource
            and (e.get("allocatable") or 0) >= 1,
            FAST.reaction_s, f"allocatable {self.resource} after registration", reg.t_ns,
            abort=lambda e: e.kind == "process.exit" and self.env.is_mine(e),
            relevant=("kubelet.devices", "kubelet.stream_end", "process.exit"))

    def endpoint(self) -> Endpoint:
        manager = self.env.node.manager
        endpoint = manager.endpoint(self.resource) if manager is not None else None
        if endpoint is None:
            raise RuntimeError(f"no live endpoint for {self.resource}")
        return endpoint

    def admit(self) -> float:
        """Admit one pod for one device, end to end through the kubelet path; free it again. Milliseconds."""
        manager = self.env.node.manager
        assert manager is not None
        self.pods += 1
        pod = f"bench-{self.delay_ms}ms-{self.pods}"
        t0 = time.perf_counter_ns()
        allocations = self.env.node.admit_pod(pod, {self.resource: 1})
        elapsed = (time.perf_counter_ns() - t0) / 1e6
        manager.remove_pod(pod)
        if allocations[0].reused or len(allocations[0].device_ids) != 1:
            raise RuntimeError(f"{pod}: expected a fresh allocation of 1 device, got {allocations[0]}")
        return elapsed

    def rpc_durations(self, method: str, since_ns: int) -> list[float]:
        """The kubelet client interceptor's own duration of each `method` call since `since_ns`, in ms."""
        def mine(e: Event) -> bool:
            return (e.kind == "grpc.call" and e.source == "kubelet" and e.get("side") == "client"
                    and e.get("method") == method)
        return [e.get("duration_s") * 1e3 for e in self.env.timeline.find(mine, since_ns)]

    def close(self) -> None:
        self.env.close()


def alternate(calls: int, first: Callable[[], float], second: Callable[[], float]) -> tuple[list[float], list[float]]:
    """Time `calls` of each, interleaved ABBA so that neither side always goes first."""
    a: list[float] = []
    b: list[float] = []
    for i in range(calls):
        if i % 2 == 0:
            a.append(first())
            b.append(second())
        else:
            b.append(second())
            a.append(first())
    return a, b


def timed(fn: Callable[[], object]) -> Callable[[], float]:
    def run() -> float:
        t0 = time.perf_counter_ns()
        fn()
        return (time.perf_counter_ns() - t0) / 1e6
    return run


def added_latency(zero: Bench, delayed: Bench, calls: int, warmup: int, target_ms: float) -> None:
    delay = float(delayed.delay_ms)
    alternate(warmup, zero.admit, delayed.admit)
    since0, sinced = zero.env.now(), delayed.env.now()
    m0, md = alternate(calls, zero.admit, delayed.admit)
    added = [m - delay for m in md]
    rpc0, rpcd = zero.rpc_durations("Allocate", since0), delayed.rpc_durations("Allocate", sinced)

    print(f"\n1. kubelet path: {calls} admissions at each delay, alternated, after {warmup} warm-up each")
    print("   (admit_pod = GetPreferredAllocation + Allocate + checkpoint write; then remove_pod, untimed)")
    print(header())
    print(row("end to end, delay 0 ms", m0))
    print(row(f"end to end, delay {delayed.delay_ms} ms", md))
    print(row(f"measured - injected ({delayed.delay_ms} ms)", added))
    print(row("  of it Allocate RPC - injected", [r - delay for r in rpcd]))
    print(row("Allocate RPC alone, delay 0 ms", rpc0))
    shift = [pct(md, p) - pct(m0, p) - delay for p in QUANTILES]
    print("  delay overshoot (delayed - undelayed - injected) at p50/p95/p99: "
          + " / ".join(f"{s:.3f}" for s in shift) + " ms")
    p99 = pct(added, 99)
    print(f"\n   target: measured - injected <= {target_ms:g} ms at p99")
    print(f"   p99 measured - injected = {p99:.3f} ms = {p99 / target_ms:.2f} x target; "
          f"meets target: {'yes' if p99 <= target_ms else 'no'}")


def interceptor_overhead(zero: Bench, calls: int, warmup: int) -> None:
    endpoint = zero.endpoint()
    channel = insecure_unix_channel(endpoint.socket_path)
    try:
        if not wait_ready(channel, FAST.dial_timeout_s):
            raise RuntimeError(f"cannot dial {endpoint.socket_path}")
        stub = dp_grpc.DevicePluginStub(channel)
        device = sorted(zero.env.node.devices(zero.resource))[0]
        # Both sides build the same request per call, as Endpoint.allocate does.
        plain = timed(lambda: stub.Allocate(dp.AllocateRequest(
            container_requests=[dp.ContainerAllocateRequest(devices_ids=[device])]), timeout=CALL_TIMEOUT_S))
        recorded = timed(lambda: endpoint.allocate([device]))
        alternate(warmup, plain, recorded)
        p, r = alternate(calls, plain, recorded)
    finally:
        channel.close()
    print(f"\n2. recording interceptor: {calls} Allocate calls each on the delay-0 plugin, alternated")
    print(header())
    print(row("plain grpc stub", p))
    print(row("kubelet endpoint (recording)", r))
    ratios = " / ".join(f"{pct(r, q) / pct(p, q):.2f}" for q in QUANTILES)
    extra = " / ".join(f"{(pct(r, q) - pct(p, q)) * 1e3:.0f}" for q in QUANTILES)
    print(f"  recorded / plain at p50/p95/p99: {ratios} x  (+{extra} us per call)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300, help="timed calls per side (default 300)")
    parser.add_argument("--delay-ms", type=int, default=20, help="injected Allocate delay D (default 20)")
    parser.add_argument("--warmup", type=int, default=20, help="untimed calls per side first (default 20)")
    parser.add_argument("--target-ms", type=float, default=TARGET_MS,
                        help=f"p99 measured-minus-injected target (default {TARGET_MS:g})")
    args = parser.parse_args(argv)
    if args.calls < 2 or args.delay_ms < 0 or args.warmup < 0:
        parser.error("need --calls >= 2, --delay-ms >= 0, --warmup >= 0")
    signal.signal(signal.SIGTERM, _term_to_interrupt)

    print(f"P2 added latency: reference-dp, profile {FAST.name}, injected Allocate delay {args.delay_ms} ms, "
          f"{len(os.sched_getaffinity(0))} usable CPU(s), grpcio {grpc.__version__}, "
          f"load average {os.getloadavg()[0]:.2f}")
    benches: list[Bench] = []
    try:
        for delay in (0, args.delay_ms):
            benches.append(Bench(delay))
            benches[-1].start()
        zero, delayed = benches
        added_latency(zero, delayed, args.calls, args.warmup, args.target_ms)
        interceptor_overhead(zero, args.calls, args.warmup)
        print(f"\nload average {os.getloadavg()[0]:.2f} at the end (other work on the machine skews the tails)")
    except KeyboardInterrupt:
        print("interrupted; plugins stopped and sandboxes removed", file=sys.stderr)
        return 130
    finally:
        for bench in reversed(benches):
            try:
                bench.close()
            except Exception as err:  # keep closing the others
                print(f"cleanup of the {bench.delay_ms} ms bench failed: {err}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
