"""The reference DRA driver beside a device plugin for the same hardware (DRA-EXT-02).

A node migrating from a device plugin to DRA one node at a time (or splitting its GPUs between the two, as NVIDIA's
device plugin and DRA driver do by configuration) runs both. Upstream does not keep them apart: kube-scheduler sends
a pod's extended-resource request to the device plugin on a node whose allocatable has the resource, but a
ResourceClaim still takes devices from the driver's ResourceSlices on that node, and neither the kubelet's device
manager nor its DRA manager knows what the other handed out (keps/sig-scheduling/5004-dra-extended-resource: "One
node in a cluster cannot have both extended resource backed by DRA, and same named extended resource backed by
device plugin at the same time"). So the driver must be told the device plugin's devices and leave them alone:
publish none of them, prepare none. `--exclude-devices ID,ID` tells the reference driver (by the backend's device
IDs); the mutant `ignores-device-plugin` takes the flag and publishes every device anyway.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

from harness.spec import composition

T = TypeVar("T")


def parse(value: str) -> frozenset[str]:
    """The device IDs of `--exclude-devices` (comma-separated; empty: none)."""
    return frozenset(v.strip() for v in value.split(",") if v.strip())


def kept(devices: Sequence[T], excluded: frozenset[str], defect: str | None) -> list[T]:
    """The devices the driver publishes and prepares: all but the device plugin's (every one, for the mutant)."""
    if composition.has(defect, "ignores-device-plugin") or not excluded:
        return list(devices)
    return [d for d in devices if getattr(d, "id", None) not in excluded]
