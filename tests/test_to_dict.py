"""to_dict (the record of every gRPC message on the timeline) gives exactly MessageToDict's dict, keys in order."""

from __future__ import annotations

from typing import Any

import pytest
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from hypothesis import given, settings
from hypothesis import strategies as st
from test_list_to_dict import ordered

from harness import wire
from harness.instruments import interceptors
from harness.instruments.interceptors import message_to_dict, to_dict

FD = FieldDescriptor
MODULES = [getattr(wire, name) for name in wire.__all__ if not name.endswith("_grpc")]
MESSAGES = sorted({(m.__name__, m.DESCRIPTOR.full_name): m for mod in MODULES
                   for m in (getattr(mod, n) for n in mod.DESCRIPTOR.message_types_by_name)}.items())
TYPES = [m for _, m in MESSAGES]
INTS = {FD.CPPTYPE_INT32: (-(2**31), 2**31 - 1), FD.CPPTYPE_UINT32: (0, 2**32 - 1),
        FD.CPPTYPE_INT64: (-(2**63), 2**63 - 1), FD.CPPTYPE_UINT64: (0, 2**64 - 1)}
TEXT = st.one_of(st.just(""), st.text(max_size=6))


def scalar(data: st.DataObject, f: Any) -> Any:
    cpp = f.cpp_type
    if cpp in INTS:
        return data.draw(st.integers(*INTS[cpp]))
    if cpp == FD.CPPTYPE_BOOL:
        return data.draw(st.booleans())
    if cpp == FD.CPPTYPE_STRING:
        return data.draw(st.binary(max_size=6)) if f.type == FD.TYPE_BYTES else data.draw(TEXT)
    if cpp == FD.CPPTYPE_ENUM:
        return data.draw(st.sampled_from([v.number for v in f.enum_type.values]))
    return data.draw(st.floats(width=32 if cpp == FD.CPPTYPE_FLOAT else 64, allow_nan=False))


def fill(data: st.DataObject, msg: Message, depth: int) -> Message:
    """Set a random part of `msg`'s fields (nested messages down to `depth`), some to their default values."""
    for f in msg.DESCRIPTOR.fields:
        if not data.draw(st.booleans()):
            continue
        nested = f.cpp_type == FD.CPPTYPE_MESSAGE
        if nested and f.message_type.GetOptions().map_entry:
            key_f, value_f = f.message_type.fields_by_name["key"], f.message_type.fields_by_name["value"]
            if value_f.cpp_type == FD.CPPTYPE_MESSAGE and depth == 0:
                continue
            target = getattr(msg, f.name)
            for _ in range(data.draw(st.integers(0, 2))):
                key = scalar(data, key_f)
                if value_f.cpp_type == FD.CPPTYPE_MESSAGE:
                    fill(data, target[key], depth - 1)
                else:
                    target[key] = scalar(data, value_f)
        elif nested and depth == 0:
            continue
        elif f.is_repeated:
            values = getattr(msg, f.name)
            for _ in range(data.draw(st.integers(0, 2))):
                if nested:
                    fill(data, values.add(), depth - 1)
                else:
                    values.append(scalar(data, f))
        elif nested:
            getattr(msg, f.name).SetInParent()  # set, even when empty
            fill(data, getattr(msg, f.name), depth - 1)
        else:
            setattr(msg, f.name, scalar(data, f))
    return msg


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(TYPES), st.data())
def test_same_dict_as_message_to_dict(kind: type[Message], data: st.DataObject) -> None:
    msg = fill(data, kind(), depth=3)
    assert ordered(to_dict(msg)) == ordered(message_to_dict(msg))
    assert ordered(to_dict(msg)) == ordered(message_to_dict(msg))  # the second time from the plans made


@pytest.mark.parametrize("kind", TYPES, ids=[f"{name[1]}" for name, _ in MESSAGES])
def test_every_wire_type_unset_and_each_default(kind: type[Message]) -> None:
    assert ordered(to_dict(kind())) == ordered(message_to_dict(kind()))


def test_allocate_answer_takes_the_plan() -> None:
    """The messages an admission records never fall back to MessageToDict."""
    answer = wire.dp.AllocateResponse(container_responses=[wire.dp.ContainerAllocateResponse(
        envs={"A": "1"}, annotations={"b": "2"}, mounts=[wire.dp.Mount(container_path="/c", host_path="/h")],
        devices=[wire.dp.DeviceSpec(container_path="/dev/x", host_path="/dev/x", permissions="rw")],
        cdi_devices=[wire.dp.CDIDevice(name="example.com/gpu=gpu-0")])])
    request = wire.dp.PreferredAllocationRequest(container_requests=[
        wire.dp.ContainerPreferredAllocationRequest(available_deviceIDs=["a", "b"], allocation_size=1)])
    for msg in (answer, request, wire.dp.AllocateRequest(), wire.dp.PreferredAllocationResponse()):
        interceptors._planned_dict(msg)  # raises _Unplanned on a fallback


def test_each_record_gets_dicts_of_its_own() -> None:
    msg = wire.dp.ContainerAllocateResponse(envs={"A": "1"})
    first, second = to_dict(msg), to_dict(msg)
    first["envs"]["A"], first["mounts"] = "2", [1]
    assert second == {"envs": {"A": "1"}, "mounts": [], "devices": [], "annotations": {}, "cdi_devices": []}


def test_none_is_an_empty_dict() -> None:
    assert to_dict(None) == {}
