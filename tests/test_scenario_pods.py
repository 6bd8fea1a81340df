"""The pod step's options (issue 35): `grace_period` on create (the Pod's terminationGracePeriodSeconds) and on
delete (the DeleteOptions' gracePeriodSeconds), `tolerations` (a DRA claim's device tolerations, a device-plugin
pod's own), and `timeout`, the bound of the step's wait, narrated while it runs. Each is checked when the file
loads (file:line), reaches the API server on the fake kubelet's node, and on the real kubelet where it runs here
(real_kubelet); a node that cannot honour one makes the run inconclusive with the reason."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import outcome_of, scenario_run

from harness.controlplane.base import RESOURCE_API
from harness.controlplane.client import ApiError
from harness.scenarios.check import check_file
from harness.scenarios.outcomes import Inconclusive, PodRecord
from harness.scenarios.schema import INCONCLUSIVE, NOT_REPRODUCED, loads
from harness.scenarios.stage import Stage
from harness.scenarios.step import Step
from harness.spec.profiles import FAST
from harness.spec.subjects import load_subject
from harness.world.draenv import DRAEnv

TOLERATION = {"key": "example.com/gpu-broken", "operator": "Exists", "effect": "NoExecute", "toleration_seconds": 30}
API_TOLERATION = {"key": "example.com/gpu-broken", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 30}
# The run's own reason when the real node cannot be had here (harness/scenarios/runner.py _environment): only then
# does a real-kubelet test skip; any other inconclusive outcome is a failure.
NO_REAL_NODE = ("the real kubelet cannot run here", "the real kubelet needs an API server")


def detail_of(report: dict[str, Any]) -> str:
    return str(report["checks"][0]["detail"]) if report.get("checks") else ""


def skip_without_real_node(report: dict[str, Any], output: str) -> None:
    """Skip, with the run's one-line reason, where no real node can run; never on any other outcome."""
    detail = detail_of(report).removeprefix(f"{INCONCLUSIVE}: ")
    if outcome_of(report) == INCONCLUSIVE and detail.startswith(NO_REAL_NODE):
        pytest.skip(detail.splitlines()[0])
    assert report, output


# -- checked when the file loads ------------------------------------------------------------------------------

BAD = """\
title: t
correct: c
bug: b
kind: {kind}
steps:
  - kubelet: start
  - pod: {{create: a, grace_period: -1}}
  - pod: {{create: b, grace_period: 1.5}}
  - pod: {{create: c, timeout: 0}}
  - pod: {{create: d, tolerations: [{{key: k, effect: PreferNoSchedule}}]}}
  - pod: {{create: e, tolerations: [{{key: k, effect: NoSchedule, toleration_seconds: 5}}]}}
  - pod: {{create: f, tolerations: [{{operator: Exists, value: x}}]}}
  - pod: {{create: g, tolerations: [{{key: "not a key"}}]}}
  - pod: {{create: h, tolerations: [{{effect: NoExecute}}]}}
  - pod: {{create: i, tolerations: [{{key: k, tolerationSeconds: 5}}]}}
  - pod: {{create: j, tolerations: []}}
  - pod: {{delete: a, tolerations: [{{key: k}}]}}
  - pod: {{delete: a, grace_period: 601}}
  - pod: {{create: k, grace_period: 0, timeout: 20s,
          tolerations: [{{key: example.com/k, operator: Exists, effect: NoExecute, toleration_seconds: 30}}]}}
  - pod: {{delete: k, grace_period: 0, timeout: 5}}
"""


def test_each_pod_option_is_checked_with_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(BAD.format(kind="dra"))
    _scenario, problems = check_file(path)
    expected = {
        7: "steps[1].pod.grace_period: a whole number of seconds from 0 to 600",
        8: "steps[2].pod.grace_period: a whole number of seconds from 0 to 600",
        9: "steps[3].pod.timeout: a positive duration up to 600s",
        10: "steps[4].pod.tolerations[0].effect: a device toleration's: one of NoSchedule, NoExecute",
        11: "steps[5].pod.tolerations[0].toleration_seconds: goes with effect: NoExecute",
        12: "steps[6].pod.tolerations[0].value: none with operator Exists",
        13: "steps[7].pod.tolerations[0].key: a label name",
        14: "steps[8].pod.tolerations[0].key: required unless operator is Exists",
        15: "steps[9].pod.tolerations[0].tolerationSeconds: unknown key; known: key, operator, value, effect, "
            "toleration_seconds",
        16: "steps[10].pod.tolerations: a list of 1 to 16 tolerations",
        17: "steps[11].pod.tolerations: unknown key; known: delete, grace_period, timeout",
        18: "steps[12].pod.grace_period: a whole number of seconds from 0 to 600",
    }
    for line, text in expected.items():
        assert any(p.startswith(f"{path}:{line}: {text}") for p in problems), (line, text, problems)
    assert len(problems) == len(expected), problems  # the last two steps are well formed
    # A device plugin's pod tolerates node taints: PreferNoSchedule is a pod toleration's effect.
    path.write_text(BAD.format(kind="device-plugin"))
    _scenario, problems = check_file(path)
    assert not any(p.startswith(f"{path}:10:") for p in problems), problems
    done = subprocess.run([sys.executable, "-m", "harness.run.cli", "scenario", "check", str(path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and f"{path}:7: steps[1].pod.grace_period" in done.stdout, done.stdout + done.stderr


def test_the_vocabulary_shows_the_pod_options() -> None:
    done = subprocess.run([sys.executable, "-m", "harness.run.cli", "scenario", "vocabulary", "pod"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    for key in ("grace_period", "tolerations", "timeout", "toleration_seconds", "terminationGracePeriodSeconds"):
        assert key in done.stdout, (key, done.stdout)


# -- on the fake kubelet's node, through the API server ---------------------------------------------------------

STEPS = """\
title: t
correct: c
bug: b
kind: dra
subject: reference-dra
steps:
  - kubelet: start
  - plugin: start
  - wait: {registered: true, slices: {devices: {at_least: 2}}}
  - pod: {create: tolerant, devices: 1, grace_period: 0, tolerations: [@TOLERATION@]}
  - pod: {create: plain, devices: 1}
  - pod: {delete: plain, grace_period: 0}
  - pod: {delete: tolerant}
  - pod: {create: plain, devices: 1, timeout: 2}
  - expect: {not: {pod: {name: plain, phase: Running}}}
""".replace("@TOLERATION@", json.dumps(TOLERATION))


@pytest.fixture
def unprepare_hangs(control_plane: Any) -> Iterator[tuple[DRAEnv, Stage, list[str]]]:
    """The reference driver whose NodeUnprepareResources never returns (as upstream's e2e test makes its driver
    fail it), on the fake kubelet: a pod still in the API server after its delete is held there by the kubelet."""
    env = DRAEnv(load_subject("reference-dra"), FAST, defect="unprepare-hang", control_plane=control_plane)
    said: list[str] = []
    stage = Stage(env, said.append)
    try:
        yield env, stage, said
    finally:
        stage.close()
        env.close()


def api_pod(env: DRAEnv, stage: Stage, name: str) -> dict[str, Any] | None:
    assert env.client is not None
    api = stage.pods[name].api
    assert api is not None
    try:
        return env.client.get(f"/api/v1/namespaces/{api['metadata']['namespace']}/pods/{api['metadata']['name']}")
    except ApiError as err:
        if err.status == 404:
            return None
        raise


def test_grace_period_tolerations_and_timeout_on_a_dra_pod(unprepare_hangs: tuple[DRAEnv, Stage, list[str]]) -> None:
    env, stage, said = unprepare_hangs
    steps = loads(STEPS, "pods.yaml").steps
    for step in steps[:5]:
        stage.run(step)
    # grace_period on create: the Pod's own terminationGracePeriodSeconds, 0 included (the node's default is 1).
    tolerant, plain = api_pod(env, stage, "tolerant"), api_pod(env, stage, "plain")
    assert tolerant is not None and plain is not None
    assert tolerant["spec"]["terminationGracePeriodSeconds"] == 0, tolerant["spec"]
    assert plain["spec"]["terminationGracePeriodSeconds"] == 1, plain["spec"]
    # tolerations: the claim's device request's, as resource.k8s.io/v1 writes them.
    (claim,) = stage.pods["tolerant"].claims
    assert env.client is not None
    live = env.client.get(f"{RESOURCE_API}/namespaces/{claim['metadata']['namespace']}/resourceclaims/"
                          f"{claim['metadata']['name']}")
    assert live["spec"]["devices"]["requests"][0]["exactly"]["tolerations"] == [API_TOLERATION], live["spec"]
    assert any("running with claim(s) on" in line and "of its 75 s bound" in line for line in said), said

    # grace_period 0 on delete deletes at once: the Pod is gone from the API server although the kubelet's
    # NodeUnprepareResources for its claim has not returned (with the pod's own grace period of 1 the kubelet
    # would hold it until it had).
    plain_uid = stage.pods["plain"].key
    stage.run(steps[5])
    assert api_pod(env, stage, "plain") is None
    assert not env.timeline.find(lambda e: e.kind == "dra.pod_unprepared" and e.get("pod_uid") == plain_uid)
    assert any(line.endswith("bound)") and "pod plain deleted with grace period 0 s" in line for line in said), said
    # A plain delete of the pod made with grace period 0: the same, by the pod's own grace period.
    stage.run(steps[6])
    assert api_pod(env, stage, "tolerant") is None

    # Made again under its old names while its old claim is still prepared: the kubelet refuses it (manager.go's
    # UID check), and the step gives up at its own 2 s bound, saying so.
    old_name = stage.pods["plain"].api["metadata"]["name"]  # type: ignore[index]
    stage.run(steps[7])
    again = stage.pods["plain"]
    assert again.api is not None and again.api["metadata"]["name"] == old_name and again.key != plain_uid
    assert again.created.startswith("gave up waiting for it to run within 2 s"), again.created
    assert any("pod plain: gave up waiting for it to run within 2 s" in line for line in said), said


def test_a_pod_wait_past_its_timeout_is_inconclusive_and_narrated_while_it_runs(tmp_path: Path) -> None:
    """A delete the kubelet cannot finish (its unprepare never returns) within the step's own timeout: the case is
    inconclusive with that bound named, and the wait said how long it had taken every 10 s."""
    path = tmp_path / "held.yaml"
    path.write_text("""\
title: a deletion the kubelet holds
correct: c
bug: b
kind: dra
subject: reference-dra
defect: unprepare-hang
steps:
  - kubelet: start
  - plugin: start
  - wait: {registered: true, slices: {devices: {at_least: 1}}}
  - pod: {create: p, devices: 1}
  - pod: {delete: p, timeout: 12}
  - expect: {pod: {name: p, phase: Deleted}}
""")
    code, output, report = scenario_run(tmp_path / "out", path)
    assert code == 3 and outcome_of(report) == INCONCLUSIVE, output
    assert "pod p deleted and not gone from the API server within 12 s (the step's bound)" in detail_of(report), \
        detail_of(report)
    assert "waiting for pod p to be gone: 10 s of 12 s" in output, output
    assert "REPRODUCED" not in output, output


def test_a_fake_device_plugin_pod_cannot_take_a_grace_period(tmp_path: Path) -> None:
    """The fake kubelet's device-plugin pods are no Pod objects: the option is not dropped, the run says why."""
    path = tmp_path / "dp.yaml"
    path.write_text("""\
title: t
correct: c
bug: b
kind: device-plugin
subject: reference-dp
steps:
  - kubelet: start
  - plugin: start
  - wait: {registered: true, allocatable: all}
  - pod: {create: p, devices: 1, grace_period: 0}
  - expect: {pod: {name: p, phase: Running}}
""")
    code, output, report = scenario_run(tmp_path / "out", path)
    assert code == 3 and outcome_of(report) == INCONCLUSIVE, output
    detail = detail_of(report)
    assert f"{path}:10: steps[3]: pod p: grace_period cannot be honoured here" in detail, detail
    assert "--node real" in detail and len(detail.removeprefix(f"{INCONCLUSIVE}: ").splitlines()) == 1, detail


def test_a_pod_made_again_needs_its_old_delete() -> None:
    stage: Any = Stage.__new__(Stage)  # no world: the step refuses before it reaches one
    stage.pods = {"p": PodRecord("p", "uid", 1, "Running")}
    with pytest.raises(Inconclusive, match="exists already"):
        stage._do_pod(Step("pod", {"create": "p"}, {}, "x.yaml:3: steps[0]", 0))


# -- on the real kubelet --------------------------------------------------------------------------------------

REAL_DRA = """\
title: a DRA pod with grace period 0 on the real kubelet
correct: it leaves the API server at once when deleted, though its claim's unprepare never returns
bug: it stays
kind: dra
subject: reference-dra
defect: unprepare-hang
nodes: [fake, real]
steps:
  - kubelet: start
  - plugin: start
  - wait: {registered: true, slices: {devices: {at_least: 2}}}
  - pod: {create: zero, devices: 1, grace_period: 0, tolerations: [@TOLERATION@]}
  - pod: {create: one, devices: 1}
  - wait: {pod: {name: zero, phase: Running}}
  - wait: {pod: {name: one, phase: Running}}
  # Each pod's own device: a pod made after a deletion could be given the device of a claim the driver still
  # holds prepared (it refuses that, rightly).
  - pod: {delete: zero, timeout: 30}
  - pod: {delete: one, grace_period: 0, timeout: 30}
  - expect: {pod: {name: zero, phase: Deleted}}
""".replace("@TOLERATION@", json.dumps(TOLERATION))


@pytest.mark.real_kubelet
def test_grace_period_on_a_dra_pod_of_the_real_kubelet(tmp_path: Path) -> None:
    """On the real kubelet, whose unprepare of the claim never returns (the driver's defect), a pod leaves the API
    server within the step's 30 s only by its grace period of 0, its own (create) or its delete's."""
    path = tmp_path / "dra.yaml"
    path.write_text(REAL_DRA)
    code, output, report = scenario_run(tmp_path / "out", path, "--node", "real")
    skip_without_real_node(report, output)
    assert code == 0 and outcome_of(report) == NOT_REPRODUCED, output
    assert "pod zero deleted (gone from the API server" in output, output
    assert "pod one deleted with grace period 0 s (gone from the API server" in output, output


REAL_DP = """\
title: a device-plugin pod's grace period and tolerations on the real kubelet
correct: the pod runs with them and leaves at once when deleted with grace period 0
bug: it does not
kind: device-plugin
subject: reference-dp
nodes: [fake, real]
steps:
  - kubelet: start
  - plugin: start
  - wait: {registered: true, allocatable: all}
  - pod: {create: p, devices: 1, grace_period: 5, tolerations: [{key: example.com/maintenance, operator: Exists}],
          timeout: 90}
  - expect: {pod: {name: p, phase: Running}}
  - pod: {delete: p, grace_period: 0, timeout: 30}
  - expect: {pod: {name: p, phase: Deleted}}
"""


@pytest.mark.real_kubelet
def test_grace_period_and_tolerations_on_a_device_plugin_pod_of_the_real_kubelet(tmp_path: Path) -> None:
    path = tmp_path / "dp.yaml"
    path.write_text(REAL_DP)
    code, output, report = scenario_run(tmp_path / "out", path, "--node", "real")
    skip_without_real_node(report, output)
    assert code == 0 and outcome_of(report) == NOT_REPRODUCED, output
    assert "pod p deleted with grace period 0 s (gone from the API server" in output, output
