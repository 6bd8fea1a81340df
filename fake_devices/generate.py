"""Seeded inventories: the same seed always gives the same devices, byte for byte.

Two random streams, both derived from the seed: faker's (through
`DeviceProvider`) draws identities (vendor, model, serial, uuid, PCI address),
and a `random.Random(seed)` draws physical state (temperature). The provider
draws only through faker's seeded `random.Random`, never through faker's own
helpers, whose algorithms may change between faker releases; Python's
`random.Random` is stable for a given seed.
"""

from __future__ import annotations

import random
import uuid

from faker import Faker
from faker.providers import BaseProvider

from fake_devices.model import CLASSES, HEALTHY, Device, Inventory

DEFAULT_COUNTS: dict[str, int] = {"gpu": 4}
NUMA_NODES = 2

# (vendor, [(model, memory MiB), ...]) per class. Made-up names: the fake
# hardware must never be mistaken for a real product in a report.
CATALOG: dict[str, list[tuple[str, list[tuple[str, int]]]]] = {
    "gpu": [
        ("Fakelet Graphics", [("FX-100", 16384), ("FX-200", 24576), ("FX-300 Pro", 49152)]),
        ("Mockwave Compute", [("MW-8", 8192), ("MW-16", 16384), ("MW-80X", 81920)]),
    ],
    "nic": [
        ("Fakelet Networks", [("FN-25G", 0), ("FN-100G", 0)]),
        ("Loopback Labs", [("LL-10", 0), ("LL-200 SmartNIC", 4096)]),
    ],
    "fpga": [
        ("Fakelet Logic", [("FL-A7", 8192), ("FL-K9", 16384)]),
        ("Gatearray Works", [("GW-2", 4096)]),
    ],
    "generic": [
        ("Fakelet", [("Widget", 0), ("Gadget", 0)]),
    ],
}
SERIAL_PREFIX = {"gpu": "FG", "nic": "FN", "fpga": "FF", "generic": "FK"}
SERIAL_ALPHABET = "ABCDEFGHJKLMNPQRSTUVWXYZ0123456789"  # no I/O: serials get read aloud
# PCI buses by NUMA node: the low half of the bus range hangs off node 0, the
# high half off node 1, as on a two-socket server.
BUS_RANGES = {0: (0x17, 0x7f), 1: (0x80, 0xfe)}
PCI_DEVICES_PER_BUS = 32  # PCI: a 5-bit device number


class DeviceProvider(BaseProvider):
    """Faker provider for device identities; all draws go through faker's seeded random."""

    def __init__(self, generator: object) -> None:
        super().__init__(generator)
        self._slots: set[tuple[int, int]] = set()  # (bus, device) pairs handed out

    def device_vendor_model(self, cls: str) -> tuple[str, str, int]:
        vendor, models = self.generator.random.choice(CATALOG[cls])
        model, memory_mib = self.generator.random.choice(models)
        return vendor, model, memory_mib

    def device_serial(self, cls: str) -> str:
        rnd = self.generator.random
        body = "".join(rnd.choice(SERIAL_ALPHABET) for _ in range(10))
        return f"{SERIAL_PREFIX[cls]}{body}"

    def device_uuid(self) -> str:
        return str(uuid.UUID(int=self.generator.random.getrandbits(128), version=4))

    def device_pci_address(self, numa: int) -> str:
        """A PCI address on a bus of the device's NUMA node, distinct from earlier draws.

        One device per bus while buses last (as on real servers); large
        inventories then share buses, device numbers 1..31.
        """
        low, high = BUS_RANGES[numa % NUMA_NODES]
        for device in range(PCI_DEVICES_PER_BUS):
            free = [b for b in range(low, high + 1) if (b, device) not in self._slots]
            if free:
                bus = self.generator.random.choice(free)
                self._slots.add((bus, device))
                return f"0000:{bus:02x}:{device:02x}.0"
        raise ValueError(f"NUMA node {numa % NUMA_NODES} has no free PCI address left "
                         f"({(high - low + 1) * PCI_DEVICES_PER_BUS} slots): ask for fewer devices")


def generate(seed: int, counts: dict[str, int] | None = None) -> Inventory:
    """An inventory fully determined by `seed` and `counts` (default {"gpu": 4}).

    Classes come out in the fixed order gpu, nic, fpga, generic whatever the
    order of `counts`; ids are <cls>-<n> and nodes fake<cls><n>; within a class
    the first half of the devices sits on NUMA node 0 and the rest on node 1.
    """
    counts = dict(DEFAULT_COUNTS if counts is None else counts)
    unknown = sorted(set(counts) - set(CLASSES))
    if unknown:
        raise ValueError(f"unknown device class(es) {unknown}; known: {list(CLASSES)}")
    for cls, n in counts.items():
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise ValueError(f"count for {cls!r} must be a non-negative integer, got {n!r}")
    fake = Faker()
    fake.seed_instance(seed)
    provider = DeviceProvider(fake)
    fake.add_provider(provider)
    rng = random.Random(seed)
    devices = []
    for cls in CLASSES:
        n = counts.get(cls, 0)
        for i in range(n):
            numa = i * NUMA_NODES // n
            vendor, model, memory_mib = provider.device_vendor_model(cls)
            devices.append(Device(
                id=f"{cls}-{i}", cls=cls, vendor=vendor, model=model,
                serial=provider.device_serial(cls), uuid=provider.device_uuid(),
                pci_address=provider.device_pci_address(numa), numa=numa, memory_mib=memory_mib,
                temperature_c=round(rng.uniform(32.0, 48.0), 1), health=HEALTHY, present=True,
                ecc_errors=0, node=f"fake{cls}{i}",
            ))
    return Inventory(seed=seed, devices=devices)
