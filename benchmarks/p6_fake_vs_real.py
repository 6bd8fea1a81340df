"""P6: the same checks on the fake kubelet and on the real one, timed side by side in one run.

Two measurements, both kubelets in the same run on the same machine:

1. Wall time of the DP-NODE check set on the reference device plugin (the
   checks that run on both kubelets), run one check at a time, and the
   reaction times each kubelet's run measured (registration, re-registration
   after a restart, health to allocatable). The ratio is the fake's speed-up.
2. What the fake kubelet imitates of a restart: from "restart the kubelet" to
   a fresh kubelet.sock (the real one deletes every socket and serves a new
   one), repeated, p50 and max for each kubelet.

Needs root and containerd (the real node); it prints figures, it is not a test.

    python benchmarks/p6_fake_vs_real.py [--restarts 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.config.runconfig import SHARED_CONTROL_PLANE_ENV
from harness.controlplane.local import LocalControlPlane
from harness.instruments.filewatch import FileWatch
from harness.instruments.timeline import Timeline
from harness.launch.sandbox import Sandbox
from harness.node.fake import FakeNode
from harness.node.real.localnode import LocalNode, unavailable
from harness.run import fidelity
from harness.run.commands import run_one, shared_control_plane
from harness.spec.profiles import get as get_profile

SOCKET_WAIT_S = 30.0


def check_set(out: Path) -> fidelity.Table:
    args = argparse.Namespace(profile="fast", seed=0, jobs=1, verbose=False, mutant_bound=6.0, serial=True)
    try:
        return fidelity.run(args, [fidelity.Target("reference-dp")], [], out, run_one, shared_control_plane,
                            lambda line: None)
    finally:
        os.environ.pop(SHARED_CONTROL_PLANE_ENV, None)


def restart_to_socket(node: FakeNode | LocalNode, timeline: Timeline, plugin_dir: Path, n: int) -> list[float]:
    """Seconds from restart_kubelet() being called to kubelet.sock created anew, n times."""
    watch = FileWatch(plugin_dir, timeline).start()
    times = []
    try:
        for _ in range(n):
            t = timeline.now()
            node.restart_kubelet()
            created = timeline.wait_for(lambda e: e.kind == "file.created" and e.get("name") == "kubelet.sock",
                                        SOCKET_WAIT_S, "a new kubelet.sock", t)
            times.append((created.t_ns - t) / 1e9)
    finally:
        watch.stop()
    return times


def restarts(n: int) -> dict[str, list[float]]:
    profile = get_profile("fast")
    out = {}
    with Sandbox() as sandbox:
        timeline = Timeline()
        fake = FakeNode(sandbox.plugin_dir, sandbox.state_dir, timeline, profile)
        fake.start_kubelet()
        try:
            out["fake"] = restart_to_socket(fake, timeline, sandbox.plugin_dir, n)
        finally:
            fake.close()
    plane = LocalControlPlane().start()
    try:
        with Sandbox() as sandbox:
            timeline = Timeline()
            real = LocalNode(sandbox, timeline, profile, plane.kubeconfig, plane.client())
            try:
                real.start_kubelet()
                out["real"] = restart_to_socket(real, timeline, sandbox.plugin_dir, n)
            finally:
                real.close()
    finally:
        plane.stop()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--restarts", type=int, default=5)
    args = parser.parse_args()
    why = unavailable()
    if why:
        print(f"p6: needs a real kubelet: {why}")
        return 2
    with tempfile.TemporaryDirectory(prefix="fakelet-p6-") as tmp:
        table = check_set(Path(tmp) / "fidelity")
    fake_s, real_s = table.wall_s["fake"], table.wall_s["real"]
    print("P6 the DP-NODE checks on reference-dp, one at a time")
    print(f"  wall time: fake {fake_s:.1f}s, real {real_s:.1f}s, ratio real/fake {real_s / fake_s:.2f}")
    print(f"  {'check':11} {'reaction':32} {'fake':>8} {'real':>8}")
    for row in table.rows:
        for what in sorted(set(row.fake_measured) | set(row.real_measured)):
            f, r = row.fake_measured.get(what), row.real_measured.get(what)
            print(f"  {row.check:11} {what:32} {f if f is not None else '-':>8} {r if r is not None else '-':>8}")
    times = restarts(args.restarts)
    print(f"P6 restart_kubelet() to a new kubelet.sock, {args.restarts} restarts")
    for node, ts in times.items():
        print(f"  {node}: p50 {statistics.median(ts) * 1000:.1f} ms, max {max(ts) * 1000:.1f} ms")
    ratio = statistics.median(times["real"]) / max(statistics.median(times["fake"]), 1e-6)
    print(f"  ratio real/fake (p50): {ratio:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
