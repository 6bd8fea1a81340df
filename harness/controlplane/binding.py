"""Device binding conditions (KEP-5007, DRADeviceBindingConditions) and device status on the claim (KEP-4817,
DRAResourceClaimDeviceStatus) for fakelet's allocator and the DRA-BND checks.

What kube-scheduler 1.36 does with them (both gates on by default there: DRADeviceBindingConditions beta since
1.36, DRAResourceClaimDeviceStatus beta since 1.33; pkg/features/kube_features.go):

- the structured allocator copies a device's `bindingConditions` and `bindingFailureConditions` into its
  allocation result (k8s.io/dynamic-resource-allocation structured/internal/incubating allocator_incubating.go:
  `Results[i].BindingConditions = internal.BindingConditions`), and restricts the allocation to the chosen node
  when the device has `bindsToNode` (createNodeSelector); it tries pools without binding conditions first
  (pools_incubating.go GatherPools: `unbound_first`);
- bindClaim stamps `status.allocation.allocationTimestamp` (pkg/scheduler/framework/plugins/dynamicresources
  dynamicresources.go) and PreBind then polls the claim every 5 s (wait.PollUntilContextTimeout) until
  isClaimReadyForBinding: for each result with binding conditions, the status.devices entry of the same
  driver/pool/device exists, no bindingFailureCondition is True there (one that is fails the wait at once:
  ErrDeviceBindingFailed) and every bindingCondition is True; a wait past the binding timeout
  (DynamicResourcesBindingTimeoutDefault, 600 s, from allocationTimestamp) fails with ErrDeviceBindingTimeout;
- a failed or timed-out claim is unavailable in Filter, and PostFilter deallocates it (status.allocation and
  reservedFor cleared in one status update) so that the next attempt can pick other devices; the API server
  then drops the claim's status.devices entries of the devices no longer allocated (pkg/registry/resource/
  resourceclaim strategy.go dropDeallocatedStatusDevices).

fakelet's allocator stamps allocationTimestamp only on an allocation with binding conditions: upstream stamps
every allocation while the gates are on, but reads it only for results with binding conditions (isClaimTimeout),
so nothing a driver or a check sees differs, and every other check's claims stay as they were.

What the API server accepts in a status.devices entry (pkg/apis/resource/validation validation.go
validateDeviceStatus, validateNetworkDeviceData, validateRawExtension) is `entry_errors`.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

from fake_devices.fabric import canonical_cidr
from harness.controlplane.client import ApiError, KubeClient
from harness.spec.names import qualified_name_errors

BINDING_TIMEOUT_S = 600.0  # kube-scheduler apis/config types_pluginargs.go DynamicResourcesBindingTimeoutDefault
PREBIND_POLL_S = 5.0  # dynamicresources.go PreBind: wait.PollUntilContextTimeout(ctx, 5*time.Second, ...)
# k8s.io/api resource/v1 types.go
BINDING_CONDITIONS_MAX = 4  # BindingConditionsMaxSize
BINDING_FAILURE_CONDITIONS_MAX = 4  # BindingFailureConditionsMaxSize
STATUS_MAX_CONDITIONS = 8  # AllocatedDeviceStatusMaxConditions
STATUS_DATA_MAX = 10 * 1024  # AllocatedDeviceStatusDataMaxLength
NETWORK_MAX_IPS = 16  # NetworkDeviceDataMaxIPs
INTERFACE_NAME_MAX = 256  # NetworkDeviceDataInterfaceNameMaxLength
HARDWARE_ADDRESS_MAX = 128  # NetworkDeviceDataHardwareAddressMaxLength
# apimachinery pkg/apis/meta/v1/validation validation.go ValidateCondition
CONDITION_STATUSES = ("True", "False", "Unknown")
CONDITION_REASON_MAX, CONDITION_MESSAGE_MAX = 1024, 32 * 1024  # maxReasonLen, maxMessageLen
READY, PENDING, FAILED = "ready", "pending", "failed"
CONFLICT_RETRIES = 3

DeviceId = tuple[str, str, str, str]  # (driver, pool, device, shareID or "")


def result_fields(device: dict[str, Any]) -> dict[str, Any]:
    """What the allocation result of a published device carries of its binding conditions (none without)."""
    out: dict[str, Any] = {}
    for key in ("bindingConditions", "bindingFailureConditions"):
        if device.get(key):
            out[key] = list(device[key])
    return out


def unbound_first(pools: list[tuple[str, list[dict[str, Any]]]]) -> list[tuple[str, list[dict[str, Any]]]]:
    """(pool, slices) in the order the allocator tries them: pools with no device with binding conditions first,
    each part in its own order (pools_incubating.go GatherPools, poolHasBindingConditions)."""
    def binds(slices: list[dict[str, Any]]) -> bool:
        return any(d.get("bindingConditions") is not None for s in slices for d in (s.get("spec") or {}).get(
            "devices") or [])
    return [p for p in pools if not binds(p[1])] + [p for p in pools if binds(p[1])]


def has_binding_conditions(allocation: dict[str, Any]) -> bool:
    return any(r.get("bindingConditions") for r in (allocation.get("devices") or {}).get("results") or [])


def stamp(allocation: dict[str, Any]) -> dict[str, Any]:
    """The allocation with its allocationTimestamp (bindClaim), when a result has binding conditions."""
    if has_binding_conditions(allocation) and not allocation.get("allocationTimestamp"):
        allocation["allocationTimestamp"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return allocation


def device_id(entry: dict[str, Any]) -> DeviceId:
    return (str(entry.get("driver", "")), str(entry.get("pool", "")), str(entry.get("device", "")),
            str(entry.get("shareID") or ""))


def status_entry(claim: dict[str, Any], result: dict[str, Any]) -> dict[str, Any] | None:
    """The claim's status.devices entry of an allocation result (dynamicresources.go getAllocatedDeviceStatus:
    by driver, pool and device)."""
    for entry in (claim.get("status") or {}).get("devices") or []:
        if (entry.get("driver"), entry.get("pool"), entry.get("device")) == (
                result.get("driver"), result.get("pool"), result.get("device")):
            return dict(entry)
    return None


def _condition(entry: dict[str, Any], kind: str) -> dict[str, Any] | None:
    return next((c for c in entry.get("conditions") or [] if c.get("type") == kind), None)


def readiness(claim: dict[str, Any]) -> tuple[str, str]:
    """(READY, PENDING or FAILED, what says so): dynamicresources.go isClaimReadyForBinding."""
    allocation = (claim.get("status") or {}).get("allocation")
    if not allocation:
        return PENDING, "the claim is not allocated"
    for result in (allocation.get("devices") or {}).get("results") or []:
        wanted = result.get("bindingConditions") or []
        if not wanted:
            continue
        where = f"{result.get('pool')}/{result.get('device')}"
        entry = status_entry(claim, result)
        if entry is None:
            return PENDING, f"no status.devices entry for {where}"
        for kind in result.get("bindingFailureConditions") or []:
            failed = _condition(entry, kind)
            if failed is not None and failed.get("status") == "True":
                return FAILED, (f"{where}: binding failure condition {kind} True (reason {failed.get('reason')}, "
                                f"message {failed.get('message', '')!r})")
        for kind in wanted:
            cond = _condition(entry, kind)
            if cond is None or cond.get("status") != "True":
                return PENDING, f"{where}: binding condition {kind} " + (
                    "not set" if cond is None else f"{cond.get('status')} (reason {cond.get('reason')})")
    return READY, "every binding condition True"


def binding_parameter_errors(conditions: list[str], failures: list[str], where: str) -> list[str]:
    """pkg/apis/resource/validation validateDeviceBindingParameters, in its words."""
    errors = []
    if len(conditions) > BINDING_CONDITIONS_MAX:
        errors.append(f"{where}.bindingConditions: must have at most {BINDING_CONDITIONS_MAX} items")
    if len(failures) > BINDING_FAILURE_CONDITIONS_MAX:
        errors.append(f"{where}.bindingFailureConditions: must have at most {BINDING_FAILURE_CONDITIONS_MAX} items")
    for key, values in (("bindingConditions", conditions), ("bindingFailureConditions", failures)):
        errors += [f"{where}.{key}: {v!r}: {e}" for v in values for e in qualified_name_errors(v)]
        errors += [f"{where}.{key}: Duplicate value {v!r}" for i, v in enumerate(values) if v in values[:i]]
    errors += [f"{where}.bindingFailureConditions: {v!r}: bindingFailureConditions must not overlap with "
               f"bindingConditions" for v in failures if v in conditions]
    if failures and not conditions:
        errors.append(f"{where}.bindingConditions: bindingConditions are required to use bindingFailureConditions")
    if conditions and not failures:
        errors.append(f"{where}.bindingFailureConditions: bindingFailureConditions are required to use "
                      f"bindingConditions")
    return errors


_REASON = re.compile(r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")  # isValidConditionReason


def condition_errors(conditions: list[Any], where: str) -> list[str]:
    """apimachinery ValidateConditions, in its words."""
    errors = []
    if len(conditions) > STATUS_MAX_CONDITIONS:
        errors.append(f"{where}: must have at most {STATUS_MAX_CONDITIONS} items")
    seen: set[str] = set()
    for i, c in enumerate(conditions):
        at = f"{where}[{i}]"
        if not isinstance(c, dict):
            errors.append(f"{at}: not an object")
            continue
        kind = str(c.get("type", ""))
        if kind in seen:
            errors.append(f"{at}.type: Duplicate value {kind!r}")
        seen.add(kind)
        errors += [f"{at}.type: {e}" for e in qualified_name_errors(kind)]
        if c.get("status") not in CONDITION_STATUSES:
            errors.append(f"{at}.status: Unsupported value {c.get('status')!r}")
        if int(c.get("observedGeneration") or 0) < 0:
            errors.append(f"{at}.observedGeneration: must be greater than or equal to zero")
        if not c.get("lastTransitionTime"):
            errors.append(f"{at}.lastTransitionTime: Required value")
        reason = str(c.get("reason") or "")
        if not reason:
            errors.append(f"{at}.reason: Required value")
        elif not _REASON.match(reason) or len(reason) > CONDITION_REASON_MAX:
            errors.append(f"{at}.reason: {reason!r}: a condition reason must start with alphabetic character, "
                          f"optionally followed by a string of alphanumeric characters or '_,:', and must end "
                          f"with an alphanumeric character or '_'")
        if len(str(c.get("message") or "")) > CONDITION_MESSAGE_MAX:
            errors.append(f"{at}.message: Too long: may not be more than {CONDITION_MESSAGE_MAX} bytes")
    return errors


def entry_errors(entry: dict[str, Any], allocated: set[DeviceId], where: str) -> list[str]:
    """What keeps a status.devices entry from being what the release validates (validateDeviceStatus)."""
    errors = []
    if device_id(entry) not in allocated:
        errors.append(f"{where}: {'/'.join(device_id(entry)[:3])}: must be an allocated device in the claim")
    errors += condition_errors(list(entry.get("conditions") or []), f"{where}.conditions")
    if "data" in entry and entry["data"] is not None:
        data = entry["data"]
        raw = json.dumps(data, separators=(",", ":"))
        if len(raw) > STATUS_DATA_MAX:
            errors.append(f"{where}.data: Too long: may not be more than {STATUS_DATA_MAX} bytes")
        elif not isinstance(data, dict):
            errors.append(f"{where}.data: must be a valid JSON object")
    network = entry.get("networkData")
    if network:
        if len(str(network.get("interfaceName") or "")) > INTERFACE_NAME_MAX:
            errors.append(f"{where}.networkData.interfaceName: Too long: may not be more than {INTERFACE_NAME_MAX} "
                          f"bytes")
        if len(str(network.get("hardwareAddress") or "")) > HARDWARE_ADDRESS_MAX:
            errors.append(f"{where}.networkData.hardwareAddress: Too long: may not be more than "
                          f"{HARDWARE_ADDRESS_MAX} bytes")
        ips = list(network.get("ips") or [])
        if len(ips) > NETWORK_MAX_IPS:
            errors.append(f"{where}.networkData.ips: must have at most {NETWORK_MAX_IPS} items")
        for i, ip in enumerate(ips):
            canonical = canonical_cidr(str(ip))
            if canonical is None:
                errors.append(f"{where}.networkData.ips[{i}]: {ip!r}: must be a valid address in CIDR form, (e.g. "
                              f"10.9.8.7/24 or 2001:db8::1/64)")
            elif canonical != ip:
                errors.append(f"{where}.networkData.ips[{i}]: {ip!r}: must be in canonical form ({canonical!r})")
            if ip in ips[:i]:
                errors.append(f"{where}.networkData.ips[{i}]: Duplicate value {ip!r}")
    return errors


def allocated_ids(claim: dict[str, Any]) -> set[DeviceId]:
    """The claim's allocated devices as status.devices names them (validation.go gatherAllocatedDevices)."""
    results = (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or []
    return {device_id(r) for r in results}


def deallocate(client: KubeClient, claim: dict[str, Any]) -> dict[str, Any]:
    """What kube-scheduler's PostFilter does with a claim whose binding failed or timed out: allocation and
    reservedFor cleared in one status update (dynamicresources.go PostFilter)."""
    meta = claim["metadata"]
    path = f"/apis/resource.k8s.io/v1/namespaces/{meta['namespace']}/resourceclaims/{meta['name']}"
    for attempt in range(CONFLICT_RETRIES):
        current = client.get(path)
        status = current.setdefault("status", {})
        status.pop("allocation", None)
        status.pop("reservedFor", None)
        try:
            return client.replace_status(path, current)
        except ApiError as err:
            if err.status != 409 or attempt == CONFLICT_RETRIES - 1:
                raise
    raise AssertionError("unreachable")  # the loop returns or raises
