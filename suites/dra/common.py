"""What several DRA checks share: getting a driver registered, published and prepared."""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Callable
from typing import Any

from harness.instruments.timeline import Event
from harness.spec.checks import expect
from harness.world.draenv import DRAEnv


def is_socket(path: str) -> tuple[bool, str]:
    """Whether `path` is a unix socket, and if not, why."""
    try:
        return stat.S_ISSOCK(os.stat(path).st_mode), "not a socket"
    except OSError as err:
        return False, err.strerror or str(err)


def offered(env: DRAEnv, shows: Callable[[Event], bool], first: Event) -> Event:
    """The driver's first slice set since `first` that `shows` a feature, else its settled slices.

    A driver publishes what its hardware offers with its devices, not minutes after them: once its slices have
    not changed for the quiet window (none of them showing the feature), they are its offer, and a check of a
    feature it does not offer says so then, not after T (each of nine such checks on dra-example-driver waited
    its 30 s out). Slices that keep changing are watched for T at most, as before.
    """
    deadline = time.monotonic() + env.profile.reaction_s

    def slices(e: Event) -> bool:
        return e.kind == "api.slices"
    while True:
        shown = env.timeline.find(lambda e: slices(e) and shows(e), first.t_ns)
        if shown:
            return shown[0]
        last = env.timeline.find(slices)[-1]
        left = deadline - time.monotonic()
        if left <= 0:
            return last
        changed = env.timeline.wait_quiet(slices, min(env.profile.quiet_window_s, left), last.t_ns + 1)
        if changed is None:
            return last


def registered(env: DRAEnv) -> Event:
    env.start()
    return env.wait_dra_registered()


def published(env: DRAEnv, count: int = 1) -> Event:
    """Registered, and its ResourceSlices offer at least `count` devices (needs the API server)."""
    env.need_api()
    reg = registered(env)
    env.wait_allocatable(count)
    return reg


def prepared(env: DRAEnv, count: int = 1) -> tuple[dict[str, str], dict[str, Any], dict[str, Any]]:
    """A pod with one claim of `count` devices, prepared through the kubelet's connection.

    Returns the pod, the allocated claim and that claim's result.
    """
    published(env, count)
    pod = env.new_pod()
    claim = env.allocated_claim(pod, count)
    uid = claim["metadata"]["uid"]
    result = env.conn().node_prepare([env.claim_ref(claim)], timeout_s=env.profile.dra_call_timeout_s)
    expect(uid in result, f"a result for claim {uid}", f"results for {sorted(result)}")
    expect(not result[uid]["error"], "no error preparing an allocated claim", repr(result[uid]["error"]))
    return pod, claim, result[uid]


def device_set(result: dict[str, Any]) -> list[tuple[str, str]]:
    return sorted((d["pool"], d["device"]) for d in result["devices"])


def health_started(env: DRAEnv, since_ns: int) -> Event | None:
    """The kubelet's first health message from the driver, or None once its stream is refused as
    Unimplemented (no DRAResourceHealth) or nothing came within T."""
    def done(e: Event) -> bool:
        if e.get("driver") != env.driver:
            return False
        return e.kind == "dra.health" or (e.kind == "dra.health_stream" and e.get("state") == "ended"
                                          and "Unimplemented" in str(e.get("error")) and not e.get("messages"))
    event = env.timeline.wait_quiet(done, env.profile.reaction_s, since_ns)
    return event if event is not None and event.kind == "dra.health" else None
