"""fakelet's image (tools/build-image.sh; tox -e image): built here without a registry, and runs in it build nothing.

The image is built once per test session into the Docker engine the tests use (the user's if one answers,
else a private dockerd, as tests/test_containers.py starts one), tagged fakelet-test:<the wheel's content
digest>, and removed at the end. Every run is `docker run --rm --network none`: a run that tried to build
anything (the Go module proxy, PyPI) would fail there, so a pass also says the image is complete.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import docker_engine_host

pytestmark = pytest.mark.image

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tools" / "build-image.sh"
HELPER = ROOT / "tools" / "build_image.py"
TEST_REPO = "fakelet-test"  # the tags this test makes (and removes)
WHEEL_TIMEOUT_S = 600.0
# A first build here: about 2.5 min at a load of 3 (debootstrap 44 s, apt 26 s, pip 24 s, import 18 s), plus
# the kube binaries' builds when fakelet's cache lacks them (about 10 min on 2 cores, tools: fakelet prebuild).
BUILD_TIMEOUT_S = 2400.0
BUILD_STOP_S = 60.0  # the script's EXIT trap removes its root after SIGTERM; seconds
MIRROR_TIMEOUT_S = 10.0
# One `docker run`: the private engine's vfs copies the ~1 GB image per container (15 to 50 s here), then the
# run itself (DP-REG-01 about 1 s, 4 s on the real kubelet; the two DRA checks with the local control plane
# about 16 s).
RUN_TIMEOUT_S = 900.0
# Linux capabilities 0..37 (CAP_CHOWN .. CAP_AUDIT_READ): every Docker release grants all of them to a
# --privileged container. Names in Docker's spelling, by number (linux/capability.h).
DOCKER_CAPS = ["CHOWN", "DAC_OVERRIDE", "DAC_READ_SEARCH", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID",
               "SETPCAP", "LINUX_IMMUTABLE", "NET_BIND_SERVICE", "NET_BROADCAST", "NET_ADMIN", "NET_RAW",
               "IPC_LOCK", "IPC_OWNER", "SYS_MODULE", "SYS_RAWIO", "SYS_CHROOT", "SYS_PTRACE", "SYS_PACCT",
               "SYS_ADMIN", "SYS_BOOT", "SYS_NICE", "SYS_RESOURCE", "SYS_TIME", "SYS_TTY_CONFIG", "MKNOD", "LEASE",
               "AUDIT_WRITE", "AUDIT_CONTROL", "SETFCAP", "MAC_OVERRIDE", "MAC_ADMIN", "SYSLOG", "WAKE_ALARM",
               "BLOCK_SUSPEND", "AUDIT_READ"]


@dataclass(frozen=True)
class Image:
    tag: str
    version: str
    privileged: tuple[str, ...]  # the flags that make a container privileged on this machine


def _cannot_build() -> str | None:
    """Why this machine cannot build the image, in one line, or None."""
    if os.geteuid() != 0:
        return "building the image needs root (debootstrap, chroot)"
    if shutil.which("docker") is None:
        return "no docker client (Debian package docker.io)"
    if shutil.which("debootstrap") is None and shutil.which("apt-get") is None:
        return "no debootstrap, and no apt-get to install it (Debian package debootstrap)"
    if shutil.which("go") is None:
        missing = _uncached_kube_binaries()
        if missing:
            return f"no Go toolchain to build {', '.join(missing)} (fakelet's cache lacks them)"
    mirror = subprocess.run([str(SCRIPT), "--print-mirror"], capture_output=True, text=True,
                            timeout=30).stdout.strip()
    release = f"{mirror.rstrip('/')}/dists/bookworm/Release"
    try:
        with urllib.request.urlopen(urllib.request.Request(release, method="HEAD"), timeout=MIRROR_TIMEOUT_S):
            pass
    except (urllib.error.URLError, OSError) as err:
        return f"no network to the Debian mirror {mirror} ({err})"
    return None


def _uncached_kube_binaries() -> list[str]:
    sys.path.insert(0, str(HELPER.parent))
    try:
        import build_image
    finally:
        sys.path.remove(str(HELPER.parent))
    from harness.launch import gobuild
    from harness.spec import bundled

    return [name for module, name, package in build_image.kube_binaries()
            if gobuild.cached(bundled.go_module(module), package, name) is None]


@pytest.fixture(scope="session")
def image_engine() -> Iterator[str]:
    """The user's Docker engine if one answers, else a private dockerd for this test process; after the
    checks that the image can be built here at all, so that a skip starts nothing."""
    why = _cannot_build()
    if why is not None:
        pytest.skip(why)
    with docker_engine_host() as host:
        yield host


def _docker(*args: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)


def _label(tag: str, label: str) -> str | None:
    proc = _docker("image", "inspect", "--format", f'{{{{index .Config.Labels "{label}"}}}}', tag)
    return proc.stdout.strip() if proc.returncode == 0 else None


def _privileged_flags() -> tuple[str, ...]:
    """--privileged, unless this machine's capability bounding set lacks a capability Docker grants with it:
    runc then fails every such container ("unable to apply caps: operation not permitted"; this project's
    VM has no CAP_SYS_RESOURCE). The stand-in is what --privileged grants, less those capabilities: every
    other one, no seccomp, AppArmor or masked /proc paths, every device, the cgroup tree writable, and
    /dev/kmsg (the real kubelet will not start without it)."""
    bounding = next(int(line.split()[1], 16) for line in Path("/proc/self/status").read_text().splitlines()
                    if line.startswith("CapBnd:"))
    lacking = [name for bit, name in enumerate(DOCKER_CAPS) if not bounding >> bit & 1]
    if not lacking:
        return ("--privileged",)
    return ("--cap-add", "ALL", *(f"--cap-drop={name}" for name in lacking),
            "--security-opt", "seccomp=unconfined", "--security-opt", "apparmor=unconfined",
            "--security-opt", "systempaths=unconfined", "--device-cgroup-rule", "a *:* rwm",
            "-v", "/sys/fs/cgroup:/sys/fs/cgroup:rw",
            *(("--device", "/dev/kmsg") if Path("/dev/kmsg").exists() else ()))


def _build(wheel: Path, tag: str) -> None:
    env = dict(os.environ, FAKELET_PYTHON=sys.executable)
    # Its own session: on a timeout, SIGTERM reaches the script and what it runs, and its EXIT trap removes the
    # root it was building; SIGKILL only if that does not end it.
    proc = subprocess.Popen([str(SCRIPT), "--wheel", str(wheel), "--tag", tag], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=BUILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            out, _ = proc.communicate(timeout=BUILD_STOP_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
        pytest.fail(f"tools/build-image.sh did not finish within {BUILD_TIMEOUT_S:g} s:\n{out[-4000:]}")
    assert proc.returncode == 0, f"tools/build-image.sh failed:\n{out[-4000:]}"
    # Its timings and the image's size: shown with -s, and in the output of a failing test.
    print(next((line for line in reversed(out.splitlines()) if "fakelet image: built" in line), out[-300:]))


@pytest.fixture(scope="session")
def image(image_engine: str) -> Iterator[Image]:
    with tempfile.TemporaryDirectory(prefix="fakelet-image-wheel-") as work:
        proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", work, str(ROOT)],
                              capture_output=True, text=True, timeout=WHEEL_TIMEOUT_S)
        assert proc.returncode == 0, proc.stderr[-2000:]
        wheel = next(Path(work).glob("fakelet-*.whl"))
        digest = subprocess.run([sys.executable, str(HELPER), "digest", str(wheel)], capture_output=True,
                                text=True, timeout=60, check=True).stdout.strip()
        tag = f"{TEST_REPO}:{digest[:12]}"
        try:
            # Built from this very tree already (an earlier fixture of this session, or a run of the script
            # beside it): the label holds the digest of the wheel the image carries.
            if _label(tag, "fakelet.wheel-digest") != digest:
                _build(wheel, tag)
            yield Image(tag, wheel.name.split("-")[1], _privileged_flags())
        finally:
            _docker("image", "rm", "--force", tag)


def _run(image: Image, *args: str, work: Path | None = None) -> subprocess.CompletedProcess[str]:
    """One `docker run --rm` of the image, bounded: on a timeout its container is removed, not left running."""
    name = f"fakelet-image-test-{uuid.uuid4().hex[:12]}"
    mount = ["-v", f"{work}:/work"] if work is not None else []
    try:
        return _docker("run", "--rm", "--name", name, "--network", "none", *image.privileged, *mount, image.tag,
                       *args, timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"docker run {' '.join(args)} did not finish within {RUN_TIMEOUT_S:g} s")
    finally:
        _docker("rm", "--force", name)  # gone already after --rm, unless the run timed out


def _built_nothing(proc: subprocess.CompletedProcess[str]) -> None:
    building = [line for line in (proc.stdout + proc.stderr).splitlines() if "building" in line.lower()]
    assert building == [], f"the run built in the image: {building}"


def _verdicts(report_dir: Path) -> dict[str, str]:
    return {c["id"]: c["verdict"] for c in json.loads((report_dir / "report.json").read_text())["checks"]}


def test_fakelet_in_the_image_is_this_wheel(image: Image) -> None:
    proc = _run(image, "fakelet", "--version")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith(f"fakelet {image.version}"), proc.stdout


def test_a_subject_file_mounted_in_runs_and_builds_nothing(image: Image, tmp: Path) -> None:
    # The reference device plugin described in a file of one's own, as a vendor describes theirs.
    (tmp / "my-plugin.yaml").write_text("""\
name: my-plugin
kind: device-plugin
launcher: process
command: ["{python}", "-m", "harness.reference.device_plugin", "--plugin-dir", "{plugin_dir}",
          "--kubelet-socket", "{kubelet_socket}", "--resource", "{resource}",
          "--sysfs-root", "{sysfs_root}", "--dev-dir", "{dev_dir}"]
resource: vendor.example.com/gpu
socket: my-plugin.sock
backend:
  inventory: inventories/basic.yaml
""")
    proc = _run(image, "fakelet", "run", "--subject-file", "my-plugin.yaml", "--check", "DP-REG-01",
                "--out", "report", work=tmp)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    _built_nothing(proc)
    assert _verdicts(tmp / "report") == {"DP-REG-01": "pass"}


def test_the_dra_reference_runs_on_the_local_control_plane_and_builds_nothing(image: Image, tmp: Path) -> None:
    proc = _run(image, "fakelet", "run", "--subject", "reference-dra", "--check", "DRA-REG-01", "--check",
                "DRA-PRP-01", work=tmp)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    _built_nothing(proc)
    # The default report directory, relative to the image's WORKDIR /work: the mounted one.
    assert _verdicts(tmp / "fakelet-report") == {"DRA-REG-01": "pass", "DRA-PRP-01": "pass"}


def test_the_real_kubelet_runs_in_the_image_and_builds_nothing(image: Image, tmp: Path) -> None:
    # The real node's packages (containerd, runc, busybox-static, iproute2, util-linux) and the default
    # release's kubelet, cached: the same check on a real kubelet beside the fake one.
    proc = _run(image, "fakelet", "run", "--subject", "reference-dp", "--node", "real", "--check", "DP-REG-01",
                work=tmp)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    _built_nothing(proc)
    assert _verdicts(tmp / "fakelet-report") == {"DP-REG-01": "pass"}
