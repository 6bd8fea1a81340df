"""The `kubeconfig:<path>` backend: an existing cluster that serves DRA."""

from __future__ import annotations

from pathlib import Path

from harness.controlplane.base import RESOURCE_API, ControlPlaneUnavailable
from harness.controlplane.client import NO_CREDENTIALS, ApiError, KubeClient
from harness.controlplane.kubeconfig import KubeconfigError

VERSION_TIMEOUT_S = 5.0  # the kubeconfig backend's reachability probe: an answer from /version within this bound


class KubeconfigControlPlane:
    """An existing cluster: nothing to start or stop, only to check that it answers and serves DRA."""

    name = "kubeconfig"
    # The cluster's own kube-controller-manager evicts; fakelet cannot see its flags, so trusts it.
    controllers_error = ""

    def __init__(self, path: Path) -> None:
        self.kubeconfig = Path(path)
        self._client: KubeClient | None = None
        self._version: dict = {}

    def start(self) -> KubeconfigControlPlane:
        client = KubeClient.from_kubeconfig(self.kubeconfig)
        where = f"kubeconfig {self.kubeconfig}"
        try:
            self._version = client.request("GET", "/version", timeout_s=VERSION_TIMEOUT_S) or {}
        except ApiError as err:
            client.close()
            if err.reason == NO_CREDENTIALS:  # the kubeconfig's exec plugin or token file failed
                raise KubeconfigError(f"{where}: {err.message}") from err
            raise ControlPlaneUnavailable(f"{where}: API server {client.server} /version failed: {err}") from err
        try:
            client.request("GET", RESOURCE_API, timeout_s=VERSION_TIMEOUT_S)
        except ApiError as err:
            client.close()
            raise ControlPlaneUnavailable(
                f"{where}: API server {client.server} does not serve {RESOURCE_API.removeprefix('/apis/')} "
                f"(DRA; Kubernetes 1.34 or newer): {err}") from err
        self._client = client
        return self

    def stop(self) -> None:
        if self._client is not None:
            self._client.close()

    def client(self) -> KubeClient:
        if self._client is None:
            raise RuntimeError("kubeconfig control plane: start() it first")
        return self._client

    def describe(self) -> dict[str, str]:
        return {"backend": self.name, "kubeconfig": str(self.kubeconfig),
                "server": self._client.server if self._client else "",
                "version": str(self._version.get("gitVersion", ""))}
