"""Device binding conditions and device status for the reference DRA driver (KEP-5007, DRADeviceBindingConditions;
KEP-4817, DRAResourceClaimDeviceStatus).

A device the fake backend makes fabric-attached (fake_devices/fabric.py: `fabric/` in its sysfs dir) must be
attached to the node after it is allocated, before a pod may use it. The driver publishes it with
`bindsToNode: true`, `bindingConditions: [FabricAttached]` and `bindingFailureConditions: [FabricAttachFailed]`
(pkg/apis/resource/validation validateDeviceBindingParameters wants both lists, disjoint); the scheduler copies
them into the allocation result and, in PreBind, waits until FabricAttached is True on the claim's
status.devices entry of the device, or gives up at once when FabricAttachFailed is True
(harness/controlplane/binding.py).

So the driver watches the ResourceClaims allocated from its pool (`ClaimWatcher`, through the API client it
publishes slices with): for each allocation result naming one of its fabric-attached devices it attaches the
device (the fake hardware takes `fabric/attach_ms`, then `fabric/attach_error` says whether it failed) and writes
the device's status.devices entry: both conditions, the device's networkData (interface name, hardware address,
addresses in CIDR form: what the hardware shows) and a little data. A device deallocated and allocated again is
attached again (the API server dropped the old entry with the allocation).

Devices without `fabric/` are published and prepared as before, and the watcher only runs when the driver has
a fabric-attached device at start.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.controlplane.base import RESOURCE_API
from harness.reference.dra_slices import device_entry
from harness.spec import composition

log = logging.getLogger("reference-dra")

ATTACHED = "FabricAttached"  # the binding condition
ATTACH_FAILED = "FabricAttachFailed"  # the binding failure condition
CLAIM_WATCH_S = 5.0  # one watch request's server-side timeout; the loop re-lists and re-watches
RETRY_S = 1.0  # the API server is away: try again after this
STATUS_WRITE_RETRIES = 5  # a status write races the scheduler's and other drivers' writes of the same claim

Fabric = dict[str, Any]
ClaimKey = tuple[str, str, str]  # (claim UID, device, shareID or "")


def read_fabric(device_dir: Path) -> Fabric | None:
    """The device's fabric attachment as its sysfs dir shows it, or None when it has none."""
    root = device_dir / "fabric"
    if not root.is_dir():
        return None

    def value(name: str) -> str:
        f = root / name
        return f.read_text().strip() if f.is_file() else ""

    return {"interface": value("interface"), "mac": value("mac"), "ips": value("ips").split(),
            "attach_ms": int(value("attach_ms") or 0), "dir": str(root)}


def has_fabric(devices: list[dict[str, Any]]) -> bool:
    return any(d.get("fabric") for d in devices)


def pool_slices(devices: list[dict[str, Any]], parts: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """The pool's slices (`parts`, another layout's, or None for one slice of plain devices) with each
    fabric-attached device published with its binding conditions; `parts` unchanged without one."""
    if not has_fabric(devices):
        return parts
    if parts is None:
        parts = [{"devices": [device_entry(d) for d in devices]}]
    fabric = {d["name"] for d in devices if d.get("fabric")}
    return [{**p, "devices": [{**e, "bindsToNode": True, "bindingConditions": [ATTACHED],
                               "bindingFailureConditions": [ATTACH_FAILED]} if e.get("name") in fabric else e
                              for e in p["devices"]]} if p.get("devices") else p for p in parts]


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _condition(kind: str, true: bool, reason: str, message: str) -> dict[str, Any]:
    return {"type": kind, "status": "True" if true else "False", "reason": reason, "message": message,
            "lastTransitionTime": _now()}


def status_entry(driver: str, pool: str, result: dict[str, Any], device: dict[str, Any], error: str,
                 others: list[dict[str, Any]], defect: str | None) -> dict[str, Any]:
    """The claim's status.devices entry for one attach of a fabric-attached device (`error`: why it failed, ""
    when it worked). `others`: the driver's other devices (wrong-network-data reports one's address)."""
    fabric = device["fabric"]
    entry: dict[str, Any] = {"driver": driver, "pool": pool, "device": result["device"]}
    if result.get("shareID"):
        entry["shareID"] = result["shareID"]
    if error:
        conditions = [_condition(ATTACHED, False, "AttachFailed", f"attaching {device['name']} failed"),
                      _condition(ATTACH_FAILED, True, "AttachFailed", error)]
        if composition.has(defect, "hides-attach-failure"):
            # The bug: a failed attach looks like one still under way; the scheduler waits out its timeout.
            conditions = [_condition(ATTACHED, False, "Attaching", f"attaching {device['name']}")]
        entry["data"] = {"node": pool, "attached": False}
    else:
        conditions = [_condition(ATTACHED, True, "Attached", f"attached to node {pool} as {fabric['interface']}"),
                      _condition(ATTACH_FAILED, False, "Attached", "")]
        mac = fabric["mac"]
        if composition.has(defect, "wrong-network-data"):
            # The bug: an index mix-up reports the next fabric-attached device's hardware address.
            macs = [o["fabric"]["mac"] for o in sorted(others, key=lambda o: o["name"]) if o.get("fabric")]
            mac = macs[(macs.index(mac) + 1) % len(macs)] if mac in macs else mac
        entry["networkData"] = {"interfaceName": fabric["interface"], "hardwareAddress": mac,
                                "ips": list(fabric["ips"])}
        entry["data"] = {"node": pool, "attached": True, "pciAddress": device.get("pci_address", "")}
    # never-binds: it reports the device, never the conditions the scheduler waits for
    if not composition.has(defect, "never-binds"):
        entry["conditions"] = conditions
    return entry


def _key(claim: dict[str, Any], result: dict[str, Any]) -> ClaimKey:
    return (str(claim["metadata"].get("uid", "")), str(result.get("device", "")), str(result.get("shareID") or ""))


class ClaimWatcher:
    """Watches the ResourceClaims allocated from the driver's pool and attaches each fabric-attached device of
    theirs, writing its status.devices entry."""

    def __init__(self, client: Any, api_error: type[Exception], driver: str, pool: str,
                 devices: Callable[[], list[dict[str, Any]]], defect: str | None, stopping: threading.Event) -> None:
        self.client, self.api_error = client, api_error
        self.driver, self.pool, self.devices, self.defect = driver, pool, devices, defect
        self.stopping = stopping
        self.started: set[ClaimKey] = set()  # attaches begun for the current allocations
        self.by_claim: dict[str, set[ClaimKey]] = {}
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._run, daemon=True, name="claim-watch")

    def start(self) -> ClaimWatcher:
        self.thread.start()
        return self

    def _run(self) -> None:
        path = f"{RESOURCE_API}/resourceclaims"
        while not self.stopping.is_set():
            try:
                listed = self.client.get(path)
                seen = set()
                for claim in listed.get("items", []):
                    seen.add(claim["metadata"].get("uid", ""))
                    self._consider(claim)
                for uid in set(self.by_claim) - seen:
                    self._forget(uid)
                version = listed["metadata"]["resourceVersion"]
                for event in self.client.watch(path, version, CLAIM_WATCH_S):
                    if self.stopping.is_set():
                        return
                    claim = event.get("object") or {}
                    if event.get("type") == "DELETED":
                        self._forget(claim.get("metadata", {}).get("uid", ""))
                    elif event.get("type") in ("ADDED", "MODIFIED"):
                        self._consider(claim)
            except (self.api_error, OSError, KeyError, ValueError) as err:
                log.warning("watching ResourceClaims: %s", err)
                if self.stopping.wait(RETRY_S):
                    return

    def _forget(self, uid: str) -> None:
        with self.lock:
            self.started -= self.by_claim.pop(uid, set())

    def _ours(self, claim: dict[str, Any]) -> list[dict[str, Any]]:
        allocation = (claim.get("status") or {}).get("allocation") or {}
        fabric = {d["name"] for d in self.devices() if d.get("fabric")}
        return [r for r in (allocation.get("devices") or {}).get("results") or []
                if r.get("driver") == self.driver and r.get("pool") == self.pool and r.get("device") in fabric]

    def _consider(self, claim: dict[str, Any]) -> None:
        uid = claim["metadata"].get("uid", "")
        results = self._ours(claim)
        keys = {_key(claim, r) for r in results}
        with self.lock:
            gone = self.by_claim.get(uid, set()) - keys
            self.started -= gone  # deallocated: attach again when it is allocated again
            self.by_claim[uid] = keys
            new = [r for r in results if _key(claim, r) not in self.started]
            self.started.update(_key(claim, r) for r in new)
        for result in new:
            threading.Thread(target=self._attach, args=(claim, result), daemon=True,
                             name=f"attach-{result['device']}").start()

    def _attach(self, claim: dict[str, Any], result: dict[str, Any]) -> None:
        devices = self.devices()
        device = next((d for d in devices if d["name"] == result["device"]), None)
        if device is None:
            return
        # The fake hardware's attach time, then its verdict (the fault the harness set, if any).
        if self.stopping.wait(device["fabric"]["attach_ms"] / 1000):
            return
        try:
            error = (Path(device["fabric"]["dir"]) / "attach_error").read_text().strip()
        except OSError as err:
            error = f"reading the fabric's attach status: {err}"
        entry = status_entry(self.driver, self.pool, result, device, error, devices, self.defect)
        meta = claim["metadata"]
        log.info("attach of %s for claim %s/%s: %s", result["device"], meta.get("namespace"), meta.get("name"),
                 error or "done")
        self._write(claim, result, entry)

    def _write(self, claim: dict[str, Any], result: dict[str, Any], entry: dict[str, Any]) -> None:
        meta = claim["metadata"]
        path = f"{RESOURCE_API}/namespaces/{meta['namespace']}/resourceclaims/{meta['name']}"
        key = _key(claim, result)
        for _ in range(STATUS_WRITE_RETRIES):
            try:
                current = self.client.get(path)
                if key not in {_key(current, r) for r in self._ours(current)}:
                    return  # deallocated or replaced meanwhile: nothing of this attach to report
                status = current.setdefault("status", {})
                kept = [e for e in status.get("devices") or []
                        if (e.get("driver"), e.get("pool"), e.get("device"), e.get("shareID") or "")
                        != (self.driver, self.pool, result["device"], result.get("shareID") or "")]
                status["devices"] = [*kept, entry]
                self.client.replace_status(path, current)
                return
            except self.api_error as err:
                if getattr(err, "status", None) == 404:
                    return
                if getattr(err, "status", None) != 409:
                    log.warning("writing the status of %s in claim %s/%s: %s", result["device"],
                                meta.get("namespace"), meta.get("name"), err)
                    if self.stopping.wait(RETRY_S):
                        return
            except OSError as err:
                log.warning("writing the status of claim %s/%s: %s", meta.get("namespace"), meta.get("name"), err)
                if self.stopping.wait(RETRY_S):
                    return
