"""Calls the kubelet makes, held in flight (issue 35): `hold: {call: NodePrepareResources | NodeUnprepareResources}`
for a DRA driver and `hold: {call: Allocate}` for a device plugin hold the plugin's answer back from the kubelet
until `release`, the kubelet's stop or (DRA) its deadline, and `held` reads true meanwhile, on the fake kubelet and
on the real one (the relays hold it on the wire); a pod that meets the held call waits. And a rolling update's
`defect:` runs the new instance as that mutant of the subject, or (`none`) without one."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import one_step_scenario as scenario
from conftest import outcome_of, scenario_run, timeline_of

from harness.instruments.faults import CALL_ENDED, DEADLINE, KUBELET_STOPPED, RELEASED, FaultPlan
from harness.instruments.timeline import Timeline
from harness.scenarios.check import check_file
from harness.scenarios.schema import INCONCLUSIVE, NOT_REPRODUCED, loads
from harness.spec.subjects import ProfileError

NODES = ["fake", pytest.param("real", marks=pytest.mark.real_kubelet)]


def kept_on(tmp_path: Path, name: str, text: str, node: str, *args: str) -> tuple[Path, str]:
    """Run a scenario's text on `node`, where it must keep the correct behaviour (NOT REPRODUCED): its output
    directory and what it printed. Skipped, with the one-line reason, where the node cannot run here (no real
    kubelet; no API server for a DRA driver)."""
    if node == "real":
        from harness.node.real.localnode import unavailable

        why = unavailable()
        if why:
            pytest.skip(why)
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    out = tmp_path / "out"
    code, output, report = scenario_run(out, path, "--node", node, *args)
    check = (report.get("checks") or [{}])[0]
    if outcome_of(report) == INCONCLUSIVE and check.get("install"):
        pytest.skip(check["detail"].splitlines()[0])  # a component this machine lacks, named
    assert code == 0 and outcome_of(report) == NOT_REPRODUCED, output
    return out, output


def first(timeline: list[dict[str, Any]], kind: str, **data: Any) -> dict[str, Any]:
    found = [e for e in timeline if e["kind"] == kind and all(e["data"].get(k) == v for k, v in data.items())]
    assert found, f"no {kind} {data} on the timeline"
    return found[0]


# -- the vocabulary ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("step", "kind"), [
    ("hold: {call: NodePrepareResources}", "dra"),
    ("hold: {call: NodeUnprepareResources}", "dra"),
    ("release: {call: NodePrepareResources}", "dra"),
    ("wait: {held: {call: NodeUnprepareResources}}", "dra"),
    ("expect: {not: {held: {call: NodePrepareResources}}}", "dra"),
    ("hold: {call: Allocate}", "device-plugin"),
    ("release: {call: Allocate}", "device-plugin"),
    ("wait: {held: {call: Allocate}}", "device-plugin"),
    ("hold: {call: Register}", "device-plugin"),
    ("plugin: rolling-update\n    defect: missing-device", "device-plugin"),
    ("plugin: rolling-update\n    args: [--pod-uid, next]\n    defect: none", "dra"),
])
def test_the_calls_the_kubelet_makes_can_be_held(step: str, kind: str) -> None:
    loads(scenario(step, kind), "x.yaml")


@pytest.mark.parametrize(("step", "kind", "where", "says"), [
    ("hold: {call: Register}", "dra", "8: steps[2].hold.call",
     "Register is a device plugin's call (kind: device-plugin); this scenario's: NodePrepareResources, "
     "NodeUnprepareResources"),
    ("hold: {call: NodePrepareResources}", "device-plugin", "8: steps[2].hold.call",
     "NodePrepareResources is a DRA driver's call (kind: dra); this scenario's: Register, Allocate"),
    ("release: {call: Allocate}", "dra", "8: steps[2].release.call", "Allocate is a device plugin's call"),
    ("wait: {held: {call: NodeUnprepareResources}}", "device-plugin", "8: steps[2].wait.held.call",
     "NodeUnprepareResources is a DRA driver's call"),
    ("hold: {call: GetPreferredAllocation}", "device-plugin", "8: steps[2].hold.call",
     "a call of the kubelet's: Register (the kubelet serves it); Allocate (the kubelet makes it to the plugin)"),
    ("hold: {call: GetInfo}", "dra", "8: steps[2].hold.call",
     "a call of the kubelet's: NodePrepareResources, NodeUnprepareResources (the kubelet makes it to the plugin)"),
    ("hold: {method: NodePrepareResources}", "dra", "8: steps[2].hold",
     "{call: NodePrepareResources | NodeUnprepareResources}"),
    # reject refuses the kubelet's own answer: a device plugin's Register only.
    ("reject: {call: Allocate}", "device-plugin", "8: steps[2].reject.call", "Register (the kubelet serves it)"),
    ("reject: {call: NodePrepareResources}", "dra", "8: steps[2]", "reject is for device plugins"),
    ("plugin: rolling-update\n    defect: Not_A_Name", "device-plugin", "9: steps[2].defect",
     "a defect of the subject (fakelet subjects lists them) for the new instance to run as, or none"),
    ("plugin: restart\n    defect: missing-device", "device-plugin", "9: steps[2].defect", "unknown option"),
])
def test_a_mistake_names_file_line_and_field(step: str, kind: str, where: str, says: str) -> None:
    with pytest.raises(ProfileError) as err:
        loads(scenario(step, kind), "x.yaml")
    assert str(err.value).startswith(f"x.yaml:{where}: "), str(err.value)
    assert says in str(err.value), str(err.value)


UPGRADE_CHECKED = """\
title: t
correct: c
bug: b
kind: device-plugin
cases:
  - {verdict: not reproduced}
  - {verdict: not reproduced, subject: sample-device-plugin}
steps:
  - kubelet: start
  - plugin: start
  - plugin: rolling-update
    defect: no-such-defect
  - plugin: rolling-update
    defect: none
  - expect: {registered: true}
"""


def test_check_refuses_a_defect_no_subject_of_the_file_has(tmp_path: Path) -> None:
    """Against every subject the file runs: a reference subject's defects, and none for a subject that has none."""
    path = tmp_path / "x.yaml"
    path.write_text(UPGRADE_CHECKED)
    _, problems = check_file(path)
    assert len(problems) == 2, problems
    assert problems[0].startswith(f"{path}:12: steps[2].defect: 'no-such-defect' is not a defect of reference-dp; "), \
        problems
    assert problems[0].endswith("known (fakelet subjects lists those of reference-dp)"), problems
    assert problems[1] == (f"{path}:12: steps[2].defect: sample-device-plugin has no defects to run the new instance "
                           "as (only a subject with defect_args, such as the reference subjects, runs one)"), problems


# -- the fault plan: a held answer ends four ways ---------------------------------------------------------------

def hold_in_thread(plan: FaultPlan, method: str, **kwargs: Any) -> tuple[threading.Thread, list[Any]]:
    got: list[Any] = []
    thread = threading.Thread(target=lambda: got.append(plan.hold_answer(method, **kwargs)), daemon=True)
    thread.start()
    return thread, got


@pytest.mark.parametrize("how", [RELEASED, KUBELET_STOPPED])
def test_a_held_answer_waits_for_its_release_or_its_kubelets_stop(how: str) -> None:
    timeline = Timeline()
    plan = FaultPlan(timeline, "kubelet")
    fault = plan.hold("NodePrepareResources")
    assert plan.hold_answer("Allocate") is None  # another call's answer goes on
    thread, got = hold_in_thread(plan, "NodePrepareResources")
    assert fault.reached.wait(10)
    assert thread.is_alive() and not fault.release.is_set()  # held: in flight
    if how == RELEASED:
        fault.release.set()
    else:
        plan.end_answers()  # the fake kubelet's stop, before it waits for its pod worker
    thread.join(10)
    assert got == [fault] and fault.ended == how
    assert [e.data for e in timeline.events(kind="fault.hold_ended")] == [
        {"method": "NodePrepareResources", "ended": how}]
    assert plan.hold_answer("NodePrepareResources") is None  # spent: the next call's answer goes on


def test_a_held_answer_ends_at_the_kubelets_deadline_or_when_its_call_ends() -> None:
    plan = FaultPlan(Timeline(), "kubelet")
    fault = plan.hold("NodePrepareResources")
    assert plan.hold_answer("NodePrepareResources", deadline=time.monotonic()) is fault
    assert fault.ended == DEADLINE and fault.release.is_set()

    class Ended:
        """A relay's server context whose call the kubelet already ended (its connection closed)."""

        def add_callback(self, callback: Any) -> bool:
            return False

        def is_active(self) -> bool:
            return False

    fault = plan.hold("NodeUnprepareResources")
    assert plan.hold_answer("NodeUnprepareResources", context=Ended()) is fault  # type: ignore[arg-type]
    assert fault.ended == CALL_ENDED


# -- a held call on either kubelet -------------------------------------------------------------------------------

ALLOCATE_HELD = """\
title: a held Allocate keeps the pod out of running until released
correct: the pod runs once the plugin's answer reaches the kubelet
bug: it runs without it, or never
kind: device-plugin
nodes: [fake, real]
steps:
  - kubelet: start
  - plugin: start
  - wait: {registered: true, allocatable: all}
  - hold: {call: Allocate}
  - pod: {create: first, devices: 1}
  - wait: {held: {call: Allocate}}
  - expect: {pod: {name: first, phase: Pending}, held: {call: Allocate}}
    throughout: 2s
  - release: {call: Allocate}
  - expect: {pod: {name: first, phase: Running}, pod_devices: {pod: first, count: 1}, not: {held: {call: Allocate}}}
"""


@pytest.mark.parametrize("node", NODES)
def test_a_held_allocate_keeps_the_pod_pending_until_released(tmp_path: Path, node: str) -> None:
    out, output = kept_on(tmp_path, "allocate-held", ALLOCATE_HELD, node)
    assert "holds the plugin's answer to the next Allocate it makes" in output, output
    assert "pod first: the kubelet's Allocate for it is held: its admission waits" in output, output
    assert "Allocate held in flight by kubelet instance 1" in output, output
    assert "released: the plugin's answer to the Allocate reaches kubelet instance 1" in output, output
    timeline = timeline_of(out)
    fired = first(timeline, "fault.fired", method="Allocate", held="answer")
    released = first(timeline, "fault.released", method="Allocate", in_flight=True)
    ended = first(timeline, "fault.hold_ended", method="Allocate", ended=RELEASED)
    # The kubelet's Allocate is on the record once its answer reached the kubelet: after the release.
    allocate = first(timeline, "grpc.call", method="Allocate", side="client", outcome="OK")
    assert fired["t_ns"] < released["t_ns"] <= ended["t_ns"] <= allocate["t_ns"], (fired, released, allocate)
    if node == "real":
        assert allocate["data"].get("relay") is True, allocate  # held on the wire, by the relay


PREPARE_HELD = """\
title: a held NodePrepareResources keeps the pod out of running, a held NodeUnprepareResources keeps it terminating
correct: the pod runs once the driver's answer to the prepare reaches the kubelet, and goes once the unprepare's does
bug: it does not
kind: dra
subject: reference-dra
nodes: [fake, real]
steps:
  - kubelet: start
  - plugin: start
  - wait: {registered: true, slices: {devices: {at_least: 1}}}
  - hold: {call: NodePrepareResources}
  - pod: {create: first, devices: 1}
  - wait: {held: {call: NodePrepareResources}}
  - expect: {pod: {name: first, phase: Pending}, held: {call: NodePrepareResources}}
    throughout: 2s
  - release: {call: NodePrepareResources}
  - expect: {pod: {name: first, phase: Running}, cdi: {pod: first, present: true},
             not: {held: {call: NodePrepareResources}}}
  - hold: {call: NodeUnprepareResources}
  - pod: {delete: first}
  - wait: {held: {call: NodeUnprepareResources}}
  - expect: {pod: {name: first, phase: Terminating}, held: {call: NodeUnprepareResources}}
    throughout: 2s
  - release: {call: NodeUnprepareResources}
  - expect: {pod: {name: first, phase: Deleted}, cdi: {pod: first, present: false}}
"""


@pytest.mark.parametrize("node", NODES)
def test_held_dra_calls_keep_the_pod_where_it_is_until_released(tmp_path: Path, node: str) -> None:
    out, output = kept_on(tmp_path, "prepare-held", PREPARE_HELD, node)
    for method in ("NodePrepareResources", "NodeUnprepareResources"):
        assert f"holds the plugin's answer to the next {method} it makes" in output, output
        assert f"pod first: the kubelet's {method} for it is held" in output, output
        assert f"released: the plugin's answer to the {method} reaches kubelet instance 1" in output, output
    timeline = timeline_of(out)
    fired = first(timeline, "fault.fired", method="NodePrepareResources", held="answer")
    released = first(timeline, "fault.released", method="NodePrepareResources", in_flight=True)
    prepared = next(e for e in timeline if e["kind"] == "dra.prepare" and e["source"] == "kubelet")
    running = first(timeline, "pod.running")
    # The kubelet heard the driver's answer only once released, and the pod ran only then.
    assert fired["t_ns"] < released["t_ns"] < prepared["t_ns"] < running["t_ns"], (fired, released, running)
    assert prepared["data"]["outcome"] == "OK", prepared
    unfired = first(timeline, "fault.fired", method="NodeUnprepareResources", held="answer")
    unreleased = first(timeline, "fault.released", method="NodeUnprepareResources", in_flight=True)
    deleted = first(timeline, "pod.deleted")
    assert unfired["t_ns"] < unreleased["t_ns"] < deleted["t_ns"], (unfired, unreleased, deleted)
    if node == "real":
        assert prepared["data"].get("relay") is True, prepared  # held on the wire, by the DRA relay


RESTART_WHILE_HELD = """\
title: a kubelet restart while NodePrepareResources is held
upstream: https://github.com/kubernetes/kubernetes/issues/116411
correct: the held answer dies with the kubelet; the new kubelet prepares the claim again and the pod runs
bug: the pod never runs, or its claim is never unprepared
kind: dra
subject: reference-dra
steps:
  - kubelet: start
  - plugin: start
  - wait: {registered: true, slices: {devices: {at_least: 1}}}
  - hold: {call: NodePrepareResources}
  - pod: {create: first, devices: 1}
  - wait: {held: {call: NodePrepareResources}}
  - kubelet: restart
  - expect: {not: {held: {call: NodePrepareResources}}}
  - release: {call: NodePrepareResources}
  - expect: {registered: true, pod: {name: first, phase: Running}, cdi: {pod: first, present: true},
             calls: {method: NodePrepareResources, count: 2}}
  - pod: {delete: first}
  - expect: {pod: {name: first, phase: Deleted}, cdi: {pod: first, present: false},
             calls: {method: NodeUnprepareResources, count: 1}}
"""


def test_a_held_prepare_ends_with_the_kubelet_that_made_it(tmp_path: Path) -> None:
    """On the fake kubelet: the answer never reaches the kubelet that stopped (its pod worker's sync fails, and
    writes nothing), and the next kubelet prepares the claim again from its checkpoint."""
    out, output = kept_on(tmp_path, "restart-held", RESTART_WHILE_HELD, "fake")
    assert "not (the NodePrepareResources held ended: its kubelet stopped)" in output, output
    assert "released: the held NodePrepareResources had already ended: its kubelet stopped" in output, output
    timeline = timeline_of(out)
    ended = first(timeline, "fault.hold_ended", method="NodePrepareResources", ended=KUBELET_STOPPED)
    lost = first(timeline, "grpc.call", method="NodePrepareResources", side="client")
    assert lost["data"]["outcome"].startswith("CANCELLED: the kubelet stopped"), lost
    restarted = [e for e in timeline if e["kind"] == "kubelet.start"][1]
    assert ended["t_ns"] < restarted["t_ns"], (ended, restarted)


# -- a rolling update to a mutant and back -------------------------------------------------------------------------

UPGRADE = """\
title: an upgrade to a buggy device plugin, and back
correct: every device stays advertised through each update
bug: the new version leaves a device out
kind: device-plugin
subject: reference-dp
steps:
  - kubelet: start
  - plugin: start
  - wait: {registered: true, allocatable: all}
  - plugin: rolling-update
    args: ["--socket-name", "fakelet-dp-next.sock"]
    defect: missing-device
  - wait: {dialed: {socket: fakelet-dp-next.sock, plugin_instance: 2}}
  # missing-device leaves the inventory's last device out of ListAndWatch: what the new instance runs as shows.
  - expect: {allocatable: 3}
  - plugin: rolling-update
    args: ["--socket-name", "fakelet-dp-back.sock"]
    defect: none
  - wait: {dialed: {socket: fakelet-dp-back.sock, plugin_instance: 3}}
  - expect: {allocatable: all}
"""


def test_a_rolling_update_runs_the_new_instance_as_the_mutant_named_and_back(tmp_path: Path) -> None:
    # 1.37: its device manager keeps a rolling update's clients per socket (1.36 has kubernetes#121994).
    out, output = kept_on(tmp_path, "upgrade", UPGRADE, "fake", "--kubelet-version", "1.37")
    assert "a second plugin instance started beside the first as mutant missing-device with" in output, output
    assert "a second plugin instance started beside the first without a defect with" in output, output
    log = next((out / "artifacts").rglob("subject.log"))
    starts = [line for line in log.read_text().splitlines() if line.startswith("--- start")]
    assert len(starts) == 3, starts
    assert "--defect" not in starts[0] and "--defect" not in starts[2], starts
    assert starts[1].endswith("--defect missing-device --socket-name fakelet-dp-next.sock"), starts
