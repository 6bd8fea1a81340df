"""DP-HLT: device health as the fake hardware changes under the plugin.

The fake device backend (fake_devices) fails, recovers, heats, cools,
unplugs and replugs devices; the plugin must tell the kubelet, in full
ListAndWatch lists, within the kubelet's reaction bound T.

A check drives the plugin only through a source it reads: the subject says
so (`observes`), or the access trace shows it read that source. It follows
one device by its plugin ID when the device mapping knows it, and otherwise
by counting (one healthy device fewer), which fits plugins that name devices
their own way. A plugin fakelet cannot drive gets "not exercised", never a pass.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from fake_devices.nvml.surface import APPLICATION_XIDS, NVML_ERROR_DRIVER_NOT_LOADED, NVML_ERROR_UNKNOWN
from fake_devices.scripts import flap, run_script
from harness.instruments.timeline import Event, WaitTimeout, describe
from harness.spec.checks import MUST, SHOULD, check, expect, not_exercised
from harness.spec.subjects import OVER_LIMIT_C
from harness.world.devicemap import IDENTITY, DeviceMap
from harness.world.env import DPEnv
from harness.world.listing import Listing, devices_of

HEALTHY, UNHEALTHY = "Healthy", "Unhealthy"  # deviceplugin v1beta1 constants.go
DEVICE_EVENTS = tuple(f"device.{op}" for op in ("fail", "recover", "heat", "cool", "unplug", "plug"))
FLAP_CYCLES = 5
FLAP_PERIOD_S = 0.25  # fixed in every profile: a verdict must not depend on the profile
SHOWN_DEVICES = 8  # devices of a list quoted in a detail: a 100,000-device list is counted, not copied
SCRIPT_TIMEOUT_S = 60.0  # a flap script that has not finished by then is a harness fault
NVML_CHECKS = ("DP-HLT-06", "DP-HLT-07", "DP-HLT-08")  # exercised only through the nvml skin's NVML surface
LEVELZERO_CHECKS = ("DP-HLT-09",)  # exercised only through the drm skin's Level-Zero sidecar
SURFACE_CHECKS = {"nvml": NVML_CHECKS, "drm": LEVELZERO_CHECKS}  # skin -> the checks only it makes possible


@dataclass(frozen=True)
class Target:
    """The device a check changes: its inventory ID, and its plugin ID when mapped (else by count)."""

    inventory_id: str
    plugin_id: str | None
    total: int  # devices listed when the check began
    healthy: int

    def describe(self) -> str:
        return self.plugin_id if self.plugin_id is not None else f"one device (inventory {self.inventory_id})"


def ready(env: DPEnv, capability: str) -> tuple[Event, Target]:
    if env.devices is None:
        not_exercised("fakelet drives no fake hardware for this subject (give it --inventory or a backend)")
    env.start()
    reg, listing = env.registered_and_listed()
    env.need_devices(listing, 1)
    env.require_drive(capability)
    return reg, target(env, reg, listing)


def target(env: DPEnv, reg: Event, listing: Listing) -> Target:
    mapping = env.device_map(reg, listing)
    for plugin_id in listing.healthy:
        inventory_id = mapping.inventory_id(plugin_id)
        if inventory_id is not None:
            return Target(inventory_id, plugin_id, len(listing.ids), len(listing.healthy))
    present = [h.id for h in env.hardware()]
    if len(listing.ids) != len(present) or len(listing.healthy) != len(present):
        not_exercised(f"no listed device maps to an inventory device ({mapping.describe()}), and the plugin lists "
                      f"{len(listing.ids)} devices for {len(present)} fake ones, so counting cannot tell either")
    env.note(f"followed by count: {mapping.describe()}")
    return Target(present[0], None, len(listing.ids), len(listing.healthy))


def health_counts(devices: dict[str, str]) -> tuple[int, int]:
    return sum(1 for h in devices.values() if h == HEALTHY), len(devices)


def is_down(t: Target) -> Callable[[dict[str, str]], bool]:
    """The target reported Unhealthy (by ID), or one healthy device fewer with none removed (by count)."""
    if t.plugin_id is not None:
        return lambda d: d.get(t.plugin_id) == UNHEALTHY
    return lambda d: health_counts(d) == (t.healthy - 1, t.total)


def is_gone_or_down(t: Target) -> Callable[[dict[str, str]], bool]:
    if t.plugin_id is not None:
        return lambda d: d.get(t.plugin_id, UNHEALTHY) == UNHEALTHY
    return lambda d: health_counts(d)[0] == t.healthy - 1


def is_up(t: Target) -> Callable[[dict[str, str]], bool]:
    if t.plugin_id is not None:
        return lambda d: d.get(t.plugin_id) == HEALTHY
    return lambda d: health_counts(d) == (t.healthy, t.total)


def wait_list(env: DPEnv, reg: Event, since: int, want: str, test: Callable[[dict[str, str]], bool]) -> Event:
    """The first ListAndWatch response after `since` that satisfies `test(devices)`."""
    endpoint = reg.get("endpoint_id")
    try:
        event = env.timeline.wait_for(
            lambda e: e.kind == "grpc.stream_msg" and e.source == "kubelet" and e.get("endpoint_id") == endpoint
            and test(devices_of(e)),
            env.profile.reaction_s, want, since,
            relevant=("grpc.stream_msg", "kubelet.stream_end", "process.exit", *DEVICE_EVENTS))
    except WaitTimeout as err:
        # Nothing new within T can still follow a state the plugin reported before: say which, and why.
        raise AssertionError(f"{err}\n{last_reported(env, reg)}") from None
    env.timed(event, since, want)
    return event


def last_reported(env: DPEnv, reg: Event) -> str:
    """The last device list the plugin sent on this registration, and the backend change that came before it."""
    endpoint = reg.get("endpoint_id")
    sent = env.timeline.find(lambda e: e.kind == "grpc.stream_msg" and e.source == "kubelet"
                             and e.get("endpoint_id") == endpoint)
    if not sent:
        return "the plugin sent no device list on this registration"
    last = sent[-1]
    devices = devices_of(last)
    healthy, total = health_counts(devices)
    shown = ", ".join(f"{d}={h}" for d, h in sorted(devices.items())[:SHOWN_DEVICES])
    more = f" and {total - SHOWN_DEVICES} more" if total > SHOWN_DEVICES else ""
    changes = [e for e in env.timeline.events() if e.kind in DEVICE_EVENTS]
    # The plugin may answer a change before the backend's own record of it lands: the nearest one led to it.
    cause = min(changes, key=lambda e: abs(e.t_ns - last.t_ns)) if changes else None
    led = f", answering {describe(cause, env.timeline.origin_ns)}" if cause is not None else ""
    later = [e for e in changes if e.t_ns > last.t_ns and e is not cause]
    since = f"; no list since, through {len(later)} more backend change{'s' * (len(later) != 1)}" if later else ""
    return (f"the last state the plugin reported: {healthy} of {total} {HEALTHY} ({shown}{more}) at "
            f"{env.at(last)}{led}{since}")


@check("DP-HLT-01", MUST, "a device that fails in the backend is reported Unhealthy within T")
def test_failure_reported(dp_env: DPEnv) -> None:
    env = dp_env
    reg, t = ready(env, "health")
    since = env.now()
    env.devices.fail(t.inventory_id)  # type: ignore[union-attr]
    wait_list(env, reg, since, f"{t.describe()} reported {UNHEALTHY} after it failed", is_down(t))


@check("DP-HLT-02", MUST, "a device that recovers is reported Healthy again within T")
def test_recovery_reported(dp_env: DPEnv) -> None:
    env = dp_env
    reg, t = ready(env, "health")
    since = env.now()
    env.devices.fail(t.inventory_id)  # type: ignore[union-attr]
    wait_list(env, reg, since, f"{t.describe()} reported {UNHEALTHY} after it failed", is_down(t))
    since = env.now()
    env.devices.recover(t.inventory_id)  # type: ignore[union-attr]
    wait_list(env, reg, since, f"{t.describe()} reported {HEALTHY} again after it recovered", is_up(t))


@check("DP-HLT-03", MUST, "after flapping, the last reported state equals the backend's within T")
def test_flapping_converges(dp_env: DPEnv) -> None:
    env = dp_env
    reg, t = ready(env, "health")
    steps = flap(t.inventory_id, FLAP_PERIOD_S, FLAP_CYCLES)
    done = threading.Event()
    runner = threading.Thread(target=lambda: (run_script(env.devices, steps, env.stop_scripts), done.set()),
                              daemon=True)
    runner.start()
    expect(done.wait(SCRIPT_TIMEOUT_S), "the flap script to finish", "it still running")
    t_end = env.now()
    want = backend_view(env, env.mapping)
    if want is not None:
        test: Callable[[dict[str, str]], bool] = lambda d: d == want  # noqa: E731
        what = f"a full list equal to the backend's {want}"
    else:
        final = env.devices.state(t.inventory_id)["health"]  # type: ignore[union-attr]
        test = is_up(t) if final == HEALTHY else is_down(t)
        what = f"{t.describe()} reported {final}, as the backend has it"
    endpoint = reg.get("endpoint_id")
    sent = env.timeline.find(lambda e: e.kind == "grpc.stream_msg" and e.source == "kubelet"
                             and e.get("endpoint_id") == endpoint)
    if sent and test(devices_of(sent[-1])):
        return  # the plugin had already caught up when the script ended
    wait_list(env, reg, t_end, f"{what} after {FLAP_CYCLES} flaps", test)


def backend_view(env: DPEnv, mapping: DeviceMap) -> dict[str, str] | None:
    """The whole list the backend implies, by plugin ID, when every present fake device has one."""
    view = {}
    for d in env.devices.devices():  # type: ignore[union-attr]
        if not d.present:
            continue
        plugin_id = mapping.plugin_id(d.id) or (d.id if mapping.source == IDENTITY else None)
        if plugin_id is None:
            return None
        view[plugin_id] = HEALTHY if d.health == HEALTHY else UNHEALTHY
    return view


@check("DP-HLT-04", SHOULD, "an overheated device is reported Unhealthy, and Healthy again once cooled")
def test_overtemperature(dp_env: DPEnv) -> None:
    env = dp_env
    reg, t = ready(env, "temperature")
    threshold, hysteresis = env.thermal()
    hot, cool = threshold + OVER_LIMIT_C, threshold - hysteresis - OVER_LIMIT_C
    since = env.now()
    env.devices.heat(t.inventory_id, hot)  # type: ignore[union-attr]
    wait_list(env, reg, since, f"{t.describe()} reported {UNHEALTHY} at {hot:g} C (the plugin's limit: "
              f"{env.spec.thermal_limit()})", is_down(t))
    since = env.now()
    env.devices.cool(t.inventory_id, cool)  # type: ignore[union-attr]
    wait_list(env, reg, since, f"{t.describe()} reported {HEALTHY} again at {cool:g} C (the plugin's limit: "
              f"{env.spec.thermal_limit()})", is_up(t))


@check("DP-HLT-05", SHOULD, "hot-unplug removes the device (or marks it Unhealthy); hot-plug adds it back")
def test_hotplug(dp_env: DPEnv) -> None:
    env = dp_env
    reg, t = ready(env, "hotplug")
    since = env.now()
    env.devices.unplug(t.inventory_id)  # type: ignore[union-attr]
    wait_list(env, reg, since, f"{t.describe()} gone from the list, or {UNHEALTHY}, after hot-unplug",
              is_gone_or_down(t))
    since = env.now()
    env.devices.plug(t.inventory_id)  # type: ignore[union-attr]
    wait_list(env, reg, since, f"{t.describe()} listed {HEALTHY} again after hot-plug", is_up(t))


def ready_nvml(env: DPEnv) -> tuple[Event, Target]:
    """As `ready`, for a plugin that watches NVML events (the nvml skin, its call log)."""
    nvml = env.devices.nvml if env.devices is not None else None
    if nvml is None:  # before anything starts: without the surface there is nothing to judge
        not_exercised("the fake hardware has no NVML surface (the nvml skin gives it one)")
    reg, t = ready(env, "health")
    env.require_surface_read("health", "nvml", "the plugin watched no NVML events")
    return reg, t


@check("DP-HLT-06", SHOULD, "application XIDs (13, 31, 43, 45, 68, 109) do not make a GPU unhealthy; "
       "an XID 79 afterwards does")
def test_application_xids_are_not_device_failures(dp_env: DPEnv) -> None:
    env = dp_env
    reg, t = ready_nvml(env)
    assert env.devices is not None
    since = env.now()
    for xid in APPLICATION_XIDS:
        env.devices.xid(t.inventory_id, xid)
    endpoint = reg.get("endpoint_id")
    down = env.timeline.wait_quiet(
        lambda e: e.kind == "grpc.stream_msg" and e.source == "kubelet" and e.get("endpoint_id") == endpoint
        and is_down(t)(devices_of(e)), env.profile.quiet_window_s, since)
    expect(down is None, f"{t.describe()} still {HEALTHY} {env.profile.quiet_window_s:g}s after application XIDs "
           f"{', '.join(map(str, APPLICATION_XIDS))}", f"{UNHEALTHY} at {env.at(down) if down else ''}")
    # The control: the plugin does act on its events, so the quiet above means something.
    since = env.now()
    env.devices.fail(t.inventory_id)
    wait_list(env, reg, since, f"{t.describe()} reported {UNHEALTHY} after XID 79 (fallen off the bus)", is_down(t))


@check("DP-HLT-07", SHOULD, "when the health source itself fails (nvmlEventSetWait errors), no GPU stays advertised "
       "Healthy")
def test_a_blind_plugin_advertises_no_healthy_gpu(dp_env: DPEnv) -> None:
    env = dp_env
    reg, t = ready_nvml(env)
    assert env.devices is not None and env.devices.nvml is not None
    since = env.now()
    env.devices.nvml_wait_error(NVML_ERROR_UNKNOWN)
    wait_list(env, reg, since, f"no device {HEALTHY} once nvmlEventSetWait fails",
              lambda d: bool(d) and health_counts(d)[0] == 0)
    since = env.now()
    env.devices.nvml_wait_error(0)
    wait_list(env, reg, since, f"{t.describe()} {HEALTHY} again once the event wait works", is_up(t))


@check("DP-HLT-08", SHOULD, "a plugin whose NVML does not initialize advertises no healthy GPU")
def test_no_healthy_gpu_without_nvml(dp_env: DPEnv) -> None:
    env = dp_env
    nvml = env.devices.nvml if env.devices is not None else None
    if env.devices is None or nvml is None:
        not_exercised("the fake hardware has no NVML surface (the nvml skin gives it one)")
    env.devices.nvml_init_error(NVML_ERROR_DRIVER_NOT_LOADED)  # before the plugin's first call
    since = env.now()
    env.start()
    resource = env.spec.resource
    # Until the plugin advertises healthy capacity (the bug), gives up (exits), or T passes.
    first = env.timeline.wait_quiet(
        lambda e: (env.allocatable_in(e, resource) or 0) > 0 or (e.kind == "process.exit" and env.is_mine(e)),
        env.profile.reaction_s, since)
    if not nvml.reads("init"):
        not_exercised(f"the plugin never initialized NVML (its NVML calls: {nvml.summary() or 'none'})")
    advertised = env.allocatable_in(first, resource) if first is not None else None
    expect(not advertised, f"no healthy {resource} on the Node while nvmlInit fails (NVML_ERROR_DRIVER_NOT_LOADED)",
           f"allocatable {advertised} at {env.at(first) if first else ''}")


@check("DP-HLT-09", SHOULD, "while the Level-Zero sidecar is down, no GPU stays advertised Healthy; once it is back, "
       "they are Healthy again")
def test_a_plugin_without_its_sidecar_advertises_no_healthy_gpu(dp_env: DPEnv) -> None:
    env = dp_env
    sidecar = env.levelzero
    if sidecar is None:  # before anything starts: without the sidecar there is nothing to judge
        not_exercised("the fake hardware has no Level-Zero sidecar (the drm skin serves one)")
    reg, t = ready(env, "health")
    env.require_surface_read("health", "levelzero", "the plugin never asked the Level-Zero sidecar for health")
    since = env.now()
    sidecar.stop()
    wait_list(env, reg, since, f"no device {HEALTHY} while the Level-Zero sidecar is down",
              lambda d: bool(d) and health_counts(d)[0] == 0)
    since = env.now()
    sidecar.start()
    wait_list(env, reg, since, f"{t.describe()} {HEALTHY} again once the sidecar is back", is_up(t))
