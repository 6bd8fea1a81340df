"""`fakelet matrix`: one table per driver, its checks down, kubelet release x node across.

    fakelet matrix --subject reference-dra --kubelet-version 1.34,1.36 --node fake,real --out DIR [--shard K/N]
    fakelet matrix --merge DIR... --out OUT

Each cell (subject, release, node) is one ordinary check run, as `fakelet fidelity` runs its two
(the same RunConfig, run_one and shared control plane): on the fake node the release picks the
fake kubelet's model of that minor, on the real node the release itself is built from the Go
module proxy. The work is the (cell, check) pairs, split by `--shard K/N` exactly as `fakelet
run --shard` splits (subject, check) pairs (harness/run/shards.py), each shard writing its cells
and `shard.json`; `--merge` refuses the same overlaps, gaps and foreign shards `fakelet merge` does
(reports/merge.py) and writes the table from every shard's cells.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.config.runconfig import RunConfig, check_kubelet_version
from harness.kubelet.versions import minor_of
from harness.run import shards
from harness.run.no_verdict import interrupted_reports
from harness.spec.checks import SUITES, catalog
from harness.spec.subjects import ProfileError, load_subject
from reports.merge import MergeError, ShardDir, check_shards
from reports.model import INTERRUPTED, SubjectReport, run_status

CELLS = "cells"
NODES = ("fake", "real")
MATRIX_MD, MATRIX_JSON = "matrix.md", "matrix.json"
SHORT = {"pass": "pass", "fail": "FAIL", "not-exercised": "not exercised", "n/a": "n/a", "skip": "skip",
         "error": "ERROR"}


@dataclass(frozen=True)
class Cell:
    subject: str
    release: str
    node: str

    @property
    def label(self) -> str:
        return f"{self.subject}@{self.release}/{self.node}"

    @property
    def slug(self) -> str:
        return f"{self.subject}-{self.release}-{self.node}"

    @property
    def column(self) -> str:
        return f"{self.release} {self.node}"


def split_list(value: str, flag: str) -> list[str]:
    items = [v.strip() for v in (value or "").split(",") if v.strip()]
    if not items:
        raise ProfileError(f"{flag}: give a comma-separated list")
    return list(dict.fromkeys(items))


def plan(args: argparse.Namespace) -> list[Cell]:
    """Every cell, validated before anything starts: known subjects, releases each node can run, nodes."""
    if not args.subject:
        raise ProfileError("give --subject NAME (repeatable)")
    nodes = split_list(args.node, "--node")
    bad = [n for n in nodes if n not in NODES]
    if bad:
        raise ProfileError(f"--node {bad[0]!r}: choose from {', '.join(NODES)}")
    releases = split_list(args.kubelet_version, "--kubelet-version")
    for release in releases:
        for node in nodes:
            try:
                check_kubelet_version(minor_of(release) if node == "fake" else release, node)
            except ValueError as err:
                raise ProfileError(f"--kubelet-version {release} on the {node} node: {err}") from None
    for subject in args.subject:
        load_subject(subject)  # an unknown name lists the known ones
    return [Cell(s, r, n) for s in args.subject for r in releases for n in nodes]


def checks_of(cell: Cell, wanted: list[str]) -> list[str]:
    kind = load_subject(cell.subject).kind
    known = catalog(SUITES[kind])
    unknown = sorted(set(wanted) - set(known))
    if unknown and not set(wanted) & set(known):
        raise ProfileError(f"--check {unknown[0]}: not a check of {cell.subject} (a {kind} subject)")
    return sorted(set(wanted) & set(known)) if wanted else sorted(known)


def build_run(cell: Cell, checks: list[str], args: argparse.Namespace, out: Path) -> RunConfig:
    release = minor_of(cell.release) if cell.node == "fake" else cell.release
    return RunConfig.build(subject=cell.subject, profile=args.profile, seed=args.seed, checks=checks,
                           out=str(out), node=cell.node, kubelet_version=release)


def run(args: argparse.Namespace, out: Path, run_one: Callable[..., SubjectReport], shared_plane: Any,
        say: Callable[[str], None] = print, stop: Any = None) -> list[tuple[Cell, SubjectReport]]:
    """Every cell of this shard, then its table. `stop` (harness/run/stopping.StopSignals): a stop signal at any
    moment ends the run with the table of what ran, every other selected check interrupted before its verdict."""
    shielded = stop.shielded if stop is not None else contextlib.nullcontext
    cells = plan(args)
    shard = shards.parse_shard(args.shard) if args.shard else shards.Shard(1, 1)
    pairs = sorted((c.label, cid) for c in cells for cid in checks_of(c, args.check))
    mine = shard.take(pairs)
    work = [(c, [cid for label, cid in mine if label == c.label]) for c in cells]
    work = [(c, ids) for c, ids in work if ids]
    say(f"matrix: {len(cells)} cell(s), shard {shard}: {len(mine)} of {len(pairs)} (cell, check) pairs")
    runs = [(c, build_run(c, ids, args, out / CELLS / c.slug)) for c, ids in work]
    done: list[tuple[Cell, SubjectReport]] = []
    plane = None
    try:
        if stop is not None:
            stop.raise_if_requested()  # one that came while fakelet imported or checked its flags
        plane = shared_plane([r for _, r in runs])
        for cell, config in runs:
            report = run_one(args, config, out / CELLS / cell.slug)
            done.append((cell, report))
            say(f"{cell.label}: {report.status_line()}")
    except KeyboardInterrupt as err:  # commands.Interrupted carries the partial report of the cell that ran
        if stop is None:
            raise  # a caller without the stop signals' state handles it
        partial = getattr(err, "partial", None)
        if partial is not None:
            done.append((runs[len(done)][0], partial))
    finally:
        with shielded():
            if plane is not None:
                plane.stop()
    cell_map = {c.slug: {"subject": c.subject, "release": c.release, "node": c.node} for c in cells}
    with shielded():
        if stop is not None and stop.requested:
            done = interrupted_cells(runs, done)
        shards.write_record(shards.record_of(shard, pairs, mine, cells=cell_map), out)
        write_table(done, out)
    if stop is not None and stop.requested and not all(r.interrupted for _, r in done):
        done = interrupted_cells(runs, done)  # the stop came while the table was written: say so in it
        with shielded():
            write_table(done, out)
    return done


def interrupted_cells(runs: list[tuple[Cell, RunConfig]],
                      done: list[tuple[Cell, SubjectReport]]) -> list[tuple[Cell, SubjectReport]]:
    """Every cell marked interrupted; a cell that never ran lists every selected check without its verdict."""
    reports = interrupted_reports([config for _, config in runs], [report for _, report in done])
    return list(zip([cell for cell, _ in runs], reports, strict=True))


def load_cells(path: Path) -> list[SubjectReport]:
    """A matrix shard's cell reports, each named by its cell's label (what its shard record pairs name)."""
    record = json.loads((path / shards.SHARD_FILE).read_text())
    reports = []
    for slug, cell in record.get("cells", {}).items():
        report_file = path / CELLS / slug / "report.json"
        if report_file.is_file():
            report = SubjectReport.from_dict(json.loads(report_file.read_text()))
            report.subject = Cell(cell["subject"], cell["release"], cell["node"]).label
            reports.append(report)
    return reports


def merge_dirs(dirs: list[Path], out: Path) -> list[tuple[Cell, SubjectReport]]:
    from reports.merge import load_shard

    loaded: list[ShardDir] = [load_shard(d, load_cells) for d in dirs]
    if any("cells" not in s.record for s in loaded):
        raise MergeError(f"{next(s.path for s in loaded if 'cells' not in s.record)}: not a fakelet matrix shard "
                         "(use fakelet merge for fakelet run --shard)")
    check_shards(loaded)
    cells = {slug: Cell(c["subject"], c["release"], c["node"]) for s in loaded for slug, c in s.record["cells"].items()}
    by_label = {c.label: (slug, c) for slug, c in cells.items()}
    merged: dict[str, list[SubjectReport]] = {}
    for s in loaded:
        for r in s.reports:
            merged.setdefault(r.subject, []).append(r)
            slug = by_label[r.subject][0]
            target = out / CELLS / slug / f"shard-{s.record['index']}"
            shutil.copytree(s.path / CELLS / slug, target)
    done = []
    for label, parts in merged.items():
        slug, cell = by_label[label]
        base = parts[0]
        base.checks = sorted((c for p in parts for c in p.checks), key=lambda c: c.id)
        base.subject = cell.subject
        done.append((cell, base))
    shards.write_record({**loaded[0].record, "shard": "merged", "merged_from": [str(d) for d in dirs]}, out)
    write_table(done, out)
    return done


def write_table(done: list[tuple[Cell, SubjectReport]], out: Path) -> None:
    """One table per subject: rows = checks, columns = release x node, in the order asked. A stopped run's table
    says INTERRUPTED, and a selected check of it without a result says why instead of a verdict."""
    subjects = list(dict.fromkeys(c.subject for c, _ in done))
    interrupted = any(r.interrupted for _, r in done)
    lines = ["# fakelet matrix", ""]
    data: dict[str, Any] = {"format": 1, "subjects": {}}
    if interrupted:
        ran = sum(1 for _, r in done if r.checks)
        lines += [f"**{INTERRUPTED}**: stopped by a signal; {ran} of {len(done)} cell(s) have verdicts", ""]
        data["status"] = run_status([r for _, r in done])
    for subject in subjects:
        cells = [(c, r) for c, r in done if c.subject == subject]
        columns = list(dict.fromkeys(c.column for c, _ in sorted(cells, key=lambda cr: (cr[0].release,
                                                                                           cr[0].node))))
        verdicts = {(c.column, k.id): k.verdict for c, r in cells for k in r.checks}
        verdicts.update({(c.column, cid): r.no_result() for c, r in cells if r.interrupted for cid in r.missing})
        checks = sorted({cid for _, cid in verdicts})
        lines += [f"## {subject}", "", "| check | " + " | ".join(columns) + " |",
                  "| --- |" + " --- |" * len(columns)]
        for cid in checks:
            lines.append(f"| {cid} | " + " | ".join(short(verdicts.get((col, cid))) for col in columns) + " |")
        lines.append("")
        data["subjects"][subject] = {"columns": columns,
                                     "rows": {cid: {col: verdicts.get((col, cid)) for col in columns}
                                              for cid in checks}}
    (out / MATRIX_MD).write_text("\n".join(lines) + "\n")
    (out / MATRIX_JSON).write_text(json.dumps(data, indent=2) + "\n")


def short(verdict: str | None) -> str:
    return SHORT.get(verdict or "", verdict or "-")
