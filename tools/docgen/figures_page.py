"""docs/reference/benchmarks.md: the benchmarks' latest figures, from the committed benchmarks/figures.yaml.

The page is the only place the docs quote a measured figure; other pages link here. Each figure names the
machine, date and load it was measured at. A figure edited in the data file without regenerating the page
fails `gen_docs.py --check`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from docgen.markdown import cell, code, header, table

ROOT = Path(__file__).resolve().parents[2]
FIGURES = ROOT / "benchmarks" / "figures.yaml"
REQUIRED = ("id", "title", "script", "command", "target", "met", "measured", "figures")
MEASURED = ("machine", "date", "load")


class FiguresError(ValueError):
    pass


def load(path: Path = FIGURES) -> list[dict[str, Any]]:
    doc = yaml.safe_load(path.read_text())
    entries = doc.get("benchmarks") if isinstance(doc, dict) else None
    if not isinstance(entries, list):
        raise FiguresError(f"{path}: expected a mapping with a 'benchmarks' list")
    for n, entry in enumerate(entries):
        missing = [k for k in REQUIRED if k not in entry] + \
            [f"measured.{k}" for k in MEASURED if k not in (entry.get("measured") or {})]
        if missing:
            raise FiguresError(f"{path}: benchmarks[{n}] lacks {', '.join(missing)} (a figure says where and when "
                               "it was measured)")
        for figure in entry["figures"]:
            if set(figure) != {"what", "value"}:
                raise FiguresError(f"{path}: {entry['id']}: each figure is {{what, value}}, got {sorted(figure)}")
    return entries


def _met(value: object) -> str:
    return {True: "yes", False: "**no**", None: "n/a"}[value]  # type: ignore[index]


def anchor(entry: dict[str, Any]) -> str:
    return entry["id"].lower()


def render(path: Path = FIGURES) -> str:
    entries = load(path)
    out = header("Benchmarks: latest figures", "benchmarks/figures.yaml",
                 "What the benchmarks in `benchmarks/` measured last, with where and when. They are not tests: "
                 "nothing passes or fails on timing, and figures spread with the machine's load (the tails most). "
                 "`benchmarks/README.md` explains each benchmark.")
    rows = [[f"[{e['id']}](#{anchor(e)})", cell(e["title"]), cell(e["figures"][0]["what"] + ": " +
             str(e["figures"][0]["value"])), cell(e["target"]), _met(e["met"]), cell(e["measured"]["date"])]
            for e in entries]
    out += table(["", "benchmark", "headline", "target", "met", "measured"], rows)
    for e in entries:
        m = e["measured"]
        out += [f"## {e['id']}: {e['title']} {{#{anchor(e)}}}", "", f"`{e['command']}` ({code(e['script'])})", "",
                f"Measured on {cell(m['machine'])}; date: {cell(m['date'])}; load average: {cell(m['load'])}. "
                f"Target: {cell(e['target'])}. Met: {_met(e['met'])}.", ""]
        out += table(["figure", "value"], [[cell(f["what"]), cell(f["value"])] for f in e["figures"]])
        if e.get("note"):
            out += [cell(e["note"]), ""]
    return "\n".join(out).rstrip() + "\n"
