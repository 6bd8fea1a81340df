"""`fakelet explore`: its flags, its model, and proof that it finds bugs and only bugs.

The default run (tox -e py) takes a small sample, each about a minute at most: two reference device-plugin
mutants (one searching on until its budget is spent, one with --first) and one DRA mutant (--first) found with
a fixed seed and replayed as reproduced, and the reference plugin with no finding; and, with no subject, the
keys that keep findings apart, the passes, unconfirmed findings and their report.
FAKELET_EXPLORE=full (tox -e explore) runs every mutant of the table in docs/explore.md with
the whole rule set and the table's budget.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.config.runconfig import RunConfig
from harness.explore import explorer, model, repro
from harness.explore.explorer import Options, Result, explore
from harness.explore.findings import Kept, Replay
from harness.explore.machine import Finding, InvariantBroken, Session, broken, key_of
from harness.explore.rules import RULES, Context, applicable, context_of
from harness.reference.multibug import MULTI_BUG, MultiBug
from harness.run.explorecli import budget_s, rule_names
from harness.scenarios.schema import INCONCLUSIVE, NOT_REPRODUCED, REPRODUCED, load
from harness.spec.subjects import load_subject
from reports.model import CONFORMANT, EXIT_CODES, FAIL, NOT_CONFORMANT, NOT_EXERCISED, PASS, SubjectReport

ROOT = Path(__file__).resolve().parents[1]
FULL = os.environ.get("FAKELET_EXPLORE") == "full"
# Mutants that never react are caught after the reaction bound, and shrinking replays each failing example: the
# kill matrix's shortened bound (harness/spec/profiles.py with_reaction_bound) keeps a sample test under a minute.
MUTANT_BOUND_S = 5.0


# -- flags and model (no subject runs) -------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "seconds"), [("90", 90.0), ("90s", 90.0), ("10m", 600.0), ("1.5h", 5400.0)])
def test_budget_durations(text: str, seconds: float) -> None:
    assert budget_s(text) == seconds


@pytest.mark.parametrize("text", ["", "x", "10d", "0", "-5s", "25h"])
def test_bad_budgets_are_one_line_errors(text: str) -> None:
    with pytest.raises(ValueError, match="--budget"):
        budget_s(text)


def test_rule_names_split_and_keep_order() -> None:
    assert rule_names([]) is None
    assert rule_names(["kubelet-restart,device-fail", " plugin-kill "]) == ("kubelet-restart", "device-fail",
                                                                           "plugin-kill")


def test_rules_follow_what_the_subject_observes() -> None:
    dp = context_of(load_subject("reference-dp"))
    names = {r.name for r in applicable(dp)}
    assert {"kubelet-restart", "device-fail", "device-heat", "device-unplug", "pod-admitted"} <= names
    assert "device-xid" not in names  # the neutral skin has no NVML
    nvml = context_of(load_subject("reference-nvml"))
    assert "device-xid" in {r.name for r in applicable(nvml)}
    with pytest.raises(ValueError, match="unknown rule"):
        applicable(dp, ("kubelet-restart", "nope"))
    with pytest.raises(ValueError, match="device-xid needs"):
        applicable(dp, ("device-xid",))


def test_model_holds_a_stopped_plugin_to_allocatable_zero_and_judges_nothing_without_a_kubelet() -> None:
    m = model.Model(model.DP, [model.Device(), model.Device(failed=True), model.Device(hot=True)],
                    kubelet_up=True, plugin_up=True)
    got = dict(model.expectations(m))
    assert got["EXP-DP-CAPACITY"] == {"capacity": 3}
    assert got["EXP-DP-ALLOCATABLE"] == {"allocatable": 1}
    m.plugin_up = False
    assert model.expectations(m) == [("EXP-DP-STOPPED", {"allocatable": 0})]
    m.kubelet_up = False
    assert model.expectations(m) == []


def test_two_pods_are_two_expect_steps() -> None:
    m = model.Model(model.DP, [model.Device()] * 4, kubelet_up=True, plugin_up=True)
    m.pods = {"a": model.Pod("a", 1, True), "b": model.Pod("b", 1, True)}
    groups = model.split(model.expectations(m))
    assert len(groups) == 2
    assert all(len({k for _i, c in g for k in c}) == sum(len(c) for _i, c in g) for g in groups)


@pytest.mark.parametrize("subject", ["reference-nvml", "reference-dra"])
def test_every_rule_speaks_the_scenario_vocabulary(tmp_path: Path, subject: str) -> None:
    """Whatever a rule emits, `fakelet scenario check` accepts: a shrunk sequence is a scenario file as it is."""
    import random

    ctx = context_of(load_subject(subject))
    rng = random.Random(7)
    m = model.Model(ctx.kind, [model.Device() for _ in range(4)], kubelet_up=True, plugin_up=True,
                    health="health" in ctx.observes)
    steps: list[dict] = [{"kubelet": "start"}, {"plugin": "start"}]
    ran: set[str] = set()
    for _ in range(300):
        rule = rng.choice([r for r in applicable(ctx) if r.enabled(m)])
        ran.add(rule.name)
        steps += rule.act(m, ctx, lambda options: rng.choice(list(options)))
        steps += [{"expect": model.merged(g)} for g in model.split(model.expectations(m))]
    invariant = next(i.id for i in model.INVARIANTS.values() if ctx.kind in i.kinds)
    finding = Finding(invariant, "saw nothing", steps, ["x"] * len(steps), [], 1.0, 1.0)
    run = RunConfig.build(subject=subject, seed=3)
    path = repro.write(finding, run, 3, len(steps), tmp_path)
    scenario = load(path)  # every problem is an error here
    assert scenario.subject == subject and scenario.kind == ctx.kind
    assert [s.action for s in scenario.steps].count("expect") == 1 and scenario.steps[-1].action == "expect"
    assert path.name.startswith("explore-") and set(RULES) >= {"device-xid", "health-stream-drop"}
    assert ran >= {"pod-admitted", "pod-deleted"}


# -- DRA: health, taints, the dropped stream and the eviction (model level, no subject runs) ----------------------


def _dra_model(*devices: model.Device, health: bool = True) -> model.Model:
    return model.Model(model.DRA, list(devices), kubelet_up=True, plugin_up=True, health=health)


def test_dra_health_and_taints_follow_the_devices() -> None:
    """Healthy devices held Healthy, failed or hot ones Unhealthy; the driver's taints allowed on failed, hot and
    warm devices only, NoExecute on failed and hot ones only; an unplugged device is in no slice."""
    m = _dra_model(model.Device(), model.Device(failed=True), model.Device(hot=True), model.Device(warm=True),
                   model.Device(present=False, failed=True))
    got = dict(model.expectations(m))
    assert got["EXP-DRA-HEALTH"] == {"device_health": {"healthy": ["@0", "@3"], "unhealthy": ["@1", "@2"]}}
    assert got["EXP-DRA-TAINTS"] == {"taints": {"only": ["@1", "@2", "@3"], "no_execute": ["@1", "@2"]}}
    m.health = False  # the profile says the driver streams no health: nothing of it is judged
    assert "EXP-DRA-HEALTH" not in dict(model.expectations(m))
    m.plugin_up = False  # a stopped driver's slices and health are not judged (the kubelet wipes them later)
    assert not {"EXP-DRA-HEALTH", "EXP-DRA-TAINTS"} & set(dict(model.expectations(m)))


def test_dra_health_is_judged_only_when_the_driver_observes_health_and_the_kubelet_asks() -> None:
    dra = context_of(load_subject("reference-dra"))
    assert {"health", "eviction"} <= dra.observes
    assert {"health-stream-drop", "taint-eviction"} <= {r.name for r in applicable(dra)}
    blind = dataclasses.replace(dra, observes=dra.observes - {"health", "eviction"})
    assert not {"health-stream-drop", "taint-eviction"} & {r.name for r in applicable(blind)}
    dp = context_of(load_subject("reference-dp"))
    assert not {"health-stream-drop", "taint-eviction"} & {r.name for r in applicable(dp)}


def test_a_dra_device_fault_leaves_the_pods_on_the_node_unjudged() -> None:
    """A failed or hot device may be a pod's: a driver that taints it NoExecute (DRA-TNT-01 allows it) has the pod
    evicted, one that does not keeps it, so the model judges neither; a pod made while a device is failed may land
    on it before the taint is published, so it is not judged either."""
    ctx = context_of(load_subject("reference-dra"))
    m = _dra_model(model.Device(), model.Device(), model.Device())
    RULES["pod-admitted"].act(m, ctx, _first)
    assert ("EXP-DRA-PREPARED", {"cdi": {"pod": "explore-1", "present": True}}) in model.expectations(m)
    assert RULES["device-fail"].act(m, ctx, _first) == [{"device": {"fail": "@0"}}]
    assert m.pods["explore-1"].lost and "EXP-DRA-PREPARED" not in dict(model.expectations(m))
    RULES["pod-admitted"].act(m, ctx, _first)
    assert not m.pods["explore-2"].running
    assert not RULES["taint-eviction"].enabled(m)  # no pod the model is sure runs
    RULES["pod-deleted"].act(m, ctx, _first)  # a lost pod goes unjudged (it may have been evicted already)
    assert "explore-1" not in m.pods


def test_heat_draws_hot_or_warm_for_a_dra_driver() -> None:
    """Warm is a degree under the driver's limit: NoSchedule allowed, NoExecute not, Healthy; pods stay judged."""
    ctx = context_of(load_subject("reference-dra"))
    m = _dra_model(model.Device(), model.Device())
    RULES["pod-admitted"].act(m, ctx, _first)
    warm = RULES["device-heat"].act(m, ctx, lambda options: list(options)[-1])
    assert warm == [{"device": {"heat": "@1", "to": ctx.thermal[0] - 1}}] and m.devices[1].warm
    assert not m.pods["explore-1"].lost and m.free_healthy() == 0  # a warm device may be kept away from claims
    got = dict(model.expectations(m))
    assert got["EXP-DRA-TAINTS"] == {"taints": {"only": ["@1"], "no_execute": []}}
    assert got["EXP-DRA-HEALTH"] == {"device_health": {"healthy": ["@0", "@1"]}}
    assert RULES["device-cool"].enabled(m)
    RULES["device-cool"].act(m, ctx, lambda options: list(options)[-1])
    assert not m.devices[1].warm
    dp = context_of(load_subject("reference-dp"))  # device plugins know no warning temperature
    d = model.Model(model.DP, [model.Device()], kubelet_up=True, plugin_up=True)
    assert RULES["device-heat"].act(d, dp, lambda options: list(options)[-1])[0]["device"]["to"] > dp.thermal[0]


def test_a_dropped_health_stream_gives_the_next_judgement_the_kubelets_retry() -> None:
    """The kubelet re-opens NodeWatchResources 5 s after a stream ends (dra_plugin_manager.go add()): the next
    judgement's bound is T plus that."""
    from harness.spec.profiles import DRA_HEALTH_RETRY_S

    ctx = context_of(load_subject("reference-dra"))
    m = _dra_model(model.Device())
    assert RULES["health-stream-drop"].act(m, ctx, _first) == [{"kubelet": "drop-health-stream"}]
    assert m.grace_s == DRA_HEALTH_RETRY_S
    m.plugin_up = False
    assert not RULES["health-stream-drop"].enabled(m)


def test_taint_eviction_taints_a_running_pods_device_and_expects_its_eviction() -> None:
    ctx = context_of(load_subject("reference-dra"))
    m = _dra_model(model.Device(), model.Device())
    RULES["pod-admitted"].act(m, ctx, _first)
    steps = RULES["taint-eviction"].act(m, ctx, _first)
    assert steps == [{"taint": {"device": "@pod:explore-1", "effect": "NoExecute", "key": "fakelet.example.com/"
                                "explore-evict"}}]
    got = model.expectations(m)
    assert ("EXP-DRA-EVICTED", {"pod": {"name": "explore-1", "phase": "Deleted"}}) in got
    assert ("EXP-DRA-UNPREPARED", {"cdi": {"pod": "explore-1", "present": False}}) in got
    assert m.free_healthy() == 1  # the tainted device stays away from claims for the rest of the example
    assert not RULES["taint-eviction"].enabled(m) and not RULES["pod-deleted"].enabled(m)


def test_the_dra_conditions_are_dra_vocabulary() -> None:
    from harness.scenarios.step import Step
    from harness.scenarios.vocabulary import check_step

    def problem(action: str, arg: Any, kind: str = "dra") -> Any:
        return check_step(Step(action, arg, {}, "t", 0), kind)

    assert problem("expect", {"taints": {"only": ["@0", "@pod:a"], "no_execute": []}}) is None
    assert problem("expect", {"device_health": {"healthy": ["@0"], "unhealthy": ["gpu-1"]}}) is None
    assert problem("expect", {"taints": {"only": "@0"}}) is not None
    assert problem("expect", {"taints": {}}) is not None
    assert problem("expect", {"device_health": {"sick": ["@0"]}}) is not None
    assert problem("expect", {"taints": {"only": []}}, "device-plugin") is not None
    assert problem("kubelet", "drop-health-stream") is None
    assert problem("kubelet", "drop-health-stream", "device-plugin") is not None


def test_a_repro_waits_as_the_exploration_judged() -> None:
    """The invariants that held on the way become waits with their options: a first glimpse stays a glimpse, and a
    bound widened for the kubelet's retry after a dropped health stream stays widened, or the replay would hold
    the subject to more than the exploration did (inconclusive, another story)."""
    steps = [{"kubelet": "start"}, {"kubelet": "drop-health-stream"},
             {"expect": {"device_health": {"healthy": ["@0"]}}, "glimpse": True, "within": "10s"},
             {"expect": {"registered": True}, "glimpse": True}]
    finding = Finding("EXP-DRA-REGISTERED", "x", steps, ["x"] * len(steps), [], 1.0, 1.0)
    out = repro.scenario_steps(finding)
    assert out[2] == {"wait": {"device_health": {"healthy": ["@0"]}}, "glimpse": True, "within": "10s"}
    assert out[3] == steps[3]


def test_the_taints_invariant_is_held_not_glimpsed() -> None:
    # A driver's taints pass at the first moment after a step, before it reacted: held, its findings replay.
    # (cdi present: false and a shared CDI device: tests/test_conditions.py)
    assert "EXP-DRA-TAINTS" in model.HELD


def test_taints_condition_judges_the_drivers_own_taints() -> None:
    """Only the driver's taints that keep claims away count; NoExecute where only NoSchedule is allowed breaks it."""
    from types import SimpleNamespace

    from harness.scenarios.conditions import Conditions

    def taint(effect: str) -> dict[str, str]:
        return {"key": "gpu.example.com/x", "effect": effect}

    devices = [{"name": "gpu-0", "taints": [taint("NoSchedule")]}, {"name": "gpu-1", "taints": [taint("NoExecute")]},
               {"name": "gpu-2"}]
    env = SimpleNamespace(slices=lambda: [{"spec": {"devices": devices}}])
    stage = SimpleNamespace(env=env, began_ns=0, device=lambda ref: f"gpu-{ref[1:]}")
    c = Conditions(stage)  # type: ignore[arg-type]
    assert c.holds({"taints": {"only": ["@0", "@1"], "no_execute": ["@1"]}})[0]
    ok, seen = c.holds({"taints": {"only": ["@0"]}})
    assert not ok and "gpu-1" in seen
    ok, seen = c.holds({"taints": {"only": ["@0", "@1"], "no_execute": ["@0", "@2"]}})
    assert not ok and "NoExecute taints on gpu-1" in seen


def _first(options: Any) -> Any:  # a Draw that takes the first candidate, as hypothesis shrinks towards
    return next(iter(options))


def test_kubelet_reject_restarts_the_kubelet_with_one_register_refused() -> None:
    """The next kubelet refuses the plugin's first Register; EXP-DP-REGISTERED then judges that kubelet only."""
    dp = context_of(load_subject("reference-dp"))
    rule = RULES["kubelet-reject"]
    assert rule in applicable(dp) and rule.kinds == (model.DP,)
    m = model.Model(model.DP, [model.Device()], kubelet_up=True, plugin_up=True)
    assert rule.act(m, dp, _first) == [{"kubelet": "stop"}, {"reject": {"call": "Register"}}, {"kubelet": "start"}]
    assert m.kubelet_up and m.plugin_up and ("EXP-DP-REGISTERED", {"registered": True}) in model.expectations(m)
    m.kubelet_up = False  # already down: the rejection waits for the kubelet about to start
    assert rule.act(m, dp, _first) == [{"reject": {"call": "Register"}}, {"kubelet": "start"}] and m.kubelet_up
    m.plugin_up = False  # no plugin: no Register to refuse
    assert not rule.enabled(m)


def test_plugin_before_kubelet_takes_the_start_up_order_the_boot_never_does() -> None:
    dp = context_of(load_subject("reference-dp"))
    rule = RULES["plugin-before-kubelet"]
    assert rule in applicable(dp) and rule.kinds == (model.DP,)
    m = model.Model(model.DP, [model.Device()], kubelet_up=True, plugin_up=False)
    steps = rule.act(m, dp, _first)
    assert steps == [{"kubelet": "stop"}, {"socket": {"delete": "kubelet"}}, {"plugin": "start"}, {"hold": "1s"},
                     {"kubelet": "start"}]
    assert m.kubelet_up and m.plugin_up
    assert rule.act(m, dp, _first)[2] == {"plugin": "restart"}
    m.kubelet_up = False
    assert not rule.enabled(m)


def test_reject_is_a_device_plugin_step_of_the_scenario_vocabulary() -> None:
    from harness.scenarios.step import Step
    from harness.scenarios.vocabulary import check_step

    def problem(arg: Any, kind: str = "device-plugin") -> Any:
        return check_step(Step("reject", arg, {}, "t", 0), kind)

    assert problem({"call": "Register"}) is None
    assert problem({"call": "Allocate"}) is not None and problem("Register") is not None
    assert problem({"call": "Register"}, "dra") is not None


def test_a_pod_of_an_rwx_device_runs_on_the_fake_node_as_on_the_real_one() -> None:
    """bad-allocate-response answers permissions 'rwx'. Measured on the real node (containerd 1.6, runc 1.1), its
    pod runs (DP-NODE-04 passes there), so the fake's container start must not refuse it: explore cannot see this
    defect through the node, and DP-ALC-03 judges it on the wire."""
    from harness.node.real.view import runtime_refusals

    responses = [{"devices": [{"container_path": "/dev/x0", "host_path": "/dev/null", "permissions": "rwx"}]}]
    assert runtime_refusals(responses) == []



# -- every finding kept: keys, one exception type a key, passes, unconfirmed findings (no subject runs) -----------


def _finding(invariant: str, origins: list[str], at: float = 1.0, duration: float = 1.0) -> Finding:
    steps = [{"kubelet": "start"} if o != "invariants" else {"expect": {"registered": True}} for o in origins]
    return Finding(invariant, f"{invariant} broke", steps, origins, [f"line {n}" for n in range(3)], duration, at,
                   ["plugin: started", "plugin: lost the kubelet"])


def _session(first_only: bool = False) -> Session:
    said: list[str] = []
    return Session(None, Context(model.DP, frozenset(), (85.0, 5.0)), [], None, "",  # type: ignore[arg-type]
                   time.monotonic() + 600, said.append, first_only=first_only)


def test_a_key_is_the_invariant_and_the_last_rule_before_the_failing_expect() -> None:
    origins = ["boot", "boot", "held", "kubelet-restart", "invariants", "device-fail", "device-fail", "invariants"]
    assert key_of("EXP-DP-ALLOCATABLE", origins) == ("EXP-DP-ALLOCATABLE", "device-fail")
    assert key_of("EXP-DP-CAPACITY", ["boot", "boot", "held"]) == ("EXP-DP-CAPACITY", "boot")
    assert _finding("EXP-DP-POD", origins).rule_steps() == ["kubelet-restart", "device-fail", "device-fail"]


def test_each_key_fails_with_an_exception_type_of_its_own_that_hypothesis_tells_apart() -> None:
    """hypothesis's InterestingOrigin (its exception type and where it was raised) is what report_multiple_bugs
    shrinks apart: one type a key, the same every time."""
    from hypothesis.internal.escalation import InterestingOrigin

    a, b = ("EXP-DP-REGISTERED", "kubelet-restart"), ("EXP-DP-REGISTERED", "plugin-crash")
    assert broken(a) is broken(a) and broken(a) is not broken(b)
    assert issubclass(broken(a), InvariantBroken) and broken(a).key == a

    def origin(key: tuple[str, str]) -> InterestingOrigin:
        try:
            raise broken(key)("x")
        except InvariantBroken as err:
            return InterestingOrigin.from_exception(err)

    assert origin(a) == origin(a) and origin(a) != origin(b)


def test_hypothesis_shrinks_each_key_on_its_own_and_reports_every_one() -> None:
    """Two failures in one machine: with one exception type a key and report_multiple_bugs, both come back, each
    shrunk to its own minimal example (none slipped into the other, smaller one)."""
    from hypothesis import HealthCheck, Phase, settings
    from hypothesis import strategies as st
    from hypothesis.stateful import RuleBasedStateMachine, rule, run_state_machine_as_test

    class Two(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.seen: list[int] = []

        @rule(n=st.integers(0, 3))
        def step(self, n: int) -> None:
            self.seen.append(n)
            if n == 1:
                raise broken(("EXP-A", "one"))("a one")
            if self.seen.count(3) == 2:
                raise broken(("EXP-B", "three"))("two threes")

    config = settings(max_examples=500, deadline=None, database=None, derandomize=True, stateful_step_count=10,
                      suppress_health_check=list(HealthCheck), phases=(Phase.generate, Phase.shrink),
                      report_multiple_bugs=True, print_blob=False)
    with pytest.raises(ExceptionGroup) as group:
        run_state_machine_as_test(Two, settings=config)
    assert {type(e).key for e in group.value.exceptions} == {("EXP-A", "one"), ("EXP-B", "three")}


def test_a_session_keeps_the_shortest_finding_of_each_key_and_leaves_found_keys_alone_in_later_passes() -> None:
    s = _session()
    s.begin_pass()
    long = _finding("EXP-DP-REGISTERED", ["boot", "plugin-crash", "invariants", "kubelet-restart", "invariants"], 9.0)
    s.record(long)
    other = _finding("EXP-DP-CAPACITY", ["boot", "device-fail", "invariants"], 12.0)
    s.record(other)
    short = _finding("EXP-DP-REGISTERED", ["boot", "kubelet-restart", "invariants"], 20.0)
    s.record(short)
    assert list(s.found) == [long.key, other.key] and s.found[long.key] is short
    assert s.first[long.key] == (5, 9.0) and s.failing == 3  # the first failing sequence's length and time
    assert s.pass_end is not None and s.end > time.monotonic()  # every key minimal: this pass ends, the search not
    assert not s.ignored(long.key)  # this pass still shrinks it
    s.end_pass()
    s.begin_pass()
    assert s.ignored(long.key) and s.ignored(other.key) and s.pass_end is None
    assert not s.ignored(("EXP-DP-POD", "pod-admitted"))


def test_first_keeps_one_key_and_ends_the_search_once_it_cannot_be_shorter() -> None:
    s = _session(first_only=True)
    s.begin_pass()
    s.record(_finding("EXP-DP-REGISTERED", ["boot", "plugin-crash", "invariants", "kubelet-restart", "invariants"]))
    assert s.ignored(("EXP-DP-CAPACITY", "device-fail")) and not s.ignored(("EXP-DP-REGISTERED", "kubelet-restart"))
    assert not s.over()
    s.record(_finding("EXP-DP-REGISTERED", ["boot", "kubelet-restart", "invariants"]))
    assert s.over()


@pytest.mark.filterwarnings("ignore:Using `reject` outside a property-based test")
def test_steps_that_failed_before_fail_again_without_a_node_or_not_at_all_once_found() -> None:
    """hypothesis runs a failing example again before shrinking it and to report it: the same steps raise their
    key's exception at once (no node is made); in a later pass, where that key is found already, they are rejected."""
    from hypothesis.errors import UnsatisfiedAssumption

    from harness.explore.machine import _key, machine_for

    s = _session()
    s.begin_pass()
    steps = [{"kubelet": "start"}, {"plugin": "start"}]
    failing = {"expect": {"registered": True, "capacity": 4, "allocatable": 4}}
    key = ("EXP-DP-REGISTERED", "boot")
    s.record(_finding("EXP-DP-REGISTERED", ["boot", "boot", "held"]))  # as the first failure of those steps did
    s.passed(steps)
    s.failed[_key([*steps, failing])] = key
    m = machine_for(s)()
    for mapping in steps:
        m._one("boot", mapping)
    assert m.stage is None  # held back: those steps held before
    with pytest.raises(broken(key)):
        m._one("held", failing)
    assert m.stage is None and s.nodes == 0
    s.end_pass()
    s.begin_pass()
    again = machine_for(s)()
    for mapping in steps:
        again._one("boot", mapping)
    with pytest.raises(UnsatisfiedAssumption):
        again._one("held", failing)
    assert s.again == 1 and s.nodes == 0


def _kept(invariant: str, *outcomes: str) -> Kept:
    f = _finding(invariant, ["boot", "kubelet-restart", "invariants"], 30.0)
    return Kept(f, 7, 30.0, None, [Replay(o, f"{o}: saw this", [f"replay line {o}"], [f"log {o}"], 2.0)
                                   for o in outcomes])


def test_replays_say_which_one_reproduced() -> None:
    assert _kept("EXP-DP-REGISTERED", NOT_REPRODUCED, REPRODUCED).replay_said() == "reproduced on replay 2 of 3"
    never = _kept("EXP-DP-REGISTERED", NOT_REPRODUCED, INCONCLUSIVE, NOT_REPRODUCED)
    assert not never.confirmed and never.outcome() == NOT_REPRODUCED
    assert never.replay_said() == "not reproduced in 3 replay(s) (not reproduced, inconclusive, not reproduced)"
    assert _kept("EXP-DP-REGISTERED").replay_said() == "not replayed (interrupted)"


def _report(kept: list[Kept]) -> SubjectReport:
    """explorer._fill on a session that ran nothing of a subject: the report as a run with these findings ends."""
    s = _session()
    s.examples, s.judged = 12, {i for i in model.INVARIANTS if i.startswith("EXP-DP")}
    s.passes = 2
    result = Result(SubjectReport(subject="x", profile="fast", seed=1), kept)
    explorer._fill(result.report, result, s, Options(60, 1), time.monotonic(), Path("/out"), Path("/out"))
    return result.report


def test_an_unconfirmed_finding_is_no_verdict_and_keeps_its_evidence() -> None:
    """A correct plugin with a failure no replay showed again: exit 0, its check passes saying so, and the evidence
    of both sides (the failing example's timeline and plugin log, each replay's) is in the check's notes."""
    kept = _kept("EXP-DP-REGISTERED", NOT_REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE)
    report = _report([kept])
    assert report.status() == CONFORMANT and EXIT_CODES[report.status()] == 0
    check = next(c for c in report.checks if c.id == "EXP-DP-REGISTERED")
    assert check.verdict == PASS and "UNCONFIRMED" in check.detail
    notes = "\n".join(check.notes)
    for seen in ("the failing example: timeline", "  line 2", "the failing example: the plugin's log",
                 "  plugin: lost the kubelet", "replay 3: timeline", "  replay line inconclusive",
                 "replay 1: the plugin's log", "  log not reproduced"):
        assert seen in notes, seen
    assert report.findings and report.findings[0].startswith("UNCONFIRMED explore finding EXP-DP-REGISTERED after "
                                                             "kubelet-restart")
    facts = report.facts["explore"]
    assert facts["confirmed"] == 0 and facts["findings"][0]["confirmed"] is False
    assert facts["findings"][0]["replays_tried"] == 3 and facts["replay"] == INCONCLUSIVE  # the last one


def test_every_finding_is_reported_and_a_confirmed_one_fails_its_invariant() -> None:
    confirmed = _kept("EXP-DP-ALLOCATABLE", NOT_REPRODUCED, REPRODUCED)
    second = _kept("EXP-DP-ALLOCATABLE", NOT_REPRODUCED, NOT_REPRODUCED, NOT_REPRODUCED)
    second.finding.rules[1] = "device-recover"
    other = _kept("EXP-DP-CAPACITY", REPRODUCED)
    report = _report([second, confirmed, other])
    assert report.status() == NOT_CONFORMANT and EXIT_CODES[report.status()] == 1
    verdicts = {c.id: c for c in report.checks}
    allocatable = verdicts["EXP-DP-ALLOCATABLE"]
    assert allocatable.verdict == FAIL and allocatable.detail.startswith("EXP-DP-ALLOCATABLE broke")
    assert "1 more finding" in allocatable.detail
    assert allocatable.notes[0].startswith("finding 1 of 2 (confirmed): EXP-DP-ALLOCATABLE after kubelet-restart")
    assert any(n.startswith("finding 2 of 2 (UNCONFIRMED): EXP-DP-ALLOCATABLE after device-recover")
               for n in allocatable.notes)
    assert verdicts["EXP-DP-CAPACITY"].verdict == FAIL and verdicts["EXP-DP-REGISTERED"].verdict == PASS
    facts = report.facts["explore"]
    assert [f["key"] for f in facts["findings"]] == ["EXP-DP-ALLOCATABLE after device-recover",
                                                     "EXP-DP-ALLOCATABLE after kubelet-restart",
                                                     "EXP-DP-CAPACITY after kubelet-restart"]
    assert facts["findings"][1]["replay"] == "reproduced on replay 2 of 3" and facts["confirmed"] == 2
    assert facts["invariant"] == "EXP-DP-ALLOCATABLE" and facts["replay"] == REPRODUCED  # the lead: first confirmed
    assert facts["passes"] == 2 and facts["time_to_find_s"] == 30.0


def test_progress_comes_while_a_step_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The ticker says progress every PROGRESS_EVERY_S whatever the block does (here: waits), and stops with it."""
    import threading

    monkeypatch.setattr(explorer, "PROGRESS_EVERY_S", 0.01)
    s = _session()
    lines: list[str] = []
    twice = threading.Event()

    def say(line: str) -> None:
        lines.append(line)
        if len(lines) >= 2:
            twice.set()

    s.say, s.doing = say, "example 3, steps[4] kubelet: restart"
    with explorer._ticking(s):
        assert twice.wait(10)
    said = len(lines)
    assert all(t.name != "fakelet-explore-progress" for t in threading.enumerate())
    assert len(lines) == said and "now: example 3, steps[4] kubelet: restart" in lines[0]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GRPC_VERBOSITY": "ERROR"}
    return subprocess.run([sys.executable, "-m", "harness.run.cli", "explore", *args], capture_output=True,
                          text=True, env=env, timeout=120, cwd=ROOT)


# Each costs an interpreter's start and fakelet's imports (seconds on a loaded runner): two, one per kind of check
# (a flag's own, and one that needs the subject); the rest of the validation is tested in-process above.
@pytest.mark.parametrize("args", [["--budget", "soon"], ["--rules", "device-xid"]])
def test_bad_input_is_one_line_and_exit_2(args: list[str], tmp_path: Path) -> None:
    out = tmp_path / "report"
    done = _cli(*args, "--out", str(out))
    assert done.returncode == 2, done
    assert len(done.stderr.strip().splitlines()) == 1 and done.stderr.startswith("fakelet: error:")
    assert not out.exists() and not list(tmp_path.glob(".fakelet-*"))  # nothing made, nothing left


# -- proof: it finds bugs, and only bugs -----------------------------------------------------------------------


def _explore(tmp_path: Path, subject: str, defect: str | None, budget: float, seed: int,
             rules: tuple[str, ...] | None, bound: float | None, max_steps: int = 6, first: bool = False):
    run = RunConfig.build(subject=subject, defect=defect, profile="fast", seed=seed, reaction_bound=bound,
                          out=str(tmp_path))
    began = time.monotonic()
    result = explore(run, Options(budget, seed, max_steps, rules, first=first), tmp_path, lambda line: None)
    return result, time.monotonic() - began


# (subject, defect, rules, budget s, --first): the sample CI runs. Rules narrowed to the faults the defect is about
# keep each under a minute; the full table (FAKELET_EXPLORE=full) gives every mutant every rule. no-reregister
# searches on after its finding until the budget is spent (every finding kept); stuck-unhealthy stops at the first.
SAMPLE = [
    ("reference-dp", "no-reregister", ("kubelet-restart", "plugin-restart", "device-fail", "pod-admitted"), 45,
     False),
    ("reference-dp", "stuck-unhealthy", ("device-fail", "device-recover", "plugin-crash", "pod-admitted"), 45, True),
]


@pytest.mark.parametrize(("subject", "defect", "rules", "budget", "first"), SAMPLE, ids=[s[1] for s in SAMPLE])
def test_explore_finds_the_mutant_and_the_repro_replays(tmp_path: Path, subject: str, defect: str,
                                                        rules: tuple[str, ...], budget: float, first: bool) -> None:
    result, took = _explore(tmp_path, subject, defect, budget, 1, rules, MUTANT_BOUND_S, first=first)
    assert took <= budget + 15, f"the budget bounds the run: {took:.0f}s for {budget}s"
    assert result.finding is not None, result.report.facts
    assert result.replayed == REPRODUCED
    failed = [c for c in result.report.checks if c.verdict == FAIL]
    assert {c.id for c in failed} == {k.finding.invariant for k in result.confirmed()}
    assert failed[0].repro.startswith("fakelet scenario run --file ") and "--reaction-bound 5" in failed[0].repro
    assert result.repro is not None and load(result.repro).defect == defect
    doc = yaml.safe_load(result.repro.read_text())
    assert "expect" in doc["steps"][-1] and not any("expect" in s for s in doc["steps"][:-1])
    facts = result.report.facts["explore"]
    assert [f["repro"] for f in facts["findings"]] == [str(k.repro.relative_to(tmp_path)) for k in result.findings]
    assert len({f["key"] for f in facts["findings"]}) == len(result.findings)  # one finding a key
    if first:
        assert len(result.findings) == 1 and facts["passes"] == 1


def test_explore_finds_a_dra_mutant_through_the_health_stream(tmp_path: Path) -> None:
    """single-stream serves only the first NodeWatchResources call: the kubelet's next stream (a restart, a dropped
    stream) gets nothing, and the devices turn Unknown. Found at the first kubelet restart (one rule, five steps),
    replayed as reproduced; about 15 s on an idle machine, the local API server's start included."""
    rules = ("kubelet-restart", "health-stream-drop")
    result, took = _explore(tmp_path, "reference-dra", "single-stream", 45, 1, rules, MUTANT_BOUND_S, first=True)
    if "error" in result.report.facts["explore"]:
        pytest.skip(result.report.facts["explore"]["error"])  # no API server here: DRA cannot run
    # The API server's start has its own bound (START_TIMEOUT_S: 3 s idle, over 60 s at CI's worst load); the
    # budget bounds what follows it, stopping the API server included.
    searched = took - result.report.facts["explore"]["control_plane_s"]
    assert searched <= 45 + 30, f"the budget bounds the run once the API server is up: {searched:.0f}s"
    assert result.finding is not None and result.finding.invariant == "EXP-DRA-HEALTH", result.report.facts
    assert result.replayed == REPRODUCED


def test_the_reference_plugin_gives_no_finding(tmp_path: Path) -> None:
    """Every rule, the kubelet's own bounds: nothing to find in the reference plugin."""
    result, took = _explore(tmp_path, "reference-dp", None, 45, 2, None, None)
    assert result.finding is None, result.report.checks
    facts = result.report.facts["explore"]
    assert facts["examples"] >= 1 and facts["steps"] > 0 and "error" not in facts
    verdicts = {c.id: c.verdict for c in result.report.checks}
    assert set(verdicts.values()) <= {PASS, NOT_EXERCISED} and PASS in verdicts.values()
    assert took <= 45 + 30  # the budget, and the teardown of the example it ended in


# -- the full table (FAKELET_EXPLORE=full, tox -e explore): docs/explore.md --------------------------------------

# (subject, defect, rules or None for every rule, budget s, found?): mutants whose defect an invariant can see, with
# every rule the subject observes; benign behaviours under the kubelet's own bounds. What no invariant sees (an
# Allocate answer the kubelet and runtime accept, NUMA, ...) is the checks' job, listed in docs/explore.md as not
# found.
TABLE = [
    *[("reference-dp", d, None, 150, True) for d in (
        "no-reregister", "stuck-unhealthy", "no-hotplug", "ignore-temperature", "missing-device", "close-stream",
        "partial-list", "slow-health", "wrong-version", "no-socket-recreate", "stale-socket-crash",
        "give-up-on-reject", "no-wait-for-kubelet")],
    *[("reference-dp", d, None, 150, False) for d in ("slow-reregister", "empty-first-list", "repeat-lists", None)],
    ("reference-dra", "forgets-after-restart", ("pod-admitted", "plugin-restart", "pod-deleted"), 150, True),
    # The DRA mutants explore found with every rule in 120 s (docs/explore.md, rows marked §).
    *[("reference-dra", d, None, 150, True) for d in (
        "no-health", "split-health-socket", "health-silent", "wrong-endpoint", "getinfo-slow", "getinfo-hang",
        "bad-driver-name", "unserved-version", "bad-slice", "one-kubelet-only", "single-stream", "stale-health",
        "stale-socket-crash", "no-hotplug", "dies-mid-prepare", "prepare-hang", "wrong-cdi-id", "taint-never-cleared",
        "leaves-cdi-after-eviction", "unprepare-fails-after-eviction", "unprepare-hang")],
    ("reference-dra", None, None, 150, False),
]


@pytest.mark.slow
@pytest.mark.skipif(not FULL, reason="the full explore table: FAKELET_EXPLORE=full (tox -e explore)")
@pytest.mark.parametrize(("subject", "defect", "rules", "budget", "found"), TABLE,
                         ids=[f"{s}-{d or 'reference'}" for s, d, *_ in TABLE])
def test_explore_table(tmp_path: Path, subject: str, defect: str | None, rules: tuple[str, ...] | None,
                       budget: float, found: bool) -> None:
    result, took = _explore(tmp_path, subject, defect, budget, 1, rules, MUTANT_BOUND_S if found else None, 8)
    assert took <= budget + (90 if subject == "reference-dra" else 30)  # the teardown; a DRA API server's start
    if not found:
        assert result.finding is None, result.report.checks
        return
    assert result.finding is not None, result.report.facts
    assert result.replayed == REPRODUCED


# The multi-bug plugins (harness/reference/multibug.py): every bug reported, each under its invariant, and each
# replayed, within one budget (issue 38's kill rate). FAKELET_EXPLORE=full: the three-bug plugin alone takes 76 s.
@pytest.mark.slow
@pytest.mark.skipif(not FULL, reason="the multi-bug plugins: FAKELET_EXPLORE=full (tox -e explore)")
@pytest.mark.parametrize("plugin", MULTI_BUG, ids=[m.defect for m in MULTI_BUG])
def test_explore_reports_every_bug_of_a_multi_bug_plugin(tmp_path: Path, plugin: MultiBug) -> None:
    rules = tuple(dict.fromkeys(r for b in plugin.bugs for r in b.rules))
    result, _took = _explore(tmp_path, plugin.subject, plugin.defect, 240, 1, rules, MUTANT_BOUND_S, 8)
    confirmed = {k.finding.invariant for k in result.confirmed()}
    assert set(plugin.invariants().values()) <= confirmed, result.report.facts["explore"]


def test_ctrl_c_is_interrupted_and_leaves_nothing(tmp_path: Path) -> None:
    """SIGINT amid the examples: INTERRUPTED (exit 130), a report, and nothing of the run left: no sandbox under its
    TMPDIR, no process whose command line names it."""
    import shutil
    import signal
    import tempfile

    out = tmp_path / "report"
    scratch = Path(tempfile.mkdtemp(prefix="fx-", dir="/tmp"))  # short: sandbox socket paths have a length limit
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GRPC_VERBOSITY": "ERROR", "TMPDIR": str(scratch)}
    proc = subprocess.Popen([sys.executable, "-m", "harness.run.cli", "explore", "--budget", "5m", "--seed", "3",
                             "--out", str(out), "-v"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, cwd=ROOT)
    try:
        assert proc.stdout is not None
        seen = []
        for line in proc.stdout:  # an example has ended: the next one's node is being made and run
            seen.append(line)
            if line.startswith("example "):
                break
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=60)
        assert proc.returncode == 130, "".join(seen) + rest
        assert "INTERRUPTED" in (out / "summary.md").read_text()
        assert not list(scratch.iterdir()), f"left in TMPDIR: {list(scratch.iterdir())}"
        mine = []
        for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
            try:
                if str(scratch).encode() in cmdline.read_bytes():
                    mine.append(cmdline.parent.name)
            except OSError:
                continue
        assert not mine, f"processes of the run outlived it: {mine}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        shutil.rmtree(scratch, ignore_errors=True)
