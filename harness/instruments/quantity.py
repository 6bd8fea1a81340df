"""Kubernetes resource quantities ("40Gi", "1e3"), exactly: the fake hardware's capacities and the allocator's
counters both count in them."""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Any

# k8s.io/apimachinery pkg/api/resource quantity.go suffixes (binarySI, decimalSI; the decimal exponent form).
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"n": Fraction(1, 10**9), "u": Fraction(1, 10**6), "m": Fraction(1, 10**3), "": 1, "k": 10**3,
            "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}
_QUANTITY = re.compile(r"^([+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+))(?:([eE][+-]?[0-9]+)|([KMGTPE]i|[numkMGTPE])?)$")


def quantity(value: Any) -> Fraction:
    """A Kubernetes quantity, exactly ("40Gi", "40960Mi", "1", "1e3"); ValueError for anything else."""
    text = str(value).strip()
    m = _QUANTITY.match(text)
    if not m:
        raise ValueError(f"not a quantity: {value!r}")
    number = Fraction(m.group(1))
    if m.group(2):
        return number * Fraction(10) ** int(m.group(2)[1:])
    suffix = m.group(3) or ""
    return number * (_BINARY.get(suffix) or _DECIMAL[suffix])
