"""`fakelet explore`: its flags, and the run from flags to the report directory.

The exploration itself is harness/explore; this only reads and checks the flags (every bad one is
one line and exit 2 before anything starts) and prints what was found, with its shrunk sequence as
a timeline. commands.py writes the reports as `fakelet run` does (staged beside `--out`, swapped in
whole).
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.explore.rules import DEFAULT_MAX_STEPS, RULES, applicable, context_of

if TYPE_CHECKING:  # hypothesis and the engine load when an exploration runs, not with every fakelet command
    from harness.config.runconfig import RunConfig
    from harness.explore.explorer import Options, Result

MAX_BUDGET_S = 24 * 3600.0  # a day: longer is a soak, run it again with another seed
MAX_STEPS = 50  # rules per example: past this a finding shrinks for longer than it searched
BUDGET = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(s|m|h)?\s*")
UNIT_S = {None: 1.0, "s": 1.0, "m": 60.0, "h": 3600.0}


def budget_s(text: str) -> float:
    """'90', '90s', '10m', '1.5h' in seconds; a ValueError (one line) otherwise."""
    match = BUDGET.fullmatch(text)
    if match is None:
        raise ValueError(f"--budget {text!r}: a duration like 90s, 10m or 1h")
    seconds = float(match.group(1)) * UNIT_S[match.group(2)]
    if not 0 < seconds <= MAX_BUDGET_S:
        raise ValueError(f"--budget {text!r}: must be more than 0 and at most {MAX_BUDGET_S / 3600:g}h")
    return seconds


def rule_names(values: list[str]) -> tuple[str, ...] | None:
    """--rules a,b --rules c: the names in order, or None (every rule that applies) when none was given."""
    names = [n.strip() for v in values for n in v.split(",") if n.strip()]
    return tuple(names) if names else None


def add_parser(sub: Any, subject_flags: Any, one_off_flags: Any, world_flags: Any) -> None:
    p = sub.add_parser("explore", help="search for orders of faults that break the subject (hypothesis stateful "
                                       "testing); each finding is shrunk into a scenario file")
    subject_flags(p, many=False)
    one_off_flags(p)
    world_flags(p)
    p.add_argument("--budget", default="10m", metavar="DURATION",
                   help="wall time for search, shrinking and the finding's replay: 90s, 10m, 1h (default 10m)")
    p.add_argument("--max-steps", type=int, default=DEFAULT_MAX_STEPS, metavar="K",
                   help=f"rules per example, at most (default {DEFAULT_MAX_STEPS}, at most {MAX_STEPS})")
    p.add_argument("--rules", action="append", default=[], metavar="NAME[,NAME]",
                   help=f"only these rules (repeatable); default every rule the subject observes: {', '.join(RULES)}")
    p.add_argument("--reaction-bound", type=float, metavar="SECONDS",
                   help="hold the plugin to this bound instead of the kubelet's 30 s (for mutants that never "
                        "react; the report and the repro's replay line say so)")
    p.add_argument("-v", "--verbose", action="store_true", help="one line per example: the rules it ran")
    p.add_argument("--out", default="fakelet-explore", help="report directory (default ./fakelet-explore)")


def options_of(args: argparse.Namespace) -> Options:
    """The exploration the flags ask for; a bad flag is one ValueError line (commands.py prints it)."""
    from harness.explore.explorer import Options
    from harness.instruments.userinput import check_number

    budget = budget_s(args.budget)
    check_number("--max-steps", args.max_steps, 1, MAX_STEPS, integer=True)
    return Options(budget, args.seed, args.max_steps, rule_names(args.rules), args.verbose)


def check_rules(run: RunConfig, options: Options) -> None:
    """A --rules name that is unknown or not for this subject, before anything starts."""
    applicable(context_of(run.spec), options.rules)


def run_explore(run: RunConfig, options: Options, stage: Path, out: Path) -> Result:
    """The exploration with its progress on stdout; its repro files in `stage`, named as they will be in `out`."""
    from harness.explore.explorer import explore

    return explore(run, options, stage, lambda line: print(line, flush=True), shown=out)


def print_result(result: Result, budget: float, stage: Path, out: Path) -> None:
    """What was explored and found, the shrunk sequence as a timeline (after the report's own lines)."""
    from harness.explore import repro

    report = result.report
    facts = report.facts.get("explore", {})
    print(f"\nexplored: {facts.get('examples', 0)} example(s), {facts.get('steps', 0)} steps, "
          f"{facts.get('steps_per_s', 0):g} steps/s, {report.duration_s:.0f}s of a {budget:g}s budget")
    if result.finding is not None:
        print(f"finding: {result.finding.invariant}, found after {facts.get('time_to_find_s', 0):.0f}s, shrunk from "
              f"{result.first_steps} to {len(result.finding.steps)} steps; replay: {facts.get('replay')}")
        print("\n".join(repro.timeline(result.finding)))
        if result.repro is not None:
            print(f"repro: {out / result.repro.relative_to(stage)}")
