"""One fake GPU, every vendor surface at once (the drm+nvml skin), seen on one timeline; and the NVML
library where a distribution puts it, inside the plugin's mount namespace only.

The consumers are real ones: NVIDIA's own binding (nvidia-ml-py's pynvml, tests/nvml_consumer.py) in a
process of its own, a gRPC client on the Level-Zero sidecar's generated stubs, and a reader of the
sysfs tree (whose reads the access trace sees). Every wait is on the timeline, bounded.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from fake_devices.access import AccessTrace
from fake_devices.backend import DeviceBackend
from fake_devices.levelzero import LevelZeroSidecar
from fake_devices.model import Inventory
from fake_devices.nvml import build
from harness.instruments.grpcutil import unix_target
from harness.instruments.timeline import Predicate, Timeline
from harness.launch import nsexec
from harness.launch import process as launchers
from harness.launch.namespace import NamespaceLauncher
from harness.launch.process import LaunchError
from harness.spec.profiles import FAST
from harness.spec.subjects import fixtures_dir, load_subject_file, load_yaml
from harness.wire import levelzero as lz
from harness.wire import levelzero_grpc as lz_grpc
from harness.world.env import DPEnv

CONSUMER = Path(__file__).resolve().parent / "nvml_consumer.py"
WAIT_S = 20.0  # generous on 2 busy cores; every wait returns as soon as its event comes
TEMPERATURE = "nvmlDeviceGetTemperature"


def _library() -> Path:
    pytest.importorskip("pynvml", reason="nvidia-ml-py (NVIDIA's NVML binding) is not installed")
    try:
        return build.library()
    except build.NvmlBuildError as err:
        pytest.skip(str(err))


def _inventory() -> Inventory:
    return Inventory.from_dict(load_yaml(fixtures_dir() / "inventories" / "gpus-only.yaml").data, "gpus-only")


def _real_nvml_on_host() -> list[str]:
    """libnvidia-ml entries in the host's distribution lib dir (a real driver, or a leak of ours)."""
    host_dir = Path(build.distribution_path()).parent
    return sorted(n for n in os.listdir(host_dir) if n.startswith("libnvidia-ml")) if host_dir.is_dir() else []


@dataclass
class Surfaces:
    timeline: Timeline
    backend: DeviceBackend
    sidecar: LevelZeroSidecar
    stub: lz_grpc.LevelzeroStub
    library: Path


@pytest.fixture
def surfaces(tmp_path: Path) -> Iterator[Surfaces]:
    library = _library()
    timeline = Timeline()
    backend = DeviceBackend(tmp_path / "hw", _inventory(), timeline, skin="drm+nvml").start()
    # As harness/world/env.py serves it under a drm skin: from the backend's surface view, onto the same timeline.
    sidecar = LevelZeroSidecar(backend.surface_view, tmp_path / "lz" / "server.sock", timeline).start()
    access = AccessTrace(backend.root, timeline).start()
    channel = grpc.insecure_channel(unix_target(str(sidecar.socket_path)))
    try:
        yield Surfaces(timeline, backend, sidecar, lz_grpc.LevelzeroStub(channel), library)
    finally:
        channel.close()
        access.stop()
        sidecar.stop()
        backend.stop()


class NvmlReader:
    """tests/nvml_consumer.py `temperature`: one pynvml process, asked for a device's temperature per line."""

    def __init__(self, s: Surfaces) -> None:
        assert s.backend.nvml is not None
        env = dict(os.environ, LD_LIBRARY_PATH=str(s.library.parent), **s.backend.nvml.env)
        self.proc = subprocess.Popen([sys.executable, str(CONSUMER), "temperature"], env=env, text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert self._line()["ready"]

    def _line(self) -> dict:
        """The consumer's next line (a blocking read: the consumer answers each request at once, or exits)."""
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait(WAIT_S)
            raise AssertionError(f"the consumer exited: {self.proc.stderr.read() if self.proc.stderr else ''}")
        return json.loads(line)

    def temperature(self, index: int) -> int:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{index}\n")
        self.proc.stdin.flush()
        return self._line()["temperature"]

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(WAIT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


def _nvml_read(device: str, value: int | None = None, pid: int | None = None) -> Predicate:
    return lambda e: (e.kind == "nvml.call" and e.get("call") == TEMPERATURE and e.get("device") == device
                      and (value is None or e.get("value") == value) and (pid is None or e.get("pid") == pid))


def _sidecar_read(device: str, temperature: float | None = None) -> Predicate:
    return lambda e: (e.kind == "levelzero.call" and e.get("method") == "GetDeviceTemperature"
                      and e.get("device") == device
                      and (temperature is None or e.get("answer", {}).get("gpu") == temperature))


def test_the_combined_skin_has_the_drm_tree_the_sidecar_and_nvml(surfaces: Surfaces) -> None:
    s = surfaces
    gpu = s.backend.devices()[0]
    m = s.backend.materializer
    assert s.backend.drm and s.backend.nvml is not None
    card = m.card_dir(gpu)
    assert card is not None and card.is_symlink()
    assert (s.backend.root / "dev" / "dri" / "card0").exists() and (s.backend.root / "dev" / "nvidia0").exists()
    bdf = lz.DeviceId(bdfAddress=gpu.pci_address)
    assert s.stub.GetDeviceTemperature(bdf).gpu == pytest.approx(gpu.temperature_c)
    reader = NvmlReader(s)
    try:
        assert reader.temperature(0) == round(gpu.temperature_c)
    finally:
        reader.close()


def test_one_heat_reaches_sysfs_the_sidecar_and_nvml_on_one_timeline(surfaces: Surfaces) -> None:
    s, timeline = surfaces, surfaces.timeline
    gpu, other = s.backend.devices()[:2]
    bdf = lz.DeviceId(bdfAddress=gpu.pci_address)
    hwmon = s.backend.materializer.device_dir(gpu) / "temperature"
    reader = NvmlReader(s)
    try:
        pid = reader.proc.pid
        # Before: each surface's reader saw the old temperature, and the timeline has it (waited for,
        # so that nothing of before can land after the heat).
        cool = round(gpu.temperature_c)
        assert reader.temperature(0) == cool
        assert s.stub.GetDeviceTemperature(bdf).gpu == pytest.approx(gpu.temperature_c)
        timeline.wait_for(_nvml_read(gpu.id, cool, pid), WAIT_S, "pynvml's first temperature read")
        timeline.wait_for(_sidecar_read(gpu.id, gpu.temperature_c), WAIT_S, "the sidecar's first answer")

        s.backend.heat(gpu.id, 95.0)
        heat = timeline.wait_for(lambda e: e.kind == "device.heat" and e.get("device") == gpu.id, WAIT_S, "the heat")

        # After: every surface answers 95 C to its own consumer...
        assert reader.temperature(0) == 95
        assert s.stub.GetDeviceTemperature(bdf).gpu == 95.0
        assert hwmon.read_text() == "95000\n"  # millidegrees, as hwmon's temp*_input

        # ... and one timeline shows all three reads after the backend's event.
        rel = f"sys/class/gpu/{gpu.id}/temperature"
        sysfs = timeline.wait_for(lambda e: e.kind == "hw.read" and e.get("path") == rel,
                                  WAIT_S, "the access trace's read of the hwmon-style temperature", heat.t_ns)
        nvml = timeline.wait_for(_nvml_read(gpu.id, 95, pid), WAIT_S, "pynvml's read of 95 C", heat.t_ns)
        sidecar = timeline.wait_for(_sidecar_read(gpu.id, 95.0), WAIT_S, "the sidecar's answer of 95 C", heat.t_ns)
        assert sysfs.get("group") == "temperature"
        assert nvml.get("rc") == 0 and nvml.get("call_ns") > heat.t_ns, "the library was called after the heat"
        assert sidecar.get("bdf") == gpu.pci_address and sidecar.get("answer")["memory"] == pytest.approx(90.0)
        assert all(e.t_ns > heat.t_ns for e in (sysfs, nvml, sidecar))

        # Polls are not news: the same answers again add no event. The call log is taken in order, so
        # once a later call (another device) is on the timeline, the repeat before it was seen.
        assert reader.temperature(0) == 95 and s.stub.GetDeviceTemperature(bdf).gpu == 95.0
        reader.temperature(1)
        timeline.wait_for(_nvml_read(other.id, pid=pid), WAIT_S, "pynvml's read of the other GPU", heat.t_ns)
        assert len(timeline.find(_nvml_read(gpu.id), heat.t_ns)) == 1
        assert len(timeline.find(_sidecar_read(gpu.id), heat.t_ns)) == 1
    finally:
        reader.close()

    # The library said where the process's loader found it: on LD_LIBRARY_PATH here.
    loads = [e for e in timeline.events(kind="nvml.load") if e.get("pid") == pid]
    assert [e.get("path") for e in loads] == [str(s.library)]
    assert s.backend.nvml is not None and s.backend.nvml.loads()[-1]["path"] == str(s.library)
    assert {"nvmlDeviceGetTemperature x4", "nvmlInitWithFlags x1"} <= set(s.backend.nvml.summary().split(", "))


def _namespace_or_skip() -> None:
    try:
        launchers.namespace_prefix()
    except LaunchError as err:
        pytest.skip(f"no private mount namespace here: {err}")
    if _real_nvml_on_host():
        pytest.skip(f"the host has NVML installed in {Path(build.distribution_path()).parent} "
                    f"({', '.join(_real_nvml_on_host())}): ours could not be told from it")


def _json_line(log: str) -> dict:
    return json.loads(next(line for line in reversed(log.splitlines()) if line.startswith("{")))


def test_in_the_mount_namespace_the_library_is_at_the_distributions_path_only(tmp_path: Path) -> None:
    library = _library()
    _namespace_or_skip()
    target = build.distribution_path()
    timeline = Timeline()
    with DeviceBackend(tmp_path / "hw", _inventory(), timeline, skin="nvml") as backend:
        assert backend.nvml is not None
        # No LD_LIBRARY_PATH: the dynamic loader finds libnvidia-ml.so.1 in its own search dirs or not at all.
        env = {"PATH": "/usr/bin:/bin", **backend.nvml.env}
        launcher = NamespaceLauncher("nvml-consumer", [sys.executable, str(CONSUMER), "inventory"], env,
                                     tmp_path / "consumer.log", timeline, binds={}, files={str(library): target})
        try:
            launcher.start()
            code = launcher.wait_exit(WAIT_S)
        finally:
            launcher.stop()
        log = launcher.log_tail(40)
        assert code == 0, log
        got = _json_line(log)
        gpus = [d for d in backend.devices() if d.cls == "gpu"]
        assert got["count"] == len(gpus) > 0
        assert [d["uuid"] for d in got["devices"]] == [f"GPU-{d.uuid}" for d in gpus]
        loads = backend.nvml.loads()
    # The loader's own name for it: /lib/<triplet>/ on a merged-/usr system (its first search dir), the same dir.
    assert len(loads) == 1 and os.path.basename(loads[0]["path"]) == build.LIBRARY
    assert os.path.realpath(os.path.dirname(loads[0]["path"])) == os.path.realpath(os.path.dirname(target))
    assert timeline.find(lambda e: e.kind == "nvml.load" and e.get("path") == loads[0]["path"])
    assert _real_nvml_on_host() == [], "nothing of ours is left in the host's lib dir"


def test_the_overlay_is_planned_only_for_a_file_alone_in_its_dir(tmp_path: Path) -> None:
    library = _library()
    target = build.distribution_path()
    crowded = tmp_path / "crowded"
    crowded.mkdir()
    (crowded / build.LIBRARY).write_bytes(library.read_bytes())
    (crowded / "neighbour").write_text("")
    ops = nsexec.plan([], [], [], files=[(str(library), target), (str(crowded / build.LIBRARY), target)])
    try:
        alone, shared = ops
        assert (alone.kind, alone.path, alone.is_dir) == ("file", target, False)
        assert alone.layer_fd is not None and alone.lower_fd is not None, "one overlay layer: the build cache dir"
        assert shared.layer_fd is None, "a dir with more in it would show all of it: bound instead"
    finally:
        for op in ops:
            for fd in (op.source_fd, op.layer_fd, op.lower_fd):
                if fd is not None:
                    os.close(fd)


def test_a_file_that_cannot_be_an_overlay_layer_is_bound_read_only_through_a_copy(tmp_path: Path) -> None:
    library = _library()
    _namespace_or_skip()
    target = build.distribution_path()
    crowded = tmp_path / "crowded"
    crowded.mkdir()
    source = crowded / build.LIBRARY
    source.write_bytes(library.read_bytes())
    (crowded / "neighbour").write_text("")
    # The same bytes at the target, not writable there, and how many entries its directory shows.
    probe = 'cmp "$0" "$1" && ! test -w "$1" && echo "ok: $(ls "$(dirname "$1")" | wc -l)"'
    timeline = Timeline()
    launcher = NamespaceLauncher("probe", ["/bin/sh", "-c", probe, str(source), target], {"PATH": "/usr/bin:/bin"},
                                 tmp_path / "probe.log", timeline, binds={}, files={str(source): target})
    try:
        launcher.start()
        code = launcher.wait_exit(WAIT_S)
    finally:
        launcher.stop()
    log = launcher.log_tail(20)
    assert code == 0 and "ok: " in log, log
    # The directory kept every entry the host has, plus ours.
    assert int(log.split("ok: ")[1].split()[0]) == len(os.listdir(os.path.dirname(target))) + 1
    assert _real_nvml_on_host() == []


class _Recorded:
    """Stands in for testcontainers' DockerContainer: records the mounts asked for, reaches no engine."""

    def __init__(self, image: str, **kwargs: object) -> None:
        self.volumes: dict[str, dict[str, str]] = {}

    def with_volume_mapping(self, host: str, container: str, mode: str) -> _Recorded:
        self.volumes[host] = {"bind": container, "mode": mode}
        return self

    def with_tmpfs_mount(self, path: str) -> _Recorded:
        return self


def test_the_container_launcher_binds_the_library_read_only_at_the_distributions_path(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("testcontainers", reason="testcontainers is not installed")
    from harness.launch.containers import launcher as container_launcher

    monkeypatch.setattr(container_launcher, "DockerContainer", _Recorded)
    target = build.distribution_path()
    launcher = container_launcher.ContainerLauncher("c", "image", [], {}, tmp_path / "c.log", Timeline(), binds={},
                                                    files={"/host/libnvidia-ml.so.1": target})
    assert launcher._container().volumes == {"/host/libnvidia-ml.so.1": {"bind": target, "mode": "ro"}}


SUBJECT = """\
name: surfaces
kind: device-plugin
launcher: mount-namespace
resource: fakelet.example.com/gpu
command: ["{{python}}", "{consumer}", "inventory"]
env:
  LD_LIBRARY_PATH: ""
  LZ: "{{levelzero_socket}}"
backend:
  inventory: inventories/gpus-only.yaml
  skin: drm+nvml
"""


def test_a_subject_under_drm_nvml_gets_every_surface_and_the_report_says_where_nvml_came_from(
        tmp_path: Path) -> None:
    _library()
    _namespace_or_skip()
    path = tmp_path / "surfaces.yaml"
    # An empty LD_LIBRARY_PATH (the subject's env wins over the launcher's): only the distribution's path is left.
    path.write_text(SUBJECT.format(consumer=CONSUMER))
    spec = load_subject_file(path)
    assert spec.backend is not None and spec.backend["skin"] == "drm+nvml"
    env = DPEnv(spec, FAST)
    try:
        assert env.levelzero is not None and env.devices is not None and env.devices.nvml is not None
        assert env.subject.env["LZ"] == "/var/lib/levelzero/server.sock"  # the sidecar, at its host path inside
        env.start_subject()
        assert env.subject.wait_exit(WAIT_S) == 0, env.subject.log_tail(20)
        assert _json_line(env.subject.log_tail(40))["count"] == len(env.devices.devices())
    finally:
        env.close()
    triplet = Path(build.distribution_path()).parent.name
    fact = env.facts["NVML library"]
    assert fact.startswith("loaded from /") and fact.endswith(f"/{triplet}/{build.LIBRARY} (1 process)"), fact
    assert "nvmlDeviceGetCount_v2 x1" in env.facts["NVML calls"]
    assert env.facts["Level-Zero sidecar calls"].startswith("none")
    assert _real_nvml_on_host() == []
