"""The table in docs/explore.md: `fakelet explore` against each mutant (and benign behaviour) of a subject.

    python tools/explore_table.py [--subject reference-dp] [--budget 90] [--seed 1] [--out table.md] [DEFECT ...]

Each row is one exploration with every rule the subject observes: mutants under the kill matrix's shortened
reaction bound (--mutant-bound, default 5 s; a mutant that never reacts is caught after it), benign behaviours
and the reference under the kubelet's own bounds. Rows are appended to --out as they finish.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from harness.config.runconfig import RunConfig
from harness.explore.explorer import Options, explore
from harness.reference.defects import DP_BENIGN, DP_DEFECTS
from harness.reference.dra_defects import DRA_DEFECTS

HEADER = ("| subject | defect | expected | found | invariant | time to find | steps first → shrunk | replay | "
          "examples | steps/s | wall |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n")


def row(subject: str, defect: str | None, budget: float, seed: int, bound: float | None) -> str:
    benign = defect is None or defect in DP_BENIGN
    run = RunConfig.build(subject=subject, defect=defect, profile="fast", seed=seed,
                          reaction_bound=None if benign else bound)
    with tempfile.TemporaryDirectory(prefix="fakelet-explore-table-") as out:
        began = time.monotonic()
        result = explore(run, Options(budget, seed), Path(out), lambda line: print(f"  {line}", flush=True))
        wall = time.monotonic() - began
    facts = result.report.facts.get("explore", {})
    f = result.finding
    found_s = f"{facts.get('time_to_find_s', 0):.0f} s" if f else ""
    return (f"| {subject} | {defect or '(reference)'} | {'no finding' if benign else 'finding'} | "
            f"{'yes' if f else 'no'} | {f.invariant if f else ''} | "
            f"{found_s} | "
            f"{f'{result.first_steps} → {len(f.steps)}' if f else ''} | {result.replayed if f else ''} | "
            f"{facts.get('examples', 0)} | {facts.get('steps_per_s', 0):.2f} | {wall:.0f} s |\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--subject", default="reference-dp")
    p.add_argument("--budget", type=float, default=90.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--mutant-bound", type=float, default=5.0)
    p.add_argument("--out", type=Path, default=Path("explore-table.md"))
    p.add_argument("defects", nargs="*", help="default: every defect and benign behaviour, then `reference`")
    args = p.parse_args(argv)
    known = {**DP_DEFECTS, **DP_BENIGN} if args.subject != "reference-dra" else DRA_DEFECTS
    # "reference" names the subject itself, without a defect.
    defects: list[str | None] = [None if d == "reference" else d for d in args.defects] or [*known, None]
    if not args.out.exists():
        args.out.write_text(HEADER)
    for defect in defects:
        print(f"{args.subject} {defect or '(reference)'}", flush=True)
        line = row(args.subject, defect, args.budget, args.seed, args.mutant_bound)
        print(line, end="", flush=True)
        with args.out.open("a") as table:
            table.write(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
