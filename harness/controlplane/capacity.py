"""Consumable capacity (KEP-5075, DRAConsumableCapacity) for fakelet's allocator.

What k8s.io/dynamic-resource-allocation@v0.36.3 structured/internal/incubating does with it, which
kube-scheduler 1.36 runs (the gate is beta and on by default there; alpha and off in 1.35):

- a device with `allowMultipleAllocations: true` is never "in use": another claim may have it too, each
  allocation of it a share with an ID of its own (allocator_incubating.go allocateDevice: GenerateNewShareID,
  a random UUID) and the capacity it consumes recorded beside it (`consumedCapacity`, every capacity of the
  device, even one not requested);
- what a request consumes of a capacity (consumable_capacity.go calculateConsumedCapacity): unrequested, the
  policy's default, else the whole value; requested without a policy, the amount as is; with a validRange,
  rounded up to min, then to min + n * step; with validValues, up to the first value not below it;
- a device fits (CmpRequestOverCapacity) unless the request names a capacity the device lacks, the amount
  violates the policy (above validRange.max, off the step, not among validValues; the default never does),
  or what other claims' shares and this allocation's consume, with it, exceeds the capacity's value. A
  device that allows a single allocation is held to the same (its requests must fit its capacity), and
  gets no share ID and no consumedCapacity.
"""

from __future__ import annotations

import math
import uuid
from collections import defaultdict
from collections.abc import Iterable
from fractions import Fraction
from typing import Any

from harness.instruments.quantity import quantity

DeviceKey = tuple[str, str, str]  # (driver, pool, device)


def multi_allocatable(device: dict[str, Any]) -> bool:
    return device.get("allowMultipleAllocations") is True


def requested(request: dict[str, Any]) -> dict[str, Fraction]:
    """A request's `exactly.capacity.requests`, as numbers."""
    wanted = ((request.get("exactly") or request).get("capacity") or {}).get("requests") or {}
    return {str(k): quantity(v) for k, v in wanted.items()}


def _round_up(amount: Fraction, policy: dict[str, Any]) -> Fraction:
    valid_range = policy.get("validRange")
    if valid_range and valid_range.get("min") is not None:
        low = quantity(valid_range["min"])
        if amount < low:
            return low
        if valid_range.get("step") is None:
            return amount
        # Upstream rounds in whole units (roundUpRange: Quantity.Value(), a ceiling): so does this.
        lo, step = math.ceil(low), math.ceil(quantity(valid_range["step"]))
        return Fraction(lo + step * math.ceil(Fraction(math.ceil(amount) - lo, step)))
    for value in policy.get("validValues") or []:
        if amount <= quantity(value):
            return quantity(value)
    return amount


def consumption(capacity: dict[str, Any], amount: Fraction | None) -> Fraction:
    """What a request for `amount` (None: it names no amount) consumes of one DeviceCapacity."""
    policy = capacity.get("requestPolicy")
    if amount is None:
        if policy and policy.get("default") is not None:
            return quantity(policy["default"])
        return quantity(capacity.get("value", "0"))
    return _round_up(amount, policy) if policy else amount


def violates(amount: Fraction, policy: dict[str, Any] | None) -> bool:
    if not policy:
        return False
    if policy.get("default") is not None and amount == quantity(policy["default"]):
        return False
    valid_range = policy.get("validRange")
    if valid_range:
        if valid_range.get("max") is not None and amount > quantity(valid_range["max"]):
            return True
        if valid_range.get("step") is not None:
            low, step = math.ceil(quantity(valid_range.get("min", "0"))), math.ceil(quantity(valid_range["step"]))
            return (math.ceil(amount) - low) % step != 0
        return False
    values = policy.get("validValues") or []
    return bool(values) and all(amount != quantity(v) for v in values)


def consumed(device: dict[str, Any], wanted: dict[str, Fraction]) -> dict[str, Fraction]:
    """What a request wanting `wanted` consumes of each of the device's capacities."""
    return {name: consumption(cap or {}, wanted.get(name)) for name, cap in (device.get("capacity") or {}).items()}


_BINARY_SUFFIXES = (("Ei", 2**60), ("Pi", 2**50), ("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10))


def show(amount: Fraction) -> str:
    """A quantity as the API takes it: in the largest binary unit it is a whole number of, else in units, else a
    decimal."""
    if amount.denominator != 1:
        return f"{float(amount):g}"
    for suffix, unit in _BINARY_SUFFIXES:
        if amount and amount.numerator % unit == 0:
            return f"{amount.numerator // unit}{suffix}"
    return str(amount.numerator)


class CapacityLedger:
    """The capacity of every multi-allocatable device in one claim's allocation: what other claims' shares hold
    (`held`, from their allocation results) plus what this allocation has taken so far."""

    def __init__(self, held: Iterable[tuple[DeviceKey, dict[str, Any]]]) -> None:
        self.used: dict[DeviceKey, dict[str, Fraction]] = defaultdict(lambda: defaultdict(Fraction))
        for key, result in held:
            for name, value in (result.get("consumedCapacity") or {}).items():
                self.used[key][name] += quantity(value)

    def take(self, key: DeviceKey, device: dict[str, Any], wanted: dict[str, Fraction]) -> dict[str, Fraction] | str:
        """The device's consumption for the request, counted in, or why it does not fit."""
        capacity = device.get("capacity") or {}
        missing = sorted(set(wanted) - set(capacity))
        if missing:
            return f"no capacity {', '.join(missing)}"
        need = consumed(device, wanted)
        for name, amount in need.items():
            cap = capacity[name] or {}
            if violates(amount, cap.get("requestPolicy")):
                return f"capacity {name}: {show(amount)} is not allowed by its requestPolicy"
            have = quantity(cap.get("value", "0"))
            if self.used[key][name] + amount > have:
                return (f"capacity {name}: {show(amount)} wanted, {show(have - self.used[key][name])} of "
                        f"{show(have)} left")
        if multi_allocatable(device):
            for name, amount in need.items():
                self.used[key][name] += amount
        return need


    def holds(self, key: DeviceKey) -> bool:
        """Does a share (another claim's or this allocation's) hold some of the device?"""
        return any(v > 0 for v in self.used.get(key, {}).values())

    def release(self, key: DeviceKey, device: dict[str, Any], need: dict[str, Fraction]) -> None:
        """Give back what take() counted in (the device did not work out after all)."""
        if multi_allocatable(device):
            for name, amount in need.items():
                self.used[key][name] -= amount


def share_result(result: dict[str, Any], need: dict[str, Fraction]) -> dict[str, Any]:
    """An allocation result of a multi-allocatable device: a share of its own, and what it consumes."""
    return {**result, "shareID": str(uuid.uuid4()),
            "consumedCapacity": {name: show(amount) for name, amount in need.items()}}
