"""A device plugin beside the DRA driver under test, on the same fake hardware (DRA-EXT-02, suites/dra/test_beside.py).

fakelet's reference device plugin serves its share of the fake backend's devices (`--only-devices`) and registers with
the fake kubelet's device manager, which every DRA environment runs (the kubelet's kubelet.sock in device-plugins/);
the driver is told that share through its subject file's `device_plugin_beside:` entry. Which hardware device a
device plugin's Allocate answer, a CDI device or a published device stands for is read as the device map does
(harness/world/devicemap.py HardwareDevice.matches): by its device node paths, or a UUID, serial or PCI address in a
value it carries.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.launch.process import ProcessLauncher
from harness.spec.subjects import BESIDE_PLACEHOLDERS, render, template_fields
from harness.world.cdispecs import edits_of
from harness.world.devicemap import HardwareDevice

if TYPE_CHECKING:
    from harness.world.draenv import DRAEnv

COMPANION = "reference-dp-beside"  # the companion's launcher name: the source of its timeline events
SOCKET_NAME = "fakelet-beside.sock"  # its endpoint in device-plugins/, beside any other


@dataclass
class Beside:
    """The companion device plugin, its share of the hardware, and what its Allocate handed out."""

    launcher: ProcessLauncher
    resource: str
    share: list[HardwareDevice]
    socket: Path
    pod: str = ""  # the fake kubelet's pod that holds every device of the share, once allocated
    allocated: dict[str, set[str]] = field(default_factory=dict)  # device plugin ID -> hardware IDs its answer names


def split(hardware: list[HardwareDevice]) -> tuple[list[HardwareDevice], list[HardwareDevice]]:
    """(the device plugin's share, the driver's): the lower half by ID to the device plugin, one at least each."""
    ordered = sorted(hardware, key=lambda h: h.id)
    half = max(1, len(ordered) // 2)
    return ordered[:half], ordered[half:]


def values(env: DRAEnv, share: list[HardwareDevice]) -> dict[str, str]:
    """The placeholders of `device_plugin_beside:`: the share by the backend's device IDs, and by UUID."""
    ids = {h.id for h in share}
    uuids = [d.uuid for d in (env.devices.devices() if env.devices is not None else []) if d.id in ids and d.uuid]
    out = {"dp_devices": ",".join(sorted(ids)), "dp_uuids": ",".join(sorted(uuids))}
    assert set(out) == set(BESIDE_PLACEHOLDERS)
    return out


def unnamed(env: DRAEnv, share: list[HardwareDevice]) -> list[str]:
    """The placeholders the subject's device_plugin_beside uses that would render empty (devices without UUIDs):
    the driver would be told nothing."""
    beside = env.spec.device_plugin_beside or {}
    given = values(env, share)
    used = {n for t in [*beside.get("args", []), *beside.get("env", {}).values()]
            for n in template_fields(t, env.spec.where("device_plugin_beside"))}
    return sorted(n for n in used if n in given and not given[n])


def driver_args(env: DRAEnv, share: list[HardwareDevice]) -> tuple[list[str], dict[str, str]]:
    """The subject's device_plugin_beside args and env, naming the device plugin's share."""
    beside = env.spec.device_plugin_beside or {}
    given = {**env.placeholders, **values(env, share)}
    args = [render(a, given, env.spec.where("device_plugin_beside.args")) for a in beside.get("args", [])]
    extra = {k: render(v, given, env.spec.where(f"device_plugin_beside.env.{k}"))
             for k, v in beside.get("env", {}).items()}
    return args, extra


def launcher(env: DRAEnv, resource: str, share: list[HardwareDevice]) -> Beside:
    """The reference device plugin for `share`, not started: it reads the same fake tree the driver does."""
    assert env.devices is not None
    root = env.devices.root
    argv = [sys.executable, "-m", "harness.reference.device_plugin", "--plugin-dir", str(env.sandbox.plugin_dir),
            "--socket-name", SOCKET_NAME, "--resource", resource, "--sysfs-root", str(root),
            "--dev-dir", str(root / "dev"), "--cdi-dir", str(env.sandbox.cdi_dir),
            "--only-devices", ",".join(h.id for h in share)]
    scratch = env.sandbox.path / "tmp"
    scratch.mkdir(exist_ok=True)
    proc_env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(env.sandbox.path), "TMPDIR": str(scratch),
                "PYTHONPATH": str(Path(__file__).resolve().parents[2]), "GRPC_VERBOSITY": "ERROR"}
    proc = ProcessLauncher(COMPANION, argv, proc_env, env.sandbox.logs_dir / f"{COMPANION}.log", env.timeline)
    return Beside(proc, resource, share, env.sandbox.plugin_dir / SOCKET_NAME)


def exited(event: Any) -> bool:
    return event.kind == "process.exit" and event.source == COMPANION


def identify(hardware: Iterable[HardwareDevice], paths: Iterable[str], found: Iterable[str]) -> set[str]:
    """The hardware devices these device node paths and values stand for."""
    paths, found = list(paths), list(found)
    return {h.id for h in hardware if h.matches(paths, found)}


def allocate_evidence(response: dict[str, Any], cdi_dir: Path) -> tuple[list[str], list[str]]:
    """(device node paths, values) of a ContainerAllocateResponse (the kubelet's dict of it), its CDI devices'
    edits included."""
    paths = [p for d in response.get("devices") or [] for p in (d.get("host_path"), d.get("container_path")) if p]
    found = [f"{k}={v}" for k, v in (response.get("envs") or {}).items()]
    found += [str(v) for v in (response.get("annotations") or {}).values()]
    for c in response.get("cdi_devices") or []:
        more_paths, more = cdi_evidence(cdi_dir, str(c.get("name", "")))
        paths += more_paths
        found += more
    return paths, found


def cdi_evidence(cdi_dir: Path, qualified: str) -> tuple[list[str], list[str]]:
    """(device node paths, values) of the containerEdits a runtime applies for one CDI device."""
    paths: list[str] = []
    found: list[str] = []
    for edits in edits_of(cdi_dir, qualified):
        for node in edits.get("deviceNodes") or []:
            paths += [p for p in (node.get("hostPath"), node.get("path")) if isinstance(p, str) and p]
        for mount in edits.get("mounts") or []:
            paths += [p for p in (mount.get("hostPath"),) if isinstance(p, str) and p]
        found += [e for e in edits.get("env") or [] if isinstance(e, str)]
    return paths, found


def slice_evidence(device: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(paths, values) a published device carries: its attributes' strings and versions (a UUID, a PCI address,
    a device node path)."""
    found = [str(v) for a in (device.get("attributes") or {}).values() if isinstance(a, dict)
             for k, v in a.items() if k in ("string", "version")]
    return [f for f in found if f.startswith("/")], found
