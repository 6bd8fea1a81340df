"""The unix socket paths a rolling update's `args:` make, measured against what a socket address holds.

A path longer than SOCKET_PATH_MAX cannot be bound or dialed: the new instance exits at start, which is no
verdict on the bug. `fakelet scenario check` measures each argument against the longest sandbox this machine
makes (sandbox.longest_path) and refuses one that would not fit; a run measures it against its own sandbox
and ends inconclusive before it starts anything. Paths are the kubelet's view (it dials them there).

What an argument makes: a path ending in `.sock`, as given; a device plugin's bare `NAME.sock`, in the
device-plugins directory (the reference plugin's `--socket-name`); and a DRA driver's `--pod-uid UID`, the two
sockets kubeletplugin names after the UID (`<driver>-<UID>-reg.sock` in plugins_registry, `dra-<UID>.sock`
in plugins/<driver>), which the reference driver shortens when they would not fit (dra_driver.socket_names).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from harness.launch.sandbox import (
    PLUGIN_DIR_NAME,
    PLUGINS_DIR_NAME,
    REGISTRY_DIR_NAME,
    SOCKET_PATH_MAX,
    UNIX_PATH_MAX,
)
from harness.spec.subjects import SubjectSpec

POD_UID_FLAG = "--pod-uid"  # the reference driver's, as upstream's kubeletplugin.RollingUpdate(uid) takes it
REFERENCE_DRIVER = "harness.reference.dra_driver"  # its module in a subject's command: names it shortens


@dataclass(frozen=True)
class SocketDirs:
    """Where a subject's sockets go, as the kubelet dials them."""

    plugin_dir: str  # device-plugins
    registry_dir: str  # plugins_registry
    driver_dir: str  # plugins/<driver>


def dirs_under(sandbox: Path, spec: SubjectSpec) -> SocketDirs:
    kubelet = sandbox / "kubelet"
    return SocketDirs(str(kubelet / PLUGIN_DIR_NAME), str(kubelet / REGISTRY_DIR_NAME),
                      str(kubelet / PLUGINS_DIR_NAME / (spec.driver or spec.resource)))


@dataclass(frozen=True)
class Overflow:
    index: int  # the argument's, in args
    path: str

    def describe(self) -> str:
        return (f"the socket path it makes, {self.path}, is {len(self.path)} bytes: over the {SOCKET_PATH_MAX} a "
                f"unix socket address holds (sun_path, {UNIX_PATH_MAX} bytes with its NUL)")


def overflows(spec: SubjectSpec, args: list[str], dirs: SocketDirs) -> list[Overflow]:
    """Each socket path of `args` (rendered) that would not fit, with the argument that makes it."""
    return [Overflow(n, path) for n in range(len(args)) for path in _paths(spec, args, n, dirs)
            if len(path) > SOCKET_PATH_MAX]


def _paths(spec: SubjectSpec, args: list[str], n: int, dirs: SocketDirs) -> list[str]:
    arg = args[n]
    uid = arg.removeprefix(f"{POD_UID_FLAG}=") if arg.startswith(f"{POD_UID_FLAG}=") else \
        arg if n and args[n - 1] == POD_UID_FLAG else None
    if uid is not None:
        return _uid_sockets(spec, uid, dirs) if spec.is_dra else []
    if arg.startswith("-") or not arg.endswith(".sock"):
        return []
    if "/" in arg:
        return [arg]
    return [os.path.join(dirs.plugin_dir, arg)] if not spec.is_dra else []


def _uid_sockets(spec: SubjectSpec, uid: str, dirs: SocketDirs) -> list[str]:
    from harness.reference.dra_driver import socket_names  # its gRPC stubs only when a UID is given

    driver = spec.driver or spec.resource
    if any(REFERENCE_DRIVER in part for part in spec.command):
        reg, dra = socket_names(driver, uid, dirs.registry_dir, dirs.driver_dir)
    else:
        reg, dra = socket_names(driver, uid)  # upstream's kubeletplugin names them in full
    return [os.path.join(dirs.registry_dir, reg), os.path.join(dirs.driver_dir, dra)]
