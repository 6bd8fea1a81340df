"""The fake NVML library against NVIDIA's own binding (nvidia-ml-py), fed by the fake backend."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fake_devices.backend import DeviceBackend
from fake_devices.model import Inventory
from fake_devices.nvml import build
from fake_devices.nvml.surface import CALL_EVENT, XID_DBE, XID_FALLEN_OFF_BUS, CallFollower, NvmlSurface
from harness.instruments.timeline import Timeline
from harness.spec.subjects import fixtures_dir, load_yaml

CONSUMER = Path(__file__).resolve().parent / "nvml_consumer.py"
STEP_S = 30.0  # one step of the consumer: a Python start and an NVML call or a wait
EVENT_XID, EVENT_DBE = 0x8, 0x2  # nvmlEventTypeXidCriticalError, nvmlEventTypeDoubleBitEccError


def _library() -> Path:
    pytest.importorskip("pynvml", reason="nvidia-ml-py (NVIDIA's NVML binding) is not installed")
    try:
        return build.library()
    except build.NvmlBuildError as err:
        pytest.skip(str(err))


@pytest.fixture
def gpus(tmp_path: Path) -> Iterator[DeviceBackend]:
    inventory = Inventory.from_dict(load_yaml(fixtures_dir() / "inventories" / "gpus-seed7.yaml").data, "gpus-seed7")
    backend = DeviceBackend(tmp_path / "hw", inventory, skin="nvml").start()
    try:
        yield backend
    finally:
        backend.stop()


def _env(backend: DeviceBackend) -> dict[str, str]:
    assert backend.nvml is not None
    return dict(os.environ, LD_LIBRARY_PATH=str(_library().parent), **backend.nvml.env)


def _consumer(backend: DeviceBackend, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, str(CONSUMER), *args], env=_env(backend), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _line(proc: subprocess.Popen[str]) -> dict:
    """The consumer's next line (a blocking read; the consumer's own waits are bounded, and so is the test)."""
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        proc.wait(STEP_S)
        raise AssertionError(f"the consumer exited: {proc.stderr.read() if proc.stderr else ''}")
    return json.loads(line)


def _inventory(backend: DeviceBackend) -> dict:
    proc = subprocess.run([sys.executable, str(CONSUMER), "inventory"], env=_env(backend), capture_output=True,
                          text=True, timeout=STEP_S)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_nvidias_binding_enumerates_the_fake_gpus(gpus: DeviceBackend) -> None:
    got = _inventory(gpus)
    devices = [d for d in gpus.devices() if d.cls == "gpu"]
    assert got["count"] == len(devices) > 0
    assert [d["uuid"] for d in got["devices"]] == [f"GPU-{d.uuid}" for d in devices]
    first, model = got["devices"][0], devices[0]
    assert first["name"].startswith("NVIDIA ") and first["minor"] == 0
    assert first["bus_id"].endswith(model.pci_address.split(":", 1)[1].upper())
    assert first["pci_device_id"] & 0xFFFF == 0x10DE  # NVIDIA's PCI vendor
    assert first["memory_total"] == model.memory_mib << 20
    assert first["temperature"] == round(model.temperature_c) and first["throttle"] == 0
    assert first["mig"] == [0, 0] and first["dbe"] == 0
    calls = gpus.nvml.calls() if gpus.nvml else []
    assert {"nvmlInitWithFlags", "nvmlDeviceGetCount_v2", "nvmlDeviceGetHandleByIndex_v2"} <= set(calls)


def test_heat_moves_nvml_and_sysfs_together(gpus: DeviceBackend) -> None:
    target = next(d for d in gpus.devices() if d.cls == "gpu")
    gpus.heat(target.id, 95.0)
    hot = _inventory(gpus)["devices"][0]
    assert hot["temperature"] == 95 and hot["temperature"] >= hot["slowdown"]
    assert hot["throttle"] & 0x20 and hot["throttle"] & 0x40, "thermal slowdown, software and hardware"
    sysfs = (gpus.materializer.device_dir(target) / "temperature").read_text().strip()
    assert sysfs.startswith("95"), sysfs
    gpus.cool(target.id, 40.0)
    assert _inventory(gpus)["devices"][0]["throttle"] == 0


def test_unplug_and_plug_change_the_enumeration(gpus: DeviceBackend) -> None:
    gpu_ids = [d.id for d in gpus.devices() if d.cls == "gpu"]
    gpus.unplug(gpu_ids[0])
    assert _inventory(gpus)["count"] == len(gpu_ids) - 1
    gpus.plug(gpu_ids[0])
    assert _inventory(gpus)["count"] == len(gpu_ids)


def test_failures_ecc_and_xids_reach_an_event_wait(gpus: DeviceBackend) -> None:
    gpu = [d for d in gpus.devices() if d.cls == "gpu"]
    proc = _consumer(gpus, "events", "5000", "5")
    try:
        assert _line(proc)["ready"]
        gpus.fail(gpu[1].id)
        lost = _line(proc)
        assert (lost["type"], lost["xid"], lost["uuid"], lost["lost"]) == (
            EVENT_XID, XID_FALLEN_OFF_BUS, f"GPU-{gpu[1].uuid}", True)
        gpus.recover(gpu[1].id)
        gpus.ecc(gpu[0].id, 2)
        assert (_line(proc)["type"], _line(proc)["xid"]) == (EVENT_DBE, XID_DBE)
        gpus.xid(gpu[2].id, 13)  # an application XID: the plugin is expected to ignore it
        app = _line(proc)
        assert (app["xid"], app["uuid"], app["lost"]) == (13, f"GPU-{gpu[2].uuid}", False)
        started = time.monotonic()
        assert _line(proc)["error"].lower().startswith("timeout")  # nothing more happened: NVML_ERROR_TIMEOUT
        assert time.monotonic() - started >= 4.0
        assert proc.wait(STEP_S) == 0, proc.stderr.read() if proc.stderr else ""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert _inventory(gpus)["devices"][0]["dbe"] == 2
    assert "nvmlEventSetWait_v2" in (gpus.nvml.calls() if gpus.nvml else [])


def test_a_failed_device_answers_gpu_is_lost_until_it_recovers(gpus: DeviceBackend) -> None:
    target = next(d for d in gpus.devices() if d.cls == "gpu")
    gpus.fail(target.id)
    assert "GPU is lost" in _inventory(gpus)["devices"][0]["error"]
    gpus.recover(target.id)
    assert _inventory(gpus)["devices"][0]["uuid"] == f"GPU-{target.uuid}"


# A ctypes consumer: each device call once on GPU 0, printing what each answered. The return codes are
# the NVML ABI's (nvml.h): NOT_SUPPORTED 3 for a GPU without NVLink, INVALID_ARGUMENT 2 for a NULL out
# pointer, INSUFFICIENT_SIZE 7 for a UUID buffer shorter than the UUID.
_RC_PROBE = """
import ctypes, json
lib = ctypes.CDLL("libnvidia-ml.so.1")
assert lib.nvmlInitWithFlags(0) == 0
h = ctypes.c_void_p()
assert lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(h)) == 0
state, minor, buf = ctypes.c_int(), ctypes.c_uint(), ctypes.create_string_buffer(96)
print(json.dumps({
    "nvmlDeviceGetNvLinkState": lib.nvmlDeviceGetNvLinkState(h, 0, ctypes.byref(state)),
    "nvmlDeviceGetMinorNumber": lib.nvmlDeviceGetMinorNumber(h, None),
    "nvmlDeviceGetUUID": lib.nvmlDeviceGetUUID(h, buf, 4),
    "nvmlDeviceGetSerial": lib.nvmlDeviceGetSerial(h, buf, 96),
}))
"""


def test_the_call_log_carries_the_rc_each_device_call_answered(gpus: DeviceBackend) -> None:
    # Found running NVIDIA's k8s-device-plugin (issue 14): its GetPreferredAllocation asks
    # nvmlDeviceGetNvLinkState for 18 links per GPU, each answered NOT_SUPPORTED, yet the log (and the
    # timeline's nvml.call events) said rc=0: the handle check's rc, not the call's answer.
    assert gpus.nvml is not None
    proc = subprocess.run([sys.executable, "-c", _RC_PROBE], env=_env(gpus), capture_output=True, text=True,
                          timeout=STEP_S)
    assert proc.returncode == 0, proc.stderr
    answered: dict[str, int] = json.loads(proc.stdout)
    assert answered == {"nvmlDeviceGetNvLinkState": 3, "nvmlDeviceGetMinorNumber": 2, "nvmlDeviceGetUUID": 7,
                        "nvmlDeviceGetSerial": 0}
    logged = {name: int(fields["rc"]) for name, fields in gpus.nvml.log() if name in answered}
    assert logged == answered
    lines = [name for name, _ in gpus.nvml.log()]
    assert all(lines.count(name) == 1 for name in answered), "one log line per call"


def test_xid_is_a_control_of_the_nvml_skin_only(tmp_path: Path) -> None:
    inventory = Inventory.from_dict(load_yaml(fixtures_dir() / "inventories" / "basic.yaml").data, "basic")
    with DeviceBackend(tmp_path / "hw", inventory) as plain, pytest.raises(ValueError, match="needs the nvml skin"):
        plain.xid("gpu-0", 79)
    with DeviceBackend(tmp_path / "hw2", inventory, skin="nvml") as nvml, pytest.raises(ValueError, match="XID"):
        nvml.xid("gpu-0", 0)


def test_no_compiler_is_one_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKELET_CACHE", str(tmp_path))
    monkeypatch.setenv("CC", "no-such-cc")
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(build.NvmlBuildError, match=r"no C compiler .*apt-get install -y gcc"):
        build.library()


def test_the_driver_proc_files_follow_the_gpus(gpus: DeviceBackend) -> None:
    from fake_devices.nvml.surface import PROC_GPUS, nvidia_uuid

    proc = gpus.root / PROC_GPUS
    first = gpus.devices()[0]
    info = (proc / first.pci_address / "information").read_text()
    assert f"GPU UUID: \t {nvidia_uuid(first)}" in info and f"Bus Location: \t {first.pci_address}" in info
    assert sorted(p.name for p in proc.iterdir()) == sorted(d.pci_address for d in gpus.devices() if d.present)
    gpus.unplug(first.id)
    assert not (proc / first.pci_address).exists()
    gpus.plug(first.id)
    assert (proc / first.pci_address / "information").is_file()


def test_an_event_line_still_being_written_is_read_whole(gpus: DeviceBackend) -> None:
    """A reader can see part of an append: "N 0 8 7" of "N 0 8 79". The wait read it as XID 7 and moved past the
    XID 79 (CI: reference-nvml-go never reported the GPU Unhealthy). A partial line waits until it is whole."""
    assert gpus.nvml is not None
    events = gpus.nvml.dir / "events"
    proc = _consumer(gpus, "events", "1500", "2")
    try:
        assert _line(proc)["ready"]
        with open(events, "a") as f:
            f.write(f"{gpus.nvml._sequence} 0 {EVENT_XID:x} 7")  # the backend's append, caught halfway
        assert _line(proc)["error"].lower().startswith("timeout")
        with open(events, "a") as f:
            f.write("9\n")
        event = _line(proc)
        assert (event["type"], event["xid"]) == (EVENT_XID, XID_FALLEN_OFF_BUS)
        assert proc.wait(STEP_S) == 0, proc.stderr.read() if proc.stderr else ""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _log_calls(surface: NvmlSurface, *pids: int) -> None:
    with open(surface.dir / "calls", "a") as f:
        f.writelines(f"nvmlDeviceGetCount_v2 pid={pid} ns=1 rc=0 value=2\n" for pid in pids)


def test_one_device_count_call_at_start_is_no_hotplug_watch(tmp_path: Path) -> None:
    """Defect 8 of issue 39: a GPU plugin counted its GPUs once at start, and fakelet held it to hotplug. Only a
    process that counts again (a poll) watches hotplug; one call each of two starts is no poll either."""
    surface = NvmlSurface(tmp_path)
    surface.dir.mkdir()
    _log_calls(surface, 41)
    assert not surface.reads("hotplug")
    _log_calls(surface, 42)
    assert not surface.reads("hotplug")
    _log_calls(surface, 41)
    assert surface.reads("hotplug")


def test_the_first_repeat_of_a_device_count_is_on_the_timeline(tmp_path: Path) -> None:
    """Coverage waits on the timeline: the poll's first repeat must land there, though its answer is the same."""
    surface = NvmlSurface(tmp_path)
    surface.dir.mkdir()
    (surface.dir / "calls").touch()
    timeline = Timeline()
    follower = CallFollower(surface, timeline).start()
    try:
        for _ in range(3):
            follower._record("nvmlDeviceGetCount_v2", {"pid": "41", "ns": "1", "rc": "0", "value": "2"})
    finally:
        follower.stop()
    calls = [e for e in timeline.events() if e.kind == CALL_EVENT]
    assert [e.get("repeat") for e in calls] == [None, True]
