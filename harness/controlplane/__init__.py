"""fakelet's control plane: a real API server for DRA, and the harness's side of it.

Backends: `local` (etcd + kube-apiserver started here, see local.py) and
`kubeconfig:<path>` (an existing cluster). The Allocator plays the scheduler:
it allocates ResourceClaims from the ResourceSlices drivers publish.
"""

from __future__ import annotations

from pathlib import Path

from harness.controlplane.allocator import AllocationError, Allocator
from harness.controlplane.backend import ControlPlane
from harness.controlplane.base import RESOURCE_API, ControlPlaneStartError, ControlPlaneUnavailable
from harness.controlplane.client import ApiError, KubeClient, server_config
from harness.controlplane.existing import KubeconfigControlPlane
from harness.controlplane.kubeconfig import KubeconfigError, load_kubeconfig
from harness.controlplane.local import LocalControlPlane

__all__ = [
    "RESOURCE_API",
    "AllocationError",
    "Allocator",
    "ApiError",
    "ControlPlane",
    "ControlPlaneStartError",
    "ControlPlaneUnavailable",
    "KubeClient",
    "KubeconfigControlPlane",
    "KubeconfigError",
    "LocalControlPlane",
    "load_kubeconfig",
    "open_control_plane",
    "server_config",
]

SPECS = ('"local"', '"kubeconfig:<path>"', '"none"')


def open_control_plane(spec: str, workdir: Path | None = None, scheduler: bool = False) -> ControlPlane:
    """The backend `spec` names, not yet started; "none" and unknown specs raise ControlPlaneUnavailable.
    `scheduler`: a local one also runs kube-scheduler (the kep5970 suite)."""
    spec = spec.strip()
    if spec == "local":
        return LocalControlPlane(workdir, scheduler=scheduler)
    if spec.startswith("kubeconfig:"):
        path = spec.removeprefix("kubeconfig:")
        if not path:
            raise ControlPlaneUnavailable("control plane spec 'kubeconfig:' names no file (kubeconfig:<path>)")
        return KubeconfigControlPlane(Path(path).expanduser())
    if spec == "none":
        raise ControlPlaneUnavailable("no API server: control plane 'none' was chosen")
    raise ControlPlaneUnavailable(f"unknown control plane {spec!r}: expected one of {', '.join(SPECS)}")
