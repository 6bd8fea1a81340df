"""One exploration: search and shrink under a budget, replay each finding, and the report that says so.

hypothesis runs the state machine (machine.py) with a fixed seed, no example database and no
deadline of its own; the budget ends search and shrinking (an example that would start past it
is rejected, a step past it is not taken). Every distinct failure is kept (its key: the invariant
and the rule that led to it), each shrunk on its own (report_multiple_bugs, one exception type a
key). hypothesis stops generating a while after its last finding: further passes (seed + 1, ...),
in which the keys found already are no failures, search on until the budget is spent. Each
finding's shortest sequence is written as a scenario file and replayed on a fresh node, up to
three times: only a replay that reproduces it makes a failure (every failure is true); one that
never does is reported unconfirmed, with its evidence (findings.py). `--first` stops at the first.
"""

from __future__ import annotations

import dataclasses
import datetime
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from hypothesis import HealthCheck, Phase, Verbosity, settings
from hypothesis import seed as hypothesis_seed
from hypothesis.errors import HypothesisException
from hypothesis.stateful import run_state_machine_as_test

from harness.config.runconfig import RunConfig
from harness.controlplane import ControlPlane
from harness.explore import nodes, repro
from harness.explore.findings import MAX_REPLAYS, Kept, Replay, judge, unconfirmed_line
from harness.explore.machine import (
    LOG_BYTES,
    LOG_LINES,
    PROGRESS_EVERY_S,
    Finding,
    InvariantBroken,
    Session,
    machine_for,
)
from harness.explore.model import INVARIANTS
from harness.explore.rules import DEFAULT_MAX_STEPS, EVICTION, Context, Rule, applicable, context_of
from harness.instruments import logtail
from harness.scenarios import runner
from harness.scenarios.schema import load
from reports.model import ERROR, NOT_EXERCISED, PASS, CheckResult, SubjectReport

MAX_EXAMPLES = 100_000  # never the limit: the budget is
LEVEL = "MUST"  # an invariant is what upstream kubelet behaviour depends on


@dataclass(frozen=True)
class Options:
    budget_s: float
    seed: int
    max_steps: int = DEFAULT_MAX_STEPS
    rules: tuple[str, ...] | None = None  # None: every rule that applies to the subject
    verbose: bool = False  # a line per example: the rules it ran
    replay_on: str | None = None  # the other kubelet each finding is replayed on too (nodes.py), after the budget
    first: bool = False  # stop at the first finding (once shrunk), as explore did before it kept every one


@dataclass
class Result:
    report: SubjectReport
    findings: list[Kept] = field(default_factory=list)  # every finding, in the order found
    interrupted: bool = False
    lines: list[str] = field(default_factory=list)

    # The lead finding (the first confirmed, else the first), for readers of one finding: tools/explore_table.py.

    def lead(self) -> Kept | None:
        return next((k for k in self.findings if k.confirmed), self.findings[0] if self.findings else None)

    @property
    def finding(self) -> Finding | None:
        lead = self.lead()
        return lead.finding if lead else None

    @property
    def first_steps(self) -> int:
        lead = self.lead()
        return lead.first_steps if lead else 0

    @property
    def repro(self) -> Path | None:
        lead = self.lead()
        return lead.repro if lead else None

    @property
    def replayed(self) -> str:
        """The lead finding's replay outcome (schema.py OUTCOMES), "" when none ran."""
        lead = self.lead()
        return lead.outcome() if lead else ""

    def confirmed(self) -> list[Kept]:
        return [k for k in self.findings if k.confirmed]


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
                           kind=run.spec.kind, node=run.node, started_at=started.isoformat(timespec="seconds"))
    report.timings = run.profile.describe()
    result = Result(report)
    # One API server for every example (DRA, and the real kubelet's node joins it), as a scenario's.
    plane, why = runner._control_plane(run, run.node)
    plane_s = time.monotonic() - began  # bounded by the API server's own start bound, not by the budget
    ctx, rules = _without_eviction(ctx, rules, plane, say)
    rules = nodes.runnable(rules, run.node, say)
    # A step that started before the end may still wait out its bound after it (a mutant that never reacts).
    in_flight = min(run.profile.reaction_s, options.budget_s / 4)
    # The budget is for search, shrinking and the replay: it starts once the API server is up (a DRA driver's local
    # one takes seconds to start, 40 on a loaded machine, and is made once for every example).
    session = Session(run, ctx, rules, plane, why, time.monotonic() + options.budget_s - in_flight, say,
                      verbose=options.verbose, node=run.node)
    session.first_only, budget_end = options.first, time.monotonic() + options.budget_s
    say(f"explore {run.spec.name}{f' --defect {run.defect}' if run.defect else ''}"
        f"{' on the real kubelet' if run.node == nodes.REAL else ''}: seed {options.seed}, budget "
        f"{options.budget_s:g}s, up to {options.max_steps} steps per example, rules: "
        f"{', '.join(r.name for r in rules)}")
    try:
        with _ticking(session):
            try:
                _search(session, options)
            except KeyboardInterrupt:
                result.interrupted = True
                say("explore: interrupted; what was found so far follows")
            result.findings = [Kept(f, *session.first[key]) for key, f in session.found.items()]
            for kept in result.findings:
                kept.repro = repro.write(kept.finding, run, options.seed, kept.first_steps, out)
            if not result.interrupted:
                try:
                    _replay_all(run, result.findings, session, budget_end, out, say)
                except KeyboardInterrupt:
                    result.interrupted = True
    finally:
        if plane is not None:
            plane.stop()
    _fill(report, result, session, options, began, out, shown or out)
    report.facts["explore"]["control_plane_s"] = round(plane_s, 3)
    if options.replay_on and not result.interrupted:
        result.interrupted = nodes.replay_findings(run, options.replay_on, [
            (k.repro, k.finding.invariant) for k in result.findings if k.repro is not None], out, report, say)
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
    """hypothesis passes until the budget is spent: the next (seed + 1) starts when one ends before it, the keys
    found so far no failures in it. --first: one pass, ended once its finding is shrunk."""
    seed = options.seed
    while True:
        made = session.nodes
        session.begin_pass()
        try:
            _pass(session, options, seed)
        finally:
            session.end_pass()
        if session.over() or session.error or (options.first and session.found):
            return
        if session.nodes == made:
            return  # no example of the pass was new: the rules and steps allow no more, whatever the seed
        seed += 1
        session.say(f"explore: {len(session.found)} finding(s) so far, each shrunk; searching on (seed {seed})")


def _pass(session: Session, options: Options, seed: int) -> None:
    machine = hypothesis_seed(seed)(machine_for(session))
    # report_multiple_bugs: each key (an exception type) shrunk on its own, none slipping into another's smaller
    # example. With --first the other keys are no failures (Session.ignored): the same, and generation ends at once.
    config = settings(max_examples=MAX_EXAMPLES, stateful_step_count=options.max_steps, deadline=None, database=None,
                      derandomize=False, suppress_health_check=list(HealthCheck), verbosity=Verbosity.quiet,
                      phases=(Phase.generate, Phase.shrink), report_multiple_bugs=not options.first,
                      print_blob=False)
    try:
        run_state_machine_as_test(machine, settings=config)
    except InvariantBroken:
        pass  # hypothesis's last run of the shrunk example; the session kept it
    except (HypothesisException, ExceptionGroup) as err:
        # Several findings (a group), Unsatisfiable (every example past the budget rejected) or a flaky shrink:
        # what was found stands.
        if not session.found and session.examples == 0 and not session.error:
            session.error = f"no example ran: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"


@contextmanager
def _ticking(session: Session) -> Iterator[None]:
    """A progress line every PROGRESS_EVERY_S while the block runs, whatever it is doing (one example's step may
    take 40 s, a replay as long): a daemon thread waiting on an Event, stopped as the block ends."""
    stop = threading.Event()

    def tick() -> None:
        while not stop.wait(PROGRESS_EVERY_S):
            session.progress()

    ticker = threading.Thread(target=tick, name="fakelet-explore-progress", daemon=True)
    ticker.start()
    try:
        yield
    finally:
        stop.set()
        ticker.join(PROGRESS_EVERY_S)


def _replay_all(run: RunConfig, kept: list[Kept], session: Session, budget_end: float, out: Path,
                say: Callable[[str], None]) -> None:
    """Each finding replayed on a fresh node until one replay reproduces it, MAX_REPLAYS at most: the first replay of
    every finding (the search left time for it), then a second of each not reproduced, then a third, while the
    budget lasts (a replay is expected to take as long as that finding's longest one)."""
    for attempt in range(1, MAX_REPLAYS + 1):
        for k in kept:
            if k.confirmed or len(k.replays) != attempt - 1 or k.repro is None:
                continue
            longest = max((r.duration_s for r in k.replays), default=0.0)
            if attempt > 1 and time.monotonic() + longest > budget_end:
                k.unreplayed = "the budget was spent"
                continue
            k.replays.append(_replay(run, k.repro, session, say, out, attempt))


def _replay(run: RunConfig, path: Path, session: Session, say: Callable[[str], None], out: Path,
            attempt: int) -> Replay:
    """The repro file on a fresh node, as `fakelet scenario run --file` runs it; its timeline and the plugin's log
    kept (artifacts/<repro>-replay-<n>/ in the report, their last lines in the finding)."""
    scenario = load(path)
    say(f"replaying {path.name} on a fresh node ({attempt} of up to {MAX_REPLAYS})")
    session.doing = f"replaying {path.name} ({attempt} of up to {MAX_REPLAYS})"
    scratch = SubjectReport(subject=run.spec.name, profile=run.profile.name, seed=run.seed)
    kept = out / "artifacts" / f"{path.stem}-replay-{attempt}"
    began = time.monotonic()
    outcome = runner._one_run(run, scenario, lambda line: None, session.plane, session.plane_error, session.node, kept,
                              scratch, None)
    session.doing = ""
    say(f"replay: {outcome.outcome}: {outcome.detail.splitlines()[0] if outcome.detail else ''}")
    log = logtail.tail(kept / "subject.log", LOG_LINES, LOG_BYTES).splitlines()
    return Replay(outcome.outcome, outcome.detail, outcome.steps, log, round(time.monotonic() - began, 3),
                  str(kept.relative_to(out)) if kept.is_dir() else "")


def _fill(report: SubjectReport, result: Result, session: Session, options: Options, began: float,
          out: Path, shown: Path) -> None:
    report.duration_s = round(time.monotonic() - began, 3)
    report.interrupted = result.interrupted
    rate = session.steps / session.step_s if session.step_s else 0.0
    lead = result.lead()
    report.facts["explore"] = {
        "seed": options.seed, "budget_s": options.budget_s, "max_steps": options.max_steps, "first": options.first,
        "rules": [r.name for r in session.rules], "examples": session.examples, "steps": session.steps,
        "steps_per_s": round(rate, 3), "judging_s": round(session.judge_s, 1),
        "inconclusive_examples": session.inconclusive,
        "failing_examples": session.failing, "known_failures": session.again, "passes": session.passes,
        "findings": [k.fact(out) for k in result.findings],
        "confirmed": len(result.confirmed()),
        # The lead finding (the first confirmed, else the first) as the fields were before every finding was kept.
        **({"time_to_find_s": lead.found_at_s, "first_steps": lead.first_steps,
            "shrunk_steps": len(lead.finding.steps), "invariant": lead.finding.invariant,
            "repro": str(lead.repro.relative_to(out)) if lead.repro else "",
            "replay": lead.outcome() or "not replayed (interrupted)"} if lead else {}),
        **({"error": session.error} if session.error else {}),
    }
    report.fault_plan = [r.name for r in session.rules]

    def command(k: Kept) -> str:
        return repro.replay_command(session.run, shown / k.repro.relative_to(out)) if k.repro else ""

    report.findings += [unconfirmed_line(k, command(k)) for k in result.findings if not k.confirmed]
    for invariant in INVARIANTS.values():
        if session.ctx.kind not in invariant.kinds:
            continue
        title = f"{invariant.title} (bound: {invariant.bound})"
        check = CheckResult(id=invariant.id, level=LEVEL, title=title, verdict=PASS, duration_s=report.duration_s,
                            detail=f"held in every step of {session.examples} example(s)")
        mine = [k for k in result.findings if k.finding.invariant == invariant.id]
        if mine:
            judge(check, mine, session.examples, command)
        elif invariant.id not in session.judged:
            check.verdict, check.detail = NOT_EXERCISED, "no example reached a state this invariant judges"
        report.checks.append(check)
    if session.error:
        report.checks.append(CheckResult(id="EXP-HARNESS", level=LEVEL, title="fakelet could run the examples",
                                         verdict=ERROR, duration_s=report.duration_s, detail=session.error))
