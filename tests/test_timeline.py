"""Waits on the timeline are event-driven, bounded, and explain their timeouts."""

from __future__ import annotations

import threading

import pytest

from harness.instruments.timeline import Timeline, WaitTimeout


def test_wait_returns_an_event_recorded_later() -> None:
    tl = Timeline()
    t0 = tl.now()
    timer = threading.Timer(0.05, lambda: tl.record("kubelet.register", "kubelet", accepted=True))
    timer.start()
    try:
        event = tl.wait_for(lambda e: e.kind == "kubelet.register", 5, "a registration", t0)
    finally:
        timer.cancel()
    assert event.get("accepted") is True and event.t_ns >= t0


def test_events_before_since_are_ignored() -> None:
    tl = Timeline()
    tl.record("x", "a")
    since = tl.now()
    with pytest.raises(WaitTimeout):
        tl.wait_for(lambda e: e.kind == "x", 0.05, "a fresh x", since)


def test_timeout_says_what_was_awaited_and_seen() -> None:
    tl = Timeline()
    tl.record("kubelet.register", "kubelet", accepted=False, error="bad version")
    with pytest.raises(WaitTimeout) as info:
        tl.wait_for(lambda e: bool(e.get("accepted")), 0.05, "an accepted registration")
    text = str(info.value)
    assert text.startswith("expected an accepted registration within 0.05s; saw instead")
    assert "kubelet.register [kubelet] accepted=False, error=bad version" in text


def test_abort_ends_the_wait_early() -> None:
    tl = Timeline()
    tl.record("process.exit", "plugin", returncode=2)
    with pytest.raises(WaitTimeout) as info:
        tl.wait_for(lambda e: e.kind == "kubelet.register", 60, "a registration",
                    abort=lambda e: e.kind == "process.exit")
    assert "gave up" in str(info.value) and "returncode=2" in str(info.value)


def test_wait_quiet_returns_none_or_the_offending_event() -> None:
    tl = Timeline()
    assert tl.wait_quiet(lambda e: e.kind == "storm", 0.05) is None
    tl.record("storm", "plugin")
    assert tl.wait_quiet(lambda e: e.kind == "storm", 5) is not None
