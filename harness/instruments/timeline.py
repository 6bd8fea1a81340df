"""The run's single source of truth: every observable thing, timestamped.

gRPC calls, stream messages, file events, process events and injected faults
all land here with a monotonic nanosecond timestamp. Checks never sleep: they
wait on a predicate over this log under a deadline, and a timeout says what was
awaited and what was seen instead.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from harness.instruments.bounds import CUT_KIND, MARKER_ROOM, TAIL_SHARE, TIMELINE_CAP_BYTES, Cut, event_line


@dataclass(frozen=True)
class Event:
    t_ns: int
    kind: str
    source: str
    data: dict[str, Any] = field(default_factory=dict)

    def get(self, key: str, default: Any = None) -> Any:
        return self.data.get(key, default)


Predicate = Callable[[Event], bool]


class WaitTimeout(AssertionError):
    """The subject did not do what was awaited in time: a conformance failure.

    It subclasses AssertionError so that pytest and the report treat it as a
    failed check, not as a harness error.
    """

    SHOWN = 8  # the last events a message quotes

    def __init__(self, awaiting: str, timeout_s: float, seen: list[Event], origin_ns: int,
                 waited_s: float | None = None) -> None:
        self.awaiting, self.timeout_s, self.seen = awaiting, timeout_s, seen
        lines = [describe(e, origin_ns) for e in seen[-self.SHOWN:]] or ["nothing"]
        after = f" (after {waited_s:.3f}s)" if waited_s is not None else ""
        super().__init__(
            f"expected {awaiting} within {timeout_s:g}s{after}; saw instead "
            "(times since the check started):\n  " + "\n  ".join(lines)
        )


DESCRIBE_VALUE_CHARS = 300  # one value in a verdict's "saw instead": a 100,000-device list is cut, not copied


def describe(event: Event, origin_ns: int = 0) -> str:
    summary = ", ".join(f"{k}={_cut(v)}" for k, v in event.data.items() if k not in {"request", "response"})
    return f"+{(event.t_ns - origin_ns) / 1e9:.3f}s {event.kind} [{event.source}] {summary}"


def _cut(value: Any) -> str:
    text = str(value)
    if len(text) <= DESCRIBE_VALUE_CHARS:
        return text
    return f"{text[:DESCRIBE_VALUE_CHARS]}… ({len(text) - DESCRIBE_VALUE_CHARS} more characters)"


def wall_time(event: Event) -> float:
    """The event's wall-clock time (stamps are monotonic), for comparing with times the API server wrote."""
    return time.time() - (time.monotonic_ns() - event.t_ns) / 1e9


class Timeline:
    def __init__(self) -> None:
        self._events: list[Event] = []
        self._cond = threading.Condition()
        self.origin_ns = time.monotonic_ns()

    def now(self) -> int:
        return time.monotonic_ns()

    def record(self, kind: str, source: str, **data: Any) -> Event:
        with self._cond:
            event = Event(time.monotonic_ns(), kind, source, data)
            self._events.append(event)
            self._cond.notify_all()
        return event

    def events(self, since_ns: int = 0, kind: str | None = None) -> list[Event]:
        with self._cond:
            return [e for e in self._events
                    if e.t_ns >= since_ns and (kind is None or e.kind == kind)]

    def after(self, index: int, timeout_s: float) -> list[Event]:
        """Events from position `index` on, waiting up to `timeout_s` for the first (for live followers)."""
        with self._cond:
            if len(self._events) <= index:
                self._cond.wait(timeout_s)
            return self._events[index:]

    def find(self, predicate: Predicate, since_ns: int = 0) -> list[Event]:
        return [e for e in self.events(since_ns) if predicate(e)]

    def wait_for(
        self,
        predicate: Predicate,
        timeout_s: float,
        awaiting: str,
        since_ns: int = 0,
        abort: Predicate | None = None,
        relevant: Iterable[str] | None = None,
    ) -> Event:
        """Return the first event since `since_ns` matching `predicate`.

        `abort` ends the wait early when an event shows the awaited thing can no
        longer happen (a permanent rejection, a process exit). `relevant` lists
        event kinds worth quoting in a timeout message.
        """
        stop = predicate if abort is None else (lambda e: predicate(e) or abort(e))
        event = self._first(stop, timeout_s, since_ns)
        if event is None:
            raise WaitTimeout(awaiting, timeout_s, self._seen(since_ns, relevant), self.origin_ns)
        if predicate(event):
            return event
        waited = (event.t_ns - max(since_ns, self.origin_ns)) / 1e9
        raise WaitTimeout(f"{awaiting} (gave up: {describe(event, self.origin_ns)})",
                          timeout_s, self._seen(since_ns, relevant), self.origin_ns, waited)

    def wait_quiet(self, predicate: Predicate, window_s: float, since_ns: int = 0) -> Event | None:
        """Watch for `window_s`: return the first matching event, or None if none came.

        This is an observation window for checks that assert something does NOT
        happen (a registration storm, a closed stream); it is bounded and
        returns early on the first offending event.
        """
        return self._first(predicate, window_s, since_ns)

    def _first(self, predicate: Predicate, timeout_s: float, since_ns: int) -> Event | None:
        """The first event since `since_ns` matching `predicate`, waiting up to `timeout_s` for it."""
        deadline = time.monotonic() + timeout_s
        checked = 0
        with self._cond:
            while True:
                window = [e for e in self._events[checked:] if e.t_ns >= since_ns]
                checked = len(self._events)
                for event in window:
                    if predicate(event):
                        return event
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self._cond.wait(remaining)

    def _seen(self, since_ns: int, relevant: Iterable[str] | None) -> list[Event]:
        kinds = set(relevant) if relevant is not None else None
        return [e for e in self._events if e.t_ns >= since_ns and (kinds is None or e.kind in kinds)]

    def to_json(self) -> list[dict[str, Any]]:
        with self._cond:
            out = []
            for e in self._events:
                d = asdict(e)
                d["t_s"] = round((e.t_ns - self.origin_ns) / 1e9, 6)
                out.append(d)
            return out

    def dump(self, path: str, cap_bytes: int = TIMELINE_CAP_BYTES) -> Cut:
        """Write the events as a JSON array, one event a line, streamed: a plugin listing 100,000 devices
        makes each ListAndWatch event megabytes, and a copy of them all would double the check's memory.
        Readers may stop after any line (reports/html.py caps what it embeds). Written beside `path` and
        renamed, so that an interrupted dump never leaves half a timeline.

        What is written is bounded (harness/instruments/bounds.py): each event's values, and the file at
        `cap_bytes`, past which the first events and the newest ones are kept around a `timeline.cut` event
        that counts those left out. The events in memory, which the checks judged, are not touched."""
        with self._cond:
            events = list(self._events)  # the event objects themselves, not copies
        cut = Cut()
        part = f"{path}.part"
        try:
            with open(part, "w") as f:
                f.write("[")
                written = 0

                def put(line: str) -> None:
                    nonlocal written
                    f.write(("\n" if written == 0 else ",\n") + line)
                    written += 1

                tail, first_dropped = self._write_bounded(events, put, cap_bytes, cut)
                if first_dropped is not None:
                    put(json.dumps({"t_ns": first_dropped, "kind": CUT_KIND, "source": "fakelet",
                                    "data": {"events": sum(cut.dropped.values()), "kinds": dict(cut.dropped),
                                             "bytes": cut.not_written, "cap_bytes": cap_bytes},
                                    "t_s": round((first_dropped - self.origin_ns) / 1e9, 6)}))
                for line in tail:
                    put(line)
                f.write("\n]\n")
            os.replace(part, path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(part)
        return cut

    def _write_bounded(self, events: list[Event], put: Callable[[str], None], cap_bytes: int,
                       cut: Cut) -> tuple[list[str], int | None]:
        """Write events from the first on while they fit in their share of `cap_bytes`; return the lines of
        the newest of the rest that fit in the tail's share, and the time of the first event left out (None
        when none was). Those left out are counted in `cut`; at most the tail's share is held in memory."""
        head_room = cap_bytes - cap_bytes // TAIL_SHARE
        tail_room = cap_bytes // TAIL_SHARE - MARKER_ROOM
        used, spilled = 0, False
        tail: collections.deque[tuple[str, Event]] = collections.deque()
        first_dropped: int | None = None
        for event in events:
            line = event_line({"t_ns": event.t_ns, "kind": event.kind, "source": event.source, "data": event.data,
                               "t_s": round((event.t_ns - self.origin_ns) / 1e9, 6)}, cut)
            if not spilled and used + len(line) + 2 <= head_room:
                put(line)
                used += len(line) + 2
                continue
            spilled = True  # from here on, only the newest are kept: the file stays in time order
            tail.append((line, event))
            used += len(line) + 2
            while tail and used > head_room + tail_room:
                old, gone = tail.popleft()
                used -= len(old) + 2
                cut.dropped[gone.kind] += 1
                cut.not_written += len(old)
                first_dropped = gone.t_ns if first_dropped is None else first_dropped
        return [line for line, _ in tail], first_dropped
