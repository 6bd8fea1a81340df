"""DRA-RS: the ResourceSlices a driver publishes for its node."""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Any

from harness.instruments.timeline import Event
from harness.spec.checks import MUST, SHOULD, check, expect, not_exercised
from harness.spec.names import is_dns1123_label, is_dns1123_subdomain
from harness.world.draenv import DRAEnv
from suites.dra.common import registered

# resource.k8s.io validation (k8s.io/kubernetes pkg/apis/resource/validation/validation.go).
C_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
ATTRIBUTE_ID_MAX = 32  # resource.k8s.io types.go DeviceMaxIDLength
ATTRIBUTE_TYPES = ("int", "bool", "string", "version")  # resource.k8s.io DeviceAttribute: exactly one


def qualified_name_error(name: str) -> str | None:
    """resource.k8s.io QualifiedName: an optional DNS-subdomain domain, '/', a C identifier of <= 32."""
    domain, _, ident = name.rpartition("/")
    if domain and not is_dns1123_subdomain(domain):
        return f"{name!r}: domain {domain!r} is not a DNS subdomain"
    if not C_IDENTIFIER.fullmatch(ident) or len(ident) > ATTRIBUTE_ID_MAX:
        return f"{name!r}: {ident!r} is not a C identifier of at most {ATTRIBUTE_ID_MAX} characters"
    return None


def slice_errors(env: DRAEnv, slices: list[dict[str, Any]]) -> list[str]:
    errors: list[str] = []
    pools: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for s in slices:
        spec, name = s["spec"], s["metadata"]["name"]
        if spec.get("driver") != env.driver:
            errors.append(f"{name}: driver {spec.get('driver')!r}, not {env.driver!r}")
        if spec.get("nodeName") != env.node_name:
            errors.append(f"{name}: nodeName {spec.get('nodeName')!r}, not {env.node_name!r}")
        pools[spec.get("pool", {}).get("name", "")].append(s)
    for pool, members in pools.items():
        newest = max(m["spec"]["pool"].get("generation", 0) for m in members)
        current = [m for m in members if m["spec"]["pool"].get("generation", 0) == newest]
        counts = {m["spec"]["pool"].get("resourceSliceCount") for m in current}
        if counts != {len(current)}:
            errors.append(f"pool {pool!r} generation {newest}: resourceSliceCount {sorted(counts, key=str)} "
                          f"but {len(current)} slice(s)")
        seen: set[str] = set()
        for m in current:
            for device in m["spec"].get("devices", []):
                errors += device_errors(pool, device, seen)
    return errors


def device_errors(pool: str, device: dict[str, Any], seen: set[str]) -> list[str]:
    errors = []
    name = device.get("name", "")
    if not is_dns1123_label(name):
        errors.append(f"pool {pool!r}: device name {name!r} is not a DNS label")
    if name in seen:
        errors.append(f"pool {pool!r}: device name {name!r} appears twice")
    seen.add(name)
    for key, value in (device.get("attributes") or {}).items():
        why = qualified_name_error(key)
        if why:
            errors.append(f"device {name}: attribute {why}")
        types = [t for t in ATTRIBUTE_TYPES if isinstance(value, dict) and t in value]
        if len(types) != 1:
            errors.append(f"device {name}: attribute {key!r} carries {types or 'no'} value types, not exactly one")
    for key in device.get("capacity") or {}:
        why = qualified_name_error(key)
        if why:
            errors.append(f"device {name}: capacity {why}")
    return errors


def settled(env: DRAEnv) -> Event:
    """The driver's slices once published and consistent, or the last set seen."""
    registered(env)
    first = env.wait_allocatable(1)
    good = env.timeline.wait_quiet(
        lambda e: e.kind == "api.slices" and not slice_errors(env, e.get("slices")), env.profile.reaction_s,
        first.t_ns)
    return good or env.timeline.find(lambda e: e.kind == "api.slices")[-1]


@check("DRA-RS-01", MUST, "published ResourceSlices are well formed")
def test_slices_well_formed(dra_env: DRAEnv) -> None:
    env = dra_env
    env.need_api()
    event = settled(env)
    errors = slice_errors(env, event.get("slices"))
    more = f" (+{len(errors) - 6} more)" if len(errors) > 6 else ""
    expect(not errors, "well-formed slices", "; ".join(errors[:6]) + more)


@check("DRA-RS-02", SHOULD, "slices follow hot-unplug and hot-plug within T")
def test_slices_follow_hotplug(dra_env: DRAEnv) -> None:
    env = dra_env
    env.need_api()
    if env.devices is None:
        env.require_drive("hotplug")  # no fake hardware: nothing to unplug, nothing to start
    registered(env)
    # Only once the driver runs does what it read (the access trace, the NVML call log) hold it to hot-plug.
    env.require_drive("hotplug")
    assert env.devices is not None
    event = settled(env)
    published = set(event.get("devices"))
    device = next((d for d in env.devices.ids() if d in published), "")
    if not device:
        not_exercised(f"no published device is named like a fake device ({sorted(published)[:8]}): "
                      "fakelet cannot tell which one to unplug")
    t = env.now()
    env.devices.unplug(device)
    env.wait_slices(lambda e: device not in e.get("devices"), f"{device} gone from the slices after hot-unplug", t)
    t = env.now()
    env.devices.plug(device)
    env.wait_slices(lambda e: device in e.get("devices"), f"{device} back in the slices after hot-plug", t)
