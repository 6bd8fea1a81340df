"""What every control-plane backend is: local.py starts one here, existing.py reaches one through a kubeconfig."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from harness.controlplane.client import KubeClient


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
