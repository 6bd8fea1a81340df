"""The DRA relay: fakelet on the wire between any kubelet and a DRA driver, recording both sides.

The driver keeps its plugins_registry and plugins directories (the sandbox's); the kubelet gets directories
of its own. The relay makes them one for what the kubelet reads:

- every socket the driver creates in its registry directory appears, at the same name, in the kubelet's,
  served by the relay and forwarding the pluginregistration v1 Registration service to the driver's; the
  driver deleting it deletes the kubelet's copy (the kubelet's plugin watcher deregisters the driver), and
  the kubelet's copy going away deletes the driver's;
- GetInfo's `endpoint` is rewritten to a relay socket in the kubelet's plugins directory, named as the
  kubelet sees it (/var/lib/kubelet/plugins/<the same path under plugins as the driver's endpoint>), which
  forwards the DRA services (v1 and v1beta1 DRAPlugin, v1 and v1alpha1 DRAResourceHealth) to the driver's
  real endpoint, translated from the driver's view (its sandbox path, or /var/lib/kubelet/... inside its
  mount namespace). The message is re-encoded for that one field; every other call passes as raw bytes.
  The endpoint's directory is watched too: the driver's socket deleted (an rm, as a scenario's `socket:
  {delete: service}` does) deletes the kubelet's copy, the kubelet's open connections going on as they do to
  a deleted socket whose server runs; the driver serving there again puts a new copy in place.

The one-connection rule (DRA-REG-04): every relay socket keeps the kubelet's connections as they are
(perconn.py). Each connection the kubelet opens gets one upstream connection of its own to the driver, made
when the kubelet's is accepted and closed when it closes; a driver closing its end closes the kubelet's.
So the driver sees exactly as many connections as the kubelet opened (one per registration, serving the DRA
calls and the health stream alike), and `relay.connection` events count them.

What crosses is put on the timeline with the event kinds the fake kubelet's plugin watcher and DRA manager
write (`pluginwatcher.found`, `pluginwatcher.getinfo`, `pluginwatcher.notify`, `pluginwatcher.registered`,
`pluginwatcher.rejected`, `dra.registered`, `dra.rejected`, `dra.prepare`, `dra.unprepare`,
`dra.health_stream`, `dra.health`, `grpc.call`), marked `relay=True`, each naming the driver's own paths
(`socket`, `endpoint`) so that a check reads either kubelet alike. What the wire does not show (a
deregistration, the connection's state, the start-up ResourceSlice wipe) the real kubelet's log says
(harness/node/real/localnode.py LOG_EVENTS).
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from harness.instruments.dials import OK, endpoint_ids, record_dial
from harness.instruments.faults import FaultPlan
from harness.instruments.filewatch import is_socket
from harness.instruments.interceptors import to_dict
from harness.instruments.timeline import Timeline
from harness.kubelet.drahealth import HEALTHY, UNHEALTHY, UNKNOWN, DeviceHealth, HealthInfoCache, truncate_message
from harness.kubelet.dramanager import results_to_dict
from harness.kubelet.endpoint import _LOCAL_DEADLINE_DETAILS
from harness.kubelet.pluginwatcher import DRA_PLUGIN
from harness.node.relay.forward import Method, Outcome, decode, forward_stream, forward_unary, hold_answer
from harness.node.relay.mirror import CREATED, DELETED, DirMirror
from harness.node.relay.perconn import Connection, PerConnectionRelay
from harness.spec.profiles import DRA_HEALTH_TIMEOUT_S
from harness.wire import dra_v1, dra_v1beta1, drahealth_v1, drahealth_v1alpha1, reg

DRIVER, KUBELET = "driver", "kubelet"
REGISTRATION_SERVICE = "pluginregistration.Registration"
REGISTRATION = [
    Method(REGISTRATION_SERVICE, "GetInfo", reg.InfoRequest, reg.PluginInfo),
    Method(REGISTRATION_SERVICE, "NotifyRegistrationStatus", reg.RegistrationStatus, reg.RegistrationStatusResponse),
]
# service -> the short version the fake kubelet's events name (versions.py SERVICE_SHORT, HEALTH_SHORT)
DRA_SERVICES = {f"{dra_v1.DESCRIPTOR.package}.DRAPlugin": ("v1", dra_v1),
                f"{dra_v1beta1.DESCRIPTOR.package}.DRAPlugin": ("v1beta1", dra_v1beta1),
                "v1alpha3.Node": ("v1alpha3", dra_v1beta1)}  # 1.32/1.33's v1alpha4 API: v1beta1's messages
HEALTH_SERVICES = {"v1.DRAResourceHealth": ("v1", drahealth_v1),
                   "v1alpha1.DRAResourceHealth": ("v1alpha1", drahealth_v1alpha1)}
DRA_METHODS = [
    *(Method(service, name, request, response)
      for service, (_, mod) in DRA_SERVICES.items()
      for name, request, response in (
          ("NodePrepareResources", mod.NodePrepareResourcesRequest, mod.NodePrepareResourcesResponse),
          ("NodeUnprepareResources", mod.NodeUnprepareResourcesRequest, mod.NodeUnprepareResourcesResponse))),
    *(Method(service, "NodeWatchResources", mod.NodeWatchResourcesRequest, mod.NodeWatchResourcesResponse,
             streams=True) for service, (_, mod) in HEALTH_SERVICES.items()),
]
# operation_generator.go GenerateRegisterPluginFunc: the status a failed handler RegisterPlugin is notified with.
REGISTRATION_FAILED = "RegisterPlugin error -- plugin registration failed with err: "
# A kubelet cancel this close to the call's deadline is the deadline: the deadline travels as the time that
# remained when the kubelet sent the call, so the relay's copy ends later by the call's transit.
DEADLINE_SLACK_S = 0.25
RELAY_DIR = "fakelet-relay"  # under the kubelet's plugins dir: endpoints the driver put outside its plugins dir
ENDPOINT_DIR = "endpoints:"  # a DirMirror side: a directory of the driver's endpoints, by its path after this



def go_outcome(done: Outcome, context: grpc.ServicerContext | None = None) -> str:
    """"OK", or Go's %v of the gRPC error the kubelet got (endpoint.go_status), from the relay's record."""
    if done.outcome == "OK":
        return "OK"
    if done.cancelled_by_caller:
        remaining = context.time_remaining() if context is not None else None
        if remaining is not None and remaining <= DEADLINE_SLACK_S:
            # The kubelet's own deadline ended the call (GetInfo's 1 s): it saw its context's deadline. Its
            # cancel arrives a moment before the relay's copy of that deadline, which started when the call
            # reached the relay.
            return "rpc error: code = DeadlineExceeded desc = context deadline exceeded"
        return "rpc error: code = Canceled desc = context canceled"
    code, _, details = done.outcome.partition(": ")
    name = "Canceled" if code == "CANCELLED" else "".join(w.capitalize() for w in code.split("_"))
    if code == "DEADLINE_EXCEEDED" and details in _LOCAL_DEADLINE_DETAILS:
        details = "context deadline exceeded"  # the kubelet's own deadline, passed on, fired
    return f"rpc error: code = {name} desc = {details}"


def answer(done: Outcome, context: grpc.ServicerContext, response: bytes | None = None) -> bytes:
    """The caller's answer: the bytes that came back, or the far side's status."""
    if done.outcome != "OK" and not done.cancelled_by_caller:
        code = context.code() if hasattr(context, "code") else None
        _, _, details = done.outcome.partition(": ")
        context.abort(code or grpc.StatusCode.UNKNOWN, details)
    return response if response is not None else (done.response or b"")


def health_name(value: int) -> str:
    """drahealth.py _status (manager.go toDeviceHealthStatus): anything but HEALTHY/UNHEALTHY is Unknown."""
    return {1: HEALTHY, 2: UNHEALTHY}.get(value, UNKNOWN)


# What a dial of a socket nobody serves ends with in grpc-go (the kubelet's client): its connection error.
DIAL_REFUSED = "connection refused"


@dataclass
class _Endpoint:
    """The kubelet's view of one endpoint a driver named: a relay socket in the kubelet's plugins dir."""

    named: str  # as the driver named it in GetInfo
    kubelet_path: str  # as the kubelet dials it
    local: Path  # the same socket, where the relay put it
    relay: PerConnectionRelay
    driver: str = ""  # the driver that last registered it
    driver_path: Path | None = None  # the driver's socket, as the relay reaches it (its deletion is mirrored)
    linked: bool = True  # the kubelet's copy is in place (gone while the driver's socket is)


@dataclass
class _Registration:
    name: str
    relay: PerConnectionRelay
    retired: list[PerConnectionRelay] = field(default_factory=list)


class DRARelay:
    """The relay for one driver's registry and plugins dirs and one kubelet's (see the module's docstring)."""

    def __init__(self, timeline: Timeline, driver_registry: Path, driver_plugins: Path, kubelet_registry: Path,
                 kubelet_plugins: Path, kubelet_plugins_view: str, state_dir: Path,
                 kubelet_instance: Callable[[], int], translate: Callable[[str], str] | None = None,
                 faults: Callable[[], FaultPlan | None] | None = None) -> None:
        """`kubelet_plugins_view`: where the kubelet sees `kubelet_plugins` (/var/lib/kubelet/plugins);
        `translate`: a path the driver names (its mount namespace's view) -> the relay's; `faults`: the running
        kubelet instance's fault plan on the wire (the device-plugin relay's, one per kubelet instance and closed
        when it stops), whose holds keep the driver's NodePrepareResources or NodeUnprepareResources answer from
        the kubelet."""
        self.timeline = timeline
        self.driver_registry, self.driver_plugins = Path(driver_registry), Path(driver_plugins)
        self.kubelet_registry, self.kubelet_plugins = Path(kubelet_registry), Path(kubelet_plugins)
        self.kubelet_plugins_view = kubelet_plugins_view.rstrip("/")
        self.state_dir, self.kubelet_instance = Path(state_dir), kubelet_instance
        self.translate = translate or (lambda path: path)
        self.faults = faults or (lambda: None)
        self._lock = threading.RLock()
        self._registrations: dict[str, _Registration] = {}
        self._retired: list[PerConnectionRelay] = []
        self._endpoints: dict[str, _Endpoint] = {}
        self._endpoint_dirs: set[Path] = set()  # the driver's endpoint directories the mirror watches
        self._health: dict[str, dict[str, str]] = {}  # driver -> "pool/device" -> health, as the kubelet's cache
        # The same, with the kubelet's receive times and timeouts (healthinfo.go getHealthInfo): what the real
        # kubelet holds for each device, read by the scenarios' device_health.
        self.health_cache = HealthInfoCache(None, DRA_HEALTH_TIMEOUT_S, timeline, observe_timeouts=False)
        self._serial = itertools.count(1)
        self._closed = False
        self.mirror: DirMirror | None = None

    # -- lifecycle ------------------------------------------------------------------------------------

    def start(self) -> DRARelay:
        for path in (self.driver_registry, self.driver_plugins, self.kubelet_registry, self.kubelet_plugins,
                     self.state_dir):
            path.mkdir(parents=True, exist_ok=True)
        self.mirror = DirMirror({DRIVER: self.driver_registry, KUBELET: self.kubelet_registry}, self._on_change,
                                name="relay-dra-mirror").start()
        with self._lock:
            for entry in sorted(os.scandir(self.driver_registry), key=lambda e: e.name):
                if is_socket(Path(entry.path)):
                    self._open_registration(entry.name)
        self.timeline.record("relay.start", "relay", relays="dra", driver_registry=str(self.driver_registry),
                             kubelet_registry=str(self.kubelet_registry))
        return self

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if self.mirror is not None:
            self.mirror.stop()  # outside the lock: its thread may be waiting for it, to find the relay closed
        with self._lock:
            relays = [r.relay for r in self._registrations.values()] + self._retired
            relays += [e.relay for e in self._endpoints.values()]
            for name in self._registrations:
                (self.kubelet_registry / name).unlink(missing_ok=True)
            for endpoint in self._endpoints.values():
                endpoint.local.unlink(missing_ok=True)
            self._registrations.clear()
            self._endpoints.clear()
        for relay in relays:
            relay.close()
        self.timeline.record("relay.stop", "relay", relays="dra")

    # -- the two registry directories as one ------------------------------------------------------------

    def _on_change(self, side: str, name: str, what: str) -> None:
        with self._lock:
            if self._closed:
                return
            if side.startswith(ENDPOINT_DIR):
                self._endpoint_changed(Path(side.removeprefix(ENDPOINT_DIR)) / name, what)
            elif side == DRIVER:
                if what == CREATED and is_socket(self.driver_registry / name):
                    if name in self._registrations:  # re-created without our seeing it go: a new socket
                        self._drop_registration(name, None, "the driver replaced its socket")
                    self._open_registration(name)
                elif what == DELETED and name in self._registrations:
                    self._drop_registration(name, KUBELET, "the driver deleted its socket")
            elif what == DELETED and name in self._registrations:
                self._drop_registration(name, DRIVER, "the kubelet's copy was deleted")

    def _unlink(self, side: str, name: str) -> None:
        directory = self.driver_registry if side == DRIVER else self.kubelet_registry
        if os.path.lexists(directory / name):
            assert self.mirror is not None
            self.mirror.expect_echo(side, name, DELETED)
            try:
                (directory / name).unlink()
            except FileNotFoundError:
                pass

    def _open_registration(self, name: str) -> None:
        relay = PerConnectionRelay(
            self.state_dir, f"reg-{next(self._serial)}", lambda: str(self.driver_registry / name),
            [*REGISTRATION, *DRA_METHODS],
            lambda conn, m, raw, ctx: self._registry_unary(name, conn, m, raw, ctx),
            lambda conn, m, raw, ctx: self._stream(conn, conn.state.get("info", {}).get("name", ""), m, raw, ctx),
            lambda conn, what, upstream: self._connection(conn, what, upstream, "registration"))
        # Linked into place: the socket appears in the kubelet's directory already listening, as a
        # driver's does once it serves.
        self._unlink(KUBELET, name)
        assert self.mirror is not None
        self.mirror.expect_echo(KUBELET, name, CREATED)
        os.link(relay.path, self.kubelet_registry / name)
        relay.path.unlink()
        self._registrations[name] = _Registration(name, relay)
        self.timeline.record("relay.mirror", "relay", name=name, what="created", side=KUBELET)
        # The kubelet's plugin watcher finds it now (inotify); a real kubelet does not log that.
        self.timeline.record("pluginwatcher.found", "pluginwatcher", socket=str(self.driver_registry / name),
                             relay=True)

    def _drop_registration(self, name: str, side: str | None, why: str) -> None:
        registration = self._registrations.pop(name)
        # The kubelet's connection in flight (a registration) goes on until it closes.
        registration.relay.stop_accepting()
        self._retired.append(registration.relay)
        if side is not None:
            self._unlink(side, name)
        self.timeline.record("relay.mirror", "relay", name=name, what="deleted", side=side or KUBELET, why=why)

    # -- connections --------------------------------------------------------------------------------------

    def _connection(self, conn: Connection | None, what: str, upstream: str, role: str) -> None:
        instance = self.kubelet_instance()
        self.timeline.record("relay.connection", "relay", role=role, what=what, upstream=upstream,
                             number=conn.number if conn is not None else None, instance=instance)
        if what in ("opened", "refused"):
            # The kubelet's dial, as the fake kubelet records its own and the DP relay the kubelet's: a scenario's
            # `dialed` reads both kubelets alike, naming the driver's socket (upstream), not the relay's copy.
            record_dial(self.timeline, upstream, instance, next(endpoint_ids),
                        OK if what == "opened" else DIAL_REFUSED)

    # -- the registration service -------------------------------------------------------------------------

    def _registry_unary(self, name: str, conn: Connection, method: Method, raw: bytes,
                        context: grpc.ServicerContext) -> bytes:
        if method.service != REGISTRATION_SERVICE:
            # The driver gave no endpoint: the kubelet calls the DRA service on the registration socket.
            info = conn.state.get("info", {})
            return self._dra_unary(conn, info.get("name", ""), str(self.driver_registry / name), method, raw,
                                   context)
        if method.name == "GetInfo":
            return self._get_info(name, conn, method, raw, context)
        return self._notify(name, conn, method, raw, context)

    def _get_info(self, name: str, conn: Connection, method: Method, raw: bytes,
                  context: grpc.ServicerContext) -> bytes:
        socket = str(self.driver_registry / name)
        done = forward_unary(conn.channel, method, raw, context)
        base = {"socket": socket, "instance": self.kubelet_instance(), "relay": True}
        info = decode(reg.PluginInfo, done.response) if done.outcome == "OK" else None
        if info is None:
            # An answer that does not parse fails the kubelet's own unmarshalling: an Internal error.
            unparsable = "rpc error: code = Internal desc = grpc: failed to unmarshal the received message"
            outcome = go_outcome(done, context) if done.outcome != "OK" else unparsable
            self.timeline.record("pluginwatcher.getinfo", "pluginwatcher", outcome=outcome, **base)
            return answer(done, context)
        versions = list(info.supported_versions)
        kubelet_endpoint = self._endpoint_for(info.endpoint, info.name) if info.endpoint else ""
        conn.state["info"] = {"type": info.type, "name": info.name, "endpoint": info.endpoint or socket,
                              "kubelet_endpoint": kubelet_endpoint, "versions": versions}
        self.timeline.record("pluginwatcher.getinfo", "pluginwatcher", outcome="OK", type=info.type, name=info.name,
                             endpoint=info.endpoint, kubelet_endpoint=kubelet_endpoint, versions=versions, **base)
        if not info.endpoint:
            return answer(done, context)
        info.endpoint = kubelet_endpoint
        return answer(done, context, info.SerializeToString())

    def _notify(self, name: str, conn: Connection, method: Method, raw: bytes, context: grpc.ServicerContext) -> bytes:
        status = decode(reg.RegistrationStatus, raw) or reg.RegistrationStatus()
        info = conn.state.get("info", {})
        socket = str(self.driver_registry / name)
        base = {"instance": self.kubelet_instance(), "relay": True}
        driver, endpoint, versions = info.get("name", ""), info.get("endpoint", socket), info.get("versions", [])
        is_dra = info.get("type") == DRA_PLUGIN
        if status.plugin_registered and is_dra:
            # The kubelet's handler registered the driver before it notifies (operation_generator.go), so the
            # registration goes on the timeline before the driver hears of it, as the fake kubelet's does.
            self.timeline.record("dra.registered", "kubelet", driver=driver, endpoint=endpoint,
                                 kubelet_endpoint=info.get("kubelet_endpoint", ""), versions=versions, real=True,
                                 **base)
        done = forward_unary(conn.channel, method, raw, context)
        ok = done.outcome == "OK"
        code, _, details = done.outcome.partition(": ")
        self.timeline.record("pluginwatcher.notify", "pluginwatcher", registered=status.plugin_registered,
                             code="OK" if ok else code, details="" if ok else details, **base)
        described = {"socket": socket, "type": info.get("type"), "name": driver}
        if status.plugin_registered and ok:
            self.timeline.record("pluginwatcher.registered", "pluginwatcher", endpoint=endpoint, versions=versions,
                                 **described, **base)
        elif status.plugin_registered:
            # operation_generator.go: a failed notify deregisters the plugin again.
            self.timeline.record("pluginwatcher.deregistered", "pluginwatcher", why="notify failed", **described,
                                 **base)
            if is_dra:
                self.timeline.record("dra.deregistered", "kubelet", driver=driver, endpoint=endpoint,
                                     why="notify failed", real=True, **base)
        else:
            self.timeline.record("pluginwatcher.rejected", "pluginwatcher", socket=socket, error=status.error,
                                 notified=status.error, **base)
            if is_dra and status.error.startswith(REGISTRATION_FAILED):
                self.timeline.record("dra.rejected", "kubelet", driver=driver, endpoint=endpoint,
                                     error=status.error.removeprefix(REGISTRATION_FAILED), real=True, **base)
        return answer(done, context)

    # -- the driver's endpoints, in the kubelet's plugins directory -----------------------------------------

    def _endpoint_for(self, named: str, driver: str) -> str:
        """The path the kubelet is to dial for the endpoint the driver named (a relay socket, made once)."""
        with self._lock:
            endpoint = self._endpoints.get(named)
            if endpoint is not None:
                endpoint.driver = driver
                if not endpoint.linked and endpoint.driver_path is not None:
                    self._endpoint_changed(endpoint.driver_path, CREATED)  # made again before the watch said so
                return endpoint.kubelet_path
            number = next(self._serial)
            driver_path = Path(self.translate(named))
            try:
                relative = str(driver_path.relative_to(self.driver_plugins))
            except ValueError:
                relative = f"{RELAY_DIR}/endpoint-{number}.sock"  # outside the plugins dir: a place of our own
            local = self.kubelet_plugins / relative
            local.parent.mkdir(parents=True, exist_ok=True)
            holder: dict[str, _Endpoint] = {}
            relay = self._endpoint_relay(named, holder)
            local.unlink(missing_ok=True)
            os.link(relay.path, local)
            relay.path.unlink()
            holder["ep"] = endpoint = _Endpoint(named, f"{self.kubelet_plugins_view}/{relative}", local, relay, driver,
                                                driver_path)
            self._endpoints[named] = endpoint
            self._watch_endpoint_dir(driver_path.parent)
            self.timeline.record("relay.endpoint", "relay", driver=driver, endpoint=named,
                                 kubelet_endpoint=endpoint.kubelet_path)
            return endpoint.kubelet_path

    def _endpoint_relay(self, named: str, holder: dict[str, _Endpoint]) -> PerConnectionRelay:
        """A relay socket forwarding the DRA services to the endpoint the driver named (holder["ep"]: its record)."""
        return PerConnectionRelay(
            self.state_dir, f"ep-{next(self._serial)}", lambda: self.translate(named), DRA_METHODS,
            lambda conn, m, raw, ctx: self._dra_unary(conn, holder["ep"].driver, named, m, raw, ctx),
            lambda conn, m, raw, ctx: self._stream(conn, holder["ep"].driver, m, raw, ctx),
            lambda conn, what, upstream: self._connection(conn, what, upstream, "endpoint"))

    def _watch_endpoint_dir(self, directory: Path) -> None:
        """Follow the driver's endpoint sockets in `directory` (its plugins/<driver>), as the registry is followed:
        an endpoint the driver's side loses (an rm, a restart) goes from the kubelet's side too."""
        if directory == self.driver_registry or directory in self._endpoint_dirs or self.mirror is None:
            return  # the registry is watched as the driver's side already
        try:
            self.mirror.watch(ENDPOINT_DIR + str(directory), directory)
        except OSError as err:
            self.timeline.record("relay.error", "relay", what="watch endpoint directory", path=str(directory),
                                 error=str(err))
            return
        self._endpoint_dirs.add(directory)

    def _endpoint_changed(self, path: Path, what: str) -> None:
        """The driver's endpoint socket at `path` deleted, or made again: the kubelet's copy goes and comes with it,
        as one directory's socket would. Connections the kubelet has open go on, as they do to a socket deleted
        under a server that still runs; the kubelet's next dial finds nothing until the driver serves again."""
        for endpoint in self._endpoints.values():
            if endpoint.driver_path != path:
                continue
            if what == DELETED and endpoint.linked:
                endpoint.linked = False
                endpoint.relay.stop_accepting()
                endpoint.local.unlink(missing_ok=True)
                self.timeline.record("relay.mirror", "relay", name=path.name, what="deleted", side=KUBELET,
                                     why="the driver's endpoint was deleted", kubelet_endpoint=endpoint.kubelet_path)
            elif what == CREATED and not endpoint.linked and is_socket(path):
                self._retired.append(endpoint.relay)  # its connections still open close with the relay
                holder = {"ep": endpoint}
                endpoint.relay = self._endpoint_relay(endpoint.named, holder)
                endpoint.local.unlink(missing_ok=True)
                os.link(endpoint.relay.path, endpoint.local)
                endpoint.relay.path.unlink()
                endpoint.linked = True
                self.timeline.record("relay.mirror", "relay", name=path.name, what="created", side=KUBELET,
                                     kubelet_endpoint=endpoint.kubelet_path)

    def _dra_unary(self, conn: Connection, driver: str, endpoint: str, method: Method, raw: bytes,
                   context: grpc.ServicerContext) -> bytes:
        faults, t0 = self.faults(), time.monotonic()  # the plan of the kubelet instance that made the call
        done = forward_unary(conn.channel, method, raw, context)
        if faults is not None:
            hold_answer(faults, method.name, context, done, t0)
        request, response = decode(method.request, raw), decode(method.response, done.response)
        base = {"relay": True, "connection": conn.number}
        self.timeline.record("grpc.call", "kubelet", side="client", method=method.name, request=to_dict(request),
                             response=to_dict(response), outcome=done.outcome, duration_s=done.duration_s, **base)
        unprepare = method.name == "NodeUnprepareResources"
        ok = done.outcome == "OK" and response is not None
        claims = [c.uid for c in request.claims] if request is not None else []  # type: ignore[attr-defined]
        self.timeline.record("dra.unprepare" if unprepare else "dra.prepare", "kubelet",
                             outcome="OK" if ok else go_outcome(done, context),
                             results=results_to_dict(response, unprepare) if ok else {},
                             duration_s=done.duration_s, driver=driver, endpoint=endpoint,
                             service_version=DRA_SERVICES[method.service][0], claims=claims, via="pod",
                             instance=self.kubelet_instance(), **base)
        return answer(done, context)

    def _stream(self, conn: Connection, driver: str, method: Method, raw: bytes,
                context: grpc.ServicerContext) -> Iterator[bytes]:
        version = HEALTH_SERVICES[method.service][0]
        base = {"relay": True, "connection": conn.number}
        self.timeline.record("grpc.stream_open", "kubelet", side="client", method=method.name, **base)
        self.timeline.record("dra.health_stream", "kubelet", driver=driver, state="open", version=version,
                             error=None, **base)
        done = Outcome()
        received = [0]

        def on_message(message: bytes) -> None:
            received[0] += 1
            self._health_message(driver, version, decode(method.response, message), base)

        try:
            yield from forward_stream(conn.channel, method, raw, context, on_message, done)
        finally:
            with self._lock:
                cleared = sorted(self._health.pop(driver, {}))
            # manager.go HandleWatchResourcesStream: any stream's exit clears the whole driver (its other
            # endpoints' too: kubernetes/kubernetes#140818), and posts no pod.
            self.health_cache.clear_driver(driver)
            if done.cancelled_by_caller:
                error: str = "context canceled"  # the kubelet cancelled it (deregistration, its stop)
            else:
                error = "EOF" if done.outcome == "OK" else go_outcome(done)
            self.timeline.record("dra.health_stream", "kubelet", driver=driver, state="ended", version=version,
                                 error=error, messages=received[0], cleared=cleared, **base)

    def _health_message(self, driver: str, version: str, message: Any, base: dict[str, Any]) -> None:
        if message is None:
            return
        devices = []
        for d in message.devices:
            timeout = d.health_check_timeout_seconds
            devices.append({"pool": d.device.pool_name, "device": d.device.device_name,
                            "health": health_name(d.health), "reason": d.message,
                            "timeout_s": float(timeout) if timeout > 0 else 0.0})
        with self._lock:
            known = self._health.setdefault(driver, {})
            changed = [f"{d['pool']}/{d['device']}" for d in devices
                       if known.get(f"{d['pool']}/{d['device']}") != d["health"]]
            known.update({f"{d['pool']}/{d['device']}": d["health"] for d in devices})
        self.health_cache.update(driver, [DeviceHealth(d["pool"], d["device"], d["health"], timeout_s=d["timeout_s"],
                                                       message=truncate_message(d["reason"])) for d in devices])
        self.timeline.record("dra.health", "kubelet", driver=driver, version=version, devices=devices,
                             changed=changed, **base)


__all__ = ["DRARelay"]
