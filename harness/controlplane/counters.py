"""Shared counters (KEP-4815, DRAPartitionableDevices) for fakelet's allocator.

What k8s.io/dynamic-resource-allocation@v0.36.3 structured/internal/stable does with them, which
kube-scheduler 1.36 runs (the gate is beta and on by default there):

- a pool's slices with sharedCounters hold its counter sets, the others its devices
  (pools_stable.go GatherPools: `len(slice.Spec.SharedCounters) > 0`);
- the pool is invalid, and nothing is allocated while the allocator sees it, when two counter sets
  share a name ("duplicate counter set name"), or a device consumes from a set the pool lacks
  ("counter set %s not found") or a counter its set lacks ("counter %s not found in counter set %s")
  (getAndValidateCounterSets, validateDeviceCounterConsumption);
- a device is allocatable only while, for every counter of every set of its pool, what the set has
  less what allocated devices consume is at least what the devices being allocated consume, itself
  included (allocator_stable.go checkAvailableCounters); a set already over-consumed blocks every
  device of the pool, whatever it consumes.
"""

from __future__ import annotations

from collections import defaultdict
from fractions import Fraction
from typing import Any

from harness.instruments.quantity import quantity


def is_counter_slice(s: dict[str, Any]) -> bool:
    return bool((s.get("spec") or {}).get("sharedCounters"))


def counter_sets(slices: list[dict[str, Any]]) -> dict[str, dict[str, Fraction]]:
    """Counter set name -> counter -> value, from the pool's counter slices (the first of a duplicate name)."""
    out: dict[str, dict[str, Fraction]] = {}
    for s in slices:
        if not is_counter_slice(s):
            continue
        for cs in s["spec"]["sharedCounters"]:
            out.setdefault(cs.get("name", ""), {k: quantity((v or {}).get("value", "0"))
                                                for k, v in (cs.get("counters") or {}).items()})
    return out


def invalid_reason(slices: list[dict[str, Any]]) -> str | None:
    """Why the allocator takes the pool (its slices of one generation) for invalid, in its words, or None."""
    seen: set[str] = set()
    for s in slices:
        for cs in (s.get("spec") or {}).get("sharedCounters") or [] if is_counter_slice(s) else []:
            if cs.get("name") in seen:
                return f"duplicate counter set name {cs.get('name')}"
            seen.add(cs.get("name"))
    sets = counter_sets(slices)
    for s in slices:
        if is_counter_slice(s):
            continue  # their devices, if any, the allocator never reads
        for device in (s.get("spec") or {}).get("devices") or []:
            for use in device.get("consumesCounters") or []:
                name = use.get("counterSet", "")
                if name not in sets:
                    return f"counter set {name} not found"
                for counter in use.get("counters") or {}:
                    if counter not in sets[name]:
                        return f"counter {counter} not found in counter set {name}"
    return None


def _consumption(device: dict[str, Any]) -> dict[str, dict[str, Fraction]]:
    out: dict[str, dict[str, Fraction]] = defaultdict(dict)
    for use in device.get("consumesCounters") or []:
        for counter, value in (use.get("counters") or {}).items():
            out[use.get("counterSet", "")][counter] = quantity((value or {}).get("value", "0"))
    return out


class Ledger:
    """One pool's counters during one claim's allocation: `allocated` are the pool's devices other claims hold."""

    def __init__(self, slices: list[dict[str, Any]], allocated: set[str]) -> None:
        self.available = counter_sets(slices)
        for s in slices:
            if is_counter_slice(s):
                continue
            for device in (s.get("spec") or {}).get("devices") or []:
                if device.get("name") in allocated:
                    for name, counters in _consumption(device).items():
                        for counter, value in counters.items():
                            if counter in self.available.get(name, {}):
                                self.available[name][counter] -= value
        self.consumed: dict[str, dict[str, Fraction]] = defaultdict(lambda: defaultdict(Fraction))

    def take(self, device: dict[str, Any]) -> str | None:
        """Count the device in if every counter still fits (None), else leave it out and say which does not."""
        uses = _consumption(device)
        if not uses:
            return None  # upstream checks counters only for a device that consumes some
        for name, counters in uses.items():
            for counter, value in counters.items():
                self.consumed[name][counter] += value
        for name, counters in self.available.items():
            for counter, have in counters.items():
                used = self.consumed[name][counter]
                if have < used:
                    for n, cs in uses.items():
                        for c, v in cs.items():
                            self.consumed[n][c] -= v
                    return f"counter {counter} of counter set {name}: {_show(used)} wanted, {_show(have)} left"
        return None


def _show(value: Fraction) -> str:
    return str(value.numerator) if value.denominator == 1 else f"{float(value):g}"
