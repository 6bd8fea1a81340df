"""DeviceTaintRules by selector and a DRA driver's sockets deleted by hand (issue 35): `taint: {selector: ...}`
in every form, the empty one included, is checked as the API server checks it and reaches the API server as
written; `untaint` removes a rule by name, selector or device; `socket: {delete: registration | service |
NAME}` deletes a DRA driver's socket, which the kubelet's plugin watcher sees go. Each scenario runs on the
fake kubelet, and on the real one where it runs here (real_kubelet); the DRA relay's mirror of a deleted
endpoint is tested on its own with the fake kubelet behind it."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import one_step_scenario, outcome_of, scenario_run, timeline_of
from test_reference_dra import DRIVER, WAIT_S
from test_relay_dra import Rig, is_socket, registered

from fake_devices.backend import DeviceBackend
from fake_devices.model import Inventory
from harness.scenarios.check import check_file
from harness.scenarios.schema import INCONCLUSIVE, NOT_REPRODUCED, loads
from harness.spec.subjects import ProfileError, fixtures_dir

REFERENCE_DRIVER = "gpu.fakelet.example.com"  # reference-dra's driver (fixtures/subjects/reference-dra.yaml)
REG_SOCKET = f"{REFERENCE_DRIVER}-reg.sock"  # kubeletplugin draplugin.go: driver name + "-reg.sock"


def kept_on(tmp_path: Path, text: str, node: str, *args: str) -> tuple[Path, str]:
    """Run a scenario's text on `node`; it must keep its correct behaviour (NOT REPRODUCED). Skipped, with the
    reason, where this machine cannot run the node (no real kubelet) or has no API server."""
    path = tmp_path / "scenario.yaml"
    path.write_text(text)
    out = tmp_path / "out"
    code, output, report = scenario_run(out, path, "--node", node, *args)
    check = (report.get("checks") or [{}])[0]
    if outcome_of(report) == INCONCLUSIVE and (node == "real" or check.get("install")):
        pytest.skip(check["detail"].splitlines()[0])
    assert code == 0 and outcome_of(report) == NOT_REPRODUCED, output
    return out, output


# -- what a taint, untaint or socket step takes, checked before anything runs ------------------------------

def scenario(step: str, kind: str = "dra") -> str:
    return one_step_scenario(step, kind)


@pytest.mark.parametrize("step", [
    "taint: {device: gpu-0, effect: NoSchedule, key: example.com/drain, name: drain}",
    "taint: {selector: {}}",
    "taint: {selector: {driver: gpu.fakelet.example.com}, effect: NoExecute}",
    "taint: {selector: {driver: '@driver', pool: '@node', device: '@pod:first'}, name: r1}",
    "taint: {selector: {pool: node-a/slice.b, device: gpu-1}}",
    "untaint: {rule: r1}",
    "untaint: {selector: {driver: '@driver'}}",
    "untaint: {device: '@0'}",
    "socket: {delete: registration}",
    "socket: {delete: service}",
    "socket: {delete: dra.sock}",
])
def test_the_new_forms_load(step: str) -> None:
    loads(scenario(step), "x.yaml")


@pytest.mark.parametrize(("step", "kind", "where", "says"), [
    ("taint: {device: gpu-0, selector: {}}", "dra", "steps[2].taint", "exactly one of device and selector"),
    ("taint: {effect: NoExecute}", "dra", "steps[2].taint", "exactly one of device and selector"),
    ("taint: {selector: [driver]}", "dra", "steps[2].taint.selector", "a mapping of driver, pool and device"),
    ("taint: {selector: {deviceClassName: gpu}}", "dra", "steps[2].taint.selector.deviceClassName",
     "removed from the API in 1.35"),
    # validation.go validateDeviceTaintSelector: driver ValidateCSIDriverName, pool validatePoolName, device
    # ValidateDNS1123Label.
    ("taint: {selector: {driver: gpu_fakelet}}", "dra", "steps[2].taint.selector.driver", "DNS-1123 subdomain"),
    (f"taint: {{selector: {{driver: {'d' * 64}}}}}", "dra", "steps[2].taint.selector.driver", "at most 63"),
    ("taint: {selector: {driver: ''}}", "dra", "steps[2].taint.selector.driver", "a driver name"),
    ("taint: {selector: {pool: a//b}}", "dra", "steps[2].taint.selector.pool", "each '/'-separated part"),
    (f"taint: {{selector: {{pool: {'p' * 254}}}}}", "dra", "steps[2].taint.selector.pool", "at most 253"),
    ("taint: {selector: {pool: '@pool'}}", "dra", "steps[2].taint.selector.pool", "or @node"),
    ("taint: {selector: {device: GPU_0}}", "dra", "steps[2].taint.selector.device", "DNS-1123 label"),
    ("taint: {selector: {device: '@x'}}", "dra", "steps[2].taint.selector.device", "'@N' or '@pod:NAME'"),
    ("taint: {selector: {}, effect: NoEvict}", "dra", "steps[2].taint.effect", "one of NoExecute, NoSchedule"),
    ("taint: {selector: {}, key: a/b/c}", "dra", "steps[2].taint.key", "a label name"),
    ("taint: {selector: {}, name: Drain}", "dra", "steps[2].taint.name", "a DNS-1123 label"),
    ("taint: {selector: {}, value: x}", "dra", "steps[2].taint.value", "unknown key"),
    ("taint: {selector: {}}", "device-plugin", "steps[2]", "taint needs a DRA driver"),
    ("untaint: {rule: a, device: gpu-0}", "dra", "steps[2].untaint", "exactly one of them"),
    ("untaint: {rule: A}", "dra", "steps[2].untaint.rule", "a DNS-1123 label"),
    ("untaint: {selector: {driver: x_y}}", "dra", "steps[2].untaint.selector.driver", "DNS-1123 subdomain"),
    ("socket: {delete: kubelet}", "dra", "steps[2].socket.delete", "kubelet is for device plugins"),
    ("socket: {delete: registration}", "device-plugin", "steps[2].socket.delete", "registration is for DRA drivers"),
    ("socket: {delete: plugins/dra.sock}", "dra", "steps[2].socket.delete", "plugins_registry or plugins/<driver>"),
    ("socket: {remove: service}", "dra", "steps[2].socket", "{delete: registration | service | NAME}"),
])
def test_a_mistake_names_file_line_and_field(step: str, kind: str, where: str, says: str) -> None:
    with pytest.raises(ProfileError) as err:
        loads(scenario(step, kind), "x.yaml")
    assert str(err.value).startswith(f"x.yaml:8: {where}: "), str(err.value)
    assert says in str(err.value), str(err.value)


UNTAINTS = """\
title: t
correct: c
bug: b
kind: dra
subject: reference-dra
steps:
  - kubelet: start
  - plugin: start
  - taint: {name: drain, selector: {driver: '@driver'}}
  - untaint: {rule: drian}
  - untaint: {selector: {driver: gpu.fakelet.example.com}}
  - taint: {selector: {device: gpu-9}}
  - untaint: {rule: drain}
  - expect: {registered: true}
"""


def test_check_refuses_an_untaint_of_what_no_earlier_taint_made(tmp_path: Path) -> None:
    """A rule's name or selector that no earlier taint step gave (a typo), and a device the inventory lacks."""
    path = tmp_path / "x.yaml"
    path.write_text(UNTAINTS)
    _scenario, problems = check_file(path)
    assert any(p.startswith(f"{path}:10: steps[3].untaint.rule: no earlier taint step names a rule 'drian'")
               and "drain" in p for p in problems), problems
    # The same selector as written: the words are not resolved before the run.
    assert any(p.startswith(f"{path}:11: steps[4].untaint.selector: no earlier taint step has this selector")
               for p in problems), problems
    assert any(p.startswith(f"{path}:12: steps[5].taint.selector.device: no device 'gpu-9' in reference-dra's "
                            "inventory") for p in problems), problems
    assert len(problems) == 3, problems  # the last untaint names a rule made before it


# -- every selector form reaches the API server; the empty one evicts every pod ------------------------------

FORMS = """\
title: DeviceTaintRules of every selector form
correct: each rule selects what its selector names; the empty selector selects every device and evicts every pod
bug: a rule selects something else
kind: dra
subject: reference-dra
nodes: [fake, real]
steps:
  - kubelet: start
  - plugin: start
  - wait: {registered: true, slices: {devices: all}}
  - pod: {create: first, devices: 1}
  - pod: {create: second, devices: 1}
  - wait: {pod: {name: first, phase: Running}, checkpoint: {claims: 2, devices: 2}}
  - taint: {device: "@pod:first", effect: NoSchedule}
  - taint: {name: by-driver, selector: {driver: "@driver"}, effect: NoSchedule, key: example.com/driver}
  - taint: {name: by-pool, selector: {pool: "@node"}, effect: NoSchedule}
  - taint: {name: by-device, selector: {device: "@1"}, effect: NoSchedule}
  - taint: {name: by-all, selector: {driver: gpu.fakelet.example.com, pool: "@node", device: gpu-2}, effect: NoSchedule}
  - taint: {selector: {driver: other.example.com}, effect: NoExecute}
  # NoSchedule evicts nothing, and another driver's NoExecute rule selects none of this driver's devices.
  - expect: {checkpoint: {claims: 2, devices: 2}}
    throughout: 5s
  - untaint: {device: "@pod:first"}
  - untaint: {rule: by-driver}
  - untaint: {selector: {pool: "@node"}}
  - untaint: {rule: by-device}
  - untaint: {rule: by-all}
  - untaint: {selector: {driver: other.example.com}}
  - taint: {name: every-device, selector: {}, effect: NoExecute}
  - expect: {checkpoint: {claims: 0, devices: 0}}
"""


@pytest.mark.parametrize("node", ["fake", pytest.param("real", marks=pytest.mark.real_kubelet)])
def test_each_selector_form_reaches_the_api_server_and_the_empty_one_evicts_every_pod(tmp_path: Path,
                                                                                      node: str) -> None:
    out, output = kept_on(tmp_path, FORMS, node)
    timeline = timeline_of(out)
    added = {e["data"]["rule"]: e["data"] for e in timeline if e["kind"] == "fault.taint_added"}
    node_name = next(r for r in added if r.endswith("-by-driver")).removesuffix("-by-driver")
    # The deviceSelector each rule has on the API server (the create's answer), as the eviction controller reads it.
    stored = {rule.removeprefix(f"{node_name}-"): data["selector"] for rule, data in added.items()}
    by_device = [d["device"] for d in added.values() if d["device"]]  # the device form's, named after its device
    assert len(by_device) == 1, added
    first_device = by_device[0]
    assert stored == {
        first_device: {"driver": REFERENCE_DRIVER, "pool": node_name, "device": first_device},
        "by-driver": {"driver": REFERENCE_DRIVER},
        "by-pool": {"pool": node_name},
        "by-device": {"device": "gpu-1"},
        "by-all": {"driver": REFERENCE_DRIVER, "pool": node_name, "device": "gpu-2"},
        "step-11": {"driver": "other.example.com"},  # named after its step (steps[11]): it gave no name
        "every-device": {},
    }, stored
    assert {d["version"] for d in added.values()} == {"v1beta2"}, added
    assert added[f"{node_name}-by-driver"]["key"] == "example.com/driver"
    removed = [r for e in timeline if e["kind"] == "fault.taint_removed" for r in e["data"]["rules"]]
    assert sorted(removed) == sorted(r for r in added if not r.endswith("-every-device")), removed
    # The empty selector: both pods evicted by kube-controller-manager, both claims unprepared by the kubelet.
    unprepared = [c for e in timeline if e["kind"] == "dra.unprepare" and e["data"]["outcome"] == "OK"
                  for c in e["data"]["claims"]]
    assert len(set(unprepared)) == 2, unprepared
    assert "(the empty selector: every device of every driver in the cluster)" in output, output


# -- a DRA driver's sockets deleted by hand, on both kubelets ------------------------------------------------

DRA_SOCKETS = """\
title: a DRA driver's sockets deleted by hand
correct: the kubelet deregisters a driver whose registration socket goes, and registers it again once the driver
  makes it again; a driver whose endpoint was deleted, and served again, keeps preparing claims
bug: it does not
kind: dra
subject: reference-dra
nodes: [fake, real]
steps:
  - kubelet: start
  - plugin: start
  - wait: {registered: true, slices: {devices: all}}
  - socket: {delete: registration}
  # The reference driver makes its registration socket again (dra_driver.py _on_registry_event): a second dial.
  - expect: {registered: true, dialed: {socket: REG, count: {at_least: 2}}}
  - socket: {delete: service}
  - pod: {create: after, devices: 1}
  - expect: {registered: true, pod: {name: after, phase: Running}, dialed: {socket: dra.sock, count: {at_least: 2}}}
""".replace("REG", REG_SOCKET)


# The real kubelet's case waits for its gRPC reconnect backoff to reach the new dra.sock (130 s of the real-kubelet
# env's worker time at CI's load): tox -e fidelity runs it. The default real-kubelet env keeps a deleted registration
# socket on the real kubelet twice: the driver that stays away (below) and DRA-RST-03 in reference-dra's fidelity row.
IN_FIDELITY_ENV = os.environ.get("FAKELET_FIDELITY") == "full"


@pytest.mark.parametrize("node", ["fake", pytest.param("real", marks=[
    pytest.mark.real_kubelet,
    pytest.mark.skipif(not IN_FIDELITY_ENV, reason="the real kubelet's case runs in tox -e fidelity "
                       "(FAKELET_FIDELITY=full): its reconnect backoff costs the real-kubelet env two minutes")])])
def test_a_deleted_dra_registration_socket_deregisters_the_driver_until_it_is_back(tmp_path: Path,
                                                                                  node: str) -> None:
    out, output = kept_on(tmp_path, DRA_SOCKETS, node)
    assert f"deleted {REG_SOCKET}, the driver's registration socket in plugins_registry" in output, output
    assert "deleted dra.sock, the driver's registered endpoint" in output, output
    timeline = timeline_of(out)
    deleted = [e for e in timeline if e["kind"] == "fault.socket_deleted"]
    assert [e["data"]["name"] for e in deleted] == [REG_SOCKET, "dra.sock"], deleted
    # In the driver's own directories, never the kubelet's: on the real node the relay mirrors them.
    assert deleted[0]["data"]["socket"].endswith(f"/kubelet/plugins_registry/{REG_SOCKET}"), deleted
    assert deleted[1]["data"]["socket"].endswith(f"/kubelet/plugins/{REFERENCE_DRIVER}/dra.sock"), deleted
    # The kubelet deregistered the driver after the deletion (the fake's plugin watcher, the real one's log) and
    # registered it again.
    gone = [e for e in timeline if e["kind"] == "dra.deregistered" and e["t_ns"] > deleted[0]["t_ns"]
            and e["data"]["driver"] == REFERENCE_DRIVER]
    assert gone and gone[0]["t_ns"] < deleted[1]["t_ns"], gone
    again = [e for e in timeline if e["kind"] == "dra.registered" and gone[0]["t_ns"] < e["t_ns"]]
    assert again, "not registered again"
    if node == "real":
        mirrored = [(e["data"]["name"], e["data"]["what"], e["data"]["side"]) for e in timeline
                    if e["kind"] == "relay.mirror" and e["t_ns"] > deleted[0]["t_ns"]]
        assert (REG_SOCKET, "deleted", "kubelet") in mirrored and ("dra.sock", "deleted", "kubelet") in mirrored, \
            mirrored
        assert ("dra.sock", "created", "kubelet") in mirrored, mirrored  # the driver served again: a new copy


NOT_BACK = """\
title: a DRA driver that does not make its registration socket again
correct: the kubelet deregisters the driver once its registration socket is gone
bug: the kubelet keeps it registered
kind: dra
subject: reference-dra
nodes: [fake, real]
steps:
  - kubelet: start
  - plugin: start
  - wait: {registered: true}
  - socket: {delete: REG}
  - expect: {not: {registered: true}}
  - expect: {dialed: {socket: REG, count: 1}}
""".replace("REG", REG_SOCKET)


@pytest.mark.parametrize("node", ["fake", pytest.param("real", marks=pytest.mark.real_kubelet)])
def test_registered_reads_false_once_a_deleted_registration_socket_stays_away(tmp_path: Path, node: str) -> None:
    """The no-reregister mutant leaves its registration socket deleted: `registered` reads false on both kubelets
    (held, not glimpsed), and the kubelet dialed the socket once only. A socket named by its file, too."""
    out, output = kept_on(tmp_path, NOT_BACK, node, "--defect", "no-reregister")
    assert f"deleted {REG_SOCKET}, a socket in plugins_registry" in output, output
    timeline = timeline_of(out)
    deleted = next(e for e in timeline if e["kind"] == "fault.socket_deleted")
    assert any(e["kind"] == "dra.deregistered" and e["t_ns"] > deleted["t_ns"] for e in timeline), output


def test_deleting_a_dra_socket_that_is_not_there_is_inconclusive(tmp_path: Path) -> None:
    """A step that cannot run: never the bug reproducing, and the two places looked in are named."""
    path = tmp_path / "rm.yaml"
    path.write_text(NOT_BACK.replace(f"socket: {{delete: {REG_SOCKET}}}", "socket: {delete: nobody.sock}"))
    code, output, report = scenario_run(tmp_path / "out", path)
    check = (report.get("checks") or [{}])[0]
    if outcome_of(report) == INCONCLUSIVE and check.get("install"):
        pytest.skip(check["detail"].splitlines()[0])  # no API server here
    assert code == 3 and outcome_of(report) == INCONCLUSIVE, output
    assert "no socket to delete at" in output and "/plugins_registry/nobody.sock" in output, output
    assert f"/plugins/{REFERENCE_DRIVER}/nobody.sock" in output and "REPRODUCED" not in output, output


# -- the DRA relay mirrors a deleted endpoint ---------------------------------------------------------------


@pytest.fixture
def relay_rig(tmp: Path) -> Iterator[Rig]:
    inventory = Inventory.load(fixtures_dir() / "inventories" / "basic.yaml")
    with DeviceBackend(tmp / "hw", inventory):
        made = Rig(tmp)
        try:
            made.node.start_kubelet()
            made.relay.start()
            yield made
        finally:
            made.close()


def test_the_dra_relay_mirrors_a_deleted_endpoint_and_its_return(relay_rig: Rig) -> None:
    """An `rm` of the driver's dra.sock takes the kubelet's copy away (a real kubelet's next dial of it finds
    nothing, as on one directory); the driver serving again (the reference driver does) puts a copy back, and
    the kubelet, still registered, connects through it."""
    rig = relay_rig
    registered(rig)
    rig.wait(rig.kubelet_timeline, "dra.connection", driver=DRIVER, connected=True)
    copy = rig.kubelet_plugins / DRIVER / "dra.sock"
    assert is_socket(copy)
    t = rig.timeline.now()
    (rig.driver.plugin_dir / "dra.sock").unlink()
    gone = rig.wait(rig.timeline, "relay.mirror", t, name="dra.sock", what="deleted", side="kubelet")
    back = rig.wait(rig.timeline, "relay.mirror", gone.t_ns, name="dra.sock", what="created", side="kubelet")
    assert is_socket(copy) and back.get("kubelet_endpoint") == str(copy)
    # The kubelet keeps the driver (the registration was not touched) and connects again through the new copy:
    # the driver's restarted server closed the old connection. A connection is accepted only on a copy in place.
    rig.timeline.wait_for(lambda e: e.kind == "relay.connection" and e.get("role") == "endpoint"
                          and e.get("what") == "opened", WAIT_S, "the kubelet's connection through the new copy",
                          gone.t_ns)
    assert not rig.kubelet_timeline.find(lambda e: e.kind == "dra.deregistered")
