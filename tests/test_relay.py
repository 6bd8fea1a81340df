"""The relay between a kubelet and a device plugin (harness/node/relay/dp.py), with the fake kubelet on the
kubelet's side: what the plugin sees is what a direct connection shows, and the relay's record of the wire
matches the fake kubelet's own record of it.

The fake kubelet records on a timeline of its own here, the relay on another, so that each record is seen
apart; the plugin is the in-test plugin of test_devicemanager.py.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
from test_devicemanager import ENDPOINT, PROFILE, RES, WAIT_S, Plugin, is_socket

from harness.instruments.grpcutil import unix_target
from harness.instruments.timeline import Event, Timeline
from harness.launch.sandbox import Sandbox
from harness.node.fake import FakeNode
from harness.node.relay.dp import DevicePluginRelay
from harness.wire import dp, dp_grpc


class Rig:
    """A plugin directory, a kubelet directory, the fake kubelet on the latter and the relay between."""

    def __init__(self, sandbox: Sandbox) -> None:
        self.plugin_dir = sandbox.plugin_dir
        self.kubelet_dir = sandbox.path / "kubelet-device-plugins"
        self.kubelet_dir.mkdir()
        self.kubelet_timeline, self.timeline = Timeline(), Timeline()
        self.node = FakeNode(self.kubelet_dir, sandbox.state_dir, self.kubelet_timeline, PROFILE)
        self.relay = DevicePluginRelay(self.timeline, self.plugin_dir, self.kubelet_dir, sandbox.path / "relay",
                                       lambda: self.node.instance or 0)
        self.plugins: list[Plugin] = []

    def plugin(self, devices: list[tuple[str, str]] | None = None) -> Plugin:
        plugin = Plugin(self.plugin_dir, ENDPOINT, devices or [("d0", "Healthy"), ("d1", "Healthy")])
        self.plugins.append(plugin)
        return plugin.serve()

    def register(self, version: str = "v1beta1", endpoint: str = ENDPOINT) -> None:
        channel = grpc.insecure_channel(unix_target(str(self.plugin_dir / "kubelet.sock")))
        try:
            dp_grpc.RegistrationStub(channel).Register(
                dp.RegisterRequest(version=version, endpoint=endpoint, resource_name=RES), timeout=WAIT_S * 2)
        finally:
            channel.close()

    def wait(self, timeline: Timeline, kind: str, since: int = 0, **data: object) -> Event:
        return timeline.wait_for(lambda e: e.kind == kind and all(e.get(k) == v for k, v in data.items()),
                                 WAIT_S, f"{kind} {data}", since)

    def close(self) -> None:
        for plugin in self.plugins:
            plugin.stop()
        self.relay.close()
        self.node.close()


@pytest.fixture
def rig() -> Iterator[Rig]:
    sandbox = Sandbox()
    made = Rig(sandbox)
    try:
        made.node.start_kubelet()
        made.relay.start()
        yield made
    finally:
        made.close()
        sandbox.close()


def test_the_plugin_sees_the_kubelet_socket_and_registers_through_it(rig: Rig) -> None:
    assert is_socket(rig.plugin_dir / "kubelet.sock")
    plugin = rig.plugin()
    rig.wait(rig.timeline, "relay.mirror", name=ENDPOINT, what="created")
    assert is_socket(rig.kubelet_dir / ENDPOINT)
    rig.register()
    # The fake kubelet on the far side accepted it and listed the plugin's devices.
    kubelet = rig.wait(rig.kubelet_timeline, "kubelet.register", accepted=True)
    relayed = rig.wait(rig.timeline, "kubelet.register", accepted=True)
    for key in ("resource", "version", "endpoint", "options", "served_options"):
        assert relayed.get(key) == kubelet.get(key), key
    assert relayed.get("probe") == {"ok": True} and relayed.get("options_call") == {"ok": True, "error": None}
    message = rig.wait(rig.timeline, "grpc.stream_msg", endpoint_id=relayed.get("endpoint_id"))
    assert {d["ID"] for d in message.get("message")["devices"]} == {"d0", "d1"}
    assert rig.wait(rig.timeline, "kubelet.dial", name=ENDPOINT).get("outcome") == "OK"
    assert [c.method for c in plugin.calls][:2] == ["GetDevicePluginOptions", "ListAndWatch"]


def test_a_rejection_reaches_the_plugin_as_the_kubelet_gave_it(rig: Rig) -> None:
    rig.plugin()
    with pytest.raises(grpc.RpcError) as info:
        rig.register(version="v1alpha")
    kubelet = rig.wait(rig.kubelet_timeline, "kubelet.register", accepted=False)
    relayed = rig.wait(rig.timeline, "kubelet.register", accepted=False)
    assert info.value.details() == kubelet.get("error") == relayed.get("error")  # type: ignore[attr-defined]


def test_the_kubelets_calls_are_forwarded_and_recorded(rig: Rig) -> None:
    plugin = rig.plugin()
    rig.register()
    rig.wait(rig.kubelet_timeline, "kubelet.devices", why="list")
    allocated = rig.node.admit_pod("pod-a", {RES: 1})
    assert allocated[0].device_ids and len(plugin.called("Allocate")) == 1
    call = rig.wait(rig.timeline, "grpc.call", method="Allocate")
    assert call.get("outcome") == "OK" and call.get("response")["container_responses"][0]["envs"]["DEVICES"]


def test_a_kubelet_restart_deletes_the_plugins_socket_and_brings_a_new_kubelet_sock(rig: Rig) -> None:
    rig.plugin()
    rig.register()
    rig.wait(rig.timeline, "kubelet.register", accepted=True)
    t = rig.timeline.now()
    rig.node.restart_kubelet()  # the fake kubelet's start deletes every socket in its directory
    rig.wait(rig.timeline, "relay.mirror", t, name=ENDPOINT, what="deleted", side="plugin")
    gone = rig.wait(rig.timeline, "relay.mirror", t, name="kubelet.sock", what="deleted", side="plugin")
    rig.wait(rig.timeline, "relay.mirror", gone.t_ns, name="kubelet.sock", what="created", side="plugin")
    assert not os.path.lexists(rig.plugin_dir / ENDPOINT)
    assert is_socket(rig.plugin_dir / "kubelet.sock")


def test_a_stopped_kubelet_leaves_a_socket_that_refuses(rig: Rig) -> None:
    rig.node.stop_kubelet()
    rig.relay.kubelet_stopped()
    assert is_socket(rig.plugin_dir / "kubelet.sock")
    with pytest.raises(grpc.RpcError) as info:
        rig.register()
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE  # type: ignore[attr-defined]


def test_the_kubelets_checkpoint_is_copied_for_the_plugin(rig: Rig) -> None:
    rig.plugin()
    rig.register()
    rig.wait(rig.kubelet_timeline, "kubelet.devices", why="list")
    rig.wait(rig.timeline, "relay.mirror", name="kubelet_internal_checkpoint", what="copied")
    copied = (rig.plugin_dir / "kubelet_internal_checkpoint").read_bytes()
    assert copied and copied == (rig.kubelet_dir / "kubelet_internal_checkpoint").read_bytes()


def test_a_fault_armed_for_the_next_kubelet_is_applied_on_the_wire(rig: Rig) -> None:
    """The real node's `arm`: a rejected Register, as the fake kubelet's fault plan gives it, then the real one."""
    rig.relay.arm().reject("Register", count=1, message="fakelet: rejected once")
    t = rig.timeline.now()
    rig.node.restart_kubelet()
    rig.wait(rig.timeline, "relay.mirror", t, name="kubelet.sock", what="created", side="plugin")
    rig.plugin()  # after the restart, which deletes every socket in the kubelet's directory, and so the plugin's
    with pytest.raises(grpc.RpcError) as info:
        rig.register()
    assert info.value.details() == "fakelet: rejected once"  # type: ignore[attr-defined]
    rejected = rig.wait(rig.timeline, "grpc.call", t, method="Register", side="server")
    assert rejected.get("outcome") == "UNKNOWN: fakelet: rejected once"
    rig.register()  # the next one reaches the kubelet
    rig.wait(rig.timeline, "kubelet.register", t, accepted=True)
    assert rig.kubelet_timeline.find(lambda e: e.kind == "kubelet.register", t) != []


def test_a_call_the_plugin_never_answers_ends_when_the_relay_closes(rig: Rig) -> None:
    """A hung side gets a bounded end: the kubelet's call (it sets no deadline on Allocate) is cancelled when the
    relay goes, and the relay's close does not wait for the plugin."""
    import threading
    import time

    plugin = rig.plugin()
    plugin.hold_prestart = True  # PreStartContainer answers only when its caller gives up
    rig.wait(rig.timeline, "relay.mirror", name=ENDPOINT, what="created")
    channel = grpc.insecure_channel(unix_target(str(rig.kubelet_dir / ENDPOINT)))
    ended: list[grpc.StatusCode] = []

    def call() -> None:
        try:
            dp_grpc.DevicePluginStub(channel).PreStartContainer(dp.PreStartContainerRequest(devices_ids=["d0"]))
        except grpc.RpcError as err:
            ended.append(err.code())  # type: ignore[attr-defined]

    caller = threading.Thread(target=call, daemon=True)
    caller.start()
    rig.wait(rig.timeline, "kubelet.dial", name=ENDPOINT)  # the call is through the relay, held by the plugin
    t0 = time.monotonic()
    rig.relay.close()
    caller.join(WAIT_S)
    channel.close()
    assert time.monotonic() - t0 < WAIT_S and ended and ended[0] != grpc.StatusCode.OK
    for path in (rig.kubelet_dir / ENDPOINT, rig.plugin_dir / "kubelet.sock"):
        assert not os.path.lexists(path) or path.name == "kubelet.sock"  # kubelet.sock stays, dead, as the kubelet's


def test_a_message_above_the_kubelets_limit_passes_unchanged_and_is_recorded_as_refused(rig: Rig) -> None:
    """The kubelet judges it (it fails the stream); the relay's record carries no list the kubelet never applied."""
    long_id = "d" * 1024
    rig.plugin([(f"{long_id}-{i}", "Healthy") for i in range(4500)])  # about 4.7 MB in one ListAndWatch message
    rig.register()
    refused = rig.wait(rig.timeline, "kubelet.over_limit", what="ListAndWatch message")
    assert refused.get("bytes") > 4 * 1024 * 1024 and refused.get("finding")
    rig.wait(rig.kubelet_timeline, "kubelet.over_limit", what="ListAndWatch message")  # it reached the kubelet
    assert rig.timeline.find(lambda e: e.kind == "grpc.stream_msg") == []


def test_what_the_plugin_writes_to_the_kubelets_files_reaches_them(rig: Rig) -> None:
    """A plugin that overwrites or deletes the kubelet's checkpoint does it to the kubelet's own, as it would on a
    direct connection (the corrupt-checkpoint mutant passed DP-ROB-02 on the real kubelet while only a copy broke)."""
    rig.plugin()
    rig.register()
    rig.wait(rig.timeline, "relay.mirror", name="kubelet_internal_checkpoint", what="copied", side="plugin")
    t = rig.timeline.now()
    (rig.plugin_dir / "kubelet_internal_checkpoint").write_bytes(b"garbage")
    rig.wait(rig.timeline, "relay.mirror", t, name="kubelet_internal_checkpoint", what="copied", side="kubelet")
    assert (rig.kubelet_dir / "kubelet_internal_checkpoint").read_bytes() == b"garbage"
    t = rig.timeline.now()
    (rig.plugin_dir / "kubelet_internal_checkpoint").unlink()
    rig.wait(rig.timeline, "relay.mirror", t, name="kubelet_internal_checkpoint", what="deleted", side="kubelet")
    assert not (rig.kubelet_dir / "kubelet_internal_checkpoint").exists()


def test_a_plugin_registering_before_the_mirror_saw_its_socket_gets_its_calls_recorded(rig: Rig) -> None:
    """Under load the directory watch reports a socket late; the plugin's Register must not outrun it: the
    kubelet dials inside Register, so the relay opens the socket then, and the calls carry the registration."""
    seen = rig.relay._plugin_changed
    rig.relay._plugin_changed = lambda name, what: None if name == ENDPOINT else seen(name, what)  # type: ignore[method-assign]
    rig.plugin()
    rig.register()
    relayed = rig.wait(rig.timeline, "kubelet.register", accepted=True)
    message = rig.wait(rig.timeline, "grpc.stream_msg", endpoint_id=relayed.get("endpoint_id"))
    assert {d["ID"] for d in message.get("message")["devices"]} == {"d0", "d1"}


def test_a_socket_that_appears_while_its_register_waits_gets_the_registration(rig: Rig) -> None:
    """A plugin that registers a moment before it serves: the kubelet's dial waits for the socket, and the
    relay's side of it, opened when it appears, belongs to the Register in flight."""
    with ThreadPoolExecutor(1) as pool:
        registering = pool.submit(rig.register)
        rig.wait(rig.timeline, "kubelet.register_received", endpoint=ENDPOINT)
        rig.plugin()
        registering.result(WAIT_S * 2)
    relayed = rig.wait(rig.timeline, "kubelet.register", accepted=True)
    message = rig.wait(rig.timeline, "grpc.stream_msg", endpoint_id=relayed.get("endpoint_id"))
    assert {d["ID"] for d in message.get("message")["devices"]} == {"d0", "d1"}
