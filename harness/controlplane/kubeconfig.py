"""Kubeconfig files: check and load one, write one (the `kubeconfig:<path>` backend is existing.py).

lightkube loads the kubeconfig (KubeConfig resolves the context to its cluster
and user; its client adapter turns them into TLS and credentials, exec plugins
included). This module checks the file first, so that a kubeconfig that cannot
work is refused before a run starts with a message naming the file and what is
wrong, rather than failing inside the first request. It also closes the gaps
where lightkube 1.0.1 differs from kubectl:

- relative tokenFile paths and exec commands with a '/' are relative to the
  kubeconfig's directory, as in client-go (lightkube: the working directory);
- exec plugins of client.authentication.k8s.io/v1 run (lightkube runs only
  v1alpha1 and v1beta1, though it reads a token from both the same way), and
  every plugin gets KUBERNETES_EXEC_INFO, which v1 plugins may rely on.

Refused by name: auth-provider plugins and tls-server-name (lightkube supports
neither), a certificate authority together with insecure-skip-tls-verify
(kubectl refuses it too), and interactiveMode Always (nothing here has a terminal).
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import shutil
import ssl
from pathlib import Path
from typing import Any

import lightkube
import msgspec
import yaml
from lightkube.config import client_adapter
from lightkube.config.kubeconfig import KubeConfig, SingleConfig
from lightkube.config.models import NameValue, User, UserExec

from harness.controlplane.base import ControlPlaneUnavailable
from harness.instruments.userinput import UserInputError, read_user_file, read_user_text

EXEC_API_VERSIONS = ("client.authentication.k8s.io/v1", "client.authentication.k8s.io/v1beta1")
# What lightkube is told: it refuses v1, and it runs a v1 plugin and reads its token exactly as a v1beta1 one.
LIGHTKUBE_EXEC_API = "client.authentication.k8s.io/v1beta1"
EXEC_TIMEOUT_S = 60  # fakelet's bound on one exec credential plugin run (client-go sets none)
EXEC_KILL_AFTER_S = 5  # then SIGKILL, for a plugin that ignores SIGTERM
EXEC_EXTENSION = "client.authentication.k8s.io/exec"  # cluster extension passed to plugins as spec.cluster.config
MAX_KUBECONFIG_BYTES = 16 * 1024 * 1024  # kubeconfigs embed certificates, for many clusters: larger than ours


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


def _file(ref: str, base: Path) -> Path:
    path = Path(os.path.expanduser(ref))
    return path if path.is_absolute() else base / path


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
        try:
            return read_user_file(_file(str(ref), base), f"{where}: {key}", MAX_KUBECONFIG_BYTES)
        except UserInputError as err:
            raise KubeconfigError(str(err)) from None
    return None


def _exec_command(command: str, base: Path) -> str | None:
    """The command as it will be run, or None when there is nothing to run."""
    if "/" not in command:
        return command if shutil.which(command) else None
    path = _file(command, base)
    return str(path) if path.is_file() and os.access(path, os.X_OK) else None


def _check_exec(spec: Any, user: str, base: Path, where: str) -> str:
    """The exec plugin's command as it will be run; a KubeconfigError when the plugin cannot be run here."""
    what = f"{where}: user {user!r}: exec plugin"
    if not isinstance(spec, dict):
        raise KubeconfigError(f"{what} is not a mapping")
    api = spec.get("apiVersion")
    if api not in EXEC_API_VERSIONS:
        found = f"apiVersion {api!r} is not supported" if api else "has no apiVersion"
        raise KubeconfigError(f"{what} {found} (supported: {', '.join(EXEC_API_VERSIONS)})")
    command = spec.get("command")
    if not command or not isinstance(command, str):
        raise KubeconfigError(f"{what} has no command")
    if spec.get("interactiveMode") == "Always":
        raise KubeconfigError(f"{what} needs interactiveMode Always, but fakelet runs it without a terminal")
    resolved = _exec_command(command, base)
    if resolved is None:
        hint = " ".join(str(spec.get("installHint") or "").split())
        raise KubeconfigError(f"{what} command {command!r} is not an executable found from {base} or on PATH"
                              + (f" ({hint})" if hint else ""))
    return resolved


def _exec_info(spec: dict, cluster: dict, ca: bytes | None) -> str:
    """KUBERNETES_EXEC_INFO, which client-go gives every plugin and lightkube gives none."""
    info: dict[str, Any] = {"apiVersion": spec["apiVersion"], "kind": "ExecCredential",
                            "spec": {"interactive": False}}
    if spec.get("provideClusterInfo"):
        info["spec"]["cluster"] = {"server": cluster.get("server"),
                                   "insecure-skip-tls-verify": bool(cluster.get("insecure-skip-tls-verify"))}
        if ca is not None:
            info["spec"]["cluster"]["certificate-authority-data"] = base64.b64encode(ca).decode()
        for ext in cluster.get("extensions") or []:
            if isinstance(ext, dict) and ext.get("name") == EXEC_EXTENSION:
                info["spec"]["cluster"]["config"] = ext.get("extension")
    return json.dumps(info)


def load_kubeconfig(path: Path, context: str | None = None) -> SingleConfig:
    """Check the kubeconfig at `path` and load `context` (default: current-context) with lightkube."""
    path = Path(path)
    where = f"kubeconfig {path}"
    try:
        text = read_user_text(path, "kubeconfig", MAX_KUBECONFIG_BYTES)
    except UserInputError as err:
        raise KubeconfigError(str(err)) from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise KubeconfigError(f"{where}: not YAML: {str(err).splitlines()[0]}") from err
    if not isinstance(doc, dict):
        raise KubeconfigError(f"{where}: not a kubeconfig (expected a mapping with clusters, users, contexts)")
    context = str(context or doc.get("current-context") or "")
    if not context:
        raise KubeconfigError(f"{where}: no current-context set")
    ctx = _named(doc.get("contexts"), "context", context, where)
    if not ctx.get("cluster"):
        raise KubeconfigError(f"{where}: context {context!r} names no cluster")
    cluster_name, user_name = str(ctx["cluster"]), str(ctx.get("user") or "")
    cluster = _named(doc.get("clusters"), "cluster", cluster_name, where)
    user = _named(doc.get("users"), "user", user_name, where) if user_name else {}
    if user.get("auth-provider"):
        raise KubeconfigError(f"{where}: user {user_name!r} uses an auth-provider plugin, which lightkube (fakelet's "
                              "Kubernetes client) does not support; use an exec plugin, a token or a client "
                              "certificate")
    server = str(cluster.get("server") or "")
    if not server.startswith(("https://", "http://")):
        raise KubeconfigError(f"{where}: cluster {cluster_name!r} has no http(s) server URL (server: {server!r})")
    if cluster.get("tls-server-name"):
        raise KubeconfigError(f"{where}: cluster {cluster_name!r} sets tls-server-name, which lightkube (fakelet's "
                              "Kubernetes client) cannot verify against; use a server URL whose host the "
                              "certificate names")
    base = path.resolve().parent
    ca = _material(cluster, "certificate-authority", base, where)
    if ca is not None and cluster.get("insecure-skip-tls-verify"):
        raise KubeconfigError(f"{where}: cluster {cluster_name!r} sets both a certificate authority and "
                              "insecure-skip-tls-verify; kubectl refuses that too: keep one")
    token_file = _file(str(user["tokenFile"]), base) if user.get("tokenFile") else None
    if token_file is not None:  # lightkube prefers it to a token given beside it
        try:
            read_user_file(token_file, f"{where}: tokenFile", MAX_KUBECONFIG_BYTES)
        except UserInputError as err:
            raise KubeconfigError(str(err)) from None
    cert = _material(user, "client-certificate", base, where)
    key = _material(user, "client-key", base, where)
    if (cert is None) != (key is None):
        raise KubeconfigError(f"{where}: user {user_name!r} has a client certificate without a key "
                              "or a key without a certificate")
    command = _check_exec(user["exec"], user_name, base, where) if user.get("exec") is not None else None

    # Only the entries this context uses: the rest of the file is not ours to judge.
    mine = {"current-context": context, "contexts": [{"name": context, "context": ctx}],
            "clusters": [{"name": cluster_name, "cluster": cluster}],
            "users": [{"name": user_name, "user": user}] if user_name else []}
    try:
        config = KubeConfig.from_dict(mine, fname=path).get(context)
    except (lightkube.ConfigError, msgspec.ValidationError) as err:
        raise KubeconfigError(f"{where}: context {context!r}: {err}") from err
    assert config is not None  # get() returns None only for a missing context with a default
    loaded = config.user or User()
    changes: dict[str, Any] = {}
    for field in ("client_cert", "client_key"):
        if getattr(loaded, field):
            changes[field] = str(_file(getattr(loaded, field), base))
    if token_file is not None:
        changes["token_file"] = str(token_file)
    if loaded.exec is not None and command is not None:
        info = NameValue(name="KUBERNETES_EXEC_INFO", value=_exec_info(user["exec"], cluster, ca))
        # lightkube waits for the plugin without a bound: coreutils' timeout gives it one, so a hung
        # plugin fails the call ("exit 124") instead of hanging the run.
        bounded = shutil.which("timeout")
        argv = [command, *(loaded.exec.args or [])]
        if bounded is not None:
            argv = [bounded, f"--kill-after={EXEC_KILL_AFTER_S}", str(EXEC_TIMEOUT_S), *argv]
        changes["exec"] = UserExec(apiVersion=LIGHTKUBE_EXEC_API, command=argv[0], args=argv[1:],
                                   env=[*(loaded.exec.env or []), info], installHint=loaded.exec.installHint)
    authority = config.cluster.certificate_auth
    config = config._replace(
        cluster=msgspec.structs.replace(config.cluster, certificate_auth=str(_file(authority, base)))
        if authority else config.cluster,
        user=msgspec.structs.replace(loaded, **changes))
    if server.startswith("https://"):
        try:  # lightkube reads the CA and client certificate only when a client is built: read them now
            client_adapter.verify_cluster(config.cluster, config.user, config.abs_file, trust_env=False)
        except (ssl.SSLError, OSError, ValueError) as err:
            raise KubeconfigError(f"{where}: context {context!r}: the certificate authority or client "
                                  f"certificate cannot be used: {err}") from err
    return config


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
