"""`fakelet explore --node real` and `--replay-on real` (harness/explore/nodes.py).

The flags and what the real node leaves out are checked in seconds. The explorations on the real kubelet
(`real_kubelet`) run only under FAKELET_EXPLORE=full (tox -e explore): each costs a real node per example
and a minute or two, which the default real-kubelet env has no time for.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from harness.explore import nodes
from harness.explore.model import DRA, Model
from harness.explore.rules import RULES, applicable, context_of
from harness.scenarios.schema import NOT_REPRODUCED, REPRODUCED
from harness.spec.subjects import load_subject
from reports.model import FAIL, CheckResult, SubjectReport

ROOT = Path(__file__).resolve().parents[1]
FULL = os.environ.get("FAKELET_EXPLORE") == "full"
# A mutant that never re-registers is caught after the reaction bound (tests/test_explore.py MUTANT_BOUND_S).
MUTANT_BOUND_S = 5.0
BUDGET_S = 45
RUN_TIMEOUT_S = 600  # the budget, the replays, a real node's start on a loaded machine (a cold build: the fixture)


def _cli(out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GRPC_VERBOSITY": "ERROR"}
    return subprocess.run([sys.executable, "-m", "harness.run.cli", "explore", *args, "--out", str(out)],
                          capture_output=True, text=True, env=env, timeout=RUN_TIMEOUT_S, cwd=ROOT)


# -- flags and rules (no subject runs) --------------------------------------------------------------------------


def test_a_bad_node_is_one_line_and_exit_2(tmp_path: Path) -> None:
    out = tmp_path / "report"
    done = _cli(out, "--node", "moon")
    assert done.returncode == 2, done
    assert done.stderr.strip().splitlines() == ["fakelet: error: --node 'moon': one of fake, real"], done.stderr
    assert not out.exists()


@pytest.mark.parametrize(("node", "replay_on", "says"), [
    ("fake", "moon", "--replay-on 'moon': one of fake, real"),
    ("fake", "fake", "--replay-on fake: the findings of --node fake are replayed on the fake kubelet already"),
])
def test_bad_replay_targets_are_refused(node: str, replay_on: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        nodes.check_flags(node, replay_on)


@pytest.mark.parametrize(("node", "replay_on", "flag"), [("real", None, "--node"), ("fake", "real", "--replay-on")])
def test_a_machine_without_the_real_kubelet_is_refused_in_one_line(monkeypatch: pytest.MonkeyPatch, node: str,
                                                                   replay_on: str | None, flag: str) -> None:
    from harness.config.runconfig import RunConfig
    from harness.node.real import localnode

    monkeypatch.setattr(localnode, "unavailable", lambda: "the real kubelet needs root")
    run = RunConfig.build(subject="reference-dp", node=node)
    with pytest.raises(ValueError, match=f"^{flag} real: the real kubelet cannot run here: the real kubelet needs "
                                         "root$"):
        nodes.check_machine(run, replay_on)
    nodes.check_machine(RunConfig.build(subject="reference-dp"), None)  # the fake node alone needs nothing


def test_the_real_node_leaves_out_the_rules_it_cannot_carry_out() -> None:
    rules = applicable(context_of(load_subject("reference-dra")))
    said: list[str] = []
    left = nodes.runnable(rules, nodes.REAL, said.append)
    assert {r.name for r in rules} - {r.name for r in left} == {"health-stream-drop"}
    assert said == ["explore: not run on the real kubelet: health-stream-drop (kubelet: drop-health-stream: only "
                    "the fake kubelet's NodeWatchResources streams are in fakelet's reach)"]
    assert nodes.runnable(rules, nodes.FAKE, said.append) == rules and len(said) == 1
    with pytest.raises(ValueError, match="none of them runs on the real kubelet: health-stream-drop"):
        nodes.check_rules([RULES["health-stream-drop"]], nodes.REAL)


def test_each_fake_only_rule_takes_the_step_the_real_node_refuses() -> None:
    for name, (action, arg) in nodes.FAKE_ONLY_RULES.items():
        steps = RULES[name].act(Model(DRA, [], kubelet_up=True, plugin_up=True), context_of(
            load_subject("reference-dra")), lambda options: next(iter(options)))
        assert {action: arg} in steps
        assert nodes.scenario_nodes([{"kubelet": "start"}, *steps]) == ["fake"]
    assert nodes.scenario_nodes([{"kubelet": "start"}, {"kubelet": "restart"}]) == ["fake", "real"]


def test_the_other_kubelets_replay_is_recorded_beside_the_first() -> None:
    report = SubjectReport(subject="reference-dp", profile="fast", seed=1, duration_s=10.0)
    report.facts["explore"] = {"findings": [{"repro": "repro/explore-x.yaml", "replay": REPRODUCED}]}
    report.checks.append(CheckResult(id="EXP-DP-REGISTERED", level="MUST", title="t", verdict=FAIL, duration_s=1.0,
                                     notes=["a"]))
    nodes.record(report, nodes.NodeReplay(nodes.REAL, NOT_REPRODUCED, "every expectation held", ["l1", "l2"], 5.0),
                 "repro/explore-x.yaml", "EXP-DP-REGISTERED")
    facts = report.facts["explore"]
    assert facts["replay_on_real"] == {"repro/explore-x.yaml": "not reproduced on the real kubelet"}
    assert facts["findings"][0]["replay_on_real"] == "not reproduced on the real kubelet"
    assert report.checks[0].notes == ["a", "replay of repro/explore-x.yaml on the real kubelet: not reproduced on "
                                           "the real kubelet",
                                      "timeline of the replay on the real kubelet:", "l1", "l2"]
    assert report.checks[0].verdict == FAIL and report.duration_s == 15.0


# -- on the real kubelet (FAKELET_EXPLORE=full) ------------------------------------------------------------------


@pytest.fixture
def real_kubelet() -> None:
    """Skips, in one line, where the real kubelet cannot run or be built; builds it out of the test's time."""
    if not FULL:
        pytest.skip("explore on the real kubelet runs under FAKELET_EXPLORE=full (tox -e explore)")
    from harness.controlplane import ControlPlaneUnavailable
    from harness.node.real.localnode import find_kubelet, unavailable

    why = unavailable()
    if why:
        pytest.skip(f"real kubelet: {why}")
    try:
        find_kubelet()
    except ControlPlaneUnavailable as err:
        pytest.skip(str(err).splitlines()[0])


def _finding(out: Path, done: subprocess.CompletedProcess[str]) -> tuple[dict, CheckResult | dict]:
    assert (out / "report.json").exists(), done.stdout + done.stderr
    report = json.loads((out / "report.json").read_text())
    failed = [c for c in report["checks"] if c["verdict"] == FAIL]
    assert [c["id"] for c in failed] == ["EXP-DP-REGISTERED"], done.stdout + done.stderr
    return report, failed[0]


@pytest.mark.real_kubelet
def test_explore_on_the_real_kubelet_finds_the_mutant_and_replays_it_there(tmp_path: Path, real_kubelet: None) -> None:
    """no-reregister on the real kubelet: the first kubelet restart leaves it unregistered; found, and replayed
    on a fresh real node as reproduced. The repro file runs on both kubelets; its replay line names the real."""
    out = tmp_path / "report"
    began = time.monotonic()
    done = _cli(out, "--subject", "reference-dp", "--defect", "no-reregister", "--node", "real", "--rules",
                "kubelet-restart", "--reaction-bound", f"{MUTANT_BOUND_S:g}", "--budget", f"{BUDGET_S}s", "--seed", "1")
    took = time.monotonic() - began
    report, check = _finding(out, done)
    assert done.returncode == 1 and report["node"] == "real", done.stdout + done.stderr
    facts = report["facts"]["explore"]
    assert facts["replay"] == REPRODUCED and "error" not in facts, facts
    assert "--node real" in check["repro"] and "--reaction-bound 5" in check["repro"]
    doc = yaml.safe_load((out / facts["repro"]).read_text())
    assert doc["nodes"] == ["fake", "real"]
    assert took < BUDGET_S + 120, f"the budget, the replay and the API server's start bound it: {took:.0f}s"


@pytest.mark.real_kubelet
def test_a_finding_on_the_fake_node_is_replayed_on_the_real_kubelet(tmp_path: Path, real_kubelet: None) -> None:
    """The same mutant found on the fake kubelet, and its repro reproduced on the real one: the plugin's bug."""
    out = tmp_path / "report"
    done = _cli(out, "--subject", "reference-dp", "--defect", "no-reregister", "--replay-on", "real", "--rules",
                "kubelet-restart", "--reaction-bound", f"{MUTANT_BOUND_S:g}", "--budget", f"{BUDGET_S}s", "--seed", "1")
    report, check = _finding(out, done)
    facts = report["facts"]["explore"]
    assert report["node"] == "fake" and facts["replay"] == REPRODUCED, facts
    [note] = facts["replay_on_real"].values()
    assert note.startswith(f"{REPRODUCED} on the real kubelet: "), facts
    assert "on the real kubelet: reproduced on the real kubelet" in "\n".join(check["notes"])
    assert facts["findings"][0]["replay_on_real"] == note
    assert "on the real kubelet: reproduced on the real kubelet" in done.stdout
