"""Partitionable devices for the reference DRA driver (KEP-4815, DRAPartitionableDevices).

A GPU the fake backend partitions (fake_devices/partitions.py: `partitions/` in its sysfs dir) is
published the way resource.k8s.io/v1 has it in 1.36: one CounterSet per GPU, named after it, with a
`memory` counter and one `memory-slice-<i>` counter per memory slice, in slices of their own (a
ResourceSlice holds sharedCounters or devices, never both: pkg/apis/resource/validation
validateResourceSliceSpec), and devices that consume from it: the whole GPU consumes every counter,
each partition its memory and its slices. Two devices that share a slice can then never be allocated
together, which is what the hardware allows. The counter sets and the devices are one pool (the
node's), as the allocator requires: a device's counterSet must name a set of its own pool
(dynamic-resource-allocation structured/internal/*/pools_*.go validateDeviceCounterConsumption).

Prepare finds a partition by its device name and hands the container that partition's node and UUID
(a CDI device naming the partition, never the whole GPU), and refuses a device whose hardware
overlaps one already prepared for another claim, the driver's last line of defence.

Without partitions nothing here is used: the driver publishes one slice of plain devices, as before.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.reference.dra_slices import device_entry, dns_label
from harness.spec import composition

# k8s.io/api resource/v1 types.go
MAX_COUNTER_SETS_PER_SLICE = 8  # ResourceSliceMaxCounterSets
MAX_DEVICES_WITH_COUNTERS = 64  # ResourceSliceMaxDevicesWithAdvancedFeatures (a device consumes counters)
MEMORY = "memory"  # the counter and the capacity a partition's memory is counted in
SLICE_COUNTER = "memory-slice-{}"  # one per memory slice: a DNS label, as counter names must be
OVERCOMMIT = 2  # overcommit-counters: how many times the hardware its counter sets offer


@dataclass(frozen=True)
class HwPartition:
    id: str
    profile: str
    start: int
    size: int
    memory_mib: int
    uuid: str
    node: str
    host_path: str

    @property
    def slices(self) -> frozenset[int]:
        return frozenset(range(self.start, self.start + self.size))


@dataclass(frozen=True)
class Layout:
    slices: int
    partitions: tuple[HwPartition, ...]


def read_layout(device_dir: Path, dev_root: Path) -> Layout | None:
    """The device's partitions as its sysfs dir shows them, or None when it has none (no `partitions/slices`)."""
    root = device_dir / "partitions"
    count = root / "slices"
    if not count.is_file():
        return None

    def value(d: Path, name: str) -> str:
        return (d / name).read_text().strip()

    parts = []
    for d in sorted(p for p in root.iterdir() if p.is_dir()):
        node = value(d, "node")
        parts.append(HwPartition(id=d.name, profile=value(d, "profile"), start=int(value(d, "start")),
                                 size=int(value(d, "size")), memory_mib=int(value(d, "memory_mib")),
                                 uuid=value(d, "uuid"), node=node, host_path=str(dev_root / node)))
    return Layout(slices=int(count.read_text().strip()), partitions=tuple(parts))


def has_partitions(devices: list[dict[str, Any]]) -> bool:
    return any(d.get("layout") for d in devices)


def counter_set_name(device: dict[str, Any]) -> str:
    return dns_label(f"{device['name']}-counters")


def _mi(mib: int) -> dict[str, str]:
    return {"value": f"{mib}Mi"}


def _consumes(device: dict[str, Any], memory_mib: int, slices: frozenset[int] | range,
              extra_slice: bool = False) -> list[dict[str, Any]]:
    counters = {MEMORY: _mi(memory_mib), **{SLICE_COUNTER.format(i): {"value": "1"} for i in sorted(slices)}}
    if extra_slice:
        # consumes-missing-counter's bug: an off-by-one loop names a slice past the GPU's last.
        counters[SLICE_COUNTER.format(max(slices) + 1)] = {"value": "1"}
    return [{"counterSet": counter_set_name(device), "counters": counters}]


def counter_set(device: dict[str, Any], overcommit: bool = False) -> dict[str, Any]:
    layout: Layout = device["layout"]
    times = OVERCOMMIT if overcommit else 1
    counters = {MEMORY: _mi(device["memory_mib"] * times),
                **{SLICE_COUNTER.format(i): {"value": str(times)} for i in range(layout.slices)}}
    return {"name": counter_set_name(device), "counters": counters}


def partition_name(p: HwPartition) -> str:
    return dns_label(p.id)


def partition_entry(device: dict[str, Any], p: HwPartition) -> dict[str, Any]:
    """A partition as a resource.k8s.io/v1 Device: its own UUID and memory, its parent's identity beside."""
    attributes: dict[str, dict[str, Any]] = {
        "class": {"string": device["cls"]},
        "numa": {"int": device["numa"]},
        "profile": {"string": p.profile},
        "placementStart": {"int": p.start},
        "placementSize": {"int": p.size},
        "uuid": {"string": p.uuid},
        "parentUUID": {"string": device["uuid"]},
    }
    for key in ("model", "vendor"):
        if device.get(key):
            attributes[key] = {"string": str(device[key])}
    entry: dict[str, Any] = {"name": partition_name(p), "attributes": attributes,
                             "capacity": {MEMORY: _mi(p.memory_mib)}}
    if device.get("taints"):
        # A partition is as healthy as the GPU it is cut from.
        entry["taints"] = [dict(t) for t in device["taints"]]
    return entry


def pool_slices(devices: list[dict[str, Any]], defect: str | None = None) -> list[dict[str, Any]] | None:
    """The pool's slices when a device has partitions (else None: the publisher's plain slice): counter sets
    first, at most 8 a slice, then the devices, at most 64 a slice."""
    if not has_partitions(devices):
        return None
    sets, entries = [], []
    for d in devices:
        entry = device_entry(d)
        layout: Layout | None = d.get("layout")
        if layout is None:
            entries.append(entry)
            continue
        sets.append(counter_set(d, overcommit=composition.has(defect, "overcommit-counters")))
        entry["consumesCounters"] = _consumes(d, d["memory_mib"], range(layout.slices),
                                              extra_slice=composition.has(defect, "consumes-missing-counter"))
        entries.append(entry)
        for p in layout.partitions:
            partition = partition_entry(d, p)
            partition["consumesCounters"] = _consumes(d, p.memory_mib, p.slices)
            entries.append(partition)
    if composition.has(defect, "counters-in-device-slice"):
        # The bug: the counter sets ride in the devices' slice, as alpha drafts of KEP-4815 had it; 1.36's API
        # server refuses such a slice ("only one of `sharedCounters` or `devices` is allowed").
        return [{"sharedCounters": sets, "devices": entries}]
    return ([{"sharedCounters": sets[i:i + MAX_COUNTER_SETS_PER_SLICE]}
             for i in range(0, len(sets), MAX_COUNTER_SETS_PER_SLICE)]
            + [{"devices": entries[i:i + MAX_DEVICES_WITH_COUNTERS]}
               for i in range(0, len(entries), MAX_DEVICES_WITH_COUNTERS)])


# -- prepare ---------------------------------------------------------------------------------------------------


def _env_key(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", text).upper()


def find(devices: list[dict[str, Any]], name: str, whole_gpu: bool = False) -> dict[str, Any] | None:
    """The partition published as `name`, shaped as the driver's device entries are for prepare (node,
    host_path, index, uuid), or None. With `whole_gpu` (prepares-whole-gpu's bug): its parent GPU instead."""
    for d in devices:
        layout: Layout | None = d.get("layout")
        for p in layout.partitions if layout is not None else ():
            if partition_name(p) != name:
                continue
            if whole_gpu:
                return {**d, "name": name}
            return {"name": name, "node": p.node, "host_path": p.host_path, "uuid": p.uuid,
                    "index": f"{d['index']}_{_env_key(p.profile)}_{p.start}", "parent": d["name"]}
    return None


def _hardware(devices: list[dict[str, Any]], name: str) -> tuple[str, frozenset[int]] | None:
    """(GPU, the memory slices it takes) of a published device of a partitioned GPU, or None."""
    for d in devices:
        layout: Layout | None = d.get("layout")
        if layout is None:
            continue
        if d["name"] == name:
            return d["name"], frozenset(range(layout.slices))
        for p in layout.partitions:
            if partition_name(p) == name:
                return d["name"], p.slices
    return None


def clash(devices: list[dict[str, Any]], name: str, in_use: dict[str, str]) -> tuple[str, str] | None:
    """(device, claim UID) of a device prepared for another claim that shares hardware with `name`, or None."""
    mine = _hardware(devices, name)
    if mine is None:
        return None
    for other, claim in in_use.items():
        theirs = _hardware(devices, other)
        if other != name and theirs is not None and theirs[0] == mine[0] and theirs[1] & mine[1]:
            return other, claim
    return None


def health_entries(devices: list[dict[str, Any]], pool: str) -> list[dict[str, str]]:
    """The health stream's entries for the partitions: each as healthy as its GPU."""
    return [{"pool": pool, "device": partition_name(p), "health": d["health"], "reason": d["reason"]}
            for d in devices if d.get("layout") is not None for p in d["layout"].partitions]
