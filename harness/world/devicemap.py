"""Which of the plugin's devices is which piece of fake hardware.

Checks that fail, heat or unplug one fake device and expect the plugin to
report *that* device need to know its name on the wire. Plugins name devices
their own way (`card0-0`, a hash, a UUID), so the mapping comes, in order,
from: an explicit `devices.map` in the subject file; the inventory IDs
themselves when the plugin uses them; or what the plugin's Allocate answer
for one device points at (device nodes, mounts, env values carrying a UUID,
serial or PCI address). A plugin device that maps to no inventory device, or
to more than one, stays unmapped. The report shows the mapping and its source.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

# Allocate calls made to learn the mapping: enough for every inventory fixture, bounded for huge lists.
MAX_ALLOCATE_PROBES = 64

EXPLICIT, IDENTITY, ALLOCATE, NONE = "subject file", "same IDs as the inventory", "Allocate answers", "none"


@dataclass(frozen=True)
class HardwareDevice:
    """What identifies one fake device: its inventory ID and the strings a plugin may pass on."""

    id: str
    paths: tuple[str, ...] = ()  # device node paths (basenames are compared too)
    tokens: tuple[str, ...] = ()  # uuid, serial, PCI address

    def matches(self, paths: Iterable[str], values: Iterable[str]) -> bool:
        names = {os.path.basename(p.rstrip("/")) for p in self.paths}
        if any(p in self.paths or os.path.basename(p.rstrip("/")) in names for p in paths):
            return True
        return any(token and token in value for token in self.tokens for value in values)


@dataclass(frozen=True)
class DeviceMap:
    pairs: dict[str, str] = field(default_factory=dict)  # plugin device ID -> inventory device ID
    source: str = NONE

    def inventory_id(self, plugin_id: str) -> str | None:
        return self.pairs.get(plugin_id)

    def plugin_id(self, inventory_id: str) -> str | None:
        return next((p for p, i in self.pairs.items() if i == inventory_id), None)

    def describe(self) -> str:
        if not self.pairs:
            return "no plugin device maps to an inventory device"
        shown = ", ".join(f"{p}->{i}" for p, i in sorted(self.pairs.items())[:8])
        more = f" (+{len(self.pairs) - 8} more)" if len(self.pairs) > 8 else ""
        return f"{shown}{more} (from {self.source})"


def allocation_strings(response: Any) -> tuple[list[str], list[str]]:
    """(paths, values) a ContainerAllocateResponse points at: device and mount host paths, env and CDI."""
    paths = [d.host_path for d in response.devices] + [m.host_path for m in response.mounts]
    values = list(response.envs.values()) + [c.name for c in response.cdi_devices] + list(response.annotations.values())
    return paths, values


def map_devices(plugin_ids: list[str], hardware: list[HardwareDevice], explicit: dict[str, str] | None,
                allocate: Callable[[str], Any] | None, opaque: bool = False) -> DeviceMap:
    """`opaque`: the subject says the plugin names devices its own way, so equal names are a coincidence."""
    known = {h.id for h in hardware}
    if explicit:
        return DeviceMap({p: i for p, i in explicit.items() if p in plugin_ids and i in known}, EXPLICIT)
    same = {p: p for p in plugin_ids if p in known}
    if same and not opaque:
        return DeviceMap(same, IDENTITY)
    if allocate is None:
        return DeviceMap()
    pairs = {}
    for plugin_id in plugin_ids[:MAX_ALLOCATE_PROBES]:
        try:
            paths, values = allocation_strings(allocate(plugin_id))
        except Exception:  # a plugin that cannot allocate one device leaves it unmapped
            continue
        hits = [h.id for h in hardware if h.matches(paths, values)]
        if len(hits) == 1:
            pairs[plugin_id] = hits[0]
    # Two plugin devices on one fake device (shared GPUs, MIG-like slices) are legal, but
    # failing that device then changes both: keep the mapping one-to-one for the checks.
    counts: dict[str, int] = {}
    for inv in pairs.values():
        counts[inv] = counts.get(inv, 0) + 1
    return DeviceMap({p: i for p, i in pairs.items() if counts[i] == 1}, ALLOCATE if pairs else NONE)
