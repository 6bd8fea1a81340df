"""A relay socket that keeps the kubelet's connections: each connection the kubelet opens gets one upstream
connection to the plugin of its own, opened when the kubelet's is accepted and closed when it closes, and a
dropped upstream connection drops the kubelet's.

Why: the kubelet's connections are part of what a plugin is judged on (DRA-REG-04: one gRPC connection serves
the DRA service and the health stream), and a plugin sees connections come and go as the kubelet's start,
deregister and restart. A single shared channel to the plugin would show it one long-lived connection whatever
the kubelet did, and a single relay server would hide from the kubelet that the plugin went away (its
connection would stay up, talking to the relay).

How: the socket the kubelet dials is a plain listening unix socket. Each accepted connection is spliced, byte
for byte, to a gRPC server of its own on a private socket; that server forwards every call (forward.py) on a
channel of its own, whose subchannel is not shared with any other channel (grpc.use_local_subchannel_pool:
grpc-core otherwise pools subchannels of equal target and arguments process-wide, so two kubelet connections
would become one upstream connection). The upstream connection is made before the kubelet's connection gets
its HTTP/2 greeting, so a kubelet dialing a plugin that does not listen sees its connection close, not a
relay that answers.
"""

from __future__ import annotations

import itertools
import os
import select
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from harness.node.relay.forward import RELAY_CHANNEL_OPTIONS, Method, MethodTable, raw_server

# One connection per channel: never a subchannel shared with another kubelet connection's channel.
PER_CONNECTION_CHANNEL_OPTIONS = [*RELAY_CHANNEL_OPTIONS, ("grpc.use_local_subchannel_pool", 1)]
UPSTREAM_CONNECT_S = 5.0  # the plugin to accept the relay's connection; the kubelet's own dial waits meanwhile
SPLICE_CHUNK = 1 << 16
SERVER_STOP_S = 5.0
LISTEN_BACKLOG = 64


@dataclass
class Connection:
    """One connection of the kubelet's and the upstream connection that is its other end."""

    number: int
    upstream: str  # the plugin's socket, as the relay reaches it
    channel: grpc.Channel
    state: dict[str, Any] = field(default_factory=dict)  # what its calls learned (a registration's GetInfo)


Unary = Callable[[Connection, Method, bytes, grpc.ServicerContext], bytes]
Stream = Callable[[Connection, Method, bytes, grpc.ServicerContext], Iterator[bytes]]


class PerConnectionRelay:
    """Serves `methods` at a socket bound at `private_dir/<name>`, which the caller links into place (`path`);
    `upstream()` says where the plugin's socket is at the moment a connection comes."""

    def __init__(self, private_dir: Path, name: str, upstream: Callable[[], str], methods: list[Method],
                 unary: Unary, stream: Stream,
                 on_connection: Callable[[Connection | None, str, str], None]) -> None:
        self.private_dir, self.upstream, self.methods = Path(private_dir), upstream, methods
        self._unary, self._stream, self._on_connection = unary, stream, on_connection
        self.path = self.private_dir / f"{name}.sock"
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(str(self.path))
        self._listener.listen(LISTEN_BACKLOG)
        self._wake_r, self._wake_w = os.pipe()
        self._numbers = itertools.count(1)
        self._lock = threading.Lock()
        self._live: dict[int, tuple[socket.socket, grpc.Server, grpc.Channel]] = {}
        self._threads: list[threading.Thread] = []
        self._accepting = True
        self._closed = False
        self._acceptor = threading.Thread(target=self._accept_loop, daemon=True, name=f"relay-accept-{name}")
        self._acceptor.start()

    # -- accepting --------------------------------------------------------------------------------------

    def _accept_loop(self) -> None:
        while True:
            try:
                ready, _, _ = select.select([self._listener, self._wake_r], [], [])
            except (OSError, ValueError):
                return
            if self._wake_r in ready:
                return
            try:
                conn, _ = self._listener.accept()
            except OSError:
                continue
            thread = threading.Thread(target=self._serve, args=(conn, next(self._numbers)), daemon=True,
                                      name="relay-conn")
            with self._lock:
                self._threads = [t for t in self._threads if t.is_alive()] + [thread]
            thread.start()

    def stop_accepting(self) -> None:
        """No new connections (the socket is gone from the kubelet's directory); the open ones go on."""
        with self._lock:
            if not self._accepting:
                return
            self._accepting = False
        os.write(self._wake_w, b"x")
        self._acceptor.join(SERVER_STOP_S)
        self._listener.close()

    def close(self) -> None:
        """Every connection closed, both ends, as a relay process dying would leave them."""
        self.stop_accepting()
        with self._lock:
            self._closed = True
            live = list(self._live.values())
            threads = list(self._threads)
        for kubelet, _, _ in live:
            _shutdown(kubelet)
        for thread in threads:
            thread.join(SERVER_STOP_S)
        os.close(self._wake_r)
        os.close(self._wake_w)
        self.path.unlink(missing_ok=True)

    # -- one connection -----------------------------------------------------------------------------------

    def _serve(self, kubelet: socket.socket, number: int) -> None:
        upstream = self.upstream()
        channel = grpc.insecure_channel(f"unix:{upstream}", options=PER_CONNECTION_CHANNEL_OPTIONS)
        if not _first_attempt_ready(channel):
            # The plugin does not accept: the kubelet's connection closes before its greeting, as its dial
            # of a socket nobody listens on fails (and is retried by the kubelet, as that would be).
            # Recorded before the close, so that whoever sees the close finds the refusal on the timeline.
            channel.close()
            try:
                self._on_connection(None, "refused", upstream)
            finally:
                kubelet.close()
            return
        connection = Connection(number, upstream, channel)
        private = self.private_dir / f"{self.path.stem}-c{number}.sock"
        table = MethodTable(self.methods, lambda m, raw, ctx: self._unary(connection, m, raw, ctx),
                            lambda m, raw, ctx: self._stream(connection, m, raw, ctx))
        server = raw_server(table, f"relay-c{number}")
        server.add_insecure_port(f"unix://{private}")
        server.start()
        inner = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            inner.connect(str(private))
        except OSError:
            inner.close()
            kubelet.close()
            server.stop(grace=0).wait(SERVER_STOP_S)
            channel.close()
            private.unlink(missing_ok=True)
            return
        with self._lock:
            if self._closed:
                _shutdown(kubelet)
            self._live[number] = (kubelet, server, channel)
        self._on_connection(connection, "opened", upstream)

        def on_state(state: grpc.ChannelConnectivity) -> None:
            # The plugin closed (or lost) its end: the kubelet's end closes too, so that the kubelet sees
            # its connection drop when the plugin goes away, and reconnects as it would to the plugin.
            if state != grpc.ChannelConnectivity.READY:
                _shutdown(kubelet)

        channel.subscribe(on_state, try_to_connect=False)
        try:
            _splice(kubelet, inner)
        finally:
            channel.unsubscribe(on_state)
            with self._lock:
                self._live.pop(number, None)
            kubelet.close()
            inner.close()
            server.stop(grace=0).wait(SERVER_STOP_S)
            channel.close()  # the plugin sees its end of this connection close, as the kubelet's closing would
            private.unlink(missing_ok=True)
            self._on_connection(connection, "closed", upstream)


def _first_attempt_ready(channel: grpc.Channel) -> bool:
    """Whether the channel's first attempt to connect succeeds: its first READY or TRANSIENT_FAILURE decides
    (no probe connection of our own, which the plugin would see as one more connection)."""
    settled = threading.Event()
    outcome: list[bool] = []

    def on_state(state: grpc.ChannelConnectivity) -> None:
        if state in (grpc.ChannelConnectivity.READY, grpc.ChannelConnectivity.TRANSIENT_FAILURE,
                     grpc.ChannelConnectivity.SHUTDOWN) and not settled.is_set():
            outcome.append(state == grpc.ChannelConnectivity.READY)
            settled.set()

    channel.subscribe(on_state, try_to_connect=True)
    try:
        return settled.wait(UPSTREAM_CONNECT_S) and outcome[0]
    finally:
        channel.unsubscribe(on_state)


def _shutdown(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def _splice(a: socket.socket, b: socket.socket) -> None:
    """Copy bytes both ways until either side closes."""
    peers = {a: b, b: a}
    while True:
        try:
            ready, _, _ = select.select([a, b], [], [])
        except (OSError, ValueError):
            return
        for sock in ready:
            try:
                data = sock.recv(SPLICE_CHUNK)
                if not data:
                    return
                peers[sock].sendall(data)
            except OSError:
                return
