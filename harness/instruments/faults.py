"""Faults injected into gRPC methods, consulted at two points.

Keyed by method name, like the upstream fake plugins. The recording server
interceptor calls `FaultPlan.apply` before every handler of a call the kubelet
serves (Register), so a fault can reject, delay or hold any call, including one
that is opening a stream. A call the kubelet makes to a plugin (Allocate,
NodePrepareResources, NodeUnprepareResources) is held where its answer comes
back: `FaultPlan.hold_answer`, called by the kubelet's client interceptor and by
the relays in front of a real kubelet, keeps the plugin's answer from the
kubelet until the fault is released or the kubelet goes away.
"""

from __future__ import annotations

import threading
import time
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
    ended: str = ""  # how a held answer's hold ended (hold_answer: RELEASED, KUBELET_STOPPED, ...); "" until then


# How a held answer's hold ends (Fault.ended).
RELEASED = "released"
KUBELET_STOPPED = "its kubelet stopped"
CALL_ENDED = "the kubelet's call ended first (its connection closed, or its deadline passed)"
DEADLINE = "the kubelet's deadline on the call passed"


class FaultPlan:
    def __init__(self, timeline: Timeline, source: str) -> None:
        self._timeline, self._source = timeline, source
        self._faults: list[Fault] = []
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._answers_ended = threading.Event()  # the kubelet is going away: no held answer reaches it
        self._held_answers: list[Fault] = []

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
        self.end_answers()
        self._closed.set()
        with self._lock:
            for f in self._faults:
                f.release.set()

    @property
    def answers_ended(self) -> bool:
        """Whether the kubelet of this plan is going away (end_answers or close was called)."""
        return self._answers_ended.is_set()

    def end_answers(self) -> None:
        """The kubelet that made the held calls is going away: their answers never reach it (hold_answer fails
        them). Called first when a kubelet stops, before it waits for its own workers, which a held call blocks."""
        self._answers_ended.set()
        with self._lock:
            held = list(self._held_answers)
        for fault in held:
            fault.release.set()

    def _add(self, fault: Fault) -> Fault:
        with self._lock:
            self._faults.append(fault)
        self._timeline.record("fault.armed", self._source, method=fault.method, action=fault.action,
                              count=fault.remaining, delay_s=fault.delay_s)
        return fault

    def _take(self, method: str, actions: tuple[str, ...] | None = None) -> Fault | None:
        with self._lock:
            for f in self._faults:
                if f.method == method and (f.remaining is None or f.remaining > 0) and \
                        (actions is None or f.action in actions):
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

    def hold_answer(self, method: str, context: grpc.ServicerContext | None = None,
                    deadline: float | None = None) -> Fault | None:
        """For a call the kubelet made, whose answer has come back from the plugin: while a `hold` of `method` is
        armed, keep that answer from the kubelet until the fault is released, the kubelet goes away (`close`,
        `end_answers`), the kubelet's own call ends (`context`: the relay's side of it, ended when the kubelet's
        connection closes or its deadline passes) or `deadline` (time.monotonic(): the fake kubelet's deadline on
        the call) passes. The answer, not the request, is held: the plugin has done its part and the kubelet has
        not heard, the window a kubelet restart or a pod deletion falls into in the reported bugs
        (kubernetes#116411). The fault (its `ended` says how), or None when none was armed."""
        fault = self._take(method, ("hold",))
        if fault is None:
            return None
        with self._lock:
            self._held_answers.append(fault)
        self._timeline.record("fault.fired", self._source, method=method, action="hold", held="answer")
        fault.reached.set()
        if self._answers_ended.is_set():
            fault.release.set()
        if context is not None and not context.add_callback(fault.release.set):
            fault.release.set()  # the call had ended already
        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        fault.release.wait(remaining)
        if self._answers_ended.is_set():
            fault.ended = KUBELET_STOPPED
        elif context is not None and not context.is_active():
            fault.ended = CALL_ENDED
        elif fault.release.is_set():
            fault.ended = RELEASED
        else:
            fault.ended = DEADLINE
        # Ended, however it ended: the call is no longer in flight (a scenario's `held` reads release).
        fault.release.set()
        with self._lock:
            self._held_answers.remove(fault)
        self._timeline.record("fault.hold_ended", self._source, method=method, ended=fault.ended)
        return fault
