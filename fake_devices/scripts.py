"""Fault scripts: what happens to which device when, as plain data.

A script is a list of `Step`s with offsets from its start. Building one is
pure (the same arguments, or the same seed, give the same steps), so a
failing check can be rerun with exactly the faults it saw; `describe` turns
one into lines for a report, and `run_script` plays one against a backend.
"""

from __future__ import annotations

import math
import random
import threading
import time
from dataclasses import dataclass

from fake_devices.backend import OPS, DeviceBackend
from fake_devices.model import Inventory

NEEDS_VALUE = ("heat", "cool")
# A flap is a few cycles a person watches; past these it is a typo, and its steps would fill memory
# (one per half cycle) or wait past what a timer can hold.
MAX_FLAP_CYCLES = 10_000
MAX_PERIOD_S = 3600.0


@dataclass(frozen=True)
class Step:
    at_s: float  # offset from the script's start
    op: str  # one of backend.OPS
    device: str
    value: float | None = None  # degrees C for heat/cool; error count for ecc (default 1)

    def __post_init__(self) -> None:
        if not math.isfinite(self.at_s) or self.at_s < 0:
            raise ValueError(f"step at {self.at_s!r}: offset must be a non-negative number of seconds")
        if self.op not in OPS:
            raise ValueError(f"step at {self.at_s:g}s: unknown op {self.op!r}; known: {', '.join(OPS)}")
        if self.op in NEEDS_VALUE and self.value is None:
            raise ValueError(f"step at {self.at_s:g}s: {self.op} {self.device} needs a temperature")


def flap(device: str, period_s: float, cycles: int) -> list[Step]:
    """`cycles` times: fail, then recover half a period later; the next fail one period after the last.

    The script ends with the device recovered, at (cycles - 0.5) * period_s.
    """
    _positive("period_s", period_s)
    _count("cycles", cycles)
    if period_s > MAX_PERIOD_S or cycles > MAX_FLAP_CYCLES:
        raise ValueError(f"flap of {cycles} cycles of {period_s:g}s: at most {MAX_FLAP_CYCLES} cycles of "
                         f"{MAX_PERIOD_S:g}s")
    steps = []
    for k in range(cycles):
        steps += [Step(k * period_s, "fail", device), Step(k * period_s + period_s / 2, "recover", device)]
    return steps


def temperature_ramp(device: str, start_c: float, peak_c: float, step_c: float, period_s: float) -> list[Step]:
    """Heat from start_c up to peak_c in step_c increments, then cool back down to start_c; one step per period."""
    _positive("step_c", step_c)
    _positive("period_s", period_s)
    if peak_c < start_c:
        raise ValueError(f"peak_c ({peak_c:g}) must not be below start_c ({start_c:g})")
    # Computed from the index, not accumulated: no float drift past the peak.
    ups = [round(start_c + k * step_c, 6) for k in range(math.floor((peak_c - start_c) / step_c + 1e-9) + 1)]
    if ups[-1] != peak_c:
        ups.append(peak_c)
    downs = [round(peak_c - k * step_c, 6) for k in range(1, math.ceil((peak_c - start_c) / step_c - 1e-9))]
    if peak_c != start_c:
        downs.append(start_c)
    ops = [("heat", t) for t in ups] + [("cool", t) for t in downs]
    return [Step(k * period_s, op, device, t) for k, (op, t) in enumerate(ops)]


def unplug_replug(device: str, down_s: float) -> list[Step]:
    _positive("down_s", down_s)
    return [Step(0.0, "unplug", device), Step(down_s, "plug", device)]


def ecc_burst(device: str, count: int, period_s: float) -> list[Step]:
    """`count` single ECC errors, one per period."""
    _count("count", count)
    _positive("period_s", period_s)
    return [Step(k * period_s, "ecc", device, 1.0) for k in range(count)]


def bad_day(inventory: Inventory, seed: int, duration_s: float) -> list[Step]:
    """A seeded mix of failures, overheating, hot-unplugs and ECC bursts over `duration_s`.

    Incidents on one device never overlap, and each ends within the duration:
    every failure is recovered, every heat cooled back to the device's
    inventory temperature, every unplug replugged. Steps come sorted by time.
    """
    _positive("duration_s", duration_s)
    rng = random.Random(seed)
    candidates = [d for d in inventory.devices if d.present]
    if not candidates:
        return []
    chosen = {d.id for d in rng.sample(candidates, rng.randint(1, len(candidates)))}
    steps: list[Step] = []
    for device in (d for d in candidates if d.id in chosen):
        t = rng.uniform(0.0, 0.25) * duration_s
        while True:
            kind = rng.choice(("fail", "heat", "unplug", "ecc"))
            end = t + rng.uniform(0.05, 0.25) * duration_s
            if end > 0.95 * duration_s:
                break  # the first incident always fits: it ends by half the duration
            if kind == "fail":
                steps += [Step(t, "fail", device.id), Step(end, "recover", device.id)]
            elif kind == "heat":
                peak = round(rng.uniform(88.0, 105.0), 1)
                steps += [Step(t, "heat", device.id, peak), Step(end, "cool", device.id, device.temperature_c)]
            elif kind == "unplug":
                steps += [Step(t, "unplug", device.id), Step(end, "plug", device.id)]
            else:
                n = rng.randint(2, 5)
                steps += [Step(t + j * (end - t) / n, "ecc", device.id, 1.0) for j in range(n)]
            t = end + rng.uniform(0.02, 0.1) * duration_s
    # A stable sort: simultaneous steps keep their generated (deterministic) order.
    return sorted(steps, key=lambda s: s.at_s)


def describe(steps: list[Step]) -> list[str]:
    out = []
    for s in steps:
        line = f"+{s.at_s:.3f}s {s.op} {s.device}"
        if s.op in NEEDS_VALUE and s.value is not None:
            line += f" to {s.value:g} C"
        elif s.op == "ecc":
            line += f" +{int(s.value) if s.value is not None else 1} error(s)"
        out.append(line)
    return out


def run_script(backend: DeviceBackend, steps: list[Step], stop: threading.Event) -> int:
    """Play `steps` against `backend`, each at its offset from now; return how many ran.

    The waits are a schedule, not synchronisation: a step runs when its time
    comes, whatever the plugin has or has not done. Setting `stop` ends the
    script before its next step.
    """
    order = sorted(steps, key=lambda s: s.at_s)
    start = time.monotonic()
    done = 0
    for step in order:
        remaining = start + step.at_s - time.monotonic()
        if (remaining > 0 and stop.wait(remaining)) or stop.is_set():
            break
        backend.apply(step.op, step.device, step.value)
        done += 1
    return done


def _positive(name: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a positive number, got {value!r}")


def _count(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
