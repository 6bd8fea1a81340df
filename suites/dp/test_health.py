"""DP-HLT: device health as the fake hardware changes under the plugin.

The fake device backend (fake_devices) fails, recovers, heats, cools,
unplugs and replugs devices; the plugin must tell the kubelet, in full
ListAndWatch lists, within the profile's reaction bound T.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from fake_devices.scripts import flap, run_script
from harness.checks import MUST, SHOULD, check, expect, not_applicable
from harness.env import DPEnv
from harness.timeline import Event

HEALTHY, UNHEALTHY = "Healthy", "Unhealthy"  # deviceplugin v1beta1 constants.go
DEVICE_EVENTS = tuple(f"device.{op}" for op in ("fail", "recover", "heat", "cool", "unplug", "plug"))
FLAP_CYCLES = 5
SCRIPT_TIMEOUT_S = 60.0  # a flap script that has not finished by then is a harness fault


def listed(msg: Event) -> dict[str, str]:
    return {d.get("ID", ""): d.get("health", "") for d in msg.get("message", {}).get("devices", [])}


def ready(env: DPEnv, capability: str) -> tuple[Event, str]:
    if env.devices is None or capability not in env.spec.observes:
        not_applicable(f"the subject profile does not map fake-device {capability} to the plugin")
    assert env.devices is not None
    env.start()
    reg, first = env.registered_and_listed()
    device = sorted(listed(first))[0] if listed(first) else ""
    expect(device, "at least one listed device", "an empty list")
    return reg, device


def wait_list(env: DPEnv, reg: Event, since: int, want: str, test: Callable[[dict[str, str]], bool]) -> Event:
    """The first ListAndWatch response after `since` that satisfies `test(devices)`."""
    endpoint = reg.get("endpoint_id")
    return env.timeline.wait_for(
        lambda e: e.kind == "grpc.stream_msg" and e.get("endpoint_id") == endpoint and test(listed(e)),
        env.profile.reaction_s, want, since,
        relevant=("grpc.stream_msg", "kubelet.stream_end", "process.exit", *DEVICE_EVENTS))


@check("DP-HLT-01", MUST, "a device that fails in the backend is reported Unhealthy within T")
def test_failure_reported(dp_env: DPEnv) -> None:
    env = dp_env
    reg, device = ready(env, "health")
    t = env.now()
    env.devices.fail(device)  # type: ignore[union-attr]
    wait_list(env, reg, t, f"{device} reported {UNHEALTHY} after it failed", lambda d: d.get(device) == UNHEALTHY)


@check("DP-HLT-02", MUST, "a device that recovers is reported Healthy again within T")
def test_recovery_reported(dp_env: DPEnv) -> None:
    env = dp_env
    reg, device = ready(env, "health")
    t = env.now()
    env.devices.fail(device)  # type: ignore[union-attr]
    wait_list(env, reg, t, f"{device} reported {UNHEALTHY} after it failed", lambda d: d.get(device) == UNHEALTHY)
    t = env.now()
    env.devices.recover(device)  # type: ignore[union-attr]
    wait_list(env, reg, t, f"{device} reported {HEALTHY} again after it recovered",
              lambda d: d.get(device) == HEALTHY)


@check("DP-HLT-03", MUST, "after flapping, the last reported state equals the backend's within T")
def test_flapping_converges(dp_env: DPEnv) -> None:
    env = dp_env
    reg, device = ready(env, "health")
    period = env.profile.quiet_window_s / 4
    steps = flap(device, period, FLAP_CYCLES)
    done = threading.Event()
    runner = threading.Thread(target=lambda: (run_script(env.devices, steps, env.stop_scripts), done.set()),
                              daemon=True)
    runner.start()
    expect(done.wait(SCRIPT_TIMEOUT_S), "the flap script to finish", "it still running")
    t_end = env.now()
    want = {d.id: HEALTHY if d.health == HEALTHY else UNHEALTHY
            for d in env.devices.devices() if d.present}  # type: ignore[union-attr]
    endpoint = reg.get("endpoint_id")
    sent = env.timeline.find(lambda e: e.kind == "grpc.stream_msg" and e.get("endpoint_id") == endpoint)
    if sent and listed(sent[-1]) == want:
        return  # the plugin had already caught up when the script ended
    wait_list(env, reg, t_end, f"a full list equal to the backend's {want} after {FLAP_CYCLES} flaps",
              lambda d: d == want)


@check("DP-HLT-04", SHOULD, "an overheated device is reported Unhealthy, and Healthy again once cooled")
def test_overtemperature(dp_env: DPEnv) -> None:
    env = dp_env
    reg, device = ready(env, "temperature")
    threshold, hysteresis = env.spec.thermal
    t = env.now()
    env.devices.heat(device, threshold + 10)  # type: ignore[union-attr]
    wait_list(env, reg, t, f"{device} reported {UNHEALTHY} at {threshold + 10:g} C (threshold {threshold:g} C)",
              lambda d: d.get(device) == UNHEALTHY)
    cool = threshold - hysteresis - 10
    t = env.now()
    env.devices.cool(device, cool)  # type: ignore[union-attr]
    wait_list(env, reg, t, f"{device} reported {HEALTHY} again at {cool:g} C", lambda d: d.get(device) == HEALTHY)


def healthy_count(devices: dict[str, str]) -> int:
    return sum(1 for h in devices.values() if h == HEALTHY)


@check("DP-HLT-05", SHOULD, "hot-unplug removes the device (or marks it Unhealthy); hot-plug adds it back")
def test_hotplug(dp_env: DPEnv) -> None:
    env = dp_env
    reg, device = ready(env, "hotplug")
    if env.expected_ids is None:
        _hotplug_by_count(env, reg)
        return
    t = env.now()
    env.devices.unplug(device)  # type: ignore[union-attr]
    wait_list(env, reg, t, f"{device} gone from the list, or {UNHEALTHY}, after hot-unplug",
              lambda d: d.get(device, UNHEALTHY) == UNHEALTHY)
    t = env.now()
    env.devices.plug(device)  # type: ignore[union-attr]
    wait_list(env, reg, t, f"{device} listed {HEALTHY} again after hot-plug", lambda d: d.get(device) == HEALTHY)


def _hotplug_by_count(env: DPEnv, reg: Event) -> None:
    """For plugins with their own device names: one healthy device fewer, then back."""
    assert env.devices is not None
    n = sum(1 for d in env.devices.devices() if d.present)
    device = env.devices.devices()[0].id
    t = env.now()
    env.devices.unplug(device)
    wait_list(env, reg, t, f"{n - 1} healthy devices after hot-unplugging {device}",
              lambda d: healthy_count(d) == n - 1)
    t = env.now()
    env.devices.plug(device)
    wait_list(env, reg, t, f"{n} healthy devices after hot-plugging {device} back",
              lambda d: healthy_count(d) == n and len(d) == n)
