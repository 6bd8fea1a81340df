"""DRA-EXT-02 (suites/dra/test_beside.py): a DRA driver beside a device plugin for the same hardware publishes and
prepares none of the device plugin's devices.

The subject-file entry that tells a driver the device plugin's devices (`device_plugin_beside:`), the reference
device plugin's `--only-devices` and the reference driver's `--exclude-devices`, how fakelet tells which hardware a
device stands for, and the check end to end: the reference driver passes, its mutant ignores-device-plugin fails,
and a driver whose subject file has no entry is not applicable, with the reason.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness.config.runconfig import check_templates
from harness.reference import dra_beside
from harness.reference.device_plugin import ReferencePlugin
from harness.reference.device_plugin import parse_args as dp_args
from harness.spec.checks import catalog
from harness.spec.subjects import ProfileError, load_subject, parse_profile
from harness.world import dp_beside
from harness.world.devicemap import HardwareDevice

CHECK = "DRA-EXT-02"
RUN_TIMEOUT_S = 600
ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "fixtures" / "subjects" / "reference-dra.yaml"


def test_the_check_is_listed_with_the_dra_checks() -> None:
    assert CHECK in catalog("suites.dra")


def test_the_subject_file_says_how_the_driver_is_told_the_device_plugins_devices() -> None:
    spec = load_subject("reference-dra")
    assert spec.device_plugin_beside == {"args": ["--exclude-devices", "{dp_devices}"], "env": {}}
    check_templates(spec, None, {})  # {dp_devices} is a placeholder there
    base = {"name": "d", "kind": "dra", "driver": "gpu.example.com", "command": ["{python}", "x"]}
    assert parse_profile({**base, "device_plugin_beside": {"env": {"SKIP": "{dp_uuids}"}}},
                         "my.yaml").device_plugin_beside == {"args": [], "env": {"SKIP": "{dp_uuids}"}}
    assert parse_profile(base, "my.yaml").device_plugin_beside is None
    with pytest.raises(ProfileError, match="device_plugin_beside: must tell the driver the device plugin's devices"):
        parse_profile({**base, "device_plugin_beside": {"args": ["--exclude-devices", "gpu-0"]}}, "my.yaml")
    with pytest.raises(ProfileError, match="device_plugin_beside: is for kind dra"):
        parse_profile({"name": "p", "kind": "device-plugin", "resource": "example.com/gpu", "command": ["x"],
                       "device_plugin_beside": {"args": ["{dp_devices}"]}}, "my.yaml")
    with pytest.raises(ProfileError, match=re.escape("unknown placeholder {dp_devices}")):
        check_templates(parse_profile({**base, "command": ["{python}", "{dp_devices}"]}, "my.yaml"), None, {})


def test_the_reference_device_plugin_serves_only_its_share(tmp_path: Path) -> None:
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text((ROOT / "fixtures" / "inventories" / "basic.yaml").read_text())
    every = ReferencePlugin(dp_args(["--plugin-dir", str(tmp_path), "--inventory", str(inventory)]))
    assert [d["id"] for d in every.devices] == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
    some = ReferencePlugin(dp_args(["--plugin-dir", str(tmp_path), "--inventory", str(inventory),
                                    "--only-devices", "gpu-1,gpu-3"]))
    assert [d["id"] for d in some.devices] == ["gpu-1", "gpu-3"]


def test_the_reference_driver_leaves_the_excluded_devices_alone() -> None:
    devices = [SimpleNamespace(id=f"gpu-{i}") for i in range(4)]
    excluded = dra_beside.parse("gpu-0, gpu-1,")
    assert excluded == {"gpu-0", "gpu-1"}
    assert [d.id for d in dra_beside.kept(devices, excluded, None)] == ["gpu-2", "gpu-3"]
    assert dra_beside.kept(devices, dra_beside.parse(""), None) == devices
    assert dra_beside.kept(devices, excluded, "ignores-device-plugin") == devices  # the mutant


def test_which_hardware_a_device_stands_for() -> None:
    hw = [HardwareDevice("gpu-0", ("/sb/hw/dev/fakegpu0",), ("GPU-aaaa", "", "0000:01:00.0")),
          HardwareDevice("gpu-1", ("/sb/hw/dev/fakegpu1",), ("GPU-bbbb", "", "0000:02:00.0"))]
    assert [[h.id for h in part] for part in dp_beside.split(hw)] == [["gpu-0"], ["gpu-1"]]
    # A device plugin's Allocate answer: its device nodes.
    response = {"devices": [{"host_path": "/sb/hw/dev/fakegpu1", "container_path": "/dev/fakelet/gpu-1"}],
                "envs": {"FAKELET_DEVICES": "gpu-1"}}
    assert dp_beside.identify(hw, *dp_beside.allocate_evidence(response, Path("/nonexistent"))) == {"gpu-1"}
    # A published device: its UUID attribute.
    published = {"name": "gpu-0", "attributes": {"uuid": {"string": "GPU-aaaa"}, "index": {"int": 0}}}
    assert dp_beside.identify(hw, *dp_beside.slice_evidence(published)) == {"gpu-0"}
    assert dp_beside.identify(hw, *dp_beside.slice_evidence({"name": "x", "attributes": {}})) == set()


def test_a_cdi_device_stands_for_the_hardware_its_edits_name(tmp_path: Path) -> None:
    hw = [HardwareDevice("gpu-0", ("/sb/hw/dev/fakegpu0",), ("GPU-aaaa",)),
          HardwareDevice("gpu-1", ("/sb/hw/dev/fakegpu1",), ("GPU-bbbb",))]
    spec = {"cdiVersion": "0.6.0", "kind": "gpu.example.com/gpu",
            "devices": [{"name": "a", "containerEdits": {"deviceNodes": [{"path": "/dev/x", "hostPath":
                                                                          "/sb/hw/dev/fakegpu1"}]}},
                        {"name": "b", "containerEdits": {"env": ["UUID=GPU-aaaa"]}}]}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    assert dp_beside.identify(hw, *dp_beside.cdi_evidence(tmp_path, "gpu.example.com/gpu=a")) == {"gpu-1"}
    assert dp_beside.identify(hw, *dp_beside.cdi_evidence(tmp_path, "gpu.example.com/gpu=b")) == {"gpu-0"}
    assert dp_beside.identify(hw, *dp_beside.cdi_evidence(tmp_path, "gpu.example.com/gpu=c")) == set()


# -- end to end ---------------------------------------------------------------------------------------------------


def fakelet_run(out: Path, *args: str) -> tuple[str, str]:
    proc = subprocess.run([sys.executable, "-m", "harness.run.cli", "run", "--out", str(out), "--check", CHECK,
                           *args], capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    report_file = out / "report.json"
    assert report_file.exists(), f"no report; exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    checks = json.loads(report_file.read_text()).get("checks") or []
    assert [c["id"] for c in checks] == [CHECK]
    if checks[0]["verdict"] == "skip":
        pytest.skip(checks[0]["detail"].splitlines()[0])  # no API server here
    return checks[0]["verdict"], checks[0]["detail"]


# The reference driver's pass and ignores-device-plugin's fail are the kill matrix's (tests/test_kill_matrix.py).


def test_a_driver_that_cannot_be_told_is_not_applicable(tmp_path: Path, shared_kubeconfig: Path) -> None:
    text = REFERENCE.read_text()
    assert "\ndevice_plugin_beside:" in text
    alone = "\n".join(line for line in text.splitlines() if not line.startswith("device_plugin_beside:"))
    path = tmp_path / "alone.yaml"
    path.write_text(alone.replace("name: reference-dra", "name: alone"))
    verdict, detail = fakelet_run(tmp_path / "out", "--subject-file", str(path),
                                  "--control-plane", f"kubeconfig:{shared_kubeconfig}")
    assert verdict == "n/a", detail
    assert "device_plugin_beside:" in detail, detail
