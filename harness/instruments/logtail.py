"""The last lines of a log file, bounded in lines and bytes, for a verdict's detail."""

from __future__ import annotations

import os
from pathlib import Path


def tail(path: Path, lines: int, max_bytes: int) -> str:
    """The last `lines` lines of `path` within its last `max_bytes` bytes ("" when it cannot be read); a line cut
    by the byte bound is left out rather than shown in part."""
    try:
        with open(path, "rb") as log:
            size = log.seek(0, os.SEEK_END)
            start = max(size - max_bytes, 0)
            log.seek(start)
            data = log.read(max_bytes)
    except OSError:
        return ""
    if start > 0:
        data = data.partition(b"\n")[2]
    return "\n".join(data.decode(errors="replace").splitlines()[-lines:])


def cut_lines(text: str, max_bytes: int) -> list[str]:
    """The last lines of `text` that fit in `max_bytes` (UTF-8), whole lines only."""
    kept: list[str] = []
    size = 0
    for line in reversed(text.splitlines()):
        size += len(line.encode()) + 1
        if size > max_bytes:
            break
        kept.append(line)
    return kept[::-1]
