"""Device binding conditions (KEP-5007) and device status (KEP-4817): the fake backend's fabric-attached devices,
the reference DRA driver's binding conditions and status entries, the scheduler's rules for them
(harness/controlplane/binding.py) on their own and against the local API server, and the DRA-BND checks end to
end: the reference passes them, each binding mutant fails exactly the checks it kills.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from conftest import SLICE_DRIVER, as_slices, publish_slices

from fake_devices.backend import DeviceBackend
from fake_devices.fabric import canonical_cidr
from fake_devices.materialize import Materializer
from fake_devices.model import Inventory
from harness.controlplane import binding
from harness.controlplane.allocator import Allocator
from harness.controlplane.base import RESOURCE_API
from harness.controlplane.client import ApiError
from harness.controlplane.scheduler import pod_body
from harness.instruments.timeline import Timeline
from harness.reference import dra_binding
from harness.reference.dra_defects import DRA_DEFECTS
from harness.reference.dra_driver import DraSysfsSource
from harness.spec.checks import NOT_EXERCISED
from harness.spec.subjects import fixtures_dir, load_subject
from harness.world.draenv import FABRIC_INVENTORY
from suites.dra.test_binding import CHECKS, HwFabric, binding_devices, parameter_errors, published, truth_errors

DRIVER = SLICE_DRIVER
BINDING_DEFECTS = ("never-binds", "hides-attach-failure", "wrong-network-data")


def fabric() -> Inventory:
    return Inventory.load(fixtures_dir() / FABRIC_INVENTORY)


# -- the fake hardware ------------------------------------------------------------------------------------------


def test_a_fabric_attached_nic_shows_its_attachment_in_sysfs(tmp_path: Path) -> None:
    inventory = fabric()
    assert inventory.devices[0].fabric == {"interface": "fab0", "mac": "02:fa:b0:00:00:01", "ips": ["10.77.0.11/24"],
                                           "attach_ms": 200, "attach_error": ""}
    assert Inventory.from_yaml(inventory.to_yaml()) == inventory
    assert "fabric" not in Inventory.load(fixtures_dir() / "inventories" / "basic.yaml").to_yaml()
    Materializer(tmp_path).write_all(inventory)
    seen = {d.id: d for d in DraSysfsSource(tmp_path).read_devices()}
    assert seen["nic-0"].fabric is not None and seen["gpu-0"].fabric is None
    assert {k: v for k, v in seen["nic-0"].fabric.items() if k != "dir"} == {
        "interface": "fab0", "mac": "02:fa:b0:00:00:01", "ips": ["10.77.0.11/24"], "attach_ms": 200}


@pytest.mark.parametrize(("value", "says"), [
    ({"mac": "02:fa:b0:00:00:01"}, "missing"),
    ({"interface": "a-very-long-interface", "mac": "02:fa:b0:00:00:01"}, "interface"),
    ({"interface": "fab0", "mac": "02:fa:b0:00:01"}, "mac"),
    ({"interface": "fab0", "mac": "02:fa:b0:00:00:01", "ips": ["10.77.0.11"]}, "CIDR"),
    ({"interface": "fab0", "mac": "02:fa:b0:00:00:01", "ips": ["10.77.0.011/24"]}, "CIDR"),
    ({"interface": "fab0", "mac": "02:fa:b0:00:00:01", "attach_ms": -1}, "attach_ms"),
    ({"interface": "fab0", "mac": "02:fa:b0:00:00:01", "speed": 1}, "unknown key"),
])
def test_a_bad_fabric_is_refused_with_why(value: dict[str, Any], says: str) -> None:
    with pytest.raises(ValueError, match=says):
        Inventory.from_dict({"devices": [{"id": "nic-0", "cls": "nic", "fabric": value}]})


def test_the_backend_fails_and_heals_attaches(tmp_path: Path) -> None:
    timeline = Timeline()
    with DeviceBackend(tmp_path, fabric(), timeline) as backend:
        error_file = Path(DraSysfsSource(tmp_path).read_devices()[1].fabric["dir"]) / "attach_error"  # type: ignore[index]
        assert error_file.read_text() == "\n"
        backend.fabric_fault("nic-0", "port down")
        assert error_file.read_text() == "port down\n"
        assert timeline.find(lambda e: e.kind == "device.fabric_fault" and e.get("device") == "nic-0")
        backend.fabric_fault("nic-0", "")
        assert error_file.read_text() == "\n"
        with pytest.raises(ValueError, match="not fabric-attached"):
            backend.fabric_fault("gpu-0", "x")


@pytest.mark.parametrize(("value", "canonical"), [
    ("10.9.8.7/24", "10.9.8.7/24"), ("2001:db8::1/64", "2001:db8::1/64"), ("2001:DB8::1/64", "2001:db8::1/64"),
    ("10.9.8.7", None), ("10.9.8.300/24", None), ("nonsense", None)])
def test_addresses_in_cidr_form(value: str, canonical: str | None) -> None:
    assert canonical_cidr(value) == canonical


# -- the driver's slices and status entries ----------------------------------------------------------------------


def devices_seen(tmp_path: Path) -> list[dict[str, Any]]:
    """The driver's device entries for the fabric inventory, as its _effective makes them."""
    Materializer(tmp_path).write_all(fabric())
    return [{"id": d.id, "name": d.id, "index": n, "cls": d.cls, "uuid": d.uuid, "model": d.model, "vendor": d.vendor,
             "numa": d.numa, "pci_address": d.pci_address, "memory_mib": d.memory_mib, "node": d.node,
             "host_path": d.host_path, "health": "HEALTHY", "reason": "", "layout": None, "sharing": None,
             "fabric": d.fabric} for n, d in enumerate(DraSysfsSource(tmp_path).read_devices())]


def test_only_fabric_attached_devices_are_published_with_binding_conditions(tmp_path: Path) -> None:
    devices = devices_seen(tmp_path)
    parts = dra_binding.pool_slices(devices, None)
    assert parts is not None
    entries = {e["name"]: e for e in parts[0]["devices"]}
    assert entries["nic-0"]["bindingConditions"] == [dra_binding.ATTACHED]
    assert entries["nic-0"]["bindingFailureConditions"] == [dra_binding.ATTACH_FAILED]
    assert entries["nic-0"]["bindsToNode"] is True
    assert "bindingConditions" not in entries["gpu-0"]
    slices = as_slices(parts)
    assert [d["name"] for _, d in binding_devices(slices)] == ["nic-0", "nic-1"]
    assert parameter_errors(slices) == []
    assert dra_binding.pool_slices([{**d, "fabric": None} for d in devices], None) is None


def entry_for(tmp_path: Path, error: str, defect: str | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the claim with its allocation of nic-0 and the driver's status entry, that entry)."""
    devices = devices_seen(tmp_path)
    nic0 = next(d for d in devices if d["name"] == "nic-0")
    result = {"request": "req-0", "driver": DRIVER, "pool": "node-a", "device": "nic-0",
              "bindingConditions": [dra_binding.ATTACHED], "bindingFailureConditions": [dra_binding.ATTACH_FAILED]}
    entry = dra_binding.status_entry(DRIVER, "node-a", result, nic0, error, devices, defect)
    claim = {"status": {"allocation": {"devices": {"results": [result]}}, "devices": [entry]}}
    return claim, entry


NIC0 = HwFabric("nic-0", "", "fab0", "02:fa:b0:00:00:01", ("10.77.0.11/24",))


@pytest.mark.parametrize(("error", "defect", "state"), [
    ("", None, binding.READY),
    ("port down", None, binding.FAILED),
    ("", "never-binds", binding.PENDING),
    ("port down", "never-binds", binding.PENDING),
    ("port down", "hides-attach-failure", binding.PENDING),
    ("", "hides-attach-failure", binding.READY),
    ("", "wrong-network-data", binding.READY),
])
def test_what_prebind_makes_of_the_drivers_status(tmp_path: Path, error: str, defect: str | None, state: str) -> None:
    claim, entry = entry_for(tmp_path, error, defect)
    assert binding.readiness(claim)[0] == state
    assert binding.entry_errors(entry, binding.allocated_ids(claim), "status.devices[0]") == []
    wrong = truth_errors(entry, NIC0)
    assert bool(wrong) == (defect == "wrong-network-data"), wrong
    if defect == "wrong-network-data":
        assert "02:fa:b0:00:00:02" in wrong[0]


# -- the scheduler's rules ----------------------------------------------------------------------------------------


def condition(kind: str, status: str = "True", **more: Any) -> dict[str, Any]:
    return {"type": kind, "status": status, "reason": "R", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z",
            **more}


def claim_with(entries: list[dict[str, Any]] | None, results: list[dict[str, Any]]) -> dict[str, Any]:
    return {"status": {"allocation": {"devices": {"results": results}}, **({"devices": entries} if entries else {})}}


RESULT = {"driver": DRIVER, "pool": "p", "device": "d", "bindingConditions": ["A", "B"],
          "bindingFailureConditions": ["F"]}


def test_readiness_follows_is_claim_ready_for_binding() -> None:
    assert binding.readiness({"status": {}})[0] == binding.PENDING
    assert binding.readiness(claim_with(None, [{**RESULT, "bindingConditions": None}]))[0] == binding.READY
    assert "no status.devices entry" in binding.readiness(claim_with(None, [RESULT]))[1]
    entry = {"driver": DRIVER, "pool": "p", "device": "d"}
    assert binding.readiness(claim_with([{**entry, "conditions": [condition("A")]}], [RESULT]))[0] == binding.PENDING
    both = [condition("A"), condition("B")]
    assert binding.readiness(claim_with([{**entry, "conditions": both}], [RESULT]))[0] == binding.READY
    # A failure condition True wins over binding conditions all True (it is looked at first).
    failed = claim_with([{**entry, "conditions": [*both, condition("F")]}], [RESULT])
    assert binding.readiness(failed)[0] == binding.FAILED
    other = claim_with([{**entry, "driver": "other.example.com", "conditions": both}], [RESULT])
    assert binding.readiness(other)[0] == binding.PENDING


def test_pools_without_binding_conditions_are_tried_first() -> None:
    def pool(name: str, *devices: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
        return name, [{"spec": {"devices": list(devices)}}]
    pools = [pool("a", {"name": "x", "bindingConditions": ["A"]}), pool("b", {"name": "y"}),
             pool("c", {"name": "z", "bindingConditions": []}), pool("d", {"name": "w"})]
    # An empty list is set, as a non-nil slice upstream (the API server drops empty lists: it never comes).
    assert [name for name, _ in binding.unbound_first(pools)] == ["b", "d", "a", "c"]


@pytest.mark.parametrize(("conditions", "failures", "says"), [
    (["A"], [], "bindingFailureConditions are required"),
    ([], ["F"], "bindingConditions are required"),
    (["A"], ["A"], "must not overlap"),
    (["A", "A"], ["F"], "Duplicate"),
    (["A", "B", "C", "D", "E"], ["F"], "at most 4"),
    (["not a name"], ["F"], "name part"),
])
def test_binding_parameters_as_validation_has_them(conditions: list[str], failures: list[str], says: str) -> None:
    assert any(says in e for e in binding.binding_parameter_errors(conditions, failures, "d")), says
    assert binding.binding_parameter_errors(["A"], ["F"], "d") == []


@pytest.mark.parametrize(("change", "says"), [
    ({"device": "other"}, "must be an allocated device"),
    ({"networkData": {"ips": ["10.0.0.1"]}}, "CIDR form"),
    ({"networkData": {"ips": ["10.0.0.01/24"]}}, "CIDR form"),
    ({"networkData": {"ips": ["2001:DB8::1/64"]}}, "canonical form"),
    ({"networkData": {"ips": ["10.0.0.1/24", "10.0.0.1/24"]}}, "Duplicate"),
    ({"networkData": {"interfaceName": "x" * 257}}, "interfaceName: Too long"),
    ({"data": [1, 2]}, "valid JSON object"),
    ({"conditions": [condition("A"), condition("A")]}, "Duplicate value 'A'"),
    ({"conditions": [condition("A", reason="")]}, "reason: Required"),
    ({"conditions": [condition("A", status="Yes")]}, "Unsupported value"),
    ({"conditions": [condition("A", lastTransitionTime="")]}, "lastTransitionTime: Required"),
])
def test_a_bad_status_entry_is_told_apart(change: dict[str, Any], says: str) -> None:
    entry = {"driver": DRIVER, "pool": "p", "device": "d", **change}
    errors = binding.entry_errors(entry, {(DRIVER, "p", "d", "")}, "status.devices[0]")
    assert any(says in e for e in errors), errors


def test_not_exercised_without_binding_conditions() -> None:
    timeline = Timeline()
    slices = as_slices([{"devices": [{"name": "gpu-0"}]}])
    event = timeline.record("api.slices", "apiserver", devices=["gpu-0"], slices=slices)
    env = SimpleNamespace(need_api=lambda: None, start=lambda: None, wait_dra_registered=lambda: event,
                          wait_allocatable=lambda count: event, timeline=timeline,
                          profile=SimpleNamespace(reaction_s=0.05, quiet_window_s=0.05))
    with pytest.raises(pytest.skip.Exception, match=f"^{NOT_EXERCISED}"):
        published(env)  # type: ignore[arg-type]


def test_the_mutants_are_registered_with_what_they_kill() -> None:
    spec = load_subject("reference-dra")
    for defect in BINDING_DEFECTS:
        assert defect in DRA_DEFECTS
        kills = set(spec.defects[defect].kills)
        assert kills and kills <= set(CHECKS) <= set(spec.defects[defect].checks or [])


# -- fakelet's allocator and the real API server ----------------------------------------------------------------


def allocate(alloc: Allocator, node: str, device: str) -> dict[str, Any]:
    name = f"p-{uuid.uuid4().hex[:6]}"
    pod = alloc.client.create(f"/api/v1/namespaces/{node}/pods", pod_body(node, name, {}))
    claim = alloc.create_claim(node, f"c-{uuid.uuid4().hex[:6]}", node)
    return alloc.allocate(claim, node, DRIVER, {"name": name, "uid": pod["metadata"]["uid"]}, only={device})


def status_path(claim: dict[str, Any]) -> str:
    meta = claim["metadata"]
    return f"{RESOURCE_API}/namespaces/{meta['namespace']}/resourceclaims/{meta['name']}"


def test_the_allocation_carries_the_binding_conditions(slice_api: Any, tmp_path: Path) -> None:
    alloc, node = slice_api
    parts = dra_binding.pool_slices(devices_seen(tmp_path), None)
    assert parts is not None
    publish_slices(alloc, node, parts)
    claim = allocate(alloc, node, "nic-0")
    allocation = claim["status"]["allocation"]
    assert allocation["devices"]["results"][0]["bindingConditions"] == [dra_binding.ATTACHED]
    assert allocation["devices"]["results"][0]["bindingFailureConditions"] == [dra_binding.ATTACH_FAILED]
    assert allocation.get("allocationTimestamp")  # the API server keeps it: DRADeviceBindingConditions is on
    plain = allocate(alloc, node, "gpu-0")
    assert "bindingConditions" not in plain["status"]["allocation"]["devices"]["results"][0]
    assert "allocationTimestamp" not in plain["status"]["allocation"]
    assert binding.readiness(claim)[0] == binding.PENDING and binding.readiness(plain)[0] == binding.READY


def test_the_api_server_holds_status_entries_to_the_rules(slice_api: Any, tmp_path: Path) -> None:
    alloc, node = slice_api
    devices = devices_seen(tmp_path)
    parts = dra_binding.pool_slices(devices, None)
    assert parts is not None
    publish_slices(alloc, node, parts)
    claim = allocate(alloc, node, "nic-0")
    result = claim["status"]["allocation"]["devices"]["results"][0]
    pool = result["pool"]
    nic0 = next(d for d in devices if d["name"] == "nic-0")
    good = dra_binding.status_entry(DRIVER, pool, result, nic0, "", devices, None)
    for bad in ({**good, "device": "nic-1"}, {**good, "networkData": {"ips": ["10.77.0.11"]}}):
        current = alloc.client.get(status_path(claim))
        current["status"]["devices"] = [bad]
        assert binding.entry_errors(bad, binding.allocated_ids(current), "e")  # fakelet's rules agree
        with pytest.raises(ApiError) as err:
            alloc.client.replace_status(status_path(claim), current)
        assert err.value.status == 422
    current = alloc.client.get(status_path(claim))
    current["status"]["devices"] = [good]
    written = alloc.client.replace_status(status_path(claim), current)
    assert binding.readiness(written)[0] == binding.READY
    assert binding.entry_errors(written["status"]["devices"][0], binding.allocated_ids(written), "e") == []
    # PostFilter gives the allocation up: the API server drops the entry with it.
    gone = binding.deallocate(alloc.client, written)
    assert not gone["status"].get("devices") and not gone["status"].get("allocation")


def test_the_api_server_refuses_binding_conditions_without_failure_conditions(slice_api: Any) -> None:
    alloc, node = slice_api
    parts = [{"devices": [{"name": "nic-0", "bindingConditions": ["A"]}]}]
    assert parameter_errors(as_slices(parts))
    with pytest.raises(ApiError, match="bindingFailureConditions are required"):
        publish_slices(alloc, node, parts)
