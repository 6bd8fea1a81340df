"""The kep5970 suite (issue 26): kubernetes/enhancements#5970's seven behaviours, judged through the API.

What needs no cluster runs everywhere: the suite's catalog and JUnit names, the environment diff and
the runtime rule behind KEP5970-05, and the live-cluster flags' one-line errors. Marked `real_kubelet`:
the suite on the local real kubelet passes on the reference DRA driver and dra-example-driver, and
fails on two mutants of the reference driver, each naming its KEP check. The mutants run under the
fidelity table's mutant bound (6 s; `fakelet fidelity --mutant-bound`), which only shortens how long a
mutant that never reacts is waited for.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from harness.node.real import runtime
from harness.spec.checks import catalog
from harness.world.kepworld import CDI_CONTAINERD, containerd_version, env_of
from reports.model import FAIL, NOT_EXERCISED, PASS, CheckResult, SubjectReport
from reports.writers import write_junit

KEP_IDS = [f"KEP5970-0{n}" for n in range(1, 8)]
RUN_TIMEOUT_S = 600
MUTANT_BOUND_S = "6"  # harness/run/commands.py MUTANT_BOUND_S
# Each check of the suite and the mutant of the reference driver that fails it (the kill matrix runs the DRA
# suite; these run here): the driver never registers, or never answers an unprepare.
# Each mutant: the checks it fails, and the checks of stages before its broken one, which still pass (the suite
# names the broken behaviour, not everything after it).
MUTANTS = {"getinfo-slow": ({"KEP5970-01", "KEP5970-04"}, {"KEP5970-02", "KEP5970-03"}),
           "unprepare-hang": ({"KEP5970-06"}, {"KEP5970-01", "KEP5970-02", "KEP5970-03", "KEP5970-04"}),
           # Two slices of one pool with the same device: kube-scheduler finds the pool invalid and allocates nothing.
           "bad-slice": ({"KEP5970-03"}, {"KEP5970-02"}),
           "empty-slice": ({"KEP5970-02"}, set()),
           "stuck-after-unprepare": ({"KEP5970-07"},
                                     {"KEP5970-01", "KEP5970-02", "KEP5970-03", "KEP5970-04", "KEP5970-06"}),
           # Prepared, then containerd 2 refuses the container: "CDI device injection failed: unresolvable CDI devices".
           "cdi-kind-mismatch": ({"KEP5970-05"}, {"KEP5970-01", "KEP5970-02", "KEP5970-03", "KEP5970-04"})}
# The default real-kubelet env runs these two (the running container, the second pod; each holds the stages
# before its own); tox -e fidelity (FAKELET_FIDELITY=full) runs every mutant. Each costs a real node and a control
# plane, about 45 s, and the default run has no room for all six within its 25 minutes.
SAMPLED_MUTANTS = ("cdi-kind-mismatch", "stuck-after-unprepare")
FIDELITY_ENV = "FAKELET_FIDELITY"
# KEP5970-05 is judged where the real node runs containerd 2 (harness/node/real/runtime.py), and not exercised on
# Debian's containerd 1.6, which applies no CDI device.
REAL_CONTAINERD_ENV = "KEP5970-05"


def fakelet(cwd: Path, *args: str, timeout: float = RUN_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "harness.run.cli", *args], capture_output=True, text=True,
                          env=dict(os.environ, TMPDIR=str(cwd)), timeout=timeout, cwd=cwd)


def test_the_suite_names_the_keps_seven_behaviours() -> None:
    checks = catalog("suites.kep5970")
    assert sorted(checks) == KEP_IDS
    titles = [checks[i][1].split(":")[0] for i in KEP_IDS]
    assert titles == ["Driver Registration", "ResourceSlice Publishing", "Device Allocation", "NodePrepareResources",
                      "Pod Runs Successfully", "NodeUnprepareResources", "Resource Reuse"]


def test_junit_uses_the_suites_own_name(tmp_path: Path) -> None:
    report = SubjectReport(subject="gpu.example.com", profile="fast", seed=0, suite="kep5970",
                           checks=[CheckResult("KEP5970-02", "MUST", "ResourceSlice Publishing: x", PASS, 1.0)])
    write_junit(report, tmp_path / "junit.xml")
    suite = ET.parse(tmp_path / "junit.xml").getroot()
    assert suite.get("name") == "kep5970"
    assert suite.find("testcase").get("name") == "KEP5970-02 ResourceSlice Publishing: x"


def test_the_injected_environment_is_what_the_claim_added() -> None:
    plain = env_of("PATH=/bin\nHOSTNAME=node\n")
    probe = env_of("PATH=/bin\nHOSTNAME=node\nGPU_DEVICE_0=gpu-0\nbroken line\n")
    assert sorted(k for k, v in probe.items() if plain.get(k) != v) == ["GPU_DEVICE_0"]


def test_only_a_runtime_known_without_cdi_makes_the_environment_not_exercised() -> None:
    assert containerd_version("containerd://1.6.20") == (1, 6) < CDI_CONTAINERD
    assert containerd_version("containerd://v2.1.0") == (2, 1) >= CDI_CONTAINERD
    assert containerd_version("cri-o://1.30.0") is None  # judged on what the container got


@pytest.mark.parametrize("args, words", [
    (["--cluster", "kubeconfig:/nonexistent/kubeconfig", "--driver", "gpu.example.com", "--device-class", "gpu"],
     "no such kubeconfig file"),
    (["--cluster", "kubeconfig:KUBECONFIG", "--device-class", "gpu"], "give --driver NAME"),
    (["--cluster", "kubeconfig:KUBECONFIG", "--driver", "gpu.example.com"], "give --device-class CLASS"),
    (["--cluster", "kubeconfig:KUBECONFIG", "--driver", "gpu.example.com", "--device-class", "gpu",
      "--subject", "reference-dra"], "drop --subject"),
    (["--subject", "reference-dp", "--node", "real"], "--suite kep5970 is for a dra subject"),
    (["--subject", "reference-dra", "--device-class", "gpu"], "--device-class goes with --cluster"),
    (["--subject", "reference-dra"], "judges real pods: run it with --node real"),
])
def test_bad_input_is_one_line_and_leaves_nothing(tmp: Path, args: list[str], words: str) -> None:
    kubeconfig = tmp / "kubeconfig"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\nusers: []\n")
    args = [a.replace("KUBECONFIG", str(kubeconfig)) for a in args]
    got = fakelet(tmp, "run", "--suite", "kep5970", *args, "--out", "r", timeout=120)
    assert got.returncode == 2, got.stdout + got.stderr
    assert words in got.stderr and len(got.stderr.strip().splitlines()) == 1, got.stderr
    assert not (tmp / "r").exists()


# -- on the local real kubelet -------------------------------------------------------------------------------


def need_real_kubelet() -> None:
    from harness.node.real.localnode import unavailable

    why = unavailable()
    if why:
        pytest.skip(f"real kubelet: {why}")


def verdicts_of(report: dict) -> dict[str, str]:
    return {c["id"]: c["verdict"] for c in report["checks"]}


@pytest.mark.real_kubelet
def test_the_reference_driver_and_dra_example_driver_pass_on_the_real_kubelet(tmp: Path) -> None:
    need_real_kubelet()
    got = fakelet(tmp, "run", "--suite", "kep5970", "--node", "real", "--subject", "reference-dra",
                  "--subject", "dra-example-driver", "--out", "r")
    index = json.loads((tmp / "r" / "report.json").read_text())
    for report in index["runs"]:
        verdicts = verdicts_of(report)
        if any(v == "skip" for v in verdicts.values()):
            pytest.skip(f"{report['subject']}: {next(c['detail'] for c in report['checks'] if c['verdict'] == 'skip')}")
        assert sorted(verdicts) == KEP_IDS
        # containerd before 1.7 applies no CDI device: the driver's environment cannot reach a container there. The
        # run built containerd 2 unless it could not (it is cached then): the node ran it, and 05 is judged.
        containerd2 = runtime.cached() is not None
        allowed = {i: {PASS} for i in KEP_IDS} | {REAL_CONTAINERD_ENV: {PASS} if containerd2 else {PASS, NOT_EXERCISED}}
        wrong = {i: v for i, v in verdicts.items() if v not in allowed[i]}
        assert not wrong, (report["subject"], wrong, [c["detail"] for c in report["checks"] if c["id"] in wrong])
        if containerd2:
            # The variables the claim added, as the container printed them, on containerd 2 (kubelet's nodeInfo).
            notes = next(c["notes"] for c in report["checks"] if c["id"] == REAL_CONTAINERD_ENV)
            assert re.fullmatch(r"the claim's container got \S.* from the driver \(runtime containerd://2\.\d+.*\)",
                                notes[0]), notes
            assert report["provenance"]["components"]["containerd"].startswith(runtime.pinned_version())
        # `fakelet run --suite kep5970` starts the local kube-scheduler: the allocation KEP5970-03 judged is its.
        notes = next(c["notes"] for c in report["checks"] if c["id"] == "KEP5970-03")
        assert notes == ["allocated by the local kube-scheduler"], notes
        assert report["provenance"]["components"]["kube-scheduler"] == report["provenance"]["components"][
            "kube-apiserver"]
        junit = ET.parse(tmp / "r" / report["subject"] / "junit.xml").getroot()
        assert junit.get("name") == "kep5970"
    assert got.returncode == 0, got.stdout + got.stderr


@pytest.mark.real_kubelet
@pytest.mark.parametrize("defect", sorted(MUTANTS) if os.environ.get(FIDELITY_ENV) == "full" else SAMPLED_MUTANTS)
def test_a_mutant_of_the_reference_driver_fails_its_kep_checks(tmp: Path, defect: str) -> None:
    need_real_kubelet()
    fails, passes = MUTANTS[defect]
    if REAL_CONTAINERD_ENV in fails and runtime.cached() is None:
        pytest.skip(f"{defect}: the real node runs Debian's containerd 1.6 (containerd 2 was not built), which "
                    f"applies no CDI device, so {REAL_CONTAINERD_ENV} cannot fail")
    got = fakelet(tmp, "run", "--suite", "kep5970", "--node", "real", "--subject", "reference-dra", "--defect",
                  defect, "--reaction-bound", MUTANT_BOUND_S, "--out", "r")
    report = json.loads((tmp / "r" / "report.json").read_text())
    verdicts = verdicts_of(report)
    failed = {i for i, v in verdicts.items() if v == FAIL}
    assert failed == fails, (failed, [c["detail"] for c in report["checks"]])
    assert {i for i in passes if verdicts[i] != PASS} == set(), verdicts
    assert got.returncode == 1


# -- against a cluster (here: a local API server with no node, which a kubeconfig names like any cluster's) ------


def test_a_cluster_without_the_driver_fails_publishing_and_leaves_no_objects(tmp: Path, shared_kubeconfig) -> None:
    from harness.controlplane.client import KubeClient

    client = KubeClient.from_kubeconfig(shared_kubeconfig)
    driver = "absent.fakelet.example.com"
    client.create("/apis/resource.k8s.io/v1/deviceclasses", {
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "kep-absent"},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{driver}"'}}]}})
    try:
        missing = fakelet(tmp, "run", "--suite", "kep5970", "--cluster", f"kubeconfig:{shared_kubeconfig}",
                          "--driver", driver, "--device-class", "kep-no-such-class", "--out", "r0", timeout=120)
        assert missing.returncode == 2 and "no such DeviceClass" in missing.stderr, missing.stderr
        got = fakelet(tmp, "run", "--suite", "kep5970", "--cluster", f"kubeconfig:{shared_kubeconfig}",
                      "--driver", driver, "--device-class", "kep-absent", "--reaction-bound", "2", "--out", "r")
        report = json.loads((tmp / "r" / "report.json").read_text())
        verdicts = verdicts_of(report)
        assert verdicts["KEP5970-02"] == FAIL and "no device" in next(
            c["detail"] for c in report["checks"] if c["id"] == "KEP5970-02")
        assert {v for i, v in verdicts.items() if i != "KEP5970-02"} == {NOT_EXERCISED}
        assert got.returncode == 1 and report["suite"] == "kep5970"
        # Its namespace is deleted (a bare API server has no namespace controller to finish that: Terminating).
        left = [n for n in client.list("/api/v1/namespaces") if n["metadata"]["name"].startswith("fakelet-kep5970-")
                and not n["metadata"].get("deletionTimestamp")]
        assert left == []
    finally:
        client.delete("/apis/resource.k8s.io/v1/deviceclasses/kep-absent")
        client.close()
