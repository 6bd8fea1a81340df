"""The test suite's own order under xdist: the longest tests first, on every worker.

`--dist worksteal` hands each worker a contiguous share of the collected order and, when one runs dry, moves
the tail half of the longest queue to it. In collection order the kill matrix's one-minute runs and the leak
soak came last, so the suite ended with one worker on a long test and the others idle. Here each worker's share
starts with the longest tests and ends with the short ones, which are what stealing then evens out.

The expected durations are measured (tests/durations.json, written by a run with FAKELET_RECORD_DURATIONS=FILE);
a test never measured counts DEFAULT_S. The order changes when a test runs, never what it does.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import TypeVar

DURATIONS = Path(__file__).with_name("durations.json")
DEFAULT_S = 1.0  # most tests of this suite take well under a second; an unmeasured one is not the long tail
RECORD_ENV = "FAKELET_RECORD_DURATIONS"

T = TypeVar("T")


def load(path: Path = DURATIONS) -> dict[str, float]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): float(v) for k, v in data.items() if isinstance(v, (int, float))}


def expected(nodeid: str, known: dict[str, float]) -> float:
    return known.get(nodeid, DEFAULT_S)


def interleave(items: Sequence[T], seconds: Sequence[float], workers: int) -> list[T]:
    """Longest first, dealt round-robin into `workers` contiguous shares, each share longest first.

    The sort is stable, so ties keep collection order and every worker computes the same order (xdist requires
    identical collections).
    """
    ranked = sorted(range(len(items)), key=lambda i: -seconds[i])
    if workers <= 1:
        return [items[i] for i in ranked]
    shares: list[list[int]] = [ranked[k::workers] for k in range(workers)]
    return [items[i] for share in shares for i in share]


class Recorder:
    """Sums each test's setup, call and teardown durations; `write` keeps what the file knew of other tests."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    def add(self, nodeid: str, duration: float) -> None:
        self.seconds[nodeid] += duration

    def write(self, path: Path) -> None:
        merged = load(path) | {k: round(v, 1) for k, v in self.seconds.items()}
        kept = {k: v for k, v in sorted(merged.items(), key=lambda kv: (-kv[1], kv[0])) if v >= DEFAULT_S}
        path.write_text(json.dumps(kept, indent=0) + "\n")
