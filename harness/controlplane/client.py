"""A thin JSON REST client for the Kubernetes API: stdlib http.client + ssl only.

The harness needs a handful of verbs on a handful of resources, and it must
not depend on the version skew of a generated client. Every call is bounded
by a socket timeout; every non-2xx answer becomes an ApiError carrying the
HTTP status and the Status object's reason and message.
"""

from __future__ import annotations

import http.client
import json
import math
import os
import shutil
import ssl
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Re-exported: callers reach for the API path where they get the client.
from harness.controlplane.base import RESOURCE_API as RESOURCE_API

DEFAULT_TIMEOUT_S = 10.0  # one request/response; generous for a loaded CI machine, short enough to fail a check
LIST_PAGE_SIZE = 500  # kubectl's default --chunk-size (k8s.io/kubectl cmd/get/get.go)
MERGE_PATCH = "application/merge-patch+json"
_STALE_CONNECTION = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError,
                     http.client.CannotSendRequest, http.client.ResponseNotReady)


@dataclass(frozen=True)
class ClusterAccess:
    """How to reach and authenticate to one API server (what a kubeconfig context resolves to)."""

    server: str                          # https://host:port[/prefix]
    ca_pem: bytes | None = None          # trust these roots instead of the system's
    insecure: bool = False               # insecure-skip-tls-verify
    tls_server_name: str | None = None   # verify the certificate for this name instead of the URL's host
    token: str | None = None
    cert_pem: bytes | None = None        # client certificate (chain) ...
    key_pem: bytes | None = None         # ... and its key
    source: str = ""                     # where this came from, for error messages


class ApiError(RuntimeError):
    """The API server answered with an error, or could not be reached (status 0)."""

    def __init__(self, status: int, reason: str, message: str, method: str = "", path: str = "") -> None:
        self.status, self.reason, self.message = status, reason, message
        self.method, self.path = method, path
        what = f"{method} {path}: " if method else ""
        code = f"{status} " if status else ""
        super().__init__(f"{what}{code}{reason}: {message}")


def _ssl_context(access: ClusterAccess) -> ssl.SSLContext:
    if access.insecure:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    elif access.ca_pem is not None:
        ctx = ssl.create_default_context(cadata=access.ca_pem.decode("ascii", errors="replace"))
    else:
        ctx = ssl.create_default_context()
    if access.cert_pem is not None and access.key_pem is not None:
        # ssl only loads client credentials from files: write them to a private
        # directory for the duration of the call and remove them at once.
        tmp = tempfile.mkdtemp(prefix="fakelet-kc-")
        try:
            cert, key = Path(tmp, "client.crt"), Path(tmp, "client.key")
            for path, data in ((cert, access.cert_pem), (key, access.key_pem)):
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
            ctx.load_cert_chain(cert, key)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return ctx


class _HTTPSConnection(http.client.HTTPSConnection):
    """HTTPSConnection that can verify the certificate against a name other than the host (tls-server-name)."""

    def __init__(self, host: str, port: int | None, context: ssl.SSLContext, timeout: float,
                 server_name: str | None) -> None:
        super().__init__(host, port, context=context, timeout=timeout)
        self._server_name = server_name
        self._ctx = context

    def connect(self) -> None:
        http.client.HTTPConnection.connect(self)
        self.sock = self._ctx.wrap_socket(self.sock, server_hostname=self._server_name or self.host)


def _status_error(status: int, body: bytes, method: str, path: str) -> ApiError:
    try:
        obj = json.loads(body)
    except ValueError:
        obj = None
    if isinstance(obj, dict) and obj.get("kind") == "Status":
        return ApiError(status, obj.get("reason") or http.client.responses.get(status, "Error"),
                        obj.get("message") or "", method, path)
    text = body.decode("utf-8", errors="replace").strip().replace("\n", " ")[:300]
    return ApiError(status, http.client.responses.get(status, "Error"), text, method, path)


class KubeClient:
    """Thread-safe: each thread keeps its own keep-alive connection."""

    def __init__(self, access: ClusterAccess, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        url = urllib.parse.urlsplit(access.server)
        if url.scheme not in ("https", "http") or not url.hostname:
            raise ValueError(f"{access.source or 'server'}: server {access.server!r} is not an http(s) URL")
        self.access, self.timeout_s = access, timeout_s
        self._scheme, self._host = url.scheme, url.hostname
        self._port = url.port or (443 if url.scheme == "https" else 80)
        self._prefix = url.path.rstrip("/")
        self._ssl = _ssl_context(access) if url.scheme == "https" else None
        self._local = threading.local()

    @classmethod
    def from_kubeconfig(cls, path: Path, timeout_s: float = DEFAULT_TIMEOUT_S) -> KubeClient:
        # Imported here: kubeconfig.py builds on this module (ClusterAccess, KubeClient).
        from harness.controlplane.kubeconfig import load_kubeconfig

        return cls(load_kubeconfig(Path(path)), timeout_s)

    @property
    def server(self) -> str:
        return self.access.server

    # -- transport ---------------------------------------------------------------------------

    def _connect(self, timeout_s: float) -> http.client.HTTPConnection:
        if self._ssl is not None:
            return _HTTPSConnection(self._host, self._port, self._ssl, timeout_s, self.access.tls_server_name)
        return http.client.HTTPConnection(self._host, self._port, timeout=timeout_s)

    def _headers(self, content_type: str | None) -> dict[str, str]:
        headers = {"Accept": "application/json", "User-Agent": "fakelet"}
        if self.access.token:
            headers["Authorization"] = f"Bearer {self.access.token}"
        if content_type:
            headers["Content-Type"] = content_type
        return headers

    def _unreachable(self, err: BaseException, method: str, path: str, timeout_s: float) -> ApiError:
        if isinstance(err, TimeoutError):
            why = f"no answer within {timeout_s:g}s"
        elif isinstance(err, ssl.SSLError):
            why = f"TLS error: {err}"
        else:
            why = f"{type(err).__name__}: {err}"
        return ApiError(0, "Unreachable", f"{self.access.server}: {why}", method, path)

    def request(self, method: str, path: str, body: Any = None, content_type: str = "application/json",
                query: dict[str, str] | None = None, timeout_s: float | None = None, raw: bool = False) -> Any:
        """One call; returns the decoded JSON answer (None for an empty body), or the bytes when `raw`."""
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        target = self._prefix + path
        if query:
            target += ("&" if "?" in target else "?") + urllib.parse.urlencode(query)
        data = None if body is None else json.dumps(body).encode()
        headers = self._headers(content_type if data is not None else None)
        for attempt in (0, 1):
            conn: http.client.HTTPConnection | None = getattr(self._local, "conn", None)
            reused = conn is not None
            if conn is None:
                conn = self._connect(timeout_s)
                self._local.conn = conn
            try:
                if conn.sock is not None:
                    conn.sock.settimeout(timeout_s)
                conn.timeout = timeout_s
                conn.request(method, target, body=data, headers=headers)
                resp = conn.getresponse()
                payload = resp.read()
            except _STALE_CONNECTION as err:
                conn.close()
                self._local.conn = None
                # The server closes idle keep-alive connections; a request on such a
                # connection never reached it, so one retry on a fresh one is safe.
                if reused and attempt == 0:
                    continue
                raise self._unreachable(err, method, path, timeout_s) from err
            except (OSError, http.client.HTTPException) as err:
                conn.close()
                self._local.conn = None
                raise self._unreachable(err, method, path, timeout_s) from err
            if resp.will_close:
                conn.close()
                self._local.conn = None
            if resp.status >= 300:
                raise _status_error(resp.status, payload, method, path)
            if raw:
                return payload
            if not payload:
                return None
            try:
                return json.loads(payload)
            except ValueError as err:
                raise ApiError(resp.status, "BadResponse", f"answer is not JSON: {payload[:120]!r}",
                               method, path) from err
        raise AssertionError("unreachable")  # the loop returns or raises

    def close(self) -> None:
        """Close this thread's connection (other threads' close when they are collected)."""
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    # -- verbs -------------------------------------------------------------------------------

    def get(self, path: str) -> dict:
        return self.request("GET", path)

    def list(self, path: str, label_selector: str | None = None, field_selector: str | None = None) -> list[dict]:
        """Every item of the collection, following `continue` tokens."""
        items: list[dict] = []
        query: dict[str, str] = {"limit": str(LIST_PAGE_SIZE)}
        if label_selector:
            query["labelSelector"] = label_selector
        if field_selector:
            query["fieldSelector"] = field_selector
        while True:
            page = self.request("GET", path, query=query)
            items.extend(page.get("items") or [])
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return items
            query["continue"] = token

    def list_with_version(self, path: str) -> tuple[list[dict], str]:
        """Items and the list's resourceVersion, to start a watch from (a single page: use on small sets)."""
        page = self.request("GET", path)
        return page.get("items") or [], (page.get("metadata") or {}).get("resourceVersion", "")

    def create(self, path: str, body: dict) -> dict:
        return self.request("POST", path, body)

    def replace(self, path: str, body: dict) -> dict:
        return self.request("PUT", path, body)

    def replace_status(self, path: str, body: dict) -> dict:
        return self.request("PUT", path.rstrip("/") + "/status", body)

    def patch(self, path: str, body: dict) -> dict:
        return self.request("PATCH", path, body, content_type=MERGE_PATCH)

    def delete(self, path: str, missing_ok: bool = True) -> None:
        try:
            self.request("DELETE", path)
        except ApiError as err:
            if not (missing_ok and err.status == 404):
                raise

    def watch(self, path: str, resource_version: str, timeout_s: float) -> Iterator[dict]:
        """Decoded watch events ({"type", "object"}) after `resource_version`, until `timeout_s` has passed.

        BOOKMARK events are passed on; an ERROR event (e.g. 410 Expired) raises
        ApiError. The stream has its own connection, closed when the iterator
        ends or is closed.
        """
        deadline = time.monotonic() + timeout_s
        query = {"watch": "1", "allowWatchBookmarks": "true",
                 "timeoutSeconds": str(max(1, math.ceil(timeout_s)))}
        if resource_version:
            query["resourceVersion"] = resource_version
        target = self._prefix + path + ("&" if "?" in path else "?") + urllib.parse.urlencode(query)
        conn = self._connect(min(self.timeout_s, timeout_s) or 0.001)
        try:
            try:
                conn.request("GET", target, headers=self._headers(None))
                resp = conn.getresponse()
            except (OSError, http.client.HTTPException) as err:
                raise self._unreachable(err, "WATCH", path, min(self.timeout_s, timeout_s)) from err
            if resp.status >= 300:
                raise _status_error(resp.status, resp.read(), "WATCH", path)
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or conn.sock is None:
                    return
                conn.sock.settimeout(remaining)
                try:
                    line = resp.readline()
                except TimeoutError:
                    return
                except (OSError, http.client.HTTPException) as err:
                    raise self._unreachable(err, "WATCH", path, timeout_s) from err
                if not line:
                    return  # the server ended the stream (its timeoutSeconds)
                if not line.strip():
                    continue
                event = json.loads(line)
                if event.get("type") == "ERROR":
                    obj = event.get("object") or {}
                    raise ApiError(int(obj.get("code") or 0), obj.get("reason") or "Error",
                                   obj.get("message") or "", "WATCH", path)
                yield event
        finally:
            conn.close()
