"""The README's table of measured goals: the issue-27 speed goals and explore's kill rate, from figures.yaml.

The README quotes each goal's latest figure with the load it was measured at; the table sits between two
markers and is rewritten by tools/gen_docs.py, so `gen_docs.py --check` (tox -e docs) fails when the README
quotes a figure the data file no longer holds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from docgen.figures_page import FIGURES, anchor, load
from docgen.markdown import cell, table

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
IDS = ("P1-ratio", "P1b", "P2", "P3", "P5-py", "EXPLORE")  # the goals a README reader asks about, in the issues' order
BEGIN = "<!-- BEGIN generated from benchmarks/figures.yaml by tools/gen_docs.py: do not edit -->"
END = "<!-- END generated -->"


class ReadmeError(ValueError):
    pass


def _headline(entry: dict[str, Any]) -> str:
    figure = entry["figures"][0]
    return str(entry.get("headline") or f"{figure['what']}: {figure['value']}")


def block(path: Path = FIGURES) -> str:
    entries = {e["id"]: e for e in load(path)}
    missing = [i for i in IDS if i not in entries]
    if missing:
        raise ReadmeError(f"{path}: the README quotes {', '.join(missing)}, which the file lacks")
    met = {True: "yes", False: "**no**", None: "n/a"}
    rows = [[f"[{i}](docs/reference/benchmarks.md#{anchor(entries[i])})", cell(entries[i]["target"]),
             met[entries[i]["met"]], cell(_headline(entries[i])),
             cell(f"{entries[i]['measured']['load']} ({entries[i]['measured']['date']})")] for i in IDS]
    lines = table(["goal", "target", "met", "latest figure", "load (date)"], rows)
    return "\n".join([BEGIN, *lines, END])


def rewrite(text: str, path: Path = FIGURES) -> str:
    """The README's text with the block between the markers rendered afresh."""
    if text.count(BEGIN) != 1 or text.count(END) != 1 or text.index(BEGIN) > text.index(END):
        raise ReadmeError(f"{README.name}: expected one {BEGIN!r} ... {END!r} block")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return head + block(path) + tail
