"""A grpc channel that one thread may close while others start calls on it.

grpc-python (1.85 here) looks a registered method's handle up on the C channel
each time a call through an intercepted channel starts (`grpc.intercept_channel`
builds the multicallable per call). On a channel that is closed, or being closed
by another thread, that lookup reads freed memory: the process dies of SIGSEGV
instead of getting an error. The fake kubelet closes an endpoint's channel from
whichever thread stops the endpoint (a stream's end, a disconnect, the kubelet's
stop) while the endpoint's ListAndWatch thread or an admission may be starting a
call on it; a plugin that floods Register makes that race likely.

`GuardedChannel` sits under the interceptors: starting a call and closing
exclude each other, and a call on a closed channel fails as an in-flight call
fails when its channel closes (CANCELLED), never with a crash.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import grpc

from harness.instruments.interceptors import FailedCall

CLOSED_DETAILS = "Channel closed!"  # grpc-python's own details for the calls a channel's close cancels


class ChannelClosed(FailedCall):
    """A call started after its channel was closed."""

    def __init__(self) -> None:
        super().__init__(grpc.StatusCode.CANCELLED, CLOSED_DETAILS)


class GuardedChannel(grpc.Channel):
    """`raw`, whose calls start only while it is open (see the module's doc)."""

    def __init__(self, raw: grpc.Channel) -> None:
        self.raw = raw
        self._lock = threading.Lock()
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self.raw.close()

    def subscribe(self, callback: Callable[[grpc.ChannelConnectivity], None], try_to_connect: bool = False) -> None:
        self.raw.subscribe(callback, try_to_connect=try_to_connect)

    def unsubscribe(self, callback: Callable[[grpc.ChannelConnectivity], None]) -> None:
        self.raw.unsubscribe(callback)

    def unary_unary(self, method: str, request_serializer: Any = None, response_deserializer: Any = None,
                    _registered_method: bool | None = False) -> Any:
        return self._multicallable(self.raw.unary_unary, method, request_serializer, response_deserializer,
                                   _registered_method)

    def unary_stream(self, method: str, request_serializer: Any = None, response_deserializer: Any = None,
                     _registered_method: bool | None = False) -> Any:
        return self._multicallable(self.raw.unary_stream, method, request_serializer, response_deserializer,
                                   _registered_method)

    def stream_unary(self, method: str, request_serializer: Any = None, response_deserializer: Any = None,
                     _registered_method: bool | None = False) -> Any:
        return self._multicallable(self.raw.stream_unary, method, request_serializer, response_deserializer,
                                   _registered_method)

    def stream_stream(self, method: str, request_serializer: Any = None, response_deserializer: Any = None,
                      _registered_method: bool | None = False) -> Any:
        return self._multicallable(self.raw.stream_stream, method, request_serializer, response_deserializer,
                                   _registered_method)

    def _multicallable(self, make: Callable[..., Any], method: str, request_serializer: Any,
                       response_deserializer: Any, registered: bool | None) -> _Guarded:
        with self._lock:
            if self._closed:
                return _Guarded(None, self)
            return _Guarded(make(method, request_serializer, response_deserializer, registered), self)

    def __enter__(self) -> GuardedChannel:
        return self

    def __exit__(self, *exc: object) -> bool:
        self.close()
        return False


class _Guarded:
    """A multicallable of a GuardedChannel, made under its lock (the handle lookup is the unsafe part). The call
    itself starts outside it, so that a blocking call never holds a close up: grpc serializes a call's start
    with a close on its own, and refuses a call on a closed channel with a ValueError, which this makes the
    CANCELLED error a call cut by a close gets."""

    def __init__(self, inner: Any, channel: GuardedChannel) -> None:
        self._inner, self._channel = inner, channel

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._start("__call__", *args, **kwargs)

    def with_call(self, *args: Any, **kwargs: Any) -> Any:
        return self._start("with_call", *args, **kwargs)

    def future(self, *args: Any, **kwargs: Any) -> Any:
        return self._start("future", *args, **kwargs)

    def _start(self, how: str, *args: Any, **kwargs: Any) -> Any:
        if self._inner is None:
            raise ChannelClosed()
        try:
            return getattr(self._inner, how)(*args, **kwargs)
        except ValueError:
            if self._channel.closed:
                raise ChannelClosed() from None
            raise
