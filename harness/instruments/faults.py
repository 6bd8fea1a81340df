"""Faults injected into gRPC methods, consulted through one entry point.

Keyed by method name, like the upstream fake plugins. The recording
interceptor calls `FaultPlan.apply` before every handler, so a fault can
reject, delay or hold any call, including one that is opening a stream.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import grpc

from harness.instruments.timeline import Timeline


@dataclass
class Fault:
    method: str
    action: str  # "reject" | "delay" | "hold"
    remaining: int | None = 1  # None: every call
    code: grpc.StatusCode = grpc.StatusCode.UNKNOWN
    message: str = "rejected by fakelet fault plan"
    delay_s: float = 0.0
    release: threading.Event = field(default_factory=threading.Event)
    reached: threading.Event = field(default_factory=threading.Event)


class FaultPlan:
    def __init__(self, timeline: Timeline, source: str) -> None:
        self._timeline, self._source = timeline, source
        self._faults: list[Fault] = []
        self._lock = threading.Lock()
        self._closed = threading.Event()

    def reject(self, method: str, count: int | None = 1, message: str | None = None,
               code: grpc.StatusCode = grpc.StatusCode.UNKNOWN) -> Fault:
        return self._add(Fault(method, "reject", count, code, message or Fault.message))

    def delay(self, method: str, delay_s: float, count: int | None = 1) -> Fault:
        return self._add(Fault(method, "delay", count, delay_s=delay_s))

    def hold(self, method: str, count: int | None = 1) -> Fault:
        """Block matching calls until `fault.release` is set (or the plan closes)."""
        return self._add(Fault(method, "hold", count))

    def close(self) -> None:
        """Release every held or delayed call: the server is going away."""
        self._closed.set()
        with self._lock:
            for f in self._faults:
                f.release.set()

    def _add(self, fault: Fault) -> Fault:
        with self._lock:
            self._faults.append(fault)
        self._timeline.record("fault.armed", self._source, method=fault.method, action=fault.action,
                              count=fault.remaining, delay_s=fault.delay_s)
        return fault

    def _take(self, method: str) -> Fault | None:
        with self._lock:
            for f in self._faults:
                if f.method == method and (f.remaining is None or f.remaining > 0):
                    if f.remaining is not None:
                        f.remaining -= 1
                    return f
        return None

    def apply(self, method: str, context: grpc.ServicerContext) -> None:
        fault = self._take(method)
        if fault is None:
            return
        self._timeline.record("fault.fired", self._source, method=method, action=fault.action)
        fault.reached.set()
        if fault.action == "delay":
            # A bounded pause is the fault itself, not synchronisation; close() cuts it short.
            self._closed.wait(fault.delay_s)
        elif fault.action == "hold":
            fault.release.wait()
        elif fault.action == "reject":
            context.abort(fault.code, fault.message)
