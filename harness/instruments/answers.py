"""Answers a gRPC server has given but not yet sent.

A Python handler's return is not the answer on the wire: grpc's core sends the status afterwards, from its own
thread, and on a loaded machine that lags by tens of milliseconds. A Go kubelet writes its answer as its handler
returns. So a kubelet that stops "just after" it accepted a Register must first let that answer go out, or the
plugin sees "Unavailable: Cancelling all calls" for a registration the timeline says was accepted (the upstream
sample plugin panics on it). Calls still being handled (a held Register) are not waited for: stopping cancels
them, as a real kubelet's exit does.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import grpc

# Seconds a stopping server waits for answers already given to be sent: the send is local and immediate once
# grpc's thread runs; the bound is for a machine so loaded that it does not.
FLUSH_WAIT_S = 2.0

T = TypeVar("T")


class Answers:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._unsent: list[threading.Event] = []

    @contextmanager
    def handling(self, context: grpc.ServicerContext) -> Iterator[None]:
        """Around a handler: once it returns or aborts, its answer counts as given until grpc has sent it."""
        sent = threading.Event()
        context.add_callback(sent.set)  # grpc runs it when the call's status has gone out (or the call ended)
        try:
            yield
        finally:
            with self._lock:
                self._unsent = [e for e in self._unsent if not e.is_set()] + [sent]

    def call(self, context: grpc.ServicerContext, handler: Callable[..., T], *args: Any) -> T:
        with self.handling(context):
            return handler(*args)

    def flush(self, timeout_s: float = FLUSH_WAIT_S) -> None:
        """Wait, within `timeout_s`, for every answer given so far to be sent."""
        with self._lock:
            unsent, self._unsent = self._unsent, []
        deadline = time.monotonic() + timeout_s
        for sent in unsent:
            sent.wait(max(deadline - time.monotonic(), 0))
