"""The benchmarks' figures, in one committed file (benchmarks/figures.json) that the docs' performance page renders.

Each entry: the benchmark's name, its figure with unit, its goal, whether the figure meets it, the load average
and usable CPUs it was measured at, the date (UTC) and a note. A benchmark that records replaces its own entry.
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

FIGURES = Path(__file__).resolve().parent / "figures.json"


def record(name: str, figure: float, goal: float, unit: str, met: bool, note: str = "",
           load: float | None = None, **extra: Any) -> None:
    entries = json.loads(FIGURES.read_text()) if FIGURES.exists() else []
    entry = {"name": name, "figure": round(figure, 3), "unit": unit, "goal": goal, "met": met,
             "load_average": round(os.getloadavg()[0] if load is None else load, 2),
             "cores": len(os.sched_getaffinity(0)), "date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%MZ"),
             "note": note, **extra}
    entries = [e for e in entries if e.get("name") != name] + [entry]
    FIGURES.write_text(json.dumps(sorted(entries, key=lambda e: e["name"]), indent=2) + "\n")
