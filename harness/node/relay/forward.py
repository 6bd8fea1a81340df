"""Forwarding one gRPC call as raw bytes, from a server the kubelet (or the plugin) calls to a channel on the
other side, with what passed recorded by the caller's hooks.

Bytes are forwarded as they came: no message is decoded and encoded again, so the far side receives exactly
what the near side sent, whatever its size (the kubelet's 4 MiB limit is the kubelet's to apply). Decoding
happens only for the record, after the bytes are on their way. Deadlines pass on as the time that remained,
and a cancel on either side cancels the other.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.message import DecodeError, Message

from harness.instruments.faults import RELEASED, FaultPlan
from harness.instruments.grpcutil import status_of, unix_target

# No limit either way: a message above the kubelet's 4 MiB must reach the kubelet, which refuses it itself.
UNLIMITED = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]
# Reconnect at once when the far side appears: a plugin that starts serving a moment after the kubelet
# dialed is seen as the kubelet's own blocking dial would see it.
RELAY_CHANNEL_OPTIONS = [*UNLIMITED, ("grpc.initial_reconnect_backoff_ms", 20),
                         ("grpc.min_reconnect_backoff_ms", 20), ("grpc.max_reconnect_backoff_ms", 100),
                         ("grpc.enable_retries", 0)]
RELAY_WORKERS = 32  # each open stream holds one; the kubelet opens one ListAndWatch per registration


@dataclass(frozen=True)
class Method:
    """One method the relay forwards: its full name, whether the answer streams, and its message types."""

    service: str  # "v1beta1.DevicePlugin"
    name: str  # "ListAndWatch"
    request: type[Message]
    response: type[Message]
    streams: bool = False

    @property
    def path(self) -> str:
        return f"/{self.service}/{self.name}"


@dataclass
class Outcome:
    """How one forwarded call ended, for the record."""

    outcome: str = "OK"  # "OK" or "CODE: details", as the fake kubelet words it (grpcutil.status_of)
    request: bytes = b""
    response: bytes | None = None
    duration_s: float = 0.0
    cancelled_by_caller: bool = False


def decode(kind: type[Message], raw: bytes | None) -> Message | None:
    """The message for the record; None when the bytes do not parse (the far side will say so itself)."""
    if raw is None:
        return None
    message = kind()
    try:
        message.ParseFromString(raw)
    except DecodeError:
        return None
    return message


def _code_of(err: grpc.RpcError) -> tuple[grpc.StatusCode, str]:
    code = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN  # type: ignore[attr-defined]
    details = err.details() if hasattr(err, "details") else str(err)  # type: ignore[attr-defined]
    return code or grpc.StatusCode.UNKNOWN, details or ""


def _timeout(context: grpc.ServicerContext) -> float | None:
    remaining = context.time_remaining()
    # grpc-python says "no deadline" with a huge number: pass None on, as the caller set none.
    return None if remaining is None or remaining > 10 ** 8 else max(remaining, 0.0)


def forward_unary(channel: grpc.Channel, method: Method, request: bytes, context: grpc.ServicerContext) -> Outcome:
    """Send `request` on and answer the caller with what came back (bytes, or the same status)."""
    t0 = time.monotonic()
    done = Outcome(request=request)
    call = channel.unary_unary(method.path)  # no (de)serializers: bytes both ways
    future = call.future(request, timeout=_timeout(context))
    context.add_callback(future.cancel)
    try:
        done.response = future.result()
    except grpc.FutureCancelledError:
        done.outcome, done.cancelled_by_caller = "CANCELLED: the caller cancelled", True
    except grpc.RpcError as err:
        code, details = _code_of(err)
        done.outcome = status_of(err)
        context.set_code(code)
        context.set_details(details)
    done.duration_s = round(time.monotonic() - t0, 6)
    return done


def hold_answer(faults: FaultPlan, method: str, context: grpc.ServicerContext, done: Outcome, t0: float) -> None:
    """A scenario's hold of a call the kubelet made: the plugin's answer (in `done`) waits here, on the wire, until
    released, the kubelet stops (kubelet_stopped closes its plan) or the kubelet's call ends on its own (its
    connection closed, its deadline passed). An answer that never reached the kubelet is recorded as the kubelet
    saw the call end: cancelled by it."""
    fault = faults.hold_answer(method, context)
    if fault is None:
        return
    if fault.ended != RELEASED:
        done.outcome, done.cancelled_by_caller = "CANCELLED: the caller cancelled", True
    done.duration_s = round(time.monotonic() - t0, 6)


def forward_stream(channel: grpc.Channel, method: Method, request: bytes, context: grpc.ServicerContext,
                   on_message: Callable[[bytes], None], done: Outcome) -> Iterator[bytes]:
    """Yield each streamed answer to the caller as it comes; `done` says how the stream ended."""
    t0 = time.monotonic()
    done.request = request
    stream = channel.unary_stream(method.path)(request, timeout=_timeout(context))
    context.add_callback(stream.cancel)
    try:
        for raw in stream:
            on_message(raw)
            yield raw
    except grpc.RpcError as err:
        code, details = _code_of(err)
        if code == grpc.StatusCode.CANCELLED and not context.is_active():
            done.outcome, done.cancelled_by_caller = "CANCELLED: the caller cancelled", True
        else:
            done.outcome = status_of(err)
            context.set_code(code)
            context.set_details(details)
    finally:
        if not context.is_active() and done.outcome == "OK":
            done.outcome, done.cancelled_by_caller = "CANCELLED: the caller cancelled", True
        done.duration_s = round(time.monotonic() - t0, 6)


def raw_server(handler: grpc.GenericRpcHandler, name: str) -> grpc.Server:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=RELAY_WORKERS, thread_name_prefix=name),
                         options=UNLIMITED)
    server.add_generic_rpc_handlers([handler])
    return server


def raw_channel(path: str) -> grpc.Channel:
    return grpc.insecure_channel(unix_target(path), options=RELAY_CHANNEL_OPTIONS)


class MethodTable(grpc.GenericRpcHandler):
    """A generic handler over a fixed table: each method's bytes go to `unary` or `stream`; an unknown method is
    UNIMPLEMENTED, as it would be on the far side (the kubelet never calls one)."""

    def __init__(self, methods: list[Method], unary: Callable[[Method, bytes, grpc.ServicerContext], Any],
                 stream: Callable[[Method, bytes, grpc.ServicerContext], Iterator[bytes]]) -> None:
        self._methods = {m.path: m for m in methods}
        self._unary, self._stream = unary, stream

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        method = self._methods.get(handler_call_details.method)  # type: ignore[attr-defined]
        if method is None:
            return None
        if method.streams:
            return grpc.unary_stream_rpc_method_handler(lambda req, ctx: self._stream(method, req, ctx))
        return grpc.unary_unary_rpc_method_handler(lambda req, ctx: self._unary(method, req, ctx))
