"""harness/instruments/logtail.py: the last lines of a log, bounded in lines and bytes, whole lines only."""

from __future__ import annotations

from pathlib import Path

from harness.instruments.logtail import cut_lines, tail


def test_the_tail_keeps_whole_lines_within_both_bounds(tmp_path: Path) -> None:
    log = tmp_path / "subject.log"
    log.write_text("".join(f"line {n:03d}\n" for n in range(100)))  # 9 bytes a line
    assert tail(log, 3, 4096) == "line 097\nline 098\nline 099"
    assert tail(log, 50, 20) == "line 098\nline 099"  # the line the byte bound cuts is left out
    assert tail(tmp_path / "none.log", 3, 4096) == ""


def test_cut_lines_keeps_the_newest_that_fit() -> None:
    assert cut_lines("a\nbb\nccc", 7) == ["bb", "ccc"]
    assert cut_lines("a\nbb\nccc", 2) == []
