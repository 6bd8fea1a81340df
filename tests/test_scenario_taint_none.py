"""A DeviceTaintRule of effect None, and the taints condition's `from:` (issue 35).

None (k8s.io/api resource/v1 DeviceTaintEffectNone, accepted by API servers from 1.35) only informs: the
device-taint eviction controller evicts nothing for it and posts on the rule what a NoExecute one would evict,
which the taint step waits for and narrates. `taints: {..., from: driver | rules | both}` counts the driver's
published taints (the default), DeviceTaintRules', or both. One scenario on the fake kubelet with the real
kube-controller-manager of the local control plane shows both."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import one_step_scenario, timeline_of
from test_scenario_taints_sockets import kept_on

from harness.scenarios.check import check_file
from harness.scenarios.schema import loads
from harness.spec.subjects import ProfileError


def test_a_none_taint_and_the_sources_of_taints_load() -> None:
    loads(one_step_scenario("taint: {device: gpu-0, effect: None, key: example.com/notice}", "dra"), "x.yaml")
    loads(one_step_scenario("expect: {taints: {only: [], from: both}}", "dra"), "x.yaml")
    loads(one_step_scenario("expect: {taints: {no_execute: ['@0'], from: rules}}", "dra"), "x.yaml")


@pytest.mark.parametrize(("step", "where", "says"), [
    ("taint: {device: gpu-0, effect: none}", "steps[2].taint.effect", "one of NoExecute, NoSchedule, None"),
    ("expect: {taints: {from: both}}", "steps[2].expect.taints",
     "only: [DEV, ...] and no_execute: [DEV, ...], or both"),
    ("expect: {taints: {only: [], from: admin}}", "steps[2].expect.taints.from", "one of driver, rules, both"),
])
def test_a_mistake_names_file_line_and_field(step: str, where: str, says: str) -> None:
    with pytest.raises(ProfileError) as err:
        loads(one_step_scenario(step, "dra"), "x.yaml")
    assert str(err.value) == f"x.yaml:8: {where}: {says}", str(err.value)


def test_check_takes_a_none_taint_for_every_release_fakelet_runs(tmp_path: Path) -> None:
    """The API server, not the kubelet, accepts None, and every node's is the local control plane's (1.36.3,
    node/real/releases.py: "The control plane always comes from the default module"): no kubelet release makes
    a None taint a problem before the run."""
    cases = ("nodes: [fake, real]\ncases:\n  - {kubelet_version: \"1.33\", verdict: not reproduced}\n"
             "  - {node: real, kubelet_version: \"1.37\", verdict: not reproduced}\n")
    text = one_step_scenario("taint: {device: gpu-0, effect: None}", "dra")
    text = text.replace("kind: dra\n", "kind: dra\n" + cases)
    path = tmp_path / "x.yaml"
    path.write_text(text)
    _scenario, problems = check_file(path)
    assert problems == [], problems


NONE_THEN_SOURCES = """\
title: a None DeviceTaintRule only informs
correct: a None taint on the device of a running pod evicts nothing; the taints condition counts rules with from
bug: the pod is evicted, or a rule's taint is not seen
kind: dra
subject: reference-dra
steps:
  - kubelet: start
  - plugin: start
  - wait: {registered: true, slices: {devices: all}}
  - pod: {create: workload, devices: 1}
  - wait: {pod: {name: workload, phase: Running}, checkpoint: {claims: 1, devices: 1}}
  - taint: {name: notice, device: "@pod:workload", effect: None, key: example.com/notice}
  # The step returned once the eviction controller had posted on the rule: it saw it, and evicted nothing.
  - expect: {pod: {name: workload, phase: Running}, checkpoint: {claims: 1, devices: 1},
             taints: {only: [], from: both}}
    throughout: 3s
  - taint: {name: hold-off, device: "@pod:workload", effect: NoSchedule, key: example.com/hold-off}
  - expect: {taints: {only: ["@pod:workload"], no_execute: [], from: rules}}
  - expect: {taints: {only: []}}
  - expect: {not: {taints: {only: [], from: both}}}
  # The same controller evicts for NoExecute: the None rule's calm was not a controller that never acts.
  - taint: {name: evict, device: "@pod:workload", effect: NoExecute}
  - expect: {checkpoint: {claims: 0, devices: 0}}
"""


def test_a_none_taint_evicts_nothing_and_taints_from_rules_are_counted(tmp_path: Path) -> None:
    out, output = kept_on(tmp_path, NONE_THEN_SOURCES, "fake")
    assert "1 pod would be evicted in 1 namespace if the effect was NoExecute" in output, output
    assert "DeviceTaintRules' taints on gpu-" in output and "the driver's taints on no device" in output, output
    timeline = timeline_of(out)
    added = {e["data"]["effect"]: e["t_ns"] for e in timeline if e["kind"] == "fault.taint_added"}
    (status,) = [e for e in timeline if e["kind"] == "api.taint_rule_status"]
    assert status["data"]["reason"] == "NoEffect" and status["data"]["rule"].endswith("-notice"), status
    assert added["None"] < status["t_ns"] < added["NoSchedule"]
    killed = [e["t_ns"] for e in timeline if e["kind"] == "pod.killing"]
    assert len(killed) == 1 and killed[0] > added["NoExecute"], (killed, added)
