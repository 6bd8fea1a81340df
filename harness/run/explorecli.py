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

from harness.explore import nodes
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
    # Checked by options_of, not by argparse choices: a bad value is one line, as every other explore flag's.
    p.add_argument("--node", default=nodes.FAKE, metavar="fake|real",
                   help="whose kubelet every example runs on: fake (fakelet's own, default) or real (a real kubelet "
                        "through the relay, as `fakelet scenario run --node real`; root, containerd); rules the real "
                        "node cannot carry out are left out, with a line saying so")
    p.add_argument("--replay-on", metavar="real|fake",
                   help="replay each finding on the other kubelet too, after the budget: its outcome is reported "
                        "beside the first replay's (reproduced on the real kubelet: the plugin's bug, not the fake "
                        "kubelet's)")
    p.add_argument("--first", action="store_true",
                   help="stop at the first finding, once shrunk and replayed (default: search on until the budget "
                        "is spent, keeping every distinct finding)")
    p.add_argument("-v", "--verbose", action="store_true", help="one line per example: the rules it ran")
    p.add_argument("--out", default="fakelet-explore", help="report directory (default ./fakelet-explore)")


def options_of(args: argparse.Namespace) -> Options:
    """The exploration the flags ask for; a bad flag is one ValueError line (commands.py prints it)."""
    from harness.explore.explorer import Options
    from harness.instruments.userinput import check_number

    budget = budget_s(args.budget)
    check_number("--max-steps", args.max_steps, 1, MAX_STEPS, integer=True)
    nodes.check_flags(args.node, args.replay_on)
    return Options(budget, args.seed, args.max_steps, rule_names(args.rules), args.verbose, args.replay_on,
                   first=args.first)


def check_rules(run: RunConfig, options: Options) -> None:
    """A --rules name that is unknown or not for this subject or node, and a real kubelet this machine cannot run
    (built here if need be, out of the budget), before anything starts."""
    nodes.check_rules(applicable(context_of(run.spec), options.rules), run.node)
    nodes.check_machine(run, options.replay_on)


def run_explore(run: RunConfig, options: Options, stage: Path, out: Path) -> Result:
    """The exploration with its progress on stdout; its repro files in `stage`, named as they will be in `out`."""
    from harness.explore.explorer import explore

    return explore(run, options, stage, lambda line: print(line, flush=True), shown=out)


def print_result(result: Result, budget: float, stage: Path, out: Path) -> None:
    """What was explored and found: each finding with its replays, its shrunk sequence as a timeline, and its repro
    file (after the report's own lines)."""
    from harness.explore import repro
    from harness.explore.findings import key_text

    report = result.report
    facts = report.facts.get("explore", {})
    print(f"\nexplored: {facts.get('examples', 0)} example(s), {facts.get('steps', 0)} steps, "
          f"{facts.get('steps_per_s', 0):g} steps/s, {facts.get('passes', 1)} hypothesis pass(es), "
          f"{report.duration_s:.0f}s of a {budget:g}s budget")
    for n, kept in enumerate(result.findings, 1):
        state = "confirmed" if kept.confirmed else "UNCONFIRMED: no verdict, its evidence is in the report"
        print(f"\nfinding {n} of {len(result.findings)} ({state}): {key_text(kept.key)}, found after "
              f"{kept.found_at_s:.0f}s, shrunk from {kept.first_steps} to {len(kept.finding.steps)} steps; "
              f"{kept.replay_said()}")
        print("\n".join(repro.timeline(kept.finding)))
        if kept.repro is not None:
            print(f"repro: {out / kept.repro.relative_to(stage)}")
    if result.findings:
        for node in nodes.NODES:
            for name, note in facts.get(f"replay_on_{node}", {}).items():
                print(f"replay of {name}: {note}")
    if result.findings and not result.confirmed():
        print("\nno confirmed finding: what did not replay is reported unconfirmed, with its evidence")
