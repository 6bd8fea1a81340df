"""list_to_dict (the fake kubelet's record of each ListAndWatch message) gives exactly MessageToDict's dict."""

from __future__ import annotations

import gc

from hypothesis import given, settings
from hypothesis import strategies as st

from harness.instruments.interceptors import list_to_dict, message_to_dict, to_dict
from harness.wire import dp

INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
TEXT = st.one_of(st.just(""), st.just("Healthy"), st.just("Unhealthy"), st.text(max_size=8))
TOPOLOGY = st.one_of(st.none(), st.lists(INT64, max_size=3))


def device(device_id: str, health: str, nodes: list[int] | None) -> dp.Device:
    d = dp.Device(ID=device_id, health=health)
    if nodes is not None:
        d.topology.SetInParent()  # set, even with no nodes: {"topology": {"nodes": []}}
        d.topology.nodes.extend(dp.NUMANode(ID=n) for n in nodes)
    return d


def ordered(value: object) -> object:
    """The dict with its keys' order made part of what compares."""
    if isinstance(value, dict):
        return [(k, ordered(v)) for k, v in value.items()]
    if isinstance(value, list):
        return [ordered(v) for v in value]
    return value


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(TEXT, TEXT, TOPOLOGY), max_size=6))
def test_same_dict_as_message_to_dict(devices: list[tuple[str, str, list[int] | None]]) -> None:
    msg = dp.ListAndWatchResponse(devices=[device(*d) for d in devices])
    assert ordered(list_to_dict(msg)) == ordered(message_to_dict(msg))
    assert ordered(list_to_dict(msg)) == ordered(message_to_dict(msg))  # the second time from its cache


def test_every_event_gets_a_list_of_its_own() -> None:
    msg = dp.ListAndWatchResponse(devices=[device("gpu-0", "Healthy", [0])])
    first, second = list_to_dict(msg), list_to_dict(msg)
    first["devices"].append({"ID": "gpu-9"})
    assert first is not second and len(second["devices"]) == 1


def test_a_device_listed_again_adds_no_containers() -> None:
    """P3: the timeline keeps every list; fresh dicts per device were 2 GB at 32 x 1,024 and most of the kubelet's
    time in the garbage collector. A device listed as before is the same (read-only) dict, a changed one a new dict."""
    many = 256
    before = dp.ListAndWatchResponse(devices=[device(f"gpu-{i}", "Healthy", [i % 2]) for i in range(many)])
    after = dp.ListAndWatchResponse(devices=[device(f"gpu-{i}", "Unhealthy" if i == 7 else "Healthy", [i % 2])
                                             for i in range(many)])
    first = list_to_dict(before)
    gc.collect()
    tracked = len(gc.get_objects())
    second = list_to_dict(after)
    assert len(gc.get_objects()) - tracked < many // 4  # a few, not three containers per device
    assert [a is b for a, b in zip(first["devices"], second["devices"], strict=True)].count(False) == 1
    assert second["devices"][7]["health"] == "Unhealthy" and first["devices"][7]["health"] == "Healthy"
    assert ordered(second) == ordered(message_to_dict(after))


def test_other_messages_go_through_to_dict() -> None:
    msg = dp.RegisterRequest(version="v1beta1", endpoint="x.sock", resource_name="example.com/gpu")
    assert list_to_dict(msg) == to_dict(msg)
