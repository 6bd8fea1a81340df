"""How much of one timeline event, and of one timeline, is written to a run's artifacts.

The checks judge from the events in memory, which stay whole (a 100,000-device ListAndWatch list is what
DP-LAW-01 and DP-HLT-03 read). Only the written copy is bounded, so that what a plugin sends (a huge resource
name, a 10 MB environment value in an Allocate answer, a flood of calls) cannot make timeline.json hundreds of MB.
"""

from __future__ import annotations

import itertools
import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

MAX_STRING_CHARS = 4096  # a string value or key past this is cut, saying how much
MAX_ITEMS = 1000  # items of a list, keys of a dict: the rest are summarized
MAX_EVENT_BYTES = 1024 * 1024  # one written event; past it, its largest fields are left out
TIMELINE_CAP_BYTES = 16 * 1024 * 1024  # one timeline.json; past it, events in the middle are left out
TAIL_SHARE = 4  # of a timeline over its cap, this fraction of it keeps the newest events (how the check ended)
CUT_KIND = "timeline.cut"  # the event that stands where events were left out
MARKER_ROOM = 1024  # bytes of the cap kept for that event


@dataclass
class Cut:
    """What a dump left out, for the check's note."""

    strings: int = 0  # string values (or keys) over MAX_STRING_CHARS
    lists: int = 0  # lists or dicts over MAX_ITEMS
    trimmed: int = 0  # events over MAX_EVENT_BYTES even so, whose largest fields were left out
    dropped: Counter[str] = field(default_factory=Counter)  # events left out, by kind
    not_written: int = 0  # bytes, about

    def __bool__(self) -> bool:
        return bool(self.strings or self.lists or self.trimmed or self.dropped)

    def describe(self) -> str:
        parts = []
        if self.strings:
            parts.append(f"{_n(self.strings, 'value')} over {MAX_STRING_CHARS:,} characters")
        if self.lists:
            parts.append(f"{_n(self.lists, 'list')} over {MAX_ITEMS:,} items")
        if self.trimmed:
            parts.append(f"{_n(self.trimmed, 'event')} over {MAX_EVENT_BYTES // 1024:,} KiB with fields left out")
        if self.dropped:
            kinds = ", ".join(f"{k} x{n}" for k, n in self.dropped.most_common(3))
            parts.append(f"{sum(self.dropped.values()):,} events left out ({kinds})")
        return f"{', '.join(parts)}; {megabytes(self.not_written)} not written"


def _n(count: int, noun: str) -> str:
    return f"{count:,} {noun}{'s' if count != 1 else ''}"


def megabytes(size: int) -> str:
    return f"{size / 1e6:.1f} MB"


def bound(value: Any, cut: Cut) -> Any:
    """`value` with long strings cut and long lists and dicts summarized; `cut` counts what was. What needs no
    cut is returned as it is, not copied: a dump of a 100,000-device list stays streamed (tests/test_interrupts.py)."""
    if isinstance(value, str):
        return _cut_string(value, cut)
    if isinstance(value, dict):
        return _bound_dict(value, cut)
    if isinstance(value, list | tuple):
        return _bound_list(value, cut)
    if value is None or isinstance(value, bool | int | float):
        return value
    return _cut_string(str(value), cut)  # as json.dumps(default=str) would write it, bounded


def _bound_list(value: list[Any] | tuple[Any, ...], cut: Cut) -> list[Any] | tuple[Any, ...]:
    out: list[Any] | None = None
    for n, item in enumerate(itertools.islice(value, MAX_ITEMS)):
        kept = bound(item, cut)
        if kept is not item and out is None:
            out = list(value[:n])
        if out is not None:
            out.append(kept)
    if len(value) > MAX_ITEMS:
        cut.lists += 1
        cut.not_written += _estimate(value[MAX_ITEMS - 1], len(value) - MAX_ITEMS)
        out = list(value[:MAX_ITEMS]) if out is None else out
        out.append(f"… ({len(value) - MAX_ITEMS:,} more items cut)")
    return value if out is None else out


def _bound_dict(value: dict[Any, Any], cut: Cut) -> dict[Any, Any]:
    out: dict[Any, Any] | None = None
    for n, (key, item) in enumerate(itertools.islice(value.items(), MAX_ITEMS)):
        kept_key = key if key is None or isinstance(key, int | float) else _cut_string(str(key), cut)
        kept = bound(item, cut)
        if (kept is not item or kept_key is not key) and out is None:
            out = dict(itertools.islice(value.items(), n))
        if out is not None:
            out[kept_key] = kept
    if len(value) > MAX_ITEMS:
        cut.lists += 1
        last = next(itertools.islice(value.values(), MAX_ITEMS - 1, None))
        cut.not_written += _estimate(last, len(value) - MAX_ITEMS)
        out = dict(itertools.islice(value.items(), MAX_ITEMS)) if out is None else out
        out["…"] = f"{len(value) - MAX_ITEMS:,} more keys cut"
    return value if out is None else out


def _cut_string(text: str, cut: Cut) -> str:
    if len(text) <= MAX_STRING_CHARS:
        return text
    cut.strings += 1
    cut.not_written += len(text) - MAX_STRING_CHARS
    return f"{text[:MAX_STRING_CHARS]}… ({len(text) - MAX_STRING_CHARS} bytes cut)"


def _estimate(sample: Any, count: int) -> int:
    """About how many bytes `count` items like `sample` take, without writing them all."""
    return len(json.dumps(bound(sample, Cut()), default=str)) * count


def event_line(record: dict[str, Any], cut: Cut) -> str:
    """One event as the line timeline.json holds, within MAX_EVENT_BYTES."""
    record = {**record, "data": bound(record["data"], cut)}
    line = json.dumps(record, default=str)
    if len(line) <= MAX_EVENT_BYTES:
        return line
    # Bounded values can still add up (1,000 items of 4 KiB each): the small fields (method, outcome) stay.
    cut.trimmed += 1
    data, room = {}, MAX_EVENT_BYTES // 2
    for key, value in record["data"].items():
        size = len(json.dumps(value, default=str))
        if size <= MAX_STRING_CHARS and size <= room:
            data[key], room = value, room - size
        else:
            data[key] = f"… ({size} bytes cut: the event is over its bound)"
            cut.not_written += size
    return json.dumps({**record, "data": data}, default=str)
