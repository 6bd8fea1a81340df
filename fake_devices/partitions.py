"""MIG-style partitions of a fake GPU: what an inventory's `partitions` key makes of a device.

A partitioned GPU is cut into `slices` equal memory slices, and each profile
(`{name, size}`: a partition of `size` consecutive slices) can be placed at
every start that is a multiple of its size, as NVIDIA's MIG places its GPU
instances (a 2-slice profile at slices 0 and 2, a 1-slice one at 0..3). Two
partitions overlap when they share a slice; the whole GPU overlaps all of them.
Partitions that overlap can never be in use at once: that is the hardware's
truth the DRA-PRT checks hold a driver's counters to.

    partitions:
      slices: 4
      profiles: [{name: 1g, size: 1}, {name: 2g, size: 2}]

Each partition gets an ID (`<gpu id>-<profile>-<start>`), a MIG-like UUID derived
from the GPU's, its memory (the GPU's, per slice) and a device node of its own
(`<gpu node>-<profile>-<start>`). The layout is opt-in: an inventory without
the key has no partitions, and nothing about its devices changes.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# A counter set holds at most 32 counters (k8s.io/api resource/v1 types.go ResourceSliceMaxCountersPerCounterSet):
# one per memory slice plus the memory counter must fit, so a driver can publish one set per GPU. MIG has 8.
MAX_SLICES = 16
PROFILE_NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,14}[a-z0-9])?$")  # goes into device and node names
LAYOUT_KEYS = ("slices", "profiles")
PROFILE_KEYS = ("name", "size")
UUID_PREFIX = "MIG-"  # what NVML names a MIG device's UUID with


@dataclass(frozen=True)
class Partition:
    id: str
    profile: str
    start: int
    size: int
    memory_mib: int
    uuid: str
    node: str

    @property
    def slices(self) -> frozenset[int]:
        return frozenset(range(self.start, self.start + self.size))

    def overlaps(self, other: Partition) -> bool:
        return bool(self.slices & other.slices)


def check_layout(label: str, value: Any) -> dict[str, Any]:
    """The `partitions` value of an inventory device, normalized, or a ValueError naming what is wrong."""
    def bad(what: str) -> ValueError:
        return ValueError(f"{label}: field 'partitions': {what}")

    if not isinstance(value, Mapping):
        raise bad(f"expected a mapping with {list(LAYOUT_KEYS)}, got {value!r}")
    unknown = sorted(str(k) for k in value if k not in LAYOUT_KEYS)
    if unknown:
        raise bad(f"unknown key(s) {unknown}; known: {list(LAYOUT_KEYS)}")
    slices = value.get("slices")
    if not isinstance(slices, int) or isinstance(slices, bool) or not 1 <= slices <= MAX_SLICES:
        raise bad(f"'slices' must be an integer from 1 to {MAX_SLICES}, got {slices!r}")
    profiles = value.get("profiles")
    if not isinstance(profiles, list) or not profiles:
        raise bad(f"'profiles' must be a non-empty list of {{name, size}}, got {profiles!r}")
    out, names = [], set()
    for p in profiles:
        if not isinstance(p, Mapping) or sorted(p) != sorted(PROFILE_KEYS):
            raise bad(f"a profile is a mapping with exactly {list(PROFILE_KEYS)}, got {p!r}")
        name, size = p["name"], p["size"]
        if not isinstance(name, str) or not PROFILE_NAME_RE.match(name):
            raise bad(f"profile name {name!r}: lower-case letters, digits and '-', at most 16")
        if name in names:
            raise bad(f"profile {name!r} given twice")
        if not isinstance(size, int) or isinstance(size, bool) or not 1 <= size <= slices:
            raise bad(f"profile {name!r}: 'size' must be an integer from 1 to {slices}, got {size!r}")
        names.add(name)
        out.append({"name": name, "size": size})
    return {"slices": slices, "profiles": out}


def partition_uuid(gpu_uuid: str, partition_id: str) -> str:
    # Derived, not random: the same inventory always has the same partitions.
    return UUID_PREFIX + str(uuid.uuid5(uuid.NAMESPACE_URL, f"fakelet:partition:{gpu_uuid}:{partition_id}"))


def partitions_of(device_id: str, node: str, gpu_uuid: str, memory_mib: int,
                  layout: Mapping[str, Any] | None) -> list[Partition]:
    """Every placement of every profile, by profile then start."""
    if not layout:
        return []
    slices = int(layout["slices"])
    per_slice = memory_mib // slices
    out = []
    for profile in layout["profiles"]:
        size = int(profile["size"])
        for start in range(0, slices - size + 1, size):
            pid = f"{device_id}-{profile['name']}-{start}"
            out.append(Partition(id=pid, profile=profile["name"], start=start, size=size,
                                 memory_mib=per_slice * size, uuid=partition_uuid(gpu_uuid, pid),
                                 node=f"{node}-{profile['name']}-{start}"))
    return out
