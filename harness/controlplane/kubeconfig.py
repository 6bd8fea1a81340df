"""Kubeconfig files: read one (current context only), write one, and the `kubeconfig:<path>` backend.

Only what a static kubeconfig can say is supported: server, certificate
authority (file or -data), insecure-skip-tls-verify, tls-server-name, bearer
token (or tokenFile), client certificate and key (file or -data). exec and
auth-provider plugins are refused by name, since running them is out of scope.
Relative file paths are relative to the kubeconfig's directory, as in client-go.
"""

from __future__ import annotations

import base64
import binascii
import os
from pathlib import Path
from typing import Any

import yaml

from harness.controlplane.base import RESOURCE_API, ControlPlaneUnavailable
from harness.controlplane.client import ApiError, ClusterAccess, KubeClient

VERSION_TIMEOUT_S = 5.0  # the kubeconfig backend's reachability probe: an answer from /version within this bound


class KubeconfigError(ControlPlaneUnavailable):
    """The kubeconfig file is missing or wrong; the message names the file and what is wrong."""


def _named(entries: Any, kind: str, name: str, where: str) -> dict:
    if not isinstance(entries, list):
        raise KubeconfigError(f"{where}: '{kind}s' is missing or not a list")
    for entry in entries:
        if isinstance(entry, dict) and entry.get("name") == name:
            body = entry.get(kind)
            if not isinstance(body, dict):
                raise KubeconfigError(f"{where}: {kind} {name!r} has no '{kind}' mapping")
            return body
    known = [e.get("name") for e in entries if isinstance(e, dict)]
    raise KubeconfigError(f"{where}: {kind} {name!r} not found (have: {', '.join(map(str, known)) or 'none'})")


def _material(section: dict, key: str, base: Path, where: str) -> bytes | None:
    """`key-data` (base64) or `key` (a file path), as bytes."""
    data = section.get(f"{key}-data")
    if data:
        try:
            return base64.b64decode(str(data), validate=True)
        except (binascii.Error, ValueError) as err:
            raise KubeconfigError(f"{where}: {key}-data is not valid base64 ({err})") from err
    ref = section.get(key)
    if ref:
        path = Path(os.path.expanduser(str(ref)))
        path = path if path.is_absolute() else base / path
        try:
            return path.read_bytes()
        except OSError as err:
            raise KubeconfigError(f"{where}: {key} {path}: {err.strerror or err}") from err
    return None


def load_kubeconfig(path: Path, context: str | None = None) -> ClusterAccess:
    """Resolve `context` (default: current-context) of the kubeconfig at `path`."""
    path = Path(path)
    where = f"kubeconfig {path}"
    try:
        text = path.read_text()
    except OSError as err:
        raise KubeconfigError(f"{where}: cannot read: {err.strerror or err}") from err
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise KubeconfigError(f"{where}: not YAML: {str(err).splitlines()[0]}") from err
    if not isinstance(doc, dict):
        raise KubeconfigError(f"{where}: not a kubeconfig (expected a mapping with clusters, users, contexts)")
    context = context or doc.get("current-context")
    if not context:
        raise KubeconfigError(f"{where}: no current-context set")
    ctx = _named(doc.get("contexts"), "context", str(context), where)
    if not ctx.get("cluster"):
        raise KubeconfigError(f"{where}: context {context!r} names no cluster")
    cluster = _named(doc.get("clusters"), "cluster", str(ctx["cluster"]), where)
    user: dict = {}
    if ctx.get("user"):
        user = _named(doc.get("users"), "user", str(ctx["user"]), where)
    for plugin in ("exec", "auth-provider"):
        if user.get(plugin):
            raise KubeconfigError(f"{where}: user {ctx['user']!r} uses an {plugin} plugin, which fakelet does not "
                                  "run; give a kubeconfig with a token or a client certificate")
    server = str(cluster.get("server") or "")
    if not server.startswith(("https://", "http://")):
        raise KubeconfigError(f"{where}: cluster {ctx['cluster']!r} has no http(s) server URL (server: {server!r})")
    base = path.resolve().parent
    token = user.get("token")
    if not token and user.get("tokenFile"):
        token_path = Path(os.path.expanduser(str(user["tokenFile"])))
        token_path = token_path if token_path.is_absolute() else base / token_path
        try:
            token = token_path.read_text().strip()
        except OSError as err:
            raise KubeconfigError(f"{where}: tokenFile {token_path}: {err.strerror or err}") from err
    cert = _material(user, "client-certificate", base, where)
    key = _material(user, "client-key", base, where)
    if (cert is None) != (key is None):
        raise KubeconfigError(f"{where}: user {ctx.get('user')!r} has a client certificate without a key "
                              "or a key without a certificate")
    return ClusterAccess(
        server=server, ca_pem=_material(cluster, "certificate-authority", base, where),
        insecure=bool(cluster.get("insecure-skip-tls-verify")), tls_server_name=cluster.get("tls-server-name"),
        token=str(token) if token else None, cert_pem=cert, key_pem=key, source=where,
    )


def write_kubeconfig(path: Path, server: str, ca_pem: bytes, token: str, name: str = "fakelet") -> Path:
    """A self-contained kubeconfig (CA and token inline), readable only by us."""
    doc = {
        "apiVersion": "v1", "kind": "Config", "current-context": name, "preferences": {},
        "clusters": [{"name": name, "cluster": {
            "server": server, "certificate-authority-data": base64.b64encode(ca_pem).decode()}}],
        "users": [{"name": name, "user": {"token": token}}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name}}],
    }
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        yaml.safe_dump(doc, f, sort_keys=False)
    return Path(path)


class KubeconfigControlPlane:
    """An existing cluster: nothing to start or stop, only to check that it answers and serves DRA."""

    name = "kubeconfig"

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
