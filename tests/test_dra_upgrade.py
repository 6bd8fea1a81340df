"""The DRA-UPG area (suites/dra/test_upgrade.py): a DRA driver's rolling update, two instances at once.

The reference driver passes the area on the fake kubelet, and on the real one (real_kubelet); a driver whose subject
file gives it no pod UID (`rolling_update:`) is not exercised, with the reason. Each mutant the area ships with
(refuses-old-claims, private-checkpoint, loads-checkpoint-once, waits-for-old-instance, old-health-wins) failing
exactly its checks is the kill matrix's case (tests/test_kill_matrix.py, fixtures/subjects/reference-dra.yaml).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from harness.config.runconfig import check_templates
from harness.spec.checks import catalog
from harness.spec.subjects import ProfileError, load_subject, parse_profile

UPG_IDS = ["DRA-UPG-01", "DRA-UPG-02", "DRA-UPG-03", "DRA-UPG-04"]
RUN_TIMEOUT_S = 600
JOBS = "4"  # the four checks at once: mostly waiting on the driver and the kubelet
REFERENCE = Path(__file__).resolve().parents[1] / "fixtures" / "subjects" / "reference-dra.yaml"


def fakelet_run(out: Path, *args: str) -> dict:
    proc = subprocess.run([sys.executable, "-m", "harness.run.cli", "run", "--out", str(out),
                           *(a for i in UPG_IDS for a in ("--check", i)), *args],
                          capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    report_file = out / "report.json"
    assert report_file.exists(), f"no report; exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    report = json.loads(report_file.read_text())
    checks = report.get("checks") or []
    if checks and all(c["verdict"] == "skip" for c in checks):
        pytest.skip(checks[0]["detail"].splitlines()[0])  # no API server or real kubelet here
    return report


def verdicts(report: dict) -> dict[str, tuple[str, str]]:
    return {c["id"]: (c["verdict"], c["detail"]) for c in report["checks"]}


def test_the_area_is_listed_with_the_dra_checks() -> None:
    assert [i for i in catalog("suites.dra") if i.startswith("DRA-UPG-")] == UPG_IDS


def test_the_subject_file_says_how_an_instance_gets_its_pod_uid() -> None:
    spec = load_subject("reference-dra")
    assert spec.rolling_update == {"args": ["--pod-uid", "{pod_uid}"], "env": {}}
    check_templates(spec, None, {})  # {pod_uid} is a placeholder there
    base = {"name": "d", "kind": "dra", "driver": "gpu.example.com", "command": ["{python}", "x"]}
    assert parse_profile({**base, "rolling_update": {"env": {"POD_UID": "{pod_uid}"}}}, "my.yaml").rolling_update \
        == {"args": [], "env": {"POD_UID": "{pod_uid}"}}
    with pytest.raises(ProfileError, match="rolling_update: must give each instance its pod UID"):
        parse_profile({**base, "rolling_update": {"args": ["--pod-uid", "fixed"]}}, "my.yaml")
    with pytest.raises(ProfileError, match="rolling_update: is for kind dra"):
        parse_profile({"name": "p", "kind": "device-plugin", "resource": "example.com/gpu", "command": ["x"],
                       "rolling_update": {"args": ["{pod_uid}"]}}, "my.yaml")
    with pytest.raises(ProfileError, match=re.escape("unknown placeholder {pod_uid}")):
        check_templates(parse_profile({**base, "command": ["{python}", "{pod_uid}"]}, "my.yaml"), None, {})


def test_the_reference_driver_passes_the_area_on_the_fake_kubelet(tmp_path: Path, shared_kubeconfig: Path) -> None:
    report = fakelet_run(tmp_path, "--subject", "reference-dra", "--jobs", JOBS,
                         "--control-plane", f"kubeconfig:{shared_kubeconfig}")
    got = verdicts(report)
    assert sorted(got) == UPG_IDS
    assert all(v == "pass" for v, _ in got.values()), got


def test_a_driver_with_sockets_of_one_instance_only_is_not_exercised(tmp_path: Path,
                                                                       shared_kubeconfig: Path) -> None:
    text = REFERENCE.read_text()
    assert "\nrolling_update:" in text
    single = "\n".join(line for line in text.splitlines() if not line.startswith("rolling_update:"))
    path = tmp_path / "single-instance.yaml"
    path.write_text(single.replace("name: reference-dra", "name: single-instance"))
    report = fakelet_run(tmp_path / "out", "--subject-file", str(path), "--jobs", JOBS,
                         "--control-plane", f"kubeconfig:{shared_kubeconfig}")
    got = verdicts(report)
    assert {v for v, _ in got.values()} == {"not-exercised"}, got
    assert all("rolling_update:" in detail for _, detail in got.values()), got


# Two driver instances on a real node cost the default real-kubelet env about 100 s: the area runs on the real
# kubelet in tox -e fidelity (FAKELET_FIDELITY=full), as the other opt-in DRA areas' fidelity rows do.
@pytest.mark.real_kubelet
@pytest.mark.skipif(os.environ.get("FAKELET_FIDELITY") != "full",
                    reason="DRA-UPG on the real kubelet runs in tox -e fidelity (FAKELET_FIDELITY=full)")
def test_the_reference_driver_passes_the_area_on_the_real_kubelet(tmp_path: Path) -> None:
    from harness.node.real.localnode import unavailable

    why = unavailable()
    if why:
        pytest.skip(f"real kubelet: {why}")
    report = fakelet_run(tmp_path, "--subject", "reference-dra", "--node", "real")
    got = verdicts(report)
    assert sorted(got) == UPG_IDS
    assert all(v == "pass" for v, _ in got.values()), got
