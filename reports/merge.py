"""One report from the shards of one run (`fakelet merge DIR... -o OUT`).

Each shard directory holds its reports and `shard.json` (harness/run/shards.py): its place K/N,
every (subject, check) pair of the whole run, and its own. Shards merge only when they are the
N shards of one run: the same pairs, the same check catalog, every K from 1 to N exactly once,
and each shard's reports holding exactly its own pairs. Anything else is a MergeError naming
the shard directory and what is wrong, never a report that looks whole and is not.

The merged report of a subject is its checks from every shard, in the catalog's order; its
provenance is the first shard's, with every shard's own kept under `shards`.

Each shard's files beside its reports are kept (`keep_artifacts`): the entries of its `artifacts/`
(a check's timeline and logs, under the check's ID) and `repro/` (a failed check's scenario) go to the
same place in the merged directory, where the HTML report and the summary look for them; an entry
another shard already holds (a suite's shared one) and a repeated run's `runs/` go under
`artifacts/shard-K-of-N/`. Each shard's `provenance.shards` entry maps what was copied where, and the
`merged` fact says it plainly, or where the files stayed when they could not be copied.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

from reports.model import SubjectReport, merge_facts
from reports.provenance import host_path

SHARD_FILE = "shard.json"  # harness/run/shards.py SHARD_FILE
SHARD_FORMAT = 1
ARTIFACTS = "artifacts"
# Trees whose entries are merged by name (a check's own directory or file never collides across shards) ...
MERGED_TREES = (ARTIFACTS, "repro")  # harness/scenarios/repro.py REPRO_DIR
# ... and trees kept whole per shard (a repeated run's runs/1, runs/2 are in every shard).
PER_SHARD_TREES = ("runs",)
MERGED_FACT = "merged"


class MergeError(ValueError):
    """Shards that cannot be merged; str(err) is one line naming the shard."""


class ShardDir:
    def __init__(self, path: Path, record: dict[str, Any], reports: list[SubjectReport]) -> None:
        self.path, self.record, self.reports = path, record, reports

    @property
    def label(self) -> str:
        return f"{self.path} (shard {self.record['shard']})"

    def pairs(self) -> set[tuple[str, str]]:
        return {(p[0], p[1]) for p in self.record["pairs"]}

    def mine(self) -> set[tuple[str, str]]:
        return {(p[0], p[1]) for p in self.record["mine"]}


def load_shard(path: Path, load_dir: Any) -> ShardDir:
    """A shard directory: its shard.json and its reports (`load_dir` reads a report directory)."""
    record_path = path / SHARD_FILE
    if not path.is_dir():
        raise MergeError(f"{path}: no such shard directory")
    try:
        record = json.loads(record_path.read_text())
    except FileNotFoundError:
        raise MergeError(f"{path}: no {SHARD_FILE} (not written by fakelet run --shard K/N)") from None
    except (OSError, ValueError) as err:
        raise MergeError(f"{record_path}: unreadable ({err})") from None
    if not isinstance(record, dict) or record.get("format") != SHARD_FORMAT or \
            not all(k in record for k in ("shard", "index", "count", "pairs", "mine", "catalog_sha256")):
        raise MergeError(f"{record_path}: not a fakelet shard record (format {SHARD_FORMAT})")
    reports = load_dir(path) if record["mine"] else []
    return ShardDir(path, record, reports)


def _catalogs(shard: ShardDir) -> set[str]:
    found = {str(r.provenance.get("catalog", {}).get("sha256", "")) for r in shard.reports} - {""}
    return found | {str(shard.record["catalog_sha256"])}


def check_shards(shards: list[ShardDir]) -> None:
    """The N shards of one run, each once: raise MergeError otherwise."""
    if not shards:
        raise MergeError("no shard directories given")
    first = shards[0]
    for shard in shards[1:]:
        if shard.record["count"] != first.record["count"]:
            raise MergeError(f"{shard.label} and {first.label}: split into different numbers of shards")
        if shard.record["subjects"] != first.record["subjects"]:
            raise MergeError(f"{shard.label} and {first.label} come from different subjects: "
                             f"{', '.join(shard.record['subjects'])} vs {', '.join(first.record['subjects'])}")
        if shard.pairs() != first.pairs():
            only = sorted(shard.pairs() ^ first.pairs())[:3]
            raise MergeError(f"{shard.label} and {first.label} come from different runs (their checks differ, "
                             f"e.g. {', '.join('/'.join(p) for p in only)})")
    catalogs: dict[str, str] = {}
    for shard in shards:
        for digest in _catalogs(shard):
            catalogs.setdefault(digest, shard.label)
    if len(catalogs) > 1:
        (a, where_a), (b, where_b) = sorted(catalogs.items())[:2]
        raise MergeError(f"{where_a} and {where_b} come from different check catalogs ({a[:12]} vs {b[:12]})")
    for shard in shards:
        foreign = sorted(shard.mine() - shard.pairs())
        if foreign:
            raise MergeError(f"{shard.label} holds {', '.join('/'.join(p) for p in foreign[:3])} that is not its own "
                             "run's (subject, check) pair")
    seen: dict[int, ShardDir] = {}
    for shard in shards:
        index = shard.record["index"]
        if index in seen:
            raise MergeError(f"shards overlap: {seen[index].path} and {shard.path} are both shard "
                             f"{shard.record['shard']}")
        seen[index] = shard
    count = first.record["count"]
    missing = [f"{k}/{count}" for k in range(1, count + 1) if k not in seen]
    if missing:
        lost = sorted(first.pairs() - set().union(*(s.mine() for s in shards)))
        raise MergeError(f"shards missing: {', '.join(missing)} ({len(lost)} (subject, check) pair(s) without a "
                         f"verdict, e.g. {', '.join('/'.join(p) for p in lost[:3])})")
    _check_results(shards)


def _check_results(shards: list[ShardDir]) -> None:
    """Each shard's reports hold exactly its own pairs (a verdict or a missing entry each), none twice."""
    owner: dict[tuple[str, str], ShardDir] = {}
    for shard in shards:
        held: set[tuple[str, str]] = set()
        for r in shard.reports:
            for cid in [c.id for c in r.checks] + list(r.missing):
                pair = (r.subject, cid)
                if pair in owner and owner[pair] is not shard:
                    raise MergeError(f"shards overlap: {owner[pair].path} and {shard.path} both hold "
                                     f"{r.subject}/{cid}")
                owner[pair] = shard
                held.add(pair)
        if held != shard.mine():
            extra, lost = sorted(held - shard.mine()), sorted(shard.mine() - held)
            what = (f"holds {', '.join('/'.join(p) for p in extra[:3])} that is not its own" if extra
                    else f"has no result for {', '.join('/'.join(p) for p in lost[:3])}")
            raise MergeError(f"{shard.label} {what}")


def _shard_note(shard: ShardDir, report: SubjectReport) -> dict[str, Any]:
    return {"shard": shard.record["shard"], "dir": host_path(shard.path, [("<cwd>", Path.cwd())]),
            "checks": sorted(c.id for c in report.checks), "provenance": report.provenance}


def merge(shards: list[ShardDir]) -> list[SubjectReport]:
    """Checked shards as one report per subject, in the run's subject order."""
    check_shards(shards)
    shards = sorted(shards, key=lambda s: s.record["index"])
    by_subject: dict[str, list[tuple[ShardDir, SubjectReport]]] = {}
    for shard in shards:
        for r in shard.reports:
            by_subject.setdefault(r.subject, []).append((shard, r))
    merged = []
    for subject in shards[0].record["subjects"]:
        parts = by_subject.get(subject, [])
        if not parts:
            continue
        merged.append(_merge_subject(parts))
    return merged


def _merge_subject(parts: list[tuple[ShardDir, SubjectReport]]) -> SubjectReport:
    base = parts[0][1]
    checks = sorted((c for _, r in parts for c in r.checks), key=lambda c: c.id)
    facts: dict[str, Any] = {}
    for _, r in parts:
        merge_facts(facts, r.facts)
    api_versions: dict[str, str] = {}
    for _, r in parts:
        for k, v in r.api_versions.items():
            known = api_versions.get(k)
            api_versions[k] = v if known in (None, v) else ", ".join(sorted(set(known.split(", ")) | {v}))
    provenance = dict(base.provenance)
    provenance["shards"] = [_shard_note(shard, r) for shard, r in parts]
    return replace(
        base, checks=checks, missing=sorted({m for _, r in parts for m in r.missing}),
        interrupted=any(r.interrupted for _, r in parts), facts=facts, api_versions=api_versions,
        findings=list(dict.fromkeys(f for _, r in parts for f in r.findings)),
        cleanup=list(dict.fromkeys(c for _, r in parts for c in r.cleanup)),
        fault_plan=list(dict.fromkeys(f for _, r in parts for f in r.fault_plan)),
        started_at=min((r.started_at for _, r in parts if r.started_at), default=""),
        duration_s=round(sum(r.duration_s for _, r in parts), 3), provenance=provenance)


def per_shard(shard: ShardDir) -> str:
    """The merged directory's place for what a shard holds that others hold too: artifacts/shard-K-of-N."""
    return f"{ARTIFACTS}/shard-{shard.record['index']}-of-{shard.record['count']}"


def subject_dir(root: Path, reports: list[SubjectReport], subject: str) -> Path:
    """Where a subject's report lives in a directory `fakelet run` or `merge` wrote: the top for one subject."""
    return root if len(reports) == 1 else root / subject


def _shard_subject_dir(shard: ShardDir, subject: str) -> Path:
    nested = shard.path / subject
    return nested if (nested / "report.json").is_file() else shard.path


def _copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    if src.is_dir() and not src.is_symlink():
        shutil.copytree(src, dst, symlinks=True)  # a link is kept as one: it may point anywhere on the machine
    else:
        shutil.copy2(src, dst, follow_symlinks=False)


def _placements(shard: ShardDir, src: Path, dst: Path) -> list[tuple[str, str]]:
    """(path in the shard's subject directory, path in the merged one) for each entry to copy."""
    out = []
    for tree in MERGED_TREES:
        if (src / tree).is_dir():
            for entry in sorted(p.name for p in (src / tree).iterdir()):
                taken = (dst / tree / entry).exists() or (dst / tree / entry).is_symlink()
                out.append((f"{tree}/{entry}", f"{per_shard(shard)}/{tree}/{entry}" if taken else f"{tree}/{entry}"))
    out += [(tree, f"{per_shard(shard)}/{tree}") for tree in PER_SHARD_TREES if (src / tree).is_dir()]
    return out


def keep_artifacts(shards: list[ShardDir], merged: list[SubjectReport], root: Path) -> None:
    """Copy each shard's artifacts into the merged directory `root` (before its reports are written there), and
    say in each merged report what went where: its shard notes' `artifacts` (or `artifacts_not_copied`) and the
    `merged` fact."""
    by_subject = {r.subject: r for r in merged}
    for shard in sorted(shards, key=lambda s: s.record["index"]):
        for part in shard.reports:
            report = by_subject.get(part.subject)
            if report is None:
                continue
            src, dst = _shard_subject_dir(shard, part.subject), subject_dir(root, merged, part.subject)
            note = next((n for n in report.provenance.get("shards", []) if n.get("shard") == shard.record["shard"]),
                        None)
            copied: dict[str, str] = {}
            try:
                for source, target in _placements(shard, src, dst):
                    _copy(src / source, dst / target)
                    copied[source] = target
            except OSError as err:
                if note is not None:
                    where = host_path(src / ARTIFACTS, [("<cwd>", Path.cwd())])
                    note["artifacts_not_copied"] = f"{err.strerror or err}: they remain in {where}"
            if note is not None:
                note["artifacts"] = copied
    for report in merged:
        report.facts[MERGED_FACT] = merged_fact(report)


def merged_fact(report: SubjectReport) -> str:
    """What a merged report says of its shards' artifacts, in one line."""
    notes = report.provenance.get("shards", [])
    copied = [t for n in notes for t in (n.get("artifacts") or {}).values()]
    apart = sorted({t.split("/")[1] for t in copied if t.startswith(f"{ARTIFACTS}/shard-")})
    said = (f"{len(notes)} shard{'s' * (len(notes) != 1)} ({', '.join(n['shard'] for n in notes)}); their artifacts "
            f"copied here ({len(copied)} entr{'ies' if len(copied) != 1 else 'y'}, each at its path in its shard)")
    if apart:
        said += f"; those more than one shard held under {', '.join(f'{ARTIFACTS}/{a}/' for a in apart)}"
    lost = [f"shard {n['shard']}: {n['artifacts_not_copied']}" for n in notes if n.get("artifacts_not_copied")]
    if lost:
        said += f"; NOT copied, {'; '.join(lost)}"
    return said


def verdicts(reports: list[SubjectReport]) -> dict[tuple[str, str], str]:
    """(subject, check) -> verdict: what `identical in verdicts` compares."""
    return {(r.subject, c.id): c.verdict for r in reports for c in r.checks}
