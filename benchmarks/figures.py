"""Record a benchmark's figures in benchmarks/figures.yaml, the file the docs' benchmarks page renders.

One entry per benchmark id (tools/docgen/figures_page.py's schema: id, title, script, command, target, met,
measured {machine, date, load}, figures [{what, value}], note); recording replaces the entry of the same id and
keeps the file's header. Regenerate the page afterwards: python tools/gen_docs.py.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

FIGURES = Path(__file__).resolve().parent / "figures.yaml"
SECTION = "benchmarks:"


def machine() -> str:
    return f"{len(os.sched_getaffinity(0))} cores (sched_getaffinity), shared with other engineers' suites"


def record(entry_id: str, title: str, script: str, command: str, target: str, met: bool | None,
           load: str, figures: list[tuple[str, str]], note: str = "") -> None:
    text = FIGURES.read_text()
    head, _, _body = text.partition(SECTION)
    entries: list[dict[str, Any]] = (yaml.safe_load(text) or {}).get("benchmarks") or []
    entry: dict[str, Any] = {
        "id": entry_id, "title": title, "script": script, "command": command, "target": target, "met": met,
        "measured": {"machine": machine(), "date": datetime.now(UTC).strftime("%Y-%m-%d"), "load": load},
        "figures": [{"what": w, "value": v} for w, v in figures]}
    if note:
        entry["note"] = note
    if any(e.get("id") == entry_id for e in entries):
        entries = [entry if e.get("id") == entry_id else e for e in entries]
        FIGURES.write_text(head + yaml.safe_dump({"benchmarks": entries}, sort_keys=False, allow_unicode=True,
                                                 width=120))
        return
    # A new entry goes at the end as text: the others keep their formatting (and their diffs stay small).
    dumped = yaml.safe_dump([entry], sort_keys=False, allow_unicode=True, width=120)
    FIGURES.write_text(text.rstrip("\n") + "\n" + "".join("  " + line if line.strip() else line
                                                          for line in dumped.splitlines(True)))
