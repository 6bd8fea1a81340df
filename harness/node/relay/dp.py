"""The device-plugin relay: fakelet on the wire between any kubelet and a device plugin, recording both sides.

The plugin and the kubelet each get a device-plugins directory of their own; the relay makes them one:

- every socket the plugin creates in its directory appears, at the same name, in the kubelet's, served by the
  relay and forwarding to the plugin's; the plugin deleting its socket deletes the kubelet's copy, and the
  kubelet deleting a socket (its start deletes every one) deletes the plugin's;
- while the kubelet's `kubelet.sock` exists the plugin's directory has one too, served by the relay and
  forwarding Register to the kubelet's; the kubelet's files (its checkpoint) are copied across.

So endpoint names need no rewriting, and the plugin sees what it would see on a direct connection, later by
the relay's latency. Everything that crosses is put on the timeline with the event kinds the fake kubelet
writes (`kubelet.register_received`, `kubelet.register`, `kubelet.dial`, `grpc.call`, `grpc.stream_open`,
`grpc.stream_msg`, `kubelet.stream_end`), marked `relay=True`, so the checks read either kubelet alike.
"""

from __future__ import annotations

import itertools
import os
import shutil
import stat
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from harness.instruments.answers import Answers
from harness.instruments.dials import endpoint_ids, record_dial
from harness.instruments.faults import FaultPlan
from harness.instruments.filewatch import is_socket
from harness.instruments.grpcutil import KUBELET_MAX_RECV_BYTES, status_of
from harness.instruments.interceptors import to_dict
from harness.instruments.timeline import Timeline
from harness.kubelet.devicemanager import KUBELET_SOCKET, go_join, probe_listening
from harness.kubelet.endpoint import record_over_limit
from harness.node.relay.forward import (
    Method,
    MethodTable,
    Outcome,
    decode,
    forward_stream,
    forward_unary,
    hold_answer,
    raw_channel,
    raw_server,
)
from harness.node.relay.mirror import CREATED, DELETED, DirMirror
from harness.wire import dp

PLUGIN, KUBELET = "plugin", "kubelet"
SERVER_STOP_S = 5.0
# The kubelet's Register errors for a failed dial or GetDevicePluginOptions inside it (devicemanager
# plugin/v1beta1 client.go errFailedToDialDevicePlugin; manager.go PluginConnected).
KUBELET_CALL_ERRORS = ("failed to dial device plugin", "failed to get device plugin options")
REGISTER = Method("v1beta1.Registration", "Register", dp.RegisterRequest, dp.Empty)
DEVICE_PLUGIN = [
    Method("v1beta1.DevicePlugin", "GetDevicePluginOptions", dp.Empty, dp.DevicePluginOptions),
    Method("v1beta1.DevicePlugin", "ListAndWatch", dp.Empty, dp.ListAndWatchResponse, streams=True),
    Method("v1beta1.DevicePlugin", "GetPreferredAllocation", dp.PreferredAllocationRequest,
           dp.PreferredAllocationResponse),
    Method("v1beta1.DevicePlugin", "Allocate", dp.AllocateRequest, dp.AllocateResponse),
    Method("v1beta1.DevicePlugin", "PreStartContainer", dp.PreStartContainerRequest, dp.PreStartContainerResponse),
]



@dataclass
class _Pending:
    """A Register on its way through: what the kubelet's calls inside it showed."""

    endpoint_id: int
    resource: str
    options_call: dict[str, Any] | None = None
    served_options: dict[str, Any] | None = None


@dataclass
class _Endpoint:
    """The relay's socket for one plugin socket name, in the kubelet's directory."""

    name: str
    server: grpc.Server
    channel: grpc.Channel
    endpoint_id: int = 0  # the registration the kubelet's calls belong to (the latest through this name)
    resource: str = ""
    dialed_for: set[int] = field(default_factory=set)  # registrations whose dial is recorded

    def adopt(self, pending: _Pending) -> None:
        """The kubelet's calls through this socket belong to the registration on its way through."""
        self.endpoint_id, self.resource = pending.endpoint_id, pending.resource


class DevicePluginRelay:
    """The relay for one plugin directory and one kubelet directory (see the module's docstring)."""

    def __init__(self, timeline: Timeline, plugin_dir: Path, kubelet_dir: Path, state_dir: Path,
                 kubelet_instance: Callable[[], int]) -> None:
        self.timeline, self.plugin_dir, self.kubelet_dir = timeline, Path(plugin_dir), Path(kubelet_dir)
        self.state_dir, self.kubelet_instance = Path(state_dir), kubelet_instance
        self._lock = threading.RLock()
        self._endpoints: dict[str, _Endpoint] = {}
        self._in_flight: dict[str, _Pending] = {}  # Registers on their way through, by endpoint name
        self._retired: list[grpc.Server] = []  # still serving calls in flight; stopped at close
        self._channels: list[grpc.Channel] = []
        self._registration: grpc.Server | None = None
        self._kubelet_channel: grpc.Channel | None = None
        # Regular files kept the same on both sides (the kubelet's checkpoint above all): a plugin that writes or
        # deletes one does it to the kubelet's, as it would on a direct connection.
        self._copies: set[str] = set()
        # Faults on the wire, per kubelet instance as the fake kubelet's (a rejected or held Register, a held
        # answer to a call the kubelet made: Allocate here, the DRA calls in the DRA relay, which reads this plan):
        # the plan armed for the next kubelet.sock, and the one its registration socket and endpoints apply.
        self._next_faults: FaultPlan | None = None
        self.faults = FaultPlan(timeline, "kubelet")
        self._calls = itertools.count(1)
        self._answers = Answers()
        self._serial = itertools.count(1)
        self._closed = False
        self.mirror: DirMirror | None = None

    # -- lifecycle ------------------------------------------------------------------------------------

    def start(self) -> DevicePluginRelay:
        for path in (self.plugin_dir, self.kubelet_dir, self.state_dir):
            path.mkdir(parents=True, exist_ok=True)
        self.mirror = DirMirror({PLUGIN: self.plugin_dir, KUBELET: self.kubelet_dir}, self._on_change).start()
        with self._lock:
            for entry in sorted(os.scandir(self.plugin_dir), key=lambda e: e.name):
                if entry.name != KUBELET_SOCKET and is_socket(Path(entry.path)):
                    self._open_endpoint(entry.name)
            if is_socket(self.kubelet_dir / KUBELET_SOCKET):
                self._serve_registration()
        self.timeline.record("relay.start", "relay", relays="device-plugin", plugin_dir=str(self.plugin_dir),
                             kubelet_dir=str(self.kubelet_dir))
        return self

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if self.mirror is not None:
            self.mirror.stop()  # outside the lock: its thread may be waiting for it, to find the relay closed
        with self._lock:
            servers = [e.server for e in self._endpoints.values()] + self._retired
            servers += [self._registration] if self._registration is not None else []
            for name in list(self._endpoints):
                (self.kubelet_dir / name).unlink(missing_ok=True)
            self._endpoints.clear()
            self._registration = None
        for server in servers:
            server.stop(grace=0).wait(SERVER_STOP_S)
        for channel in self._channels:
            channel.close()
        self.timeline.record("relay.stop", "relay", relays="device-plugin")

    def arm(self) -> FaultPlan:
        """The fault plan of the next kubelet instance's registration socket (armed before it starts)."""
        with self._lock:
            self._next_faults = FaultPlan(self.timeline, "kubelet")
            return self._next_faults

    def kubelet_stopped(self) -> None:
        """The kubelet process is gone: the plugin's kubelet.sock stays, and refuses connections, as the dead
        kubelet's does; a Register held on the wire goes on, to the dead socket."""
        with self._lock:
            server, self._registration = self._registration, None
        self.faults.close()
        if server is not None:
            self._answers.flush()
            server.stop(grace=0).wait(SERVER_STOP_S)

    # -- the two directories as one -------------------------------------------------------------------

    def _on_change(self, side: str, name: str, what: str) -> None:
        with self._lock:
            if self._closed:
                return
            if side == PLUGIN:
                self._plugin_changed(name, what)
            else:
                self._kubelet_changed(name, what)

    def _plugin_changed(self, name: str, what: str) -> None:
        if name == KUBELET_SOCKET:
            return  # the relay's own
        if name in self._copies or (what != DELETED and not name.startswith(".") and self._is_file(PLUGIN, name)):
            self._file_changed(PLUGIN, name, what)
            return
        if what == CREATED and is_socket(self.plugin_dir / name):
            if name not in self._endpoints:
                self._open_endpoint(name)
        elif what == DELETED and name in self._endpoints:
            self._drop_endpoint(name, KUBELET, "the plugin deleted its socket")

    def _kubelet_changed(self, name: str, what: str) -> None:
        if name == KUBELET_SOCKET:
            if what == CREATED and is_socket(self.kubelet_dir / name):
                self._serve_registration()
            elif what == DELETED:
                self._stop_registration(unlink=True)
            return
        if name in self._endpoints and what == DELETED:
            self._drop_endpoint(name, PLUGIN, "the kubelet deleted the socket")
        elif name in self._copies or (what != DELETED and not name.startswith(".") and name not in self._endpoints):
            self._file_changed(KUBELET, name, what)

    def _unlink(self, side: str, name: str) -> None:
        directory = self.plugin_dir if side == PLUGIN else self.kubelet_dir
        if os.path.lexists(directory / name):
            assert self.mirror is not None
            self.mirror.expect_echo(side, name, DELETED)
            try:
                (directory / name).unlink()
            except FileNotFoundError:
                pass

    def _link(self, private: Path, side: str, name: str) -> None:
        """Put a socket bound at `private` into place at `name`: it appears at once, already listening, and
        stays (a dead socket file, as the kubelet's own) when its server stops."""
        directory = self.plugin_dir if side == PLUGIN else self.kubelet_dir
        self._unlink(side, name)
        assert self.mirror is not None
        self.mirror.expect_echo(side, name, CREATED)
        os.link(private, directory / name)
        private.unlink()

    def _dir(self, side: str) -> Path:
        return self.plugin_dir if side == PLUGIN else self.kubelet_dir

    def _is_file(self, side: str, name: str) -> bool:
        try:
            return stat.S_ISREG(os.lstat(self._dir(side) / name).st_mode)
        except OSError:
            return False

    def _file_changed(self, side: str, name: str, what: str) -> None:
        """A regular file written or deleted on `side`: the same on the other (temp files, dot-named, stay)."""
        other = KUBELET if side == PLUGIN else PLUGIN
        if what == DELETED:
            if name in self._copies:
                self._copies.discard(name)
                self._unlink(other, name)
                self.timeline.record("relay.mirror", "relay", name=name, what="deleted", side=other)
            return
        try:
            if not self._is_file(side, name):
                return
            staged = self.state_dir / f"copy-{next(self._serial)}"
            shutil.copyfile(self._dir(side) / name, staged)
        except OSError:
            return  # gone again already: its deletion follows
        assert self.mirror is not None
        self.mirror.expect_echo(other, name, CREATED)
        os.replace(staged, self._dir(other) / name)
        self._copies.add(name)
        self.timeline.record("relay.mirror", "relay", name=name, what="copied", side=other)

    # -- the kubelet's registration socket, in the plugin's directory ---------------------------------

    def _serve_registration(self) -> None:
        self._stop_registration(unlink=False)
        self.faults, self._next_faults = self._next_faults or FaultPlan(self.timeline, "kubelet"), None
        faults = self.faults
        channel = raw_channel(str(self.kubelet_dir / KUBELET_SOCKET))
        self._channels.append(channel)
        server = raw_server(MethodTable([REGISTER], lambda m, raw, ctx: self._answers.call(
            ctx, self._register, channel, faults, raw, ctx), self._no_stream), "relay-reg")
        private = self.state_dir / f"kubelet-{next(self._serial)}.sock"
        server.add_insecure_port(f"unix://{private}")
        server.start()
        self._link(private, PLUGIN, KUBELET_SOCKET)
        self._registration, self._kubelet_channel = server, channel
        self.timeline.record("relay.mirror", "relay", name=KUBELET_SOCKET, what="created", side=PLUGIN)

    def _stop_registration(self, unlink: bool) -> None:
        server, self._registration = self._registration, None
        if server is not None:
            self._retired.append(server)
            self._answers.flush()  # the kubelet's answers already relayed go out first, as the kubelet's did
            server.stop(grace=0)
        if unlink:
            self._unlink(PLUGIN, KUBELET_SOCKET)
            self.timeline.record("relay.mirror", "relay", name=KUBELET_SOCKET, what="deleted", side=PLUGIN)

    @staticmethod
    def _no_stream(method: Method, raw: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
        context.abort(grpc.StatusCode.UNIMPLEMENTED, f"unknown method {method.path}")
        yield b""  # pragma: no cover - abort raises

    def _register(self, channel: grpc.Channel, faults: FaultPlan, raw: bytes, context: grpc.ServicerContext) -> bytes:
        """Register on its way to the kubelet, recorded as the fake kubelet's server records it."""
        t0 = time.monotonic()
        request = decode(dp.RegisterRequest, raw) or dp.RegisterRequest()
        try:
            faults.apply("Register", context)  # a rejection aborts here, as the fake kubelet's interceptor does
            answer = self._relay_register(channel, request, raw, context)
        except BaseException as err:
            details = context.details()
            text = details.decode(errors="replace") if isinstance(details, bytes) else details
            outcome = f"{context.code().name}: {text}" if context.code() else status_of(err)
            self._record_call(request, outcome, t0)
            raise
        self._record_call(request, "OK", t0)
        return answer

    def _record_call(self, request: dp.RegisterRequest, outcome: str, t0: float) -> None:
        self.timeline.record("grpc.call", "kubelet", side="server", method="Register", request=to_dict(request),
                             response={}, outcome=outcome, duration_s=round(time.monotonic() - t0, 6),
                             relay=True)

    def _relay_register(self, channel: grpc.Channel, request: dp.RegisterRequest, raw: bytes,
                        context: grpc.ServicerContext) -> bytes:
        call, instance = next(self._calls), self.kubelet_instance()
        base: dict[str, Any] = {"instance": instance, "call": call, "relay": True}
        if len(raw) > KUBELET_MAX_RECV_BYTES:
            # The kubelet refuses it before its handler runs; the record says how large it was.
            self.timeline.record("kubelet.register_received", "kubelet", bytes=len(raw), **base)
            done = forward_unary(channel, REGISTER, raw, context)
            self.timeline.record("kubelet.register", "kubelet", accepted=False, error=done.outcome,
                                 resource=request.resource_name[:100] + "…", endpoint=request.endpoint[:100],
                                 version=request.version[:100], bytes=len(raw), **base)
            return self._answer(done, context)
        self.timeline.record("kubelet.register_received", "kubelet", resource=request.resource_name,
                             endpoint=request.endpoint, **base)
        event = {**base, "resource": request.resource_name, "version": request.version,
                 "endpoint": request.endpoint, "options": to_dict(request.options),
                 "probe": probe_listening(go_join(str(self.plugin_dir), request.endpoint))}
        pending = _Pending(next(endpoint_ids), request.resource_name)
        with self._lock:
            self._in_flight[request.endpoint] = pending
            endpoint = self._endpoints.get(request.endpoint)
            if endpoint is not None:
                endpoint.adopt(pending)
            elif self._plugin_socket(request.endpoint):
                # The plugin serves, but the mirror's watch has not reported its socket yet (it lags under load):
                # the kubelet dials it inside Register, so the relay's side must be there now (it adopts the
                # Register in flight, as one that appears later during the call does).
                self._open_endpoint(request.endpoint)
        done = forward_unary(channel, REGISTER, raw, context)
        with self._lock:
            if self._in_flight.get(request.endpoint) is pending:
                del self._in_flight[request.endpoint]
        accepted = done.outcome == "OK"
        if pending.options_call is not None:
            event["options_call"] = pending.options_call
        elif any(e in done.outcome for e in KUBELET_CALL_ERRORS):
            # The kubelet's dial or GetDevicePluginOptions failed where the relay could not see it (an endpoint
            # that is not a plugin's socket, such as kubelet.sock itself): its own error says so.
            event["options_call"] = {"ok": False, "error": context_details(done)}
        if accepted:
            event.update(served_options=pending.served_options or {}, endpoint_id=pending.endpoint_id)
        else:
            event["error"] = context_details(done)
        self.timeline.record("kubelet.register", "kubelet", accepted=accepted, **event)
        return self._answer(done, context)

    @staticmethod
    def _answer(done: Outcome, context: grpc.ServicerContext) -> bytes:
        if done.outcome != "OK" and not done.cancelled_by_caller:
            code = context.code() if hasattr(context, "code") else None
            context.abort(code or grpc.StatusCode.UNKNOWN, context_details(done))
        return done.response or b""

    # -- the plugin's sockets, in the kubelet's directory ---------------------------------------------

    def _open_endpoint(self, name: str) -> None:
        channel = raw_channel(str(self.plugin_dir / name))
        self._channels.append(channel)
        holder: dict[str, _Endpoint] = {}
        table = MethodTable(DEVICE_PLUGIN,
                            lambda m, raw, ctx: self._unary(holder["ep"], m, raw, ctx),
                            lambda m, raw, ctx: self._stream(holder["ep"], m, raw, ctx))
        server = raw_server(table, "relay-dp")
        private = self.state_dir / f"endpoint-{next(self._serial)}.sock"
        server.add_insecure_port(f"unix://{private}")
        server.start()
        holder["ep"] = endpoint = _Endpoint(name, server, channel)
        if name in self._in_flight:
            endpoint.adopt(self._in_flight[name])
        self._link(private, KUBELET, name)
        self._endpoints[name] = endpoint
        self.timeline.record("relay.mirror", "relay", name=name, what="created", side=KUBELET)

    def _plugin_socket(self, name: str) -> bool:
        """`name` is a socket the plugin serves in its directory (a Register may name any path; the relay mirrors
        plain names only, as the mirror does)."""
        if self._closed or not name or "/" in name or name == KUBELET_SOCKET:
            return False
        return is_socket(self.plugin_dir / name)

    def _drop_endpoint(self, name: str, side: str, why: str) -> None:
        endpoint = self._endpoints.pop(name)
        # Calls in flight (the kubelet's ListAndWatch) go on until their far side ends them.
        self._retired.append(endpoint.server)
        if side == PLUGIN and not is_socket(self.plugin_dir / name):
            return
        self._unlink(side, name)
        self.timeline.record("relay.mirror", "relay", name=name, what="deleted", side=side, why=why)

    def _record_dial(self, endpoint: _Endpoint, endpoint_id: int, outcome: str) -> None:
        if endpoint_id in endpoint.dialed_for:
            return
        endpoint.dialed_for.add(endpoint_id)
        # The plugin's socket, the one a direct kubelet would have dialed (and a scenario names).
        record_dial(self.timeline, str(self.plugin_dir / endpoint.name), self.kubelet_instance(), endpoint_id,
                    outcome)

    def _unary(self, endpoint: _Endpoint, method: Method, raw: bytes, context: grpc.ServicerContext) -> bytes:
        endpoint_id, pending = endpoint.endpoint_id, self._in_flight.get(endpoint.name)
        faults, t0 = self.faults, time.monotonic()  # the plan of the kubelet instance that made the call
        # The kubelet reached the socket: its dial is done, whatever the call makes of it (on the record too).
        self._record_dial(endpoint, endpoint_id, "OK")
        done = forward_unary(endpoint.channel, method, raw, context)
        hold_answer(faults, method.name, context, done, t0)
        if done.response is not None and len(done.response) > KUBELET_MAX_RECV_BYTES:
            record_over_limit(self.timeline, f"{method.response.__name__}", len(done.response),
                              endpoint_id=endpoint_id, resource=endpoint.resource, relay=True)
        response = decode(method.response, done.response)
        self.timeline.record("grpc.call", "kubelet", side="client", method=method.name,
                             request=to_dict(decode(method.request, raw)), response=to_dict(response),
                             outcome=done.outcome, duration_s=done.duration_s, endpoint_id=endpoint_id,
                             resource=endpoint.resource, relay=True)
        if method.name == "GetDevicePluginOptions" and pending is not None and pending.options_call is None:
            ok = done.outcome == "OK"
            pending.options_call = {"ok": ok, "error": None if ok else done.outcome}
            pending.served_options = to_dict(response) if ok else None
        return self._answer(done, context)

    def _stream(self, endpoint: _Endpoint, method: Method, raw: bytes,
                context: grpc.ServicerContext) -> Iterator[bytes]:
        endpoint_id, resource = endpoint.endpoint_id, endpoint.resource
        self._record_dial(endpoint, endpoint_id, "OK")
        self.timeline.record("grpc.stream_open", "kubelet", side="client", method=method.name,
                             endpoint_id=endpoint_id, relay=True)
        done = Outcome()

        def on_message(message: bytes) -> None:
            if len(message) > KUBELET_MAX_RECV_BYTES:
                # Passed on as it came: the kubelet's gRPC refuses it and fails the stream. Recorded as the fake
                # kubelet records it, so no check reads a list the kubelet never applied.
                record_over_limit(self.timeline, f"{method.name} message", len(message), endpoint_id=endpoint_id,
                                  resource=resource, relay=True)
                return
            self.timeline.record("grpc.stream_msg", "kubelet", side="client", method=method.name,
                                 endpoint_id=endpoint_id, resource=resource,
                                 message=to_dict(decode(method.response, message)), bytes=len(message), relay=True)

        try:
            yield from forward_stream(endpoint.channel, method, raw, context, on_message, done)
        finally:
            if done.cancelled_by_caller:
                reason = "stopped by kubelet"
            elif done.outcome == "OK":
                reason = "stream ended by plugin"
            else:
                reason = done.outcome
            self.timeline.record("kubelet.stream_end", "kubelet", instance=self.kubelet_instance(),
                                 resource=resource, endpoint_id=endpoint_id, reason=reason, relay=True)


def context_details(done: Outcome) -> str:
    """The status details the far side gave (`CODE: details` -> `details`), as the fake kubelet's errors read."""
    code, _, details = done.outcome.partition(": ")
    return details if details else code


__all__ = ["DevicePluginRelay"]
