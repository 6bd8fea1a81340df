"""A run's artifacts dir (`OUT/artifacts/`): what each check writes there, and how much of it.

Each file a check keeps is bounded (a timeline at bounds.TIMELINE_CAP_BYTES, a log at LOG_COPY_BYTES), and the
run's artifacts together at RUN_ARTIFACTS_BYTES: past it, each file of a later check keeps at most
FILE_FLOOR_BYTES, its first and last part, so that every check still shows how it began and ended. Checks write
one at a time (xdist workers too: a lock on the dir), so the budget is measured, not guessed.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from harness.instruments.bounds import TIMELINE_CAP_BYTES, megabytes
from harness.instruments.timeline import Timeline

RUN_ARTIFACTS_BYTES = 64 * 1024 * 1024
FILE_FLOOR_BYTES = 256 * 1024
LOG_COPY_BYTES = 10 * 1024 * 1024  # a copied log: the plugin's own log file is capped near it (launch/process.py)
TAIL_SHARE = 4  # of a log cut here, this fraction of what is kept is its end


class Allowance:
    """What is left of the run's budget while one check writes."""

    def __init__(self, left: int) -> None:
        self.left = left

    def cap(self, wanted: int) -> int:
        """The most one file may take: its own bound, what is left of the run's, and never less than the floor."""
        return min(wanted, max(self.left, FILE_FLOOR_BYTES))

    def spent(self, path: Path) -> None:
        with contextlib.suppress(OSError):
            self.left -= path.stat().st_size


@contextlib.contextmanager
def writing(root: Path) -> Iterator[Allowance]:
    """The run's artifacts dir `root`, held for one check's writes, with what is left of its budget."""
    root.mkdir(parents=True, exist_ok=True)
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with contextlib.suppress(OSError):  # a file system without locks: the budget may then be overshot by a check
            fcntl.flock(fd, fcntl.LOCK_EX)  # released when fd closes, also by a worker that dies
        yield Allowance(RUN_ARTIFACTS_BYTES - used_bytes(root))
    finally:
        os.close(fd)


def used_bytes(root: Path) -> int:
    """Bytes of the files under `root`, each counted once (a hard link is not a second copy)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for folder, _, files in os.walk(root):
        for name in files:
            with contextlib.suppress(OSError):
                st = os.lstat(os.path.join(folder, name))
                if (st.st_dev, st.st_ino) not in seen:
                    seen.add((st.st_dev, st.st_ino))
                    total += st.st_size
    return total


def copy_bounded(source: Path, target: Path, cap: int) -> int:
    """Copy `source` whole if it fits in `cap` bytes, else its beginning and its end with a line saying how
    much was cut between them; the bytes not copied."""
    size = source.stat().st_size
    if size <= cap:
        shutil.copyfile(source, target)
        return 0
    tail = cap // TAIL_SHARE
    head = max(cap - tail - 256, 0)  # room for the line that says so
    cut = size - head - tail
    with source.open("rb") as src, target.open("wb") as dst:
        _copy_n(src, dst, head)
        dst.write(f"\n[fakelet: {cut} bytes cut here: the artifacts bound is {cap} bytes for this file]\n".encode())
        src.seek(size - tail)
        _copy_n(src, dst, tail)
    return cut


def _copy_n(src: BinaryIO, dst: BinaryIO, n: int) -> None:
    while n > 0:
        block = src.read(min(n, 1 << 20))
        if not block:
            return
        dst.write(block)
        n -= len(block)


def keep_check(directory: Path, root: Path, timeline: Timeline, logs: dict[str, Path]) -> list[str]:
    """Write one check's timeline and `logs` (name in `directory` -> source) under `directory`, within the
    bounds, `root` being the run's artifacts dir; what was cut, one line a file ("timeline.json cut: ...")."""
    directory.mkdir(parents=True, exist_ok=True)
    said = []
    with writing(root) as allowance:
        path = directory / "timeline.json"
        cut = timeline.dump(str(path), allowance.cap(TIMELINE_CAP_BYTES))
        allowance.spent(path)
        if cut:
            said.append(f"timeline.json cut: {cut.describe()}")
        for name, source in logs.items():
            if not source.is_file():
                continue
            left_out = copy_bounded(source, directory / name, allowance.cap(LOG_COPY_BYTES))
            allowance.spent(directory / name)
            if left_out:
                said.append(f"{name} cut: {megabytes(left_out)} in its middle not written")
    return said
