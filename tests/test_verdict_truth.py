"""Issue 8's regressions at unit level: settled lists, device mapping, profile-independent bounds."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from harness.instruments.timeline import Timeline, WaitTimeout
from harness.spec.profiles import FAST, UPSTREAM
from harness.world.devicemap import ALLOCATE, EXPLICIT, IDENTITY, NONE, HardwareDevice, map_devices
from harness.world.listing import wait_settled

ENDPOINT = 7


def send(timeline: Timeline, *devices: tuple[str, str]) -> None:
    timeline.record("grpc.stream_msg", "kubelet", endpoint_id=ENDPOINT,
                    message={"devices": [{"ID": i, "health": h} for i, h in devices]})


def later(seconds: float, fn) -> threading.Timer:
    timer = threading.Timer(seconds, fn)
    timer.start()
    return timer


def test_an_empty_first_list_is_not_the_plugins_devices() -> None:
    tl = Timeline()
    send(tl)  # the legal empty first message
    later(0.05, lambda: send(tl, ("a", "Healthy"), ("b", "Healthy")))
    listing = wait_settled(tl, ENDPOINT, 5.0, settle_s=0.2)
    assert listing.settled and listing.ids == ["a", "b"] and listing.messages == 2


def test_identical_repeats_and_reordering_still_settle() -> None:
    tl = Timeline()
    stop = threading.Event()

    def repeat() -> None:
        flip = False
        while not stop.wait(0.02):
            flip = not flip
            send(tl, *([("a", "Healthy"), ("b", "Healthy")][:: -1 if flip else 1]))
    thread = threading.Thread(target=repeat, daemon=True)
    thread.start()
    try:
        listing = wait_settled(tl, ENDPOINT, 5.0, settle_s=0.2)
    finally:
        stop.set()
        thread.join(1)
    assert listing.settled and listing.ids == ["a", "b"] and listing.messages > 3


def test_a_list_that_stays_empty_is_returned_unsettled_and_no_list_at_all_times_out() -> None:
    tl = Timeline()
    send(tl)
    listing = wait_settled(tl, ENDPOINT, 0.3, settle_s=0.1)
    assert not listing.settled and listing.ids == []
    with pytest.raises(WaitTimeout):
        wait_settled(Timeline(), ENDPOINT, 0.2)


def test_stream_end_returns_what_was_applied() -> None:
    tl = Timeline()
    send(tl, ("a", "Healthy"))
    tl.record("kubelet.stream_end", "kubelet", endpoint_id=ENDPOINT, reason="EOF")
    assert wait_settled(tl, ENDPOINT, 5.0, settle_s=1.0).ids == ["a"]


HW = [HardwareDevice("gpu-0", ("/sb/hw/dev/fakelet-gpu0",), ("GPU-uuid-0", "SN0", "0000:01:00.0")),
      HardwareDevice("gpu-1", ("/sb/hw/dev/fakelet-gpu1",), ("GPU-uuid-1", "SN1", "0000:02:00.0"))]


def answer(paths: list[str] = (), envs: dict[str, str] | None = None) -> SimpleNamespace:  # type: ignore[assignment]
    return SimpleNamespace(devices=[SimpleNamespace(host_path=p) for p in paths], mounts=[], envs=envs or {},
                           cdi_devices=[], annotations={})


def test_mapping_sources_in_order() -> None:
    assert map_devices(["x"], HW, {"x": "gpu-1"}, None).source == EXPLICIT
    assert map_devices(["gpu-0", "gpu-1"], HW, None, None).pairs == {"gpu-0": "gpu-0", "gpu-1": "gpu-1"}
    assert map_devices(["gpu-0"], HW, None, None).source == IDENTITY
    answers = {"card0-0": answer(["/dev/fakelet-gpu0"]), "h1": answer(envs={"VISIBLE": "GPU-uuid-1"})}
    mapped = map_devices(["card0-0", "h1"], HW, None, lambda i: answers[i])
    assert mapped.source == ALLOCATE and mapped.pairs == {"card0-0": "gpu-0", "h1": "gpu-1"}


def test_a_mapping_that_is_not_one_to_one_maps_nothing_twice() -> None:
    both = answer(["/dev/fakelet-gpu0"])
    mapped = map_devices(["a", "b"], HW, None, lambda i: both)
    assert mapped.pairs == {} and mapped.source in (ALLOCATE, NONE)
    assert "no plugin device maps" in mapped.describe()


# Bounds a plugin is held to: a profile that changed one could change a verdict.
PLUGIN_FACING = ("dial_timeout_s", "prestart_timeout_s", "reaction_s", "startup_s", "sigterm_exit_s", "quiet_window_s",
                 "long_outage_s", "dra_call_timeout_s", "dra_health_timeout_s")


@pytest.mark.parametrize("name", PLUGIN_FACING)
def test_fast_holds_plugins_to_the_kubelets_bounds(name: str) -> None:
    assert getattr(FAST, name) == getattr(UPSTREAM, name)


def test_fast_budget_marks_slow_reactions_and_shortened_bounds_say_so() -> None:
    assert FAST.slow(10.0) and not FAST.slow(1.0) and not UPSTREAM.slow(25.0)
    short = FAST.with_reaction_bound(4)
    assert short.shortened and short.reaction_s == 4 and short.long_outage_s > 4
    with pytest.raises(ValueError, match="reaction-bound"):
        FAST.with_reaction_bound(60)
