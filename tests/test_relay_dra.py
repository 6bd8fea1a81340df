"""The DRA relay (harness/node/relay/dra.py) with the fake kubelet on the kubelet's side: the reference DRA driver
registers through it, the kubelet calls it through the endpoint the relay gave the kubelet, and the relay's
record of the wire matches the fake kubelet's own record of it.

The fake kubelet records on a timeline of its own, the relay on another, so that each record is seen apart.
The driver runs without an API server (it answers every claim with an error of its own, which is a result
like any other for the record).
"""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_reference_dra import DRIVER, WAIT_S, Driver

from fake_devices.backend import DeviceBackend
from fake_devices.model import Inventory
from harness.instruments.dials import DIAL, OK
from harness.instruments.timeline import Event, Timeline
from harness.kubelet.dramanager import PrepareError
from harness.node.fake import FakeNode
from harness.node.relay.dra import DRARelay
from harness.node.relay.perconn import PerConnectionRelay
from harness.spec.profiles import get as get_profile
from harness.spec.subjects import fixtures_dir

PROFILE = get_profile("fast")


def is_socket(path: Path) -> bool:
    import stat

    try:
        return stat.S_ISSOCK(os.lstat(path).st_mode)
    except OSError:
        return False


class Rig:
    """The driver's dirs (its root), the kubelet's own dirs, the fake kubelet on them and the relay between."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.kubelet_registry, self.kubelet_plugins = root / "k-registry", root / "k-plugins"
        self.kubelet_timeline, self.timeline = Timeline(), Timeline()
        self.node = FakeNode(root / "k-dp", root / "k-state", self.kubelet_timeline, PROFILE,
                             registry_dir=self.kubelet_registry)
        self.driver = Driver(root)
        # The fake kubelet runs in the harness's view: the path it dials is where the relay put the socket.
        self.relay = DRARelay(self.timeline, self.driver.registry, root / "plugins", self.kubelet_registry,
                              self.kubelet_plugins, str(self.kubelet_plugins), root / "relay",
                              lambda: self.node.instance or 0)

    def wait(self, timeline: Timeline, kind: str, since: int = 0, **data: object) -> Event:
        return timeline.wait_for(lambda e: e.kind == kind and all(e.get(k) == v for k, v in data.items()),
                                 WAIT_S, f"{kind} {data}", since)

    def close(self) -> None:
        try:
            if self.driver.proc is not None and self.driver.proc.poll() is None:
                self.driver.stop()
        finally:
            try:
                self.relay.close()
            finally:
                self.node.close()


@pytest.fixture
def rig(tmp: Path) -> Iterator[Rig]:
    inventory = Inventory.load(fixtures_dir() / "inventories" / "basic.yaml")
    with DeviceBackend(tmp / "hw", inventory):
        made = Rig(tmp)
        try:
            made.node.start_kubelet()
            made.relay.start()
            yield made
        finally:
            made.close()


def registered(rig: Rig) -> tuple[Event, Event]:
    rig.driver.start()
    return (rig.wait(rig.kubelet_timeline, "dra.registered", driver=DRIVER),
            rig.wait(rig.timeline, "dra.registered", driver=DRIVER))


def test_the_driver_registers_through_the_relay_with_its_endpoint_rewritten(rig: Rig) -> None:
    kubelet, relayed = registered(rig)
    endpoint = str(rig.driver.plugin_dir / "dra.sock")
    rewritten = str(rig.kubelet_plugins / DRIVER / "dra.sock")
    # The kubelet dials the relay's socket, at the driver's path under the kubelet's plugins dir...
    assert kubelet.get("endpoint") == rewritten and is_socket(Path(rewritten))
    # ...and the relay's record names the driver's own endpoint, as a check reads it.
    assert relayed.get("endpoint") == endpoint and relayed.get("kubelet_endpoint") == rewritten
    assert relayed.get("versions") == kubelet.get("versions") and relayed.get("relay") is True
    info = {tl: rig.wait(tl, "pluginwatcher.getinfo", outcome="OK") for tl in (rig.kubelet_timeline, rig.timeline)}
    for key in ("type", "name", "versions"):
        assert info[rig.timeline].get(key) == info[rig.kubelet_timeline].get(key), key
    assert info[rig.kubelet_timeline].get("endpoint") == rewritten and info[rig.timeline].get("endpoint") == endpoint
    assert info[rig.timeline].get("socket") == str(rig.driver.reg_socket)
    for kind in ("pluginwatcher.notify", "pluginwatcher.registered"):
        fake, seen = rig.wait(rig.kubelet_timeline, kind), rig.wait(rig.timeline, kind)
        for key in ("registered", "code", "type", "name", "versions"):
            assert seen.get(key) == fake.get(key), (kind, key)


def test_the_health_stream_is_recorded_as_the_fake_kubelet_records_it(rig: Rig) -> None:
    registered(rig)
    fake = rig.wait(rig.kubelet_timeline, "dra.health", driver=DRIVER)
    seen = rig.wait(rig.timeline, "dra.health", driver=DRIVER)
    assert seen.get("version") == fake.get("version")
    assert sorted(d["device"] for d in seen.get("devices")) == sorted(d["device"] for d in fake.get("devices"))
    assert {d["health"] for d in seen.get("devices")} == {d["health"] for d in fake.get("devices")}


def test_one_kubelet_connection_is_one_driver_connection(rig: Rig) -> None:
    registered(rig)
    rig.wait(rig.timeline, "dra.health", driver=DRIVER)  # the health stream runs on the kubelet's connection
    pod = {"name": "pod-a", "namespace": "ns", "uid": str(uuid.uuid4())}
    claim = {"metadata": {"name": "c", "namespace": "ns", "uid": str(uuid.uuid4())},
             "status": {"reservedFor": [{"uid": pod["uid"]}],
                        "allocation": {"devices": {"results": [{"driver": DRIVER, "pool": "p", "device": "d"}]}}}}
    with pytest.raises(PrepareError):  # without an API server the driver cannot read the claim
        rig.node.prepare_pod(pod, [claim])
    opened = rig.timeline.find(lambda e: e.kind == "relay.connection" and e.get("role") == "endpoint"
                               and e.get("what") == "opened")
    assert len(opened) == 1, opened
    calls = rig.timeline.find(lambda e: e.kind == "dra.prepare")
    assert {c.get("connection") for c in calls} == {opened[0].get("number")}


def test_the_kubelets_dials_are_recorded_as_the_fake_kubelet_records_its_own(rig: Rig) -> None:
    """A scenario's `dialed` reads `kubelet.dial` on either kubelet: the relay must write it for each connection
    it passes on, naming the driver's own socket (a real DRA node once read 0 dials of dra.sock)."""
    registered(rig)
    rig.wait(rig.timeline, "dra.health", driver=DRIVER)  # the endpoint's connection is open by now
    fake = rig.kubelet_timeline.find(lambda e: e.kind == DIAL and e.get("outcome") == OK)
    relayed = rig.timeline.find(lambda e: e.kind == DIAL)
    assert {e.get("name") for e in relayed} == {e.get("name") for e in fake} >= {"dra.sock"}, (relayed, fake)
    driver_sockets = {str(rig.driver.reg_socket), str(rig.driver.plugin_dir / "dra.sock")}
    assert {e.get("socket") for e in relayed} == driver_sockets
    assert all(e.source == "kubelet" and e.get("outcome") == OK and e.get("instance") == rig.node.instance
               for e in relayed), relayed


def test_prepare_and_unprepare_records_match_the_fake_kubelets(rig: Rig) -> None:
    registered(rig)
    pod = {"name": "pod-a", "namespace": "ns", "uid": str(uuid.uuid4())}
    uid = str(uuid.uuid4())
    claim = {"metadata": {"name": "c", "namespace": "ns", "uid": uid},
             "status": {"reservedFor": [{"uid": pod["uid"]}],
                        "allocation": {"devices": {"results": [{"driver": DRIVER, "pool": "p", "device": "d"}]}}}}
    with pytest.raises(PrepareError):
        rig.node.prepare_pod(pod, [claim])
    rig.node.unprepare_pod(pod)
    for kind in ("dra.prepare", "dra.unprepare"):
        fake, seen = rig.wait(rig.kubelet_timeline, kind), rig.wait(rig.timeline, kind)
        for key in ("driver", "service_version", "claims", "outcome", "results", "via"):
            assert seen.get(key) == fake.get(key), (kind, key)
        assert seen.get("claims") == [uid]
        assert seen.get("endpoint") == str(rig.driver.plugin_dir / "dra.sock")
    assert rig.wait(rig.timeline, "grpc.call", method="NodePrepareResources").get("outcome") == "OK"


def test_deletions_mirror_both_ways(rig: Rig) -> None:
    registered(rig)
    name = rig.driver.reg_socket.name
    assert is_socket(rig.kubelet_registry / name)
    # The driver deleting its registration socket reaches the kubelet, whose plugin watcher deregisters it.
    t = rig.timeline.now()
    rig.driver.reg_socket.unlink()
    rig.wait(rig.timeline, "relay.mirror", t, name=name, what="deleted", side="kubelet")
    assert not os.path.lexists(rig.kubelet_registry / name)
    rig.wait(rig.kubelet_timeline, "pluginwatcher.deregistered", name=DRIVER)
    # The reference driver re-creates it: registered again through a new copy.
    t = rig.kubelet_timeline.now()
    rig.wait(rig.kubelet_timeline, "dra.registered", t, driver=DRIVER)
    # The kubelet's copy going away deletes the driver's.
    t = rig.timeline.now()
    (rig.kubelet_registry / name).unlink()
    rig.wait(rig.timeline, "relay.mirror", t, name=name, what="deleted", side="driver")


def test_a_dead_driver_drops_the_kubelets_connection(rig: Rig) -> None:
    registered(rig)
    rig.wait(rig.kubelet_timeline, "dra.connection", driver=DRIVER, connected=True)
    t = rig.kubelet_timeline.now()
    # Dead, not stopping: a SIGTERM's graceful stop may wait on the streams the relay keeps open.
    rig.driver.stop(signal.SIGKILL)
    rig.wait(rig.kubelet_timeline, "dra.connection", t, driver=DRIVER, connected=False)


def test_a_connection_to_a_socket_nobody_serves_is_closed(tmp: Path) -> None:
    import socket

    seen: list[str] = []
    relay = PerConnectionRelay(tmp, "x", lambda: str(tmp / "nobody.sock"), [], lambda *a: b"",
                               lambda *a: iter(()), lambda conn, what, upstream: seen.append(what))
    try:
        client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        client.settimeout(WAIT_S)
        client.connect(str(relay.path))
        assert client.recv(1) == b""  # closed without a greeting
        client.close()
        assert seen == ["refused"]
    finally:
        relay.close()


def test_an_endpoint_named_in_the_drivers_mount_namespace_is_translated(tmp: Path) -> None:
    """A driver in a mount namespace names /var/lib/kubelet/plugins/...: the relay dials the sandbox's copy of
    that path, and gives the kubelet the same path under its own plugins dir."""
    driver_plugins, kubelet_plugins = tmp / "plugins", tmp / "k-plugins"
    host = "/var/lib/kubelet"

    def translate(path: str) -> str:
        return str(tmp) + path[len(host):] if path.startswith(host + "/") else path

    relay = DRARelay(Timeline(), tmp / "registry", driver_plugins, tmp / "k-registry", kubelet_plugins,
                     "/var/lib/kubelet/plugins", tmp / "relay", lambda: 1, translate).start()
    try:
        kubelet_path = relay._endpoint_for(f"{host}/plugins/{DRIVER}/dra.sock", DRIVER)
        assert kubelet_path == f"/var/lib/kubelet/plugins/{DRIVER}/dra.sock"
        assert is_socket(kubelet_plugins / DRIVER / "dra.sock")
        # An endpoint outside the plugins dir gets a place of the relay's own there.
        elsewhere = relay._endpoint_for(str(tmp / "other.sock"), DRIVER)
        assert elsewhere.startswith("/var/lib/kubelet/plugins/fakelet-relay/")
        assert relay._endpoint_for(f"{host}/plugins/{DRIVER}/dra.sock", DRIVER) == kubelet_path  # made once
    finally:
        relay.close()
    assert not os.path.lexists(kubelet_plugins / DRIVER / "dra.sock")


def test_a_getinfo_past_the_kubelets_second_is_recorded_as_the_kubelet_saw_it(tmp: Path) -> None:
    """The kubelet's own 1 s deadline ends a slow GetInfo: the relay's record says DeadlineExceeded, as the fake
    kubelet's does, not the cancellation that reached the relay."""
    inventory = Inventory.load(fixtures_dir() / "inventories" / "basic.yaml")
    with DeviceBackend(tmp / "hw", inventory):
        rig = Rig(tmp)
        rig.driver = Driver(tmp, defect="getinfo-slow")
        try:
            rig.node.start_kubelet()
            rig.relay.start()
            rig.driver.start()
            fake = rig.wait(rig.kubelet_timeline, "pluginwatcher.getinfo")
            seen = rig.wait(rig.timeline, "pluginwatcher.getinfo")
            assert fake.get("outcome") == seen.get("outcome") == (
                "rpc error: code = DeadlineExceeded desc = context deadline exceeded")
        finally:
            rig.close()
