"""One interceptor per side that puts every gRPC call on the timeline.

Server side: method, request, outcome and duration of each call, each
streamed message, and the fault plan consulted first. Client side: the same
for unary calls, with the kubelet's fault plan consulted once the answer is
back (a held answer, FaultPlan.hold_answer); stream consumers record their own
messages.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message

from harness.instruments.faults import KUBELET_STOPPED, RELEASED, Fault, FaultPlan
from harness.instruments.grpcutil import status_of
from harness.instruments.timeline import Timeline


def to_dict(msg: Message | None) -> dict[str, Any]:
    """MessageToDict with proto field names and every field without presence: the record of a message.

    Taken apart by a plan made once per message type (the same dict, keys in the same order, tests/test_to_dict.py):
    MessageToDict walks descriptors and options field by field, about 70 us for an Allocate answer, five times an
    admission (P2). A message with a field the plan does not convert exactly as MessageToDict (an enum, bytes, a
    float, a well-known type) goes through MessageToDict."""
    if msg is None:
        return {}
    try:
        return _planned_dict(msg)
    except _Unplanned:
        return message_to_dict(msg)


def message_to_dict(msg: Message) -> dict[str, Any]:
    """to_dict by MessageToDict itself."""
    return MessageToDict(msg, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)


class _Unplanned(Exception):
    """The message, or one inside it, has a field to_dict's plan does not convert."""


# Per field number: the key and the value's conversion; then each field without presence, in declaration order, with
# its value when unset (a fresh dict or list when that is a map's or a repeated field's).
_Plan = tuple[dict[int, tuple[str, Callable[[Any], Any]]], tuple[tuple[str, Any, type | None], ...]]
_PLANS: dict[Any, _Plan | None] = {}
_FD = FieldDescriptor


def _planned_dict(msg: Message) -> dict[str, Any]:
    d = msg.DESCRIPTOR
    try:
        plan = _PLANS[d]
    except KeyError:
        plan = _PLANS[d] = _plan(d)
    if plan is None:
        raise _Unplanned(d.full_name)
    fields, unset = plan
    js: dict[str, Any] = {}
    for field, value in msg.ListFields():  # the set fields, by number, as MessageToDict takes them
        entry = fields.get(field.number)
        if entry is None:
            raise _Unplanned(field.full_name)  # an extension
        js[entry[0]] = entry[1](value)
    for name, default, fresh in unset:
        if name not in js:
            js[name] = fresh() if fresh is not None else default
    return js


def _plan(d: Any) -> _Plan | None:
    if d.full_name.startswith("google.protobuf."):
        return None  # well-known types and wrappers have JSON forms of their own
    fields: dict[int, tuple[str, Callable[[Any], Any]]] = {}
    unset: list[tuple[str, Any, type | None]] = []
    for f in d.fields:
        convert = _converter(f)
        if convert is None:
            return None
        fields[f.number] = (f.name, convert)
        if f.has_presence:
            continue
        if _is_map(f):
            unset.append((f.name, None, dict))
        elif f.is_repeated:
            unset.append((f.name, None, list))
        else:
            unset.append((f.name, convert(f.default_value), None))
    return fields, tuple(unset)


def _is_map(f: Any) -> bool:
    return (f.type == _FD.TYPE_MESSAGE and f.message_type.has_options
            and f.message_type.GetOptions().map_entry)


def _converter(f: Any) -> Callable[[Any], Any] | None:
    if _is_map(f):
        value = _single(f.message_type.fields_by_name["value"])
        if value is None:
            return None
        if f.message_type.fields_by_name["key"].cpp_type == _FD.CPPTYPE_BOOL:
            return lambda m: {("true" if k else "false"): value(m[k]) for k in m}
        return lambda m: {str(k): value(m[k]) for k in m}
    one = _single(f)
    if one is None or not f.is_repeated:
        return one
    return lambda values: [one(v) for v in values]


def _single(f: Any) -> Callable[[Any], Any] | None:
    """One value of `f` as MessageToDict's _FieldToJsonObject gives it; None for the kinds left to it."""
    cpp = f.cpp_type
    if cpp == _FD.CPPTYPE_MESSAGE:
        return _planned_dict
    if cpp == _FD.CPPTYPE_STRING:
        return None if f.type == _FD.TYPE_BYTES else str
    if cpp == _FD.CPPTYPE_BOOL:
        return bool
    if cpp in (_FD.CPPTYPE_INT64, _FD.CPPTYPE_UINT64):
        return str
    if cpp in (_FD.CPPTYPE_INT32, _FD.CPPTYPE_UINT32):
        return int
    return None  # enums, floats, doubles


# The v1beta1 shapes list_to_dict knows by heart: (message, [(field, number, type)]).
_LIST_SHAPES = {
    "v1beta1.ListAndWatchResponse": [("devices", 1, 11)],
    "v1beta1.Device": [("ID", 1, 9), ("health", 2, 9), ("topology", 3, 11)],
    "v1beta1.TopologyInfo": [("nodes", 1, 11)],
    "v1beta1.NUMANode": [("ID", 1, 3)],
}


def _shape(descriptor: Any) -> list[tuple[str, int, int]]:
    return [(f.name, f.number, f.type) for f in descriptor.fields]


def list_to_dict(msg: Message) -> dict[str, Any]:
    """to_dict of a ListAndWatchResponse: the same dict (keys in the same order), at a fraction of the cost.

    MessageToDict walks descriptors field by field: 15 to 35 ms for a list of 1,024 devices, which at P3's
    100 lists a second is more than the harness's whole core. Successive lists differ in a device or two,
    so each device is looked up by its wire bytes (serializing one is cheap) and only a new one is taken
    apart. Every event gets a list of its own, but a device's dict is shared by every event that listed it
    the same way: read-only, as all of an event is. Four fresh containers per device, kept by the timeline,
    cost P3's kubelet 1.5 ms per list to build and 3.5 ms more in the garbage collector, which walked the
    millions of them again and again (2 GB at 32 x 1,024). Any other message, or a v1beta1 whose fields are
    not the ones this knows, goes through to_dict.
    """
    d = msg.DESCRIPTOR
    if d.full_name != "v1beta1.ListAndWatchResponse" or not _known_list_shape(d):
        return to_dict(msg)
    if len(_DEVICES) > _DEVICES_MAX:
        _DEVICES.clear()  # a bound, not an eviction policy: the hostile plugins' 100,000 phantoms pass through
    out = []
    for dev in msg.devices:  # type: ignore[attr-defined]
        key = dev.SerializeToString()
        record = _DEVICES.get(key)
        if record is None:
            record = _DEVICES[key] = _device_dict(dev)
        out.append(record)
    return {"devices": out}


def _device_dict(dev: Any) -> dict[str, Any]:
    """One v1beta1.Device as MessageToDict gives it: the set fields by number, then the unset ones without
    presence; int64 NUMA IDs as JSON strings."""
    e: dict[str, Any] = {}
    if dev.ID:
        e["ID"] = dev.ID
    if dev.health:
        e["health"] = dev.health
    if dev.HasField("topology"):
        e["topology"] = {"nodes": [{"ID": str(n.ID)} for n in dev.topology.nodes]}
    if not dev.ID:
        e["ID"] = ""
    if not dev.health:
        e["health"] = ""
    return e


_DEVICES_MAX = 1 << 16  # devices list_to_dict remembers: 64 lists of P3's 1,024 changing ones, a few MiB
_DEVICES: dict[bytes, dict[str, Any]] = {}
_KNOWN: dict[Any, bool] = {}


def _known_list_shape(d: Any) -> bool:
    known = _KNOWN.get(d)
    if known is None:
        device = d.fields_by_name["devices"].message_type
        topology = device.fields_by_name.get("topology")
        known = (_shape(d) == _LIST_SHAPES[d.full_name] and _shape(device) == _LIST_SHAPES[device.full_name]
                 and topology is not None
                 and _shape(topology.message_type) == _LIST_SHAPES.get(topology.message_type.full_name)
                 and _shape(topology.message_type.fields_by_name["nodes"].message_type)
                 == _LIST_SHAPES.get(topology.message_type.fields_by_name["nodes"].message_type.full_name))
        _KNOWN[d] = known
    return known


def method_name(full: str) -> str:
    return full.rsplit("/", 1)[-1]


def _outcome(context: grpc.ServicerContext) -> str:
    code = context.code()
    if code is None or code == grpc.StatusCode.OK:
        return "OK"
    return f"{code.name}: {context.details()}"


class RecordingServerInterceptor(grpc.ServerInterceptor):
    def __init__(self, timeline: Timeline, source: str, faults: FaultPlan | None = None) -> None:
        self.timeline, self.source, self.faults = timeline, source, faults

    def intercept_service(self, continuation: Callable[..., Any], details: grpc.HandlerCallDetails) -> Any:
        handler = continuation(details)
        if handler is None:
            return None
        method = method_name(details.method)
        if handler.unary_unary:
            return grpc.unary_unary_rpc_method_handler(
                self._wrap_unary(method, handler.unary_unary),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer)
        if handler.unary_stream:
            return grpc.unary_stream_rpc_method_handler(
                self._wrap_stream(method, handler.unary_stream),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer)
        return handler

    def _record(self, method: str, request: Message, t0: float, outcome: str, response: Any = None) -> None:
        self.timeline.record("grpc.call", self.source, side="server", method=method,
                             request=to_dict(request), response=to_dict(response),
                             outcome=outcome, duration_s=round(time.monotonic() - t0, 6))

    def _wrap_unary(self, method: str, inner: Callable[..., Any]) -> Callable[..., Any]:
        def handle(request: Message, context: grpc.ServicerContext) -> Any:
            t0 = time.monotonic()
            try:
                if self.faults is not None:
                    self.faults.apply(method, context)
                response = inner(request, context)
            except BaseException as err:
                self._record(method, request, t0, _outcome(context) if context.code() else status_of(err))
                raise
            self._record(method, request, t0, _outcome(context), response)
            return response
        return handle

    def _wrap_stream(self, method: str, inner: Callable[..., Iterator[Any]]) -> Callable[..., Iterator[Any]]:
        def handle(request: Message, context: grpc.ServicerContext) -> Iterator[Any]:
            t0 = time.monotonic()
            self.timeline.record("grpc.stream_open", self.source, side="server", method=method)
            outcome = "OK"
            try:
                if self.faults is not None:
                    self.faults.apply(method, context)
                for message in inner(request, context):
                    self.timeline.record("grpc.stream_msg", self.source, side="server", method=method,
                                         message=to_dict(message))
                    yield message
            except BaseException as err:
                outcome = _outcome(context) if context.code() else status_of(err)
                raise
            finally:
                self._record(method, request, t0, outcome)
        return handle


@dataclass(frozen=True)
class CallHook:
    """What to do as the next outgoing call of `method` on a timeline's channels is sent, once (a scenario's
    plugin crash during that call). `before` runs in the calling thread just before the request goes out,
    `after` once the call has ended, however it ended."""

    method: str
    before: Callable[[], None]
    after: Callable[[], None] | None = None


_HOOKS: weakref.WeakKeyDictionary[Timeline, list[CallHook]] = weakref.WeakKeyDictionary()
_HOOKS_LOCK = threading.Lock()


def arm_call_hook(timeline: Timeline, hook: CallHook) -> None:
    with _HOOKS_LOCK:
        _HOOKS.setdefault(timeline, []).append(hook)


def disarm_call_hooks(timeline: Timeline) -> list[CallHook]:
    """Remove every hook still armed on the timeline; the ones that never fired."""
    with _HOOKS_LOCK:
        return _HOOKS.pop(timeline, [])


def _take_call_hook(timeline: Timeline, method: str) -> CallHook | None:
    with _HOOKS_LOCK:
        hooks = _HOOKS.get(timeline) or []
        for hook in hooks:
            if hook.method == method:
                hooks.remove(hook)
                return hook
    return None


class FailedCall(grpc.RpcError, grpc.Call, grpc.Future):  # type: ignore[misc]
    """A call that failed before or instead of reaching the wire, in the shape grpc gives a failed call: an error
    that is also its own (done) call and future, as an interceptor's continuation returns it."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def result(self, timeout: float | None = None) -> Any:
        raise self

    def exception(self, timeout: float | None = None) -> BaseException:
        return self

    def traceback(self, timeout: float | None = None) -> Any:
        return None

    def add_done_callback(self, fn: Callable[[Any], None]) -> None:
        fn(self)

    def cancel(self) -> bool:
        return False

    def cancelled(self) -> bool:
        return False

    def running(self) -> bool:
        return False

    def done(self) -> bool:
        return True

    def is_active(self) -> bool:
        return False

    def time_remaining(self) -> float | None:
        return None

    def add_callback(self, callback: Callable[[], None]) -> bool:
        return False

    def initial_metadata(self) -> Any:
        return None

    def trailing_metadata(self) -> Any:
        return None


class HeldAnswerLost(FailedCall):
    """What the kubelet's code gets for a call whose answer a scenario held and never let reach it: the kubelet
    stopped meanwhile (its call dies with it), or the kubelet's own deadline on the call passed."""


def lost_answer(fault: Fault) -> HeldAnswerLost:
    """The error a held answer that never reached the kubelet makes of its call."""
    if fault.ended == KUBELET_STOPPED:
        return HeldAnswerLost(grpc.StatusCode.CANCELLED, "the kubelet stopped while the answer was held")
    # grpc-python's own words for a client-side deadline: endpoint.go_status reads them as Go's
    # "context deadline exceeded".
    return HeldAnswerLost(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")


class RecordingClientInterceptor(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):
    def __init__(self, timeline: Timeline, source: str, faults: FaultPlan | None = None,
                 deadlines: bool = True) -> None:
        """`faults`: the kubelet's fault plan, whose holds keep an answer from the kubelet (none for fakelet's own
        calls); `deadlines`: whether a call's timeout is the kubelet's own deadline, which a held answer can run
        past (DRA's), or only fakelet's bound on a call the kubelet makes without one (a device plugin's Allocate:
        context.Background() upstream, so a held answer waits for its release however long)."""
        self.timeline, self.source, self.faults, self.deadlines = timeline, source, faults, deadlines

    def intercept_unary_unary(self, continuation: Callable[..., Any], details: Any, request: Message) -> Any:
        t0 = time.monotonic()
        method = method_name(details.method)
        hook = _take_call_hook(self.timeline, method)
        try:
            if hook is not None:
                hook.before()
            return self._call(continuation, details, request, method, t0)
        finally:
            if hook is not None and hook.after is not None:
                hook.after()

    def _call(self, continuation: Callable[..., Any], details: Any, request: Message, method: str, t0: float) -> Any:
        call = continuation(details, request)
        try:
            response = call.result()
        except grpc.RpcError as err:
            # The plugin's error is its answer too: held as a success would be.
            lost = self._held(method, details, t0)
            self.timeline.record("grpc.call", self.source, side="client", method=method,
                                 request=to_dict(request), outcome=status_of(lost or err),
                                 duration_s=round(time.monotonic() - t0, 6))
            return lost or call
        lost = self._held(method, details, t0)
        if lost is not None:
            self.timeline.record("grpc.call", self.source, side="client", method=method,
                                 request=to_dict(request), outcome=status_of(lost),
                                 duration_s=round(time.monotonic() - t0, 6))
            return lost
        self.timeline.record("grpc.call", self.source, side="client", method=method,
                             request=to_dict(request), response=to_dict(response), outcome="OK",
                             duration_s=round(time.monotonic() - t0, 6))
        return call

    def _held(self, method: str, details: Any, t0: float) -> HeldAnswerLost | None:
        """Hold the answer that came back while the kubelet's fault plan holds `method`; the error the kubelet's
        code gets instead when the hold ended any way but released (None: the answer goes on)."""
        if self.faults is None:
            return None
        timeout = getattr(details, "timeout", None)
        deadline = t0 + timeout if self.deadlines and timeout is not None else None
        fault = self.faults.hold_answer(method, deadline=deadline)
        if fault is None or fault.ended == RELEASED:
            return None
        return lost_answer(fault)

    def intercept_unary_stream(self, continuation: Callable[..., Any], details: Any, request: Message) -> Any:
        self.timeline.record("grpc.stream_open", self.source, side="client",
                             method=method_name(details.method))
        return continuation(details, request)
