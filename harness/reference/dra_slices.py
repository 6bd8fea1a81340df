"""ResourceSlice publishing for the reference DRA driver (resource.k8s.io/v1).

A small take on upstream's ResourceSlice controller
(k8s.io/dynamic-resource-allocation resourceslice/resourceslicecontroller.go,
syncPool), which the kubeletplugin helper runs for a driver: one pool per
node, slices named `<index>-<driver>-<node>-<random>`, owned by the Node,
obsolete slices deleted first, then matched slices updated, then missing ones
created. It re-lists on a timer instead of running an informer, and it bumps
the pool generation on every change (upstream keeps the generation when a
single update suffices; a bump is never wrong and lets consumers see the new
pool at once).

Like upstream, it does not delete its slices on shutdown: the kubelet wipes a
driver's slices once the driver has been unregistered for a while (kubelet
cm/dra/manager.go defaultWipingDelay = 30 s), so a restarting driver does not
make its devices flicker out of the cluster.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from harness.controlplane.base import RESOURCE_API

log = logging.getLogger("reference-dra")

SLICES_PATH = f"{RESOURCE_API}/resourceslices"
SLICE_SELECTOR_NODE = "spec.nodeName"  # k8s.io/api resource/v1 types.go ResourceSliceSelectorNodeName
SLICE_SELECTOR_DRIVER = "spec.driver"  # k8s.io/api resource/v1 types.go ResourceSliceSelectorDriver
INDEX_MIN_LENGTH = 5  # resourceslicecontroller.go resourceSliceIndexMinLength
NAME_SEPARATOR = "-"  # resourceslicecontroller.go nameSeparator
RESYNC_S = 10.0  # re-list this often, so slices deleted behind our back come back
RETRY_START_S, RETRY_MAX_S = 0.2, 5.0

# resource.k8s.io/v1 validation: a device name is a DNS label; an attribute or
# capacity name is a C identifier of at most 32 characters, optionally
# prefixed by a DNS subdomain and '/'; a string value is at most 64 characters.
DNS_LABEL_MAX = 63
ATTRIBUTE_STRING_MAX = 64  # resource/v1 types.go DeviceAttributeMaxValueLength
# dynamic-resource-allocation deviceattribute/attribute.go StandardDeviceAttributePCIBusID
PCI_BUS_ID = "resource.kubernetes.io/pciBusID"

_BINARY_SUFFIXES = {"": 1, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40, "Pi": 1 << 50, "Ei": 1 << 60}
_DECIMAL_SUFFIXES = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}


class Client(Protocol):
    """The part of harness.controlplane.client.KubeClient this module uses."""

    def get(self, path: str) -> dict: ...
    def list(self, path: str, label_selector: str | None = None, field_selector: str | None = None) -> list[dict]: ...
    def create(self, path: str, body: dict) -> dict: ...
    def replace(self, path: str, body: dict) -> dict: ...
    def delete(self, path: str, missing_ok: bool = True) -> None: ...


def dns_label(name: str) -> str:
    """A device name the API accepts: lower-case alphanumerics and '-', at most 63."""
    label = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")[:DNS_LABEL_MAX].strip("-")
    return label or "device"


def device_entry(d: dict[str, Any]) -> dict[str, Any]:
    """One resource.k8s.io/v1 Device from the driver's view of a device.

    Attribute names without a domain belong to the driver's own domain; each
    value carries exactly one of int, bool, string, version.
    """
    attributes: dict[str, dict[str, Any]] = {
        "index": {"int": d["index"]},
        "numa": {"int": d["numa"]},
        "class": {"string": d["cls"][:ATTRIBUTE_STRING_MAX]},
    }
    for key in ("uuid", "model", "vendor"):
        if d.get(key):
            attributes[key] = {"string": str(d[key])[:ATTRIBUTE_STRING_MAX]}
    if d.get("pci_address"):
        attributes[PCI_BUS_ID] = {"string": d["pci_address"]}
    entry: dict[str, Any] = {"name": d["name"], "attributes": attributes}
    if d.get("memory_mib"):
        entry["capacity"] = {"memory": {"value": f"{d['memory_mib']}Mi"}}
    if d.get("taints"):
        entry["taints"] = [dict(t) for t in d["taints"]]
    return entry


def quantity(value: str) -> int | float:
    """Parse a Kubernetes quantity well enough to compare what the server canonicalized."""
    m = re.fullmatch(r"([0-9.]+)([A-Za-z]*)", str(value).strip())
    if not m:
        return -1
    number, suffix = float(m.group(1)), m.group(2)
    scale = _BINARY_SUFFIXES.get(suffix) or _DECIMAL_SUFFIXES.get(suffix)
    return -1 if scale is None else number * scale


def _comparable(devices: list[dict[str, Any]]) -> list[tuple]:
    """What we publish of each device, ignoring fields the server defaults or canonicalizes."""
    out = []
    for d in devices:
        attrs = tuple(sorted((k, tuple(sorted(v.items()))) for k, v in (d.get("attributes") or {}).items()))
        cap = tuple(sorted((k, quantity(v.get("value", ""))) for k, v in (d.get("capacity") or {}).items()))
        taints = tuple((t.get("key"), t.get("value", ""), t.get("effect"), t.get("timeAdded"))
                       for t in d.get("taints") or [])
        out.append((d.get("name"), attrs, cap, taints, _comparable_counters(d.get("consumesCounters"))))
    return out


def _comparable_counters(sets: list[dict[str, Any]] | None) -> tuple:
    """CounterSets or a device's consumesCounters (both name their set and map counters to {value}): by name, each
    quantity as a number, since the server canonicalizes it ("40960Mi" comes back "40Gi")."""
    def counters(c: dict[str, Any]) -> tuple:
        return tuple(sorted((k, quantity((v or {}).get("value", ""))) for k, v in (c.get("counters") or {}).items()))
    return tuple(sorted((c.get("name") or c.get("counterSet"), counters(c)) for c in sets or []))


def _index_of(name: str, length: int) -> int | None:
    prefix = name[:length]
    if len(name) <= length or name[length] != NAME_SEPARATOR or not re.fullmatch(r"[0-9a-f]+", prefix):
        return None
    return int(prefix, 16)


class SlicePublisher:
    """Keeps the node's pool in the API server equal to the driver's devices, on its own thread."""

    def __init__(self, client: Client, driver: str, node: str, duplicate_first: bool = False,
                 empty: bool = False,
                 layout: Callable[[list[dict[str, Any]]], list[dict[str, Any]] | None] | None = None) -> None:
        """`layout` turns the driver's devices into the pool's slices ({"devices": [...]} or {"sharedCounters":
        [...]} each), or None for one slice of plain devices (harness/reference/dra_partitions.py)."""
        self.client, self.driver, self.node = client, driver, node
        self.duplicate_first = duplicate_first  # the bad-slice mutant
        self.empty = empty  # the empty-slice mutant
        self.layout = layout
        self._cond = threading.Condition()
        self._desired: list[dict[str, Any]] | None = None
        self._dirty = False
        self._stopping = False
        self._node_uid: str | None = None
        self._thread = threading.Thread(target=self._run, name="slices", daemon=True)
        self.published_generation: int | None = None

    def start(self) -> SlicePublisher:
        self._thread.start()
        return self

    def update(self, devices: list[dict[str, Any]]) -> None:
        with self._cond:
            parts = self.layout(devices) if self.layout is not None else None
            self._desired = parts if parts is not None else self._desired_slices([device_entry(d) for d in devices])
            self._dirty = True
            self._cond.notify_all()

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(5)

    # -- the loop ----------------------------------------------------------

    def _run(self) -> None:
        backoff = RETRY_START_S
        next_sync = time.monotonic()
        while True:
            with self._cond:
                while not self._stopping and not self._dirty and time.monotonic() < next_sync:
                    self._cond.wait(next_sync - time.monotonic())
                if self._stopping:
                    return
                desired, self._dirty = self._desired, False
            if desired is None:
                next_sync = time.monotonic() + RESYNC_S
                continue
            try:
                self._sync(desired)
            except Exception as err:  # any API or network error: retry later
                log.warning("publishing ResourceSlices failed, retrying in %.1fs: %s", backoff, err)
                next_sync = time.monotonic() + backoff
                backoff = min(backoff * 2, RETRY_MAX_S)
                continue
            backoff = RETRY_START_S
            next_sync = time.monotonic() + RESYNC_S

    def _desired_slices(self, devices: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The pool's slices of plain devices: what goes into each slice's spec beside driver, pool and node."""
        if self.empty:
            # The bug: the pool is published, but without the devices the driver serves.
            return [{"devices": []}]
        if self.duplicate_first and devices:
            # The bug: a second slice of the same pool repeats a device name.
            return [{"devices": devices}, {"devices": devices[:1]}]
        return [{"devices": devices}]

    def _owner(self) -> list[dict[str, Any]]:
        if self._node_uid is None:
            try:
                self._node_uid = self.client.get(f"/api/v1/nodes/{self.node}")["metadata"]["uid"]
            except Exception as err:  # no Node object (yet): publish unowned
                log.info("node %s not readable (%s); slices have no owner", self.node, err)
                return []
        return [{"apiVersion": "v1", "kind": "Node", "name": self.node, "uid": self._node_uid, "controller": True}]

    def _sync(self, desired: list[dict[str, Any]]) -> None:
        """One pass of resourceslicecontroller.go syncPool, for our one pool (`desired`: each slice's content)."""
        selector = f"{SLICE_SELECTOR_NODE}={self.node},{SLICE_SELECTOR_DRIVER}={self.driver}"
        existing = [s for s in self.client.list(SLICES_PATH, field_selector=selector)
                    if s.get("spec", {}).get("driver") == self.driver and s["spec"].get("nodeName") == self.node]
        ours = [s for s in existing if s["spec"].get("pool", {}).get("name") == self.node]
        obsolete = [s for s in existing if s not in ours]  # pools we no longer have
        length = max(INDEX_MIN_LENGTH, len(f"{len(desired) - 1:x}"))  # getIndexLength
        generation = max((int(s["spec"]["pool"].get("generation", 0)) for s in ours), default=0)
        matched: dict[int, dict] = {}
        for s in ours:
            index = _index_of(s["metadata"]["name"], length)
            if (int(s["spec"]["pool"].get("generation", 0)) == generation and index is not None
                    and index < len(desired) and index not in matched):
                matched[index] = s
            else:
                obsolete.append(s)
        up_to_date = (not obsolete and len(matched) == len(desired) and all(
            int(s["spec"]["pool"].get("resourceSliceCount", 0)) == len(desired)
            and _comparable(s["spec"].get("devices") or []) == _comparable(desired[i].get("devices") or [])
            and _comparable_counters(s["spec"].get("sharedCounters")) == _comparable_counters(
                desired[i].get("sharedCounters"))
            for i, s in matched.items()))
        if up_to_date:
            self.published_generation = generation
            return
        generation += 1
        pool = {"name": self.node, "generation": generation, "resourceSliceCount": len(desired)}
        # Obsolete first: better to drop devices we no longer have even if the new slices fail.
        for s in obsolete:
            self.client.delete(f"{SLICES_PATH}/{s['metadata']['name']}", missing_ok=True)
        for i, content in enumerate(desired):
            spec = {"driver": self.driver, "pool": pool, "nodeName": self.node, **content}
            if i in matched:
                body = dict(matched[i])
                # A slice that held devices may hold counter sets now, and the other way round: never both.
                kept = {k: v for k, v in matched[i]["spec"].items() if k not in ("devices", "sharedCounters")}
                body["spec"] = {**kept, **spec}
                self.client.replace(f"{SLICES_PATH}/{body['metadata']['name']}", body)
            else:
                prefix = f"{i:0{length}x}{NAME_SEPARATOR}{self.driver}{NAME_SEPARATOR}{self.node}{NAME_SEPARATOR}"
                metadata: dict[str, Any] = {"generateName": prefix}
                owner = self._owner()
                if owner:
                    metadata["ownerReferences"] = owner
                self.client.create(SLICES_PATH, {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                                                 "metadata": metadata, "spec": spec})
        self.published_generation = generation
        log.info("published pool %s generation %d: %s", self.node, generation,
                 ", ".join(d["name"] for part in desired for d in part.get("devices") or []) or "no devices")
