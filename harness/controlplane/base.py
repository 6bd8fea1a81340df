"""What every control-plane backend is, and how it says it cannot be one."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from harness.controlplane.client import KubeClient

RESOURCE_API = "/apis/resource.k8s.io/v1"  # resource.k8s.io/v1: DRA's GA API version (Kubernetes 1.34)


class ControlPlaneUnavailable(RuntimeError):
    """No API server can be had here; str(err) is a one-line reason naming what is missing.

    Callers turn it into a skip (with this text) or an exit-2 error.
    """


class ControlPlaneStartError(ControlPlaneUnavailable):
    """Everything needed was there, but the control plane did not come up.

    The first line of str(err) is the reason; the lines after it are the tail
    of the failing process's log. It is a ControlPlaneUnavailable so that
    generic handlers still work, but the harness's own tests fail on it rather
    than skip: a server that crashes on our flags is our bug, not a missing tool.
    """


class ControlPlane(Protocol):
    name: str          # "local" or "kubeconfig"
    kubeconfig: Path   # a kubeconfig file a driver can be given
    # "" when a controller manager runs the device-taint eviction and resource-claim controllers
    # (the local one started them, or a cluster is trusted to run its own); else why not.
    controllers_error: str

    def start(self) -> ControlPlane: ...
    def stop(self) -> None: ...
    def client(self) -> KubeClient: ...
    def describe(self) -> dict[str, str]: ...
