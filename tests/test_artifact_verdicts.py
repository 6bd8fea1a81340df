"""Issue 28's verdicts that were artifacts, at unit level: coverage waits for a plugin's first read (its own
poll period, up to T) and ends at once when the read comes."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from fake_devices.access import AccessTrace
from harness.spec.profiles import FAST
from harness.spec.subjects import SubjectSpec, default_backend
from harness.world.env import DPEnv, SubjectUnavailable
from reports.model import merge_fact, merge_facts


def backend_env(poll_s: float | None = None) -> DPEnv:
    spec = SubjectSpec(name="t", kind="device-plugin", command=["/bin/true"], resource="example.com/t",
                       backend=default_backend(), poll_s=poll_s)
    env = DPEnv(spec, FAST)
    assert env.devices is not None
    env.access = AccessTrace(env.devices.root, env.timeline).start()  # what start_subject does
    return env


def health_file(env: DPEnv) -> Path:
    assert env.devices is not None
    return next(env.devices.root.glob("sys/class/*/*/health"))


def test_coverage_waits_for_a_late_first_read_and_ends_on_it() -> None:
    env = backend_env()
    try:
        late = threading.Timer(0.6, health_file(env).read_text)  # a plugin whose health client starts late
        late.start()
        began = time.monotonic()
        assert env.await_read("health") == "sysfs"
        took = time.monotonic() - began
        late.join()
        assert 0.5 < took < 5.0  # it waited for the read, and not a moment past it
        env.require_drive("health")  # held to it: no not-exercised
    finally:
        env.close()


def test_a_declared_poll_period_bounds_the_wait_and_the_detail_says_so() -> None:
    env = backend_env(poll_s=0.2)
    try:
        assert env.coverage_window_s() == pytest.approx(0.4)
        began = time.monotonic()
        with pytest.raises(pytest.skip.Exception) as verdict:  # not_exercised: a skip with its marker
            env.require_drive("temperature")
        assert time.monotonic() - began < 3.0
        text = str(verdict.value)
        assert "0.4s (2 of its 0.2s poll periods" in text and "read none of the fake hardware's files" in text
    finally:
        env.close()


def test_not_exercised_on_nvml_names_the_nvml_call_log_not_sysfs_files() -> None:
    spec = SubjectSpec(name="t", kind="device-plugin", command=["/bin/true"], resource="example.com/t",
                       backend={**default_backend(), "skin": "nvml"}, poll_s=0.1)
    try:
        env = DPEnv(spec, FAST)
    except SubjectUnavailable as err:  # no C compiler for the fake libnvidia-ml.so.1
        pytest.skip(str(err))
    try:
        env.access = AccessTrace(env.devices.root, env.timeline).start()  # type: ignore[union-attr]
        with pytest.raises(pytest.skip.Exception) as verdict:
            env.require_drive("health")
        assert "its NVML calls: none" in str(verdict.value), verdict.value
        with pytest.raises(pytest.skip.Exception) as verdict:
            env.require_surface_read("health", "nvml", "the plugin watched no NVML events")
        assert str(verdict.value).count("its NVML calls: none") == 1
    finally:
        env.close()


def test_without_a_poll_period_coverage_waits_up_to_t() -> None:
    env = backend_env()
    try:
        assert env.coverage_window_s() == FAST.reaction_s == 30.0
        assert "T, the kubelet's reaction bound" in env.coverage_window()
    finally:
        env.close()


def test_a_window_counted_from_an_earlier_moment_is_not_waited_again() -> None:
    env = backend_env(poll_s=0.2)
    try:
        long_ago = env.now() - int(10e9)
        began = time.monotonic()
        assert env.await_read("health", since_ns=long_ago) is None
        assert time.monotonic() - began < 0.2
    finally:
        env.close()


# -- the plugin's own overtemperature limit ------------------------------------------------------------------------

HOT_PLUGIN = ("{python} -m harness.reference.device_plugin --plugin-dir {plugin_dir} --kubelet-socket {kubelet_socket} "
              "--resource {resource} --sysfs-root {sysfs_root} --dev-dir {dev_dir} --temp-threshold-c 100")


def overtemperature(out: Path, *flags: str) -> dict:
    """DP-HLT-04 on a plugin whose own limit is 100 C (the reference plugin told so), and the report."""
    proc = subprocess.run([sys.executable, "-m", "harness.run.cli", "run", "--plugin-cmd", HOT_PLUGIN,
                           "--resource", "fakelet.example.com/gpu", "--observes", "temperature", "--check",
                           "DP-HLT-04", "--jobs", "1", "--out", str(out), *flags],
                          capture_output=True, text=True, timeout=300)
    assert (out / "report.json").is_file(), proc.stdout + proc.stderr
    report = json.loads((out / "report.json").read_text())
    return report["subjects"][0] if "subjects" in report else report


def hlt04(report: dict) -> dict:
    return next(c for c in report["checks"] if c["id"] == "DP-HLT-04")


def test_the_plugins_own_limit_from_the_flag_is_the_one_judged(tmp_path: Path) -> None:
    report = overtemperature(tmp_path, "--thermal-threshold", "100")
    check = hlt04(report)
    assert check["verdict"] == "pass", check["detail"]
    assert any("100 C (hysteresis 5 C), from --thermal-threshold" in n for n in check["notes"]), check["notes"]
    assert report["facts"]["overtemperature limit"].startswith("100 C (hysteresis 5 C), from --thermal-threshold")


def test_without_the_plugins_limit_the_detail_names_fakelets_default(tmp_path: Path) -> None:
    check = hlt04(overtemperature(tmp_path))
    # Heated to 95 C, under the plugin's own 100 C: it stays Healthy, and the verdict says against which limit.
    assert check["verdict"] == "fail"
    assert "at 95 C (the plugin's limit: 85 C (hysteresis 5 C), from fakelet's default" in check["detail"]


def test_the_limit_from_a_subject_file_is_named_with_its_line(tmp_path: Path) -> None:
    path = tmp_path / "hot.yaml"
    path.write_text(textwrap.dedent(f"""\
        name: hot
        kind: device-plugin
        command: {json.dumps(shlex.split(HOT_PLUGIN))}
        resource: fakelet.example.com/gpu
        backend:
          inventory: inventories/basic.yaml
          observes: [temperature]
          thermal: {{threshold_c: 100}}
        """))
    proc = subprocess.run([sys.executable, "-m", "harness.run.cli", "run", "--subject-file", str(path), "--check",
                           "DP-HLT-04", "--jobs", "1", "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=300)
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    report = report["subjects"][0] if "subjects" in report else report
    check = hlt04(report)
    assert check["verdict"] == "pass", (check["detail"], proc.stderr[-2000:])
    assert any(f"100 C (hysteresis 5 C), from {path}:8: backend.thermal (the subject file)" in n
               for n in check["notes"]), check["notes"]


@pytest.mark.parametrize("value", ["nan", "5", "400"])
def test_a_thermal_threshold_out_of_range_is_a_usage_error(tmp_path: Path, value: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "harness.run.cli", "run", "--subject", "reference-dp",
                           "--thermal-threshold", value, "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert f"--thermal-threshold {value}" in proc.stderr and "degrees C, 20 to 150" in proc.stderr, proc.stderr
    assert not (tmp_path / "report.json").exists()


# -- run-level facts merged across checks ---------------------------------------------------------------------------


def test_run_level_facts_unite_every_checks_never_the_first_only() -> None:
    facts: dict = {}
    merge_facts(facts, {"NVML calls": "nvmlInit_v2 x1, nvmlDeviceGetCount_v2 x1",
                        "Level-Zero sidecar calls": "none: the plugin never asked it",
                        "fake hardware read": {"health": ["a"], "nodes": []}, "cgroup": "v2"})
    merge_facts(facts, {"NVML calls": "nvmlEventSetWait_v2 x12, nvmlInit_v2 x1",
                        "Level-Zero sidecar calls": "GetDeviceHealth x3",
                        "fake hardware read": {"health": ["b"], "temperature": ["t"]}, "cgroup": "v2"})
    # The event wait every health check's own timeline shows is in the run's fact too.
    assert facts["NVML calls"] == "nvmlEventSetWait_v2 x12, nvmlInit_v2 x2, nvmlDeviceGetCount_v2 x1"
    assert facts["Level-Zero sidecar calls"] == "GetDeviceHealth x3"  # a "none" gives way to what was seen
    assert facts["fake hardware read"] == {"health": ["a", "b"], "nodes": [], "temperature": ["t"]}
    assert facts["cgroup"] == "v2"
    assert merge_fact("mapped by Allocate", "mapped by identity") == "mapped by Allocate; mapped by identity"


# -- details that show the cause ------------------------------------------------------------------------------------


def test_a_flap_verdict_shows_the_last_state_the_plugin_reported(tmp_path: Path) -> None:
    """stuck-unhealthy sends its all-Unhealthy list during the flap and nothing after: the detail must say so."""
    proc = subprocess.run([sys.executable, "-m", "harness.run.cli", "run", "--subject", "reference-dp", "--defect",
                           "stuck-unhealthy", "--check", "DP-HLT-03", "--reaction-bound", "4", "--jobs", "1",
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=300)
    report = json.loads((tmp_path / "report.json").read_text())
    report = report["subjects"][0] if "subjects" in report else report
    check = next(c for c in report["checks"] if c["id"] == "DP-HLT-03")
    assert check["verdict"] == "fail", (check["detail"], proc.stderr[-2000:])
    assert "the last state the plugin reported: " in check["detail"], check["detail"]
    assert "gpu-0=Unhealthy" in check["detail"] and "answering +" in check["detail"], check["detail"]
    assert "device.fail [devices] device=gpu-0" in check["detail"] and "no list since" in check["detail"]


def test_a_restart_storm_verdict_starts_from_the_cause(tmp_path: Path) -> None:
    """no-reregister: the detail shows the stream the restart ended and the plugin's own last words."""
    proc = subprocess.run([sys.executable, "-m", "harness.run.cli", "run", "--subject", "reference-dp", "--defect",
                           "no-reregister", "--check", "DP-RST-02", "--reaction-bound", "4", "--jobs", "1",
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=300)
    report = json.loads((tmp_path / "report.json").read_text())
    report = report["subjects"][0] if "subjects" in report else report
    check = next(c for c in report["checks"] if c["id"] == "DP-RST-02")
    assert check["verdict"] == "fail", (check["detail"], proc.stderr[-2000:])
    detail = check["detail"]
    assert detail.startswith("expected restart 1: an accepted registration"), detail
    assert "kubelet.stream_end [kubelet]" in detail, detail
    assert "its last output:" in detail, detail
