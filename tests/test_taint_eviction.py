"""The taint-eviction path's parts, against the real local control plane (kube-apiserver,
kube-controller-manager): the fake kubelet as a Node with a lease, its pod worker, PodResources
reflecting real pods, DeviceTaintRules, and `fakelet scenario taint-eviction` end to end."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.controlplane.scheduler import PodClaim
from harness.controlplane.taints import rule_version
from harness.kubelet.nodestatus import LEASE_NAMESPACE
from harness.kubelet.podresources import read_pod_resources
from harness.scenarios.taint_eviction import claim_released
from harness.spec.profiles import FAST
from harness.spec.subjects import load_subject
from harness.world.draenv import DRAEnv

RUN_TIMEOUT_S = 300


def test_the_local_control_plane_runs_the_eviction_controllers(control_plane):
    described = control_plane.describe()
    assert control_plane.controllers_error == ""
    assert described["controllers"] == "device-taint-eviction-controller,resourceclaim-controller"
    assert rule_version(control_plane.client()) == "v1beta2"  # served on 1.36 with DRADeviceTaintRules


def test_node_lease_pod_worker_and_pod_resources(control_plane):
    env = DRAEnv(load_subject("reference-dra"), FAST, control_plane=control_plane)
    try:
        env.start()
        env.wait_allocatable(1)
        client = control_plane.client()
        node = client.get(f"/api/v1/nodes/{env.node_name}")
        ready = {c["type"]: c["status"] for c in node["status"]["conditions"]}
        assert ready["Ready"] == "True" and node["status"]["allocatable"]["pods"] == "110"
        lease = client.get(f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NAMESPACE}/leases/{env.node_name}")
        assert lease["spec"]["holderIdentity"] == env.node_name and lease["spec"]["renewTime"]

        pod, (claim,) = env.run_pod([PodClaim("gpu")])
        live = client.get(f"/api/v1/namespaces/{env.node_name}/pods/{pod['metadata']['name']}")
        assert live["spec"]["nodeName"] == env.node_name and live["status"]["phase"] == "Running"
        (status,) = live["status"]["containerStatuses"]
        assert status["state"]["running"] and status["allocatedResourcesStatus"][0]["name"] == "claim:gpu"

        answer = read_pod_resources(env.node.pod_resources_socket, 5.0)
        (listed,) = [p for p in answer["pods"] if p["name"] == pod["metadata"]["name"]]
        (dynamic,) = listed["containers"][0]["dynamic_resources"]
        assert dynamic["claim_name"] == claim["metadata"]["name"]
        (_, device), = env.allocated_devices(claim, env.driver)
        assert [r["device_name"] for r in dynamic["claim_resources"]] == [device]

        since = env.now()
        env.delete_pod(pod)
        env.wait_pod("pod.deleted", pod, since, "the kubelet to finish the deletion")
        assert [e.get("outcome") for e in env.timeline.find(lambda e: e.kind == "dra.unprepare", since)] == ["OK"]
        answer = read_pod_resources(env.node.pod_resources_socket, 5.0)
        assert pod["metadata"]["name"] not in [p["name"] for p in answer["pods"]]
    finally:
        env.close()


def scenario(out: Path, *args: str) -> tuple[int, str, dict]:
    proc = subprocess.run([sys.executable, "-m", "harness.run.cli", "scenario", "taint-eviction", "--out", str(out),
                           *args], capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    report = json.loads((out / "report.json").read_text()) if (out / "report.json").exists() else {}
    return proc.returncode, proc.stdout + proc.stderr, report


@pytest.mark.slow
def test_scenario_narrates_the_story_and_writes_a_report(tmp_path):
    code, output, report = scenario(tmp_path, "--toleration-seconds", "1")
    assert code == 0, output
    for step in ("registered", "running on", "published taint", "eviction due at timeAdded+1s",
                 "deleted by the device-taint eviction controller", "NodeUnprepareResources", "CDI devices are gone",
                 "deallocated by the resource-claim controller"):
        assert step in output, (step, output)
    (check,) = report["checks"]
    assert check["id"] == "SCENARIO-taint-eviction" and check["verdict"] == "pass" and len(check["notes"]) >= 9


@pytest.mark.slow
def test_scenario_catches_a_driver_that_leaves_cdi_specs(tmp_path):
    code, output, report = scenario(tmp_path, "--defect", "leaves-cdi-after-eviction")
    assert code == 1, output
    (check,) = report["checks"]
    assert check["verdict"] == "fail" and "CDI devices" in check["detail"]
    assert check["repro"].startswith("fakelet scenario run taint-eviction --subject reference-dra")


@pytest.mark.parametrize("args", [["--toleration-seconds", "-1"], ["--subject", "reference-dp"],
                                  ["--subject", "nope"]])
def test_scenario_bad_input_is_one_line_and_exit_2(tmp_path, args):
    code, output, _ = scenario(tmp_path / "out", *args)
    assert code == 2 and len(output.strip().splitlines()) == 1 and "Traceback" not in output, output
    assert not (tmp_path / "out").exists()


def test_session_controls_taint_and_pods(control_plane):
    from harness.run.sessionops import ClusterOps

    env = DRAEnv(load_subject("reference-dra"), FAST, control_plane=control_plane)
    try:
        env.start()
        env.wait_allocatable(1)
        ops = ClusterOps(env).handlers()
        created = ops["pods_create"]({"count": 1, "toleration_seconds": 0})
        assert created["ok"], created
        (made,) = created["pods"]
        listed = ops["pods_list"]({})
        assert [(p["pod"], p["phase"], p["kubelet"]) for p in listed["pods"]] == [(made["pod"], "Running", "running")]
        assert ops["taint_add"]({"device": "nope"})["error"].startswith("no published device 'nope'")
        assert not ops["taint_add"]({"device": made["devices"][0], "effect": "PreferNoSchedule"})["ok"]
        since = env.now()
        added = ops["taint_add"]({"device": made["devices"][0]})
        assert added["ok"] and added["timeAdded"]
        env.timeline.wait_for(lambda e: e.kind == "pod.deleted" and e.get("pod") == made["pod"], 30,
                              "the tainted pod evicted", since)
        assert ops["taint_remove"]({"device": made["devices"][0]})["removed"] == [added["rule"]]
        assert not ops["taint_remove"]({"device": made["devices"][0]})["ok"]
        assert not ops["pods_create"]({"count": 0})["ok"]
    finally:
        env.close()


def test_a_template_claim_runs_and_goes_with_its_pod(control_plane):
    env = DRAEnv(load_subject("reference-dra"), FAST, control_plane=control_plane)
    try:
        env.start()
        env.wait_allocatable(1)
        pod, (claim,) = env.run_pod([PodClaim("gpu")], "templated", template=True)
        owners = [o["kind"] for o in claim["metadata"].get("ownerReferences", [])]
        assert owners == ["Pod"] and claim["status"]["reservedFor"][0]["uid"] == pod["metadata"]["uid"]
        since = env.now()
        env.delete_pod(pod)
        env.wait_pod("pod.deleted", pod, since, "the kubelet to finish the deletion")
        # The resource-claim controller releases a generated claim once its pod is gone.
        assert claim_released(env, claim) in ("deleted", "deallocated")
    finally:
        env.close()



def test_checks_that_write_taint_rules_get_an_api_server_of_their_own():
    """A DeviceTaintRule selects devices by driver, pool and name on every node: on the run's shared API server a
    driver with one pool name on every node (pydra) had one check's rule taint, and the eviction controller act
    on, the devices of checks beside it. Such checks are marked cluster_objects, which gives each a private one."""
    import inspect

    from harness.spec.checks import CHECK_MODULES, CLUSTER_OBJECTS, catalog

    catalog("suites.dra")
    writers = set()
    for module_name in set(CHECK_MODULES.values()):
        for fn in vars(sys.modules[module_name]).values():
            marks = [m for m in getattr(fn, "pytestmark", []) if m.name == "fakelet_check"]
            if marks and callable(fn) and "taint_rules.add" in inspect.getsource(fn):
                writers.add(marks[0].kwargs["id"])
    assert writers == {"DRA-TNT-02", "DRA-TNT-03"}
    assert writers <= CLUSTER_OBJECTS
