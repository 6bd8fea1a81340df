"""Issue 28's verdicts that were artifacts, at unit level: coverage waits for a plugin's first read (its own
poll period, up to T) and ends at once when the read comes."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from fake_devices.access import AccessTrace
from harness.spec.profiles import FAST
from harness.spec.subjects import SubjectSpec, default_backend
from harness.world.env import DPEnv


def backend_env(poll_s: float | None = None) -> DPEnv:
    spec = SubjectSpec(name="t", kind="device-plugin", command=["/bin/true"], resource="example.com/t",
                       backend=default_backend(), poll_s=poll_s)
    env = DPEnv(spec, FAST)
    assert env.devices is not None
    env.access = AccessTrace(env.devices.root, env.timeline).start()  # what start_subject does
    return env


def health_file(env: DPEnv) -> Path:
    assert env.devices is not None
    return next(env.devices.root.glob("sys/class/*/*/health"))


def test_coverage_waits_for_a_late_first_read_and_ends_on_it() -> None:
    env = backend_env()
    try:
        late = threading.Timer(0.6, health_file(env).read_text)  # a plugin whose health client starts late
        late.start()
        began = time.monotonic()
        assert env.await_read("health") == "sysfs"
        took = time.monotonic() - began
        late.join()
        assert 0.5 < took < 5.0  # it waited for the read, and not a moment past it
        env.require_drive("health")  # held to it: no not-exercised
    finally:
        env.close()


def test_a_declared_poll_period_bounds_the_wait_and_the_detail_says_so() -> None:
    env = backend_env(poll_s=0.2)
    try:
        assert env.coverage_window_s() == pytest.approx(0.4)
        began = time.monotonic()
        with pytest.raises(pytest.skip.Exception) as verdict:  # not_exercised: a skip with its marker
            env.require_drive("temperature")
        assert time.monotonic() - began < 3.0
        text = str(verdict.value)
        assert "0.4s (2 of its 0.2s poll periods" in text and "read none of the fake hardware's files" in text
    finally:
        env.close()


def test_without_a_poll_period_coverage_waits_up_to_t() -> None:
    env = backend_env()
    try:
        assert env.coverage_window_s() == FAST.reaction_s == 30.0
        assert "T, the kubelet's reaction bound" in env.coverage_window()
    finally:
        env.close()


def test_a_window_counted_from_an_earlier_moment_is_not_waited_again() -> None:
    env = backend_env(poll_s=0.2)
    try:
        long_ago = env.now() - int(10e9)
        began = time.monotonic()
        assert env.await_read("health", since_ns=long_ago) is None
        assert time.monotonic() - began < 0.2
    finally:
        env.close()
