"""Kubelet-side health semantics, end to end: fake hardware -> reference plugin -> fake kubelet.

Allocatable follows health; a pod that holds a device that turns unhealthy
keeps it; its allocatedResourcesStatus shows the device's health the way
upstream does (name = resource name, resourceID = device ID).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from harness.instruments.timeline import Event
from harness.spec.profiles import FAST
from harness.spec.subjects import load_subject
from harness.world.env import DPEnv

RESOURCE = "fakelet.example.com/gpu"


@pytest.fixture
def env() -> Iterator[DPEnv]:
    e = DPEnv(load_subject("reference-dp"), FAST)
    try:
        yield e.start()
    finally:
        e.close()


def wait_allocatable(env: DPEnv, since: int, value: int) -> Event:
    return env.timeline.wait_for(
        lambda e: e.kind == "kubelet.devices" and e.get("resource") == RESOURCE and e.get("allocatable") == value,
        10, f"allocatable {value}", since)


def test_health_flows_to_allocatable_and_pod_status(env: DPEnv) -> None:
    env.registered_and_listed()
    assert env.devices is not None
    total = len(env.devices.devices())
    assert env.node.capacity(RESOURCE) == env.node.allocatable(RESOURCE) == total

    (alloc,) = env.node.admit_pod("pod-1", {RESOURCE: 1})
    held = alloc.device_ids[0]
    assert env.node.allocated_resources_status("pod-1") == {
        "main": [{"name": RESOURCE, "resources": [{"resourceID": held, "health": "Healthy"}]}]}

    t = env.now()
    env.devices.fail(held)
    wait_allocatable(env, t, total - 1)
    assert env.node.capacity(RESOURCE) == total  # capacity keeps unhealthy devices
    assert env.node.pod_devices("pod-1") == {RESOURCE: [held]}  # the pod keeps its device
    assert env.node.allocated_resources_status("pod-1")["main"][0]["resources"] == [
        {"resourceID": held, "health": "Unhealthy"}]

    t = env.now()
    env.devices.recover(held)
    wait_allocatable(env, t, total)
    assert env.node.allocated_resources_status("pod-1")["main"][0]["resources"] == [
        {"resourceID": held, "health": "Healthy"}]


def test_unplugged_device_leaves_capacity(env: DPEnv) -> None:
    env.registered_and_listed()
    assert env.devices is not None
    total = len(env.devices.devices())
    device = env.devices.devices()[-1].id
    t = env.now()
    env.devices.unplug(device)
    env.timeline.wait_for(lambda e: e.kind == "kubelet.devices" and e.get("capacity") == total - 1, 10,
                          f"capacity {total - 1} after unplugging {device}", t)
    t = env.now()
    env.devices.plug(device)
    env.timeline.wait_for(lambda e: e.kind == "kubelet.devices" and e.get("capacity") == total
                          and e.get("allocatable") == total, 10, f"capacity {total} after replugging", t)


@pytest.mark.parametrize(("defect", "verdict"), [(None, "pass"), ("no-hotplug", "fail")])
def test_hotplug_by_count_for_plugins_with_their_own_device_names(tmp_path, defect, verdict) -> None:
    """DP-HLT-05 for a subject whose IDs are declared opaque (generic-device-plugin's hashes): mapped through
    Allocate (or by count), it still kills no-hotplug."""
    import json
    import os
    import shutil
    import subprocess
    import sys

    import yaml

    from harness.spec.subjects import fixtures_dir

    fixtures = tmp_path / "fixtures"
    shutil.copytree(fixtures_dir(), fixtures)
    profile = yaml.safe_load((fixtures / "subjects" / "reference-dp.yaml").read_text())
    profile["devices"] = {"ids": "opaque"}
    (fixtures / "subjects" / "reference-dp.yaml").write_text(yaml.safe_dump(profile))
    out = tmp_path / "out"
    # The mutant fails by never reacting: a short bound, as the kill matrix gives its mutants (the fast profile's
    # own bound made this the py env's longest DP-HLT run, about a minute under CI's load).
    mutant = ["--defect", defect, "--reaction-bound", "4"] if defect else []
    args = ["run", "--check", "DP-HLT-05", "--out", str(out), *mutant]
    subprocess.run([sys.executable, "-m", "harness.run.cli", *args], capture_output=True, text=True, timeout=120,
                   env=dict(os.environ, FAKELET_FIXTURES=str(fixtures)))
    (check,) = json.loads((out / "report.json").read_text())["checks"]
    assert check["verdict"] == verdict, check["detail"]
    if verdict == "fail":
        assert "after hot-unplug" in check["detail"]


def test_a_declared_observes_leaves_hotplug_unjudged(tmp_path) -> None:
    """Defect 8 of issue 39: a subject file that says `observes: [health]` is not held to DP-HLT-05, though the
    plugin reads the device tree (which, with nothing declared, makes fakelet hold it to hotplug)."""
    import json
    import os
    import shutil
    import subprocess
    import sys

    import yaml

    from harness.spec.subjects import fixtures_dir

    fixtures = tmp_path / "fixtures"
    shutil.copytree(fixtures_dir(), fixtures)
    subject = fixtures / "subjects" / "reference-dp.yaml"
    profile = yaml.safe_load(subject.read_text())
    profile["backend"]["observes"] = ["health"]
    subject.write_text(yaml.safe_dump(profile))
    out = tmp_path / "out"
    subprocess.run([sys.executable, "-m", "harness.run.cli", "run", "--check", "DP-HLT-05", "--out", str(out)],
                   capture_output=True, text=True, timeout=120, env=dict(os.environ, FAKELET_FIXTURES=str(fixtures)))
    (check,) = json.loads((out / "report.json").read_text())["checks"]
    assert check["verdict"] == "not-exercised", check["detail"]
    assert "the subject declares it does not watch hotplug (" in check["detail"]
    assert "reference-dp.yaml:" in check["detail"] and "backend.observes: [health])" in check["detail"]
