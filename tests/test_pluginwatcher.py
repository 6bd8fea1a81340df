"""The fake kubelet's plugin watcher (plugins_registry) against upstream v1.36 semantics.

A tiny in-test plugin serves pluginregistration.Registration on a socket in
plugins_registry and v1beta1.DevicePlugin on the same socket or on a separate
endpoint. Every wait is on the timeline, under a deadline.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from harness.instruments.grpcutil import unix_target
from harness.instruments.timeline import Event, Timeline
from harness.kubelet.devicemanager import DeviceManager
from harness.kubelet.pluginwatcher import DEVICE_PLUGIN, DevicePluginHandler, PluginWatcher
from harness.spec.profiles import FAST
from harness.wire import dp, dp_grpc, reg, reg_grpc

RES = "example.com/foo"
WAIT_S = 5.0  # bound for every single wait; the reconciler runs every second
PROFILE = dataclasses.replace(FAST, name="unit", dial_timeout_s=2.0, endpoint_grace_s=30.0, quiet_window_s=0.3)
SLOW_GETINFO_S = 1.5  # longer than the kubelet's 1 s GetInfo timeout


class Plugin(reg_grpc.RegistrationServicer, dp_grpc.DevicePluginServicer):
    """Registration (and, unless `endpoint` is set, DevicePlugin) on `path`; DevicePlugin on `endpoint` if set."""

    def __init__(self, timeline: Timeline, path: Path, name: str = RES, type_: str = DEVICE_PLUGIN,
                 versions: tuple[str, ...] = ("v1beta1",), endpoint: Path | None = None,
                 devices: tuple[str, ...] = ("d1", "d2"), getinfo_delay_s: float = 0.0) -> None:
        self.timeline, self.path, self.endpoint = timeline, path, endpoint
        self.info = reg.PluginInfo(type=type_, name=name, endpoint=str(endpoint) if endpoint else "",
                                   supported_versions=list(versions))
        self.devices, self.getinfo_delay_s = devices, getinfo_delay_s
        self._release = threading.Event()  # ends ListAndWatch and a held GetInfo at cleanup
        self._servers: list[grpc.Server] = []

    def serve(self) -> Plugin:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for path, dp_too in ((self.path, self.endpoint is None), (self.endpoint, True)):
            if path is None:
                continue
            server = grpc.server(futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="test-plugin"))
            if path == self.path:
                reg_grpc.add_RegistrationServicer_to_server(self, server)
            if dp_too:
                dp_grpc.add_DevicePluginServicer_to_server(self, server)
            server.add_insecure_port(unix_target(str(path)))
            server.start()
            self._servers.append(server)
        return self

    def close(self) -> None:
        self._release.set()
        for server in self._servers:
            server.stop(grace=0).wait(2)

    # Registration

    def GetInfo(self, request: reg.InfoRequest, context: grpc.ServicerContext) -> reg.PluginInfo:  # noqa: N802
        self.timeline.record("plugin.getinfo", "plugin", socket=str(self.path))
        if self.getinfo_delay_s:
            self._release.wait(self.getinfo_delay_s)  # a slow plugin: answers after the kubelet gave up
        return self.info

    def NotifyRegistrationStatus(self, request: reg.RegistrationStatus,  # noqa: N802
                                 context: grpc.ServicerContext) -> reg.RegistrationStatusResponse:
        self.timeline.record("plugin.notified", "plugin", socket=str(self.path),
                             registered=request.plugin_registered, error=request.error)
        return reg.RegistrationStatusResponse()

    # DevicePlugin

    def GetDevicePluginOptions(self, request: dp.Empty, context: grpc.ServicerContext) -> dp.DevicePluginOptions:  # noqa: N802
        return dp.DevicePluginOptions()

    def ListAndWatch(self, request: dp.Empty, context: grpc.ServicerContext) -> Iterator[dp.ListAndWatchResponse]:  # noqa: N802
        yield dp.ListAndWatchResponse(devices=[dp.Device(ID=i, health="Healthy") for i in self.devices])
        while not self._release.is_set() and context.is_active():
            self._release.wait(0.1)  # poll for cancellation: grpc-python offers no blocking wait on it


# -- fixtures ------------------------------------------------------------------


@pytest.fixture
def timeline() -> Timeline:
    return Timeline()


@pytest.fixture
def manager(tmp: Path, timeline: Timeline) -> Iterator[DeviceManager]:
    m = DeviceManager(tmp / "device-plugins", tmp / "state", timeline, PROFILE).start()
    try:
        yield m
    finally:
        m.stop()


@pytest.fixture
def registry(tmp: Path) -> Path:
    return tmp / "plugins_registry"


@pytest.fixture
def watcher(registry: Path, timeline: Timeline, manager: DeviceManager) -> Iterator[PluginWatcher]:
    w = PluginWatcher(registry, timeline, PROFILE, {DEVICE_PLUGIN: DevicePluginHandler(manager)})
    w.start()
    try:
        yield w
    finally:
        w.stop()


@pytest.fixture
def make_plugin(timeline: Timeline) -> Iterator[Callable[..., Plugin]]:
    plugins: list[Plugin] = []

    def make(path: Path, **kwargs: object) -> Plugin:
        plugin = Plugin(timeline, path, **kwargs).serve()  # type: ignore[arg-type]
        plugins.append(plugin)
        return plugin

    try:
        yield make
    finally:
        for p in plugins:
            p.close()


def of(kind: str, **data: object) -> Callable[[Event], bool]:
    return lambda e: e.kind == kind and all(e.get(k) == v for k, v in data.items())


def notified(timeline: Timeline, path: Path, since_ns: int = 0) -> Event:
    return timeline.wait_for(of("plugin.notified", socket=str(path)), WAIT_S,
                             f"NotifyRegistrationStatus at {path}", since_ns)


# -- tests ---------------------------------------------------------------------


@pytest.mark.parametrize("separate_endpoint", [False, True], ids=["same-socket", "separate-endpoint"])
def test_device_plugin_registers_through_the_registry(watcher: PluginWatcher, registry: Path, tmp: Path,
                                                      timeline: Timeline, manager: DeviceManager,
                                                      make_plugin: Callable[..., Plugin],
                                                      separate_endpoint: bool) -> None:
    path = registry / "foo.sock"
    endpoint = tmp / "foo-dp.sock" if separate_endpoint else None
    make_plugin(path, endpoint=endpoint, devices=("a", "b", "c"))
    status = notified(timeline, path)
    assert status.get("registered") is True and status.get("error") == ""
    timeline.wait_for(of("kubelet.devices", resource=RES, why="list", capacity=3), WAIT_S, "capacity 3")
    assert manager.capacity(RES) == 3 and manager.allocatable(RES) == 3
    registered = timeline.wait_for(of("pluginwatcher.registered", socket=str(path)), WAIT_S, "registered")
    assert registered.get("endpoint") == str(endpoint or path)  # an empty endpoint means the registry socket
    assert watcher.registered() == {str(path): RES}


def test_dot_files_and_non_sockets_are_ignored_and_nested_dirs_found(watcher: PluginWatcher, registry: Path,
                                                                      timeline: Timeline, manager: DeviceManager,
                                                                      make_plugin: Callable[..., Plugin]) -> None:
    hidden = registry / ".hidden.sock"
    make_plugin(hidden, name="example.com/hidden")
    (registry / "plain.sock").write_text("not a socket")
    nested = registry / "sub" / "deeper" / "nested.sock"
    make_plugin(nested, name="example.com/nested")
    notified(timeline, nested)
    timeline.wait_for(of("kubelet.devices", resource="example.com/nested", capacity=2), WAIT_S, "nested capacity")
    assert not timeline.find(lambda e: e.kind == "pluginwatcher.found" and e.get("socket") != str(nested))
    assert not timeline.find(of("plugin.getinfo", socket=str(hidden)))
    assert manager.capacity("example.com/hidden") is None


def test_sockets_present_at_start_are_found(registry: Path, timeline: Timeline, manager: DeviceManager,
                                            make_plugin: Callable[..., Plugin]) -> None:
    path = registry / "early" / "early.sock"
    make_plugin(path)
    w = PluginWatcher(registry, timeline, PROFILE, {DEVICE_PLUGIN: DevicePluginHandler(manager)}).start()
    try:
        assert notified(timeline, path).get("registered") is True
    finally:
        w.stop()
        w.stop()  # idempotent


def test_unknown_type_is_refused_with_upstreams_message(watcher: PluginWatcher, registry: Path,
                                                        timeline: Timeline, make_plugin: Callable[..., Plugin]) -> None:
    path = registry / "csi.sock"
    make_plugin(path, type_="CSIPlugin", name="csi.example.com")
    status = notified(timeline, path)
    assert status.get("registered") is False
    assert status.get("error") == ("RegisterPlugin error -- no handler registered for plugin type: CSIPlugin "
                                   f"at socket {path}")


@pytest.mark.parametrize(("name", "versions", "error"), [
    (RES, ("v1", "v2"), "manager version, v1beta1, is not among plugin supported versions [v1 v2]"),
    (RES, (), "manager version, v1beta1, is not among plugin supported versions []"),
    ("x", ("v1beta1",), 'invalid name of device plugin socket: the ResourceName "x" is invalid'),
], ids=["bad-versions", "no-versions", "bad-name"])
def test_validation_failure_is_notified(watcher: PluginWatcher, registry: Path, timeline: Timeline,
                                        manager: DeviceManager, make_plugin: Callable[..., Plugin],
                                        name: str, versions: tuple[str, ...], error: str) -> None:
    path = registry / "bad.sock"
    make_plugin(path, name=name, versions=versions)
    status = notified(timeline, path)
    assert status.get("registered") is False
    assert status.get("error") == f"RegisterPlugin error -- plugin validation failed with err: {error}"
    timeline.wait_for(of("pluginwatcher.rejected", socket=str(path)), WAIT_S, "rejected")
    assert manager.capacity(name) is None and watcher.registered() == {}


def test_slow_getinfo_is_not_registered(watcher: PluginWatcher, registry: Path, timeline: Timeline,
                                        manager: DeviceManager, make_plugin: Callable[..., Plugin]) -> None:
    path = registry / "slow.sock"
    make_plugin(path, getinfo_delay_s=SLOW_GETINFO_S)
    getinfo = timeline.wait_for(of("pluginwatcher.getinfo", socket=str(path)), WAIT_S, "GetInfo outcome")
    assert getinfo.get("outcome") == "rpc error: code = DeadlineExceeded desc = context deadline exceeded"
    rejected = timeline.wait_for(of("pluginwatcher.rejected", socket=str(path)), WAIT_S, "rejected")
    assert "failed to get plugin info using RPC GetInfo" in rejected.get("error")
    # The held GetInfo answers 0.5 s after the timeout; nothing may be notified meanwhile.
    assert timeline.wait_quiet(of("plugin.notified", socket=str(path)), SLOW_GETINFO_S) is None
    assert manager.capacity(RES) is None and watcher.registered() == {}


def test_socket_deletion_deregisters(watcher: PluginWatcher, registry: Path, timeline: Timeline,
                                     manager: DeviceManager, make_plugin: Callable[..., Plugin]) -> None:
    path = registry / "gone.sock"
    make_plugin(path)
    timeline.wait_for(of("kubelet.devices", resource=RES, why="list", capacity=2), WAIT_S, "capacity 2")
    since = timeline.now()
    os.unlink(path)
    timeline.wait_for(of("pluginwatcher.deregistered", socket=str(path)), WAIT_S, "deregistered", since)
    timeline.wait_for(of("kubelet.devices", resource=RES, why="disconnected"), WAIT_S, "devices unhealthy", since)
    assert manager.capacity(RES) == 2 and manager.allocatable(RES) == 0  # grace period: capacity kept
    assert manager.endpoint(RES) is None and watcher.registered() == {}


def test_registry_dir_is_created(tmp: Path, timeline: Timeline) -> None:
    registry = tmp / "root" / "plugins_registry"
    w = PluginWatcher(registry, timeline, PROFILE, {}).start()
    try:
        assert registry.is_dir()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # a socket nobody answers on
        try:
            sock.bind(str(registry / "mute.sock"))
            timeline.wait_for(of("pluginwatcher.found", socket=str(registry / "mute.sock")), WAIT_S, "found")
        finally:
            sock.close()
    finally:
        w.stop()


def test_getinfo_delay_knob_holds_the_kubelet(registry: Path, timeline: Timeline, manager: DeviceManager,
                                              make_plugin: Callable[..., Plugin]) -> None:
    """A slow kubelet: GetInfo comes late, but its own 1 s timeout starts only with the call."""
    w = PluginWatcher(registry, timeline, PROFILE, {DEVICE_PLUGIN: DevicePluginHandler(manager)})
    w.getinfo_delay_s = SLOW_GETINFO_S
    w.start()
    try:
        path = registry / "late.sock"
        make_plugin(path)
        delay = timeline.wait_for(of("fault.getinfo_delay", socket=str(path)), WAIT_S, "the injected delay")
        getinfo = timeline.wait_for(of("plugin.getinfo", socket=str(path)), WAIT_S, "GetInfo at the plugin")
        assert (getinfo.t_ns - delay.t_ns) / 1e9 >= SLOW_GETINFO_S
        assert notified(timeline, path).get("registered") is True
    finally:
        w.stop()
