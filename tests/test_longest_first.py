"""The suite's own xdist order (tests/longest_first.py): every worker's share starts with its longest tests."""

from __future__ import annotations

import json
from pathlib import Path

import longest_first


def test_each_share_starts_with_the_longest_and_the_shares_are_contiguous() -> None:
    items = list("abcdefg")
    seconds = [1, 7, 3, 9, 2, 8, 5]
    # ranks d9 f8 b7 g5 c3 e2 a1, dealt round-robin into three shares
    assert longest_first.interleave(items, seconds, 3) == ["d", "g", "a", "f", "c", "b", "e"]
    assert longest_first.interleave(items, seconds, 1) == ["d", "f", "b", "g", "c", "e", "a"]


def test_ties_keep_collection_order_so_every_worker_collects_the_same() -> None:
    items = [f"t{i}" for i in range(10)]
    assert longest_first.interleave(items, [1.0] * 10, 1) == items
    assert longest_first.interleave(items, [1.0] * 10, 3) == longest_first.interleave(list(items), [1.0] * 10, 3)


def test_an_unmeasured_test_counts_the_default_and_a_broken_file_counts_nothing(tmp_path: Path) -> None:
    assert longest_first.expected("tests/x.py::t", {}) == longest_first.DEFAULT_S
    bad = tmp_path / "d.json"
    bad.write_text("{not json")
    assert longest_first.load(bad) == {}


def test_the_recorder_sums_a_tests_phases_and_keeps_what_it_did_not_run(tmp_path: Path) -> None:
    path = tmp_path / "durations.json"
    path.write_text(json.dumps({"tests/a.py::old": 30.0, "tests/a.py::t": 2.0}))
    rec = longest_first.Recorder()
    for phase in (0.5, 40.0, 0.25):  # setup, call, teardown
        rec.add("tests/a.py::t", phase)
    rec.add("tests/a.py::quick", 0.01)
    rec.write(path)
    assert json.loads(path.read_text()) == {"tests/a.py::t": 40.8, "tests/a.py::old": 30.0}


def test_the_committed_durations_name_tests_that_exist() -> None:
    known = longest_first.load()
    assert known, "tests/durations.json is missing or empty"
    root = Path(__file__).resolve().parents[1]
    for nodeid in known:
        assert (root / nodeid.split("::")[0]).is_file(), f"{nodeid}: no such test file (refresh tests/durations.json)"
