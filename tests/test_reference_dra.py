"""The reference DRA driver on its own: a subprocess, a small gRPC client, the fake hardware.

Without an API server (--kubeconfig "") it registers, serves both DRA
versions and both health versions on one socket and answers every claim
with an error. With the local control plane (skipped with its reason when
that cannot start) it publishes slices, prepares allocated claims into CDI
specs, and survives a crash with its checkpoint.

Every wait is on an event (inotify, a gRPC stream, an API watch, the
driver's log) under a deadline; nothing sleeps.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from inotify_simple import INotify
from inotify_simple import flags as IN

from fake_devices.backend import DeviceBackend
from fake_devices.model import Inventory
from harness.instruments.grpcutil import insecure_unix_channel
from harness.reference.dra_defects import DRA_DEFECTS
from harness.spec.subjects import fixtures_dir, load_subject
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

DRIVER = "gpu.fakelet.example.com"
REFRESH_S = 0.5
# Generous for a loaded CI machine (a driver's Python start there once took more than 10 s); every wait ends as
# soon as its event comes, so only a failing test waits this long.
WAIT_S = 30.0
# A SIGTERM'd driver has a pod's default grace to exit (k8s.io/api core/v1 DefaultTerminationGracePeriodSeconds).
# Its own shutdown is bounded below that (stop_registrar and stop_dra wait at most 5 s per server).
STOP_S = 30.0
RESOURCE_API = "/apis/resource.k8s.io/v1"


def wait_path(path: Path, present: bool = True, timeout_s: float = WAIT_S) -> None:
    """Until `path` exists (or is gone), watching its directory with inotify."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with INotify() as ino:
        ino.add_watch(str(path.parent), IN.CREATE | IN.DELETE | IN.MOVED_TO | IN.MOVED_FROM)
        deadline = time.monotonic() + timeout_s
        while path.exists() != present:
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"{path} still {'missing' if present else 'there'} after {timeout_s:g}s"
            ino.read(timeout=int(remaining * 1000) + 1)


class Driver:
    """One driver process with the sandbox paths the harness gives it."""

    def __init__(self, root: Path, kubeconfig: str = "", node: str = "node-a", defect: str | None = None) -> None:
        self.root, self.node = root, node
        self.registry, self.plugin_dir = root / "registry", root / "plugins" / DRIVER
        self.cdi_dir, self.state_dir = root / "cdi", root / "state"
        self.reg_socket = self.registry / f"{DRIVER}-reg.sock"
        self.argv = [sys.executable, "-m", "harness.reference.dra_driver", "--driver-name", DRIVER,
                     "--node-name", node, "--kubeconfig", kubeconfig, "--registry-dir", str(self.registry),
                     "--plugin-dir", str(self.plugin_dir), "--cdi-dir", str(self.cdi_dir),
                     "--sysfs-root", str(root / "hw"), "--state-dir", str(self.state_dir),
                     "--health-refresh-s", str(REFRESH_S)] + (["--defect", defect] if defect else [])
        self.proc: subprocess.Popen[str] | None = None
        self.lines: list[str] = []
        self._log = threading.Condition()

    def start(self, wait: bool = True) -> Driver:
        env = {**os.environ, "GRPC_VERBOSITY": "ERROR"}
        self.lines = []
        self.proc = subprocess.Popen(self.argv, stderr=subprocess.PIPE, text=True, env=env,
                                     cwd=Path(__file__).resolve().parent.parent)
        threading.Thread(target=self._read, args=(self.proc,), daemon=True).start()
        if wait:
            # Its log, not the socket file: a crashed predecessor may have left one behind.
            self.wait_log("serving registration on")
        return self

    def _read(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            with self._log:
                self.lines.append(line)
                self._log.notify_all()
        with self._log:
            self._log.notify_all()

    def wait_log(self, text: str, timeout_s: float = WAIT_S) -> None:
        with self._log:
            ok = self._log.wait_for(lambda: any(text in line for line in self.lines), timeout_s)
        assert ok, f"no log line with {text!r}; log:\n{''.join(self.lines)}"

    def wait_exit(self, timeout_s: float = WAIT_S) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout_s)

    def stop(self, sig: int = signal.SIGTERM) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.wait_exit(STOP_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"the driver did not exit within {STOP_S:g} s of signal {sig}; its log ends:\n"
                                 f"{''.join(self.lines[-30:])}") from None

    def channel(self) -> grpc.Channel:
        return insecure_unix_channel(str(self.plugin_dir / "dra.sock"))


def get_info(driver: Driver) -> reg.PluginInfo:
    with insecure_unix_channel(str(driver.reg_socket)) as ch:
        # The socket file exists from bind(), a moment before listen(): wait for ready, within the same 1 s.
        return reg_grpc.RegistrationStub(ch).GetInfo(reg.InfoRequest(), timeout=1.0, wait_for_ready=True)


def claims(pb: Any, *refs: tuple[str, str, str]) -> list[Any]:
    return [pb.Claim(namespace=ns, uid=uid, name=name) for ns, uid, name in refs]


def prepare(ch: grpc.Channel, *refs: tuple[str, str, str], pb: Any = dra_v1, pb_grpc: Any = dra_v1_grpc) -> Any:
    return pb_grpc.DRAPluginStub(ch).NodePrepareResources(
        pb.NodePrepareResourcesRequest(claims=claims(pb, *refs)), timeout=WAIT_S).claims


def unprepare(ch: grpc.Channel, *refs: tuple[str, str, str]) -> Any:
    return dra_v1_grpc.DRAPluginStub(ch).NodeUnprepareResources(
        dra_v1.NodeUnprepareResourcesRequest(claims=claims(dra_v1, *refs)), timeout=WAIT_S).claims


def health_stream(ch: grpc.Channel, pb: Any = drahealth_v1alpha1, pb_grpc: Any = drahealth_v1alpha1_grpc) -> Any:
    return pb_grpc.DRAResourceHealthStub(ch).NodeWatchResources(pb.NodeWatchResourcesRequest(), timeout=WAIT_S * 2)


def health(message: Any, pb: Any = drahealth_v1alpha1) -> dict[str, str]:
    return {d.device.device_name: pb.HealthStatus.Name(d.health) for d in message.devices}


def until(stream: Any, test: Callable[[dict[str, str]], bool], what: str) -> dict[str, str]:
    seen: list[dict[str, str]] = []
    for message in stream:
        seen.append(health(message))
        if test(seen[-1]):
            return seen[-1]
    raise AssertionError(f"the stream ended before {what}; saw {seen}")


@pytest.fixture
def hw(tmp: Path) -> Iterator[DeviceBackend]:
    inventory = Inventory.load(fixtures_dir() / "inventories" / "basic.yaml")
    with DeviceBackend(tmp / "hw", inventory) as backend:
        yield backend


@pytest.fixture
def driver(tmp: Path, hw: DeviceBackend) -> Iterator[Driver]:
    d = Driver(tmp)
    yield d
    if d.proc is not None and d.proc.poll() is None:
        d.proc.kill()
        d.proc.wait()


def test_profile_documents_every_defect() -> None:
    spec = load_subject("reference-dra")
    assert spec.kind == "dra" and spec.driver == DRIVER
    assert set(spec.defects) == set(DRA_DEFECTS)


# -- without an API server -----------------------------------------------------


def test_registers_serves_and_cleans_up(driver: Driver) -> None:
    driver.start()
    info = get_info(driver)
    assert info.type == "DRAPlugin" and info.name == DRIVER
    assert info.endpoint == str(driver.plugin_dir / "dra.sock") and os.path.isabs(info.endpoint)
    assert list(info.supported_versions) == ["v1.DRAPlugin", "v1beta1.DRAPlugin", "v1.DRAResourceHealth",
                                             "v1alpha1.DRAResourceHealth"]
    with insecure_unix_channel(str(driver.reg_socket)) as ch:
        reg_grpc.RegistrationStub(ch).NotifyRegistrationStatus(
            reg.RegistrationStatus(plugin_registered=False, error="rejected by the test"), timeout=1.0)
    driver.wait_log("rejected the registration")
    with driver.channel() as ch:
        # One connection: both DRA versions and both health versions.
        ref = ("ns", str(uuid.uuid4()), "c")
        for pb, pb_grpc in ((dra_v1, dra_v1_grpc), (dra_v1beta1, dra_v1beta1_grpc)):
            result = prepare(ch, ref, pb=pb, pb_grpc=pb_grpc)
            assert list(result) == [ref[1]] and "no API server" in result[ref[1]].error
        for pb, pb_grpc in ((drahealth_v1alpha1, drahealth_v1alpha1_grpc), (drahealth_v1, drahealth_v1_grpc)):
            stream = health_stream(ch, pb, pb_grpc)
            first = next(stream)
            assert health(first, pb) == {f"gpu-{i}": "HEALTHY" for i in range(4)}
            assert {d.device.pool_name for d in first.devices} == {"node-a"}
            assert all(d.health_check_timeout_seconds == 2 for d in first.devices)  # 3 x 0.5 s, rounded up
            stream.cancel()
        assert unprepare(ch, ref)[ref[1]].error == ""  # unknown: success
    assert driver.stop() == 0
    assert not driver.reg_socket.exists() and not (driver.plugin_dir / "dra.sock").exists()


def test_health_follows_the_hardware(driver: Driver, hw: DeviceBackend) -> None:
    driver.start()
    with driver.channel() as ch:
        stream = health_stream(ch)
        assert set(health(next(stream))) == {f"gpu-{i}" for i in range(4)}
        hw.heat("gpu-1", 90.0)
        until(stream, lambda h: h["gpu-1"] == "UNHEALTHY", "gpu-1 overheated")
        hw.cool("gpu-1", 82.0)  # inside the 5 C hysteresis: still hot
        hw.fail("gpu-2")
        h = until(stream, lambda h: h["gpu-2"] == "UNHEALTHY", "gpu-2 failed")
        assert h["gpu-1"] == "UNHEALTHY"
        hw.cool("gpu-1", 70.0)
        until(stream, lambda h: h["gpu-1"] == "HEALTHY", "gpu-1 cooled down")
        hw.recover("gpu-2")
        until(stream, lambda h: h["gpu-2"] == "HEALTHY", "gpu-2 recovered")
        hw.unplug("gpu-3")
        until(stream, lambda h: "gpu-3" not in h, "gpu-3 unplugged")
        # Unchanged hardware still gets a message every refresh period.
        t = time.monotonic()
        next(stream)
        assert time.monotonic() - t < REFRESH_S * 3
        stream.cancel()
        # And a new stream works after the old one dropped.
        again = health_stream(ch)
        assert set(health(next(again))) == {"gpu-0", "gpu-1", "gpu-2"}
        again.cancel()


def test_recreates_a_deleted_registration_socket(driver: Driver) -> None:
    driver.start()
    driver.reg_socket.unlink()
    driver.wait_log("recreating it")
    wait_path(driver.reg_socket)
    assert get_info(driver).name == DRIVER


# -- mutants that need no API server --------------------------------------------


@pytest.mark.parametrize("defect", ["unserved-version", "split-health-socket", "no-health"])
def test_mutants_serve_less(tmp: Path, hw: DeviceBackend, defect: str) -> None:
    d = Driver(tmp, defect=defect).start()
    try:
        with d.channel() as ch:
            if defect == "unserved-version":
                assert "v1.DRAPlugin" in get_info(d).supported_versions
                with pytest.raises(grpc.RpcError) as err:
                    prepare(ch)
                assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
                prepare(ch, pb=dra_v1beta1, pb_grpc=dra_v1beta1_grpc)
            else:
                with pytest.raises(grpc.RpcError) as err:
                    next(health_stream(ch))
                assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
        if defect == "split-health-socket":
            with insecure_unix_channel(str(d.plugin_dir / "health.sock")) as ch:
                stream = health_stream(ch)
                assert len(next(stream).devices) == 4
                stream.cancel()
    finally:
        d.stop()


def test_mutants_answer_claims_wrongly(tmp: Path, hw: DeviceBackend) -> None:
    refs = [("ns", str(uuid.uuid4()), f"c{i}") for i in range(3)]
    d = Driver(tmp, defect="drops-claims-in-batch").start()
    with d.channel() as ch:
        assert list(prepare(ch, *refs)) == [refs[0][1]]
    d.stop()
    d = Driver(tmp, defect="unprepare-unknown-errors").start()
    with d.channel() as ch:
        assert "not prepared" in unprepare(ch, refs[0])[refs[0][1]].error
    d.stop()


def test_mutants_that_die_or_stay_away(tmp: Path, hw: DeviceBackend) -> None:
    d = Driver(tmp, defect="dies-on-reject").start()
    with insecure_unix_channel(str(d.reg_socket)) as ch, pytest.raises(grpc.RpcError):
        reg_grpc.RegistrationStub(ch).NotifyRegistrationStatus(reg.RegistrationStatus(plugin_registered=False),
                                                               timeout=2.0)
    assert d.wait_exit() == 1
    # It crashed: its sockets are still there, and this mutant cannot live with that.
    assert d.reg_socket.exists()
    d = Driver(tmp, defect="stale-socket-crash").start(wait=False)
    assert d.wait_exit() == 1
    d.wait_log("address already in use")
    d = Driver(tmp, defect="no-reregister").start()  # the good path removes stale sockets
    d.reg_socket.unlink()
    d.wait_log("not recreating it")
    assert not d.reg_socket.exists()
    d.stop()
    d = Driver(tmp, defect="wrong-endpoint").start()
    assert get_info(d).endpoint == str(d.plugin_dir / "plugin.sock")
    d.stop()


# -- with an API server ----------------------------------------------------------


def wait_slices(client: Any, node: str, test: Callable[[list[dict]], bool], what: str) -> list[dict]:
    """The node's ResourceSlices once `test` holds, following an API watch."""
    path = f"{RESOURCE_API}/resourceslices?fieldSelector=spec.nodeName%3D{node}"
    items, rv = client.list_with_version(path)
    current = {s["metadata"]["name"]: s for s in items}
    deadline = time.monotonic() + WAIT_S
    while not test(list(current.values())):
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"expected {what}; slices: {json.dumps(list(current.values()))[:800]}"
        for event in client.watch(path, rv, remaining):
            obj = event["object"]
            rv = obj.get("metadata", {}).get("resourceVersion", rv)
            if event["type"] == "DELETED":
                current.pop(obj["metadata"]["name"], None)
            elif event["type"] in ("ADDED", "MODIFIED"):
                current[obj["metadata"]["name"]] = obj
            if test(list(current.values())):
                break
    return list(current.values())


def real_pod(client: Any, namespace: str) -> dict[str, str]:
    """A Pod object to reserve claims for: the resource-claim controller drops reservations of missing pods."""
    from harness.controlplane.scheduler import pod_body

    name = f"pod-{uuid.uuid4().hex[:6]}"
    pod = client.create(f"/api/v1/namespaces/{namespace}/pods", pod_body(namespace, name, {}))
    return {"name": name, "uid": pod["metadata"]["uid"]}


def remove_node_objects(client: Any, node: str) -> None:
    """What a test made for its node: the node's slices, its namespace, the node, its device class (any missing)."""
    for s in client.list(f"{RESOURCE_API}/resourceslices", field_selector=f"spec.nodeName={node}"):
        client.delete(f"{RESOURCE_API}/resourceslices/{s['metadata']['name']}")
    client.delete(f"/api/v1/namespaces/{node}")
    client.delete(f"/api/v1/nodes/{node}")
    client.delete(f"{RESOURCE_API}/deviceclasses/{node}-class")


def devices_of(slices: list[dict]) -> list[str]:
    return sorted(d["name"] for s in slices for d in s["spec"]["devices"])


def test_slices_prepare_and_restart(tmp: Path, hw: DeviceBackend, control_plane: Any) -> None:
    from harness.controlplane import Allocator

    client = control_plane.client()
    node = f"fakelet-{uuid.uuid4().hex[:8]}"
    alloc = Allocator(client)
    alloc.ensure_node(node)
    alloc.ensure_namespace(node)
    alloc.ensure_device_class(f"{node}-class", DRIVER)
    d = Driver(tmp, kubeconfig=str(control_plane.kubeconfig), node=node).start()
    try:
        slices = wait_slices(client, node, lambda s: len(devices_of(s)) == 4, "four devices")
        (s,) = slices
        assert s["spec"]["driver"] == DRIVER and s["spec"]["nodeName"] == node
        assert s["spec"]["pool"] == {"name": node, "generation": 1, "resourceSliceCount": 1}
        assert s["metadata"]["ownerReferences"][0]["kind"] == "Node"
        gpu0 = next(x for x in s["spec"]["devices"] if x["name"] == "gpu-0")
        assert gpu0["attributes"]["index"] == {"int": 0} and "string" in gpu0["attributes"]["uuid"]
        assert all(len(v) == 1 for v in gpu0["attributes"].values())

        pod = real_pod(client, node)
        claim = alloc.allocate(alloc.create_claim(node, "claim", f"{node}-class", 2), node, DRIVER, pod)
        ref = (node, claim["metadata"]["uid"], "claim")
        allocated = sorted(r["device"] for r in claim["status"]["allocation"]["devices"]["results"])
        bogus = (node, str(uuid.uuid4()), "no-such-claim")
        with d.channel() as ch:
            result = prepare(ch, ref, bogus)
            assert set(result) == {ref[1], bogus[1]} and "not found" in result[bogus[1]].error
            first = result[ref[1]]
            assert first.error == "" and sorted(x.device_name for x in first.devices) == allocated
            for x in first.devices:
                assert x.pool_name == node and list(x.request_names) == ["req-0"]
                assert list(x.cdi_device_ids) == [f"{DRIVER}/gpu={ref[1]}-{x.device_name}"]
            (spec_file,) = d.cdi_dir.iterdir()
            spec = json.loads(spec_file.read_text())
            assert spec["kind"] == f"{DRIVER}/gpu"
            assert sorted(x["name"] for x in spec["devices"]) == [f"{ref[1]}-{n}" for n in allocated]
            assert prepare(ch, ref)[ref[1]] == first  # idempotent
            assert prepare(ch, ref, pb=dra_v1beta1, pb_grpc=dra_v1beta1_grpc)[ref[1]].devices[0].device_name \
                == first.devices[0].device_name

        # A crash: sockets and checkpoint stay behind; the new process copes with both.
        d.stop(signal.SIGKILL)
        d.start()
        with d.channel() as ch:
            assert prepare(ch, ref)[ref[1]] == first
            assert unprepare(ch, ref)[ref[1]].error == ""
            assert list(d.cdi_dir.iterdir()) == []
            assert unprepare(ch, ref)[ref[1]].error == ""

        hw.unplug("gpu-3")
        slices = wait_slices(client, node, lambda s: "gpu-3" not in devices_of(s), "gpu-3 gone")
        assert [x["spec"]["pool"]["generation"] for x in slices] == [2]
        hw.plug("gpu-3")
        wait_slices(client, node, lambda s: "gpu-3" in devices_of(s), "gpu-3 back")
    finally:
        d.stop()
        remove_node_objects(client, node)


def test_the_empty_slice_mutant_publishes_its_pool_without_devices(tmp: Path, hw: DeviceBackend,
                                                                  control_plane: Any) -> None:
    from harness.controlplane import Allocator

    client = control_plane.client()
    node = f"fakelet-{uuid.uuid4().hex[:8]}"
    Allocator(client).ensure_node(node)
    d = Driver(tmp, kubeconfig=str(control_plane.kubeconfig), node=node, defect="empty-slice").start()
    try:
        slices = wait_slices(client, node, lambda s: len(s) == 1, "the pool's one slice")
        # The API server leaves an empty device list out of the object.
        assert not slices[0]["spec"].get("devices") and slices[0]["spec"]["pool"]["name"] == node
    finally:
        d.stop()
        remove_node_objects(client, node)


def test_claim_mutants(tmp: Path, hw: DeviceBackend, control_plane: Any) -> None:
    from harness.controlplane import AllocationError, Allocator

    client = control_plane.client()
    node = f"fakelet-{uuid.uuid4().hex[:8]}"
    alloc = Allocator(client)
    alloc.ensure_node(node)
    alloc.ensure_namespace(node)
    alloc.ensure_device_class(f"{node}-class", DRIVER)
    d = Driver(tmp, kubeconfig=str(control_plane.kubeconfig), node=node, defect="bad-slice").start()
    try:
        slices = wait_slices(client, node, lambda s: len(s) == 2, "two slices")
        assert sorted(devices_of(slices)).count("gpu-0") == 2  # a device name twice in one pool
        with pytest.raises(AllocationError, match="invalid resource pools"):  # as kube-scheduler refuses it
            alloc.allocate(alloc.create_claim(node, "refused", f"{node}-class"), node, DRIVER, real_pod(client, node))
        d.stop()
        d = Driver(tmp, kubeconfig=str(control_plane.kubeconfig), node=node).start()
        wait_slices(client, node, lambda s: len(s) == 1, "the pool in one slice again")
        claim = alloc.allocate(alloc.create_claim(node, "claim", f"{node}-class"), node, DRIVER,
                               real_pod(client, node))
        ref = (node, claim["metadata"]["uid"], "claim")
        d.stop()
        for defect, check in (
            ("wrong-cdi-id", lambda r, again: "/" not in r.devices[0].cdi_device_ids[0]),
            ("non-idempotent-prepare", lambda r, again: r.error == "" and "already prepared" in again.error),
        ):
            d = Driver(tmp, kubeconfig=str(control_plane.kubeconfig), node=node, defect=defect).start()
            with d.channel() as ch:
                first, again = prepare(ch, ref)[ref[1]], prepare(ch, ref)[ref[1]]
                assert check(first, again), (defect, first, again)
                unprepare(ch, ref)
            d.stop()
    finally:
        d.stop()
        remove_node_objects(client, node)
