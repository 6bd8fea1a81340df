"""The real node's container runtime (issue 36): containerd 2's config as rendered, the fallback to Debian's
containerd and its one line, and the CDI pieces the fake kubelet and the reference device plugin share with it.
Nothing is built or started here (gobuild is stood in for); the run on the real node is in tests/test_kep5970.py.
"""

from __future__ import annotations

import argparse
import json
import os
import tomllib
from pathlib import Path

import pytest

from harness.launch import gobuild
from harness.node.real import configs, runtime
from harness.node.real.view import defined_cdi_devices, runtime_refusals
from harness.reference import cdi
from harness.reference.device_plugin import cdi_env_name, cdi_spec
from harness.run import commands, doctor, prebuild

SOCKET = Path("/tmp/fk-node/containerd.sock")
SHIM = "/root/.cache/fakelet/bin/containerd-shim-runc-v2-0123456789abcdef"


def test_containerd2_config_applies_cdi_from_the_nodes_dir_only() -> None:
    config = tomllib.loads(configs.containerd2_toml(SOCKET, "fakelet.local/node:1", "/var/run/cdi", SHIM))
    assert config["version"] == 3  # containerd 2.0's format: every containerd 2 the module may pin reads it
    assert config["grpc"]["address"] == str(SOCKET)
    assert (config["root"], config["state"]) == ("/var/lib/containerd", "/run/containerd")
    cri = config["plugins"]["io.containerd.cri.v1.runtime"]
    assert cri["cdi_spec_dirs"] == ["/var/run/cdi"]  # never the host's /etc/cdi
    assert "enable_cdi" not in cri  # containerd 2 always applies CDI devices and drops the key
    assert cri["restrict_oom_score_adj"] is True and cri["disable_apparmor"] is True
    runc = cri["containerd"]["runtimes"]["runc"]
    assert cri["containerd"]["default_runtime_name"] == "runc"
    assert (runc["runtime_type"], runc["runtime_path"]) == ("io.containerd.runc.v2", SHIM)
    assert runc["options"]["SystemdCgroup"] is False
    images = config["plugins"]["io.containerd.cri.v1.images"]
    assert images["snapshotter"] == "native"
    assert images["pinned_images"]["sandbox"] == "fakelet.local/node:1"


def test_containerd16_config_keeps_its_version_2_format() -> None:
    config = tomllib.loads(configs.containerd_toml(SOCKET, "fakelet.local/node:1"))
    assert config["version"] == 2
    assert config["plugins"]["io.containerd.grpc.v1.cri"]["sandbox_image"] == "fakelet.local/node:1"


def test_the_wrapper_module_pins_containerd_2() -> None:
    major = int(runtime.pinned_version().split(".")[0])
    assert major == 2
    assert set(runtime.COMMANDS) == {"containerd", "containerd-shim-runc-v2", "ctr"}
    assert [b.name for b in prebuild.node_runtime()] == list(runtime.COMMANDS)


def no_go(*args: object, **kwargs: object) -> Path:
    raise gobuild.GoUnavailable("go toolchain not found on PATH")


def test_without_a_build_the_node_falls_back_to_debians_containerd_in_one_line(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(runtime.RUNTIME_ENV, raising=False)
    monkeypatch.setattr(gobuild, "build", no_go)
    found = runtime.find()
    assert not found.cdi and found.containerd == "containerd" and found.shim is None
    line = found.fallback
    assert line is not None and "\n" not in line
    assert line.startswith(f"fakelet: the real node runs Debian's containerd {found.version}, which applies no CDI")
    assert "containerd 2 could not be built: go toolchain not found on PATH" in line
    assert "KEP5970-05" in line and "DP-NODE-04" in line


def test_a_runs_decision_reaches_its_check_processes_without_a_second_build(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv(runtime.RUNTIME_ENV, raising=False)
    monkeypatch.setattr(gobuild, "build", no_go)
    monkeypatch.setattr(commands, "_runtime_said", [])
    commands.decide_runtime()
    commands.decide_runtime()  # a second subject of the same run: the line is said once
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Debian's containerd" in err[0]
    # A check process inherits the decision: it never builds, and says the same reason.
    monkeypatch.setattr(gobuild, "build", lambda *a, **k: pytest.fail("a check process built containerd again"))
    again = runtime.find()
    assert not again.cdi and "go toolchain not found" in (again.reason or "")
    assert runtime.in_use() is None


def test_asking_for_debians_containerd_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(runtime.RUNTIME_ENV, "debian")
    monkeypatch.setattr(gobuild, "build", lambda *a, **k: pytest.fail("asked for Debian's, built containerd 2"))
    assert f"(${runtime.RUNTIME_ENV}=debian)" in (runtime.find().fallback or "")


def test_a_built_containerd_2_applies_cdi(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(runtime.RUNTIME_ENV, raising=False)
    monkeypatch.setattr(gobuild, "build", lambda module, package, name, **k: tmp_path / f"{name}-0")
    found = runtime.find()
    assert found.cdi and found.fallback is None and found.shim == str(tmp_path / "containerd-shim-runc-v2-0")
    assert found.label == f"containerd {runtime.pinned_version()} (built from the Go module proxy)"
    runtime.announce(found)
    assert os.environ[runtime.RUNTIME_ENV] == runtime.BUILT


def test_doctor_says_which_runtime_the_real_node_gets() -> None:
    m = doctor.Machine(offline=True, root=True, files=Path("."), node_runtime=prebuild.node_runtime())
    m.found = {b: None for b in m.node_runtime}  # nothing cached, and no Go: Debian's containerd
    tier = doctor.runtime_tier(m)
    assert tier.status == doctor.LIMITED and "cannot be built, so Debian's containerd" in tier.what
    assert "KEP5970-05" in tier.what and tier.fix == gobuild.GO_FIX
    m.found = {b: ("cached", Path(f"/c/{b.name}")) for b in m.node_runtime}
    tier = doctor.runtime_tier(m)
    assert tier.status == doctor.OK and f"containerd {runtime.pinned_version()} cached" in tier.what


def test_an_undefined_cdi_device_is_refused_as_containerd_2_refuses_it(tmp_path: Path) -> None:
    ids = ["gpu-0", "gpu-1"]
    response = {"cdi_devices": [{"name": f"fakelet.example.com/gpu={i}"} for i in ids]}
    assert runtime_refusals([response]) == []  # no CDI dir: CDI devices are not looked at
    refused = runtime_refusals([response], tmp_path)
    assert refused == ["CDI device injection failed: unresolvable CDI devices fakelet.example.com/gpu=gpu-0, "
                       "fakelet.example.com/gpu=gpu-1"]
    cdi.write_spec(tmp_path / "fakelet.example.com-gpu.json", cdi_spec("fakelet.example.com/gpu", ids))
    assert defined_cdi_devices(tmp_path) == {f"fakelet.example.com/gpu={i}" for i in ids}
    assert runtime_refusals([response], tmp_path) == []


def test_the_reference_plugins_cdi_spec_sets_one_variable_per_device() -> None:
    spec = cdi_spec("nvidia.com/gpu", ["GPU-1a2b", "0000:03:00.0"])
    assert spec["kind"] == "nvidia.com/gpu"
    assert json.loads(json.dumps(spec))["devices"][1]["containerEdits"]["env"] == ["FAKELET_CDI_GPU_1A2B=GPU-1a2b"]
    assert cdi_env_name("0000:03:00.0") == "FAKELET_CDI_0000_03_00_0"
    assert all(cdi.DEVICE_NAME_RE.match(d["name"]) for d in spec["devices"])


def test_the_reference_plugin_defines_what_it_names_unless_its_defect_says(tmp_path: Path) -> None:
    from harness.reference.device_plugin import ReferencePlugin, parse_args

    inventory = Path(__file__).parent.parent / "fixtures" / "inventories" / "basic.yaml"
    for defect, defined in ((None, True), ("no-cdi-spec", False)):
        cdi_dir = tmp_path / str(defect)
        argv = ["--plugin-dir", str(tmp_path), "--inventory", str(inventory), "--cdi-dir", str(cdi_dir)]
        args: argparse.Namespace = parse_args(argv + (["--defect", defect] if defect else []))
        plugin = ReferencePlugin(args)
        plugin.define_cdi_devices(["gpu-0"])
        assert (defined_cdi_devices(cdi_dir) == {"fakelet.example.com/gpu=gpu-0"}) is defined, defect
