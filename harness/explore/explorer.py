"""One exploration: search and shrink under a budget, replay the finding, and the report that says so.

hypothesis runs the state machine (machine.py) with a fixed seed, no example database and no
deadline of its own; the budget ends search and shrinking (an example that would start past it
is rejected, a step past it is not taken). The shortest failing sequence seen is written as a
scenario file and replayed once on a fresh node: only a replay that reproduces it is reported as
a failure (every finding is true); one that does not is reported, unjudged, as what it is.
"""

from __future__ import annotations

import dataclasses
import datetime
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from hypothesis import HealthCheck, Phase, Verbosity, settings
from hypothesis import seed as hypothesis_seed
from hypothesis.errors import HypothesisException
from hypothesis.stateful import run_state_machine_as_test

from harness.config.runconfig import RunConfig
from harness.controlplane import ControlPlane
from harness.explore import repro
from harness.explore.machine import Finding, InvariantBroken, Session, machine_for
from harness.explore.model import INVARIANTS
from harness.explore.rules import DEFAULT_MAX_STEPS, EVICTION, Context, Rule, applicable, context_of
from harness.scenarios import runner
from harness.scenarios.schema import REPRODUCED, load
from reports.model import ERROR, FAIL, NOT_EXERCISED, PASS, SKIP, CheckResult, SubjectReport

MAX_EXAMPLES = 100_000  # never the limit: the budget is
LEVEL = "MUST"  # an invariant is what upstream kubelet behaviour depends on


@dataclass(frozen=True)
class Options:
    budget_s: float
    seed: int
    max_steps: int = DEFAULT_MAX_STEPS
    rules: tuple[str, ...] | None = None  # None: every rule that applies to the subject
    verbose: bool = False  # a line per example: the rules it ran


@dataclass
class Result:
    report: SubjectReport
    finding: Finding | None = None
    first_steps: int = 0  # the length of the first failing sequence, before shrinking
    repro: Path | None = None
    replayed: str = ""  # the replay's outcome (schema.py OUTCOMES), "" when there was none
    interrupted: bool = False
    lines: list[str] = field(default_factory=list)


def explore(run: RunConfig, options: Options, out: Path, say: Callable[[str], None],
            shown: Path | None = None) -> Result:
    """Explore `run`'s subject for `options.budget_s` of wall time; repro files go to `out`, which the report
    calls `shown` (the report directory a staging directory becomes)."""
    ctx = context_of(run.spec)
    rules = applicable(ctx, options.rules)
    if not rules:
        raise ValueError(f"no rule applies to {run.spec.name} (a {ctx.kind} observing "
                         f"{', '.join(sorted(ctx.observes)) or 'nothing'})")
    if not run.kubelet_version.health_versions:  # this kubelet never opens NodeWatchResources: no health to judge
        ctx = dataclasses.replace(ctx, observes=ctx.observes - {"health"})
        rules = [r for r in rules if r.applies(ctx)]
    began = time.monotonic()
    started = datetime.datetime.now(datetime.UTC)
    report = SubjectReport(subject=run.spec.name, profile=run.profile.name, seed=options.seed, defect=run.defect,
                           kind=run.spec.kind, started_at=started.isoformat(timespec="seconds"))
    report.timings = run.profile.describe()
    result = Result(report)
    plane, why = runner._control_plane(run, "fake")  # one API server for every example (DRA), as a scenario's
    ctx, rules = _without_eviction(ctx, rules, plane, say)
    # A step that started before the end may still wait out its bound after it (a mutant that never reacts).
    in_flight = min(run.profile.reaction_s, options.budget_s / 4)
    # The budget is for search, shrinking and the replay: it starts once the API server is up (a DRA driver's local
    # one takes seconds to start, 40 on a loaded machine, and is made once for every example).
    session = Session(run, ctx, rules, plane, why, time.monotonic() + options.budget_s - in_flight, say,
                      verbose=options.verbose)
    say(f"explore {run.spec.name}{f' --defect {run.defect}' if run.defect else ''}: seed {options.seed}, budget "
        f"{options.budget_s:g}s, up to {options.max_steps} steps per example, rules: "
        f"{', '.join(r.name for r in rules)}")
    try:
        try:
            _search(session, options)
        except KeyboardInterrupt:
            result.interrupted = True
            say("explore: interrupted; what was found so far follows")
        result.finding = session.best
        if session.best is not None:
            result.first_steps = session.first_steps
            result.repro = repro.write(session.best, run, options.seed, session.first_steps, out)
            if not result.interrupted:
                try:
                    result.replayed = _replay(run, result.repro, session, say)
                except KeyboardInterrupt:
                    result.interrupted = True
    finally:
        if plane is not None:
            plane.stop()
    _fill(report, result, session, options, began, out, shown or out)
    return result


def _without_eviction(ctx: Context, rules: list[Rule], plane: ControlPlane | None,
                      say: Callable[[str], None]) -> tuple[Context, list[Rule]]:
    """No eviction rule where no kube-controller-manager evicts (DRA-TNT-02 skips there too)."""
    why = "no API server" if plane is None else plane.controllers_error
    if EVICTION not in ctx.observes or not why:
        return ctx, rules
    ctx = dataclasses.replace(ctx, observes=ctx.observes - {EVICTION})
    left = [r for r in rules if r.applies(ctx)]
    if len(left) < len(rules):
        say(f"explore: not run: {', '.join(r.name for r in rules if r not in left)} (no device-taint eviction "
            f"controller: {why})")
    return ctx, left


def _search(session: Session, options: Options) -> None:
    machine = hypothesis_seed(options.seed)(machine_for(session))
    config = settings(max_examples=MAX_EXAMPLES, stateful_step_count=options.max_steps, deadline=None, database=None,
                      derandomize=False, suppress_health_check=list(HealthCheck), verbosity=Verbosity.quiet,
                      phases=(Phase.generate, Phase.shrink), report_multiple_bugs=False, print_blob=False)
    try:
        run_state_machine_as_test(machine, settings=config)
    except InvariantBroken:
        pass  # hypothesis's last run of the shrunk example; the session kept it
    except (HypothesisException, ExceptionGroup) as err:
        # Unsatisfiable (every example past the budget rejected) or a flaky shrink: what was found stands.
        if session.best is None and session.examples == 0 and not session.error:
            session.error = f"no example ran: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"


def _replay(run: RunConfig, path: Path, session: Session, say: Callable[[str], None]) -> str:
    """The repro file on a fresh node, as `fakelet scenario run --file` runs it."""
    scenario = load(path)
    say(f"replaying {path.name} on a fresh node")
    scratch = SubjectReport(subject=run.spec.name, profile=run.profile.name, seed=run.seed)
    outcome = runner._one_run(run, scenario, lambda line: None, session.plane, session.plane_error, "fake", None,
                              scratch, None)
    say(f"replay: {outcome.outcome}: {outcome.detail.splitlines()[0] if outcome.detail else ''}")
    return outcome.outcome


def _fill(report: SubjectReport, result: Result, session: Session, options: Options, began: float,
          out: Path, shown: Path) -> None:
    report.duration_s = round(time.monotonic() - began, 3)
    report.interrupted = result.interrupted
    finding = result.finding
    rate = session.steps / session.step_s if session.step_s else 0.0
    report.facts["explore"] = {
        "seed": options.seed, "budget_s": options.budget_s, "max_steps": options.max_steps,
        "rules": [r.name for r in session.rules], "examples": session.examples, "steps": session.steps,
        "steps_per_s": round(rate, 3), "inconclusive_examples": session.inconclusive,
        "failing_examples": session.findings,
        **({"time_to_find_s": session.first_at,
            "first_steps": result.first_steps, "shrunk_steps": len(finding.steps), "invariant": finding.invariant,
            "repro": str(result.repro.relative_to(out)) if result.repro else "", "replay": result.replayed or
            "not replayed (interrupted)"} if finding else {}),
        **({"error": session.error} if session.error else {}),
    }
    report.fault_plan = [r.name for r in session.rules]
    for invariant in INVARIANTS.values():
        if session.ctx.kind not in invariant.kinds:
            continue
        title = f"{invariant.title} (bound: {invariant.bound})"
        check = CheckResult(id=invariant.id, level=LEVEL, title=title, verdict=PASS, duration_s=report.duration_s,
                            detail=f"held in every step of {session.examples} example(s)")
        if finding is not None and finding.invariant == invariant.id:
            command = repro.replay_command(session.run, shown / result.repro.relative_to(out)) if result.repro else ""
            lines = ["shrunk sequence:", *repro.timeline(finding), "timeline of the failing example:", *finding.lines]
            if result.replayed == REPRODUCED:
                check.verdict, check.detail = FAIL, finding.detail
            else:
                # Not replayed (interrupted) or not reproduced: no verdict on the subject, and the reason.
                check.verdict = SKIP
                check.detail = (f"a finding that did not replay ({result.replayed or 'interrupted first'}) is not "
                                f"a verdict: {finding.detail}")
            check.repro, check.notes = command, lines
        elif invariant.id not in session.judged:
            check.verdict, check.detail = NOT_EXERCISED, "no example reached a state this invariant judges"
        report.checks.append(check)
    if session.error:
        report.checks.append(CheckResult(id="EXP-HARNESS", level=LEVEL, title="fakelet could run the examples",
                                         verdict=ERROR, duration_s=report.duration_s, detail=session.error))
