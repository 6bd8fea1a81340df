"""The kind tier's rendered manifests and flags (no cluster needed: no kind node image can be had here)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.node.kind import manifests
from harness.spec.subjects import ProfileError, in_container, load_subject


def _by_kind(objects: list[dict]) -> dict[str, dict]:
    return {o["kind"]: o for o in objects}


def test_a_device_plugin_ships_as_a_daemonset_over_the_kubelets_device_plugins_dir() -> None:
    spec = in_container(load_subject("sample-device-plugin"), "fakelet.local/sample:1", None, False)
    objects = manifests.daemonset(spec, "fakelet.local/sample:1", "fakelet-sample")
    assert [o["kind"] for o in objects] == ["DaemonSet"]
    ds = objects[0]
    pod = ds["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == "fakelet.local/sample:1"
    assert ds["spec"]["selector"]["matchLabels"].items() <= ds["spec"]["template"]["metadata"]["labels"].items()
    assert {v["name"]: v["hostPath"]["path"] for v in pod["volumes"]} == {
        "device-plugins": "/var/lib/kubelet/device-plugins"}
    assert {m["mountPath"] for m in container["volumeMounts"]} == {"/var/lib/kubelet/device-plugins"}
    assert {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}} in container["env"]
    assert pod["tolerations"] == [{"operator": "Exists"}] and "serviceAccountName" not in pod


def test_a_dra_driver_gets_its_dirs_its_node_and_the_rbac_to_publish_slices() -> None:
    spec = in_container(load_subject("dra-example-driver"), "fakelet.local/dra:1", None, False)
    objects = manifests.daemonset(spec, "fakelet.local/dra:1", "fakelet-dra")
    assert [o["kind"] for o in objects] == ["ServiceAccount", "ClusterRole", "ClusterRoleBinding", "DaemonSet"]
    kinds = _by_kind(objects)
    pod = kinds["DaemonSet"]["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "fakelet-dra"
    assert {v["hostPath"]["path"] for v in pod["volumes"]} == {
        "/var/lib/kubelet/plugins_registry", "/var/lib/kubelet/plugins", "/var/run/cdi",
        "/var/lib/kubelet/device-plugins"}
    args = pod["containers"][0]["args"]
    # In-cluster: the node from the downward API, no kubeconfig file, the kubelet's own paths.
    assert args[args.index("--node-name") + 1] == "$(NODE_NAME)"
    assert args[args.index("--kubeconfig") + 1] == ""
    assert args[args.index("--kubelet-registrar-directory-path") + 1] == "/var/lib/kubelet/plugins_registry"
    assert {"name": "NODE_NAME", "value": "$(NODE_NAME)"} in pod["containers"][0]["env"]
    resources = {r for rule in kinds["ClusterRole"]["rules"] for r in rule["resources"]}
    assert resources == {"resourceslices", "resourceclaims", "nodes"}
    assert kinds["ClusterRoleBinding"]["subjects"] == [
        {"kind": "ServiceAccount", "name": "fakelet-dra", "namespace": manifests.NAMESPACE}]


def test_a_placeholder_naming_this_machines_sandbox_is_an_error_on_kind() -> None:
    spec = in_container(load_subject("generic-device-plugin"), "fakelet.local/gdp:1", None, False)
    with pytest.raises(ProfileError, match=r"\{dev_dir\} in .* names this machine's sandbox"):
        manifests.daemonset(spec, "fakelet.local/gdp:1", "fakelet-gdp")


def test_the_cluster_binds_out_its_pod_resources_and_turns_on_the_taint_gates() -> None:
    config = manifests.cluster_config("/tmp/fakelet-kind-x/pod-resources")
    assert config["apiVersion"] == "kind.x-k8s.io/v1alpha4"
    (node,) = config["nodes"]
    assert node["extraMounts"] == [{"hostPath": "/tmp/fakelet-kind-x/pod-resources",
                                    "containerPath": "/var/lib/kubelet/pod-resources"}]
    assert config["featureGates"] == {"DRADeviceTaints": True, "DRADeviceTaintRules": True}


def test_pytest_kinds_cluster_keeps_its_files_in_fakelets_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from harness.node.kind.cluster import _Cluster

    monkeypatch.chdir(tmp_path)
    cluster = _Cluster("fakelet", tmp_path / "work", None, Path("/bin/true"), Path("/bin/true"))
    assert cluster.kubeconfig_path == tmp_path / "work" / "kubeconfig"
    assert not (tmp_path / ".pytest-kind").exists(), "pytest-kind's default is a dir in the cwd"


@pytest.mark.parametrize(("args", "said"), [
    (["--cluster", "kind"], "--cluster kind deploys the plugin's image as a DaemonSet: give --image"),
    (["--kind-image", "kindest/node:v1.36.0"], "--kind-image goes with --cluster kind"),
    (["--keep-cluster"], "--keep-cluster goes with --cluster kind"),
    (["--cluster", "kind", "--node", "real", "--image", "x.example.com/p:1", "--resource", "v.example.com/x"],
     "--cluster kind brings its own kubelet; drop --node real"),
])
def test_bad_kind_flags_are_one_line(tmp_path: Path, args: list[str], said: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "harness.run.cli", "run", *args, "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, env=dict(os.environ, TMPDIR=str(tmp_path)), timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert said in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
