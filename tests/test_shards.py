"""Shards (issue 26): `fakelet run --shard K/N` and `fakelet merge DIR... -o OUT`.

The split and the merge's refusals are tested on records and reports built here (no run); one
real case runs the reference plugin's three registration checks whole and as three shards, and
merges the shards into the same verdicts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from harness.run.shards import Shard, ShardError, parse_shard
from reports.bundle import load_dir
from reports.merge import MergeError, keep_artifacts, load_shard, merge, verdicts
from reports.model import PASS, CheckResult, SubjectReport
from reports.writers import write_all

CHECKS = ("DP-REG-02", "DP-REG-03", "DP-REG-04")  # three fast checks of the reference plugin: one per shard
RUN_TIMEOUT_S = 180
CATALOG = "ab" * 32


def fakelet(cwd: Path, *args: str, timeout: float = RUN_TIMEOUT_S, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "harness.run.cli", *args], capture_output=True, text=True,
                          env=dict(os.environ, TMPDIR=str(cwd), **env), timeout=timeout, cwd=cwd)


# -- the split ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["4/3", "0/3", "3", "a/b", "1/0", "-1/3", "2/1001", ""])
def test_a_bad_shard_spec_is_one_clear_error(text: str) -> None:
    with pytest.raises(ShardError) as err:
        parse_shard(text)
    assert "--shard" in str(err.value) and "\n" not in str(err.value)


def test_shards_partition_the_pairs_evenly() -> None:
    pairs = [(s, f"C-{n:02}") for s in ("b-subject", "a-subject") for n in range(7)]
    parts = [Shard(k, 3).take(pairs) for k in (1, 2, 3)]
    flat = [p for part in parts for p in part]
    assert sorted(flat) == sorted(pairs) and len(set(flat)) == len(pairs)
    assert max(map(len, parts)) - min(map(len, parts)) <= 1
    assert Shard(2, 3).take(list(reversed(pairs))) == parts[1]  # the order given does not matter


def test_the_split_does_not_depend_on_the_hash_seed(tmp_path: Path) -> None:
    code = ("from harness.run.shards import Shard;"
            "print(Shard(2, 3).take([(s, c) for s in ('reference-dp', 'reference-dra') for c in 'ABCDEFG']))")
    seen = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env=dict(os.environ, PYTHONHASHSEED=seed)).stdout for seed in ("0", "1", "4242")}
    assert len(seen) == 1


def test_run_refuses_a_bad_shard_before_anything_starts(tmp: Path) -> None:
    tmp_path = tmp
    got = fakelet(tmp_path, "run", "--subject", "reference-dp", "--shard", "4/3", "--out", "r")
    assert got.returncode == 2 and "K must be between 1 and N" in got.stderr
    assert len(got.stderr.strip().splitlines()) == 1 and not (tmp_path / "r").exists()


# -- the merge's refusals ------------------------------------------------------------------------------


def shard_dir(where: Path, index: int, count: int, pairs: list[tuple[str, str]], catalog: str = CATALOG,
              mine: list[tuple[str, str]] | None = None) -> Path:
    """A shard's directory as `fakelet run --shard` writes it, its verdicts all pass."""
    mine = Shard(index, count).take(pairs) if mine is None else mine
    out = where / f"s{index}-{len(list(where.iterdir()))}"
    out.mkdir()
    subjects = sorted({s for s, _ in pairs})
    reports = [SubjectReport(subject=s, profile="fast", seed=0, provenance={"catalog": {"sha256": catalog}},
                             checks=[CheckResult(c, "MUST", f"title of {c}", PASS, 0.5) for t, c in mine if t == s])
               for s in subjects if any(t == s for t, _ in mine)]
    if len(reports) == 1:
        write_all(reports[0], out)
    elif reports:
        from reports.writers import write_index
        for r in reports:
            write_all(r, out / r.subject)
        write_index(reports, out)
    (out / "shard.json").write_text(json.dumps({
        "format": 1, "shard": f"{index}/{count}", "index": index, "count": count, "subjects": subjects,
        "pairs": [list(p) for p in sorted(pairs)], "mine": [list(p) for p in mine], "catalog_sha256": catalog}))
    return out


PAIRS = [("reference-dp", c) for c in ("DP-A-01", "DP-A-02", "DP-A-03", "DP-A-04")] + [("reference-dra", "DRA-A-01")]


def load(dirs: list[Path]) -> list:
    return [load_shard(d, load_dir) for d in dirs]


def test_three_shards_merge_into_every_pair_with_each_shards_provenance(tmp_path: Path) -> None:
    merged = merge(load([shard_dir(tmp_path, k, 3, PAIRS) for k in (3, 1, 2)]))
    assert set(verdicts(merged)) == set(PAIRS)
    dp = next(r for r in merged if r.subject == "reference-dp")
    assert [c.id for c in dp.checks] == sorted(c for s, c in PAIRS if s == "reference-dp")
    assert [s["shard"] for s in dp.provenance["shards"]] == sorted(s["shard"] for s in dp.provenance["shards"])


@pytest.mark.parametrize("case, words", [
    ("overlap", "shards overlap"), ("missing", "shards missing: 3/3"), ("catalog", "different check catalogs"),
    ("subjects", "different subjects"), ("counts", "different numbers of shards"), ("checks", "different runs"),
    ("foreign-result", "not its own"), ("not-a-shard", "no shard.json")])
def test_shards_that_do_not_make_one_run_are_refused(tmp_path: Path, case: str, words: str) -> None:
    one, two = shard_dir(tmp_path, 1, 3, PAIRS), shard_dir(tmp_path, 2, 3, PAIRS)
    dirs = {
        "overlap": [one, two, shard_dir(tmp_path, 2, 3, PAIRS)],
        "missing": [one, two],
        "catalog": [one, two, shard_dir(tmp_path, 3, 3, PAIRS, catalog="cd" * 32)],
        "subjects": [one, two, shard_dir(tmp_path, 3, 3, [("other", c) for _, c in PAIRS])],
        "counts": [one, two, shard_dir(tmp_path, 3, 4, PAIRS)],
        "checks": [one, two, shard_dir(tmp_path, 3, 3, [*PAIRS[:-1], ("reference-dra", "DRA-B-01")])],
        "foreign-result": [one, two, shard_dir(tmp_path, 3, 3, PAIRS, mine=[*Shard(3, 3).take(PAIRS),
                                                                               ("reference-dp", "DP-Z-99")])],
        "not-a-shard": [one, two, tmp_path],
    }[case]
    with pytest.raises(MergeError) as err:
        merge(load(dirs))
    assert words in str(err.value) and "\n" not in str(err.value)


def test_merged_shards_keep_their_artifacts_apart_where_names_collide(tmp_path: Path) -> None:
    dirs = [shard_dir(tmp_path, k, 3, PAIRS) for k in (1, 2, 3)]
    shards = load(dirs)
    for d, shard in zip(dirs, shards, strict=True):
        for subject, cid in shard.mine():
            root = d / subject if (d / subject / "report.json").is_file() else d
            (root / "artifacts" / cid).mkdir(parents=True, exist_ok=True)
            (root / "artifacts" / cid / "timeline.json").write_text(f"[{shard.record['index']}]")
            (root / "artifacts" / "kep5970").mkdir(exist_ok=True)  # a suite's, in every shard that ran its checks
            (root / "artifacts" / "kep5970" / "log").write_text(shard.record["shard"])
    merged = merge(shards)
    out = tmp_path / "merged"
    keep_artifacts(shards, merged, out)
    dp = next(r for r in merged if r.subject == "reference-dp")
    for subject, cid in PAIRS:
        assert (out / subject / "artifacts" / cid / "timeline.json").is_file()
    placed = {n["shard"]: n["artifacts"] for n in dp.provenance["shards"]}
    first, *later = sorted(placed)
    assert placed[first]["artifacts/kep5970"] == "artifacts/kep5970"
    for shard in later:
        target = placed[shard]["artifacts/kep5970"]
        assert target.startswith("artifacts/shard-") and (out / "reference-dp" / target / "log").read_text() == shard
    assert "more than one shard held under artifacts/shard-" in dp.facts["merged"]


def test_artifacts_that_cannot_be_copied_are_said_to_stay_in_the_shard(tmp_path: Path) -> None:
    dirs = [shard_dir(tmp_path, k, 2, PAIRS[:2]) for k in (1, 2)]
    (dirs[0] / "artifacts" / "DP-A-01").mkdir(parents=True)
    shards = load(dirs)
    merged = merge(shards)
    blocker = tmp_path / "merged"
    blocker.mkdir()
    (blocker / "artifacts").write_text("a file where the merged artifacts directory goes")
    keep_artifacts(shards, merged, blocker)
    note = merged[0].provenance["shards"][0]
    assert "they remain in" in note["artifacts_not_copied"] and note["artifacts"] == {}
    assert "NOT copied, shard 1/2" in merged[0].facts["merged"]


def test_merge_says_what_is_wrong_in_one_line(tmp_path: Path) -> None:
    one = shard_dir(tmp_path, 1, 2, PAIRS)
    got = fakelet(tmp_path, "merge", str(one), "-o", "m")
    assert got.returncode == 2 and got.stderr.startswith("fakelet: error: shards missing: 2/2")
    assert len(got.stderr.strip().splitlines()) == 1 and not (tmp_path / "m").exists()


# -- a real run --------------------------------------------------------------------------------------------


def test_three_shards_of_the_reference_plugin_merge_into_the_unsharded_verdicts(tmp: Path) -> None:
    tmp_path = tmp
    checks = [a for c in CHECKS for a in ("--check", c)]
    # The whole run and its three shards side by side: each is one check that mostly waits.
    runs = [("whole", []), *((f"s{k}", ["--shard", f"{k}/3"]) for k in (1, 2, 3))]
    with ThreadPoolExecutor(len(runs)) as pool:
        done = list(pool.map(lambda r: fakelet(tmp_path, "run", "--subject", "reference-dp", *checks, "-j", "1",
                                               *r[1], "--out", r[0]), runs))
    for proc in done:
        assert proc.returncode == 0, proc.stdout + proc.stderr
    for k in (1, 2, 3):
        assert json.loads((tmp_path / f"s{k}" / "shard.json").read_text())["mine"] == [["reference-dp",
                                                                                          CHECKS[k - 1]]]
    merged = fakelet(tmp_path, "merge", "s1", "s2", "s3", "-o", "merged")
    assert merged.returncode == 0, merged.stdout + merged.stderr
    want, got = load_dir(tmp_path / "whole"), load_dir(tmp_path / "merged")
    assert verdicts(got) == verdicts(want) and len(verdicts(got)) == len(CHECKS)
    assert [s["shard"] for s in got[0].provenance["shards"]] == ["1/3", "2/3", "3/3"]
    assert got[0].provenance["catalog"] == want[0].provenance["catalog"]
    # Each shard's timelines and logs come along, where the HTML report plots them from.
    for cid in CHECKS:
        assert (tmp_path / "merged" / "artifacts" / cid / "timeline.json").is_file()
        assert (tmp_path / "merged" / "artifacts" / cid / "subject.log").is_file()
    assert [s["artifacts"] for s in got[0].provenance["shards"]] == [{f"artifacts/{c}": f"artifacts/{c}"}
                                                                     for c in CHECKS]
    assert "their artifacts copied here (3 entries" in (tmp_path / "merged" / "summary.md").read_text()
    assert "no timeline recorded" not in (tmp_path / "merged" / "report.html").read_text()  # each check's plotted


# -- fakelet matrix ----------------------------------------------------------------------------------------


def test_matrix_shards_merge_into_one_table_per_subject(tmp: Path) -> None:
    args = ["matrix", "--subject", "reference-dp", "--kubelet-version", "1.35,1.36", "--node", "fake",
            "--check", CHECKS[0], "-j", "1"]
    for k in (1, 2):
        got = fakelet(tmp, *args, "--shard", f"{k}/2", "--out", f"m{k}")
        assert got.returncode == 0, got.stdout + got.stderr
    merged = fakelet(tmp, "matrix", "--merge", "m1", "m2", "--out", "table")
    assert merged.returncode == 0, merged.stdout + merged.stderr
    table = json.loads((tmp / "table" / "matrix.json").read_text())["subjects"]["reference-dp"]
    assert table["columns"] == ["1.35 fake", "1.36 fake"]
    assert table["rows"] == {CHECKS[0]: {"1.35 fake": PASS, "1.36 fake": PASS}}
    assert "| DP-REG-02 | pass | pass |" in (tmp / "table" / "matrix.md").read_text()
    again = fakelet(tmp, "matrix", "--merge", "m1", "m1", "--out", "bad")
    assert again.returncode == 2 and "shards overlap" in again.stderr and not (tmp / "bad").exists()


@pytest.mark.parametrize("args, words", [
    (["--kubelet-version", "1.20"], "--kubelet-version 1.20"), (["--node", "fake,moon"], "--node 'moon'"),
    (["--shard", "3/2"], "K must be between 1 and N"), (["--subject", "no-such-subject"], "no-such-subject")])
def test_matrix_refuses_bad_input_in_one_line(tmp: Path, args: list[str], words: str) -> None:
    base = {"--subject": "reference-dp", "--kubelet-version": "1.36", "--node": "fake"}
    base.update(dict(zip(args[::2], args[1::2], strict=True)))
    got = fakelet(tmp, "matrix", *[x for kv in base.items() for x in kv], "--out", "m")
    assert got.returncode == 2 and words in got.stderr, got.stderr
    assert len(got.stderr.strip().splitlines()) == 1 and not (tmp / "m").exists()
