"""Wire compatibility of fakelet's DRA .proto files with upstream, by live calls.

tests/go/wirecompat is built on upstream k8s.io/kubelet's generated packages
(pluginregistration v1, dra v1 and v1beta1, dra-health v1alpha1 and v1).
Upstream decoding never fails on a field under a wrong number or type, it
just yields a missing or wrong value, so every test compares values in both
directions:

(a) fakelet's Python side is the kubelet: it dials `wirecompat draplugin`
    with harness.wire stubs, and the plugin's JSON call log says what upstream
    decoded from our requests;
(b) `wirecompat dracall` and `wirecompat healthwatch` are the kubelet, against
    a server built here from our stubs, and report what they decoded;
(c) the same programs against fakelet's own DRA pieces: the fake kubelet's
    plugin watcher and DRA manager registering draplugin, and the reference
    DRA driver serving dracall and healthwatch (skipped until those exist).
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import os
import subprocess
import sys
import threading
import time
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest
from test_wirecompat import EXIT, OUT, WAIT_S, GoProcess, build_or_skip

import harness.wire as wire
from harness.instruments.grpcutil import insecure_unix_channel
from harness.instruments.timeline import Timeline
from harness.launch.gobuild import build

CALL_TIMEOUT_S = 30  # bound for one wirecompat client run; passing runs take well under a second

DRIVER = "wirecompat.example.com"
ALL_SERVICES = ["v1.DRAPlugin", "v1beta1.DRAPlugin", "v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth"]
DRA_VERSIONS = ["v1", "v1beta1"]
HEALTH_VERSIONS = ["v1", "v1alpha1"]

# What we send to draplugin: a claim it prepares and one it refuses (name "fail-...").
CLAIMS = [("ns-a", "uid-a", "claim-a"), ("ns-b", "uid-b", "fail-b")]
GO_HEALTH = ["HEALTHY", "UNHEALTHY", "UNKNOWN"]  # draplugin --health
GO_HEALTH_TIME = 1_750_000_000  # draplugin --health-time


@pytest.fixture(scope="module")
def wirecompat_bin() -> Path:
    return build_or_skip(build)


def _pb2(api: str, version: str) -> tuple[Any, Any]:
    name = f"{api}_{version}"
    return getattr(wire, name), getattr(wire, f"{name}_grpc")


def _run(binary: Path, *args: str, expect: int = 0) -> dict[str, Any]:
    proc = subprocess.run([str(binary), *args], capture_output=True, text=True, timeout=CALL_TIMEOUT_S)
    assert proc.returncode == expect, f"wirecompat {args[0]} exited {proc.returncode}:\n{proc.stderr}"
    return json.loads(proc.stdout)


# ---------------------------------------------------------------------------
# (a) our stubs as the kubelet, upstream's as the plugin


class DraPlugin:
    """A running `wirecompat draplugin` in `tmp`, with its call log on a timeline."""

    def __init__(self, binary: Path, tmp: Path, *extra: str, registry_dir: Path | None = None,
                 socket: Path | None = None, driver: str = DRIVER) -> None:
        self.timeline = Timeline()
        self.registry_dir = registry_dir or tmp / "reg"
        self.registry_dir.mkdir(parents=True, exist_ok=True)
        self.socket = socket or tmp / "dra.sock"
        self.socket.parent.mkdir(parents=True, exist_ok=True)
        self.reg_socket = self.registry_dir / f"{driver}-reg.sock"
        argv = [str(binary), "draplugin", "--registry-dir", str(self.registry_dir), "--socket", str(self.socket),
                "--driver", driver, *extra]
        self.proc = GoProcess("wirecompat-draplugin", argv, self.timeline, tmp)

    def __enter__(self) -> DraPlugin:
        self.proc.__enter__()
        self.serving = self.proc.out(lambda d: d.get("event") == "serving", "draplugin to serve").data
        return self

    def __exit__(self, *exc: Any) -> None:
        self.proc.__exit__(*exc)

    def calls(self, service: str | None = None, method: str | None = None) -> list[dict[str, Any]]:
        return [e.data for e in self.timeline.events(kind=OUT)
                if e.source == self.proc.name and e.get("event") == "call"
                and service in (None, e.get("service")) and method in (None, e.get("method"))]

    def wait_calls(self, n: int, service: str | None = None, method: str | None = None) -> list[dict[str, Any]]:
        """The calls once at least `n` are logged: a line can reach us after the RPC's response did."""
        deadline = time.monotonic() + WAIT_S
        while len(calls := self.calls(service, method)) < n and time.monotonic() < deadline:
            time.sleep(0.01)
        return calls

    def wait_call(self, service: str, method: str) -> dict[str, Any]:
        return self.proc.out(lambda d: d.get("service") == service and d.get("method") == method,
                             f"a {service}/{method} call").data

    def stop(self) -> int | None:
        return self.proc.terminate()


def _claims_json(claims: list[tuple[str, str, str]]) -> dict[str, Any]:
    return {"claims": [{"namespace": ns, "uid": uid, "name": name} for ns, uid, name in claims]}


def test_registration_with_our_stubs(wirecompat_bin, tmp):
    with DraPlugin(wirecompat_bin, tmp) as plugin:
        assert plugin.serving["services"] == ALL_SERVICES
        assert Path(plugin.serving["registration"]) == plugin.reg_socket
        with insecure_unix_channel(str(plugin.reg_socket)) as channel:
            stub = wire.reg_grpc.RegistrationStub(channel)
            info = stub.GetInfo(wire.reg.InfoRequest(), timeout=WAIT_S, wait_for_ready=True)
            assert (info.type, info.name, info.endpoint, list(info.supported_versions)) == (
                "DRAPlugin", DRIVER, str(plugin.socket), ALL_SERVICES)
            for registered, error in ((False, "wc: rejected ünïcode"), (True, "")):
                stub.NotifyRegistrationStatus(wire.reg.RegistrationStatus(plugin_registered=registered, error=error),
                                              timeout=WAIT_S)

        service = "pluginregistration.Registration"
        assert [c["request"] for c in plugin.wait_calls(1, service, "GetInfo")] == [{}]
        assert [c["request"] for c in plugin.wait_calls(2, service, "NotifyRegistrationStatus")] == [
            {"plugin_registered": False, "error": "wc: rejected ünïcode"},
            {"plugin_registered": True, "error": ""},
        ]
        assert plugin.stop() == 0, "draplugin must exit 0 on SIGTERM"
    assert not plugin.reg_socket.exists() and not plugin.socket.exists(), "draplugin left a socket behind"


@pytest.mark.parametrize("version", DRA_VERSIONS)
def test_prepare_unprepare_with_our_stubs(wirecompat_bin, tmp, version):
    pb2, pb2_grpc = _pb2("dra", version)
    claims = [pb2.Claim(namespace=ns, uid=uid, name=name) for ns, uid, name in CLAIMS]
    with DraPlugin(wirecompat_bin, tmp) as plugin, insecure_unix_channel(str(plugin.socket)) as channel:
        stub = pb2_grpc.DRAPluginStub(channel)
        prepared = stub.NodePrepareResources(pb2.NodePrepareResourcesRequest(claims=claims), timeout=WAIT_S,
                                             wait_for_ready=True)
        unprepared = stub.NodeUnprepareResources(pb2.NodeUnprepareResourcesRequest(claims=claims), timeout=WAIT_S)

        # What upstream decoded from our requests.
        service = f"{version}.DRAPlugin"
        assert [c["request"] for c in plugin.wait_calls(1, service, "NodePrepareResources")] == [
            _claims_json(CLAIMS)]
        assert [c["request"] for c in plugin.wait_calls(1, service, "NodeUnprepareResources")] == [
            _claims_json(CLAIMS)]
        assert len(plugin.calls()) == 2, plugin.calls()

    # What we decoded from upstream's responses.
    assert set(prepared.claims) == {"uid-a", "uid-b"}
    ok, refused = prepared.claims["uid-a"], prepared.claims["uid-b"]
    assert ok.error == ""
    assert len(ok.devices) == 1
    (device,) = ok.devices
    assert list(device.request_names) == ["wc-req"]
    assert (device.pool_name, device.device_name) == ("wc-pool", "wc-dev-uid-a")
    assert list(device.cdi_device_ids) == ["wirecompat.example.com/dev=uid-a"]
    if version == "v1":
        assert device.HasField("share_id") and device.share_id == "wc-share-uid-a"
    else:
        assert "share_id" not in pb2.Device.DESCRIPTOR.fields_by_name
    assert (refused.error, len(refused.devices)) == ("wirecompat: refused claim uid-b", 0)
    assert {uid: r.error for uid, r in unprepared.claims.items()} == {
        "uid-a": "", "uid-b": "wirecompat: refused unprepare uid-b"}


def _expected_go_health(i: int, health: str) -> dict[str, Any]:
    return {"pool_name": "wc-pool", "device_name": f"wc-dev-{i}", "health": health,
            "last_updated_time": GO_HEALTH_TIME + i, "health_check_timeout_seconds": 30 + i,
            "message": f"wc-dev-{i} is {health}"}


def _health_dict(pb2: Any, message: Any) -> list[dict[str, Any]]:
    return [{"pool_name": d.device.pool_name, "device_name": d.device.device_name,
             "health": pb2.HealthStatus.Name(d.health), "last_updated_time": d.last_updated_time,
             "health_check_timeout_seconds": d.health_check_timeout_seconds, "message": d.message}
            for d in message.devices]


@pytest.mark.parametrize("version", HEALTH_VERSIONS)
def test_health_stream_with_our_stubs(wirecompat_bin, tmp, version):
    pb2, pb2_grpc = _pb2("drahealth", version)
    extra = ["--health", ",".join(GO_HEALTH), "--health-interval", "50ms", "--health-time", str(GO_HEALTH_TIME)]
    with DraPlugin(wirecompat_bin, tmp, *extra) as plugin, insecure_unix_channel(str(plugin.socket)) as channel:
        stream = pb2_grpc.DRAResourceHealthStub(channel).NodeWatchResources(
            pb2.NodeWatchResourcesRequest(), timeout=WAIT_S, wait_for_ready=True)
        try:
            messages = [next(stream), next(stream)]  # the first list and one resend
        finally:
            stream.cancel()
        assert [c["request"] for c in plugin.wait_calls(1, f"{version}.DRAResourceHealth",
                                                        "NodeWatchResources")] == [{}]
        assert len(plugin.calls()) == 1, plugin.calls()
        # The plugin copes with a kubelet that goes away: it keeps serving.
        assert plugin.proc.proc.poll() is None
        assert plugin.stop() == 0

    expected = [_expected_go_health(i, h) for i, h in enumerate(GO_HEALTH)]
    assert [_health_dict(pb2, m) for m in messages] == [expected, expected]


def test_draplugin_serves_only_advertised_services(wirecompat_bin, tmp):
    """--versions picks what GetInfo advertises and what is served (for negotiation tests)."""
    with DraPlugin(wirecompat_bin, tmp, "--versions", "v1beta1.DRAPlugin,v9.Bogus") as plugin:
        assert plugin.serving["services"] == ["v1beta1.DRAPlugin"]
        with insecure_unix_channel(str(plugin.reg_socket)) as channel:
            info = wire.reg_grpc.RegistrationStub(channel).GetInfo(wire.reg.InfoRequest(), timeout=WAIT_S,
                                                                     wait_for_ready=True)
        assert list(info.supported_versions) == ["v1beta1.DRAPlugin", "v9.Bogus"]
        with insecure_unix_channel(str(plugin.socket)) as channel:
            request = wire.dra_v1.NodePrepareResourcesRequest(claims=[wire.dra_v1.Claim(uid="u")])
            with pytest.raises(grpc.RpcError) as err:
                wire.dra_v1_grpc.DRAPluginStub(channel).NodePrepareResources(request, timeout=WAIT_S,
                                                                              wait_for_ready=True)
            assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED


# ---------------------------------------------------------------------------
# (b) upstream's stubs as the kubelet, ours as the plugin

SHARE_ID = "share-ü-7"
# Negative and large int64 values, and every enum value: a wrong varint type or number shows up here.
PY_HEALTH = [
    [("pool-a", "dev-0", "HEALTHY", 1_700_000_000, 0, ""),
     ("pool-a", "dev-1", "UNHEALTHY", 2**40 + 3, -5, "ECC burst: 12 uncorrectable"),
     ("pool-b", "dev-0", "UNKNOWN", -1, 2**33, "température ✓")],
    [("pool-a", "dev-0", "UNHEALTHY", 1_700_000_060, 45, "x" * 1500)],
]


class PythonDRAServer:
    """DRAPlugin v1/v1beta1 and DRAResourceHealth v1/v1alpha1 on one socket, from our stubs."""

    def __init__(self, socket: Path, end_health_stream: bool = False) -> None:
        self.socket = socket
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.end_health_stream = end_health_stream
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        for version in DRA_VERSIONS:
            pb2, pb2_grpc = _pb2("dra", version)
            pb2_grpc.add_DRAPluginServicer_to_server(self._dra_servicer(version, pb2), self.server)
        for version in HEALTH_VERSIONS:
            pb2, pb2_grpc = _pb2("drahealth", version)
            pb2_grpc.add_DRAResourceHealthServicer_to_server(self._health_servicer(version, pb2), self.server)
        self.server.add_insecure_port(f"unix://{socket}")

    def __enter__(self) -> PythonDRAServer:
        self.server.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stopping.set()
        self.server.stop(None)

    def _record(self, name: str, request: Any) -> None:
        claims = [{"namespace": c.namespace, "uid": c.uid, "name": c.name}
                  for c in getattr(request, "claims", [])]
        with self._lock:
            self.calls.append((name, {"claims": claims} if hasattr(request, "claims") else {}))

    def _dra_servicer(self, version: str, pb2: Any) -> Any:
        server = self

        class Servicer:
            def NodePrepareResources(self, request, context):  # noqa: N802 (gRPC method name)
                server._record(f"{version}.DRAPlugin/NodePrepareResources", request)
                claims = {}
                for c in request.claims:
                    device = pb2.Device(request_names=["req-0", "req-1"], pool_name=f"pool-{version}",
                                        device_name=f"dev-{c.uid}",
                                        cdi_device_ids=[f"example.com/dra={c.uid}", "example.com/dra=common"])
                    if version == "v1":
                        device.share_id = SHARE_ID
                    claims[c.uid] = pb2.NodePrepareResourceResponse(devices=[device, pb2.Device()])
                claims["extra-uid"] = pb2.NodePrepareResourceResponse(error="not asked for ✗")
                return pb2.NodePrepareResourcesResponse(claims=claims)

            def NodeUnprepareResources(self, request, context):  # noqa: N802 (gRPC method name)
                server._record(f"{version}.DRAPlugin/NodeUnprepareResources", request)
                return pb2.NodeUnprepareResourcesResponse(claims={
                    c.uid: pb2.NodeUnprepareResourceResponse(error=f"busy: {c.name}") for c in request.claims})

        return Servicer()

    def _health_servicer(self, version: str, pb2: Any) -> Any:
        server = self

        class Servicer:
            def NodeWatchResources(self, request, context):  # noqa: N802 (gRPC method name)
                server._record(f"{version}.DRAResourceHealth/NodeWatchResources", request)
                for message in PY_HEALTH:
                    yield pb2.NodeWatchResourcesResponse(devices=[
                        pb2.DeviceHealth(device=pb2.DeviceIdentifier(pool_name=pool, device_name=dev),
                                         health=pb2.HealthStatus.Value(health), last_updated_time=updated,
                                         health_check_timeout_seconds=timeout, message=msg)
                        for pool, dev, health, updated, timeout, msg in message])
                if server.end_health_stream:
                    return
                done = threading.Event()
                context.add_callback(done.set)
                while not done.wait(0.05) and not server._stopping.is_set():
                    pass

        return Servicer()


def _protojson_health(message: list[tuple[str, str, str, int, int, str]]) -> dict[str, Any]:
    """PY_HEALTH entries as upstream's protojson writes them (int64 as strings, zero values included)."""
    return {"devices": [{"device": {"pool_name": pool, "device_name": dev}, "health": health,
                         "last_updated_time": str(updated), "health_check_timeout_seconds": str(timeout),
                         "message": msg} for pool, dev, health, updated, timeout, msg in message]}


@pytest.fixture
def py_server(tmp):
    with PythonDRAServer(tmp / "py.sock") as server:
        yield server


@pytest.mark.parametrize("version", DRA_VERSIONS)
def test_upstream_dracall_against_our_server(wirecompat_bin, py_server, version):
    report = _run(wirecompat_bin, "dracall", "--socket", str(py_server.socket), "--version", version)
    claim = {"namespace": "wc-ns", "uid": "wc-uid-1", "name": "wc-claim"}  # what dracall sends
    assert py_server.calls == [(f"{version}.DRAPlugin/NodePrepareResources", {"claims": [claim]}),
                               (f"{version}.DRAPlugin/NodeUnprepareResources", {"claims": [claim]})]
    device = {"request_names": ["req-0", "req-1"], "pool_name": f"pool-{version}", "device_name": "dev-wc-uid-1",
              "cdi_device_ids": ["example.com/dra=wc-uid-1", "example.com/dra=common"]}
    empty = {"request_names": [], "pool_name": "", "device_name": "", "cdi_device_ids": []}
    if version == "v1":
        device["share_id"] = SHARE_ID  # set: present; unset optional: absent even with EmitUnpopulated
    assert report == {
        "version": version,
        "prepare": {"claims": {"wc-uid-1": {"devices": [device, empty], "error": ""},
                               "extra-uid": {"devices": [], "error": "not asked for ✗"}}},
        "unprepare": {"claims": {"wc-uid-1": {"error": "busy: wc-claim"}}},
    }


@pytest.mark.parametrize("version", HEALTH_VERSIONS)
def test_upstream_healthwatch_against_our_server(wirecompat_bin, py_server, version):
    report = _run(wirecompat_bin, "healthwatch", "--socket", str(py_server.socket), "--version", version,
                  "--count", str(len(PY_HEALTH)))
    assert py_server.calls == [(f"{version}.DRAResourceHealth/NodeWatchResources", {})]
    assert report == {"version": version, "messages": [_protojson_health(m) for m in PY_HEALTH],
                      "stopped": "count"}


def test_upstream_healthwatch_sees_stream_end(wirecompat_bin, tmp):
    sock = tmp / "py.sock"
    with PythonDRAServer(sock, end_health_stream=True):
        report = _run(wirecompat_bin, "healthwatch", "--socket", str(sock), "--version", "v1",
                      "--count", str(len(PY_HEALTH) + 1), expect=3)
    assert report == {"version": "v1", "messages": [_protojson_health(m) for m in PY_HEALTH], "stopped": "eof"}


# ---------------------------------------------------------------------------
# (c) fakelet's own DRA pieces


def _missing(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is None
    except ModuleNotFoundError:
        return True


def _fake_node_dra_ready() -> str | None:
    """None when FakeNode has the DRA side of harness/DRA-CONTRACTS.md, else a one-line skip reason."""
    if _missing("harness.kubelet.dramanager"):
        return "harness/kubelet/dramanager.py (the fake kubelet's DRA manager) does not exist yet"
    from harness.node.fake import FakeNode

    if "registry_dir" not in inspect.signature(FakeNode).parameters:
        return "FakeNode takes no registry_dir yet (harness/DRA-CONTRACTS.md)"
    return None


@pytest.mark.parametrize(("advertised", "service_version", "health_version"), [
    (ALL_SERVICES, "v1", "v1"),
    (["v1beta1.DRAPlugin", "v1alpha1.DRAResourceHealth"], "v1beta1", "v1alpha1"),
])
def test_fake_kubelet_registers_upstream_draplugin(wirecompat_bin, tmp, advertised, service_version,
                                                   health_version):
    reason = _fake_node_dra_ready()
    if reason:
        pytest.skip(reason)
    from harness.kubelet.versions import get as kubelet_version
    from harness.node.fake import FakeNode
    from harness.spec.profiles import FAST

    registry, plugin_dir, state = tmp / "registry", tmp / "plugins", tmp / "state"
    for d in (registry, plugin_dir / DRIVER, state, tmp / "dp"):
        d.mkdir(parents=True)
    extra = ["--versions", ",".join(advertised), "--health", "HEALTHY,UNHEALTHY"]
    with DraPlugin(wirecompat_bin, tmp, *extra, registry_dir=registry,
                   socket=plugin_dir / DRIVER / "dra.sock") as plugin:
        node = FakeNode(tmp / "dp", state, plugin.timeline, FAST, registry_dir=registry,
                        kubelet_version=kubelet_version("1.37"))
        try:
            node.start_kubelet()
            registered = plugin.timeline.wait_for(
                lambda e: e.kind == "dra.registered" and e.get("driver") == DRIVER, WAIT_S,
                f"the fake kubelet to register {DRIVER}",
                abort=lambda e: e.kind in (EXIT, "dra.rejected"))
            assert registered.get("endpoint") == str(plugin.socket)
            assert registered.get("versions") == advertised
            assert registered.get("service_version") == service_version
            assert registered.get("health_version") == health_version
            status = plugin.wait_call("pluginregistration.Registration", "NotifyRegistrationStatus")
            assert status["request"] == {"plugin_registered": True, "error": ""}

            conn = node.dra.plugin(DRIVER)
            assert conn is not None and conn.service_version == service_version
            claims = [("wc-ns", "wc-uid-1", "wc-claim")]
            result = conn.node_prepare(claims)
            share_id = "wc-share-wc-uid-1" if service_version == "v1" else None
            assert result == {"wc-uid-1": {"devices": [{"pool": "wc-pool", "device": "wc-dev-wc-uid-1",
                                                        "requests": ["wc-req"],
                                                        "cdi_ids": ["wirecompat.example.com/dev=wc-uid-1"],
                                                        "share_id": share_id}],
                                           "error": ""}}
            assert conn.node_unprepare(claims) == {"wc-uid-1": {"error": ""}}
            assert [c["request"] for c in plugin.wait_calls(2, f"{service_version}.DRAPlugin")] == [
                _claims_json(claims), _claims_json(claims)]

            health = plugin.timeline.wait_for(
                lambda e: e.kind == "dra.health" and e.get("driver") == DRIVER, WAIT_S, "a dra.health event")
            assert [(d["pool"], d["device"], d["health"]) for d in health.get("devices")] == [
                ("wc-pool", "wc-dev-0", "Healthy"), ("wc-pool", "wc-dev-1", "Unhealthy")]
            assert plugin.wait_calls(1, f"{health_version}.DRAResourceHealth", "NodeWatchResources")
        finally:
            node.close()


def test_fake_kubelet_rejection_reaches_upstream_draplugin(wirecompat_bin, tmp):
    """A registration the kubelet refuses: upstream decodes plugin_registered=false and the error."""
    reason = _fake_node_dra_ready()
    if reason:
        pytest.skip(reason)
    from harness.kubelet.versions import get as kubelet_version
    from harness.node.fake import FakeNode
    from harness.spec.profiles import FAST

    registry, state = tmp / "registry", tmp / "state"
    for d in (registry, state, tmp / "dp"):
        d.mkdir(parents=True)
    with DraPlugin(wirecompat_bin, tmp, "--versions", "v1alpha3.NodeService", registry_dir=registry) as plugin:
        node = FakeNode(tmp / "dp", state, plugin.timeline, FAST, registry_dir=registry,
                        kubelet_version=kubelet_version("1.37"))
        try:
            node.start_kubelet()
            # Validation fails (upstream ValidatePluginFunc): the watcher notifies the plugin.
            rejected = plugin.timeline.wait_for(
                lambda e: e.kind == "pluginwatcher.rejected" and e.get("socket") == str(plugin.reg_socket),
                WAIT_S, f"the fake kubelet to reject {DRIVER}", abort=lambda e: e.kind in (EXIT, "dra.registered"))
            status = plugin.wait_call("pluginregistration.Registration", "NotifyRegistrationStatus")
            assert status["request"] == {"plugin_registered": False, "error": rejected.get("notified")}
            assert '["v1alpha3.NodeService"]' in status["request"]["error"]
            assert node.dra is not None and node.dra.plugin(DRIVER) is None
        finally:
            node.close()


REF_DRIVER = "gpu.fakelet.example.com"
REF_NODE = "wc-node"  # also the reference driver's pool name
REF_DEVICES = {"gpu-0": "Healthy", "gpu-1": "Unhealthy"}  # the fake sysfs tree written below


def test_upstream_clients_against_reference_dra_driver(wirecompat_bin, tmp):
    if _missing("harness.reference.dra_driver"):
        pytest.skip("harness/reference/dra_driver.py (the reference DRA driver) does not exist yet")
    dirs = {name: tmp / name for name in ("registry", "plugins", "cdi", "sysfs", "state")}
    for d in dirs.values():
        d.mkdir()
    for dev, health in REF_DEVICES.items():  # the vendor-neutral layout of fake_devices
        (dirs["sysfs"] / "sys" / "class" / "gpu" / dev).mkdir(parents=True)
        (dirs["sysfs"] / "sys" / "class" / "gpu" / dev / "health").write_text(health + "\n")
    argv = [sys.executable, "-m", "harness.reference.dra_driver", "--driver-name", REF_DRIVER,
            "--node-name", REF_NODE, "--kubeconfig", "", "--registry-dir", str(dirs["registry"]),
            "--plugin-dir", str(dirs["plugins"]), "--cdi-dir", str(dirs["cdi"]),
            "--sysfs-root", str(dirs["sysfs"]), "--state-dir", str(dirs["state"])]
    sock = dirs["plugins"] / "dra.sock"
    log_path = tmp / "dra-driver.log"
    with log_path.open("wb") as log:
        driver = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                  env=dict(os.environ, GRPC_VERBOSITY="ERROR"), start_new_session=True)
        try:
            # dracall and healthwatch wait for the socket themselves (WaitForReady within --timeout).
            reports = {v: _run(wirecompat_bin, "dracall", "--socket", str(sock), "--version", v,
                               "--timeout", "20s") for v in DRA_VERSIONS}
            health = {v: _run(wirecompat_bin, "healthwatch", "--socket", str(sock), "--version", v,
                              "--timeout", "20s") for v in HEALTH_VERSIONS}
        except AssertionError:
            print(log_path.read_text(errors="replace")[-4000:])
            raise
        finally:
            driver.terminate()
            try:
                returncode = driver.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(driver.pid, 9)
                returncode = driver.wait()
    assert returncode == 0, log_path.read_text(errors="replace")[-4000:]
    assert not sock.exists(), "the reference driver left dra.sock behind"

    # Without an API server the driver refuses every claim with a reason naming the
    # claim it decoded from upstream's request; the refusal crosses the wire in both
    # DRA versions alike, and unpreparing a claim never prepared succeeds.
    for report in reports.values():
        prepared = report["prepare"]["claims"]
        assert list(prepared) == ["wc-uid-1"], report
        assert prepared["wc-uid-1"]["devices"] == [], report
        assert "wc-ns/wc-claim" in prepared["wc-uid-1"]["error"], report
        assert report["unprepare"] == {"claims": {"wc-uid-1": {"error": ""}}}, report
    assert reports["v1"]["prepare"] == reports["v1beta1"]["prepare"]

    # Both health versions carry the same complete device list.
    seen = {}
    for version, report in health.items():
        assert report["stopped"] == "count", report
        (message,) = report["messages"]
        devices = {}
        for d in message["devices"]:
            assert d["device"]["pool_name"] == REF_NODE, report
            assert int(d["last_updated_time"]) > 0 and int(d["health_check_timeout_seconds"]) >= 0, report
            devices[d["device"]["device_name"]] = (d["health"], d["message"])
        seen[version] = devices
    assert {dev: h for dev, (h, _) in seen["v1"].items()} == {"gpu-0": "HEALTHY", "gpu-1": "UNHEALTHY"}
    assert seen["v1"] == seen["v1alpha1"]
