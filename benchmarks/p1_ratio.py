"""P1: a full profile costs at most 1.1x its longest check (issue 27), for reference-dp and reference-dra.

Runs `fakelet run --subject S --profile fast` once per subject and --jobs value (default: auto, the default,
and 4, the old CI setting, side by side, alternating, so machine noise hits both alike), and prints for each
run: the command's wall time, the longest check's own duration (report.json) and their ratio, which is the
figure with a goal. Every verdict must still be a pass: a faster run that judged differently is no figure.

    python benchmarks/p1_ratio.py [--subject reference-dp --subject reference-dra] [--jobs auto --jobs 4]
                                  [--record]
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

import fakeletrun  # benchmarks/fakeletrun.py: a script's own directory is on its path

GOAL = 1.1  # full profile wall / its longest check's wall


def _term_to_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def timed_run(subject: str, jobs: str, extra: list[str], verbose: bool) -> dict:
    run = fakeletrun.timed_run(["--subject", subject, "--profile", "fast", "--jobs", jobs, *extra], verbose,
                               "fakelet-bench-p1r-")
    checks = run.report["checks"]
    longest = max(checks, key=lambda c: c["duration_s"])
    not_passed = sorted(c["id"] for c in checks if c["verdict"] not in ("pass", "not-exercised"))
    return {"subject": subject, "jobs": jobs, "wall_s": run.wall_s, "pytest_s": run.report["duration_s"],
            "longest": longest["id"], "longest_s": longest["duration_s"], "ratio": run.wall_s / longest["duration_s"],
            "sum_s": sum(c["duration_s"] for c in checks), "code": run.code, "not_passed": not_passed,
            "load": run.load}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--subject", action="append", default=[])
    parser.add_argument("--jobs", action="append", default=[])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--record", action="store_true", help="write the figures into benchmarks/figures.yaml")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    subjects = args.subject or ["reference-dp", "reference-dra"]
    jobs = args.jobs or ["auto", "4"]
    signal.signal(signal.SIGTERM, _term_to_interrupt)
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    cpus = len(os.sched_getaffinity(0))
    print(f"P1: full profile wall / longest check, goal <= {GOAL:g}; {cpus} usable CPU(s), "
          f"load average {os.getloadavg()[0]:.2f} at start")
    results = []
    try:
        for _ in range(args.rounds):
            for subject in subjects:
                for j in jobs:
                    r = timed_run(subject, j, [], args.verbose)
                    results.append(r)
                    print(f"  {subject:14} --jobs {j:4}: wall {r['wall_s']:6.1f}s (pytest {r['pytest_s']:.1f}s), "
                          f"longest {r['longest']} {r['longest_s']:.1f}s, ratio {r['ratio']:.2f} "
                          f"(goal {GOAL:g}: {'met' if r['ratio'] <= GOAL else 'not met'}); sum of checks "
                          f"{r['sum_s']:.0f}s; load {r['load']:.1f}; exit {r['code']}"
                          + (f"; NOT PASSED: {', '.join(r['not_passed'])}" if r["not_passed"] else ""))
    except KeyboardInterrupt:
        print("interrupted; runs stopped and temp dirs removed", file=sys.stderr)
        return 130
    print(f"load average {os.getloadavg()[0]:.2f} at the end (other work on the machine skews every figure)")
    if args.record:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from figures import record

        rows, met = [], True
        for subject in subjects:
            for j in jobs:
                for r in (r for r in results if r["subject"] == subject and r["jobs"] == j):
                    met = met and (j != jobs[0] or (r["ratio"] <= GOAL and not r["not_passed"]))
                    rows.append((f"{subject}, --jobs {j}: wall / longest check (load {r['load']:.1f})",
                                 f"{r['ratio']:.2f} ({r['wall_s']:.1f} s / {r['longest']} {r['longest_s']:.1f} s; "
                                 f"sum of checks {r['sum_s']:.0f} s)"))
        loads = [r["load"] for r in results]
        record("P1-ratio", "a full profile against its longest check", "benchmarks/p1_ratio.py",
               "python benchmarks/p1_ratio.py " + " ".join(f"--subject {s}" for s in subjects) + " "
               + " ".join(f"--jobs {j}" for j in jobs), f"wall at most {GOAL:g}x the longest check on 2 cores",
               met, f"{min(loads):.1f} to {max(loads):.1f}", rows,
               "Each ratio is one run's command wall over that run's own longest check (side by side, alternating). "
               "docs/performance.md says what stands in the way.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
