"""Partitionable devices (KEP-4815): the fake backend's partitioned GPUs, the reference DRA driver's CounterSets,
and fakelet's allocator on shared counters (against the local API server). The DRA-PRT checks end to end (the
reference passes them, each partition mutant fails exactly the ones its profile names) are the kill matrix's:
tests/test_kill_matrix.py.
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
from harness.controlplane import counters
from harness.controlplane.allocator import AllocationError, Allocator
from harness.controlplane.client import ApiError
from harness.controlplane.scheduler import pod_body
from harness.reference import dra_partitions
from harness.reference.dra_driver import DraSysfsSource
from harness.spec.subjects import fixtures_dir
from harness.world.draenv import PARTITIONED_INVENTORY
from suites.dra.test_partitions import partition_errors

DRIVER = SLICE_DRIVER
PARTITION_DEFECTS = ("counters-in-device-slice", "overcommit-counters", "consumes-missing-counter",
                     "prepares-whole-gpu")


def partitioned() -> Inventory:
    return Inventory.load(fixtures_dir() / PARTITIONED_INVENTORY)


# -- the fake hardware ------------------------------------------------------------------------------------------


def test_a_gpu_is_cut_into_overlapping_placements() -> None:
    gpu = partitioned().devices[0]
    parts = {p.id: p for p in gpu.partition_list()}
    assert sorted(parts) == ["gpu-0-1g-0", "gpu-0-1g-1", "gpu-0-1g-2", "gpu-0-1g-3", "gpu-0-2g-0", "gpu-0-2g-2"]
    assert parts["gpu-0-2g-0"].overlaps(parts["gpu-0-1g-1"]) and not parts["gpu-0-2g-0"].overlaps(parts["gpu-0-2g-2"])
    assert parts["gpu-0-2g-0"].memory_mib == gpu.memory_mib // 2
    uuids = {p.uuid for p in parts.values()}
    assert len(uuids) == len(parts) and all(u.startswith("MIG-") for u in uuids)


@pytest.mark.parametrize(("layout", "says"), [
    ({"slices": 0, "profiles": [{"name": "1g", "size": 1}]}, "'slices' must be"),
    ({"slices": 4, "profiles": [{"name": "1g", "size": 5}]}, "'size' must be"),
    ({"slices": 4, "profiles": [{"name": "1G", "size": 1}]}, "profile name"),
    ({"slices": 4, "profiles": []}, "non-empty list"),
    ({"slices": 4, "profiles": [{"name": "1g", "size": 1}], "extra": 1}, "unknown key"),
])
def test_a_bad_layout_is_refused_with_why(layout: dict[str, Any], says: str) -> None:
    doc = {"devices": [{"id": "gpu-0", "cls": "gpu", "memory_mib": 4096, "partitions": layout}]}
    with pytest.raises(ValueError, match=says):
        Inventory.from_dict(doc)


def test_only_a_gpu_has_partitions_and_inventories_without_them_are_unchanged() -> None:
    with pytest.raises(ValueError, match="only a gpu"):
        Inventory.from_dict({"devices": [{"id": "nic-0", "cls": "nic", "memory_mib": 64,
                                          "partitions": {"slices": 2, "profiles": [{"name": "a", "size": 1}]}}]})
    basic = Inventory.load(fixtures_dir() / "inventories" / "basic.yaml")
    assert "partitions" not in basic.to_yaml() and all(d.partition_list() == [] for d in basic.devices)
    assert Inventory.from_yaml(partitioned().to_yaml()) == partitioned()


def test_the_driver_reads_the_partitions_from_sysfs(tmp_path: Path) -> None:
    inventory = partitioned()
    Materializer(tmp_path).write_all(inventory)
    seen = {d.id: d for d in DraSysfsSource(tmp_path).read_devices()}
    layout = seen["gpu-0"].layout
    assert layout is not None and layout.slices == 4
    truth = {p.id: p for p in inventory.devices[0].partition_list()}
    assert {p.id: (p.uuid, p.slices, p.memory_mib) for p in layout.partitions} == \
        {i: (p.uuid, p.slices, p.memory_mib) for i, p in truth.items()}
    assert all(Path(p.host_path).exists() for p in layout.partitions)


# -- the driver's slices ----------------------------------------------------------------------------------------


def devices_seen(tmp_path: Path) -> list[dict[str, Any]]:
    """The driver's device entries for the partitioned inventory, as its _effective makes them."""
    Materializer(tmp_path).write_all(partitioned())
    return [{"id": d.id, "name": d.id, "index": n, "cls": d.cls, "uuid": d.uuid, "model": d.model, "vendor": d.vendor,
             "numa": d.numa, "pci_address": d.pci_address, "memory_mib": d.memory_mib, "node": d.node,
             "host_path": d.host_path, "health": "HEALTHY", "reason": "", "layout": d.layout}
            for n, d in enumerate(DraSysfsSource(tmp_path).read_devices())]




def test_counter_sets_get_slices_of_their_own(tmp_path: Path) -> None:
    parts = dra_partitions.pool_slices(devices_seen(tmp_path))
    assert parts is not None
    assert [sorted(p) for p in parts] == [["sharedCounters"], ["devices"]]
    assert [cs["name"] for cs in parts[0]["sharedCounters"]] == ["gpu-0-counters", "gpu-1-counters"]
    assert len(parts[1]["devices"]) == 14 and all(d["consumesCounters"] for d in parts[1]["devices"])
    assert partition_errors(as_slices(parts)) == []
    assert dra_partitions.pool_slices([{**d, "layout": None} for d in devices_seen(tmp_path)]) is None


@pytest.mark.parametrize(("defect", "says"), [
    ("counters-in-device-slice", "only one of `sharedCounters` or `devices`"),
    ("consumes-missing-counter", "counter memory-slice-4 not found in counter set gpu-0-counters"),
])
def test_the_slice_mutants_are_what_prt_01_names(tmp_path: Path, defect: str, says: str) -> None:
    parts = dra_partitions.pool_slices(devices_seen(tmp_path), defect)
    assert parts is not None
    assert any(says in e for e in partition_errors(as_slices(parts)))


def test_overcommit_is_valid_on_its_face(tmp_path: Path) -> None:
    parts = dra_partitions.pool_slices(devices_seen(tmp_path), "overcommit-counters")
    assert parts is not None and partition_errors(as_slices(parts)) == []
    assert parts[0]["sharedCounters"][0]["counters"]["memory-slice-0"] == {"value": "2"}


def test_prepare_defends_against_an_overlap(tmp_path: Path) -> None:
    devices = devices_seen(tmp_path)
    assert dra_partitions.clash(devices, "gpu-0-1g-1", {"gpu-0-2g-0": "uid-a"}) == ("gpu-0-2g-0", "uid-a")
    assert dra_partitions.clash(devices, "gpu-0-1g-1", {"gpu-0-2g-2": "uid-a", "gpu-1": "uid-b"}) is None
    assert dra_partitions.clash(devices, "gpu-0", {"gpu-0-1g-3": "uid-a"}) == ("gpu-0-1g-3", "uid-a")
    part = dra_partitions.find(devices, "gpu-0-1g-1")
    assert part is not None and part["node"] == "fakegpu0-1g-1" and part["uuid"].startswith("MIG-")
    whole = dra_partitions.find(devices, "gpu-0-1g-1", whole_gpu=True)
    assert whole is not None and whole["node"] == "fakegpu0"


# -- shared counters, as the allocator reads them ---------------------------------------------------------------


@pytest.mark.parametrize(("text", "value"), [("40Gi", 40 * 2**30), ("40960Mi", 40 * 2**30), ("1", 1),
                                             ("1e3", 1000), ("500m", Fraction(1, 2)), ("2k", 2000)])
def test_quantities_are_exact(text: str, value: Any) -> None:
    assert counters.quantity(text) == value


def test_a_ledger_refuses_what_the_set_no_longer_holds() -> None:
    sets = {"sharedCounters": [{"name": "cs", "counters": {"a": {"value": "2"}, "b": {"value": "1"}}}]}
    dev = [{"name": f"d{n}", "consumesCounters": [{"counterSet": "cs", "counters": {"a": {"value": "1"}}}]}
           for n in range(3)]
    dev.append({"name": "db", "consumesCounters": [{"counterSet": "cs", "counters": {"b": {"value": "1"}}}]})
    slices = as_slices([sets, {"devices": dev}])
    ledger = counters.Ledger(slices, allocated={"d0"})
    assert ledger.take(dev[1]) is None
    assert "counter a of counter set cs: 2 wanted, 1 left" in str(ledger.take(dev[2]))
    assert ledger.take(dev[3]) is None  # another counter of the same set
    assert counters.Ledger(slices, allocated={"db"}).take(dev[3]) is not None


# -- fakelet's allocator and the real API server ----------------------------------------------------------------






def allocate(alloc: Allocator, node: str, device: str) -> dict[str, Any]:
    # A real Pod: the resource-claim controller deallocates claims reserved for pods that do not exist.
    name = f"p-{uuid.uuid4().hex[:6]}"
    pod = alloc.client.create(f"/api/v1/namespaces/{node}/pods", pod_body(node, name, {}))
    claim = alloc.create_claim(node, f"c-{uuid.uuid4().hex[:6]}", node)
    return alloc.allocate(claim, node, DRIVER, {"name": name, "uid": pod["metadata"]["uid"]}, only={device})


def test_the_api_server_refuses_counters_beside_devices(slice_api: Any, tmp_path: Path) -> None:
    alloc, node = slice_api
    parts = dra_partitions.pool_slices(devices_seen(tmp_path), "counters-in-device-slice")
    assert parts is not None
    with pytest.raises(ApiError, match="only one of `sharedCounters` or `devices` is allowed"):
        publish_slices(alloc, node, parts)


def test_overlapping_partitions_are_never_both_allocated(slice_api: Any, tmp_path: Path) -> None:
    alloc, node = slice_api
    parts = dra_partitions.pool_slices(devices_seen(tmp_path))
    assert parts is not None
    publish_slices(alloc, node, parts)
    allocate(alloc, node, "gpu-0-2g-0")
    with pytest.raises(AllocationError, match="counter memory-slice-1 of counter set gpu-0-counters"):
        allocate(alloc, node, "gpu-0-1g-1")
    with pytest.raises(AllocationError, match="counter"):
        allocate(alloc, node, "gpu-0")
    allocate(alloc, node, "gpu-0-2g-2")  # disjoint
    allocate(alloc, node, "gpu-1")  # another GPU's counters


def test_a_pool_consuming_a_missing_counter_is_invalid(slice_api: Any, tmp_path: Path) -> None:
    alloc, node = slice_api
    parts = dra_partitions.pool_slices(devices_seen(tmp_path), "consumes-missing-counter")
    assert parts is not None
    publish_slices(alloc, node, parts)  # the API server cannot tell: the set is in another slice
    with pytest.raises(AllocationError, match=r"invalid resource pools.*counter memory-slice-4 not found"):
        allocate(alloc, node, "gpu-1-1g-0")
