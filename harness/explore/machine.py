"""The hypothesis state machine: one live node per example, every rule a scenario step, every step judged.

Each example boots one sandbox, fake kubelet, fake hardware and subject (`boot`, an initialize
rule, so that hypothesis's teardown always closes what it made), and keeps them across its steps:
a step never makes a node of its own. After each rule the model's invariants become `expect`
steps (model.py), carried out by the scenario engine's Stage exactly as a scenario file's are,
so the log of an example is a scenario file as it stands (repro.py).

What the exploration learns lives in `Session`, shared by every example of a run: the shortest
failing sequence of each finding (its key: the invariant, and the rule that led to it), counts, and
the deadline that ends search and shrinking. Each key fails with an exception type of its own, so
hypothesis (which tells failures apart by type) shrinks each on its own and never slips from one
to another.
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
from harness.explore.model import DP, DRA, Device, Model, expectations, merged, split
from harness.explore.rules import THERMAL_MARGIN_C, Context, Rule
from harness.instruments import logtail
from harness.instruments.timeline import WaitTimeout
from harness.node.real.localnode import RealNodeUnavailable
from harness.scenarios.conditions import Conditions
from harness.scenarios.outcomes import Inconclusive, Symptom
from harness.scenarios.runner import _environment
from harness.scenarios.stage import Stage
from harness.scenarios.step import Step, flow
from harness.world.env import DPEnv, SubjectUnavailable

# What ends a step without a verdict on the subject: the engine's own (runner.py _one_run treats them so).
NO_VERDICT = (Inconclusive, SubjectUnavailable, WaitTimeout, pytest.skip.Exception, RealNodeUnavailable)


# A finding's key: (the invariant, the rule of the last step before the failing expect that is no judgement; "boot"
# when none). The rule is what the node was reacting to when the invariant broke: shrinking keeps it (a shrink that
# changes it is another key), so a key stays one story while hypothesis shortens the steps before it.
Key = tuple[str, str]
# What a finding keeps of the plugin's log: its last lines, bounded in bytes (a chatty plugin's, a stack trace's end).
LOG_LINES, LOG_BYTES = 60, 16 * 1024


class InvariantBroken(AssertionError):
    """An invariant failed: the example is a finding, and hypothesis shrinks it (raised as its key's subclass)."""

    key: Key = ("", "")


_BROKEN: dict[Key, type[InvariantBroken]] = {}


def broken(key: Key) -> type[InvariantBroken]:
    """The exception type of one key, the same for every failure of it. hypothesis's InterestingOrigin is the
    exception's type and where it was raised: with report_multiple_bugs each origin is shrunk on its own."""
    if key not in _BROKEN:
        _BROKEN[key] = type(f"InvariantBroken[{key[0]} after {key[1]}]", (InvariantBroken,), {"key": key})
    return _BROKEN[key]


def key_of(invariant: str, origins: Sequence[str]) -> Key:
    """The key of a failure of `invariant` at the end of a sequence whose steps came from `origins`."""
    return invariant, next((o for o in reversed(origins) if o not in JUDGING), "boot")


@dataclass
class Finding:
    invariant: str  # EXP-... (model.py INVARIANTS)
    detail: str  # what the failed expect saw
    steps: list[dict[str, Any]]  # the whole sequence, boot included, as scenario steps
    rules: list[str]  # the rule each step came from ("boot", "invariants" for expects)
    lines: list[str]  # the stage's narration: the timeline of the failing example
    duration_s: float
    found_at_s: float  # since the exploration began
    plugin_log: list[str] = field(default_factory=list)  # its last lines as the expect failed (LOG_LINES)

    @property
    def key(self) -> Key:
        return key_of(self.invariant, self.rules)

    def rule_steps(self) -> list[str]:
        """The rules of its steps, in order (boot and judgements left out)."""
        return [o for o in self.rules if o not in JUDGING]


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
    judge_s: float = 0.0  # of which in the judgements (expects: each state held for a node-status period)
    inconclusive: int = 0
    error: str = ""  # fakelet could not make a node: the run is a harness error
    judged: set[str] = field(default_factory=set)  # invariants some expect held the subject to
    failing: int = 0  # failing examples seen (each key's first and its shrinks)
    found: dict[Key, Finding] = field(default_factory=dict)  # the shortest failing sequence of each key, in order found
    # Each key's first failing sequence: its length before hypothesis shrank it, and seconds from the start to it.
    first: dict[Key, tuple[int, float]] = field(default_factory=dict)
    first_only: bool = False  # --first: the first key found is the only one; the search ends once it is shrunk
    done: set[Key] = field(default_factory=set)  # keys found and shrunk in an earlier pass: no failure in this one
    again: int = 0  # examples that ended at a key already kept (done, or another than --first's): not run on
    failed: dict[tuple[str, ...], Key] = field(default_factory=dict)  # step sequences that ended at a failure
    passes: int = 0  # hypothesis runs (seed, seed + 1, ...): the next starts when one ends before the budget
    pass_keys: set[Key] = field(default_factory=set)  # the keys this pass found
    pass_end: float | None = None  # monotonic: this pass stops here (every key it found is as short as it gets)
    nodes: int = 0  # examples that made a node (the rest repeated steps already run)
    doing: str = ""  # what runs now, for the progress line
    verbose: bool = False  # one line per example: the rules it ran
    devices: list[Device] | None = None  # the fake hardware as every example starts (learned by the first)
    prefixes: set[tuple[str, ...]] = field(default_factory=set)  # of step sequences that ran and held throughout
    repeats: int = 0  # examples that repeated an earlier one's steps, not run again
    node: str = "fake"  # whose kubelet every example runs on (nodes.py): fakelet's, or a real one through the relay

    def known(self, log: list[dict[str, Any]]) -> bool:
        return _key(log) in self.prefixes

    def passed(self, log: list[dict[str, Any]]) -> None:
        key = _key(log)
        self.prefixes.update(key[:n] for n in range(1, len(key) + 1))

    def over(self) -> bool:
        return time.monotonic() >= self.end

    def stopping(self) -> bool:
        """No step, example or judgement more: the budget is spent, or this pass has nothing left to shrink."""
        return self.over() or (self.pass_end is not None and time.monotonic() >= self.pass_end)

    def begin_pass(self) -> None:
        self.passes += 1
        self.pass_keys, self.pass_end = set(), None

    def end_pass(self) -> None:
        self.done |= self.pass_keys

    def ignored(self, key: Key) -> bool:
        """A failure that is none in this pass: a key an earlier pass found and shrank, or with --first another key
        than the first (shrinking it would slip from the first to it)."""
        return key in self.done or (self.first_only and bool(self.found) and key not in self.found)

    def record(self, finding: Finding) -> None:
        self.failing += 1
        key = finding.key
        if key not in self.found:
            self.first[key] = (len(finding.steps), finding.found_at_s)
            # Keep time for one replay of what shrinking leaves (no longer than this): the budget bounds it all.
            self.end -= REPLAY_RESERVE * finding.duration_s
            self.say(f"finding after {finding.found_at_s:.0f}s: {finding.invariant} after {key[1]} in "
                     f"{len(finding.steps)} steps; shrinking")
            self.found[key] = finding
        elif _shorter(finding, self.found[key]):
            self.found[key] = finding
        self.pass_keys.add(key)
        if all(len(self.found[k].rule_steps()) <= 1 for k in self.pass_keys):
            # One step of one rule for every key of this pass: nothing left to shrink. --first ends there; otherwise
            # the next pass searches on (hypothesis would spend examples on shrinks that cannot be shorter).
            if self.first_only:
                self.end = time.monotonic()
            else:
                self.pass_end = time.monotonic()

    def progress(self) -> None:
        """One progress line: counts, the findings so far, and what runs now (explorer.py's ticker, every
        PROGRESS_EVERY_S)."""
        now = time.monotonic()
        rate = self.steps / self.step_s if self.step_s else 0.0
        keys = tuple(self.found)  # a copy: the ticker's thread calls this while the search adds to it
        found = f"; {len(keys)} finding(s): {', '.join(f'{i} after {r}' for i, r in keys)}" if keys else ""
        doing = f"; now: {self.doing}" if self.doing else ""
        self.say(f"explore: {now - self.began:.0f}s, {self.examples} example(s), {self.steps} steps "
                 f"({rate:.2f} steps/s), {self.inconclusive} inconclusive, {self.repeats} repeat(s) skipped"
                 f"{found}{doing}")


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
        if s.stopping():
            reject()  # the budget (or this pass) is spent: hypothesis runs no more examples worth the name
        s.examples += 1
        if s.devices is None:
            self._go_live()  # the first example: the fake hardware says what the model starts from
        self.model.devices = [dataclasses.replace(d) for d in s.devices or []]
        self._steps("boot", [{"kubelet": "start"}, {"plugin": "start"}])
        self.model.kubelet_up = self.model.plugin_up = True
        self._judge("boot")
        self.busy = False

    def _go_live(self) -> None:
        """Make this example's node and carry out the steps held back so far (see `_one`)."""
        s = self.session
        try:
            self.env = _environment(s.run, s.plane, s.plane_error, s.node, None)
        except NO_VERDICT as err:
            # fakelet's failure, never the subject's: no example can run, so the exploration ends here.
            s.error, s.end = f"the node could not be made: {str(err).splitlines()[0]}", time.monotonic()
            reject()
        s.nodes += 1
        self.stage = Stage(self.env, lambda line: None)
        if s.devices is None:
            s.devices = _devices(self.env, s.ctx)
        for n in range(len(self.log)):
            self._carry_out(n)

    def teardown(self) -> None:
        """The node closed whatever happened; an example whose every step held is remembered (see `_one`). Every
        step's judgement was held for a node-status period: quiescence has nothing more to judge."""
        try:
            if self.stage is None:
                if self.log:
                    self.session.repeats += 1  # every step of it already ran, and held, in an earlier example
                return
            if not self.busy:
                self.session.passed(self.log)
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

    # -- steps -------------------------------------------------------------------------------------------

    def apply(self, r: Rule, data: st.DataObject) -> None:
        if self.session.stopping():
            return  # no step past the budget: the example ends as it stands
        self.busy = True
        self.ran.append(r.name)
        steps = r.act(self.model, self.session.ctx, lambda options: data.draw(st.sampled_from(list(options))))
        self._steps(r.name, steps)
        self._judge(r.name)
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
            key = self.session.failed.get(_key(self.log))
            if key is not None:
                # Steps that failed before, every one of them: the same failure, without a node (hypothesis runs a
                # failing example again before shrinking it, and once more to report it).
                self._broken(key, "the same steps failed before")
            self._go_live()
            return
        self._carry_out(len(self.log) - 1)

    def _carry_out(self, n: int) -> None:
        assert self.stage is not None
        mapping = self.log[n]
        (action, arg), *rest = mapping.items()
        step = Step(action, arg, dict(rest), f"explore: steps[{n}]", n)
        self.session.doing = f"example {self.session.examples}, steps[{n}] {flow(mapping)[:60]}"
        began = time.monotonic()
        symptom: Symptom | None = None
        try:
            self.stage.run(step)
        except Symptom as err:
            if action != "expect":
                self.session.inconclusive += 1
                reject()  # an action's own expectation (a rolling update's): not one of the model's invariants
            symptom = err
        except NO_VERDICT as err:
            self.session.inconclusive += 1
            self.stage.tell(f"INCONCLUSIVE: {str(err).splitlines()[0] if str(err) else type(err).__name__}")
            reject()  # no verdict on the subject: this example says nothing
        finally:
            self.session.steps += 1
            self.session.step_s += time.monotonic() - began
            if action == "expect":
                self.session.judge_s += time.monotonic() - began
            self.session.doing = ""
        if symptom is not None:
            # Out of the handler: an exception raised in it has the Symptom as its context, which hypothesis's
            # InterestingOrigin includes (where the engine raised it), and one key would split into several.
            # A held-back step may fail as it is carried out late: the finding is the sequence up to it.
            del self.log[n + 1:], self.origin[n + 1:]
            self._found(self.groups[n], str(symptom))

    def _judge(self, origin: str) -> None:
        """Every invariant the model holds now, as `expect` steps (as few as their condition keys allow), each state
        held for a node-status period within the bound, as every scenario's expect and every check judge the node:
        the settled state, not the first moment it shows (a plugin that marks every GPU unhealthy when one fails
        shows allocatable 3 on its way to 0; a glimpse passed it)."""
        # A fault the kubelet takes a while to get over on its own (a dropped health stream: its retry) widens the
        # bound by that while: a correct node shows the state only then.
        within = {"within": f"{self.session.run.profile.reaction_s + self.model.grace_s:g}s"} \
            if self.model.grace_s else {}
        self.model.grace_s = 0.0
        for group in split(expectations(self.model)):
            self.session.judged.update(invariant for invariant, _conds in group)
            self.groups[len(self.log)] = group
            self._one("held" if origin == "boot" else "invariants", {"expect": merged(group), **within})

    def _found(self, group: list[tuple[str, dict[str, Any]]], detail: str) -> None:
        assert self.stage is not None and self.env is not None
        s = self.session
        which = group[0][0]
        conditions = Conditions(self.stage)
        for invariant, conds in group:  # the one that does not hold now names the finding
            try:
                ok, _seen = conditions.holds(conds)
            except NO_VERDICT:
                continue
            if not ok and not conditions.unread:  # one that could not be read names nothing
                which = invariant
                break
        key = key_of(which, self.origin)
        # The steps before the failing one ran and held: a later example that repeats them is held back (see `_one`).
        s.passed(self.log[:-1])
        s.failed[_key(self.log)] = key
        if not s.ignored(key):
            self.stage.tell(f"FINDING {which}: {detail.splitlines()[0]}")
            now = time.monotonic()
            s.record(Finding(which, detail, list(self.log), list(self.origin), list(self.stage.lines),
                             round(now - self.began, 3), round(now - s.began, 3), _plugin_log(self.env)))
        self._broken(key, detail)

    def _broken(self, key: Key, detail: str) -> None:
        """The failure of `key` as hypothesis should see it: its own exception, or no failure at all (rejected) when
        the key is one this pass leaves alone."""
        if self.session.ignored(key):
            self.session.again += 1
            reject()
        raise broken(key)(f"{key[0]}: {detail}")


def _plugin_log(env: DPEnv) -> list[str]:
    """The plugin's log as a finding keeps it: its last lines across this example's starts (LOG_LINES, LOG_BYTES)."""
    subject = env.subject
    drain = getattr(subject, "log_tail", None)
    if drain is not None:
        drain(1)  # the plugin's pipe into its log first: its last words are the ones that tell
    return logtail.tail(subject.log_path, LOG_LINES, LOG_BYTES).splitlines()


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
