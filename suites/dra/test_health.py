"""DRA-HLT: DRAResourceHealth, as the fake hardware fails, heats and recovers.

The kubelet opens NodeWatchResources on its one connection to the driver
and marks a device Unknown when no update came within its health timeout.
Device names in the stream are the driver's; for subjects wired to the fake
device backend they equal the backend's device IDs.
"""

from __future__ import annotations

from typing import Any

import grpc

from harness.checks import SHOULD, check, expect, not_applicable, not_exercised
from harness.draenv import DRAEnv
from harness.timeline import Event
from suites.dra.common import health_started, registered

HEALTHY, UNHEALTHY = "HEALTHY", "UNHEALTHY"  # dra-health HealthStatus enum
DEVICE_EVENTS = tuple(f"device.{op}" for op in ("fail", "recover", "heat", "cool", "unplug", "plug"))


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
    if not env.drives(capability):
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
    threshold, hysteresis = env.spec.thermal
    t = env.now()
    env.devices.heat(device, threshold + 10)  # type: ignore[union-attr]
    # The kubelet's view of a pod's device health comes from this stream alone: a taint the driver
    # publishes instead keeps new claims away, but the pod's allocatedResourcesStatus would still say Healthy.
    wait_health(env, t, f"{device} {UNHEALTHY} at {threshold + 10:g} C", lambda h: h.get(device) == UNHEALTHY)
    t = env.now()
    env.devices.cool(device, threshold - hysteresis - 10)  # type: ignore[union-attr]
    wait_health(env, t, f"{device} {HEALTHY} again after cooling", lambda h: h.get(device) == HEALTHY)


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
