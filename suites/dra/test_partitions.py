"""DRA-PRT: partitionable devices (KEP-4815, DRAPartitionableDevices: beta and on by default in 1.36).

A driver that cuts a GPU into overlapping partitions (MIG) publishes CounterSets (`sharedCounters`)
and devices that consume from them (`consumesCounters`); the scheduler then never hands out two
devices whose counters together exceed the set's. These checks run on partitioned fake GPUs
(fixtures/inventories/gpus-partitioned.yaml, when the subject's inventory has none) and judge what
the driver published through the API server, what fakelet's allocator makes of it under the rules of
upstream's structured allocator (harness/controlplane/counters.py), and what the driver prepares.
Which published device is which partition comes from the fake hardware: a device maps to the
partition (or whole GPU) it is named after or whose UUID one of its attributes carries.

A driver that publishes no counters does not partition its devices: the area is not exercised.
"""

from __future__ import annotations

import os
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from harness.controlplane import counters
from harness.controlplane.allocator import AllocationError
from harness.instruments.timeline import Event, WaitTimeout
from harness.spec.checks import MUST, check, expect, not_exercised
from harness.world.cdispecs import edits_of
from harness.world.draenv import DRAEnv
from suites.dra.common import device_set, offered, registered

CHECKS = ("DRA-PRT-01", "DRA-PRT-02", "DRA-PRT-03")
NOTHING_PARTITIONED = ("the driver publishes no CounterSet (sharedCounters) and no device that consumes counters: "
                       "it does not partition its devices")


# -- what was published ------------------------------------------------------------------------------------------


def current_pools(slices: list[dict[str, Any]]) -> tuple[dict[str, list[dict[str, Any]]], list[str]]:
    """(pool -> slices of its newest generation, for complete pools; why each other pool is incomplete)."""
    by_pool: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for s in slices:
        by_pool[s["spec"].get("pool", {}).get("name", "")].append(s)
    complete, incomplete = {}, []
    for pool, members in sorted(by_pool.items()):
        newest = max(int(m["spec"]["pool"].get("generation", 0)) for m in members)
        current = [m for m in members if int(m["spec"]["pool"].get("generation", 0)) == newest]
        counts = {int(m["spec"]["pool"].get("resourceSliceCount", 0)) for m in current}
        if counts == {len(current)}:
            complete[pool] = current
        else:
            incomplete.append(f"pool {pool!r} generation {newest}: resourceSliceCount {sorted(counts)} but "
                              f"{len(current)} slice(s)")
    return complete, incomplete


def uses_counters(slices: list[dict[str, Any]]) -> bool:
    return any(s["spec"].get("sharedCounters") or any(d.get("consumesCounters") for d in s["spec"].get("devices")
                                                      or []) for s in slices)


def partition_errors(slices: list[dict[str, Any]]) -> list[str]:
    """What keeps the published counters from being what the release validates and the scheduler allocates from."""
    pools, errors = current_pools(slices)
    for pool, current in pools.items():
        consuming = any(d.get("consumesCounters") for s in current for d in s["spec"].get("devices") or [])
        for s in current:
            name, spec = s["metadata"]["name"], s["spec"]
            if spec.get("sharedCounters") and spec.get("devices"):
                errors.append(f"slice {name} holds sharedCounters and devices: only one of `sharedCounters` or "
                              f"`devices` is allowed (pkg/apis/resource/validation)")
            elif consuming and not spec.get("sharedCounters") and not spec.get("devices"):
                errors.append(f"slice {name} holds neither devices nor sharedCounters: an API server with "
                              f"DRAPartitionableDevices off (alpha, default off up to 1.35) drops sharedCounters")
        why = counters.invalid_reason(current)
        if why is not None:
            errors.append(f"pool {pool!r}: {why} (the scheduler takes the pool for invalid and allocates none of it)")
            continue
        sets = counters.counter_sets(current)
        for s in current:
            if counters.is_counter_slice(s):
                continue
            for device in s["spec"].get("devices") or []:
                for use in device.get("consumesCounters") or []:
                    have = sets[use["counterSet"]]
                    for counter, value in (use.get("counters") or {}).items():
                        if counters.quantity(value.get("value", "0")) > have[counter]:
                            errors.append(f"pool {pool!r}: device {device['name']} consumes {value.get('value')} of "
                                          f"counter {counter} of set {use['counterSet']}, which has only "
                                          f"{have[counter]}: it can never be allocated")
    return errors


def published(env: DRAEnv) -> Event:
    """The driver's slices once complete and consistent within T, else the last set seen; not exercised when they
    carry no counters."""
    env.need_api()
    registered(env)
    try:
        first = env.wait_allocatable(1)
    except WaitTimeout as err:
        # WaitTimeout takes the wait's parts, not a message: an AssertionError is the same failed verdict.
        raise AssertionError(f"{err}\n(the API server refuses a slice that holds both sharedCounters and devices, "
                          f"and a driver whose every slice was refused publishes nothing)") from None

    def good(e: Event) -> bool:
        slices = e.get("slices")
        return e.kind == "api.slices" and uses_counters(slices) and not partition_errors(slices)
    event = offered(env, good, first)
    if not uses_counters(event.get("slices")):
        not_exercised(NOTHING_PARTITIONED)
    return event


# -- which published device is which piece of hardware --------------------------------------------------------


@dataclass(frozen=True)
class Unit:
    """A whole fake GPU or one of its partitions: the memory slices it takes."""

    id: str
    gpu: str
    slices: frozenset[int]
    node: str
    uuid: str
    whole: bool

    def overlaps(self, other: Unit) -> bool:
        return self.gpu == other.gpu and bool(self.slices & other.slices)


def units(env: DRAEnv) -> list[Unit]:
    if env.devices is None:
        not_exercised("fakelet drives no fake hardware for this subject: it cannot tell which partitions overlap")
    assert env.devices is not None
    out = []
    for d in env.devices.devices():
        if not d.present or not d.partitions:
            continue
        out.append(Unit(d.id, d.id, frozenset(range(d.partitions["slices"])), d.node, d.uuid, True))
        out += [Unit(p.id, d.id, p.slices, p.node, p.uuid, False) for p in d.partition_list()]
    return out


def _label(name: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in name.lower()).strip("-")


def mapped(event: Event, hardware: list[Unit]) -> dict[str, tuple[str, Unit]]:
    """Published device name -> (its pool, the unit it is), for the devices of complete pools that map to one unit:
    by name first, else by an attribute carrying the unit's UUID (a partition's over its GPU's, which a partition
    may carry too as its parent)."""
    pools, _ = current_pools(event.get("slices"))
    by_name = {_label(u.id): u for u in hardware}
    out: dict[str, tuple[str, Unit]] = {}
    for pool, current in pools.items():
        for s in current:
            if counters.is_counter_slice(s):
                continue
            for device in s["spec"].get("devices") or []:
                unit = by_name.get(device["name"])
                if unit is None:
                    values = {str(v.get("string")) for v in (device.get("attributes") or {}).values() if "string" in v}
                    hits = [u for u in hardware if u.uuid in values]
                    hits = [u for u in hits if not u.whole] or hits
                    unit = hits[0] if len(hits) == 1 else None
                if unit is not None:
                    out[device["name"]] = (pool, unit)
    return out


def overlapping_pair(found: dict[str, tuple[str, Unit]]) -> tuple[str, str, str | None] | None:
    """(a partition, a smaller one inside it, one that shares nothing with the first or None) of one GPU, by
    published name: partitions first, the whole GPU only when no two partitions overlap."""
    by_unit = sorted(found.items(), key=lambda kv: (kv[1][1].whole, -len(kv[1][1].slices), kv[1][1].id))
    for big, (_, b) in by_unit:
        inside = [n for n, (_, u) in by_unit if n != big and u.overlaps(b) and len(u.slices) < len(b.slices)]
        if inside:
            apart = [n for n, (_, u) in by_unit if u.gpu == b.gpu and not u.overlaps(b)]
            return big, inside[-1], apart[0] if apart else None
    return None


def claim_for(env: DRAEnv, pod: dict[str, str], device: str, label: str) -> dict[str, Any]:
    """A one-device claim allocated from exactly `device` (or AllocationError)."""
    assert env.allocator is not None
    env.allocator.ensure_device_class(env.device_class, env.driver)
    claim = env.allocator.create_claim(env.node_name, f"{label}-{os.urandom(3).hex()}", env.device_class, 1)
    return env.allocator.allocate(claim, env.node_name, env.driver, pod, only={device})


# -- the checks -----------------------------------------------------------------------------------------------


@check("DRA-PRT-01", MUST, "CounterSets and the devices consuming them are published as the release validates",
       partitioned=True)
def test_counters_published(dra_env: DRAEnv) -> None:
    env = dra_env
    event = published(env)
    errors = partition_errors(event.get("slices"))
    more = f" (+{len(errors) - 6} more)" if len(errors) > 6 else ""
    expect(not errors, "counter sets in slices of their own, each consumed counter in its pool's set, and no "
                       "device consuming more than the set has", "; ".join(errors[:6]) + more)


@check("DRA-PRT-02", MUST, "two overlapping partitions of one GPU are never both allocated; disjoint ones are",
       partitioned=True)
def test_overlap_refused(dra_env: DRAEnv) -> None:
    env = dra_env
    event = published(env)
    found = mapped(event, units(env))
    pair = overlapping_pair(found)
    if pair is None:
        not_exercised(f"no two published devices map to overlapping partitions of one fake GPU (mapped: "
                      f"{', '.join(sorted(found)) or 'none'})")
    assert pair is not None
    big, small, apart = pair
    env.note(f"partitions: {big} holds {small}" + (f"; {apart} shares nothing with {big}" if apart else ""))
    pod = env.new_pod()
    try:
        claim_for(env, pod, big, "big")
    except AllocationError as err:
        raise AssertionError(f"expected {big} allocatable on its own; the scheduler saw: {err}") from None
    try:
        claim_for(env, pod, small, "small")
    except AllocationError as err:
        env.note(f"{small} refused beside {big}: {err}")
    else:
        shared = sorted(found[big][1].slices & found[small][1].slices)
        raise AssertionError(f"expected the claim for {small} refused while {big} is allocated (both hold memory "
                             f"slice(s) {shared} of {found[big][1].gpu}); saw both allocated: the driver's counters "
                             f"let overlapping partitions be in use at once")
    if apart is not None:
        try:
            claim_for(env, pod, apart, "apart")
        except AllocationError as err:
            raise AssertionError(f"expected {apart}, which shares no memory slice with {big}, allocatable beside it; "
                                 f"the scheduler saw: {err}") from None


def _names(edits: list[dict[str, Any]]) -> tuple[set[str], list[str]]:
    """(basenames of the device nodes and mounts, env values) the edits hand a container."""
    paths = {p for e in edits for n in (e.get("deviceNodes") or []) + (e.get("mounts") or [])
             for p in (n.get("path"), n.get("hostPath"), n.get("containerPath")) if p}
    values = [str(v).partition("=")[2] for e in edits for v in e.get("env") or []]
    return {os.path.basename(p.rstrip("/")) for p in paths}, values


def _names_unit(unit: Unit, nodes: set[str], values: list[str]) -> bool:
    return unit.node in nodes or any(unit.uuid in v for v in values)


@check("DRA-PRT-03", MUST, "a claim for a partition is prepared with that partition's CDI device", partitioned=True)
def test_partition_prepared(dra_env: DRAEnv) -> None:
    env = dra_env
    event = published(env)
    hardware = units(env)
    found = mapped(event, hardware)
    partitions = sorted((n for n, (_, u) in found.items() if not u.whole), key=lambda n: found[n][1].id)
    if not partitions:
        not_exercised(f"no published device maps to a partition of a fake GPU (mapped: "
                      f"{', '.join(sorted(found)) or 'none'})")
    name = partitions[0]
    unit = found[name][1]
    gpu = next(u for u in hardware if u.whole and u.gpu == unit.gpu)
    pod = env.new_pod()
    try:
        claim = claim_for(env, pod, name, "part")
    except AllocationError as err:
        raise AssertionError(f"expected partition {name} allocatable; the scheduler saw: {err}") from None
    uid = claim["metadata"]["uid"]
    result = env.conn().node_prepare([env.claim_ref(claim)], timeout_s=env.profile.dra_call_timeout_s)
    expect(uid in result and not result[uid]["error"], f"claim for partition {name} prepared",
           repr(result.get(uid)))
    expect(device_set(result[uid]) == env.allocated_devices(claim, env.driver),
           f"devices {env.allocated_devices(claim, env.driver)} (the allocation)", str(device_set(result[uid])))
    ids = [i for d in result[uid]["devices"] for i in d["cdi_ids"]]
    edits = [e for i in ids for e in edits_of(env.sandbox.cdi_dir, i)]
    expect(edits, f"CDI spec(s) in the CDI directory defining {ids}", "none")
    nodes, values = _names(edits)
    if not _names_unit(unit, nodes, values):
        whole = " the whole GPU's" if _names_unit(gpu, nodes, values) else ""
        raise AssertionError(f"expected CDI device(s) {ids} to name partition {unit.id} (its node {unit.node} or "
                             f"UUID {unit.uuid}); saw{whole} device nodes {sorted(nodes)} and env values "
                             f"{sorted(values)[:6]}")
