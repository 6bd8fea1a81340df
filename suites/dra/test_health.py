"""DRA-HLT: DRAResourceHealth, as the fake hardware fails, heats and recovers.

The kubelet opens NodeWatchResources on its one connection to the driver
and marks a device Unknown when no update came within its health timeout.
Device names in the stream are the driver's; for subjects wired to the fake
device backend they equal the backend's device IDs.

DRA-HLT-04 and DRA-HLT-05 are DP-HLT-06 and DP-HLT-07 on the health stream:
they need the nvml skin's NVML surface, and without it are not exercised
before the driver starts.
"""

from __future__ import annotations

from typing import Any

import grpc

from fake_devices.nvml.surface import APPLICATION_XIDS, NVML_ERROR_UNKNOWN
from harness.instruments.timeline import Event
from harness.spec.checks import SHOULD, check, expect, not_applicable, not_exercised
from harness.spec.subjects import OVER_LIMIT_C
from harness.world.draenv import DRAEnv
from suites.dra.common import health_started, registered

HEALTHY, UNHEALTHY = "HEALTHY", "UNHEALTHY"  # dra-health HealthStatus enum
DEVICE_EVENTS = tuple(f"device.{op}" for op in ("fail", "recover", "heat", "cool", "unplug", "plug", "xid",
                                                  "nvml_wait_error"))
NVML_CHECKS = ("DRA-HLT-04", "DRA-HLT-05")  # exercised only through the nvml skin's NVML surface
SURFACE_CHECKS = {"nvml": NVML_CHECKS}  # skin part -> the checks only it makes possible


def health_of(event: Event) -> dict[str, str]:
    return {d["device"]: str(d["health"]).upper() for d in event.get("devices") or []}


def first_health(env: DRAEnv) -> Event:
    """The kubelet's first health message from the driver, or the verdict why there is none."""
    if not env.kubelet_version.health_versions:
        not_applicable(f"kubelet {env.kubelet_version.name} does not call DRAResourceHealth")
    reg = registered(env)
    first = health_started(env, reg.t_ns)
    if first is None:
        expect("health" not in env.spec.observes, "a NodeWatchResources stream (the subject profile says the "
               "driver reports health)", f"no health message within {env.profile.reaction_s:g}s")
        not_applicable("the driver serves no DRAResourceHealth")
    assert first is not None
    return first


def wait_health(env: DRAEnv, since: int, want: str, test: Any) -> Event:
    return env.timeline.wait_for(
        lambda e: e.kind == "dra.health" and e.get("driver") == env.driver and test(health_of(e)),
        env.profile.reaction_s, want, since,
        relevant=("dra.health", "dra.health_stream", "process.exit", *DEVICE_EVENTS))


def expected_devices(env: DRAEnv) -> set[str] | None:
    if env.client is not None:
        return {d["name"] for s in env.slices() for d in s["spec"].get("devices", [])}
    if env.devices is not None:
        return {d.id for d in env.devices.devices() if d.present}
    return None


def backend_device(env: DRAEnv, capability: str, first: Event) -> str:
    env.require_drive(capability)
    streamed = health_of(first)
    device = next((d for d in sorted(streamed) if d in env.devices.ids()), "")  # type: ignore[union-attr]
    if not device:
        not_exercised(f"no streamed device is named like a fake device ({sorted(streamed)[:8]}): "
                      "fakelet cannot tell which one to fail")
    return device


@check("DRA-HLT-01", SHOULD, "NodeWatchResources streams every device, follows the backend within T, "
       "and refreshes within the health timeout")
def test_stream(dra_env: DRAEnv) -> None:
    env = dra_env
    first = first_health(env)
    if env.client is not None:
        env.wait_allocatable(1)  # compare with what the driver publishes, once it has
    want = expected_devices(env)
    if want is not None:
        expect(set(health_of(first)) == want, f"the full device list {sorted(want)}", str(sorted(health_of(first))))
    device = backend_device(env, "health", first)
    t = env.now()
    env.devices.fail(device)  # type: ignore[union-attr]
    wait_health(env, t, f"{device} {UNHEALTHY} after it failed", lambda h: h.get(device) == UNHEALTHY)
    t = env.now()
    env.devices.recover(device)  # type: ignore[union-attr]
    back = wait_health(env, t, f"{device} {HEALTHY} after it recovered", lambda h: h.get(device) == HEALTHY)
    # A refresh must follow within the kubelet's health timeout, or the devices turn Unknown:
    # wait for the next message (event-driven: a driver refreshing every second takes a second).
    timeout = env.profile.dra_health_timeout_s
    env.timeline.wait_for(
        lambda e: (e.kind == "dra.health" and e.get("driver") == env.driver and e.t_ns > back.t_ns)
        or (e.kind == "dra.health_unknown" and e.get("driver") == env.driver),
        timeout, f"a health refresh within {timeout:g}s (the kubelet's health timeout)", back.t_ns + 1,
        relevant=("dra.health", "dra.health_stream", "dra.health_unknown"))
    unknown = env.timeline.find(lambda e: e.kind == "dra.health_unknown" and e.get("driver") == env.driver,
                                back.t_ns)
    expect(not unknown, f"an update at least every {timeout:g}s (the kubelet's health timeout)",
           f"{unknown[0].get('device') if unknown else ''} marked Unknown at {env.at(unknown[0]) if unknown else ''}")


@check("DRA-HLT-02", SHOULD, "overtemperature shows as UNHEALTHY in the health stream and cooling as HEALTHY "
       "again (a taint the driver publishes besides is judged by DRA-TNT-01)")
def test_overtemperature(dra_env: DRAEnv) -> None:
    env = dra_env
    first = first_health(env)
    device = backend_device(env, "temperature", first)
    threshold, hysteresis = env.thermal()
    hot, cool = threshold + OVER_LIMIT_C, threshold - hysteresis - OVER_LIMIT_C
    limit = f"(the driver's limit: {env.spec.thermal_limit()})"
    t = env.now()
    env.devices.heat(device, hot)  # type: ignore[union-attr]
    # The kubelet's view of a pod's device health comes from this stream alone: a taint the driver
    # publishes instead keeps new claims away, but the pod's allocatedResourcesStatus would still say Healthy.
    wait_health(env, t, f"{device} {UNHEALTHY} at {hot:g} C {limit}", lambda h: h.get(device) == UNHEALTHY)
    t = env.now()
    env.devices.cool(device, cool)  # type: ignore[union-attr]
    wait_health(env, t, f"{device} {HEALTHY} again after cooling to {cool:g} C {limit}",
                lambda h: h.get(device) == HEALTHY)


@check("DRA-HLT-03", SHOULD, "after a health stream drops, a new NodeWatchResources call works")
def test_new_stream(dra_env: DRAEnv) -> None:
    env = dra_env
    first_health(env)
    conn = env.conn()
    version = conn.health_version
    reg = env.timeline.find(lambda e: e.kind == "dra.registered" and e.get("driver") == env.driver)[-1]
    with env.probe(reg) as probe:
        for attempt in ("first", "second"):
            try:
                stream = probe.watch_health(version, env.profile.reaction_s)
                message = next(stream, None)
                stream.close()  # cancels the call: the stream drops as when a kubelet goes away
            except grpc.RpcError as err:
                raise AssertionError(f"expected the {attempt} probe stream to work; saw {err.code().name}: "
                                     f"{err.details()}") from None
            expect(message is not None, f"a device list on the {attempt} new stream",
                   f"nothing within {env.profile.reaction_s:g}s")


def merged_health(env: DRAEnv, upto: Event) -> dict[str, str]:
    """The kubelet's view of the driver's devices once `upto` arrived (a device it lacks reads Unknown).

    A message may carry only some devices (the kubelet keeps the others as they were, healthinfo.go
    updateHealthInfo), so one message alone cannot say that no device is HEALTHY. A device whose
    health timed out reads Unknown, and a stream that ends clears the view (clearDriver).
    """
    view: dict[str, str] = {}
    for e in env.timeline.events(0):
        if e.t_ns > upto.t_ns:
            break
        if e.get("driver") != env.driver:
            continue
        if e.kind == "dra.health":
            view.update(health_of(e))
        elif e.kind == "dra.health_unknown":
            view.pop(str(e.get("device")), None)
        elif e.kind == "dra.health_stream" and e.get("state") == "ended":
            view.clear()
    return view


def nvml_device(env: DRAEnv) -> tuple[Event, str]:
    """The first health message and a streamed device, for a driver that watches NVML events."""
    nvml = env.devices.nvml if env.devices is not None else None
    if nvml is None:  # before the driver starts: without the surface there is nothing to judge
        not_exercised("the fake hardware has no NVML surface (the nvml skin gives it one)")
    first = first_health(env)
    device = backend_device(env, "health", first)
    env.require_surface_read("health", "nvml", "the driver watched no NVML events")
    return first, device


@check("DRA-HLT-04", SHOULD, "application XIDs (13, 31, 43, 45, 68, 109) do not make a device UNHEALTHY in the "
       "health stream; an XID 79 afterwards does")
def test_application_xids_are_not_device_failures(dra_env: DRAEnv) -> None:
    env = dra_env
    _, device = nvml_device(env)
    assert env.devices is not None
    t = env.now()
    for xid in APPLICATION_XIDS:
        env.devices.xid(device, xid)
    # A pod's allocatedResourcesStatus follows this stream: one UNHEALTHY message, however brief, is the bug.
    down = env.timeline.wait_quiet(
        lambda e: e.kind == "dra.health" and e.get("driver") == env.driver and health_of(e).get(device) == UNHEALTHY,
        env.profile.quiet_window_s, t)
    expect(down is None, f"{device} still {HEALTHY} {env.profile.quiet_window_s:g}s after application XIDs "
           f"{', '.join(map(str, APPLICATION_XIDS))}", f"{UNHEALTHY} at {env.at(down) if down else ''}")
    # The control: the driver does act on its events, so the quiet above means something.
    t = env.now()
    env.devices.fail(device)
    wait_health(env, t, f"{device} {UNHEALTHY} after XID 79 (fallen off the bus)",
                lambda h: h.get(device) == UNHEALTHY)


@check("DRA-HLT-05", SHOULD, "when the health source itself fails (nvmlEventSetWait errors), no device stays "
       "HEALTHY in the health stream")
def test_a_blind_driver_streams_no_healthy_device(dra_env: DRAEnv) -> None:
    env = dra_env
    first, device = nvml_device(env)
    assert env.devices is not None
    known = set(health_of(first))
    t = env.now()
    env.devices.nvml_wait_error(NVML_ERROR_UNKNOWN)
    # Judged on the kubelet's merged view: a driver may stream only the devices that changed.
    env.timeline.wait_for(
        lambda e: e.kind in ("dra.health", "dra.health_unknown") and e.get("driver") == env.driver
        and all(merged_health(env, e).get(d) != HEALTHY for d in known),
        env.profile.reaction_s, f"no device {HEALTHY} once nvmlEventSetWait fails (of {sorted(known)})", t,
        relevant=("dra.health", "dra.health_stream", "dra.health_unknown", "process.exit", *DEVICE_EVENTS))
    t = env.now()
    env.devices.nvml_wait_error(0)
    wait_health(env, t, f"{device} {HEALTHY} again once the event wait works", lambda h: h.get(device) == HEALTHY)
