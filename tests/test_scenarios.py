"""The scenario library (fixtures/scenarios): each file loads, each promised verdict holds on the
fake kubelet (and on the real one where the real node runs), the step vocabulary reports mistakes
with file, line and field, and a failed check's repro file replays."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from harness.scenarios.library import all_scenarios
from harness.scenarios.schema import INCONCLUSIVE, NOT_REPRODUCED, REPRODUCED, Case, loads
from harness.spec.subjects import ProfileError, all_subjects, load_subject

RUN_TIMEOUT_S = 600
LIBRARY = all_scenarios()
SUBJECTS = {s.name: s for s in all_subjects()}
# A subject named in a scenario's notes, as a suggestion to the reader (`--subject NAME`).
SUGGESTED = re.compile(r"--subject[ =]([A-Za-z0-9][A-Za-z0-9-]*)")


def built(name: str, case: Case) -> bool:
    """Whether the case's subject is built from the Go module proxy (or PyPI): then it runs in `tox -e subjects`."""
    spec = SUBJECTS.get(case.subject or next(s.subject for s in LIBRARY if s.name == name) or "")
    return spec is not None and spec.build is not None


def case_param(name: str, case: Case) -> object:
    marks = [pytest.mark.subjects] if built(name, case) else []
    return pytest.param(name, case, marks=marks, id=case_id(name, case))


FAKE_CASES = [(s.name, c) for s in LIBRARY for c in s.cases if c.node == "fake"]
REAL_CASES = [(s.name, c) for s in LIBRARY for c in s.cases if c.node == "real"]


def scenario_run(out: Path, *args: str) -> tuple[int, str, dict]:
    proc = subprocess.run([sys.executable, "-m", "harness.run.cli", "scenario", "run", *args, "--out", str(out)],
                          capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    report = json.loads((out / "report.json").read_text()) if (out / "report.json").exists() else {}
    return proc.returncode, proc.stdout + proc.stderr, report


def outcome_of(report: dict) -> str | None:
    return (report.get("facts") or {}).get("scenario", {}).get("outcome")


def test_the_library_has_ten_reports_each_with_its_link_and_both_sides():
    assert len(LIBRARY) >= 10
    subjects = {s.name: s for s in all_subjects()}
    for scenario in LIBRARY:
        assert scenario.upstream.startswith("https://github.com/"), scenario.name
        assert scenario.cases, f"{scenario.name}: no promised verdict"
        for case in scenario.cases:
            name = case.subject or scenario.subject
            assert name in subjects, (scenario.name, name)
            assert case.defect is None or case.defect in subjects[name].defects, (scenario.name, case.defect)
            assert subjects[name].kind == scenario.kind, (scenario.name, name)
    assert sum(REPRODUCED in {c.verdict for c in s.cases} for s in LIBRARY) >= 5
    # Each shows the correct side too, unless nothing can: a report no release fixes (real: affected, no fixed)
    # about what no subject changes (dra-empty-taint-selector-evicts-every-pod: the API as specified).
    assert all(NOT_REPRODUCED in {c.verdict for c in s.cases} or (s.affected and not s.fixed
                                                                  and {c.verdict for c in s.cases} == {REPRODUCED})
               for s in LIBRARY), "each shows the correct side too"


MUTANT_REACTION_BOUND_S = "4"  # as the kill matrix's: a plugin that never reacts is caught in seconds


def case_args(name: str, case: Case) -> list[str]:
    # A reproduction waits its bound out; the correct side is held to the kubelet's own 30 s.
    bound = ["--reaction-bound", MUTANT_REACTION_BOUND_S] if case.verdict == REPRODUCED and case.node == "fake" else []
    return [name, *bound, *(["--subject", case.subject] if case.subject else []),
            *(["--defect", case.defect] if case.defect else []),
            *(["--kubelet-version", case.kubelet_version] if case.kubelet_version else []),
            *(["--node", case.node] if case.node != "fake" else [])]


def case_id(name: str, case: Case) -> str:
    parts = [name, case.subject or "default", case.defect or "reference", case.kubelet_version or ""]
    return "-".join(p for p in parts if p)


# A scenario whose fake cases need no subject built from the Go module proxy runs as a user runs it, all its
# cases in one command; the others case by case, those of built subjects in `tox -e subjects`.
MIXED = {name for name, case in FAKE_CASES if built(name, case)}
FAKE_SCENARIOS = sorted({name for name, _case in FAKE_CASES} - MIXED)


@pytest.mark.parametrize("name", FAKE_SCENARIOS)
def test_each_scenario_keeps_its_promises_on_the_fake_kubelet(tmp_path, name):
    # What a user runs (`fakelet scenario run NAME --case all`), once per scenario: its fake cases, each its own
    # run, reproductions under the mutants' bound, reported against their promises in one table.
    proc = subprocess.run([sys.executable, "-m", "harness.run.cli", "scenario", "run", name, "--case", "all",
                           "--node", "fake", "--reaction-bound", MUTANT_REACTION_BOUND_S,
                           "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=RUN_TIMEOUT_S * 3)
    output = proc.stdout + proc.stderr
    table = json.loads((tmp_path / "out" / "cases.json").read_text())["cases"]
    promised = [c for n, c in FAKE_CASES if n == name]
    assert [(r["promised"]) for r in table] == [c.verdict for c in promised], output
    for row in table:
        # Skipped only for a part this machine lacks (an API server), with the reason; never passed.
        assert row["status"] == "kept" or (row["status"] == "skipped" and row["why"]), (row, output)
    assert proc.returncode == (3 if any(r["status"] == "skipped" for r in table) else 0), output
    kept = sum(r["status"] == "kept" for r in table)
    assert "promised cases" in output and f"promises: {kept} kept, 0 broken" in output, output


def test_every_subject_a_scenario_names_or_suggests_has_a_case_ci_runs():
    # dra-cdi-gone-after-reboot suggested --subject dra-example-driver in its notes, and that run ended in a
    # harness error every time: nothing ran it.
    for scenario in LIBRARY:
        named = {c.subject or scenario.subject for c in scenario.cases}
        for subject in {scenario.subject, *SUGGESTED.findall(scenario.notes)} - {None}:
            assert subject in SUBJECTS, (scenario.name, subject)
            assert subject in named, f"{scenario.name}: {subject} is named or suggested, but no case runs it"


@pytest.mark.parametrize(("name", "case"), [case_param(n, c) for n, c in FAKE_CASES if n in MIXED])
def test_each_scenario_gives_its_verdict_on_the_fake_kubelet(tmp_path, name, case):
    args = case_args(name, case)
    code, output, report = scenario_run(tmp_path / "out", *args)
    got = outcome_of(report)
    if got == INCONCLUSIVE and report["checks"][0].get("install"):
        pytest.skip(report["checks"][0]["detail"].splitlines()[0])  # a part that cannot run here (an API server)
    assert got == case.verdict, output
    assert code == {REPRODUCED: 1, NOT_REPRODUCED: 0}[case.verdict], output
    assert f"verdict: {case.verdict.upper()}" in output


@pytest.mark.real_kubelet
@pytest.mark.parametrize(("name", "case"), [case_param(n, c) for n, c in REAL_CASES])
def test_each_scenario_gives_its_verdict_on_the_real_kubelet(tmp_path, name, case):
    # The kubelet is built here, under the build's own bound, so that the run's timeout is the run's: a cold
    # v1.37 build took more than the 600 s beside a CPU hog, with both of its cases waiting on it.
    from harness.controlplane import ControlPlaneUnavailable
    from harness.node.real.localnode import find_kubelet

    try:
        find_kubelet(case.kubelet_version)
    except ControlPlaneUnavailable as err:
        pytest.skip(str(err).splitlines()[0])
    _code, output, report = scenario_run(tmp_path / "out", *case_args(name, case))
    got = outcome_of(report)
    if got == INCONCLUSIVE:
        pytest.skip(report["checks"][0]["detail"].splitlines()[0])
    assert got == case.verdict, output


WRITTEN_BY_HAND = """\
title: the plugin comes back after a kubelet outage
correct: the plugin registers again when the kubelet returns
bug: allocatable stays 0
kind: device-plugin
steps:
  - kubelet: start
  - plugin: start
  - wait: {registered: true}
  - kubelet: stop
  - hold: 500ms
  - kubelet: start
  - expect: {registered: true, allocatable: all}
    within: 30s
"""


def test_a_scenario_written_from_the_vocabulary_alone_runs(tmp_path):
    path = tmp_path / "my-outage.yaml"
    path.write_text(WRITTEN_BY_HAND)
    code, output, report = scenario_run(tmp_path / "out", "--file", str(path), "--repeat", "2")
    assert code == 0 and outcome_of(report) == NOT_REPRODUCED, output
    assert "holding 0.5s" in output and "kubelet started" in output
    assert report["facts"]["scenario"]["runs"] == 2 and "0 of 2 runs reproduced it" in output


CRASH_RUNS = 3
CRASH_DURING_ALLOCATE = """\
title: the plugin crashes as the kubelet sends Allocate
correct: the pod is refused, the plugin comes back, and the next pod gets its device
bug: the plugin does not come back
kind: device-plugin
steps:
  - kubelet: start
  - plugin: start
  - wait: {registered: true, allocatable: all}
  - plugin: crash
    during: Allocate
  - pod: {create: first, devices: 1}
  - expect: {pod: {name: first, phase: Failed, reason: UnexpectedAdmissionError}}
  - expect: {registered: true, allocatable: all}
  - pod: {create: second, devices: 1}
  - expect: {pod: {name: second, phase: Running}}
"""


def test_a_crash_during_a_call_fails_that_pod_and_the_plugin_comes_back(tmp_path):
    path = tmp_path / "crash.yaml"
    path.write_text(CRASH_DURING_ALLOCATE)
    # Repeated: the old fault (a SIGKILL sent, not yet landed, as the request went out) let the plugin
    # answer first in 2 of 8 runs at a load of 15 on 2 cores.
    code, output, report = scenario_run(tmp_path / "out", "--file", str(path), "--repeat", str(CRASH_RUNS))
    assert code == 0 and outcome_of(report) == NOT_REPRODUCED, output
    assert "killed and started again as the kubelet sends its next Allocate" in output
    runs = sorted((tmp_path / "out").rglob("run-*/timeline.json"))
    assert len(runs) == CRASH_RUNS, runs
    for run in runs:
        timeline = json.loads(run.read_text())
        assert [e["data"]["method"] for e in timeline if e["kind"] == "fault.crash_during"] == ["Allocate"], run
        # Killed before the request went out: the first Allocate never gets the plugin's answer.
        allocates = [e["data"] for e in timeline if e["kind"] == "grpc.call" and e["data"].get("method") == "Allocate"]
        assert allocates and allocates[0]["outcome"] != "OK", (run, allocates[:1])


POD_WHILE_KUBELET_DOWN = """\
title: a pod bound while the kubelet is down runs when it comes back
correct: the kubelet prepares the claim and runs the pod when it starts
bug: the pod never runs
kind: dra
steps:
  - kubelet: start
  - plugin: start
  - wait: {registered: true, slices: {devices: {at_least: 1}}}
  - kubelet: stop
  - pod: {create: late, devices: 1}
  - kubelet: start
  - expect: {pod: {name: late, phase: Running}, cdi: {pod: late, present: true}}
    within: 60s
  - expect: {calls: {method: NodePrepareResources, count: {at_least: 1}}}
"""


def test_a_dra_pod_bound_while_the_kubelet_is_down_runs_when_it_starts(tmp_path):
    path = tmp_path / "late.yaml"
    path.write_text(POD_WHILE_KUBELET_DOWN)
    code, output, report = scenario_run(tmp_path / "out", "--file", str(path))
    if outcome_of(report) == INCONCLUSIVE and report["checks"][0].get("install"):
        pytest.skip(report["checks"][0]["detail"].splitlines()[0])
    assert code == 0 and outcome_of(report) == NOT_REPRODUCED, output
    assert "while the kubelet is down" in output


@pytest.mark.parametrize(("text", "where"), [
    (WRITTEN_BY_HAND.replace("kind: device-plugin", "kind: gpu"), "x.yaml:4: kind"),
    (WRITTEN_BY_HAND.replace("  - hold: 500ms", "  - hold: forever"), "x.yaml:10: steps[4].hold"),
    (WRITTEN_BY_HAND.replace("{registered: true}\n", "{registred: true}\n"), "x.yaml:8: steps[2].wait.registred"),
    (WRITTEN_BY_HAND.replace("  - kubelet: stop", "  - kubelet: reboot\n    checkpoint: eaten"),
     "x.yaml:10: steps[3].checkpoint"),
    (WRITTEN_BY_HAND.replace("  - kubelet: stop", "  - kubelet: stop\n    plugin: stop"), "x.yaml:9: steps[3]"),
    (WRITTEN_BY_HAND.replace("within: 30s", "within: 30 parsecs"), "x.yaml:13: steps[6].within"),
    # A field the step lacks is placed at its step's line.
    (WRITTEN_BY_HAND.replace("  - hold: 500ms", "  - device: {heat: '@0'}"), "x.yaml:10: steps[4].device.to"),
    (WRITTEN_BY_HAND.replace("kind: device-plugin", "kind: device-plugin\nsoup: 1"), "x.yaml:5: soup"),
    (WRITTEN_BY_HAND.replace("  - expect: {registered: true, allocatable: all}\n    within: 30s\n", ""),
     "x.yaml:5: steps"),
])
def test_mistakes_name_file_line_and_field(text, where):
    with pytest.raises(ProfileError) as err:
        loads(text, "x.yaml")
    assert str(err.value).startswith(where), str(err.value)


@pytest.mark.parametrize("args", [["no-such-scenario"], [], ["dp-checkpoint-lost-reboot", "--repeat", "0"],
                                  ["dp-checkpoint-lost-reboot", "--subject", "reference-dra"],
                                  ["dp-checkpoint-lost-reboot", "--file", "x.yaml"],
                                  ["dp-checkpoint-lost-reboot", "--node", "real"],
                                  ["dp-plugin-restart-allocatable-zero", "--node", "real", "--kubelet-version",
                                   "1.31"]])
def test_bad_scenario_input_is_one_line_and_exit_2(tmp_path, args):
    code, output, _ = scenario_run(tmp_path / "out", *args)
    assert code == 2 and len(output.strip().splitlines()) == 1 and "Traceback" not in output, output
    assert not (tmp_path / "out").exists()


def test_list_and_show():
    listed = subprocess.run([sys.executable, "-m", "harness.run.cli", "scenario", "list"], capture_output=True,
                            text=True, timeout=60).stdout.splitlines()
    assert [line.split()[0] for line in listed] == sorted(s.name for s in LIBRARY)
    assert all("https://" in line for line in listed)
    shown = subprocess.run([sys.executable, "-m", "harness.run.cli", "scenario", "show", "dp-checkpoint-lost-reboot"],
                           capture_output=True, text=True, timeout=60).stdout
    assert "kubernetes/kubernetes/issues/116125" in shown and "kubelet: reboot, checkpoint: lost" in shown


def test_a_failed_check_writes_a_scenario_that_replays_it(tmp_path):
    assert "duplicate-ids" in load_subject("reference-dp").defects
    out = tmp_path / "run"
    subprocess.run([sys.executable, "-m", "harness.run.cli", "run", "--subject", "reference-dp", "--defect",
                    "duplicate-ids", "--check", "DP-LAW-02", "--check", "DP-LAW-01", "--out", str(out)],
                   capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    repro = out / "repro" / "DP-LAW-02.yaml"
    assert repro.is_file() and not (out / "repro" / "DP-LAW-01.yaml").exists()
    code, output, report = scenario_run(tmp_path / "replay", "--file", str(repro))
    assert code == 1 and outcome_of(report) == REPRODUCED, output
    assert "--defect duplicate-ids" in report["checks"][0]["repro"]


CHECKPOINT_AND_PODRESOURCES = """\
title: the checkpoint holds a running pod's devices
correct: the device manager checkpoints the allocation, and PodResources reports it
bug: it does not
kind: device-plugin
nodes: [fake, real]
steps:
  - kubelet: start
  - plugin: start
  - wait: {registered: true, allocatable: all}
  - pod: {create: ck, devices: 2}
  - expect: {pod: {name: ck, phase: Running}, checkpoint: {pod: ck, devices: 2}, pod_devices: {pod: ck, count: 2}}
  - pod: {delete: ck}
  - expect: {checkpoint: {pod: ck, devices: 0}}
"""


@pytest.mark.parametrize("node", ["fake", pytest.param("real", marks=pytest.mark.real_kubelet)])
def test_the_operators_view_reads_both_kubelets(tmp_path, node):
    path = tmp_path / "ck.yaml"
    path.write_text(CHECKPOINT_AND_PODRESOURCES)
    code, output, report = scenario_run(tmp_path / "out", "--file", str(path), "--node", node)
    if outcome_of(report) == INCONCLUSIVE:
        pytest.skip(report["checks"][0]["detail"].splitlines()[0])
    assert code == 0 and outcome_of(report) == NOT_REPRODUCED, output
    assert "device-manager checkpoint: pod ck devices 2" in output and "PodResources: pod ck has devices 2" in output


DRA_POD_HEALTH = """\
title: a DRA pod's allocatedResourcesStatus follows its device's health
correct: the pod's status says Healthy, then Unhealthy once its device fails
bug: the status never changes
kind: dra
subject: reference-dra
nodes: [fake, real]
steps:
  - kubelet: start
  - plugin: start
  - wait: {registered: true, slices: {devices: {at_least: 1}}}
  # The reference driver taints a failed device NoExecute: without the toleration the eviction controller
  # deletes the pod about 70 ms after the kubelet reports it Unhealthy (on a loaded runner, before it is read).
  - pod: {create: w, devices: 1, tolerations: [{operator: Exists, effect: NoExecute}]}
  - wait: {resources_status: {pod: w, health: Healthy}, checkpoint: {claims: 1, devices: 1}}
    within: 30s
  - device: {fail: "@pod:w"}
  - expect: {resources_status: {pod: w, health: Unhealthy}}
    within: 30s
"""


@pytest.mark.parametrize("node", ["fake", pytest.param("real", marks=pytest.mark.real_kubelet)])
def test_a_dra_pods_status_and_checkpoint_read_both_kubelets(tmp_path, node):
    # On the real node: the Pod's allocatedResourcesStatus from the API server, and the kubelet's own
    # dra_manager_state from the node's private /var/lib/kubelet.
    path = tmp_path / "dra-health.yaml"
    path.write_text(DRA_POD_HEALTH)
    code, output, report = scenario_run(tmp_path / "out", "--file", str(path), "--node", node)
    if outcome_of(report) == INCONCLUSIVE and (node == "real" or report["checks"][0].get("install")):
        pytest.skip(report["checks"][0]["detail"].splitlines()[0])
    assert code == 0 and outcome_of(report) == NOT_REPRODUCED, output
    assert "allocatedResourcesStatus of w: Unhealthy" in output and "DRA checkpoint: claims 1" in output


# -- careless input (issue 28): values the fake hardware would refuse midway are refused when the file loads --

HOLD = "  - hold: 500ms"


@pytest.mark.parametrize(("step", "where", "says"), [
    ("  - device: {heat: '@0', to: 1e9}", "steps[4].device.to", "a temperature in degrees C, -273.15 to 1000"),
    ("  - device: {cool: '@0', to: .nan}", "steps[4].device.to", "a temperature in degrees C"),
    ("  - device: {ecc: '@0', count: 10000000}", "steps[4].device.count", "a whole number from 1 to 1000000"),
    ("  - device: {xid: '@0', code: 100000}", "steps[4].device.code", "a whole number from 1 to 1000"),
    ("  - script: {ramp: '@0', from: 90, to: 40, step: 5, period: 1}", "steps[4].script.to", "at least from"),
    ("  - script: {ramp: '@0', from: 40, to: 90, step: 0, period: 1}", "steps[4].script.step", "a positive number"),
    ("  - script: {ramp: '@0', from: 40, to: 90, step: 0.001, period: 1}", "steps[4].script.step",
     "at most 1000 steps"),
    ("  - script: {ramp: '@0', from: 40, to: .inf, step: 5, period: 1}", "steps[4].script.to",
     "a temperature in degrees C"),
])
def test_values_are_checked_when_the_file_loads(step: str, where: str, says: str) -> None:
    with pytest.raises(ProfileError) as err:
        loads(WRITTEN_BY_HAND.replace(HOLD, step), "x.yaml")
    assert str(err.value).startswith(f"x.yaml:10: {where}: "), str(err.value)
    assert says in str(err.value)


def test_scenario_seed_and_dash_dash_seed_share_one_range(tmp_path):
    for seed in (-1, 2**63):
        with pytest.raises(ProfileError, match=r"seed: a whole number from 0 to 9223372036854775807"):
            loads(f"seed: {seed}\n" + WRITTEN_BY_HAND, "x.yaml")
    assert loads(f"seed: {2**63 - 1}\n" + WRITTEN_BY_HAND, "x.yaml").seed == 2**63 - 1
    code, output, _ = scenario_run(tmp_path / "out", "dp-checkpoint-lost-reboot", "--seed", str(2**63))
    assert code == 2 and "--seed must be a non-negative integer (at most 9223372036854775807)" in output, output
    assert len(output.strip().splitlines()) == 1 and not (tmp_path / "out").exists()


@pytest.mark.parametrize("kind", ["fifo", "dangling"])
def test_a_scenario_file_that_is_no_regular_file_is_refused_unread(tmp_path, kind):
    # A FIFO blocked `scenario run --file` forever.
    path = tmp_path / "s.yaml"
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to(tmp_path / "gone.yaml")
    code, output, _ = scenario_run(tmp_path / "out", "--file", str(path))
    says = "a FIFO, not a regular file" if kind == "fifo" else "a dangling symlink"
    assert code == 2 and f"{path}: cannot read: {says}" in output, output
    assert len(output.strip().splitlines()) == 1 and not (tmp_path / "out").exists()
