"""`fakelet fidelity`: the same checks on the fake kubelet and on the real one, side by side.

For each target (a subject, as a mutant or not) it runs the checks of its kind (the
device-plugin checks, or the DRA checks for a DRA driver) twice, once on each kubelet
(the real one through the relays, harness/node/relay),
and writes a table: check x target x {fake, real} verdicts, with
the reaction times each kubelet's run measured. A verdict that differs is a
*fidelity gap* unless fixtures/fidelity.yaml lists it as a known, explained
limitation of the fake; an unexplained gap makes the command exit 1.

Targets and known gaps come from fixtures/fidelity.yaml (or --targets FILE),
or from --subject/--defect on the command line.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.config.runconfig import RunConfig, check_kubelet_version
from harness.kubelet.versions import KUBELET_VERSIONS, minor_of
from harness.run.no_verdict import nothing_ran
from harness.spec.checks import SUITES, catalog
from harness.spec.subjects import ProfileError, fixtures_dir, load_subject, load_yaml
from reports.model import INTERRUPTED, NO_VERDICT_INTERRUPTED, NOT_EXERCISED, SKIP, SubjectReport

DEFAULT_TARGETS = "fidelity.yaml"  # under fixtures/
NODES = ("fake", "real")
TARGET_FIELDS = {"subject", "defect", "checks"}
KNOWN_FIELDS = {"subject", "defect", "check", "fake", "real", "why"}
UNEXERCISED = {NOT_EXERCISED, SKIP}  # nothing to compare: the table says why
UNCOMPARED = UNEXERCISED | {NO_VERDICT_INTERRUPTED}


@dataclass(frozen=True)
class Target:
    subject: str
    defect: str | None = None
    # The checks to run on both kubelets; None: every device-plugin check, or a mutant's kills (the checks
    # that must catch it; the kill matrix runs the rest).
    checks: tuple[str, ...] | None = None

    def __eq__(self, other: object) -> bool:  # a known gap names a target by subject and defect alone
        return isinstance(other, Target) and (self.subject, self.defect) == (other.subject, other.defect)

    def __hash__(self) -> int:
        return hash((self.subject, self.defect))

    @property
    def name(self) -> str:
        return self.subject + (f" --defect {self.defect}" if self.defect else "")

    @property
    def slug(self) -> str:
        return self.subject + (f"-{self.defect}" if self.defect else "")


@dataclass(frozen=True)
class Known:
    """A verdict difference the fake kubelet is known to have, and why (each one is in docs/real-kubelet.md)."""

    target: Target
    check: str
    fake: str
    real: str
    why: str


@dataclass
class Row:
    target: Target
    check: str
    fake: str
    real: str
    fake_measured: dict[str, float] = field(default_factory=dict)
    real_measured: dict[str, float] = field(default_factory=dict)
    known: Known | None = None
    detail: str = ""  # the real kubelet's side of a gap

    @property
    def compared(self) -> bool:
        return self.fake not in UNCOMPARED and self.real not in UNCOMPARED

    @property
    def gap(self) -> bool:
        """A difference nobody has explained: the fidelity test fails on it."""
        return self.compared and self.fake != self.real and self.known is None


@dataclass
class Table:
    rows: list[Row] = field(default_factory=list)
    wall_s: dict[str, float] = field(default_factory=lambda: dict.fromkeys(NODES, 0.0))
    stale_known: list[Known] = field(default_factory=list)  # listed, but the verdicts now agree
    interrupted: bool = False  # a stop signal ended the run: rows not run say so

    def gaps(self) -> list[Row]:
        return [r for r in self.rows if r.gap]

    def to_dict(self) -> dict[str, Any]:
        return {
            "rows": [{"subject": r.target.subject, "defect": r.target.defect, "check": r.check, "fake": r.fake,
                      "real": r.real, "fake_measured": r.fake_measured, "real_measured": r.real_measured,
                      "known": r.known.why if r.known else None, "gap": r.gap, "detail": r.detail}
                     for r in self.rows],
            "wall_s": self.wall_s, "gaps": len(self.gaps()),
            "stale_known": [dataclasses.asdict(k) for k in self.stale_known],
            **({"status": INTERRUPTED} if self.interrupted else {}),
        }


def _fields(item: Any, allowed: set[str], where: str) -> dict[str, Any]:
    if not isinstance(item, dict):
        raise ProfileError(f"{where}: expected a mapping, got {type(item).__name__}")
    unknown = sorted(set(item) - allowed)
    if unknown:
        raise ProfileError(f"{where}: unknown field(s) {unknown}; known: {sorted(allowed)}")
    if not isinstance(item.get("subject"), str):
        raise ProfileError(f"{where}: subject: a subject name is required")
    return item


def load_targets(path: Path) -> tuple[list[Target], list[Known]]:
    doc = load_yaml(path)
    data = doc.data if isinstance(doc.data, dict) else {}
    targets, known = [], []
    for n, item in enumerate(data.get("targets") or []):
        where = f"{path}: targets[{n}]"
        f = _fields(item, TARGET_FIELDS, where)
        targets.append(Target(f["subject"], f.get("defect"),
                              _checks(f.get("checks"), f"{where}.checks", subject_kind(f["subject"]))))
    for n, item in enumerate(data.get("known") or []):
        where = f"{path}: known[{n}]"
        f = _fields(item, KNOWN_FIELDS, where)
        for name in ("check", "fake", "real", "why"):
            if not isinstance(f.get(name), str) or not f[name].strip():
                raise ProfileError(f"{where}: {name}: required (a known gap says which check, both verdicts, why)")
        known.append(Known(Target(f["subject"], f.get("defect")), f["check"], f["fake"], f["real"], f["why"]))
    if not targets:
        raise ProfileError(f"{path}: targets: at least one {{subject: NAME}} is required")
    return targets, known


def _checks(value: Any, where: str, kind: str) -> tuple[str, ...] | None:
    if value is None:
        return None
    known = set(node_checks(kind))
    if not isinstance(value, list) or not value or not all(isinstance(c, str) for c in value):
        raise ProfileError(f"{where}: a list of check IDs")
    unknown = sorted(set(value) - known)
    if unknown:
        raise ProfileError(f"{where}: unknown check(s) {unknown}; a {kind} subject's checks are {SUITES[kind]}'s")
    return tuple(value)


def default_targets_file() -> Path:
    return fixtures_dir() / DEFAULT_TARGETS


def subject_kind(subject: str) -> str:
    return load_subject(subject).kind


def node_checks(kind: str = "device-plugin") -> list[str]:
    """Every check of a subject kind: the real kubelet runs each through the relay (harness/node/relay: dp.py
    for device plugins, dra.py for DRA drivers); one that needs a fault only the fake injects says so, not
    exercised."""
    return sorted(catalog(SUITES[kind]))


def target_checks(target: Target) -> list[str]:
    if target.checks is not None:
        return list(target.checks)
    kind = subject_kind(target.subject)
    if is_mutant(target):
        assert target.defect is not None
        kills = load_subject(target.subject).defect_kills(target.defect)
        return sorted(set(kills) & set(node_checks(kind)))
    return node_checks(kind)


def is_mutant(target: Target) -> bool:
    """A defect some check must catch (a benign behaviour kills nothing)."""
    if target.defect is None:
        return False
    return bool(load_subject(target.subject).defect_kills(target.defect))


def check_release(release: str) -> dict[str, str]:
    """--kubelet-version for each node: the real node builds the release asked for, the fake runs its model
    of that release's minor; a ProfileError (or ValueError) when either cannot."""
    check_kubelet_version(release, "real")
    try:
        check_kubelet_version(minor_of(release), "fake")
    except ValueError:
        raise ProfileError(f"--kubelet-version {release}: the fake kubelet has no model of {minor_of(release)} "
                           f"to compare with (it models {', '.join(KUBELET_VERSIONS)})") from None
    return {"real": release, "fake": minor_of(release)}


def build_runs(target: Target, args: argparse.Namespace, out: Path) -> dict[str, RunConfig]:
    """The target's run on each kubelet: the same checks, profile, seed and bound; only the node differs.

    Mutants run under --mutant-bound (as the kill matrix does), so that catching a plugin that never
    reacts costs seconds; the reference and benign behaviours under the kubelet's own bounds."""
    bound = args.mutant_bound if is_mutant(target) else None
    versions = check_release(getattr(args, "kubelet_version", "default"))  # benchmarks' args have none
    return {node: RunConfig.build(subject=target.subject, defect=target.defect, profile=args.profile,
                                  seed=args.seed, checks=target_checks(target), out=str(out / target.slug / node),
                                  node=node, reaction_bound=bound, kubelet_version=versions[node])
            for node in NODES}


def compare(target: Target, reports: dict[str, SubjectReport], known: list[Known]) -> list[Row]:
    by_node = {node: {c.id: c for c in r.checks} for node, r in reports.items()}
    rows = []
    for check_id in target_checks(target):
        fake, real = by_node["fake"].get(check_id), by_node["real"].get(check_id)
        row = Row(target, check_id, fake.verdict if fake else absent(reports["fake"]),
                  real.verdict if real else absent(reports["real"]),
                  dict(fake.measured) if fake else {}, dict(real.measured) if real else {})
        row.known = next((k for k in known if k.target == target and k.check == check_id
                          and (k.fake, k.real) == (row.fake, row.real)), None)
        if row.fake != row.real:
            row.detail = ((real.detail if real and real.detail else "") or (fake.detail if fake else ""))[:400]
        rows.append(row)
    return rows


def absent(report: SubjectReport) -> str:
    """A check without a result on one side: interrupted before its verdict, or missing."""
    return report.no_result() if report.interrupted else "missing"


def stale(known: list[Known], rows: list[Row]) -> list[Known]:
    """Known gaps whose target ran and whose verdicts no longer differ that way: the list should shrink."""
    ran = {(r.target, r.check): r for r in rows}
    return [k for k in known if (k.target, k.check) in ran and ran[(k.target, k.check)].known is None]


def _measured(m: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:.2f}s" for k, v in sorted(m.items())) or "-"


def markdown(table: Table) -> str:
    lines = ["# fakelet fidelity: the fake kubelet beside the real one", "",
             *([f"**{INTERRUPTED}**: stopped by a signal; a check without a verdict on either side says so", ""]
               if table.interrupted else []),
             f"Wall time of the same checks, both kubelets side by side: fake {table.wall_s['fake']:.1f}s, "
             f"real {table.wall_s['real']:.1f}s"
             + (f" (the fake is {table.wall_s['real'] / table.wall_s['fake']:.1f}x faster)"
                if table.wall_s["fake"] > 0 and not table.interrupted else ""), "",
             "| target | check | fake | real | fake measured | real measured | note |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in table.rows:
        note = "GAP: " + r.detail.replace("|", "/").replace("\n", " ")[:200] if r.gap else \
            (f"known: {r.known.why}" if r.known else "")
        lines.append(f"| {r.target.name} | {r.check} | {r.fake} | {r.real} | {_measured(r.fake_measured)} | "
                     f"{_measured(r.real_measured)} | {note} |")
    gaps = table.gaps()
    lines += ["", f"**{len(gaps)} unexplained difference(s)**" if gaps else "**no unexplained difference**"]
    if table.stale_known:
        lines += ["", "Listed as known but now agreeing (remove from fixtures/fidelity.yaml): "
                  + ", ".join(f"{k.target.name} {k.check}" for k in table.stale_known)]
    return "\n".join(lines) + "\n"


class Stopped(KeyboardInterrupt):
    """A stop signal while a target ran: what each side reported before it stopped (a side may have none)."""

    def __init__(self, partial: dict[str, SubjectReport]) -> None:
        super().__init__()
        self.partial = partial


def run_both(args: argparse.Namespace, runs: dict[str, RunConfig], out: Path, run_one: Any,
             wall_s: dict[str, float]) -> dict[str, SubjectReport]:
    """One target on both kubelets at once (most of either run is waiting); each side's wall time added up.
    A stop signal (in either side's run_one, or here) is `Stopped` once both sides have stopped."""
    reports: dict[str, SubjectReport] = {}
    errors: list[BaseException] = []

    finished = {node: threading.Event() for node in NODES}

    def one(node: str) -> None:
        started = time.monotonic()
        try:
            reports[node] = run_one(args, runs[node], out / node)
        except BaseException as err:  # re-raised below, in the caller's thread
            errors.append(err)
            if getattr(err, "partial", None) is not None:  # commands.Interrupted: what the side got to report
                reports[node] = err.partial  # type: ignore[attr-defined]
        finally:
            wall_s[node] += time.monotonic() - started
            finished[node].set()

    stopped = False
    if getattr(args, "serial", False):  # for timing each side alone (benchmarks/p6_fake_vs_real.py)
        for node in NODES:
            one(node)
            if errors:
                break
    else:
        threads = [threading.Thread(target=one, args=(node,), name=f"fidelity-{node}") for node in NODES]
        try:
            for t in threads:
                t.start()
        except KeyboardInterrupt:
            stopped = True
        # Waited on through events, not join(): a KeyboardInterrupt inside Thread.join() marks a running thread
        # stopped (CPython before 3.13), and the interpreter's exit then no longer waits for its teardown.
        for node, t in zip(NODES, threads, strict=True):
            while t.ident is not None and not finished[node].is_set():
                try:
                    finished[node].wait()
                except KeyboardInterrupt:
                    stopped = True  # each side's run_one sees the stop and stops its own check run
    if stopped or any(isinstance(e, KeyboardInterrupt) for e in errors):
        raise Stopped(reports)
    if errors:
        raise errors[0]
    return reports


def run(args: argparse.Namespace, targets: list[Target], known: list[Known], out: Path,
        run_one: Any, shared_plane: Any, say: Any = print, stop: Any = None) -> Table:
    """Run every target on both kubelets (run_one and shared_plane come from the CLI: one code path). `stop`
    (harness/run/stopping.StopSignals): a stop signal at any moment ends the run with the table of what ran,
    every other row interrupted before its verdict."""
    shielded = stop.shielded if stop is not None else contextlib.nullcontext
    table = Table()
    plans = [(t, build_runs(t, args, out)) for t in targets]
    plane = None
    partial: dict[str, SubjectReport] = {}
    try:
        if stop is not None:
            stop.raise_if_requested()  # one that came while fakelet imported or checked its flags
        plane = shared_plane([r for _, runs in plans for r in runs.values()])
        for target, runs in plans:
            reports = run_both(args, runs, out / target.slug, run_one, table.wall_s)
            rows = compare(target, reports, known)
            table.rows += rows
            for r in rows:
                mark = "GAP " if r.gap else ("known " if r.known else "")
                say(f"{target.name:40} {r.check:11} fake {r.fake:13} real {r.real:13} {mark}".rstrip())
    except KeyboardInterrupt as err:
        if stop is None:
            raise  # a caller without the stop signals' state (benchmarks) handles it
        partial = getattr(err, "partial", {})
    finally:
        with shielded():
            if plane is not None:
                plane.stop()
    with shielded():
        if stop is not None and stop.requested:
            interrupted_rows(table, plans, partial, known)
        write_table(table, known, out)
    if stop is not None and stop.requested and not table.interrupted:
        with shielded():  # the stop came while the table was written: say so in it
            table.interrupted = True
            write_table(table, known, out)
    return table


def interrupted_rows(table: Table, plans: list[tuple[Target, dict[str, RunConfig]]],
                     partial: dict[str, SubjectReport], known: list[Known]) -> None:
    """The rows of the targets the stop left unfinished: what each side reported, the rest without a verdict."""

    table.interrupted = True
    ran = {r.target for r in table.rows}
    for target, runs in plans:
        if target in ran:
            continue
        sides = {node: partial.get(node) or nothing_ran(runs[node]) for node in NODES}
        for report in sides.values():
            report.interrupted = True
        table.rows += compare(target, sides, known)
        partial = {}  # only the target that was running has partial reports


def write_table(table: Table, known: list[Known], out: Path) -> None:
    table.stale_known = [] if table.interrupted else stale(known, table.rows)
    out.mkdir(parents=True, exist_ok=True)
    (out / "fidelity.json").write_text(json.dumps(table.to_dict(), indent=2) + "\n")
    (out / "fidelity.md").write_text(markdown(table))
