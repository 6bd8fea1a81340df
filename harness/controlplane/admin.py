"""Admin access to devices (KEP-5018, DRAAdminAccess) for fakelet's allocator and the checks.

A request with `exactly.adminAccess: true` asks for monitoring or management access to a device that ordinary
claims may hold at the same time ("They ignore all ordinary claims to the device with respect to access modes
and any resource allocations", k8s.io/api resource/v1 types.go ExactDeviceRequest.AdminAccess). What
k8s.io/kubernetes@v1.36.3 and k8s.io/dynamic-resource-allocation@v0.36.3 do with it:

- the API server takes such a request only in a namespace labelled `resource.kubernetes.io/admin-access: "true"`
  (pkg/registry/resource/utils.go AuthorizedForAdmin, for the claim's spec; AuthorizedForAdminStatus, for an
  allocation result that says adminAccess), refusing it with "admin access to devices requires the
  `resource.kubernetes.io/admin-access: true` label on the containing namespace"; with the gate off it drops
  the field (pkg/api/resourceclaimspec/util.go dropDisabledDRAAdminAccessFields);
- the allocator hands it a device other claims hold (structured/internal/incubating/allocator_incubating.go:
  `!request.adminAccess() && alloc.deviceInUse(...)`), but never a device this same claim is already being
  given (`request.adminAccess() && alloc.allocatingDeviceForClaim(...)`), and marks the result
  `adminAccess: true` (allocateDevice);
- a result with `adminAccess: true` is not "allocated" for anyone else: kube-scheduler's view of what is in
  use skips it (pkg/scheduler/framework/plugins/dynamicresources/allocateddevices.go foreachAllocatedDevice,
  "Is not considered as allocated"), so it holds no device, no share of a device's capacity and no counters.
  Within its own allocation it still goes through the counter check (checkAvailableCounters is not skipped for
  admin access): a device whose counters another claim's allocation of it already took does not fit then.

DRAAdminAccess: alpha and off in 1.32 and 1.33, beta and on by default in 1.34 and 1.35, GA (locked on) in 1.36
(pkg/features/kube_features.go v1.36.3).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, TypeVar

from harness.controlplane.client import KubeClient

# pkg/apis/resource/types.go DRAAdminNamespaceLabelKey; the value must be "true" (case-sensitive).
ADMIN_NAMESPACE_LABEL = "resource.kubernetes.io/admin-access"
ADMIN_NAMESPACE_VALUE = "true"

T = TypeVar("T")


def requested(exactly: dict[str, Any]) -> bool:
    """Does the request (its `exactly`) ask for admin access?"""
    return exactly.get("adminAccess") is True


def granted(result: dict[str, Any]) -> bool:
    """Is the allocation result one of admin access?"""
    return result.get("adminAccess") is True


def ordinary(held: Iterable[tuple[T, dict[str, Any]]]) -> list[tuple[T, dict[str, Any]]]:
    """Of (key, allocation result) pairs other claims hold, those that count as allocated (not admin access)."""
    return [(key, r) for key, r in held if not granted(r)]


def label_namespace(client: KubeClient, namespace: str) -> None:
    """Let the namespace's claims ask for admin access, as a cluster admin labels a monitoring namespace."""
    client.patch(f"/api/v1/namespaces/{namespace}",
                 {"metadata": {"labels": {ADMIN_NAMESPACE_LABEL: ADMIN_NAMESPACE_VALUE}}})
