"""Admin access (KEP-5018): fakelet's allocator on admin-access requests (on its own, and against the local API
server, which takes them only in a labelled namespace), the reference DRA driver's part, and the DRA-ADM checks end
to end (the reference passes them, each admin-access mutant fails the ones its profile names; the kill matrix,
tests/test_kill_matrix.py, runs them with the rest).
"""

from __future__ import annotations

import re
import uuid
from typing import Any

import pytest
from conftest import SLICE_DRIVER, publish_slices

from harness.controlplane import admin
from harness.controlplane.allocator import AllocationError, Allocator
from harness.controlplane.client import ApiError
from harness.controlplane.scheduler import pod_body
from harness.reference import dra_admin, dra_capacity
from harness.reference.dra_defects import DRA_DEFECTS
from harness.spec.subjects import load_subject
from suites.dra.test_admin_access import CHECKS

DRIVER = SLICE_DRIVER
ADMIN_DEFECTS = ("refuses-busy-device", "admin-unprepare-resets")
PLAIN = [{"devices": [{"name": "gpu-0"}, {"name": "gpu-1"}]}]


# -- the rules, on their own --------------------------------------------------------------------------------------


def test_admin_access_results_count_as_allocated_for_no_one() -> None:
    assert admin.requested({"adminAccess": True}) and not admin.requested({"adminAccess": False})
    assert not admin.requested({})
    held = [("a", {"device": "gpu-0"}), ("b", {"device": "gpu-0", "adminAccess": True}),
            ("c", {"device": "gpu-1", "adminAccess": False})]
    assert [k for k, _ in admin.ordinary(held)] == ["a", "c"]


def test_the_reference_driver_prepares_admin_access_beside_an_ordinary_claim() -> None:
    ordinary, granted = {"device": "gpu-0"}, {"device": "gpu-0", "adminAccess": True}
    prepared = {"uid-a": {"devices": [{"device": "gpu-0"}]},
                "uid-b": {"devices": [{"device": "gpu-0", **dra_admin.entry_fields(granted)}]},
                "uid-c": {"devices": [{"device": "gpu-1", "admin_access": True}]}}
    # Admin-access claims hold no device: an ordinary claim on gpu-1 is prepared, one on gpu-0 is not.
    assert dra_admin.in_use(prepared, None) == {"gpu-0": "uid-a"}
    assert dra_admin.exempt(granted, None) and not dra_admin.exempt(ordinary, None)
    assert dra_admin.env(granted) == {"DRA_ADMIN_ACCESS": "true"} and dra_admin.env(ordinary) == {}
    assert dra_admin.entry_fields(ordinary) == {}
    # refuses-busy-device: every claim holds its device, and admin access is no exception.
    assert dra_admin.in_use(prepared, "refuses-busy-device") == {"gpu-0": "uid-b", "gpu-1": "uid-c"}
    assert not dra_admin.exempt(granted, "refuses-busy-device")
    # admin-unprepare-resets: what releasing uid-b's device wipes.
    assert dra_admin.reset_claims(prepared, "uid-b") == ["uid-a"]
    assert dra_admin.reset_claims(prepared, "uid-c") == []


def test_the_reference_driver_counts_no_admin_access_share_of_a_capacity() -> None:
    gpu = {"name": "gpu-0", "index": 0, "sharing": {"memory": ("40Gi", "10Gi")}}
    share = {"device": "gpu-0", "share_id": "s", "consumed": {"memory": "30Gi"}}
    prepared = {"uid-a": {"devices": [share]}, "uid-b": {"devices": [{**share, "admin_access": True}]}}
    wanted = {"device": "gpu-0", "shareID": "t", "consumedCapacity": {"memory": "10Gi"}}
    assert dra_capacity.over_capacity(gpu, wanted, prepared) is not None  # 60Gi held, counting uid-b's
    assert dra_capacity.over_capacity(gpu, wanted, dra_admin.ordinary(prepared)) is None
    assert dra_admin.ordinary(prepared)["uid-b"]["devices"] == []


def test_the_mutants_are_registered_with_what_they_kill() -> None:
    spec = load_subject("reference-dra")
    for name in ADMIN_DEFECTS:
        assert spec.defects[name].description == DRA_DEFECTS[name]
        assert set(spec.defects[name].kills) <= set(CHECKS) <= set(spec.defects[name].checks or [])
    assert spec.defects["refuses-busy-device"].kills == ["DRA-ADM-01", "DRA-ADM-02"]
    assert spec.defects["admin-unprepare-resets"].kills == ["DRA-ADM-02"]


# -- fakelet's allocator and the real API server ------------------------------------------------------------------


def allocate(alloc: Allocator, node: str, device: str | None, *, admin_access: bool = False, count: int = 1,
             wanted: dict[str, str] | None = None) -> dict[str, Any]:
    name = f"p-{uuid.uuid4().hex[:6]}"
    pod = alloc.client.create(f"/api/v1/namespaces/{node}/pods", pod_body(node, name, {}))
    claim = alloc.create_claim(node, f"c-{uuid.uuid4().hex[:6]}", node, count, capacity_requests=wanted,
                               admin_access=admin_access)
    return alloc.allocate(claim, node, DRIVER, {"name": name, "uid": pod["metadata"]["uid"]},
                          only=None if device is None else {device})


def results(claim: dict[str, Any]) -> list[dict[str, Any]]:
    return list(claim["status"]["allocation"]["devices"]["results"])


def test_the_api_server_takes_admin_access_only_in_a_labelled_namespace(slice_api: Any) -> None:
    alloc, node = slice_api
    # pkg/registry/resource/utils.go AuthorizedForAdmin
    says = f"admin access to devices requires the `{admin.ADMIN_NAMESPACE_LABEL}: true` label on the containing"
    with pytest.raises(ApiError, match=re.escape(says)):
        alloc.create_claim(node, "refused", node, admin_access=True)
    admin.label_namespace(alloc.client, node)
    claim = alloc.create_claim(node, "taken", node, admin_access=True)
    assert claim["spec"]["devices"]["requests"][0]["exactly"]["adminAccess"] is True


def test_admin_access_gets_a_device_another_claim_holds(slice_api: Any) -> None:
    alloc, node = slice_api
    publish_slices(alloc, node, PLAIN)
    admin.label_namespace(alloc.client, node)
    held = results(allocate(alloc, node, "gpu-0"))[0]
    assert "adminAccess" not in held
    granted = results(allocate(alloc, node, "gpu-0", admin_access=True))  # written back by the API server
    assert [(r["device"], r["adminAccess"]) for r in granted] == [("gpu-0", True)]
    assert results(allocate(alloc, node, "gpu-0", admin_access=True))[0]["device"] == "gpu-0"  # and again
    with pytest.raises(AllocationError, match="gpu-0 \\(allocated to another claim\\)"):
        allocate(alloc, node, "gpu-0")
    # An admin-access claim holds nothing: an ordinary claim still gets the device it has.
    allocate(alloc, node, "gpu-1", admin_access=True)
    assert results(allocate(alloc, node, "gpu-1"))[0]["device"] == "gpu-1"


def test_admin_access_never_gets_one_device_twice_in_a_claim(slice_api: Any) -> None:
    alloc, node = slice_api
    publish_slices(alloc, node, PLAIN)
    admin.label_namespace(alloc.client, node)
    allocate(alloc, node, None, count=2)  # both devices held
    both = results(allocate(alloc, node, None, admin_access=True, count=2))
    assert sorted(r["device"] for r in both) == ["gpu-0", "gpu-1"]
    with pytest.raises(AllocationError, match=r"wants 2 device\(s\) .* 1 available"):
        allocate(alloc, node, "gpu-0", admin_access=True, count=2)


def test_admin_access_consumes_no_share_of_a_capacity(slice_api: Any) -> None:
    alloc, node = slice_api
    policy = {"default": "10Gi", "validRange": {"min": "10Gi", "step": "10Gi"}}
    publish_slices(alloc, node, [{"devices": [{"name": "gpu-0", "allowMultipleAllocations": True,
                                               "capacity": {"memory": {"value": "40Gi", "requestPolicy": policy}}}]}])
    admin.label_namespace(alloc.client, node)
    whole = results(allocate(alloc, node, "gpu-0", admin_access=True, wanted={"memory": "40Gi"}))[0]
    # Upstream gives it a share and records what it would consume (allocateDevice), and counts none of it.
    assert whole["adminAccess"] is True and whole["shareID"] and whole["consumedCapacity"] == {"memory": "40Gi"}
    shares = [results(allocate(alloc, node, "gpu-0", wanted={"memory": "20Gi"}))[0] for _ in range(2)]
    assert [s["consumedCapacity"] for s in shares] == [{"memory": "20Gi"}] * 2
    with pytest.raises(AllocationError, match="0 of 40Gi left"):
        allocate(alloc, node, "gpu-0")


def test_admin_access_still_needs_the_counters(slice_api: Any) -> None:
    """Upstream checks the counters of a device for admin access too (allocator_incubating.go allocateDevice
    calls checkAvailableCounters whatever the request): a device whose counters its ordinary allocation took
    does not fit, although nothing else keeps admin access from it."""
    alloc, node = slice_api
    counters = {"memory": {"value": "4"}}
    publish_slices(alloc, node, [
        {"sharedCounters": [{"name": "gpu-0-counters", "counters": counters}]},
        {"devices": [{"name": "gpu-0", "consumesCounters": [{"counterSet": "gpu-0-counters", "counters": counters}]},
                     {"name": "gpu-1"}]},
    ])
    admin.label_namespace(alloc.client, node)
    allocate(alloc, node, "gpu-0")
    with pytest.raises(AllocationError, match="counter memory of counter set gpu-0-counters"):
        allocate(alloc, node, "gpu-0", admin_access=True)
    assert results(allocate(alloc, node, "gpu-1", admin_access=True))[0]["adminAccess"] is True
