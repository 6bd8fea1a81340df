"""One step of a scenario as its file wrote it, and the one-line form messages show it in."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml


@dataclass(frozen=True)
class Step:
    action: str  # the one action key: kubelet, plugin, pod, device, wait, expect, ...
    arg: Any  # the value under that key
    options: dict[str, Any]  # the step's other keys
    where: str  # "file:line: steps[N]", for messages about this step
    index: int

    def describe(self) -> str:
        """The step as its file wrote it, on one line."""
        return flow({self.action: self.arg, **self.options})


def flow(mapping: dict[str, Any]) -> str:
    """A mapping as a scenario file writes it, on one line (YAML flow style, outer braces dropped)."""
    return yaml.safe_dump(mapping, default_flow_style=True, sort_keys=False, width=1000).strip()[1:-1]
