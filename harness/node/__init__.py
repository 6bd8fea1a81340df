"""The Node interface the checks talk to (interface.py) and its backends, one a file or room: the fake
kubelet (fake.py), the local real kubelet (real/), kind (kind/).

`harness.node` was one module before it was a room; its names still resolve here for one
release, with a DeprecationWarning (import them from harness.node.interface or .fake).
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

_OLD_NAMES = {"FakeNode": "harness.node.fake", "Node": "harness.node.interface", "NodeApi": "harness.node.interface",
              "AdmissionError": "harness.node.interface", "ContainerAllocation": "harness.node.interface",
              "PrepareError": "harness.node.interface", "PreparedClaim": "harness.node.interface",
              "UnprepareError": "harness.node.interface"}


def __getattr__(name: str) -> Any:
    if name not in _OLD_NAMES:
        raise AttributeError(f"module 'harness.node' has no attribute {name!r}")
    warnings.warn(f"harness.node.{name} moved to {_OLD_NAMES[name]}; the old name goes in the next release",
                  DeprecationWarning, stacklevel=2)
    value = getattr(importlib.import_module(_OLD_NAMES[name]), name)
    globals()[name] = value  # warned once
    return value
