"""The harness's Kubernetes client: a path-based JSON facade over lightkube.

lightkube resolves what a kubeconfig says (server, TLS, token, client
certificate, exec credential plugin) and builds the httpx client that carries
it; KubeClient sends its requests through that client, so the harness keeps
writing API paths and plain dicts, which is what the checks compare against
the API's documents. New code that wants typed resources (resource.k8s.io
ResourceSlice, ResourceClaim, DeviceClass, DeviceTaintRule) takes `typed`, a
lightkube Client on the same configuration. Every call is bounded by a
timeout; every non-2xx answer becomes an ApiError carrying the HTTP status
and the Status object's reason and message.
"""

from __future__ import annotations

import json
import math
import ssl
import threading
import time
import urllib.parse
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import httpx2 as httpx
import lightkube
from lightkube.config import client_adapter
from lightkube.config.kubeconfig import KubeConfig, SingleConfig
from lightkube.config.models import Cluster, User

# Re-exported: callers reach for the API path where they get the client.
from harness.controlplane.base import RESOURCE_API as RESOURCE_API
from harness.controlplane.kubeconfig import load_kubeconfig

DEFAULT_TIMEOUT_S = 10.0  # one request/response; generous for a loaded CI machine, short enough to fail a check
LIST_PAGE_SIZE = 500  # kubectl's default --chunk-size (k8s.io/kubectl cmd/get/get.go)
MERGE_PATCH = "application/merge-patch+json"
NO_CREDENTIALS = "NoCredentials"  # ApiError.reason when the user's credentials could not be had (exec plugin failed)
MESSAGE_MAX = 300  # characters of a plugin's or server's text kept in an ApiError: it must stay one readable line


class ApiError(RuntimeError):
    """The API server answered with an error, or could not be reached (status 0)."""

    def __init__(self, status: int, reason: str, message: str, method: str = "", path: str = "",
                 body: str = "") -> None:
        self.status, self.reason, self.message = status, reason, message
        self.method, self.path = method, path
        self.body = body  # a non-Status answer's whole text (e.g. /readyz's check list); message is one cut line
        what = f"{method} {path}: " if method else ""
        code = f"{status} " if status else ""
        super().__init__(f"{what}{code}{reason}: {message}")


class _CredentialsFailed(Exception):
    """Raised inside the auth flow; KubeClient turns it into an ApiError naming the request."""


def _one_line(text: str) -> str:
    return " ".join(text.split())[:MESSAGE_MAX]


class _ReportingAuth(httpx.Auth):
    """lightkube's auth, with the failures of its exec plugin or token file turned into one clear error.

    lightkube runs the plugin inside the request and lets what goes wrong escape
    as it comes: a ConfigError for a non-zero exit, an OSError when the command
    cannot start, a ValueError or KeyError when its output is not an
    ExecCredential with a token. Only the auth flow's own code runs inside this
    wrapper (httpx sends the requests outside it), so nothing else is caught.
    """

    def __init__(self, inner: httpx.Auth, what: str) -> None:
        self._inner, self._what = inner, what

    def sync_auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        try:
            yield from self._inner.sync_auth_flow(request)
        except lightkube.ConfigError as err:
            raise _CredentialsFailed(f"{self._what}: {_one_line(str(err))}") from err
        except OSError as err:
            raise _CredentialsFailed(f"{self._what}: cannot run it: {err}") from err
        except ValueError as err:
            raise _CredentialsFailed(f"{self._what}: its output is not JSON ({err})") from err
        except (KeyError, TypeError) as err:
            raise _CredentialsFailed(f"{self._what}: its output has no status.token (lightkube takes only a token "
                                     "from an exec plugin, not a client certificate)") from err


def _httpx_client(config: SingleConfig, timeout_s: float) -> httpx.Client:
    """The httpx client lightkube builds for `config`: its TLS context and its auth (token, exec plugin).

    lightkube.Client keeps its httpx client private; client_adapter.Client is the
    function it builds that client with, and the only way to get one that is not
    a private attribute. trust_env=False: no proxy or CA settings from the
    environment, so the local control plane on 127.0.0.1 is reached directly.
    """
    params = client_adapter.ConnectionParams(timeout=httpx.Timeout(timeout_s), trust_env=False)
    client = client_adapter.Client(config, params)
    user = config.user
    if isinstance(client.auth, client_adapter.ExecAuth) and user is not None and user.exec is not None:
        client.auth = _ReportingAuth(client.auth, f"exec plugin {user.exec.command}")
    elif isinstance(client.auth, client_adapter.BearerTokenFileAuth) and user is not None:
        client.auth = _ReportingAuth(client.auth, f"tokenFile {user.token_file}")
    client.headers.update({"Accept": "application/json", "User-Agent": "fakelet"})
    return client


def server_config(server: str, token: str | None = None, insecure: bool = False) -> SingleConfig:
    """A lightkube configuration for one server without a kubeconfig file (the local backend's /readyz probe)."""
    return KubeConfig.from_one(cluster=Cluster(server=server, insecure=insecure), user=User(token=token)).get()


def _tls_cause(err: BaseException) -> ssl.SSLError | None:
    seen: BaseException | None = err
    while seen is not None:
        if isinstance(seen, ssl.SSLError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def _status_error(status: int, body: bytes, method: str, path: str) -> ApiError:
    phrase = httpx.codes.get_reason_phrase(status) or "Error"
    try:
        obj = json.loads(body)
    except ValueError:
        obj = None
    if isinstance(obj, dict) and obj.get("kind") == "Status":
        return ApiError(status, obj.get("reason") or phrase, obj.get("message") or "", method, path)
    text = body.decode("utf-8", errors="replace")
    return ApiError(status, phrase, _one_line(text), method, path, body=text)


class KubeClient:
    """Thread-safe: threads share one httpx connection pool."""

    def __init__(self, config: SingleConfig, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        url = urllib.parse.urlsplit(config.cluster.server)
        if url.scheme not in ("https", "http") or not url.hostname:
            where = f"kubeconfig {config.fname}" if config.fname else "server"
            raise ValueError(f"{where}: server {config.cluster.server!r} is not an http(s) URL")
        if config.user is None:
            # lightkube's adapter requires a user; a context without one is anonymous.
            config = config._replace(user=User())
        self.config, self.timeout_s = config, timeout_s
        self._lock = threading.Lock()
        # Built now, so that bad TLS material fails here rather than at the first call.
        self._http: httpx.Client | None = _httpx_client(config, timeout_s)
        self._typed: lightkube.Client | None = None

    @classmethod
    def from_kubeconfig(cls, path: Path, timeout_s: float = DEFAULT_TIMEOUT_S) -> KubeClient:
        return cls(load_kubeconfig(Path(path)), timeout_s)

    @property
    def server(self) -> str:
        return self.config.cluster.server

    @property
    def typed(self) -> lightkube.Client:
        """lightkube's typed client on the same configuration (closed with this one)."""
        with self._lock:
            if self._typed is None:
                self._typed = lightkube.Client(self.config, timeout=httpx.Timeout(self.timeout_s), trust_env=False,
                                               field_manager="fakelet")
            return self._typed

    # -- transport ---------------------------------------------------------------------------

    def _client(self) -> httpx.Client:
        with self._lock:
            if self._http is None:
                self._http = _httpx_client(self.config, self.timeout_s)
            return self._http

    def _unreachable(self, err: BaseException, method: str, path: str, timeout_s: float) -> ApiError:
        tls = _tls_cause(err)
        if isinstance(err, httpx.TimeoutException):
            why = f"no answer within {timeout_s:g}s"
        elif tls is not None:
            why = f"TLS error: {tls}"
        else:
            why = f"{type(err).__name__}: {err}"
        return ApiError(0, "Unreachable", f"{self.server}: {why}", method, path)

    def _send(self, request: httpx.Request, method: str, path: str, timeout_s: float,
              stream: bool = False) -> httpx.Response:
        try:
            return self._client().send(request, stream=stream)
        except _CredentialsFailed as err:
            raise ApiError(0, NO_CREDENTIALS, str(err), method, path) from err
        except httpx.TransportError as err:
            raise self._unreachable(err, method, path, timeout_s) from err

    @staticmethod
    def _split(path: str, query: dict[str, str] | None) -> tuple[str, dict[str, str] | None]:
        """A path's own query string merged with `query`: httpx replaces a URL's query by `params`,
        which would silently drop e.g. a fieldSelector written into the path."""
        base, _, qs = path.partition("?")
        if not qs:
            return path, query
        return base, {**dict(urllib.parse.parse_qsl(qs, keep_blank_values=True)), **(query or {})}

    def request(self, method: str, path: str, body: Any = None, content_type: str = "application/json",
                query: dict[str, str] | None = None, timeout_s: float | None = None, raw: bool = False) -> Any:
        """One call; returns the decoded JSON answer (None for an empty body), or the bytes when `raw`."""
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": content_type} if data is not None else None
        target, params = self._split(path, query)
        request = self._client().build_request(method, target, params=params, content=data, headers=headers,
                                               timeout=httpx.Timeout(timeout_s))
        resp = self._send(request, method, path, timeout_s)
        payload = resp.content
        if resp.status_code >= 300:
            raise _status_error(resp.status_code, payload, method, path)
        if raw:
            return payload
        if not payload:
            return None
        try:
            return json.loads(payload)
        except ValueError as err:
            raise ApiError(resp.status_code, "BadResponse", f"answer is not JSON: {payload[:120]!r}",
                           method, path) from err

    def close(self) -> None:
        """Close the connections; a later call opens new ones."""
        with self._lock:
            http, typed = self._http, self._typed
            self._http = self._typed = None
        if http is not None:
            http.close()
        if typed is not None:
            typed.close()

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
        ApiError. The server ends the stream at timeoutSeconds (timeout_s rounded
        up); a server that goes silent instead ends it by the read timeout. The
        stream holds its own connection, released when the iterator ends or is closed.
        """
        deadline = time.monotonic() + timeout_s
        query = {"watch": "1", "allowWatchBookmarks": "true",
                 "timeoutSeconds": str(max(1, math.ceil(timeout_s)))}
        if resource_version:
            query["resourceVersion"] = resource_version
        connect_s = min(self.timeout_s, timeout_s) or 0.001
        target, params = self._split(path, query)
        request = self._client().build_request(
            "GET", target, params=params, timeout=httpx.Timeout(connect_s, read=max(timeout_s, 0.001)))
        resp = self._send(request, "WATCH", path, connect_s, stream=True)
        try:
            if resp.status_code >= 300:
                raise _status_error(resp.status_code, resp.read(), "WATCH", path)
            lines = resp.iter_lines()
            while time.monotonic() < deadline:
                try:
                    line = next(lines, None)
                except httpx.ReadTimeout:
                    return
                except httpx.TransportError as err:
                    raise self._unreachable(err, "WATCH", path, timeout_s) from err
                if line is None:
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
            resp.close()
