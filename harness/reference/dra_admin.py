"""Admin access for the reference DRA driver (KEP-5018, DRAAdminAccess: GA in 1.36).

A claim whose allocation result says `adminAccess: true` gets a device for monitoring or management while an
ordinary claim may hold it (harness/controlplane/admin.py has the scheduler's side). The driver prepares it
although the device is in use, as dra-example-driver does (cmd/dra-example-kubeletplugin/state.go
checkAdminAccess, cdi.go `DRA_ADMIN_ACCESS=<bool>`): a CDI device of the claim's own that hands the container the
device, and `DRA_ADMIN_ACCESS=true` for the tools in it to know. It never resets or reconfigures the device for
it, and unpreparing either claim leaves the other's CDI spec alone. An admin-access claim holds no device: an
ordinary claim allocated the device meanwhile is prepared too.

The last line of defence the helper asks of a driver (kubeletplugin/draplugin.go PrepareResourceClaims:
"verify that all devices ... are not already in use for some other ResourceClaim") is for ordinary claims only.

Mutants: refuses-busy-device keeps that defence for every claim (the exclusive-lock habit), so an admin claim on
a busy device is refused; admin-unprepare-resets resets the device on every unprepare, removing the CDI specs of
every other claim prepared on it.
"""

from __future__ import annotations

from typing import Any

from harness.spec import composition

ADMIN_ENV = "DRA_ADMIN_ACCESS"  # dra-example-driver cmd/dra-example-kubeletplugin/cdi.go


def granted(result: dict[str, Any]) -> bool:
    return result.get("adminAccess") is True


def exempt(result: dict[str, Any], defect: str | None) -> bool:
    """Is the result prepared whoever else holds the device (admin access, unless refuses-busy-device)?"""
    return granted(result) and not composition.has(defect, "refuses-busy-device")


def in_use(prepared: dict[str, dict[str, Any]], defect: str | None) -> dict[str, str]:
    """Device name -> a prepared claim that holds it: admin-access claims hold none (refuses-busy-device: they
    do)."""
    return {d["device"]: uid for uid, rec in prepared.items() for d in rec["devices"]
            if not d.get("admin_access") or composition.has(defect, "refuses-busy-device")}


def ordinary(prepared: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The prepared claims with their admin-access devices left out: what holds a share of a device's capacity."""
    return {uid: {**rec, "devices": [d for d in rec["devices"] if not d.get("admin_access")]}
            for uid, rec in prepared.items()}


def entry_fields(result: dict[str, Any]) -> dict[str, Any]:
    """What the prepared Device's record keeps of admin access (the kubelet's Device has no field for it)."""
    return {"admin_access": True} if granted(result) else {}


def env(result: dict[str, Any]) -> dict[str, str]:
    return {ADMIN_ENV: "true"} if granted(result) else {}


def reset_claims(prepared: dict[str, dict[str, Any]], uid: str) -> list[str]:
    """The other prepared claims on a device claim `uid` holds (admin-unprepare-resets wipes their CDI specs)."""
    mine = {d["device"] for d in prepared.get(uid, {}).get("devices", [])}
    return [other for other, rec in prepared.items()
            if other != uid and any(d["device"] in mine for d in rec["devices"])]
