"""DRA-CAP: consumable capacity (KEP-5075, DRAConsumableCapacity: beta and on by default in 1.36).

A driver that lets several claims share one device (GPU memory under MPS-style sharing, a NIC's bandwidth)
publishes it with `allowMultipleAllocations: true` and its capacities, each with an optional requestPolicy;
a claim asks for an amount (`spec.devices.requests[].exactly.capacity.requests`), and the scheduler gives
each allocation of the device a share of its own (`shareID`) and records what it takes (`consumedCapacity`),
never more in all than the device has. These checks run on a shareable fake GPU
(fixtures/inventories/gpus-shared.yaml, when the subject's inventory has none) and judge what the driver
published through the API server, what fakelet's allocator makes of it under the rules of upstream's
structured allocator (harness/controlplane/capacity.py), and what the driver prepares for each share: the
kubelet calls NodePrepareResources for each claim on its own, and the driver finds the share in the claim's
allocation result (and may name it back in the Device's share_id, kubelet pkg/apis/dra/v1).

What a driver hands a container of its share is read from the claim's CDI edits: an environment variable
whose name ends in `_<CAPACITY>` (the capacity's name upper-cased, other characters as `_`) is taken for the
amount of that capacity the share got. A driver that names none is not held to the amount.

A driver that publishes no device allowing multiple allocations shares none: the area is not exercised.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from harness.controlplane import capacity
from harness.controlplane.allocator import AllocationError
from harness.instruments.quantity import quantity
from harness.instruments.timeline import Event, WaitTimeout
from harness.spec.checks import MUST, check, expect, not_exercised
from harness.world.cdispecs import edits_of
from harness.world.draenv import DRAEnv
from suites.dra.common import offered, registered
from suites.dra.test_partitions import current_pools

CHECKS = ("DRA-CAP-01", "DRA-CAP-02", "DRA-CAP-03")
NOTHING_SHARED = ("the driver publishes no device with allowMultipleAllocations: true: it does not share its devices "
                  "(an API server with DRAConsumableCapacity off, alpha and default off up to 1.35, drops the field)")
MAX_SHARES_TRIED = 16  # DRA-CAP-03 allocates at most this many shares before it gives up on a refusal


# -- what was published ------------------------------------------------------------------------------------------


def multi_devices(slices: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """(pool, device) of every multi-allocatable device of a complete pool, by name."""
    pools, _ = current_pools(slices)
    found = [(pool, d) for pool, current in pools.items() for s in current for d in s["spec"].get("devices") or []
             if capacity.multi_allocatable(d)]
    return sorted(found, key=lambda pd: (pd[0], pd[1].get("name", "")))


def uses_sharing(slices: list[dict[str, Any]]) -> bool:
    return any(capacity.multi_allocatable(d) or any((c or {}).get("requestPolicy") for c in
                                                    (d.get("capacity") or {}).values())
               for s in slices for d in s["spec"].get("devices") or [])


def _policy_errors(where: str, value: Fraction, policy: dict[str, Any]) -> list[str]:
    """pkg/apis/resource/validation validateRequestPolicy, in its words."""
    default = quantity(policy["default"]) if policy.get("default") is not None else None
    values = [quantity(v) for v in policy.get("validValues") or []]
    valid_range = policy.get("validRange")
    if values and valid_range:
        return [f"{where}: exactly one policy can be specified, cannot specify \"validValues\" and \"validRange\" at "
                f"the same time"]
    errors = []
    if (values or valid_range) and default is None:
        errors.append(f"{where}.default: required when {'validValues' if values else 'validRange'} is defined")
    if values:
        if values != sorted(values):
            errors.append(f"{where}.validValues: values must be sorted in ascending order")
        errors += [f"{where}.validValues: option {capacity.show(v)} is larger than capacity value "
                   f"{capacity.show(value)}" for v in values if v > value]
        if default is not None and default not in values:
            errors.append(f"{where}.validValues: default value is not valid according to the requestPolicy")
    if valid_range and default is not None:
        if valid_range.get("min") is None:
            return [*errors, f"{where}.validRange.min: required when validRange is defined"]
        low = quantity(valid_range["min"])
        high = quantity(valid_range["max"]) if valid_range.get("max") is not None else None
        step = quantity(valid_range["step"]) if valid_range.get("step") is not None else None
        if low > value:
            errors.append(f"{where}.validRange.min: min is larger than capacity value")
        if default < low:
            errors.append(f"{where}.validRange.min: default is less than min")
        if high is not None and (low > high or high > value or default > high):
            errors.append(f"{where}.validRange.max: min <= default <= max <= capacity value does not hold")
        if step is not None:
            if low + step > value:
                errors.append(f"{where}.validRange.step: one step is larger than capacity value")
            for v in [default] + ([high] if high is not None else []):
                if (v - low) % step:
                    errors.append(f"{where}.validRange.step: {capacity.show(v)} is not a multiple of a given step "
                                  f"from min")
    return errors


def capacity_errors(slices: list[dict[str, Any]]) -> list[str]:
    """What keeps the published capacities from being what the release validates, in its words."""
    pools, errors = current_pools(slices)
    for current in pools.values():
        for s in current:
            for d in s["spec"].get("devices") or []:
                for name, cap in (d.get("capacity") or {}).items():
                    policy = (cap or {}).get("requestPolicy")
                    if not policy:
                        continue
                    where = f"device {d.get('name')} capacity {name}.requestPolicy"
                    if not capacity.multi_allocatable(d):
                        errors.append(f"{where}: allowMultipleAllocations must be true")
                        continue
                    errors += _policy_errors(where, quantity(cap.get("value", "0")), policy)
    return errors


def published(env: DRAEnv) -> Event:
    """The driver's slices once they offer a multi-allocatable device and are valid within T, else the last set
    seen; not exercised when no device allows multiple allocations."""
    env.need_api()
    registered(env)
    try:
        first = env.wait_allocatable(1)
    except WaitTimeout as err:
        # WaitTimeout takes the wait's parts, not a message: an AssertionError is the same failed verdict.
        raise AssertionError(f"{err}\n(the API server refuses a slice with a requestPolicy on a device without "
                          f"allowMultipleAllocations: true, and a driver whose every slice was refused publishes "
                          f"nothing)") from None

    def good(e: Event) -> bool:
        slices = e.get("slices")
        return e.kind == "api.slices" and bool(multi_devices(slices)) and not capacity_errors(slices)
    event = offered(env, good, first)
    if not uses_sharing(event.get("slices")):
        not_exercised(NOTHING_SHARED)
    return event


# -- claims on a shared device --------------------------------------------------------------------------------


def smallest_share(device: dict[str, Any]) -> dict[str, str]:
    """A capacity request for each of the device's capacities small enough that two fit: the least its policy
    allows, or half the capacity without one (unrequested, it would take the whole of it)."""
    out = {}
    for name, cap in (device.get("capacity") or {}).items():
        policy = (cap or {}).get("requestPolicy") or {}
        valid_range = policy.get("validRange") or {}
        if valid_range.get("min") is not None:
            out[name] = str(valid_range["min"])
        elif policy.get("validValues"):
            out[name] = str(policy["validValues"][0])
        elif policy.get("default") is not None:
            out[name] = str(policy["default"])
        else:
            out[name] = capacity.show(Fraction(int(quantity(cap.get("value", "0")) // 2)))
    return out


def share_claim(env: DRAEnv, pod: dict[str, str], device: str, label: str,
                wanted: dict[str, str]) -> dict[str, Any]:
    """A one-device claim asking for `wanted`, allocated from exactly `device` (or AllocationError)."""
    assert env.allocator is not None
    env.allocator.ensure_device_class(env.device_class, env.driver)
    claim = env.allocator.create_claim(env.node_name, f"{label}-{os.urandom(3).hex()}", env.device_class, 1,
                                       capacity_requests=wanted)
    return env.allocator.allocate(claim, env.node_name, env.driver, pod, only={device})


def result_of(claim: dict[str, Any], driver: str, device: str) -> dict[str, Any]:
    results = claim["status"]["allocation"]["devices"]["results"]
    return next(r for r in results if r["driver"] == driver and r["device"] == device)


def prepare_alone(env: DRAEnv, claim: dict[str, Any], what: str) -> dict[str, Any]:
    uid = claim["metadata"]["uid"]
    result = env.conn().node_prepare([env.claim_ref(claim)], timeout_s=env.profile.dra_call_timeout_s)
    expect(uid in result and not result[uid]["error"], f"{what} prepared", repr(result.get(uid)))
    return result[uid]


def cdi_ids(result: dict[str, Any]) -> list[str]:
    return [i for d in result["devices"] for i in d["cdi_ids"]]


# -- the checks -----------------------------------------------------------------------------------------------


@check("DRA-CAP-01", MUST, "devices shared by several claims are published with capacities as the release validates",
       shared=True)
def test_capacity_published(dra_env: DRAEnv) -> None:
    env = dra_env
    event = published(env)
    errors = capacity_errors(event.get("slices"))
    more = f" (+{len(errors) - 6} more)" if len(errors) > 6 else ""
    expect(not errors, "each requestPolicy on a device with allowMultipleAllocations: true, with a default its "
                       "validRange or validValues allow, within the capacity's value", "; ".join(errors[:6]) + more)
    shared = multi_devices(event.get("slices"))
    expect(shared, "a device with allowMultipleAllocations: true in a complete pool", "none")
    names = [f"{p}/{d.get('name')}" for p, d in shared]
    env.note(f"multi-allocatable: {', '.join(names)}")


@check("DRA-CAP-02", MUST, "two claims on one shared device are each prepared with their own CDI device, and "
                           "unpreparing one leaves the other prepared", shared=True)
def test_shares_prepared_apart(dra_env: DRAEnv) -> None:
    env = dra_env
    event = published(env)
    shared = multi_devices(event.get("slices"))
    expect(shared, "a device with allowMultipleAllocations: true in a complete pool", "none")
    pool, device = shared[0]
    name = device["name"]
    wanted = smallest_share(device)
    env.note(f"two claims on {pool}/{name}, each asking for {wanted or 'no capacity'}")
    pod = env.new_pod()
    claims = []
    for label in ("share-a", "share-b"):
        try:
            claims.append(share_claim(env, pod, name, label, wanted))
        except AllocationError as err:
            raise AssertionError(f"expected two claims each asking for {wanted} of {name} (published with "
                                 f"allowMultipleAllocations: true) both allocated; the scheduler saw: {err}") from None
    shares = [result_of(c, env.driver, name).get("shareID") for c in claims]
    assert all(shares) and shares[0] != shares[1], f"fakelet's allocator gave shares {shares}"  # harness invariant
    results = [prepare_alone(env, c, f"claim {c['metadata']['name']} (share {s}) on {name}")
               for c, s in zip(claims, shares, strict=True)]
    ids = [cdi_ids(r) for r in results]
    expect(all(ids), "each claim prepared with CDI device(s)", str(ids))
    common = sorted(set(ids[0]) & set(ids[1]))
    expect(not common, f"each share of {name} prepared with CDI devices of its own (the kubelet hands each claim's "
                       f"to its own containers)", f"both claims prepared with {common}")
    for result, share in zip(results, shares, strict=True):
        named = {d.get("share_id") for d in result["devices"] if d["device"] == name} - {None}
        expect(named <= {share}, f"the Device prepared for share {share} naming that share (share_id) or none",
               str(sorted(named)))
    for i in ids:
        for cdi_id in i:
            expect(edits_of(env.sandbox.cdi_dir, cdi_id), f"a CDI spec in the CDI directory defining {cdi_id}", "none")
    uid_a = claims[0]["metadata"]["uid"]
    gone = env.conn().node_unprepare([env.claim_ref(claims[0])], timeout_s=env.profile.dra_call_timeout_s)
    expect(uid_a in gone and not gone[uid_a]["error"], f"claim {claims[0]['metadata']['name']} unprepared",
           repr(gone.get(uid_a)))
    lost = [i for i in ids[1] if not edits_of(env.sandbox.cdi_dir, i)]
    expect(not lost, f"claim {claims[1]['metadata']['name']}'s CDI device(s) {ids[1]} still defined after the other "
                     f"share of {name} was unprepared (its containers still use them)",
           f"{lost} gone from the CDI directory")


@dataclass(frozen=True)
class HwShare:
    """A capacity of a shareable fake device: the hardware's truth."""

    device: str
    uuid: str
    name: str
    total: Fraction
    step: Fraction


def hw_shares(env: DRAEnv) -> list[HwShare]:
    if env.devices is None:
        not_exercised("fakelet drives no fake hardware for this subject: it cannot tell how much a device holds")
    assert env.devices is not None
    return [HwShare(d.id, d.uuid, name, quantity(cap["total"]), quantity(cap["step"]))
            for d in env.devices.devices() if d.present and d.sharing for name, cap in sorted(d.sharing.items())]


def _label(name: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in name.lower()).strip("-")


def matched(event: Event, shares: list[HwShare]) -> tuple[dict[str, Any], str, HwShare] | None:
    """(published multi-allocatable device, its capacity key, the hardware capacity it is) for the first device
    that maps to a shareable fake device (by name, else by an attribute carrying its UUID) and publishes that
    capacity (by name, with or without a domain)."""
    for _, device in multi_devices(event.get("slices")):
        values = {str(v.get("string")) for v in (device.get("attributes") or {}).values() if "string" in v}
        for hw in shares:
            if device["name"] != _label(hw.device) and hw.uuid not in values:
                continue
            for key in device.get("capacity") or {}:
                if key.rsplit("/", 1)[-1] == hw.name:
                    return device, key, hw
    return None


def _env_values(edits: list[dict[str, Any]], key: str) -> list[str]:
    suffix = "_" + re.sub(r"[^A-Za-z0-9]", "_", key.rsplit("/", 1)[-1]).upper()
    return [value for e in edits for v in e.get("env") or []
            for var, _, value in [str(v).partition("=")] if var.upper().endswith(suffix)]


@check("DRA-CAP-03", MUST, "a shared device's capacity is honoured: no share past what the hardware holds, and each "
                           "claim prepared with the share it was allocated", shared=True)
def test_capacity_honoured(dra_env: DRAEnv) -> None:
    env = dra_env
    event = published(env)
    shares = hw_shares(env)
    found = matched(event, shares)
    if found is None:
        not_exercised(f"no multi-allocatable device maps to a shareable fake device with its capacity (shareable: "
                      f"{', '.join(f'{s.device}/{s.name}' for s in shares) or 'none'}; multi-allocatable: "
                      f"{', '.join(d['name'] for _, d in multi_devices(event.get('slices'))) or 'none'})")
    assert found is not None
    device, key, hw = found
    name = device["name"]
    published_value = (device["capacity"][key] or {}).get("value")
    env.note(f"{name} capacity {key}: published {published_value}, the hardware holds {capacity.show(hw.total)} in "
             f"steps of {capacity.show(hw.step)}")
    pod = env.new_pod()
    claims: list[dict[str, Any]] = []
    used = Fraction(0)
    refused = None
    for n in range(min(int(hw.total // hw.step) + 1, MAX_SHARES_TRIED)):
        try:
            claim = share_claim(env, pod, name, f"cap-{n}", {key: capacity.show(hw.step)})
        except AllocationError as err:
            refused = str(err)
            break
        got = (result_of(claim, env.driver, name).get("consumedCapacity") or {}).get(key)
        assert got is not None, f"fakelet's allocator recorded no consumedCapacity of {key}"  # harness invariant
        used += quantity(got)
        claims.append(claim)
        if used > hw.total:
            raise AssertionError(f"expected at most {capacity.show(hw.total)} of {key} of {name} allocated (what the "
                                 f"hardware holds); saw {len(claims)} claims each asking for "
                                 f"{capacity.show(hw.step)} allocated, {capacity.show(used)} in all: the driver "
                                 f"publishes a capacity of {published_value}")
    expect(claims, f"a claim for {capacity.show(hw.step)} of {key} (one step of the hardware's) allocatable from "
                   f"{name}", f"refused: {refused}")
    env.note(f"{len(claims)} share(s) allocated, {capacity.show(used)} of {key}; the next refused: {refused}")
    judged = 0
    for claim in claims:
        share = result_of(claim, env.driver, name)
        result = prepare_alone(env, claim, f"claim {claim['metadata']['name']} (share {share.get('shareID')})")
        edits = [e for i in cdi_ids(result) for e in edits_of(env.sandbox.cdi_dir, i)]
        values = _env_values(edits, key)
        if not values:
            continue
        judged += 1
        want = quantity(share["consumedCapacity"][key])
        amounts = [v for v in values if _quantity_or_none(v) == want]
        expect(amounts, f"claim {claim['metadata']['name']}'s CDI edits giving it the {share['consumedCapacity'][key]} "
                        f"of {key} its allocation consumed", f"{sorted(values)}")
    if not judged:
        env.note(f"the driver's CDI edits name no amount of {key} (no variable ending in _"
                 f"{key.rsplit('/', 1)[-1].upper()}): the prepared share's size is not judged")


def _quantity_or_none(value: str) -> Fraction | None:
    try:
        return quantity(value)
    except ValueError:
        return None
