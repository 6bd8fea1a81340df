"""Consumable capacity (KEP-5075): the fake backend's shareable devices, the reference DRA driver's published
capacity and shares, and fakelet's allocator on shares (on its own, and against the local API server). The
DRA-CAP checks end to end (the reference passes them, each capacity mutant fails exactly the ones its profile
names) are the kill matrix's: tests/test_kill_matrix.py.
"""

from __future__ import annotations

import uuid
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from conftest import SLICE_DRIVER, as_slices, publish_slices

from fake_devices.materialize import Materializer
from fake_devices.model import Inventory
from harness.controlplane import capacity
from harness.controlplane.allocator import AllocationError, Allocator
from harness.controlplane.client import ApiError
from harness.controlplane.scheduler import pod_body
from harness.reference import dra_capacity
from harness.reference.dra_driver import DraSysfsSource
from harness.spec.subjects import fixtures_dir
from harness.world.draenv import SHARED_INVENTORY
from suites.dra.test_capacity import capacity_errors, smallest_share

DRIVER = SLICE_DRIVER
GI = 2**30


def shared() -> Inventory:
    return Inventory.load(fixtures_dir() / SHARED_INVENTORY)


# -- the fake hardware ------------------------------------------------------------------------------------------


def test_a_shareable_gpu_shows_its_capacity_in_sysfs(tmp_path: Path) -> None:
    inventory = shared()
    assert inventory.devices[0].sharing == {"memory": {"total": "40Gi", "step": "10Gi"}}
    assert Inventory.from_yaml(inventory.to_yaml()) == inventory
    basic = Inventory.load(fixtures_dir() / "inventories" / "basic.yaml")
    assert "sharing" not in basic.to_yaml()
    Materializer(tmp_path).write_all(inventory)
    seen = {d.id: d for d in DraSysfsSource(tmp_path).read_devices()}
    assert seen["gpu-0"].sharing == {"memory": ("40Gi", "10Gi")} and seen["gpu-1"].sharing is None


@pytest.mark.parametrize(("sharing", "says"), [
    ({}, "non-empty mapping"),
    ({"Memory": {"total": "4Gi", "step": "1Gi"}}, "capacity name"),
    ({"memory": {"total": "4Gi"}}, "exactly"),
    ({"memory": {"total": "four", "step": "1Gi"}}, "not a quantity"),
    ({"memory": {"total": "4Gi", "step": "3Gi"}}, "fewer than two steps"),
    ({"memory": {"total": "4Gi", "step": "0"}}, "positive"),
])
def test_a_bad_sharing_is_refused_with_why(sharing: dict[str, Any], says: str) -> None:
    with pytest.raises(ValueError, match=says):
        Inventory.from_dict({"devices": [{"id": "gpu-0", "cls": "gpu", "memory_mib": 4096, "sharing": sharing}]})


def test_a_device_is_partitioned_or_shared_not_both() -> None:
    with pytest.raises(ValueError, match="partitions and sharing"):
        Inventory.from_dict({"devices": [{"id": "gpu-0", "cls": "gpu", "memory_mib": 4096,
                                          "partitions": {"slices": 2, "profiles": [{"name": "a", "size": 1}]},
                                          "sharing": {"memory": {"total": "4Gi", "step": "1Gi"}}}]})


# -- the driver's slices and shares -----------------------------------------------------------------------------


def devices_seen(tmp_path: Path) -> list[dict[str, Any]]:
    """The driver's device entries for the shared inventory, as its _effective makes them."""
    Materializer(tmp_path).write_all(shared())
    return [{"id": d.id, "name": d.id, "index": n, "cls": d.cls, "uuid": d.uuid, "model": d.model, "vendor": d.vendor,
             "numa": d.numa, "pci_address": d.pci_address, "memory_mib": d.memory_mib, "node": d.node,
             "host_path": d.host_path, "health": "HEALTHY", "reason": "", "layout": None, "sharing": d.sharing}
            for n, d in enumerate(DraSysfsSource(tmp_path).read_devices())]




def test_a_shareable_device_is_published_multi_allocatable(tmp_path: Path) -> None:
    devices = devices_seen(tmp_path)
    parts = dra_capacity.pool_slices(devices, None, None)
    assert parts is not None and len(parts) == 1
    gpu0, gpu1 = parts[0]["devices"]
    assert gpu0["allowMultipleAllocations"] is True and "allowMultipleAllocations" not in gpu1
    assert gpu0["capacity"]["memory"] == {"value": "40Gi", "requestPolicy": {
        "default": "10Gi", "validRange": {"min": "10Gi", "step": "10Gi"}}}
    assert capacity_errors(as_slices(parts)) == []
    assert smallest_share(gpu0) == {"memory": "10Gi"} and smallest_share(gpu1) == {"memory": "20Gi"}
    plain = [{**d, "sharing": None} for d in devices]
    assert dra_capacity.pool_slices(plain, None, None) is None


def test_the_slice_mutants(tmp_path: Path) -> None:
    parts = dra_capacity.pool_slices(devices_seen(tmp_path), "policy-without-multi", None)
    assert parts is not None
    assert any("allowMultipleAllocations must be true" in e for e in capacity_errors(as_slices(parts)))
    parts = dra_capacity.pool_slices(devices_seen(tmp_path), "overstates-capacity", None)
    assert parts is not None and capacity_errors(as_slices(parts)) == []  # valid on its face
    assert capacity.quantity(parts[0]["devices"][0]["capacity"]["memory"]["value"]) == 80 * GI


def test_each_share_is_prepared_and_torn_down_on_its_own(tmp_path: Path) -> None:
    gpu0 = devices_seen(tmp_path)[0]
    share = {"device": "gpu-0", "shareID": "s-1", "consumedCapacity": {"memory": "10Gi"}}
    assert dra_capacity.share_env(gpu0, share, None) == {"FAKELET_DEVICE_0_SHARE_ID": "s-1",
                                                         "FAKELET_DEVICE_0_MEMORY": "10Gi"}
    assert dra_capacity.share_env(gpu0, share, "share-full-capacity")["FAKELET_DEVICE_0_MEMORY"] == "40Gi"
    prepared = {f"uid-{n}": {"devices": [{"device": "gpu-0", "share_id": f"s-{n}", "consumed": {"memory": "10Gi"}}]}
                for n in range(3)}
    prepared["uid-x"] = {"devices": [{"device": "gpu-1"}]}
    assert dra_capacity.over_capacity(gpu0, share, prepared) is None  # 30Gi held, 10Gi more fits in 40Gi
    prepared["uid-3"] = prepared["uid-0"]
    assert "prepared shares hold 40Gi of 40Gi" in str(dra_capacity.over_capacity(gpu0, share, prepared))
    assert sorted(dra_capacity.sharing_claims(prepared, "uid-0")) == ["uid-1", "uid-2", "uid-3"]
    assert dra_capacity.sharing_claims(prepared, "uid-x") == []


# -- consumable capacity, as the allocator reads it ---------------------------------------------------------------


POLICY = {"default": "10Gi", "validRange": {"min": "10Gi", "step": "10Gi", "max": "30Gi"}}


@pytest.mark.parametrize(("cap", "amount", "consumed"), [
    ({"value": "40Gi"}, None, 40 * GI),  # unrequested, no policy: the whole of it
    ({"value": "40Gi"}, 3 * GI, 3 * GI),  # no policy: as asked
    ({"value": "40Gi", "requestPolicy": POLICY}, None, 10 * GI),  # the default
    ({"value": "40Gi", "requestPolicy": POLICY}, GI, 10 * GI),  # up to min
    ({"value": "40Gi", "requestPolicy": POLICY}, 11 * GI, 20 * GI),  # up to the next step
    ({"value": "40Gi", "requestPolicy": {"default": "2Gi", "validValues": ["1Gi", "2Gi", "8Gi"]}}, 3 * GI, 8 * GI),
    ({"value": "40Gi", "requestPolicy": {"default": "2Gi", "validValues": ["1Gi", "2Gi"]}}, 3 * GI, 3 * GI),
])
def test_what_a_request_consumes(cap: dict[str, Any], amount: int | None, consumed: int) -> None:
    assert capacity.consumption(cap, None if amount is None else Fraction(amount)) == consumed


def test_policy_violations() -> None:
    assert capacity.violates(Fraction(40 * GI), POLICY)  # past max
    assert not capacity.violates(Fraction(30 * GI), POLICY)
    assert capacity.violates(Fraction(3 * GI), {"default": "2Gi", "validValues": ["1Gi", "2Gi"]})
    assert not capacity.violates(Fraction(3 * GI), None)


def test_a_ledger_holds_shares_to_the_capacity() -> None:
    device = {"name": "gpu-0", "allowMultipleAllocations": True,
              "capacity": {"memory": {"value": "40Gi", "requestPolicy": POLICY}}}
    key = (DRIVER, "pool", "gpu-0")
    ledger = capacity.CapacityLedger([(key, {"consumedCapacity": {"memory": "20Gi"}})])
    assert ledger.holds(key)
    need = ledger.take(key, device, {"memory": Fraction(5 * GI)})
    assert need == {"memory": 10 * GI}
    assert "capacity memory: 20Gi wanted, 10Gi of 40Gi left" in str(ledger.take(key, device,
                                                                               {"memory": Fraction(15 * GI)}))
    assert "not allowed by its requestPolicy" in str(ledger.take(key, device, {"memory": Fraction(35 * GI)}))
    assert "no capacity bandwidth" in str(ledger.take(key, device, {"bandwidth": Fraction(1)}))
    assert isinstance(need, dict)
    ledger.release(key, device, need)
    assert ledger.take(key, device, {"memory": Fraction(20 * GI)}) == {"memory": 20 * GI}
    result = capacity.share_result({"device": "gpu-0"}, {"memory": Fraction(10 * GI)})
    assert uuid.UUID(result["shareID"]) and result["consumedCapacity"] == {"memory": "10Gi"}


# -- fakelet's allocator and the real API server ----------------------------------------------------------------






def allocate(alloc: Allocator, node: str, device: str, wanted: dict[str, str] | None = None) -> dict[str, Any]:
    name = f"p-{uuid.uuid4().hex[:6]}"
    pod = alloc.client.create(f"/api/v1/namespaces/{node}/pods", pod_body(node, name, {}))
    claim = alloc.create_claim(node, f"c-{uuid.uuid4().hex[:6]}", node, capacity_requests=wanted)
    return alloc.allocate(claim, node, DRIVER, {"name": name, "uid": pod["metadata"]["uid"]}, only={device})


def test_the_api_server_refuses_a_policy_on_a_single_allocation_device(slice_api: Any, tmp_path: Path) -> None:
    alloc, node = slice_api
    parts = dra_capacity.pool_slices(devices_seen(tmp_path), "policy-without-multi", None)
    assert parts is not None
    with pytest.raises(ApiError, match="allowMultipleAllocations must be true"):
        publish_slices(alloc, node, parts)


def test_shares_of_a_device_never_exceed_its_capacity(slice_api: Any, tmp_path: Path) -> None:
    alloc, node = slice_api
    parts = dra_capacity.pool_slices(devices_seen(tmp_path), None, None)
    assert parts is not None
    publish_slices(alloc, node, parts)
    results = [allocate(alloc, node, "gpu-0", {"memory": w})["status"]["allocation"]["devices"]["results"][0]
               for w in ("10Gi", "15Gi", "1")]  # 10Gi, rounded up to 20Gi, up to 10Gi: 40Gi in all
    assert [capacity.quantity(r["consumedCapacity"]["memory"]) for r in results] == [10 * GI, 20 * GI, 10 * GI]
    assert len({r["shareID"] for r in results}) == 3
    with pytest.raises(AllocationError, match="capacity memory: 10Gi wanted, 0 of 40Gi left"):
        allocate(alloc, node, "gpu-0")  # unrequested: the policy's default
    whole = allocate(alloc, node, "gpu-1")["status"]["allocation"]["devices"]["results"][0]
    assert "shareID" not in whole and "consumedCapacity" not in whole
    with pytest.raises(AllocationError, match="allocated to another claim"):
        allocate(alloc, node, "gpu-1")
