"""`fakelet run --shard K/N` and `fakelet merge`: a CI job matrix as the distributed engine.

A run's work is its (subject, check) pairs. `--shard K/N` keeps every N-th pair of the sorted
list, starting at the K-th: sorted round-robin, so the split depends only on the pairs (never on
PYTHONHASHSEED, the machine or the order of flags) and the shards differ by at most one pair.
Each shard writes `shard.json` beside its reports: its place (K/N), every pair of the whole run
and its own, so that `fakelet merge` can tell shards of one run from shards of others, and say
which shard is missing or given twice.

The merge itself only reads reports (reports/merge.py); this module knows runs and catalogs.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the split itself needs none of it: `Shard.take` imports light, for a job's own scripts
    from harness.config.runconfig import RunConfig

SHARD_FILE = "shard.json"
SHARD_FORMAT = 1
MAX_SHARDS = 1000  # a CI matrix wider than this is a typo, not a plan
SHARD_RE = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")

Pair = tuple[str, str]  # (subject, check ID)


class ShardError(ValueError):
    """Bad --shard input; str(err) is one line."""


@dataclass(frozen=True)
class Shard:
    index: int  # 1-based, as CI systems number their jobs (GitLab's CI_NODE_INDEX)
    count: int

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    def take(self, pairs: list[Pair]) -> list[Pair]:
        """This shard's pairs: the sorted list's every `count`-th, from the `index`-th."""
        return sorted(set(pairs))[self.index - 1::self.count]


def parse_shard(text: str) -> Shard:
    match = SHARD_RE.match(text or "")
    if match is None:
        raise ShardError(f"--shard {text!r}: give K/N, the K-th of N shards (e.g. 2/3)")
    index, count = int(match[1]), int(match[2])
    if not 1 <= count <= MAX_SHARDS:
        raise ShardError(f"--shard {text}: N must be between 1 and {MAX_SHARDS}")
    if not 1 <= index <= count:
        raise ShardError(f"--shard {text}: K must be between 1 and N ({count})")
    return Shard(index, count)


def selected_checks(run: RunConfig) -> list[str]:
    from harness.spec.checks import catalog

    return sorted(run.checks or catalog(run.suite_package))


def pairs_of(runs: list[RunConfig]) -> list[Pair]:
    names = [r.spec.name for r in runs]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ShardError(f"--shard: subject {twice[0]} is given twice; each subject once")
    return sorted((r.spec.name, cid) for r in runs for cid in selected_checks(r))


def split(runs: list[RunConfig], shard: Shard) -> tuple[list[RunConfig], dict[str, Any]]:
    """The runs of this shard (each with only its own checks; a subject without any is left out),
    and the shard's record (shard.json)."""
    every = pairs_of(runs)
    mine = shard.take(every)
    kept = []
    for run in runs:
        checks = [cid for subject, cid in mine if subject == run.spec.name]
        if checks:
            kept.append(dataclasses.replace(run, checks=checks))
    return kept, record_of(shard, every, mine)


def record_of(shard: Shard, every: list[Pair], mine: list[Pair], **more: Any) -> dict[str, Any]:
    """The shard's record (shard.json): its place, the run's pairs, its own, and the check catalog's digest."""
    from harness.run.provenance import catalog_facts

    return {"format": SHARD_FORMAT, "shard": str(shard), "index": shard.index, "count": shard.count,
            "subjects": sorted({s for s, _ in every}), "pairs": [list(p) for p in every],
            "mine": [list(p) for p in mine], "catalog_sha256": str(catalog_facts()["sha256"]), **more}


def write_record(record: dict[str, Any], directory: Path) -> None:
    (directory / SHARD_FILE).write_text(json.dumps(record, indent=2) + "\n")
