"""Consumable capacity for the reference DRA driver (KEP-5075, DRAConsumableCapacity).

A device the fake backend makes shareable (fake_devices/capacity.py: `sharing/<name>/{total,step}` in its
sysfs dir) is published the way resource.k8s.io/v1 has it in 1.36: `allowMultipleAllocations: true`, and
each shared capacity with its total as the value and a requestPolicy of whole steps (default one step,
validRange from one step up in steps), which pkg/apis/resource/validation validateRequestPolicyRange accepts
for any total of two steps or more. A requestPolicy is only valid on a device that allows multiple
allocations (validateSingleAllocatableDeviceCapacity: "allowMultipleAllocations must be true").

Each claim on a shared device is its own share: the allocation result names it (`shareID`) and what it
consumes (`consumedCapacity`). Prepare hands each claim a CDI device of its own that names the share and
the capacity it got (FAKELET_DEVICE_<index>_SHARE_ID, FAKELET_DEVICE_<index>_<CAPACITY>), refuses a share
that would take the device past its hardware's total (the driver's last line of defence), and unprepare
tears down only that claim's share.

Without a shareable device nothing here is used.
"""

from __future__ import annotations

import re
from fractions import Fraction
from pathlib import Path
from typing import Any

from harness.controlplane.capacity import show
from harness.instruments.quantity import quantity
from harness.reference.dra_slices import device_entry
from harness.spec import composition

OVERSTATE = 2  # overstates-capacity: how many times the hardware's total it publishes
SHARE_ID_ENV = "FAKELET_DEVICE_{}_SHARE_ID"
CAPACITY_ENV = "FAKELET_DEVICE_{}_{}"

Sharing = dict[str, tuple[str, str]]  # capacity name -> (total, step), as the device dir shows them


def read_sharing(device_dir: Path) -> Sharing | None:
    """The device's shared capacities as its sysfs dir shows them, or None when it has none."""
    root = device_dir / "sharing"
    if not root.is_dir():
        return None
    out: Sharing = {}
    for d in sorted(p for p in root.iterdir() if p.is_dir()):
        out[d.name] = ((d / "total").read_text().strip(), (d / "step").read_text().strip())
    return out or None


def has_sharing(devices: list[dict[str, Any]]) -> bool:
    return any(d.get("sharing") for d in devices)


def _shareable(entry: dict[str, Any], sharing: Sharing, defect: str | None) -> dict[str, Any]:
    entry = {**entry, "capacity": dict(entry.get("capacity") or {})}
    if not composition.has(defect, "policy-without-multi"):
        entry["allowMultipleAllocations"] = True
    for name, (total, step) in sharing.items():
        value = f"{quantity(total) * OVERSTATE}" if composition.has(defect, "overstates-capacity") else total
        entry["capacity"][name] = {"value": value,
                                   "requestPolicy": {"default": step, "validRange": {"min": step, "step": step}}}
    return entry


def pool_slices(devices: list[dict[str, Any]], defect: str | None,
                parts: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """The pool's slices (`parts`, another layout's, or None for one slice of plain devices) with each shareable
    device published as such; `parts` unchanged without one."""
    if not has_sharing(devices):
        return parts
    if parts is None:
        parts = [{"devices": [device_entry(d) for d in devices]}]
    sharing = {d["name"]: d["sharing"] for d in devices if d.get("sharing")}
    return [{**p, "devices": [_shareable(e, sharing[e["name"]], defect) if e.get("name") in sharing else e
                              for e in p["devices"]]} if p.get("devices") else p for p in parts]


def _env_key(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", text).upper()


def share_env(device: dict[str, Any], result: dict[str, Any], defect: str | None) -> dict[str, str]:
    """What a claim's CDI device says of its share: the share ID, and each capacity it got (share-full-capacity's
    bug: the whole device's)."""
    sharing: Sharing = device.get("sharing") or {}
    env = {SHARE_ID_ENV.format(device["index"]): str(result.get("shareID", ""))}
    for name, amount in (result.get("consumedCapacity") or {}).items():
        if composition.has(defect, "share-full-capacity") and name in sharing:
            amount = sharing[name][0]
        env[CAPACITY_ENV.format(device["index"], _env_key(name))] = str(amount)
    return env


def over_capacity(device: dict[str, Any], result: dict[str, Any], prepared: dict[str, dict[str, Any]]) -> str | None:
    """Why preparing this share would take the device past its hardware's total, or None."""
    sharing: Sharing = device.get("sharing") or {}
    for name, amount in (result.get("consumedCapacity") or {}).items():
        if name not in sharing:
            continue
        held = sum((quantity(d.get("consumed", {}).get(name, "0")) for rec in prepared.values()
                    for d in rec["devices"] if d["device"] == device["name"] and d.get("share_id")), Fraction(0))
        total = quantity(sharing[name][0])
        if held + quantity(amount) > total:
            return (f"capacity {name} of device {device['name']}: {amount} wanted, prepared shares hold "
                    f"{show(held)} of {sharing[name][0]}")
    return None


def sharing_claims(prepared: dict[str, dict[str, Any]], uid: str) -> list[str]:
    """The other prepared claims holding a share of a device claim `uid` holds a share of (unprepare-drops-share
    tears them down with it)."""
    mine = {d["device"] for d in prepared.get(uid, {}).get("devices", []) if d.get("share_id")}
    return [other for other, rec in prepared.items()
            if other != uid and any(d["device"] in mine and d.get("share_id") for d in rec["devices"])]
