"""The fake kubelet's device manager against upstream v1.36 semantics.

A tiny in-test device plugin (a grpc server on a unix socket in the sandbox)
registers through kubelet.sock and drives FakeNode through registration,
ListAndWatch, disconnects, restarts and admission. Every wait is on the
timeline or on an event, under a deadline.
"""

from __future__ import annotations

import dataclasses
import json
import os
import queue
import socket
import stat
import threading
import time
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from harness.instruments.grpcutil import unix_target
from harness.instruments.timeline import Timeline
from harness.kubelet import checkpoint
from harness.kubelet.devicemanager import go_join
from harness.launch.sandbox import Sandbox
from harness.node.fake import FakeNode
from harness.node.interface import AdmissionError
from harness.spec.profiles import FAST
from harness.wire import dp, dp_grpc

RES = "example.com/foo"
ENDPOINT = "fake-dp.sock"
WAIT_S = 5.0  # bound for every single wait; passing runs take a fraction of it
PROFILE = dataclasses.replace(FAST, name="unit", dial_timeout_s=2.0, prestart_timeout_s=2.0,
                              endpoint_grace_s=0.3, quiet_window_s=0.3)
HEALTHY, UNHEALTHY = "Healthy", "Unhealthy"
_END = object()  # ends a ListAndWatch stream


# -- a tiny device plugin ----------------------------------------------------


@dataclass
class Call:
    method: str
    request: object
    time_remaining: float | None  # the deadline the kubelet set, as the plugin saw it


class Plugin(dp_grpc.DevicePluginServicer):
    """A controllable DevicePlugin service with a call log."""

    def __init__(self, plugin_dir: Path, endpoint: str, devices: list[tuple[str, str]] | None,
                 options: dp.DevicePluginOptions | None = None) -> None:
        self.endpoint, self.path = endpoint, plugin_dir / endpoint
        self.options = options or dp.DevicePluginOptions()
        self.devices = devices
        self.options_error: tuple[grpc.StatusCode, str] | None = None
        self.preferred_answer: list[str] | None = None
        self.preferred_error: tuple[grpc.StatusCode, str] | None = None
        self.hold_prestart = False
        self.empty_allocate = False  # answer Allocate with no ContainerAllocateResponse
        self.calls: list[Call] = []
        self._lock = threading.Lock()
        self._streams: list[queue.SimpleQueue] = []
        self.stream_opened = threading.Event()  # set once a ListAndWatch can take pushes
        self._server: grpc.Server | None = None

    # control

    def serve(self) -> Plugin:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="test-dp"))
        dp_grpc.add_DevicePluginServicer_to_server(self, server)
        server.add_insecure_port(unix_target(str(self.path)))
        server.start()
        self._server = server
        return self

    def stop(self) -> None:
        self.end_streams()
        server, self._server = self._server, None
        if server is not None:
            server.stop(grace=0).wait(5)

    def push(self, devices: list[tuple[str, str]]) -> None:
        """Send one ListAndWatch message on every open stream."""
        with self._lock:
            streams = list(self._streams)
        for q in streams:
            q.put(devices)

    def end_streams(self) -> None:
        with self._lock:
            streams = list(self._streams)
        for q in streams:
            q.put(_END)

    def called(self, method: str) -> list[Call]:
        with self._lock:
            return [c for c in self.calls if c.method == method]

    def _log(self, method: str, request: object, context: grpc.ServicerContext) -> None:
        with self._lock:
            self.calls.append(Call(method, request, context.time_remaining()))

    # DevicePlugin

    def GetDevicePluginOptions(self, request, context):  # noqa: N802
        self._log("GetDevicePluginOptions", request, context)
        if self.options_error is not None:
            context.abort(*self.options_error)
        return self.options

    def ListAndWatch(self, request, context):  # noqa: N802
        self._log("ListAndWatch", request, context)
        q: queue.SimpleQueue = queue.SimpleQueue()
        context.add_callback(lambda: q.put(_END))
        with self._lock:
            self._streams.append(q)
        self.stream_opened.set()
        try:
            devices = self.devices  # None: no initial list, wait for a push
            while devices is not _END:
                if devices is not None:
                    yield dp.ListAndWatchResponse(devices=[dp.Device(ID=i, health=h) for i, h in devices])
                devices = q.get()
        finally:
            with self._lock:
                self._streams.remove(q)

    def GetPreferredAllocation(self, request, context):  # noqa: N802
        self._log("GetPreferredAllocation", request, context)
        if self.preferred_error is not None:
            context.abort(*self.preferred_error)
        responses = []
        for r in request.container_requests:
            ids = self.preferred_answer
            if ids is None:
                ids = sorted(r.available_deviceIDs)[-r.allocation_size:]
            responses.append(dp.ContainerPreferredAllocationResponse(deviceIDs=ids))
        return dp.PreferredAllocationResponse(container_responses=responses)

    def Allocate(self, request, context):  # noqa: N802
        self._log("Allocate", request, context)
        if self.empty_allocate:
            return dp.AllocateResponse()
        return dp.AllocateResponse(container_responses=[
            dp.ContainerAllocateResponse(envs={"DEVICES": ",".join(r.devices_ids)})
            for r in request.container_requests])

    def PreStartContainer(self, request, context):  # noqa: N802
        self._log("PreStartContainer", request, context)
        if self.hold_prestart:
            # Answer only once the kubelet gives up: its deadline ends the call.
            done = threading.Event()
            context.add_callback(done.set)
            done.wait(WAIT_S)
        return dp.PreStartContainerResponse()


# -- fixtures and helpers ----------------------------------------------------


@pytest.fixture
def sandbox():
    sb = Sandbox()
    try:
        yield sb
    finally:
        sb.close()


@pytest.fixture
def timeline():
    return Timeline()


@pytest.fixture
def make_node(sandbox, timeline):
    nodes: list[FakeNode] = []

    def make(plugin_dir: Path | None = None, **overrides) -> FakeNode:
        profile = dataclasses.replace(PROFILE, **overrides)
        node = FakeNode(plugin_dir or sandbox.plugin_dir, sandbox.state_dir, timeline, profile)
        nodes.append(node)
        node.start_kubelet()
        return node

    try:
        yield make
    finally:
        for node in nodes:
            node.close()


@pytest.fixture
def make_plugin(sandbox):
    plugins: list[Plugin] = []

    def make(devices=None, endpoint: str = ENDPOINT, options: dp.DevicePluginOptions | None = None,
             serve: bool = True) -> Plugin:
        if devices is None:
            devices = [("d0", HEALTHY), ("d1", HEALTHY), ("d2", HEALTHY)]
        plugin = Plugin(sandbox.plugin_dir, endpoint, devices, options)
        plugins.append(plugin)
        return plugin.serve() if serve else plugin

    try:
        yield make
    finally:
        for plugin in plugins:
            plugin.stop()


def register(node: FakeNode, endpoint: str = ENDPOINT, resource: str = RES, version: str = "v1beta1",
             options: dp.DevicePluginOptions | None = None) -> None:
    channel = grpc.insecure_channel(unix_target(str(node.kubelet_socket)))
    try:
        dp_grpc.RegistrationStub(channel).Register(
            dp.RegisterRequest(version=version, endpoint=endpoint, resource_name=resource, options=options),
            timeout=WAIT_S + node.profile.dial_timeout_s)
    finally:
        channel.close()


def register_error(node: FakeNode, **kwargs) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        register(node, **kwargs)
    return info.value


def devices_event(timeline: Timeline, since: int, resource: str = RES, why: str = "list"):
    return timeline.wait_for(lambda e: e.kind == "kubelet.devices" and e.get("resource") == resource
                             and e.get("why") == why, WAIT_S, f"kubelet.devices ({why}) for {resource}",
                             since_ns=since, relevant=("kubelet.register", "kubelet.devices", "kubelet.stream_end"))


def register_and_list(node: FakeNode, timeline: Timeline, plugin: Plugin, resource: str = RES, **kwargs):
    """Register `plugin` and wait until its first list reached node status."""
    t = timeline.now()
    register(node, endpoint=plugin.endpoint, resource=resource, **kwargs)
    return devices_event(timeline, t, resource)


def push_and_wait(timeline: Timeline, plugin: Plugin, devices: list[tuple[str, str]], resource: str = RES):
    t = timeline.now()
    plugin.push(devices)
    return devices_event(timeline, t, resource)


def kubelet_calls(timeline: Timeline, method: str, since: int = 0) -> list:
    """Unary calls the kubelet's device-plugin client made (the endpoint, not the DP-REG-01 probe)."""
    return timeline.find(lambda e: e.kind == "grpc.call" and e.source == "kubelet" and e.get("side") == "client"
                         and e.get("method") == method, since)


def kubelet_streams(timeline: Timeline, since: int = 0) -> list:
    return timeline.find(lambda e: e.kind == "grpc.stream_open" and e.source == "kubelet"
                         and e.get("side") == "client" and e.get("method") == "ListAndWatch", since)


def wait_resource_gone(node: FakeNode, resource: str, bound_s: float) -> None:
    """Poll node status (GetCapacity is what garbage-collects) until `resource` is gone."""
    tick, deadline = threading.Event(), time.monotonic() + bound_s
    while node.capacity(resource) is not None:
        assert time.monotonic() < deadline, f"{resource} still in node status after {bound_s:g}s"
        tick.wait(0.02)


def make_dead_socket(path: Path) -> None:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.bind(str(path))
    finally:
        s.close()


def is_socket(path: Path) -> bool:
    try:
        return stat.S_ISSOCK(os.lstat(path).st_mode)
    except FileNotFoundError:
        return False


# -- start, stop, kubelet.sock -----------------------------------------------


def test_start_makes_dir_0750_and_cleans_only_sockets(sandbox, timeline, make_node):
    plugin_dir = sandbox.path / "fresh" / "device-plugins"
    outside = sandbox.state_dir / "outside.sock"
    make_dead_socket(outside)
    # Upstream CleanupPluginDirectory only removes what os.Stat says is a socket.
    plugin_dir.mkdir(parents=True)
    os.chmod(plugin_dir, 0o755)
    make_dead_socket(plugin_dir / "stale.sock")
    (plugin_dir / "regular.txt").write_text("keep")
    (plugin_dir / "subdir").mkdir()
    make_dead_socket(plugin_dir / "subdir" / "nested.sock")  # not recursive
    os.symlink(outside, plugin_dir / "link-to-socket.sock")  # os.Stat follows: removed
    os.symlink(sandbox.state_dir / "nowhere", plugin_dir / "dangling")  # Stat fails: kept
    checkpoint.write(plugin_dir / checkpoint.CHECKPOINT_NAME, checkpoint.CheckpointData())
    node = make_node(plugin_dir)

    cleanup = timeline.wait_for(lambda e: e.kind == "kubelet.cleanup", WAIT_S, "kubelet.cleanup")
    assert cleanup.get("removed") == ["link-to-socket.sock", "stale.sock"]
    assert not (plugin_dir / "stale.sock").exists()
    assert not os.path.lexists(plugin_dir / "link-to-socket.sock")
    assert is_socket(outside), "only the link goes, not its target"
    assert (plugin_dir / "regular.txt").read_text() == "keep"
    assert is_socket(plugin_dir / "subdir" / "nested.sock")
    assert os.path.islink(plugin_dir / "dangling")
    assert (plugin_dir / checkpoint.CHECKPOINT_NAME).is_file()
    assert is_socket(node.kubelet_socket)

    # A directory the kubelet creates gets MkdirAll(dir, 0750) (less the umask).
    new_dir = sandbox.path / "new" / "device-plugins"
    make_node(new_dir)
    mode = stat.S_IMODE(os.stat(new_dir).st_mode)
    assert mode & ~0o750 == 0 and mode & 0o700 == 0o700, oct(mode)
    assert is_socket(new_dir / "kubelet.sock")


def test_kubelet_sock_outlives_stop_and_is_recreated(timeline, make_node, make_plugin):
    node = make_node()
    plugin = make_plugin()
    register_and_list(node, timeline, plugin)
    node.stop_kubelet()
    # Nothing calls Stop on a real kubelet: a dead kubelet.sock stays behind.
    assert is_socket(node.kubelet_socket)
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        with pytest.raises(ConnectionRefusedError):
            probe.connect(str(node.kubelet_socket))
    finally:
        probe.close()

    t = timeline.now()
    node.start_kubelet()
    cleanup = timeline.wait_for(lambda e: e.kind == "kubelet.cleanup", WAIT_S, "kubelet.cleanup", since_ns=t)
    assert cleanup.get("removed") == sorted(["kubelet.sock", ENDPOINT])
    assert is_socket(node.kubelet_socket)
    assert not plugin.path.exists()
    # The new kubelet.sock serves: a plugin on a new socket registers.
    replacement = make_plugin(endpoint="fake-dp-2.sock")
    event = register_and_list(node, timeline, replacement)
    assert event.get("capacity") == 3


def test_a_register_accepted_just_before_a_stop_is_answered(timeline, make_node, make_plugin, monkeypatch):
    """The answer leaves before the kubelet goes, as a Go kubelet's does: a loaded machine's grpc, slow to send
    it, once made the upstream sample plugin panic on "Cancelling all calls" after its registration counted."""
    import grpc._server as grpc_server
    serialize = grpc_server._serialize_response

    def slow(rpc_event, state, response, serializer):
        if isinstance(response, dp.Empty):
            threading.Event().wait(0.3)  # injected lag between the handler's return and the send, not a wait
        return serialize(rpc_event, state, response, serializer)

    monkeypatch.setattr(grpc_server, "_serialize_response", slow)
    node = make_node()
    make_plugin()
    answer: queue.SimpleQueue = queue.SimpleQueue()

    def call() -> None:
        try:
            register(node)
            answer.put("OK")
        except grpc.RpcError as err:
            answer.put(f"{err.code().name}: {err.details()}")

    threading.Thread(target=call, daemon=True).start()
    timeline.wait_for(lambda e: e.kind == "kubelet.register" and e.get("accepted"), WAIT_S, "the registration")
    node.stop_kubelet()
    assert answer.get(timeout=WAIT_S) == "OK"


# -- Register ----------------------------------------------------------------


def test_register_rejects_unsupported_version(timeline, make_node, make_plugin):
    node = make_node()
    make_plugin()
    err = register_error(node, version="v1alpha")
    assert err.code() == grpc.StatusCode.UNKNOWN
    assert err.details() == 'requested API version "v1alpha" is not supported by kubelet. ' \
                            'Supported version is ["v1beta1"]'
    # The version is checked first, and a rejected plugin is never dialled.
    err = register_error(node, version="", resource="foo")
    assert err.details() == 'requested API version "" is not supported by kubelet. Supported version is ["v1beta1"]'
    assert kubelet_calls(timeline, "GetDevicePluginOptions") == []
    events = timeline.events(kind="kubelet.register")
    assert [e.get("accepted") for e in events] == [False, False]
    assert node.capacity(RES) is None


@pytest.mark.parametrize(("resource", "quoted"), [
    ("foo", '"foo"'),
    ("kubernetes.io/foo", '"kubernetes.io/foo"'),
    ("requests.example.com/foo", '"requests.example.com/foo"'),
    ("example.com/foo\n", '"example.com/foo\\n"'),  # Go's %q escapes it
    ("example.com/a\"b", '"example.com/a\\"b"'),
    (f"example.com/{'n' * 64}", f'"example.com/{"n" * 64}"'),
])
def test_register_rejects_invalid_resource_name(timeline, make_node, make_plugin, resource, quoted):
    node = make_node()
    make_plugin()
    err = register_error(node, resource=resource)
    assert err.code() == grpc.StatusCode.UNKNOWN
    assert err.details() == f"the ResourceName {quoted} is invalid"
    assert kubelet_calls(timeline, "GetDevicePluginOptions") == []
    assert node.capacity(resource) is None


@pytest.mark.parametrize("endpoint", ["/" + ENDPOINT, f"sub/../{ENDPOINT}", f"./{ENDPOINT}"])
def test_register_joins_endpoint_under_plugin_dir(sandbox, timeline, make_node, make_plugin, endpoint):
    node = make_node()
    make_plugin()
    t = timeline.now()
    register(node, endpoint=endpoint)
    devices_event(timeline, t)
    # filepath.Join(socketDir, endpoint): an absolute endpoint still lands in the directory.
    assert node.manager.endpoint(RES).socket_path == str(sandbox.plugin_dir / ENDPOINT)
    assert go_join(sandbox.plugin_dir, endpoint) == str(sandbox.plugin_dir / ENDPOINT)


def test_register_dial_times_out(timeline, make_node):
    node = make_node(dial_timeout_s=0.5)
    t0 = time.monotonic()
    err = register_error(node, endpoint="missing.sock")
    elapsed = time.monotonic() - t0
    assert err.code() == grpc.StatusCode.UNKNOWN
    assert err.details() == "failed to dial device plugin: context deadline exceeded"
    assert elapsed >= 0.5, f"the dial blocks for the whole timeout, returned after {elapsed:.3f}s"
    event = timeline.wait_for(lambda e: e.kind == "kubelet.register", WAIT_S, "kubelet.register")
    assert event.get("accepted") is False
    assert node.capacity(RES) is None


def test_register_dial_blocks_until_the_socket_appears(timeline, make_node, make_plugin):
    node = make_node(dial_timeout_s=4.0)
    node.manager.faults.delay("Register", 0.0)  # only to see the call arrive
    plugin = make_plugin(serve=False)
    errors: list[BaseException] = []

    def call() -> None:
        try:
            register(node)
        except grpc.RpcError as err:
            errors.append(err)

    caller = threading.Thread(target=call, name="test-register")
    caller.start()
    try:
        timeline.wait_for(lambda e: e.kind == "fault.fired" and e.get("method") == "Register", WAIT_S,
                          "the Register call to reach the kubelet")
        # With no socket at the endpoint, Register is still pending: the dial blocks.
        early = timeline.wait_quiet(lambda e: e.kind == "kubelet.register", 0.5)
        assert early is None, f"Register returned while the endpoint had no socket: {early}"
        plugin.serve()
        event = timeline.wait_for(lambda e: e.kind == "kubelet.register", WAIT_S, "kubelet.register")
    finally:
        caller.join(WAIT_S + 4.0)
    assert not caller.is_alive()
    assert errors == []
    assert event.get("accepted") is True
    assert event.get("probe", {}).get("ok") is False  # DP-REG-01's observation: nothing served yet
    devices_event(timeline, 0)
    assert node.capacity(RES) == 3


def test_options_fetched_once_and_list_and_watch_opened_once(timeline, make_node, make_plugin):
    node = make_node()
    plugin = make_plugin(options=dp.DevicePluginOptions(get_preferred_allocation_available=True))
    event = register_and_list(node, timeline, plugin)
    reg = timeline.wait_for(lambda e: e.kind == "kubelet.register", WAIT_S, "kubelet.register")
    assert reg.get("accepted") is True
    assert reg.get("served_options") == {"pre_start_required": False, "get_preferred_allocation_available": True}
    assert len(kubelet_calls(timeline, "GetDevicePluginOptions")) == 1
    assert len(kubelet_streams(timeline)) == 1
    assert len(plugin.called("ListAndWatch")) == 1
    assert event.get("capacity") == 3 and event.get("allocatable") == 3
    # Later messages flow on the same stream; nothing is re-fetched or re-opened.
    push_and_wait(timeline, plugin, [("d0", HEALTHY)])
    assert len(kubelet_calls(timeline, "GetDevicePluginOptions")) == 1
    assert len(kubelet_streams(timeline)) == 1


def test_options_failure_fails_register(timeline, make_node, make_plugin):
    node = make_node()
    plugin = make_plugin()
    plugin.options_error = (grpc.StatusCode.FAILED_PRECONDITION, "options broken")
    err = register_error(node)
    assert err.code() == grpc.StatusCode.UNKNOWN
    assert err.details() == ("failed to get device plugin options: "
                             "rpc error: code = FailedPrecondition desc = options broken")
    assert len(kubelet_calls(timeline, "GetDevicePluginOptions")) == 1
    assert kubelet_streams(timeline) == []
    assert plugin.called("ListAndWatch") == []
    assert node.capacity(RES) is None


# -- ListAndWatch and node status --------------------------------------------


def test_each_list_replaces_the_device_set(timeline, make_node, make_plugin):
    node = make_node()
    plugin = make_plugin([("d0", HEALTHY), ("d1", HEALTHY), ("d2", UNHEALTHY)])
    first = register_and_list(node, timeline, plugin)
    assert (first.get("capacity"), first.get("allocatable")) == (3, 2)
    assert node.devices(RES) == {"d0": HEALTHY, "d1": HEALTHY, "d2": UNHEALTHY}

    steps = [
        ([("d3", HEALTHY)], (1, 1)),  # wholesale: d0..d2 are gone
        ([("d3", "healthy"), ("d4", ""), ("d5", "Unknown")], (3, 0)),  # Healthy iff exactly "Healthy"
        ([("d0", HEALTHY), ("d1", HEALTHY)], (2, 2)),
        ([], (0, 0)),
        # healthyDevices and unhealthyDevices are sets; capacity adds their sizes.
        ([("d0", HEALTHY), ("d0", UNHEALTHY), ("d1", HEALTHY), ("d1", HEALTHY)], (3, 2)),
    ]
    for devices, (capacity, allocatable) in steps:
        event = push_and_wait(timeline, plugin, devices)
        assert (event.get("capacity"), event.get("allocatable")) == (capacity, allocatable), devices
        assert (node.capacity(RES), node.allocatable(RES)) == (capacity, allocatable), devices
    assert len(kubelet_streams(timeline)) == 1


@pytest.mark.parametrize("how", ["plugin returns", "plugin server stops"])
def test_stream_end_marks_unhealthy_then_removes_after_grace(sandbox, timeline, make_node, make_plugin, how):
    node = make_node()
    plugin = make_plugin([("d0", HEALTHY), ("d1", HEALTHY), ("d2", UNHEALTHY)])
    register_and_list(node, timeline, plugin)
    t = timeline.now()
    if how == "plugin returns":
        plugin.end_streams()
    else:
        plugin.stop()
    end = timeline.wait_for(lambda e: e.kind == "kubelet.stream_end" and e.get("resource") == RES, WAIT_S,
                            "kubelet.stream_end", since_ns=t)
    assert end.get("disconnected") is True
    gone = devices_event(timeline, t, why="disconnected")
    # Every device unhealthy, capacity kept.
    assert (gone.get("capacity"), gone.get("allocatable")) == (3, 0)
    with pytest.raises(AdmissionError, match=f"^no healthy devices present; cannot allocate unhealthy devices {RES}$"):
        node.admit_pod("pod-after-end", {RES: 1})

    # The kubelet never re-opens ListAndWatch on its own.
    reopened = timeline.wait_quiet(lambda e: e.kind == "grpc.stream_open" and e.source == "kubelet"
                                   and e.get("side") == "client", PROFILE.quiet_window_s, since_ns=end.t_ns)
    assert reopened is None, reopened
    assert len(kubelet_streams(timeline)) == 1

    # Deleted once endpointStopGracePeriod has passed since the stream ended.
    wait_resource_gone(node, RES, PROFILE.endpoint_grace_s + WAIT_S)
    removed = timeline.wait_for(lambda e: e.kind == "kubelet.resource_removed" and e.get("resource") == RES,
                                WAIT_S, "kubelet.resource_removed")
    assert (removed.t_ns - end.t_ns) / 1e9 >= PROFILE.endpoint_grace_s
    assert node.allocatable(RES) is None
    # GetCapacity rewrote the checkpoint without it: a restart does not bring it back.
    data = checkpoint.read(sandbox.plugin_dir / checkpoint.CHECKPOINT_NAME)
    assert RES not in data.registered
    node.restart_kubelet()
    assert node.capacity(RES) is None


def test_reregistration_stays_unhealthy_until_the_new_list(timeline, make_node, make_plugin):
    node = make_node(endpoint_grace_s=5.0)
    plugin = make_plugin()
    register_and_list(node, timeline, plugin)
    plugin.stop()
    devices_event(timeline, 0, why="disconnected")
    # A new instance registers but has not listed yet: PluginConnected swaps the
    # endpoint only, the devices stay unhealthy until its first message.
    second = make_plugin(endpoint="fake-dp-2.sock")
    second.devices = None  # no initial list: it sends only what is pushed
    t = timeline.now()
    register(node, endpoint=second.endpoint)
    assert second.stream_opened.wait(WAIT_S), "the kubelet opened no ListAndWatch"
    assert len(kubelet_streams(timeline, t)) == 1
    assert node.manager.endpoint(RES) is not None
    assert (node.capacity(RES), node.allocatable(RES)) == (3, 0)
    with pytest.raises(AdmissionError, match=r"^no healthy devices present"):
        node.admit_pod("pod-a", {RES: 1})
    event = push_and_wait(timeline, second, [("e0", HEALTHY), ("e1", HEALTHY)])
    assert (event.get("capacity"), event.get("allocatable")) == (2, 2)
    (alloc,) = node.admit_pod("pod-a", {RES: 1})
    assert alloc.device_ids[0] in {"e0", "e1"}


# -- restart -------------------------------------------------------------------


def test_restart_restores_resources_and_pod_devices(sandbox, timeline, make_node, make_plugin):
    node = make_node(endpoint_grace_s=5.0)
    plugin = make_plugin()
    register_and_list(node, timeline, plugin)
    (first,) = node.admit_pod("pod-a", {RES: 2})
    assert not first.reused
    assert len(plugin.called("Allocate")) == 1

    t = timeline.now()
    node.restart_kubelet()
    # RegisteredDevices come back with zero devices and a stopped endpoint.
    assert (node.capacity(RES), node.allocatable(RES)) == (0, 0)
    assert node.manager.endpoint(RES) is None
    assert node.pod_devices("pod-a") == {RES: first.device_ids}
    assert kubelet_streams(timeline, t) == []

    replacement = make_plugin(endpoint="fake-dp-2.sock")
    event = register_and_list(node, timeline, replacement)
    assert (event.get("capacity"), event.get("allocatable")) == (3, 3)
    # Same pod, same container: same devices, and no second Allocate.
    (again,) = node.admit_pod("pod-a", {RES: 2})
    assert again.reused
    assert again.device_ids == first.device_ids
    assert len(plugin.called("Allocate")) == 1
    assert replacement.called("Allocate") == []
    assert kubelet_calls(timeline, "Allocate", t) == []
    # The checkpointed devices stay in use for other pods.
    with pytest.raises(AdmissionError, match=f"^requested number of devices unavailable for {RES}. "
                                             r"Requested: 2, Available: 1$"):
        node.admit_pod("pod-b", {RES: 2})


def test_restored_resource_removed_after_grace_without_reregistration(timeline, make_node, make_plugin):
    node = make_node()
    plugin = make_plugin()
    register_and_list(node, timeline, plugin)
    t = timeline.now()
    node.restart_kubelet()
    start = timeline.wait_for(lambda e: e.kind == "kubelet.restored", WAIT_S, "kubelet.restored", since_ns=t)
    wait_resource_gone(node, RES, PROFILE.endpoint_grace_s + WAIT_S)
    removed = timeline.wait_for(lambda e: e.kind == "kubelet.resource_removed" and e.get("resource") == RES,
                                WAIT_S, "kubelet.resource_removed", since_ns=t)
    assert (removed.t_ns - start.t_ns) / 1e9 >= PROFILE.endpoint_grace_s


def test_checkpoint_keeps_the_upstream_shape(sandbox, timeline, make_node, make_plugin):
    node = make_node()
    plugin = make_plugin([("d0", HEALTHY), ("d1", UNHEALTHY)])
    register_and_list(node, timeline, plugin)
    (alloc,) = node.admit_pod("pod-a", {RES: 1})
    doc = json.loads((sandbox.plugin_dir / checkpoint.CHECKPOINT_NAME).read_text())
    assert doc["Data"]["RegisteredDevices"] == {RES: ["d0"]}  # healthy devices only
    assert doc["Data"]["PodDeviceEntries"] == [{"PodUID": "pod-a", "ContainerName": "main", "ResourceName": RES,
                                                "DeviceIDs": {"-1": alloc.device_ids}}]


def test_a_devices_event_finds_its_list_in_the_checkpoint(sandbox, timeline, make_node, make_plugin):
    """genericDeviceUpdateCallback writes the checkpoint on every list; written before the event, so a check that
    reads it on the event sees that list (P3 made the write cheap, not later)."""
    node = make_node()
    plugin = make_plugin([("d0", HEALTHY), ("d1", UNHEALTHY)])
    register_and_list(node, timeline, plugin)
    for devices in ([("d1", HEALTHY), ("d0", HEALTHY)], [("d0", UNHEALTHY), ("d2", HEALTHY)], []):
        push_and_wait(timeline, plugin, devices)
        data = checkpoint.read(sandbox.plugin_dir / checkpoint.CHECKPOINT_NAME)
        assert data.registered == {RES: sorted(i for i, h in devices if h == HEALTHY)}, devices


@pytest.mark.parametrize("garbage", [b"", b"not json", b'{"Data": 1}', b'{"Data": {}, "Checksum": 1}', b"\xff" * 64])
def test_a_corrupt_checkpoint_costs_the_allocations_not_the_start(sandbox, timeline, make_node, make_plugin,
                                                                  garbage):
    """manager.go Start(): "Continue after failing to read checkpoint file" - a plugin can write that dir."""
    node = make_node()
    plugin = make_plugin([("d0", HEALTHY)])
    register_and_list(node, timeline, plugin)
    node.stop_kubelet()
    (sandbox.plugin_dir / checkpoint.CHECKPOINT_NAME).write_bytes(garbage)
    t = timeline.now()
    node.start_kubelet()
    bad = timeline.wait_for(lambda e: e.kind == "kubelet.checkpoint_unreadable", WAIT_S, "the unreadable checkpoint",
                            since_ns=t)
    assert bad.get("error")
    assert node.capacity(RES) is None  # nothing restored; the plugin registers afresh
    assert node.kubelet_socket.exists()


# -- admission -----------------------------------------------------------------


def test_admission_without_preferred_allocation(timeline, make_node, make_plugin):
    node = make_node()
    plugin = make_plugin([("d0", HEALTHY), ("d1", HEALTHY), ("d2", UNHEALTHY)])
    register_and_list(node, timeline, plugin)
    (alloc,) = node.admit_pod("pod-a", {RES: 1})
    assert plugin.called("GetPreferredAllocation") == []
    (call,) = plugin.called("Allocate")
    assert len(call.request.container_requests) == 1
    assert list(call.request.container_requests[0].devices_ids) == alloc.device_ids
    assert alloc.device_ids[0] in {"d0", "d1"}
    assert alloc.response["envs"] == {"DEVICES": alloc.device_ids[0]}
    # available = healthy - allocated
    with pytest.raises(AdmissionError) as info:
        node.admit_pod("pod-b", {RES: 2})
    assert str(info.value) == f"requested number of devices unavailable for {RES}. Requested: 2, Available: 1"
    (other,) = node.admit_pod("pod-c", {RES: 1})
    assert set(other.device_ids + alloc.device_ids) == {"d0", "d1"}
    with pytest.raises(AdmissionError) as info:
        node.admit_pod("pod-d", {RES: 1})
    assert str(info.value) == f"requested number of devices unavailable for {RES}. Requested: 1, Available: 0"
    assert len(plugin.called("Allocate")) == 2


def test_admission_with_all_devices_unhealthy(timeline, make_node, make_plugin):
    node = make_node()
    plugin = make_plugin([("d0", UNHEALTHY), ("d1", UNHEALTHY)])
    register_and_list(node, timeline, plugin)
    with pytest.raises(AdmissionError) as info:
        node.admit_pod("pod-a", {RES: 1})
    # devicesToAllocate checks health before it counts.
    assert str(info.value) == f"no healthy devices present; cannot allocate unhealthy devices {RES}"
    assert plugin.called("Allocate") == []


@pytest.mark.parametrize(("answer", "count", "expected"), [
    (["d2", "d1"], 2, {"d1", "d2"}),  # followed
    (["bogus", "d2"], 2, None),  # unknown IDs dropped, topped up from available
    ([], 1, None),  # nothing preferred: fall back to available
    (["d2", "d1", "d0"], 1, None),  # too many: only `count` of them
    (["bogus"], 1, None),
])
def test_preferred_allocation_is_not_trusted(timeline, make_node, make_plugin, answer, count, expected):
    node = make_node()
    options = dp.DevicePluginOptions(get_preferred_allocation_available=True)
    plugin = make_plugin(options=options)
    register_and_list(node, timeline, plugin)
    plugin.preferred_answer = answer
    (alloc,) = node.admit_pod("pod-a", {RES: count})
    (pref,) = plugin.called("GetPreferredAllocation")
    assert len(pref.request.container_requests) == 1
    req = pref.request.container_requests[0]
    assert sorted(req.available_deviceIDs) == ["d0", "d1", "d2"]
    assert list(req.must_include_deviceIDs) == []
    assert req.allocation_size == count
    chosen = set(alloc.device_ids)
    assert len(alloc.device_ids) == count == len(chosen)
    assert chosen <= {"d0", "d1", "d2"}
    valid = {i for i in answer if i in {"d0", "d1", "d2"}}
    # preferred ∩ available first, then the rest of available.
    assert chosen >= valid if len(valid) <= count else chosen <= valid
    if expected is not None:
        assert chosen == expected
    (call,) = plugin.called("Allocate")
    assert len(call.request.container_requests) == 1
    assert set(call.request.container_requests[0].devices_ids) == chosen


def test_preferred_allocation_error_fails_admission(timeline, make_node, make_plugin):
    node = make_node()
    plugin = make_plugin(options=dp.DevicePluginOptions(get_preferred_allocation_available=True))
    register_and_list(node, timeline, plugin)
    plugin.preferred_error = (grpc.StatusCode.INTERNAL, "no preference")
    with pytest.raises(AdmissionError) as info:
        node.admit_pod("pod-a", {RES: 1})
    assert str(info.value) == ("device plugin GetPreferredAllocation rpc failed with err: "
                               "rpc error: code = Internal desc = no preference")
    assert plugin.called("Allocate") == []


def test_an_allocate_answer_without_container_responses_fails_admission(timeline, make_node, make_plugin):
    """manager.go refuses it ("no containers return in allocation response"); the fake admitted the pod with no
    devices, and DP-NODE-04 then erred on an IndexError instead of failing the plugin."""
    node = make_node()
    plugin = make_plugin()
    register_and_list(node, timeline, plugin)
    plugin.empty_allocate = True
    with pytest.raises(AdmissionError, match=r"^no containers return in allocation response &AllocateResponse"):
        node.admit_pod("pod-a", {RES: 1})
    assert node.pod_devices("pod-a") == {}  # nothing recorded for the refused pod


def test_served_options_decide_not_registered_ones(timeline, make_node, make_plugin):
    node = make_node()
    plugin = make_plugin()  # serves no options
    both = dp.DevicePluginOptions(pre_start_required=True, get_preferred_allocation_available=True)
    register_and_list(node, timeline, plugin, options=both)
    reg = timeline.wait_for(lambda e: e.kind == "kubelet.register", WAIT_S, "kubelet.register")
    assert reg.get("options") == {"pre_start_required": True, "get_preferred_allocation_available": True}
    node.admit_pod("pod-a", {RES: 1})
    node.start_pod("pod-a")
    assert plugin.called("GetPreferredAllocation") == []
    assert plugin.called("PreStartContainer") == []
    assert len(plugin.called("Allocate")) == 1


def test_prestart_only_at_container_start(timeline, make_node, make_plugin):
    node = make_node()
    plugin = make_plugin(options=dp.DevicePluginOptions(pre_start_required=True))
    # Registered with no options: the served ones count.
    register_and_list(node, timeline, plugin, options=dp.DevicePluginOptions())
    (alloc,) = node.admit_pod("pod-a", {RES: 2})
    assert plugin.called("PreStartContainer") == []
    node.start_pod("pod-a")
    (call,) = plugin.called("PreStartContainer")
    assert sorted(call.request.devices_ids) == sorted(alloc.device_ids)
    assert call.time_remaining is not None
    # The kubelet's deadline, as grpc carried it (its timeout header rounds a little).
    assert PROFILE.prestart_timeout_s / 2 < call.time_remaining <= PROFILE.prestart_timeout_s * 1.05
    assert len(plugin.called("Allocate")) == 1


def test_prestart_deadline(timeline, make_node, make_plugin):
    node = make_node(prestart_timeout_s=0.3)
    plugin = make_plugin(options=dp.DevicePluginOptions(pre_start_required=True))
    register_and_list(node, timeline, plugin)
    node.admit_pod("pod-a", {RES: 1})
    plugin.hold_prestart = True
    t0 = time.monotonic()
    with pytest.raises(AdmissionError) as info:
        node.start_pod("pod-a")
    elapsed = time.monotonic() - t0
    assert str(info.value) == ("device plugin PreStartContainer rpc failed with err: "
                               "rpc error: code = DeadlineExceeded desc = context deadline exceeded")
    assert 0.3 <= elapsed < WAIT_S
    (call,) = plugin.called("PreStartContainer")
    assert call.time_remaining is not None and call.time_remaining <= 0.3 * 1.05


def test_a_socket_its_plugin_removes_during_the_start_up_cleanup_is_gone_not_an_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """CI: the upstream sample plugin, panicking as a kubelet restarted, removed its socket between the cleanup's
    stat and its unlink; the FileNotFoundError made DP-RST-02 a harness error. Upstream's os.RemoveAll ignores it."""
    from harness.kubelet import devicemanager

    plugin_dir = tmp_path / "device-plugins"
    plugin_dir.mkdir()
    for name in ("racing.sock", "kept.sock"):
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(plugin_dir / name))
        sock.close()
    real_unlink = os.unlink

    def plugin_first(path: str, *args: object, **kwargs: object) -> None:
        if path.endswith("racing.sock"):
            real_unlink(path)  # the plugin's own cleanup lands first
        real_unlink(path)

    monkeypatch.setattr(devicemanager.os, "unlink", plugin_first)
    manager = object.__new__(devicemanager.DeviceManager)
    timeline = Timeline()
    manager.plugin_dir, manager.timeline, manager.instance = plugin_dir, timeline, 1
    manager._cleanup_plugin_dir()
    assert list(plugin_dir.iterdir()) == []
    assert timeline.find(lambda e: e.kind == "kubelet.cleanup")[0].get("removed") == ["kept.sock"]
