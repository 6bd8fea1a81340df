"""The hypothesis state machine: one live node per example, every rule a scenario step, every step judged.

Each example boots one sandbox, fake kubelet, fake hardware and subject (`boot`, an initialize
rule, so that hypothesis's teardown always closes what it made), and keeps them across its steps:
a step never makes a node of its own. After each rule the model's invariants become `expect`
steps (model.py), carried out by the scenario engine's Stage exactly as a scenario file's are,
so the log of an example is a scenario file as it stands (repro.py).

What the exploration learns lives in `Session`, shared by every example of a run: the best
(shortest) failing sequence, counts, and the deadline that ends search and shrinking.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import reject
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, rule

from harness.config.runconfig import RunConfig
from harness.controlplane import ControlPlane
from harness.explore.model import DP, DRA, HELD, Device, Model, expectations, merged, split
from harness.explore.rules import THERMAL_MARGIN_C, Context, Rule
from harness.instruments.timeline import WaitTimeout
from harness.scenarios.conditions import Conditions
from harness.scenarios.outcomes import Inconclusive, Symptom
from harness.scenarios.runner import _environment
from harness.scenarios.stage import Stage
from harness.scenarios.step import Step, flow
from harness.world.env import DPEnv, SubjectUnavailable

# What ends a step without a verdict on the subject: the engine's own (runner.py _one_run treats them so).
NO_VERDICT = (Inconclusive, SubjectUnavailable, WaitTimeout, pytest.skip.Exception)


class InvariantBroken(AssertionError):
    """An invariant failed: the example is a finding, and hypothesis shrinks it."""


@dataclass
class Finding:
    invariant: str  # EXP-... (model.py INVARIANTS)
    detail: str  # what the failed expect saw
    steps: list[dict[str, Any]]  # the whole sequence, boot included, as scenario steps
    rules: list[str]  # the rule each step came from ("boot", "invariants" for expects)
    lines: list[str]  # the stage's narration: the timeline of the failing example
    duration_s: float
    found_at_s: float  # since the exploration began


@dataclass
class Session:
    """What every example of one exploration shares."""

    run: RunConfig
    ctx: Context
    rules: list[Rule]
    plane: ControlPlane | None
    plane_error: str
    end: float  # monotonic: search and shrinking stop here
    say: Callable[[str], None]
    began: float = field(default_factory=time.monotonic)
    examples: int = 0
    steps: int = 0  # steps carried out, expects included
    step_s: float = 0.0  # time spent in them
    inconclusive: int = 0
    error: str = ""  # fakelet could not make a node: the run is a harness error
    judged: set[str] = field(default_factory=set)  # invariants some expect held the subject to
    findings: int = 0  # failing examples seen (the first and its shrinks)
    best: Finding | None = None
    first_steps: int = 0  # the first failing sequence's length, before hypothesis shrank it
    first_at: float | None = None  # seconds from the start to the first failing example's failure
    last_progress: float = 0.0
    verbose: bool = False  # one line per example: the rules it ran
    devices: list[Device] | None = None  # the fake hardware as every example starts (learned by the first)
    prefixes: set[tuple[str, ...]] = field(default_factory=set)  # of step sequences that ran and held throughout
    repeats: int = 0  # examples that repeated an earlier one's steps, not run again

    def known(self, log: list[dict[str, Any]]) -> bool:
        return _key(log) in self.prefixes

    def passed(self, log: list[dict[str, Any]]) -> None:
        key = _key(log)
        self.prefixes.update(key[:n] for n in range(1, len(key) + 1))

    def over(self) -> bool:
        return time.monotonic() >= self.end

    def record(self, finding: Finding) -> None:
        self.findings += 1
        if self.best is None:
            self.first_steps, self.first_at = len(finding.steps), finding.found_at_s
            # Keep time for one replay of what shrinking leaves (no longer than this): the budget bounds it all.
            self.end -= REPLAY_RESERVE * finding.duration_s
            self.say(f"finding after {finding.found_at_s:.0f}s: {finding.invariant} in {len(finding.steps)} steps; "
                     "shrinking")
        if self.best is None or _shorter(finding, self.best):
            self.best = finding
        if sum(1 for o in self.best.rules if o not in JUDGING) <= 1:
            self.end = time.monotonic()  # one step of one rule: nothing left to shrink, no reason to go on

    def progress(self) -> None:
        now = time.monotonic()
        if now - self.last_progress < PROGRESS_EVERY_S:
            return
        self.last_progress = now
        rate = self.steps / self.step_s if self.step_s else 0.0
        best = f"; best finding {self.best.invariant} in {len(self.best.steps)} steps" if self.best else ""
        self.say(f"explore: {now - self.began:.0f}s, {self.examples} example(s), {self.steps} steps "
                 f"({rate:.2f} steps/s), {self.inconclusive} inconclusive, {self.repeats} repeat(s) skipped{best}")


PROGRESS_EVERY_S = 10.0
# The replay of a finding makes a fresh node and runs the shrunk sequence: no longer than the first failing
# example, and a node's start-up on a loaded machine again; kept out of the budget for search and shrinking.
REPLAY_RESERVE = 2.0
JUDGING = ("boot", "invariants", "held")  # a finding's steps that are no rule's


def _key(log: list[dict[str, Any]]) -> tuple[str, ...]:
    return tuple(flow(step) for step in log)


def _shorter(a: Finding, b: Finding) -> bool:
    return (len(a.steps), a.duration_s) < (len(b.steps), b.duration_s)


class ExplorerMachine(RuleBasedStateMachine):
    session: Session  # set on the subclass `machine_for` makes

    def __init__(self) -> None:
        super().__init__()
        self.env: DPEnv | None = None
        self.stage: Stage | None = None
        self.model = Model(self.session.ctx.kind, [], health="health" in self.session.ctx.observes)
        self.log: list[dict[str, Any]] = []
        self.origin: list[str] = []
        self.ran: list[str] = []  # the rules this example ran, in order
        self.groups: dict[int, list[tuple[str, dict[str, Any]]]] = {}  # an expect's index in the log: its invariants
        self.busy = True  # in a step: an example that ends while busy ended on an exception, and is not judged
        self.began = time.monotonic()

    # -- the node ----------------------------------------------------------------------------------------

    @initialize()
    def boot(self) -> None:
        s = self.session
        if s.over():
            reject()  # the budget is spent: hypothesis runs no more examples worth the name
        s.examples += 1
        if s.devices is None:
            self._go_live()  # the first example: the fake hardware says what the model starts from
        self.model.devices = [dataclasses.replace(d) for d in s.devices or []]
        self._steps("boot", [{"kubelet": "start"}, {"plugin": "start"}])
        self.model.kubelet_up = self.model.plugin_up = True
        # Held, not glimpsed: every later glimpse starts from a state that lasted (a plugin whose devices show for
        # a moment and are gone, as when it ends its stream, fails here, and its replay fails the same way).
        self._judge(held=True)
        self.busy = False

    def _go_live(self) -> None:
        """Make this example's node and carry out the steps held back so far (see `_one`)."""
        s = self.session
        try:
            self.env = _environment(s.run, s.plane, s.plane_error, "fake", None)
        except NO_VERDICT as err:
            # fakelet's failure, never the subject's: no example can run, so the exploration ends here.
            s.error, s.end = f"the node could not be made: {str(err).splitlines()[0]}", time.monotonic()
            reject()
        self.stage = Stage(self.env, lambda line: None)
        if s.devices is None:
            s.devices = _devices(self.env, s.ctx)
        for n in range(len(self.log)):
            self._carry_out(n)

    def teardown(self) -> None:
        """Quiescence: the model's invariants once more, each state held for a node-status period (the steps'
        own were first glimpses), then the node closed whatever happened."""
        try:
            if self.stage is None:
                if self.log:
                    self.session.repeats += 1  # every step of it already ran, and held, in an earlier example
                return
            if not self.busy and not self.session.over():
                self.session.passed(self.log)
                self._judge(held=True)
        finally:
            try:
                if self.stage is not None:
                    self.stage.close()
            finally:
                if self.env is not None:
                    self.env.close()
                if self.session.verbose and self.env is not None:
                    self.session.say(f"example {self.session.examples}: {' '.join(self.ran) or '(boot only)'} "
                                     f"({time.monotonic() - self.began:.1f}s)")
                self.session.progress()

    # -- steps -------------------------------------------------------------------------------------------

    def apply(self, r: Rule, data: st.DataObject) -> None:
        if self.session.over():
            return  # no step past the budget: the example ends as it stands
        self.busy = True
        self.ran.append(r.name)
        steps = r.act(self.model, self.session.ctx, lambda options: data.draw(st.sampled_from(list(options))))
        self._steps(r.name, steps)
        self._judge()
        self.busy = False

    def _steps(self, origin: str, steps: Sequence[dict[str, Any]]) -> None:
        for mapping in steps:
            self._one(origin, mapping)

    def _one(self, origin: str, mapping: dict[str, Any]) -> None:
        """One step, logged; carried out once the example leaves what earlier examples already ran.

        hypothesis generates the same realized sequence again and again (different choices, same steps: its
        simplest example above all), and on a live node each costs seconds. A step sequence that is a prefix of
        one an earlier example ran, every invariant holding, is held back instead; the node is made only when
        the sequence becomes new (then the held steps run first, in order), and never for a repeat."""
        self.log.append(mapping)
        self.origin.append(origin)
        if self.stage is None:
            if self.session.known(self.log):
                return
            self._go_live()
            return
        self._carry_out(len(self.log) - 1)

    def _carry_out(self, n: int) -> None:
        assert self.stage is not None
        mapping = self.log[n]
        (action, arg), *rest = mapping.items()
        step = Step(action, arg, dict(rest), f"explore: steps[{n}]", n)
        began = time.monotonic()
        try:
            self.stage.run(step)
        except Symptom as err:
            if action != "expect":
                self.session.inconclusive += 1
                reject()  # an action's own expectation (a rolling update's): not one of the model's invariants
            # A held-back step may fail as it is carried out late: the finding is the sequence up to it.
            del self.log[n + 1:], self.origin[n + 1:]
            self._found(self.groups[n], str(err))
        except NO_VERDICT as err:
            self.session.inconclusive += 1
            self.stage.tell(f"INCONCLUSIVE: {str(err).splitlines()[0] if str(err) else type(err).__name__}")
            reject()  # no verdict on the subject: this example says nothing
        finally:
            self.session.steps += 1
            self.session.step_s += time.monotonic() - began

    def _judge(self, held: bool = False) -> None:
        """Every invariant the model holds now, as `expect` steps (as few as their condition keys allow).

        After a step the first moment the node shows the model's state counts (`glimpse: true`): a state never
        reached within the bound is a finding however it is judged, and the steps stay fast. At quiescence
        (`held`) each state must also hold for a node-status period, as every scenario's expect does."""
        # A fault the kubelet takes a while to get over on its own (a dropped health stream: its retry) widens the
        # bound by that while: a correct node shows the state only then.
        within = {"within": f"{self.session.run.profile.reaction_s + self.model.grace_s:g}s"} \
            if self.model.grace_s else {}
        self.model.grace_s = 0.0
        expected = expectations(self.model)
        for kept in (False, True):
            # An invariant that says what must not appear (HELD) holds at the first moment, before the subject has
            # reacted at all: it is held for a node-status period after every step, or it would judge nothing.
            items = [e for e in expected if (e[0] in HELD) == kept]
            glimpse = {} if held or kept else {"glimpse": True}
            for group in split(items):
                self.session.judged.update(invariant for invariant, _conds in group)
                self.groups[len(self.log)] = group
                self._one("invariants" if not held else "held", {"expect": merged(group), **glimpse, **within})

    def _found(self, group: list[tuple[str, dict[str, Any]]], detail: str) -> None:
        assert self.stage is not None
        s = self.session
        which = group[0][0]
        conditions = Conditions(self.stage)
        for invariant, conds in group:  # the one that does not hold now names the finding
            try:
                ok, _seen = conditions.holds(conds)
            except NO_VERDICT:
                continue
            if not ok:
                which = invariant
                break
        self.stage.tell(f"FINDING {which}: {detail.splitlines()[0]}")
        now = time.monotonic()
        s.record(Finding(which, detail, list(self.log), list(self.origin), list(self.stage.lines),
                         round(now - self.began, 3), round(now - s.began, 3)))
        raise InvariantBroken(f"{which}: {detail}")


def _devices(env: DPEnv, ctx: Context) -> list[Device]:
    """The model's devices as the fake hardware starts (an inventory may start with one failed or hot)."""
    if env.devices is None:
        return [Device() for _ in range(env.expected_count or 0)]
    threshold = ctx.thermal[0]
    # Warm: over what device-cool cools to (rules.py), so maybe past the driver's warning temperature (its own).
    cool = threshold - ctx.thermal[1] - THERMAL_MARGIN_C
    return [Device(present=d.present, failed=d.health != "Healthy", hot=d.temperature_c >= threshold,
                   warm=ctx.kind == DRA and cool < d.temperature_c < threshold)
            for d in env.devices.devices()]


def machine_for(session: Session) -> type[ExplorerMachine]:
    """The state machine class of one exploration.

    One hypothesis rule, `step`, draws which explorer rule runs from those the model enables. With one rule per
    explorer rule, hypothesis's swarm testing switches rules off per example and its filter retries preconditions:
    on examples that cost seconds each, that ran the same realized sequence again and again. A drawn index also
    shrinks well: towards fewer steps, and towards the rules listed first (rules.py RULES, simplest first)."""

    def step(self: ExplorerMachine, data: st.DataObject) -> None:
        enabled = [r for r in self.session.rules if r.enabled(self.model) for _ in range(r.weight())]
        if enabled:
            self.apply(data.draw(st.sampled_from(enabled), label="rule"), data)

    return type("FakeletExplore", (ExplorerMachine,), {"session": session, "step": rule(data=st.data())(step)})


def describe(mapping: dict[str, Any]) -> str:
    return flow(mapping)


__all__ = ["DP", "ExplorerMachine", "Finding", "InvariantBroken", "Session", "machine_for"]
