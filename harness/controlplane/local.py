"""The `local` backend: a real etcd and kube-apiserver on 127.0.0.1, private to this process.

Everything lives in a private temporary directory (0700) that stop() removes:
etcd's data, the serving certificate the API server generates in --cert-dir,
the service-account key pair, the token file and the kubeconfig. Both servers
run in their own sessions under `setpriv --pdeathsig KILL`, so they die with
the harness even when it is SIGKILLed (PR_SET_PDEATHSIG fires when the thread
that started them exits: call start() from a thread that outlives the control
plane, such as the main thread).

Version skew: Debian's etcd-server is etcd 3.4.23. kube-apiserver 1.36 runs on
it; its etcd feature-support checker (k8s.io/apiserver
pkg/storage/feature/feature_support_checker.go) finds that this etcd lacks
RequestWatchProgress (fixed in etcd 3.4.31/3.5.13) and turns the watch-progress
feature off by itself. With it off, consistent lists are served from etcd
instead of the watch cache, and streaming lists (sendInitialEvents=true) fail
with a 500 "the required storage feature RequestWatchProgress is disabled". We
turn the WatchList feature gate off explicitly, so that every etcd (3.4 here,
3.5+ from $KUBEBUILDER_ASSETS) gives drivers the same API: streaming lists are
refused with a 422 and client-go's reflector falls back to LIST+WATCH, as it
does against any server without WatchList.
"""

from __future__ import annotations

import atexit
import contextlib
import http.client
import os
import platform
import re
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
from pathlib import Path

from harness.controlplane.base import ControlPlaneStartError, ControlPlaneUnavailable
from harness.controlplane.client import ApiError, KubeClient, server_config
from harness.controlplane.kubeconfig import write_kubeconfig
from harness.instruments.doctor import machine_lacks
from harness.instruments.progress import Progress
from harness.launch import gobuild
from harness.launch.owners import owned_dir, remove_owned
from harness.launch.process import die_with_parent, kill_working_in
from harness.launch.reaper import reap
from harness.spec import bundled

# etcd + kube-apiserver to /readyz: ~3 s on an idle 2-core machine, yet over 60 s on a shared CI runner at a load
# of 20, where the post-start hooks (RBAC bootstrap, priority-and-fairness) are the last to finish.
START_TIMEOUT_S = 180.0
START_QUIET_S = 10.0  # a start-up this quick goes unannounced; a loaded machine's slow one is shown
STOP_GRACE_S = 5.0  # after SIGTERM, how long before SIGKILL (kube-apiserver drains requests first)
READYZ_BACKOFF_S = (0.05, 0.5)  # first and longest pause between /readyz polls
READYZ_TIMEOUT_S = 2.0  # one /readyz call
PORT_ATTEMPTS = 3  # a free port picked here can be taken before the server binds it: retry with new ports
LOG_TAIL_LINES = 15
WORKDIR_PREFIX = "fakelet-cp-"
SERVICE_CLUSTER_IP_RANGE = "10.0.0.0/24"  # any private range: nothing routes to services here
SA_ISSUER = "https://kubernetes.default.svc.cluster.local"  # kubeadm's default service-account issuer
ADMIN_USER = "fakelet-admin"
ADMIN_GROUP = "system:masters"  # k8s.io/apiserver pkg/authentication/user/user.go SystemPrivilegedGroup
KUBE_MODULE = "kubernetes"  # fixtures/go/kubernetes: the wrapper module that pins k8s.io/kubernetes
KUBE_APISERVER_PACKAGE = "k8s.io/kubernetes/cmd/kube-apiserver"
KUBE_CONTROLLER_MANAGER_PACKAGE = "k8s.io/kubernetes/cmd/kube-controller-manager"
# Started only when asked (the kep5970 suite): every other check plays the scheduler itself, and its pods carry
# schedulerName "fakelet", which the real one leaves alone.
KUBE_SCHEDULER_PACKAGE = "k8s.io/kubernetes/cmd/kube-scheduler"
# Only what the DRA checks need, by the names in cmd/kube-controller-manager/names/controller_names.go:
# device taints evict pods (DeviceTaintEvictionController), and the claim controller drops reservations of
# deleted pods and deallocates claims nobody uses any more (ResourceClaimController). No other controller
# runs: fakelet plays the scheduler and the kubelet itself.
CONTROLLERS = ("device-taint-eviction-controller", "resourceclaim-controller")
HEALTHZ_TIMEOUT_S = 2.0  # one /healthz call to kube-controller-manager
ETCD_PACKAGE_HINT = "Debian package etcd-server"

# Feature gates, each checked against kube-apiserver v1.36.3's --help:
FEATURE_GATES = {
    # See the module docstring: the same streaming-list behaviour on etcd 3.4 and 3.5+.
    "WatchList": False,
    # DeviceTaintRule objects (resource.k8s.io/v1beta2), beta and off by default in 1.36.
    # DRADeviceTaints (device taints in ResourceSlices) is beta and on by default.
    "DRADeviceTaints": True,
    "DRADeviceTaintRules": True,
    # DRAPartitionableDevices (sharedCounters, consumesCounters: the DRA-PRT checks) needs no entry: beta and on by
    # default from 1.36 (kube_features.go v1.36.3; alpha and off in v1.35.4).
    # Nor does DRAConsumableCapacity (allowMultipleAllocations, requestPolicy, shareID: the DRA-CAP checks): beta and
    # on by default from 1.36 (kube_features.go v1.36.3; alpha and off in v1.35.4).
}
# Beta APIs are off by default: serve only the DeviceTaintRule resource of v1beta2.
RUNTIME_CONFIG = "resource.k8s.io/v1beta2/devicetaintrules=true"


def _tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join("    " + line[:300] for line in text.splitlines()[-lines:]) or "    (empty log)"


def _not_ready(answer: str) -> str:
    """The checks a /readyz answer lists as failing ("[-]name failed: ..."): the many passing ones hide them."""
    failing = [line.strip() for line in answer.splitlines() if line.strip().startswith("[-]")]
    lines = answer.splitlines()
    return "; ".join(failing) if failing else (lines[0] if lines else "no answer")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _from_path_or_assets(name: str) -> Path | None:
    found = shutil.which(name)
    if found:
        return Path(found)
    assets = os.environ.get("KUBEBUILDER_ASSETS")
    if assets and os.access(Path(assets, name), os.X_OK):
        return Path(assets, name)
    return None


def find_etcd() -> Path:
    etcd = _from_path_or_assets("etcd")
    if etcd is None:
        raise ControlPlaneUnavailable(machine_lacks(f"etcd not found on PATH or in $KUBEBUILDER_ASSETS "
                                                    f"({ETCD_PACKAGE_HINT})"))
    return etcd


def _kube_module(module_dir: str | None = None) -> Path:
    """A wrapper module: a name is one of fakelet's own (fixtures/go/NAME), an absolute path a generated one
    (node/real/releases.py)."""
    name = module_dir or KUBE_MODULE
    return Path(name) if Path(name).is_absolute() else bundled.go_module(name)


def find_kube_apiserver() -> tuple[Path, str | None]:
    """The binary, and the k8s.io/kubernetes version it was built from when we built it."""
    return find_kube_binary("kube-apiserver", KUBE_APISERVER_PACKAGE, why="for the local API server")


def find_kube_binary(name: str, package: str, module_dir: str | None = None, why: str = "") -> tuple[Path, str | None]:
    """A Kubernetes server binary from PATH or $KUBEBUILDER_ASSETS, else built from the wrapper module;
    with `module_dir` (a release's own wrapper module), always built from that module. `why` is for the
    progress lines of a build."""
    if module_dir is None:
        found = _from_path_or_assets(name)
        if found is not None:
            return found, None
    module = _kube_module(module_dir)
    missing = f"{name} not found on PATH or in $KUBEBUILDER_ASSETS"
    try:
        built = gobuild.build(module, package, name, why=why)
    except gobuild.GoUnavailable as err:
        raise ControlPlaneUnavailable(machine_lacks(f"{missing}, and cannot build it: {err}")) from err
    except FileNotFoundError as err:
        raise ControlPlaneUnavailable(f"{missing}, and cannot build it: {err}") from err
    except (RuntimeError, subprocess.TimeoutExpired) as err:
        last = [line for line in str(err).splitlines() if line.strip()][-1:] or ["?"]
        # Mostly the machine: the Go module proxy out of reach, a disk full, a build past its bound.
        raise ControlPlaneUnavailable(machine_lacks(f"{missing}, and building it from {module} failed: {last[0]}")) \
            from err
    match = re.search(r"^\s*require\s+k8s\.io/kubernetes\s+(v\S+)", (module / "go.mod").read_text(), re.M)
    return built, match.group(1) if match else None


def _make_sa_keys(key: Path, pub: Path) -> None:
    """The service-account token signing pair (kube-apiserver refuses to start without one)."""
    openssl = shutil.which("openssl")
    if openssl is not None:
        # P-256: instant to generate, and kube-apiserver signs with ES256 from it.
        for args in (["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", str(key)],
                     ["pkey", "-in", str(key), "-pubout", "-out", str(pub)]):
            proc = subprocess.run([openssl, *args], capture_output=True, text=True, timeout=30)
            if proc.returncode != 0:
                raise ControlPlaneUnavailable(f"openssl {args[0]} failed: {proc.stderr.strip()[:200]}")
        return
    try:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ec
    except ImportError as err:
        raise ControlPlaneUnavailable("neither the openssl command nor the Python package cryptography found "
                                      "(needed for the service-account signing key)") from err
    private = ec.generate_private_key(ec.SECP256R1())
    key.write_bytes(private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    pub.write_bytes(private.public_key().public_bytes(serialization.Encoding.PEM,
                                                      serialization.PublicFormat.SubjectPublicKeyInfo))


def _ca_from_cert_dir(cert: Path) -> bytes:
    """The CA that signed the generated serving certificate (the file holds leaf, then CA)."""
    blocks = re.findall(rb"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----\n?", cert.read_bytes(), re.S)
    if not blocks:
        raise ControlPlaneStartError(f"kube-apiserver wrote no certificate to {cert}")
    return blocks[-1]


class _PortTaken(Exception):
    """A server could not bind a port picked for it; start again with new ones."""


class _Server:
    """One server process in its own session, its output in a log file."""

    def __init__(self, name: str, argv: list[str], log: Path, cwd: Path, env: dict[str, str]) -> None:
        self.name, self.log = name, log
        with open(log, "ab") as out:
            out.write(f"--- {' '.join(argv)}\n".encode())
            out.flush()
            self.proc = subprocess.Popen(die_with_parent(argv), stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, cwd=cwd, env=env, start_new_session=True)

    def exited(self) -> int | None:
        return self.proc.poll()

    def failure(self) -> str:
        code = self.proc.returncode
        text = _tail(self.log)
        if "address already in use" in text:
            raise _PortTaken(self.name)
        return f"{self.name} exited with code {code} during start-up; last lines of its log:\n{text}"

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                pass
        # SIGKILL the whole session, also after a clean exit: nothing it started may outlive it.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=grace_s)


class LocalControlPlane:
    name = "local"

    def __init__(self, workdir: Path | None = None, start_timeout_s: float = START_TIMEOUT_S,
                 scheduler: bool = False) -> None:
        self.parent_dir = workdir
        self.with_scheduler = scheduler
        self._scheduler: _Server | None = None
        self.scheduler_error = "" if scheduler else "not asked for"
        self.start_timeout_s = start_timeout_s
        self.workdir: Path | None = None
        self.kubeconfig = Path()
        self.server = ""
        self.startup_s = 0.0
        self._etcd: _Server | None = None
        self._apiserver: _Server | None = None
        self._controller_manager: _Server | None = None
        # Why the controllers DRA needs do not run here ("" when they do): checks that need
        # the device-taint eviction controller skip with this reason.
        self.controllers_error = ""
        self._client: KubeClient | None = None
        self._version: dict = {}
        self._binaries: dict[str, str] = {}
        self._module_version: str | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> LocalControlPlane:
        if self._client is not None:
            return self
        etcd = find_etcd()
        kube_apiserver, self._module_version = find_kube_apiserver()
        self._binaries = {"etcd": str(etcd), "kube-apiserver": str(kube_apiserver)}
        try:
            kcm, _ = find_kube_binary("kube-controller-manager", KUBE_CONTROLLER_MANAGER_PACKAGE,
                                      why="for the DRA controllers beside the local API server")
            self._binaries["kube-controller-manager"] = str(kcm)
        except ControlPlaneUnavailable as err:
            # The API server alone still serves every check but eviction.
            self.controllers_error = str(err).splitlines()[0]
        if self.with_scheduler:
            try:
                sched, _ = find_kube_binary("kube-scheduler", KUBE_SCHEDULER_PACKAGE,
                                            why="for the kep5970 suite's allocations")
                self._binaries["kube-scheduler"] = str(sched)
            except ControlPlaneUnavailable as err:
                self.scheduler_error = str(err).splitlines()[0]  # fakelet's own scheduler allocates instead
        started = time.monotonic()
        atexit.register(self.stop)
        try:
            parent = Path(self.parent_dir or tempfile.gettempdir())
            # A SIGKILLed harness cannot remove its workdir (its servers died with it: pdeathsig).
            reap(parent)
            self.workdir = owned_dir(WORKDIR_PREFIX, parent)  # 0700
            token = secrets.token_hex(24)
            self._prepare(token)
            servers = ", ".join(self._binaries)
            with Progress("the local API server", doing="starting", done="started", quiet_s=START_QUIET_S,
                          detail=f" ({servers} on 127.0.0.1)"):
                self._start_with_free_ports(etcd, kube_apiserver, token)
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.monotonic() - started
        return self

    def _start_with_free_ports(self, etcd: Path, kube_apiserver: Path, token: str) -> None:
        for attempt in range(PORT_ATTEMPTS):
            try:
                self._start_servers(etcd, kube_apiserver, token, attempt)
                return
            except _PortTaken as taken:
                self._stop_servers()
                if attempt == PORT_ATTEMPTS - 1:
                    raise ControlPlaneStartError(f"{taken}: no free port after {PORT_ATTEMPTS} attempts") from None

    def _prepare(self, token: str) -> None:
        assert self.workdir is not None
        _make_sa_keys(self.workdir / "sa.key", self.workdir / "sa.pub")
        # token,user,uid,"groups" (k8s.io/apiserver plugin/pkg/authenticator/token/tokenfile).
        tokens = self.workdir / "tokens.csv"
        fd = os.open(tokens, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(f'{token},{ADMIN_USER},{ADMIN_USER},"{ADMIN_GROUP}"\n')

    def _start_servers(self, etcd: Path, kube_apiserver: Path, token: str, attempt: int) -> None:
        wd = self.workdir
        assert wd is not None
        data = wd / f"etcd-{attempt}"
        client_port, peer_port, secure_port = _free_port(), _free_port(), _free_port()
        etcd_url, peer_url = f"http://127.0.0.1:{client_port}", f"http://127.0.0.1:{peer_port}"
        env = dict(os.environ)
        if platform.machine() in ("aarch64", "arm64"):
            env["ETCD_UNSUPPORTED_ARCH"] = "arm64"  # etcd 3.4 refuses arm64 without it (etcdmain/etcd.go)
        self._etcd = _Server("etcd", [
            str(etcd), "--name", "fakelet", "--data-dir", str(data),
            "--listen-client-urls", etcd_url, "--advertise-client-urls", etcd_url,
            "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
            "--initial-cluster", f"fakelet={peer_url}",
        ], wd / "etcd.log", wd, env)
        gates = ",".join(f"{k}={str(v).lower()}" for k, v in FEATURE_GATES.items())
        self._apiserver = _Server("kube-apiserver", [
            str(kube_apiserver),
            "--etcd-servers", etcd_url,
            "--bind-address", "127.0.0.1", "--secure-port", str(secure_port),
            "--advertise-address", "127.0.0.1",
            # No kubernetes Service endpoints: 127.0.0.1 is refused as an endpoint address,
            # and nothing here routes to services.
            "--endpoint-reconciler-type", "none",
            "--cert-dir", str(wd / "pki"),
            "--token-auth-file", str(wd / "tokens.csv"),
            # Real authorization, as kubeadm sets it up: our admin is in system:masters and
            # passes; a later check can give a driver a narrower identity and see real 403s.
            "--authorization-mode", "Node,RBAC",
            "--service-account-issuer", SA_ISSUER,
            "--service-account-key-file", str(wd / "sa.pub"),
            "--service-account-signing-key-file", str(wd / "sa.key"),
            "--service-cluster-ip-range", SERVICE_CLUSTER_IP_RANGE,
            "--feature-gates", gates,
            "--runtime-config", RUNTIME_CONFIG,
        ], wd / "kube-apiserver.log", wd, env)
        self.server = f"https://127.0.0.1:{secure_port}"
        self._wait_ready(token)
        ca = _ca_from_cert_dir(wd / "pki" / "apiserver.crt")
        self.kubeconfig = write_kubeconfig(wd / "kubeconfig", self.server, ca, token)
        client = KubeClient.from_kubeconfig(self.kubeconfig)
        try:
            # Through the kubeconfig we hand out: proves its CA and token work.
            self._version = client.request("GET", "/version") or {}
        except ApiError as err:
            raise ControlPlaneStartError(f"kube-apiserver is ready but the generated kubeconfig fails: {err}") \
                from err
        self._client = client
        if "kube-controller-manager" in self._binaries:
            self._start_controller_manager(Path(self._binaries["kube-controller-manager"]), env)
        if "kube-scheduler" in self._binaries:
            self._start_scheduler(Path(self._binaries["kube-scheduler"]), env)

    def _start_scheduler(self, binary: Path, env: dict[str, str]) -> None:
        wd = self.workdir
        assert wd is not None
        port = _free_port()
        self._scheduler = _Server("kube-scheduler", [
            str(binary), "--kubeconfig", str(self.kubeconfig), "--leader-elect=false",
            "--bind-address", "127.0.0.1", "--secure-port", str(port), "--cert-dir", str(wd / "scheduler-pki"),
        ], wd / "kube-scheduler.log", wd, env)
        self._wait_healthy(self._scheduler, port)
        self.scheduler_error = ""

    def _start_controller_manager(self, binary: Path, env: dict[str, str]) -> None:
        wd = self.workdir
        assert wd is not None
        port = _free_port()
        gates = ",".join(f"{k}={str(v).lower()}" for k, v in FEATURE_GATES.items() if k != "WatchList")
        self._controller_manager = _Server("kube-controller-manager", [
            str(binary), "--kubeconfig", str(self.kubeconfig),
            "--controllers", ",".join(CONTROLLERS),
            "--feature-gates", gates,
            "--leader-elect=false",
            "--bind-address", "127.0.0.1", "--secure-port", str(port),
            "--cert-dir", str(wd / "kcm-pki"),
        ], wd / "kube-controller-manager.log", wd, env)
        self._wait_healthy(self._controller_manager, port)

    def _wait_healthy(self, server: _Server, port: int) -> None:
        """Poll /healthz (no event exists for it) under the start deadline; abort the moment it exits."""
        ctx = ssl.create_default_context()
        ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE  # its self-signed serving certificate
        deadline = time.monotonic() + self.start_timeout_s
        backoff, last = READYZ_BACKOFF_S[0], "no answer yet"
        while True:
            if server.exited() is not None:
                raise ControlPlaneStartError(server.failure())
            conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=HEALTHZ_TIMEOUT_S)
            try:
                conn.request("GET", "/healthz")
                resp = conn.getresponse()
                body = resp.read().decode(errors="replace").strip()
                if resp.status == 200:
                    return
                last = f"{resp.status} {body[:200]}"
            except (OSError, http.client.HTTPException) as err:
                last = f"{type(err).__name__}: {err}"
            finally:
                conn.close()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ControlPlaneStartError(f"{server.name} not healthy within {self.start_timeout_s:g}s ({last}); "
                                             f"last lines of its log:\n{_tail(server.log)}")
            with contextlib.suppress(subprocess.TimeoutExpired):
                server.proc.wait(timeout=min(backoff, remaining))
            backoff = min(backoff * 2, READYZ_BACKOFF_S[1])

    def _wait_ready(self, token: str) -> None:
        """Poll /readyz (no event exists for it) under the deadline; abort the moment a server exits."""
        assert self._etcd is not None and self._apiserver is not None
        # The serving certificate does not exist until the server has written it: the probe
        # skips verification; the kubeconfig client verifies it right after.
        probe = KubeClient(server_config(self.server, token=token, insecure=True), READYZ_TIMEOUT_S)
        deadline = time.monotonic() + self.start_timeout_s
        backoff, last = READYZ_BACKOFF_S[0], "no answer yet"
        try:
            while True:
                for server in (self._etcd, self._apiserver):
                    if server.exited() is not None:
                        raise ControlPlaneStartError(server.failure())
                try:
                    probe.request("GET", "/readyz", raw=True)
                    return
                except ApiError as err:
                    last = _not_ready(err.body) if err.body else str(err)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise ControlPlaneStartError(
                        f"kube-apiserver not ready within {self.start_timeout_s:g}s ({last}); "
                        f"last lines of its log:\n{_tail(self._apiserver.log)}")
                # Wait out the backoff on the API server's exit, so that a crash ends the wait at once.
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self._apiserver.proc.wait(timeout=min(backoff, remaining))
                backoff = min(backoff * 2, READYZ_BACKOFF_S[1])
        finally:
            probe.close()

    def _stop_servers(self) -> None:
        # The API server first: without etcd it retries for a long time instead of exiting.
        for server in (self._scheduler, self._controller_manager, self._apiserver, self._etcd):
            if server is not None:
                server.stop()
        self._scheduler = self._controller_manager = self._apiserver = self._etcd = None

    def stop(self) -> None:
        atexit.unregister(self.stop)
        if self._client is not None:
            self._client.close()
            self._client = None
        self._stop_servers()
        if self.workdir is not None:
            # A server whose start a Ctrl-C cut short may be running unrecorded (the signal landed after its
            # Popen, before _Server kept it): the servers run in the workdir, so that finds them all.
            kill_working_in(self.workdir, STOP_GRACE_S)
            remove_owned(self.workdir)
            self.workdir = None

    # -- use ---------------------------------------------------------------------------------

    def client(self) -> KubeClient:
        if self._client is None:
            raise RuntimeError("local control plane: start() it first")
        return self._client

    def pids(self) -> list[int]:
        """The servers' process ids (for leak checks)."""
        return [s.proc.pid for s in (self._etcd, self._apiserver, self._controller_manager, self._scheduler)
                if s is not None]

    def log_tail(self, name: str = "kube-apiserver", lines: int = LOG_TAIL_LINES) -> str:
        if self.workdir is None:
            return ""
        return _tail(self.workdir / f"{name}.log", lines)

    def describe(self) -> dict[str, str]:
        git = str(self._version.get("gitVersion", ""))
        if git.startswith("v0.0.0") and self._module_version:
            # Built with plain `go build`, which leaves the version unstamped: name the module's pin.
            version = self._module_version
        else:
            version = git or f"v{self._version.get('major', '?')}.{self._version.get('minor', '?')}"
        return {"backend": self.name, "version": version, "server": self.server,
                "kube-apiserver": self._binaries.get("kube-apiserver", ""), "etcd": self._binaries.get("etcd", ""),
                "kube-controller-manager": self._binaries.get("kube-controller-manager", "")
                or f"not running: {self.controllers_error}",
                "controllers": ",".join(CONTROLLERS) if self._controller_manager is not None else "",
                "kube-scheduler": self._binaries.get("kube-scheduler", "") if self._scheduler is not None
                else f"not running: {self.scheduler_error}",
                "startup_s": f"{self.startup_s:.1f}"}
