"""DRA-BND: device binding conditions (KEP-5007, DRADeviceBindingConditions: beta and on by default in 1.36) and
device status on the claim (KEP-4817, DRAResourceClaimDeviceStatus: beta and on by default since 1.33).

A device that must be made ready for a node after it is allocated (attached through a fabric, programmed, a
switch port opened) is published with `bindingConditions` and `bindingFailureConditions`. The scheduler copies
both into the allocation result, and before it binds the pod (PreBind) waits until the driver has set every
binding condition True on the claim's `status.devices` entry of the device; a binding failure condition True
makes it give up the allocation at once (PostFilter deallocates the claim and the next attempt may pick other
devices), and without either it waits DynamicResourcesBindingTimeoutDefault, 600 s
(harness/controlplane/binding.py). The entry also carries what the driver reports of the device in use:
conditions, `data`, `networkData` (interface name, hardware address, addresses in CIDR form).

These checks run on fabric-attached NICs (fixtures/inventories/nics-fabric.yaml, when the subject's inventory
has none: the attach takes 200 ms, and fails when a check says so) and play the scheduler: fakelet's allocator
allocates from the driver's slices as upstream's does, and each check waits, within the reaction bound, for
what PreBind waits for, on a watch of the claim (harness/world/claimwatch.py).

A driver that publishes no device with binding conditions is not held to them (DRA-BND-01, -02 not exercised),
nor one that writes no device status to its device status (DRA-BND-03).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from harness.controlplane import binding
from harness.controlplane.allocator import AllocationError
from harness.instruments.timeline import Event, WaitTimeout
from harness.spec.checks import MUST, SHOULD, check, expect, not_exercised
from harness.world.claimwatch import ClaimWatch
from harness.world.draenv import DRAEnv
from suites.dra.common import offered, registered
from suites.dra.test_partitions import current_pools

CHECKS = ("DRA-BND-01", "DRA-BND-02", "DRA-BND-03")
NOTHING_BINDS = ("the driver publishes no device with bindingConditions: its devices are usable once allocated (an "
                 "API server with DRADeviceBindingConditions off, alpha and default off up to 1.35, drops the field)")
FAULT = "fabric port down (fakelet fault injection)"


# -- what was published --------------------------------------------------------------------------------------------


def binding_devices(slices: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """(pool, device) of every device of a complete pool published with binding conditions, by name."""
    pools, _ = current_pools(slices)
    found = [(pool, d) for pool, current in pools.items() for s in current for d in s["spec"].get("devices") or []
             if d.get("bindingConditions")]
    return sorted(found, key=lambda pd: (pd[0], pd[1].get("name", "")))


def parameter_errors(slices: list[dict[str, Any]]) -> list[str]:
    return [e for pool, d in binding_devices(slices)
            for e in binding.binding_parameter_errors(list(d.get("bindingConditions") or []),
                                                      list(d.get("bindingFailureConditions") or []),
                                                      f"pool {pool} device {d.get('name')}")]


def published(env: DRAEnv) -> tuple[Event, list[tuple[str, dict[str, Any]]]]:
    """The driver's slices once they offer a device with binding conditions within T, and those devices; not
    exercised when none has any."""
    env.need_api()
    registered(env)
    first = env.wait_allocatable(1)

    def good(e: Event) -> bool:
        return e.kind == "api.slices" and bool(binding_devices(e.get("slices")))
    event = offered(env, good, first)
    devices = binding_devices(event.get("slices"))
    if not devices:
        not_exercised(NOTHING_BINDS)
    return event, devices


# -- playing the scheduler ---------------------------------------------------------------------------------------


def allocate_on(env: DRAEnv, pod: dict[str, str], device: str, label: str) -> dict[str, Any]:
    """A one-device claim allocated from exactly `device` and reserved for `pod` (bindClaim), or the verdict."""
    assert env.allocator is not None
    env.allocator.ensure_device_class(env.device_class, env.driver)
    claim = env.allocator.create_claim(env.node_name, f"{label}-{os.urandom(3).hex()}", env.device_class, 1)
    try:
        return env.allocator.allocate(claim, env.node_name, env.driver, pod, only={device})
    except AllocationError as err:
        raise AssertionError(f"expected device {device} allocatable on node {env.node_name}; the scheduler saw: "
                             f"{err}") from None


def reallocate(env: DRAEnv, claim: dict[str, Any], pod: dict[str, str], device: str) -> dict[str, Any]:
    assert env.allocator is not None
    return env.allocator.allocate(claim, env.node_name, env.driver, pod, only={device})


def prebind(env: DRAEnv, claim: dict[str, Any], since_ns: int, awaiting: str) -> tuple[str, str, dict[str, Any]]:
    """What PreBind would conclude within the reaction bound: (READY or FAILED, why, the claim), or (PENDING, why,
    the last claim seen) when neither came (upstream would go on polling until its 600 s binding timeout)."""
    uid = claim["metadata"]["uid"]

    def decided(e: Event) -> bool:
        return (e.kind == "api.claim" and e.get("uid") == uid
                and binding.readiness(e.get("claim"))[0] != binding.PENDING)
    try:
        event = env.timeline.wait_for(decided, env.profile.reaction_s, awaiting, since_ns,
                                      relevant=("api.claim", "api.error", "process.exit"))
    except WaitTimeout:
        seen = env.timeline.find(lambda e: e.kind == "api.claim" and e.get("uid") == uid, since_ns)
        last = seen[-1].get("claim") if seen else claim
        return binding.PENDING, binding.readiness(last)[1], last
    state, why = binding.readiness(event.get("claim"))
    return state, why, event.get("claim")


def watching(env: DRAEnv, claim: dict[str, Any]) -> ClaimWatch:
    assert env.client is not None
    return ClaimWatch(env.client, env.timeline, claim["metadata"]["namespace"], claim["metadata"]["name"])


def show(entry: dict[str, Any] | None) -> str:
    if entry is None:
        return "no status.devices entry"
    conds = ", ".join(f"{c.get('type')}={c.get('status')}" for c in entry.get("conditions") or []) or "none"
    return f"conditions {conds}"


def check_result(claim: dict[str, Any], device: dict[str, Any]) -> dict[str, Any]:
    result = next(r for r in claim["status"]["allocation"]["devices"]["results"] if r["device"] == device["name"])
    # Harness invariant: fakelet's allocator copies them as upstream's does (allocator_incubating.go).
    assert result.get("bindingConditions") == device.get("bindingConditions"), result
    return result


# -- the fake hardware --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HwFabric:
    """A fabric-attached fake device: the hardware's truth."""

    id: str
    uuid: str
    interface: str
    mac: str
    ips: tuple[str, ...]


def hw_fabric(env: DRAEnv) -> list[HwFabric]:
    if env.devices is None:
        return []
    return [HwFabric(d.id, d.uuid, d.fabric["interface"], d.fabric["mac"], tuple(d.fabric.get("ips") or []))
            for d in env.devices.devices() if d.present and d.fabric]


def _label(name: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in name.lower()).strip("-")


def hw_of(device: dict[str, Any], hardware: list[HwFabric]) -> HwFabric | None:
    """The fabric-attached fake device a published device is: by name, else by an attribute carrying its UUID."""
    values = {str(v.get("string")) for v in (device.get("attributes") or {}).values() if "string" in v}
    return next((hw for hw in hardware if device.get("name") == _label(hw.id) or hw.uuid in values), None)


def mac(value: str) -> str:
    return value.strip().lower().replace("-", ":")


def truth_errors(entry: dict[str, Any], hw: HwFabric) -> list[str]:
    """How an entry's networkData differs from the hardware it reports on (fields it leaves out are not judged)."""
    network = entry.get("networkData") or {}
    where = f"status.devices entry of {entry.get('device')} (fake device {hw.id})"
    errors = []
    if network.get("hardwareAddress") and mac(network["hardwareAddress"]) != hw.mac:
        errors.append(f"{where}: networkData.hardwareAddress {network['hardwareAddress']}, the device's is {hw.mac}")
    if network.get("interfaceName") and network["interfaceName"] != hw.interface:
        errors.append(f"{where}: networkData.interfaceName {network['interfaceName']}, the device shows up as "
                      f"{hw.interface}")
    if network.get("ips") and hw.ips and sorted(network["ips"]) != sorted(hw.ips):
        errors.append(f"{where}: networkData.ips {sorted(network['ips'])}, the device has {sorted(hw.ips)}")
    return errors


# -- the checks ----------------------------------------------------------------------------------------------------


@check("DRA-BND-01", MUST, "a device published with bindingConditions gets every one of them set True on the claim's "
                           "device status after it is allocated, so the scheduler binds the pod", fabric=True)
def test_binding_conditions_met(dra_env: DRAEnv) -> None:
    env = dra_env
    event, devices = published(env)
    errors = parameter_errors(event.get("slices"))
    expect(not errors, "bindingConditions and bindingFailureConditions as the release validates them",
           "; ".join(errors[:6]))
    pool, device = devices[0]
    name = device["name"]
    env.note(f"{pool}/{name}: bindingConditions {device['bindingConditions']}, bindingFailureConditions "
             f"{device.get('bindingFailureConditions')}")
    pod = env.new_pod()
    start = env.timeline.now()
    claim = allocate_on(env, pod, name, "bind")
    result = check_result(claim, device)
    with watching(env, claim):
        state, why, seen = prebind(env, claim, start, f"binding conditions of {name} True")
    entry = binding.status_entry(seen, result)
    expect(state != binding.FAILED, f"the attach of {name} to succeed (no fault injected)", why)
    expect(state == binding.READY, f"every binding condition of {name} ({', '.join(result['bindingConditions'])}) "
                                   f"True on the claim's status.devices entry within "
                                   f"{env.profile.reaction_s:g}s of the allocation (the scheduler binds the pod "
                                   f"only then, and gives up after {binding.BINDING_TIMEOUT_S:g}s)",
           f"{why}; {show(entry)}")
    env.note(f"{name} ready for binding {(env.timeline.now() - start) / 1e9:.2f}s after the allocation")
    uid = claim["metadata"]["uid"]
    prepared = env.conn().node_prepare([env.claim_ref(claim)], timeout_s=env.profile.dra_call_timeout_s)
    expect(uid in prepared and not prepared[uid]["error"], f"claim {claim['metadata']['name']} prepared once the pod "
                                                           f"is bound", repr(prepared.get(uid)))


@check("DRA-BND-02", SHOULD, "a device whose attach fails gets a bindingFailureCondition True (the scheduler gives up "
                             "the allocation at once, not after 600 s), and is attached again when allocated again",
       fabric=True)
def test_binding_failure_reported(dra_env: DRAEnv) -> None:
    env = dra_env
    _, devices = published(env)
    hardware = hw_fabric(env)
    found = next(((pool, d, hw) for pool, d in devices if (hw := hw_of(d, hardware)) is not None), None)
    if found is None:
        not_exercised(f"no device with bindingConditions maps to a fabric-attached fake device whose attach fakelet "
                      f"can fail (fabric-attached: {', '.join(h.id for h in hardware) or 'none'}; with "
                      f"bindingConditions: {', '.join(d['name'] for _, d in devices)})")
    assert found is not None
    pool, device, hw = found
    name = device["name"]
    if not device.get("bindingFailureConditions"):
        raise AssertionError(f"expected device {name} published with bindingFailureConditions beside its "
                             f"bindingConditions (the API server requires both); saw none")
    env.devices.fabric_fault(hw.id, FAULT)  # type: ignore[union-attr]
    env.note(f"every attach of {hw.id} ({pool}/{name}) fails: {FAULT}")
    pod = env.new_pod()
    start = env.timeline.now()
    claim = allocate_on(env, pod, name, "fail")
    result = check_result(claim, device)
    with watching(env, claim):
        state, why, seen = prebind(env, claim, start, f"a binding failure condition of {name} True")
        entry = binding.status_entry(seen, result)
        expect(state != binding.READY, f"no binding condition of {name} True while its attach fails",
               f"{why}; {show(entry)}")
        expect(state == binding.FAILED,
               f"one of {name}'s bindingFailureConditions ({', '.join(result['bindingFailureConditions'])}) True on "
               f"the claim's status.devices entry within {env.profile.reaction_s:g}s (without it the scheduler "
               f"waits {binding.BINDING_TIMEOUT_S:g}s before it tries other devices)", f"{why}; {show(entry)}")
        env.note(f"binding failure reported: {why}")
        # PostFilter gives the allocation up; the next attempt finds the device again, which now attaches.
        binding.deallocate(env.client, claim)  # type: ignore[arg-type]
        env.devices.fabric_fault(hw.id, "")  # type: ignore[union-attr]
        again = env.timeline.now()
        try:
            claim = reallocate(env, claim, pod, name)
        except AllocationError as err:
            raise AssertionError(f"expected {name} allocatable again after the failed binding was given up; the "
                                 f"scheduler saw: {err}") from None
        state, why, seen = prebind(env, claim, again, f"binding conditions of {name} True after the fault cleared")
    expect(state == binding.READY, f"{name}, allocated again once its attach works, ready for binding within "
                                   f"{env.profile.reaction_s:g}s (a failed attach must not stick to the device)",
           f"{why}; {show(binding.status_entry(seen, result))}")


@check("DRA-BND-03", MUST, "the device status a driver writes on a claim names only the claim's allocated devices "
                           "of its own, is what the release validates, and its networkData is the device's",
       fabric=True)
def test_device_status_true(dra_env: DRAEnv) -> None:
    env = dra_env
    env.need_api()
    registered(env)
    first = env.wait_allocatable(1)
    event = offered(env, lambda e: bool(binding_devices(e.get("slices"))), first)
    with_conditions = binding_devices(event.get("slices"))
    pools, _ = current_pools(event.get("slices"))
    every = sorted(d["name"] for current in pools.values() for s in current for d in s["spec"].get("devices") or [])
    name = with_conditions[0][1]["name"] if with_conditions else (every[0] if every else None)
    expect(name, "a device in a complete pool", "none")
    assert name is not None
    pod = env.new_pod()
    start = env.timeline.now()
    claim = allocate_on(env, pod, name, "status")
    uid = claim["metadata"]["uid"]

    def settled(e: Event) -> bool:
        c = e.get("claim")
        return (e.kind == "api.claim" and e.get("uid") == uid and bool((c.get("status") or {}).get("devices"))
                and binding.readiness(c)[0] != binding.PENDING)
    with watching(env, claim):
        found = env.timeline.wait_quiet(settled, env.profile.reaction_s, start)
        if found is None:  # entries without the binding conditions decided, or none at all
            found = next(iter(reversed(env.timeline.find(
                lambda e: e.kind == "api.claim" and e.get("uid") == uid
                and bool((e.get("claim").get("status") or {}).get("devices")), start))), None)
    if found is None:
        not_exercised(f"the driver wrote no status.devices entry on claim {claim['metadata']['name']} (allocated "
                      f"{name}) within {env.profile.reaction_s:g}s: it reports no device status")
    assert found is not None
    seen = found.get("claim")
    entries = list(seen["status"]["devices"])
    allocated = binding.allocated_ids(seen)
    errors = [e for i, entry in enumerate(entries)
              for e in binding.entry_errors(entry, allocated, f"status.devices[{i}]")]
    errors += [f"status.devices[{i}]: driver {entry.get('driver')}, not {env.driver}"
               for i, entry in enumerate(entries) if entry.get("driver") != env.driver]
    expect(not errors, "status.devices entries the release validates, each of an allocated device of the driver's",
           "; ".join(errors[:6]))
    hardware = hw_fabric(env)
    published_devices = {d["name"]: d for current in pools.values() for s in current
                         for d in s["spec"].get("devices") or []}
    judged = []
    for entry in entries:
        hw = hw_of(published_devices.get(entry.get("device"), {"name": entry.get("device")}), hardware)
        if hw is None or not entry.get("networkData"):
            continue
        judged.append(entry["device"])
        wrong = truth_errors(entry, hw)
        expect(not wrong, f"the networkData of {entry['device']} what the device is", "; ".join(wrong))
    env.note(f"{len(entries)} status.devices entr{'y' if len(entries) == 1 else 'ies'}; networkData judged against "
             f"the hardware: {', '.join(judged) or 'none (no entry with networkData on a fabric-attached device)'}")
