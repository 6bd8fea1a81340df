"""Shareable devices: what an inventory's `sharing` key makes of a device (consumable capacity, KEP-5075).

A shareable device serves several users at once, each with a share of a capacity it has a fixed total of,
handed out in steps (a GPU's memory under MPS-style sharing, a NIC's bandwidth cut into queues):

    sharing:
      memory: {total: 40Gi, step: 10Gi}

Each capacity is named (a C identifier, as a resource.k8s.io capacity name must be) and holds `total`, of
which a share is a whole number of `step`s: at most total / step shares fit at once. That is the hardware's
truth the DRA-CAP checks hold a driver's published capacity to. The device dir shows it as
`sharing/<name>/total` and `sharing/<name>/step` (one quantity per file, as the rest of the dir). Opt-in: an
inventory without the key has no shareable device, and nothing about its devices changes.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

from harness.instruments.quantity import quantity

# k8s.io/api resource/v1 types.go: a capacity name is a C identifier of at most 32 characters
# (ResourceSliceMaxIDLength); lower case here, since it also goes into file names.
CAPACITY_NAME_RE = re.compile(r"^[a-z_][a-z0-9_]{0,31}$")
CAPACITY_KEYS = ("total", "step")
# resource/v1 types.go ResourceSliceMaxAttributesAndCapacitiesPerDevice is 32 for both together; the
# reference driver publishes a handful of attributes beside these.
MAX_CAPACITIES = 8


def check_sharing(label: str, value: Any) -> dict[str, dict[str, str]]:
    """The `sharing` value of an inventory device, normalized, or a ValueError naming what is wrong."""
    def bad(what: str) -> ValueError:
        return ValueError(f"{label}: field 'sharing': {what}")

    if not isinstance(value, Mapping) or not value:
        raise bad(f"expected a non-empty mapping of capacity name -> {{total, step}}, got {value!r}")
    if len(value) > MAX_CAPACITIES:
        raise bad(f"at most {MAX_CAPACITIES} capacities, got {len(value)}")
    out: dict[str, dict[str, str]] = {}
    for name, cap in value.items():
        if not isinstance(name, str) or not CAPACITY_NAME_RE.match(name):
            raise bad(f"capacity name {name!r}: lower-case letters, digits and '_', at most 32, not starting "
                      f"with a digit")
        if not isinstance(cap, Mapping) or sorted(cap) != sorted(CAPACITY_KEYS):
            raise bad(f"capacity {name!r}: a mapping with exactly {list(CAPACITY_KEYS)}, got {cap!r}")
        amounts: dict[str, Fraction] = {}
        for key in CAPACITY_KEYS:
            try:
                amounts[key] = quantity(cap[key])
            except ValueError:
                raise bad(f"capacity {name!r}: {key} {cap[key]!r} is not a quantity") from None
            if amounts[key] <= 0 or amounts[key].denominator != 1:
                raise bad(f"capacity {name!r}: {key} {cap[key]!r} must be a positive whole amount")
        # Two shares at least: the driver's requestPolicy (a range from one step up, in steps) must pass
        # validation's "Min + Step must be less than or equal to the capacity value".
        if amounts["step"] * 2 > amounts["total"]:
            raise bad(f"capacity {name!r}: total {cap['total']} holds fewer than two steps of {cap['step']}")
        out[name] = {key: str(cap[key]) for key in CAPACITY_KEYS}
    return out


def shares_fit(sharing: Mapping[str, Mapping[str, str]], name: str) -> int:
    """How many one-step shares of capacity `name` the device holds at once."""
    cap = sharing[name]
    return int(quantity(cap["total"]) // quantity(cap["step"]))


def sharing_files(sharing: Mapping[str, Mapping[str, str]]) -> dict[str, str]:
    """sharing/<name>/{total,step}: one quantity per file, newline-terminated (a materializer Spec)."""
    files: dict[str, str] = {"sharing/": ""}
    for name, cap in sharing.items():
        files[f"sharing/{name}/"] = ""
        for key in CAPACITY_KEYS:
            files[f"sharing/{name}/{key}"] = f"{cap[key]}\n"
    return files
