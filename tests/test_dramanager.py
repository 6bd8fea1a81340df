"""The fake kubelet's DRA manager against upstream semantics (v1.36 unless a test names another release).

Small in-test DRA plugins serve pluginregistration.Registration on a socket in
plugins_registry and DRAPlugin (v1, v1beta1, or the 1.32-era v1alpha3.Node)
plus DRAResourceHealth (v1alpha1, v1) on their service socket. Every wait is
on the timeline, under a deadline.
"""

from __future__ import annotations

import dataclasses
import json
import os
import queue
import select
import socket
import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest

from harness.instruments.grpcutil import unix_target
from harness.instruments.timeline import Event, Timeline
from harness.kubelet import dracheckpoint, versions
from harness.kubelet.dramanager import DRAManager, KubeletWouldNotStart, PrepareError
from harness.kubelet.pluginwatcher import DRA_PLUGIN, PluginWatcher
from harness.node.fake import FakeNode
from harness.spec.profiles import FAST
from harness.wire import (
    dra_v1,
    dra_v1_grpc,
    dra_v1beta1,
    dra_v1beta1_grpc,
    drahealth_v1,
    drahealth_v1_grpc,
    drahealth_v1alpha1,
    drahealth_v1alpha1_grpc,
    reg,
    reg_grpc,
)

WAIT_S = 5.0  # bound for every single wait; the watcher reconciles every second
PROFILE = dataclasses.replace(FAST, name="unit", dra_call_timeout_s=0.5, dra_health_timeout_s=0.6,
                              dra_health_retry_s=0.3, dra_wipe_delay_s=0.3, pod_sync_backoff_s=0.2)
DRIVER = "gpu.example.com"
OTHER = "nic.example.com"
ALL_SERVICES = (versions.DRA_V1, versions.DRA_V1BETA1)
HEALTHY, UNHEALTHY = 1, 2
END = object()  # ends a health stream


class DRAPlugin(reg_grpc.RegistrationServicer):
    """A driver's kubelet plugin: registration socket + one service socket with every service."""

    def __init__(self, timeline: Timeline, registry: Path, plugins: Path, driver: str = DRIVER,
                 advertised: tuple[str, ...] = ALL_SERVICES, health: tuple[str, ...] = ("v1alpha1", "v1"),
                 reg_name: str | None = None, endpoint: Path | None = None) -> None:
        self.timeline, self.driver, self.advertised, self.health = timeline, driver, advertised, health
        self.reg_path = registry / (reg_name or f"{driver}-reg.sock")
        self.endpoint = endpoint or plugins / driver / "dra.sock"
        self.fail_claims: dict[str, str] = {}  # claim name -> per-claim error
        self.prepare_hold_s = 0.0
        self.health_unimplemented = False
        self._release = threading.Event()
        self._streams: list[queue.Queue] = []
        self._lock = threading.Lock()
        self._servers: list[grpc.Server] = []

    # -- lifecycle ---------------------------------------------------------

    def serve(self, registration: bool = True) -> DRAPlugin:
        self.endpoint.parent.mkdir(parents=True, exist_ok=True)
        if not self._servers:
            svc = grpc.server(futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="test-dra"))
            dra_v1_grpc.add_DRAPluginServicer_to_server(_Service(self, dra_v1, "v1"), svc)
            dra_v1beta1_grpc.add_DRAPluginServicer_to_server(_Service(self, dra_v1beta1, "v1beta1"), svc)
            svc.add_generic_rpc_handlers([_alpha_handler(self)])
            if "v1alpha1" in self.health:
                drahealth_v1alpha1_grpc.add_DRAResourceHealthServicer_to_server(
                    _Health(self, drahealth_v1alpha1, "v1alpha1"), svc)
            if "v1" in self.health:
                drahealth_v1_grpc.add_DRAResourceHealthServicer_to_server(_Health(self, drahealth_v1, "v1"), svc)
            svc.add_insecure_port(unix_target(str(self.endpoint)))
            svc.start()
            self._servers.append(svc)
        if registration:
            self.register_socket()
        return self

    def register_socket(self) -> None:
        self.reg_path.parent.mkdir(parents=True, exist_ok=True)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="test-reg"))
        reg_grpc.add_RegistrationServicer_to_server(self, server)
        server.add_insecure_port(unix_target(str(self.reg_path)))
        server.start()
        self._servers.append(server)

    def close(self) -> None:
        self._release.set()
        self.end_health()
        for server in self._servers:
            server.stop(grace=0).wait(2)

    # -- registration ------------------------------------------------------

    def GetInfo(self, request: reg.InfoRequest, context: grpc.ServicerContext) -> reg.PluginInfo:  # noqa: N802
        return reg.PluginInfo(type=DRA_PLUGIN, name=self.driver, endpoint=str(self.endpoint),
                              supported_versions=list(self.advertised))

    def NotifyRegistrationStatus(self, request: reg.RegistrationStatus,  # noqa: N802
                                 context: grpc.ServicerContext) -> reg.RegistrationStatusResponse:
        self.timeline.record("plugin.notified", "plugin", driver=self.driver, socket=str(self.reg_path),
                             registered=request.plugin_registered, error=request.error)
        return reg.RegistrationStatusResponse()

    # -- DRA ----------------------------------------------------------------

    def prepare(self, mod: Any, version: str, request: Any) -> Any:
        self.timeline.record("plugin.prepare", "plugin", driver=self.driver, version=version,
                             claims=sorted(c.name for c in request.claims))
        if self.prepare_hold_s:
            self._release.wait(self.prepare_hold_s)  # a slow plugin: answers after the kubelet's deadline
        response = mod.NodePrepareResourcesResponse()
        for c in request.claims:
            result = response.claims[c.uid]
            if c.name in self.fail_claims:
                result.error = self.fail_claims[c.name]
                continue
            result.devices.append(mod.Device(request_names=["req-0"], pool_name="pool", device_name=f"dev-{c.name}",
                                             cdi_device_ids=[f"example.com/gpu={c.name}", "example.com/gpu=all"]))
        return response

    def unprepare(self, mod: Any, version: str, request: Any) -> Any:
        self.timeline.record("plugin.unprepare", "plugin", driver=self.driver, version=version,
                             claims=sorted(c.name for c in request.claims))
        response = mod.NodeUnprepareResourcesResponse()
        for c in request.claims:
            response.claims[c.uid].error = ""
        return response

    # -- health -------------------------------------------------------------

    def watch(self, mod: Any, version: str, context: grpc.ServicerContext) -> Iterator[Any]:
        if self.health_unimplemented:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "no health here")
        q: queue.Queue = queue.Queue()
        context.add_callback(lambda: q.put(END))  # the kubelet canceled: end the generator
        with self._lock:
            self._streams.append(q)
        self.timeline.record("plugin.health_open", "plugin", driver=self.driver, version=version,
                             endpoint=str(self.endpoint))
        try:
            while True:
                item = q.get()
                if item is END:
                    return
                yield mod.NodeWatchResourcesResponse(devices=[
                    mod.DeviceHealth(device=mod.DeviceIdentifier(pool_name=pool, device_name=dev), health=h,
                                     message=msg) for pool, dev, h, msg in item])
        finally:
            with self._lock:
                self._streams.remove(q)

    def send_health(self, *devices: tuple[str, str, int, str]) -> None:
        with self._lock:
            for q in self._streams:
                q.put(list(devices))

    def end_health(self) -> None:
        with self._lock:
            for q in self._streams:
                q.put(END)


class _Service(dra_v1_grpc.DRAPluginServicer):
    def __init__(self, plugin: DRAPlugin, mod: Any, version: str) -> None:
        self.plugin, self.mod, self.version = plugin, mod, version

    def NodePrepareResources(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        return self.plugin.prepare(self.mod, self.version, request)

    def NodeUnprepareResources(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        return self.plugin.unprepare(self.mod, self.version, request)


def _alpha_handler(plugin: DRAPlugin) -> grpc.GenericRpcHandler:
    """The v1alpha4 API (proto package v1alpha3, service Node): v1beta1's messages."""
    m = dra_v1beta1
    return grpc.method_handlers_generic_handler("v1alpha3.Node", {
        "NodePrepareResources": grpc.unary_unary_rpc_method_handler(
            lambda r, c: plugin.prepare(m, "v1alpha3", r), m.NodePrepareResourcesRequest.FromString,
            m.NodePrepareResourcesResponse.SerializeToString),
        "NodeUnprepareResources": grpc.unary_unary_rpc_method_handler(
            lambda r, c: plugin.unprepare(m, "v1alpha3", r), m.NodeUnprepareResourcesRequest.FromString,
            m.NodeUnprepareResourcesResponse.SerializeToString),
    })


class _Health:
    def __init__(self, plugin: DRAPlugin, mod: Any, version: str) -> None:
        self.plugin, self.mod, self.version = plugin, mod, version

    def NodeWatchResources(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:  # noqa: N802
        return self.plugin.watch(self.mod, self.version, context)


# -- fixtures and helpers -------------------------------------------------------


@pytest.fixture
def timeline() -> Timeline:
    return Timeline()


@pytest.fixture
def dirs(tmp: Path) -> dict[str, Path]:
    d = {"registry": tmp / "plugins_registry", "plugins": tmp / "plugins", "state": tmp / "state",
         "dp": tmp / "device-plugins"}
    for p in d.values():
        p.mkdir(parents=True, exist_ok=True)
    return d


@pytest.fixture
def make_plugin(timeline: Timeline, dirs: dict[str, Path]) -> Iterator[Callable[..., DRAPlugin]]:
    plugins: list[DRAPlugin] = []

    def make(serve: bool = True, **kwargs: Any) -> DRAPlugin:
        plugin = DRAPlugin(timeline, dirs["registry"], dirs["plugins"], **kwargs)
        plugins.append(plugin)
        return plugin.serve() if serve else plugin

    try:
        yield make
    finally:
        for p in plugins:
            p.close()


@pytest.fixture
def make_node(timeline: Timeline, dirs: dict[str, Path]) -> Iterator[Callable[..., FakeNode]]:
    nodes: list[FakeNode] = []

    def make(version: str = "1.36", profile: Any = PROFILE, **kwargs: Any) -> FakeNode:
        node = FakeNode(dirs["dp"], dirs["state"], timeline, profile, registry_dir=dirs["registry"],
                        kubelet_version=versions.get(version), **kwargs)
        nodes.append(node)
        node.start_kubelet()
        return node

    try:
        yield make
    finally:
        for n in nodes:
            n.close()


def of(kind: str, **data: object) -> Callable[[Event], bool]:
    return lambda e: e.kind == kind and all(e.get(k) == v for k, v in data.items())


def registered(timeline: Timeline, driver: str = DRIVER, since_ns: int = 0) -> Event:
    return timeline.wait_for(of("dra.registered", driver=driver), WAIT_S, f"{driver} registered", since_ns,
                             relevant=("dra.registered", "dra.rejected", "pluginwatcher.rejected"))


def pod(name: str = "p1") -> dict[str, str]:
    return {"name": name, "namespace": "ns", "uid": f"uid-{name}"}


def claim(name: str, *pods: dict[str, str], drivers: tuple[str, ...] = (DRIVER,), allocated: bool = True) -> dict:
    status: dict[str, Any] = {"reservedFor": [{"resource": "pods", "name": p["name"], "uid": p["uid"]} for p in pods]}
    if allocated:
        status["allocation"] = {"devices": {"results": [
            {"request": "req-0", "driver": d, "pool": "pool", "device": f"dev-{name}"} for d in drivers]}}
    return {"metadata": {"name": name, "namespace": "ns", "uid": f"cuid-{name}"}, "status": status}


class CountingProxy:
    """Listens on `front`, forwards each connection to `back`, and counts the connections accepted."""

    def __init__(self, front: Path, back: Path) -> None:
        self.front, self.back = front, back
        self.accepted = 0
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(str(front))
        self._listener.listen(8)
        self._wake_r, self._wake_w = os.pipe()
        threading.Thread(target=self._accept, daemon=True, name="test-proxy").start()

    def _accept(self) -> None:
        while True:
            ready, _, _ = select.select([self._listener, self._wake_r], [], [])
            if self._wake_r in ready:
                return
            conn, _ = self._listener.accept()
            self.accepted += 1
            upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            upstream.connect(str(self.back))
            threading.Thread(target=self._pump, args=(conn, upstream), daemon=True).start()

    def _pump(self, a: socket.socket, b: socket.socket) -> None:
        peers = {a: b, b: a}
        try:
            while True:
                ready, _, _ = select.select([a, b, self._wake_r], [], [])
                if self._wake_r in ready:
                    return
                for s in ready:
                    data = s.recv(65536)
                    if not data:
                        return
                    peers[s].sendall(data)
        except OSError:
            return
        finally:
            a.close()
            b.close()

    def close(self) -> None:
        os.write(self._wake_w, b"x")
        self._listener.close()


# -- versions ------------------------------------------------------------------


def test_version_table() -> None:
    assert versions.get("newest").name == versions.NEWEST == "1.37"
    assert versions.default().name == versions.DEFAULT_KUBELET_VERSION == "1.36"
    assert versions.get("v1.32").dra_services == (versions.DRA_V1BETA1, versions.DRA_V1ALPHA4)
    assert versions.get("1.36").health_versions == (versions.HEALTH_V1ALPHA1,)
    assert versions.get("1.35").health_versions == ()
    with pytest.raises(ValueError, match=r"1\.32, 1\.33"):
        versions.get("1.99")


@pytest.mark.parametrize(("version", "advertised", "service", "health"), [
    ("1.32", (versions.DRA_V1, versions.DRA_V1BETA1), "v1beta1", None),
    ("1.32", ("v9.Nothing",), "v1alpha3", None),  # 1.32 assumes the alpha service
    ("1.35", (versions.DRA_V1BETA1, versions.DRA_V1), "v1beta1", None),  # the plugin's order decides
    ("1.36", (versions.DRA_V1, versions.DRA_V1BETA1), "v1", "v1alpha1"),  # health tried unadvertised
    ("newest", (versions.DRA_V1, versions.DRA_V1BETA1, versions.HEALTH_V1ALPHA1, versions.HEALTH_V1), "v1", "v1"),
    ("newest", (versions.DRA_V1, versions.HEALTH_V1ALPHA1), "v1", "v1alpha1"),
    ("newest", (versions.DRA_V1,), "v1", None),  # 1.37 opens no stream the plugin did not advertise
], ids=["1.32-v1beta1", "1.32-fallback", "1.35-plugin-order", "1.36", "1.37-v1", "1.37-v1alpha1", "1.37-none"])
def test_version_negotiation(make_node: Callable[..., FakeNode], make_plugin: Callable[..., DRAPlugin],
                             timeline: Timeline, version: str, advertised: tuple[str, ...], service: str,
                             health: str | None) -> None:
    node = make_node(version)
    make_plugin(advertised=advertised)
    event = registered(timeline)
    assert event.get("service_version") == service and event.get("health_version") == health
    assert event.get("versions") == list(advertised)
    assert node.dra is not None
    conn = node.dra.plugin(DRIVER)
    assert conn is not None and conn.service_version == service and conn.health_version == health
    p = pod()
    node.prepare_pod(p, [claim("c1", p)])
    served = timeline.wait_for(of("plugin.prepare", driver=DRIVER), WAIT_S, "NodePrepareResources at the plugin")
    assert served.get("version") == service
    if health is not None:
        opened = timeline.wait_for(of("plugin.health_open", driver=DRIVER), WAIT_S, "a health stream")
        assert opened.get("version") == health
    else:
        assert timeline.wait_quiet(of("dra.health_stream", driver=DRIVER), PROFILE.quiet_window_s) is None


@pytest.mark.parametrize(("version", "error"), [
    ("1.36", "invalid supported gRPC versions of DRA driver plugin gpu.example.com at endpoint {endpoint}: "
             'none of services supported by the plugin (["v9.Nothing"]) are supported by the kubelet '
             '(["v1.DRAPlugin" "v1beta1.DRAPlugin"])'),
    ("1.33", None),
], ids=["1.36-refused", "1.33-falls-back"])
def test_validation_message(make_node: Callable[..., FakeNode], make_plugin: Callable[..., DRAPlugin],
                            timeline: Timeline, version: str, error: str | None) -> None:
    make_node(version)
    plugin = make_plugin(advertised=("v9.Nothing",))
    status = timeline.wait_for(of("plugin.notified", driver=DRIVER), WAIT_S, "NotifyRegistrationStatus")
    if error is None:
        assert status.get("registered") is True
        return
    assert status.get("registered") is False
    assert status.get("error") == ("RegisterPlugin error -- plugin validation failed with err: "
                                   + error.format(endpoint=plugin.endpoint))


def test_empty_service_list_is_refused(make_node: Callable[..., FakeNode], make_plugin: Callable[..., DRAPlugin],
                                       timeline: Timeline) -> None:
    make_node("1.32")
    make_plugin(advertised=())
    status = timeline.wait_for(of("plugin.notified", driver=DRIVER), WAIT_S, "NotifyRegistrationStatus")
    assert status.get("error") == ("RegisterPlugin error -- plugin validation failed with err: invalid versions of "
                                   "plugin gpu.example.com: empty list of supported gRPC services (aka supported "
                                   "versions)")


# -- registration --------------------------------------------------------------


def test_one_connection_for_all_services(make_node: Callable[..., FakeNode], make_plugin: Callable[..., DRAPlugin],
                                         timeline: Timeline) -> None:
    node = make_node("1.36")
    plugin = make_plugin(serve=False)
    front = plugin.endpoint
    plugin.endpoint = front.with_name("real.sock")  # the plugin serves behind a counting proxy
    plugin.serve(registration=False)
    proxy = CountingProxy(front, plugin.endpoint)
    plugin.endpoint = front  # and advertises the proxy
    plugin.register_socket()
    registered(timeline)
    timeline.wait_for(of("plugin.health_open", driver=DRIVER), WAIT_S, "a health stream")
    p = pod()
    node.prepare_pod(p, [claim("c1", p)])
    assert node.dra is not None
    conn = node.dra.plugin(DRIVER)
    assert conn is not None
    conn.node_unprepare([("ns", "cuid-x", "x")])
    # The stream and both calls share the kubelet's one connection to the service socket.
    assert proxy.accepted == 1
    plugin.close()
    proxy.close()


def test_rejected_registration_is_notified_and_retried(make_node: Callable[..., FakeNode],
                                                       make_plugin: Callable[..., DRAPlugin],
                                                       timeline: Timeline) -> None:
    node = make_node()
    assert node.dra is not None
    node.dra.reject_next_registration(DRIVER)
    make_plugin()
    refused = timeline.wait_for(of("plugin.notified", driver=DRIVER), WAIT_S, "NotifyRegistrationStatus")
    assert refused.get("registered") is False
    assert refused.get("error").startswith("RegisterPlugin error -- plugin registration failed with err: ")
    rejected = timeline.wait_for(of("pluginwatcher.rejected"), WAIT_S, "the watcher's backoff")
    assert rejected.get("notified") == refused.get("error") and rejected.get("retry_after_s") > 0
    # Upstream drops the plugin from the actual state and retries after the backoff.
    accepted = timeline.wait_for(of("plugin.notified", driver=DRIVER, registered=True), WAIT_S, "a later success",
                                 refused.t_ns)
    assert accepted.get("error") == "" and node.dra.plugin(DRIVER) is not None


def test_deregistered_when_socket_deleted(make_node: Callable[..., FakeNode], make_plugin: Callable[..., DRAPlugin],
                                          timeline: Timeline) -> None:
    node = make_node()
    plugin = make_plugin()
    registered(timeline)
    since = timeline.now()
    os.unlink(plugin.reg_path)
    gone = timeline.wait_for(of("dra.deregistered", driver=DRIVER), WAIT_S, "deregistered", since)
    assert gone.get("endpoint") == str(plugin.endpoint) and gone.get("plugins") == 0
    assert node.dra is not None and node.dra.plugin(DRIVER) is None
    closed = timeline.wait_for(of("dra.health_stream", driver=DRIVER, state="ended"), WAIT_S, "stream canceled", since)
    assert closed.get("error") == "context canceled"
    with pytest.raises(PrepareError, match=f"prepare dynamic resources: DRA driver {DRIVER} is not registered"):
        node.prepare_pod(pod(), [claim("c1", pod())])


def test_two_instances_of_a_driver_as_v1_36(make_node: Callable[..., FakeNode], make_plugin: Callable[..., DRAPlugin],
                                           timeline: Timeline) -> None:
    """A rolling update's two instances: dra_plugin_manager.go get() calls the newest connected one; remove() drops
    only the one whose socket went, and its canceled health stream clears the driver's whole health cache, the
    new instance's report included (manager.go HandleWatchResourcesStream clearDriver; kubernetes#140818)."""
    node = make_node()
    old = make_plugin()
    registered(timeline)
    since = timeline.now()
    new = make_plugin(reg_name=f"{DRIVER}-next-reg.sock", endpoint=old.endpoint.with_name("dra-next.sock"))
    registered(timeline, since_ns=since)
    timeline.wait_for(of("dra.connection", endpoint=str(new.endpoint), connected=True), WAIT_S, "connected", since)
    timeline.wait_for(of("plugin.health_open", endpoint=str(new.endpoint)), WAIT_S, "the new instance's stream", since)
    assert node.dra is not None and node.dra.plugin(DRIVER).endpoint == str(new.endpoint)  # type: ignore[union-attr]
    new.send_health(("pool", "dev-c", HEALTHY, ""))
    timeline.wait_for(of("dra.health", driver=DRIVER), WAIT_S, "the new instance's health", since)
    t = timeline.now()
    os.unlink(old.reg_path)
    gone = timeline.wait_for(of("dra.deregistered", driver=DRIVER), WAIT_S, "the old one deregistered", t)
    assert gone.get("endpoint") == str(old.endpoint) and gone.get("plugins") == 1
    ended = timeline.wait_for(of("dra.health_stream", driver=DRIVER, state="ended"), WAIT_S, "its stream ends", t)
    assert ended.get("error") == "context canceled" and ended.get("cleared") == ["pool/dev-c"]
    assert node.dra.plugin(DRIVER).endpoint == str(new.endpoint)  # type: ignore[union-attr]
    assert node.dra.health_cache is not None and node.dra.health_cache.get(DRIVER, "pool", "dev-c").health == "Unknown"


def test_same_endpoint_cannot_register_twice(make_node: Callable[..., FakeNode],
                                             make_plugin: Callable[..., DRAPlugin], timeline: Timeline) -> None:
    make_node()
    first = make_plugin()
    registered(timeline)
    make_plugin(serve=False, reg_name="second-reg.sock", endpoint=first.endpoint).register_socket()
    refused = timeline.wait_for(of("plugin.notified", driver=DRIVER, registered=False), WAIT_S, "a refusal")
    assert refused.get("error") == ("RegisterPlugin error -- plugin registration failed with err: endpoint "
                                    f"{first.endpoint} already registered for DRA driver plugin {DRIVER}")


def test_wipe_after_the_last_plugin_goes(make_node: Callable[..., FakeNode], make_plugin: Callable[..., DRAPlugin],
                                         timeline: Timeline) -> None:
    wiped: list[str] = []
    make_node(wipe_slices=wiped.append)
    timeline.wait_for(of("dra.wipe", driver="", why="startup"), WAIT_S, "the startup wipe")
    plugin = make_plugin()
    registered(timeline)
    timeline.wait_for(of("dra.connection", driver=DRIVER, connected=True), WAIT_S, "connected")
    since = timeline.now()
    os.unlink(plugin.reg_path)
    timeline.wait_for(of("dra.wipe_pending", driver=DRIVER), WAIT_S, "a pending wipe", since)
    timeline.wait_for(of("dra.wipe", driver=DRIVER), WAIT_S, "the wipe", since)
    assert wiped == ["", DRIVER]


# -- prepare / unprepare -----------------------------------------------------------


def test_prepare_groups_claims_per_driver(make_node: Callable[..., FakeNode], make_plugin: Callable[..., DRAPlugin],
                                          timeline: Timeline) -> None:
    node = make_node()
    make_plugin()
    make_plugin(driver=OTHER)
    registered(timeline)
    registered(timeline, OTHER)
    p = pod()
    prepared = node.prepare_pod(p, [claim("a", p), claim("b", p), claim("c", p, drivers=(OTHER,))])
    calls = timeline.find(lambda e: e.kind == "plugin.prepare")
    assert sorted((e.get("driver"), tuple(e.get("claims"))) for e in calls) == [(DRIVER, ("a", "b")), (OTHER, ("c",))]
    assert sorted(prepared) == ["a", "b", "c"]
    assert prepared["a"].prepared and prepared["a"].pods == {p["uid"]}
    assert prepared["c"].cdi_ids == ["example.com/gpu=c", "example.com/gpu=all"]
    event = timeline.find(of("dra.prepare", driver=DRIVER, via="pod"))[-1]
    assert event.get("outcome") == "OK" and event.get("claims") == ["cuid-a", "cuid-b"]


def test_shared_claim_prepared_once_and_unprepared_by_its_last_pod(make_node: Callable[..., FakeNode],
                                                                   make_plugin: Callable[..., DRAPlugin],
                                                                   timeline: Timeline) -> None:
    node = make_node()
    make_plugin()
    registered(timeline)
    p1, p2 = pod("p1"), pod("p2")
    shared = claim("shared", p1, p2)
    node.prepare_pod(p1, [shared])
    node.prepare_pod(p2, [shared])
    assert len(timeline.find(of("plugin.prepare", driver=DRIVER))) == 1
    node.unprepare_pod(p1)
    assert not timeline.find(of("plugin.unprepare"))
    assert node.dra is not None and node.dra.claims()["ns/shared"].pods == {p2["uid"]}
    node.unprepare_pod(p2)
    assert [e.get("claims") for e in timeline.find(of("plugin.unprepare"))] == [["shared"]]
    assert node.dra.claims() == {}


def test_per_claim_error_names_claim_and_driver(make_node: Callable[..., FakeNode],
                                                make_plugin: Callable[..., DRAPlugin], timeline: Timeline) -> None:
    node = make_node()
    plugin = make_plugin()
    plugin.fail_claims["bad"] = "boom"
    registered(timeline)
    p = pod()
    with pytest.raises(PrepareError) as err:
        node.prepare_pod(p, [claim("good", p), claim("bad", p)])
    assert str(err.value) == "prepare dynamic resources: NodePrepareResources failed for ResourceClaim bad: boom"
    assert err.value.claim == "bad" and err.value.driver == DRIVER
    # The next pod sync prepares both again (neither is marked prepared), as upstream does.
    del plugin.fail_claims["bad"]
    node.prepare_pod(p, [claim("good", p), claim("bad", p)])
    assert [e.get("claims") for e in timeline.find(of("plugin.prepare"))] == [["bad", "good"], ["bad", "good"]]


def test_prepare_refuses_unreserved_and_unallocated(make_node: Callable[..., FakeNode],
                                                   make_plugin: Callable[..., DRAPlugin], timeline: Timeline) -> None:
    node = make_node()
    make_plugin()
    registered(timeline)
    p = pod()
    with pytest.raises(PrepareError, match=r"pod p1 \(uid-p1\) is not allowed to use ResourceClaim c \(cuid-c\)"):
        node.prepare_pod(p, [claim("c", pod("other"))])
    with pytest.raises(PrepareError, match="ResourceClaim c: not allocated"):
        node.prepare_pod(p, [claim("c", p, allocated=False)])
    assert not timeline.find(of("plugin.prepare"))


def test_prepare_deadline(make_node: Callable[..., FakeNode], make_plugin: Callable[..., DRAPlugin],
                          timeline: Timeline) -> None:
    node = make_node()
    plugin = make_plugin()
    plugin.prepare_hold_s = PROFILE.dra_call_timeout_s * 3
    registered(timeline)
    p = pod()
    with pytest.raises(PrepareError) as err:
        node.prepare_pod(p, [claim("c", p)])
    assert str(err.value) == ("prepare dynamic resources: NodePrepareResources: rpc error: code = DeadlineExceeded "
                              "desc = context deadline exceeded")
    event = timeline.find(of("dra.prepare", driver=DRIVER))[-1]
    assert PROFILE.dra_call_timeout_s <= event.get("duration_s") < PROFILE.dra_call_timeout_s * 2


def test_prepare_retrying_like_the_pod_worker(make_node: Callable[..., FakeNode],
                                              make_plugin: Callable[..., DRAPlugin], timeline: Timeline) -> None:
    node = make_node()
    plugin = make_plugin()
    plugin.fail_claims["c"] = "not yet"
    registered(timeline)
    p = pod()
    assert node.dra is not None
    fixer = threading.Thread(target=lambda: (
        timeline.wait_for(of("dra.prepare_retry"), WAIT_S, "a retry"), plugin.fail_claims.clear()))
    fixer.start()
    prepared = node.dra.prepare_pod_retrying(p, [claim("c", p)], timeout_s=WAIT_S)
    fixer.join()
    assert prepared["c"].prepared and len(timeline.find(of("plugin.prepare"))) >= 2


def test_checkpoint_survives_restart(make_node: Callable[..., FakeNode], make_plugin: Callable[..., DRAPlugin],
                                     timeline: Timeline, dirs: dict[str, Path]) -> None:
    node = make_node()
    make_plugin()
    registered(timeline)
    p = pod()
    node.prepare_pod(p, [claim("c", p)])
    path = dirs["state"] / "dra_manager_state"
    doc = json.loads(path.read_text())
    data = json.loads(doc["Data"])
    assert data["kind"] == "DRACheckpoint" and data["apiVersion"] == "checkpoint.dra.kubelet.k8s.io/v1"
    assert data["ClaimInfoStateList"][0]["PodUIDs"] == {"uid-p1": {}}
    since = timeline.now()
    node.restart_kubelet()
    start = timeline.wait_for(of("dra.start"), WAIT_S, "the new instance", since)
    assert start.get("claims") == ["cuid-c"]
    assert node.dra is not None
    restored = node.dra.claims()["ns/c"]
    assert restored.pods == {"uid-p1"} and not restored.prepared  # upstream: prepared is not checkpointed
    assert restored.cdi_ids == ["example.com/gpu=c", "example.com/gpu=all"]
    registered(timeline, since_ns=since)  # the new watcher re-scanned plugins_registry
    node.unprepare_pod(p)  # by UID: the checkpoint knows no pod names
    assert [e.get("claims") for e in timeline.find(of("plugin.unprepare"))] == [["c"]]
    assert dracheckpoint.read(path) == []


def test_checkpoint_checksum_is_verified(tmp: Path) -> None:
    path = tmp / "dra_manager_state"
    state = dracheckpoint.ClaimInfoState("u", "n", "ns", {"pod"}, {"d": [dracheckpoint.Device("p", "x", ["r"],
                                                                                                ["v.com/c=x"])]})
    dracheckpoint.write(path, [state])
    assert dracheckpoint.read(path) == [state]
    doc = json.loads(path.read_text())
    doc["Data"] = doc["Data"].replace('"n"', '"m"')
    path.write_text(json.dumps(doc))
    with pytest.raises(dracheckpoint.CorruptCheckpointError):
        dracheckpoint.read(path)


# -- health ------------------------------------------------------------------------


def test_health_stream_is_retried_after_the_plugin_ends_it(make_node: Callable[..., FakeNode],
                                                           make_plugin: Callable[..., DRAPlugin],
                                                           timeline: Timeline) -> None:
    make_node()
    plugin = make_plugin()
    registered(timeline)
    first = timeline.wait_for(of("plugin.health_open", driver=DRIVER), WAIT_S, "a health stream")
    plugin.send_health(("pool", "dev-c", HEALTHY, ""))
    timeline.wait_for(of("dra.health", driver=DRIVER), WAIT_S, "a health message")
    plugin.end_health()
    ended = timeline.wait_for(of("dra.health_stream", driver=DRIVER, state="ended"), WAIT_S, "the stream ends")
    assert ended.get("error") == "EOF" and ended.get("cleared") == ["pool/dev-c"]
    again = timeline.wait_for(of("plugin.health_open", driver=DRIVER), WAIT_S, "a new stream", first.t_ns + 1)
    gap = (again.t_ns - ended.t_ns) / 1e9
    assert PROFILE.dra_health_retry_s <= gap < PROFILE.dra_health_retry_s + 1.0


def test_health_stream_opens_after_the_registration_is_recorded(make_node: Callable[..., FakeNode],
                                                                make_plugin: Callable[..., DRAPlugin],
                                                                timeline: Timeline) -> None:
    # Checks look for the first health message from the registration on: a driver that sends
    # its list once, at once, must not have it land before the registration it follows.
    make_node()
    make_plugin()
    reg = registered(timeline)
    opened = timeline.wait_for(of("dra.health_stream", driver=DRIVER, state="open"), WAIT_S, "a health stream")
    assert opened.t_ns > reg.t_ns


def test_health_unimplemented(make_node: Callable[..., FakeNode], make_plugin: Callable[..., DRAPlugin],
                              timeline: Timeline) -> None:
    node = make_node("1.37")
    plugin = make_plugin(advertised=(versions.DRA_V1, versions.HEALTH_V1))
    plugin.health_unimplemented = True
    registered(timeline)
    stopped = timeline.wait_for(of("dra.health_stream", driver=DRIVER, state="stopped"), WAIT_S, "1.37 gives up")
    assert "Unimplemented" in stopped.get("error")
    assert node.dra is not None


def test_health_timeout_and_status(make_node: Callable[..., FakeNode], make_plugin: Callable[..., DRAPlugin],
                                   timeline: Timeline) -> None:
    node = make_node()
    plugin = make_plugin()
    registered(timeline)
    p = pod()
    node.prepare_pod(p, [claim("c", p)])
    timeline.wait_for(of("plugin.health_open", driver=DRIVER), WAIT_S, "a health stream")
    since = timeline.now()
    plugin.send_health(("pool", "dev-c", UNHEALTHY, "ECC errors"))
    msg = timeline.wait_for(of("dra.health", driver=DRIVER), WAIT_S, "a health message", since)
    assert msg.get("devices")[0] == {"pool": "pool", "device": "dev-c", "health": "Unhealthy",
                                     "reason": "ECC errors", "timeout_s": 0.0}
    assert node.claim_resources_status("p1") == {
        "claim:c/req-0": [{"resourceID": "example.com/gpu=c", "health": "Unhealthy", "message": "ECC errors"}]}
    unknown = timeline.wait_for(of("dra.health_unknown", driver=DRIVER), WAIT_S, "the health timeout", since)
    assert unknown.get("device") == "dev-c" and unknown.get("last_health") == "Unhealthy"
    waited = (unknown.t_ns - since) / 1e9  # the receive time lies between `since` and the event
    assert PROFILE.dra_health_timeout_s <= waited < PROFILE.dra_health_timeout_s + 1.0
    assert node.claim_resources_status(p["uid"]) == {
        "claim:c/req-0": [{"resourceID": "example.com/gpu=c", "health": "Unknown"}]}
    plugin.send_health(("pool", "dev-c", HEALTHY, ""))
    timeline.wait_for(of("dra.health", driver=DRIVER), WAIT_S, "a fresh message", unknown.t_ns)
    assert node.claim_resources_status("p1")["claim:c/req-0"][0]["health"] == "Healthy"


def test_status_is_empty_without_the_health_gate(make_node: Callable[..., FakeNode],
                                                 make_plugin: Callable[..., DRAPlugin], timeline: Timeline) -> None:
    node = make_node("1.35")
    make_plugin()
    registered(timeline)
    p = pod()
    node.prepare_pod(p, [claim("c", p)])
    assert node.claim_resources_status("p1") == {}


def test_manager_alone_as_a_watcher_handler(timeline: Timeline, dirs: dict[str, Path],
                                            make_plugin: Callable[..., DRAPlugin]) -> None:
    dra = DRAManager(dirs["state"], timeline, PROFILE, versions.get("1.34")).start()
    watcher = PluginWatcher(dirs["registry"], timeline, PROFILE, {DRA_PLUGIN: dra}).start()
    try:
        make_plugin()
        event = registered(timeline)
        assert event.get("service_version") == "v1" and event.get("health_version") is None
    finally:
        watcher.stop()
        dra.stop()


def test_a_corrupt_checkpoint_stops_the_kubelet_start_as_upstream(timeline: Timeline, dirs: dict[str, Path]) -> None:
    """cm/dra manager.go NewManager fails on a checkpoint it cannot read: the kubelet does not start.
    That is a failed check (someone else wrote the kubelet's file), never a harness error."""
    state = dirs["state"]
    state.mkdir(parents=True, exist_ok=True)
    (state / dracheckpoint.CHECKPOINT_NAME).write_bytes(b"\x9b not a checkpoint")
    with pytest.raises(KubeletWouldNotStart, match="fails to start") as caught:
        DRAManager(state, timeline, PROFILE, versions.get("1.36")).start()
    assert isinstance(caught.value, AssertionError)
    assert any(e.get("finding") for e in timeline.events(kind="kubelet.checkpoint_unreadable"))


def test_the_pods_a_changed_device_is_sent_for_are_its_claims_pods(tmp: Path, timeline: Timeline) -> None:
    """pods_using once read an attribute the claim snapshot does not have: the first health change that named a
    prepared device killed the thread that re-posts the pods' allocatedResourcesStatus."""
    manager = DRAManager(tmp / "state", timeline, FAST)
    state = dracheckpoint.ClaimInfoState("uid-1", "c1", "ns", {"pod-a", "pod-b"},
                                         {DRIVER: [dracheckpoint.Device("pool", "gpu-0")]})
    with manager._cache_lock:
        manager._claims["uid-1"] = _claim_info(state)
    assert manager.pods_using(DRIVER, {"pool/gpu-0"}) == {"pod-a", "pod-b"}
    assert manager.pods_using(DRIVER, {"pool/gpu-1"}) == set()
    assert manager.pods_using("other.example.com", {"pool/gpu-0"}) == set()


def _claim_info(state: dracheckpoint.ClaimInfoState) -> Any:
    from harness.kubelet.dramanager import _ClaimInfo
    return _ClaimInfo(state, prepared=True)
