"""P1: wall time of a full device-plugin check run against the reference plugin.

Runs `fakelet run --subject reference-dp --profile fast --out <tmpdir>` N
times, each in a fresh temp directory, and prints min/median/max wall seconds,
the slowest checks (their durations from report.json) and whether the median
meets the target (15 s on 2 cores). It prints figures; it is not a test.

    python benchmarks/p1_full_run.py [--runs 3] [--target-s 15] [--top 5]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

TARGET_S = 15.0  # P1 target: a full fast-profile run on 2 cores
ABORT_GRACE_S = 15.0  # on interrupt: how long the run gets to tear its checks down before SIGKILL


@dataclass
class RunResult:
    wall_s: float
    exit_code: int
    report_s: float
    summary: dict[str, object]
    checks: dict[str, tuple[float, str]]  # id -> (duration_s, verdict)


def _term_to_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Tear a run down: SIGINT its whole session (the CLI and its pytest), then SIGKILL if it lingers."""
    if proc.poll() is not None:
        return
    for sig, grace in ((signal.SIGINT, ABORT_GRACE_S), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue


def one_run(subject: str, profile: str, verbose: bool) -> RunResult:
    out = Path(tempfile.mkdtemp(prefix="fakelet-bench-p1-"))
    try:
        argv = [sys.executable, "-m", "harness.run.cli", "run", "--subject", subject, "--profile", profile,
                "--out", str(out)]
        t0 = time.perf_counter()
        # Its own session, so that an abort reaches the CLI and the pytest run it started, and nothing else.
        proc = subprocess.Popen(argv, stdout=None if verbose else subprocess.DEVNULL, start_new_session=True)
        try:
            code = proc.wait()
        finally:
            _stop(proc)
        wall = time.perf_counter() - t0
        report_path = out / "report.json"
        if code not in (0, 1) or not report_path.exists():
            raise RuntimeError(f"fakelet run exited {code} without a report; rerun with --verbose")
        report = json.loads(report_path.read_text())
        checks = {c["id"]: (float(c["duration_s"]), c["verdict"]) for c in report["checks"]}
        return RunResult(wall, code, float(report["duration_s"]), report["summary"], checks)
    finally:
        shutil.rmtree(out, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="full runs to time (default 3)")
    parser.add_argument("--subject", default="reference-dp")
    parser.add_argument("--profile", default="fast")
    parser.add_argument("--target-s", type=float, default=TARGET_S, help=f"median wall target (default {TARGET_S:g})")
    parser.add_argument("--top", type=int, default=5, help="how many of the slowest checks to show (default 5)")
    parser.add_argument("-v", "--verbose", action="store_true", help="show the runs' own output")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be >= 1")
    signal.signal(signal.SIGTERM, _term_to_interrupt)
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

    cpus = len(os.sched_getaffinity(0))
    print(f"P1 full run: fakelet run --subject {args.subject} --profile {args.profile}, "
          f"{args.runs} run(s), {cpus} usable CPU(s), load average {os.getloadavg()[0]:.2f} at start")
    results: list[RunResult] = []
    try:
        for i in range(args.runs):
            r = one_run(args.subject, args.profile, args.verbose)
            s = r.summary
            top = max(r.checks, key=lambda c: r.checks[c][0], default="-")
            print(f"  run {i + 1}: {r.wall_s:6.2f}s wall ({r.report_s:.2f}s in pytest), exit {r.exit_code}, "
                  f"{s['pass']} pass / {s['fail']} fail / {s['skip']} skip / {s['error']} error; "
                  f"slowest {top} {r.checks.get(top, (0.0, ''))[0]:.2f}s")
            failed = [c for c, (_, v) in sorted(r.checks.items()) if v in ("fail", "error")]
            if failed:
                print(f"         not passed: {', '.join(failed)}")
            results.append(r)
    except KeyboardInterrupt:
        print("interrupted; runs stopped and temp dirs removed", file=sys.stderr)
        return 130

    walls = [r.wall_s for r in results]
    median = statistics.median(walls)
    print(f"\nwall seconds: min {min(walls):.2f}  median {median:.2f}  max {max(walls):.2f}")
    startup = statistics.median(r.wall_s - r.report_s for r in results)
    summed = statistics.median(sum(d for d, _ in r.checks.values()) for r in results)
    print(f"median sum of check durations {summed:.2f}s; outside pytest's own clock (CLI + interpreter "
          f"start-up, collection) {startup:.2f}s")

    ids = sorted({i for r in results for i in r.checks})
    per_check = {i: [r.checks[i][0] for r in results if i in r.checks] for i in ids}
    verdicts = {i: sorted({r.checks[i][1] for r in results if i in r.checks}) for i in ids}
    slowest = sorted(ids, key=lambda i: statistics.median(per_check[i]), reverse=True)[: args.top]
    print(f"\n{len(slowest)} slowest checks (median over runs, min-max, verdicts):")
    for i in slowest:
        d = per_check[i]
        print(f"  {i:10} {statistics.median(d):6.2f}s  ({min(d):.2f}-{max(d):.2f})  {'/'.join(verdicts[i])}")

    print(f"load average {os.getloadavg()[0]:.2f} at the end (other work on the machine skews every figure)")
    meets = median <= args.target_s
    print(f"\ntarget: median wall <= {args.target_s:g}s on 2 cores (this machine: {cpus})")
    print(f"median {median:.2f}s = {median / args.target_s:.2f} x target; meets target: {'yes' if meets else 'no'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
