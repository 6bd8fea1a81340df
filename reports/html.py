"""A self-contained HTML report: header, verdict table, and one timeline plot per check.

The page opens offline: inline CSS, plots as inline SVG built here, no script,
no external resource. Like the other writers it never decides a status; it
renders the report model and, when present, each check's timeline.json
(harness.instruments.timeline.Timeline.to_json: events {t_ns, kind, source, data, t_s}).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from html import escape
from pathlib import Path
from typing import Any

from reports.model import CheckResult, SubjectReport
from reports.order import around_missing, reading_order
from reports.provenance import lines as provenance_lines

HEALTHY = "Healthy"
INJECTION_PREFIXES = ("fault.", "device.")
# Of one check's timeline.json, the page embeds at most this much: writing the report stays bounded in time and
# memory, also for a plugin listing 100,000 devices (each ListAndWatch event megabytes); the page says where the
# whole timeline is.
MAX_TIMELINE_BYTES = 4 * 1024 * 1024
FACT_LINE_CHARS = 140  # a fact's folded line; its whole text is one click away
MAX_DEVICE_LANES = 24  # a 100,000-device plugin gets a readable plot: the devices fakelet changed, then the first


# -- the timeline, as the plot needs it ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Ev:
    """One timeline event; `t` is seconds since the check's timeline started."""

    t: float
    kind: str
    source: str
    data: dict[str, Any]

    def describe(self) -> str:
        fields = ", ".join(f"{k}={v}" for k, v in self.data.items()
                           if k not in {"request", "response", "message", "served_options", "options"})
        return f"+{self.t:.3f}s {self.kind} [{self.source}] {fields}".rstrip()


@dataclass(frozen=True)
class Span:
    """A state held from `start` to `end` (a device's health, a process's life)."""

    start: float
    end: float
    state: str
    label: str = ""


def parse_events(raw: Iterable[dict[str, Any]]) -> list[Ev]:
    """Events in time order; `t` from t_s, else from t_ns relative to the first event."""
    raw = [e for e in raw if isinstance(e, dict) and isinstance(e.get("kind"), str)]
    origin = min((e["t_ns"] for e in raw if isinstance(e.get("t_ns"), int)), default=0)
    events = []
    for e in raw:
        t = e.get("t_s")
        if not isinstance(t, int | float):
            t_ns = e.get("t_ns")
            t = (t_ns - origin) / 1e9 if isinstance(t_ns, int) else 0.0
        data = e.get("data")
        events.append(Ev(float(t), e["kind"], str(e.get("source", "")), data if isinstance(data, dict) else {}))
    return sorted(events, key=lambda ev: ev.t)


@dataclass(frozen=True)
class Loaded:
    """What the page embeds of one check's timeline: the events read, and how much of the file was left out."""

    events: list[Ev]
    size: int  # bytes of timeline.json
    left_out: int  # bytes not read: 0 when the whole timeline is embedded


def load_timeline(artifacts_dir: Path | None, check_id: str, cap: int | None = None) -> Loaded | None:
    """The check's timeline (at most `cap` bytes of it, default MAX_TIMELINE_BYTES), or None when it has none
    (or it cannot be read)."""
    cap = MAX_TIMELINE_BYTES if cap is None else cap
    if artifacts_dir is None or not check_id or "/" in check_id or check_id.startswith("."):
        return None
    path = artifacts_dir / check_id / "timeline.json"
    try:
        size = path.stat().st_size
        raw, used = (json.loads(path.read_bytes()), size) if size <= cap else read_lines(path, cap)
    except (OSError, ValueError):
        return None
    return Loaded(parse_events(raw), size, size - used) if isinstance(raw, list) else None


def read_lines(path: Path, cap: int) -> tuple[list[Any], int]:
    """The events of a one-event-a-line timeline (Timeline.dump) in its first `cap` bytes, and the bytes used.

    Never more than `cap` bytes are read, also of one huge line; a timeline in another layout gives none.
    """
    events: list[Any] = []
    with path.open("rb") as f:
        used = len(f.readline(2))
        if used != 2:
            return [], 0
        while used < cap:
            line = f.readline(cap - used + 1)
            if not line.endswith(b"\n") or len(line) > cap - used:
                break  # the next event does not fit
            text = line.strip().rstrip(b",")
            if text == b"]":
                return events, used + len(line)
            try:
                events.append(json.loads(text))
            except ValueError:
                break  # not one event a line (an older layout): what was read so far
            used += len(line)
    return events, used


def is_injection(e: Ev) -> bool:
    return e.kind.startswith(INJECTION_PREFIXES)


def unanswered_streams(before: list[Ev]) -> set[Any]:
    """Endpoints registered in `before` that had not sent their first ListAndWatch list yet."""
    registered = {e.data.get("endpoint_id") for e in before if e.kind == "kubelet.register" and e.data.get("accepted")}
    return registered - {e.data.get("endpoint_id") for e in before if e.kind == "grpc.stream_msg"}


def reaction(events: list[Ev]) -> tuple[Ev, Ev] | None:
    """The last injected fault and the subject's first answer after it.

    An answer is an accepted registration or a ListAndWatch message, except the
    first list of a stream registered before the fault: that one answers the
    old registration, not the fault.
    """
    last = max((i for i, e in enumerate(events) if is_injection(e)), default=None)
    if last is None:
        return None
    pending = unanswered_streams(events[:last])
    for e in events[last + 1:]:
        if e.kind == "kubelet.register" and e.data.get("accepted"):
            return events[last], e
        if e.kind == "grpc.stream_msg":
            if e.data.get("endpoint_id") not in pending:
                return events[last], e
            pending.discard(e.data.get("endpoint_id"))
    return None


def reaction_time(events: list[Ev]) -> float | None:
    pair = reaction(events)
    return None if pair is None else pair[1].t - pair[0].t


def natural_key(name: str) -> list[Any]:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def listed_devices(e: Ev) -> dict[str, str]:
    message = e.data.get("message")
    devices = message.get("devices", []) if isinstance(message, dict) else []
    return {str(d.get("ID", "")): str(d.get("health", "")) for d in devices if isinstance(d, dict)}


def device_ids(events: list[Ev]) -> list[str]:
    ids = {d for e in events if e.kind == "grpc.stream_msg" for d in listed_devices(e)}
    ids |= {str(e.data["device"]) for e in events if e.kind.startswith("device.") and "device" in e.data}
    return sorted(ids, key=natural_key)


def drawn_devices(events: list[Ev], limit: int = MAX_DEVICE_LANES) -> tuple[list[str], int]:
    """The devices that get a lane, and how many do not: those fakelet changed first, then in order."""
    ids = device_ids(events)
    if len(ids) <= limit:
        return ids, 0
    changed = {str(e.data["device"]) for e in events if e.kind.startswith("device.") and "device" in e.data}
    chosen = sorted(changed, key=natural_key)[:limit]
    chosen += [d for d in ids if d not in changed][: limit - len(chosen)]
    return sorted(chosen, key=natural_key), len(ids) - len(chosen)


def health_class(health: str) -> str:
    if health == "absent":
        return "absent"
    return "ok" if health == HEALTHY else "bad"


class SpanBuilder:
    """Collects per-key spans from state changes."""

    def __init__(self) -> None:
        self.spans: dict[str, list[Span]] = {}
        self.open: dict[str, tuple[float, str, str]] = {}

    def set(self, key: str, t: float, state: str, label: str = "") -> None:
        current = self.open.get(key)
        if current is not None and (current[1], current[2]) == (state, label):
            return
        self.close(key, t)
        self.open[key] = (t, state, label)

    def close(self, key: str, t: float) -> None:
        current = self.open.pop(key, None)
        if current is not None and t > current[0]:
            self.spans.setdefault(key, []).append(Span(current[0], t, current[1], current[2]))

    def close_all(self, t: float) -> dict[str, list[Span]]:
        for key in list(self.open):
            self.close(key, t)
        return self.spans


def reported_health(events: list[Ev], t_end: float, ids: list[str] | None = None) -> dict[str, list[Span]]:
    """Per device (of `ids`, default all), the health in the latest ListAndWatch message; nothing while no
    stream is open."""
    ids, spans, endpoint = device_ids(events) if ids is None else ids, SpanBuilder(), None
    for e in events:
        if e.kind == "grpc.stream_msg":
            listed, endpoint = listed_devices(e), e.data.get("endpoint_id")
            for dev in ids:
                spans.set(dev, e.t, listed.get(dev, "absent"))
        elif e.kind == "kubelet.stream_end" and e.data.get("endpoint_id", endpoint) == endpoint:
            spans.close_all(e.t)
    return spans.close_all(t_end)


def backend_health(events: list[Ev], t_end: float) -> dict[str, list[Span]]:
    """Per device, the fake backend's state from device.* events (from the first event on)."""
    spans = SpanBuilder()
    last: dict[str, str] = {}
    for e in events:
        if e.kind.startswith("device.") and "device" in e.data:
            dev = str(e.data["device"])
            health = "absent" if e.data.get("present") is False else str(e.data.get("health", last.get(dev, "")))
            last[dev] = health
            spans.set(dev, e.t, health)
    return spans.close_all(t_end)


def temperatures(events: list[Ev]) -> dict[str, list[tuple[float, float]]]:
    series: dict[str, list[tuple[float, float]]] = {}
    for e in events:
        temp = e.data.get("temperature_c")
        if e.kind.startswith("device.") and "device" in e.data and isinstance(temp, int | float):
            series.setdefault(str(e.data["device"]), []).append((e.t, float(temp)))
    return series


def lifetimes(events: list[Ev], start: str, stop: str, key: str) -> list[Span]:
    """Process lives: from a `start` event to the `stop` event with the same data[key], or to the end."""
    spans, t_end = SpanBuilder(), events[-1].t if events else 0.0
    for e in events:
        if e.kind == start:
            spans.set(str(e.data.get(key, "")), e.t, "up", f"{key} {e.data.get(key, '?')}")
        elif e.kind == stop:
            spans.close(str(e.data.get(key, "")), e.t)
    return sorted((s for group in spans.close_all(t_end).values() for s in group), key=lambda s: s.start)


def count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def device_counts(events: list[Ev]) -> dict[str, list[list[tuple[float, int, int]]]]:
    """Per resource, runs of (t, capacity, allocatable) from kubelet.devices; a kubelet stop ends a run."""
    runs: dict[str, list[list[tuple[float, int, int]]]] = {}
    live: set[str] = set()
    for e in events:
        if e.kind == "kubelet.devices":
            resource = str(e.data.get("resource", ""))
            if resource not in live:
                runs.setdefault(resource, []).append([])
                live.add(resource)
            runs[resource][-1].append((e.t, count(e.data.get("capacity")), count(e.data.get("allocatable"))))
        elif e.kind == "kubelet.stop":
            for resource in live:
                runs[resource][-1].append((e.t, -1, -1))  # end marker
            live.clear()
    return runs


def short_label(e: Ev) -> str:
    """A marker label: the event's last kind part plus its scalar data, e.g. 'outage 4.5'."""
    name = e.kind.split(".", 1)[-1].replace("_", " ")
    if e.kind.startswith("device."):
        parts = [name, str(e.data.get("device", ""))]
        if isinstance(e.data.get("temperature_c"), int | float) and name in {"heat", "cool"}:
            parts.append(f"{e.data['temperature_c']:g}\N{DEGREE SIGN}C")
    else:
        parts = [name, *(v if isinstance(v, str) else f"{k}={v:g}" for k, v in e.data.items()
                         if isinstance(v, str | int | float) and not isinstance(v, bool) and v and k != "subject")]
    text = " ".join(p for p in parts if p)
    return text if len(text) <= 32 else text[:31] + "\N{HORIZONTAL ELLIPSIS}"


# -- SVG ----------------------------------------------------------------------------------------------------------

WIDTH, GUTTER, RIGHT = 1100, 150, 16
LANE, COUNT_PANEL, LABEL_ROW = 20, 84, 13


def nice_step(span: float, target: int = 10) -> float:
    raw = max(span, 1e-9) / target
    magnitude = 10.0 ** math.floor(math.log10(raw))
    return next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw)


def fmt_s(value: float) -> str:
    return f"{value:.3f} s" if value < 10 else f"{value:.2f} s"


def attrs(**kw: Any) -> str:
    return " ".join(f'{k.rstrip("_").replace("_", "-")}="{escape(str(v))}"' for k, v in kw.items())


def tip(text: str) -> str:
    return f"<title>{escape(text)}</title>"


class Plot:
    """Stacks lanes top to bottom on one time axis; parts are SVG fragments."""

    def __init__(self, t_end: float) -> None:
        self.t_end = max(t_end, 0.05)
        self.y = 6.0
        self.parts: list[str] = []

    def x(self, t: float) -> float:
        return round(GUTTER + (WIDTH - GUTTER - RIGHT) * max(0.0, min(t, self.t_end)) / self.t_end, 1)

    def lane(self, label: str, height: float, cls: str, body: Callable[[float, float], str], **data: str) -> None:
        extra = "".join(f' data-{k}="{escape(v)}"' for k, v in data.items())
        label_x = GUTTER - (52 if cls == "device" else 8)
        self.parts.append(
            f'<g class="lane {cls}"{extra}>'
            f'<rect class="lane-bg" {attrs(x=GUTTER, y=self.y, width=WIDTH - GUTTER - RIGHT, height=height)}/>'
            f'<text class="lane-label" {attrs(x=label_x, y=self.y + height / 2 + 4)}>{escape(label)}</text>'
            f"{body(self.y, height)}</g>")
        self.y += height + 4

    def svg(self, overlays: list[str]) -> str:
        height = self.y + 22
        return (f'<svg class="timeline" viewBox="0 0 {WIDTH} {height:.0f}" width="100%" role="img">'
                f'{self.axis(height - 22)}{"".join(self.parts)}{"".join(overlays)}</svg>')

    def axis(self, bottom: float) -> str:
        step, out, tick = nice_step(self.t_end), [], 0.0
        while tick <= self.t_end + 1e-9:
            x = self.x(tick)
            out.append(f'<line class="grid" {attrs(x1=x, y1=4, x2=x, y2=bottom)}/>'
                       f'<text class="tick" {attrs(x=x, y=bottom + 14)}>{tick:g}</text>')
            tick = round(tick + step, 9)
        out.append(f'<text class="tick unit" {attrs(x=GUTTER - 8, y=bottom + 14)}>t [s]</text>')
        return "".join(out)


def span_rects(plot: Plot, spans: list[Span], y: float, h: float, prefix: str, title: str) -> str:
    return "".join(
        f'<rect class="{prefix}-{health_class(s.state) if prefix == "h" else s.state}" '
        f"{attrs(x=plot.x(s.start), y=y, width=max(plot.x(s.end) - plot.x(s.start), 1), height=h)}>"
        f"{tip(f'{title}: {s.label or s.state} from {s.start:.3f}s to {s.end:.3f}s')}</rect>"
        for s in spans)


def diamond(x: float, y: float, r: float = 5) -> str:
    return f"M{x},{y - r} L{x + r},{y} L{x},{y + r} L{x - r},{y} Z"


def marker(cls: str, shape: str, text: str) -> str:
    return f'<path class="mk {cls}" d="{shape}">{tip(text)}</path>'


def triangle(x: float, y: float, r: float = 5) -> str:
    return f"M{x},{y - r} L{x + r * 1.2},{y} L{x},{y + r} Z"


def square(x: float, y: float, r: float = 4) -> str:
    return f"M{x - r},{y - r} h{2 * r} v{2 * r} h{-2 * r} Z"


def cross(x: float, y: float, r: float = 5) -> str:
    return f"M{x - r},{y - r} L{x + r},{y + r} M{x + r},{y - r} L{x - r},{y + r}"


def process_lane(plot: Plot, label: str, cls: str, events: list[Ev], start: str, stop: str, key: str) -> None:
    spans = lifetimes(events, start, stop, key)
    if not spans and not any(e.kind in (start, stop) for e in events):
        return

    def body(y: float, h: float) -> str:
        out = [span_rects(plot, spans, y + 5, h - 10, "life", label)]
        out += [f'<text class="bar-label" {attrs(x=plot.x(s.start) + 7, y=y + h / 2 + 3.5)}>{escape(s.label)}</text>'
                for s in spans if plot.x(s.end) - plot.x(s.start) > 60]
        for e in events:
            x, mid = plot.x(e.t), y + h / 2
            if e.kind == start:
                out.append(marker(f"{cls}-start", triangle(x, mid), e.describe()))
            elif e.kind == stop:
                failed = e.kind == "process.exit" and e.data.get("returncode") not in (0, None)
                out.append(marker(f"{cls}-stop{' failed' if failed else ''}", square(x, mid), e.describe()))
            elif e.kind == "process.signal" and cls == "plugin":
                out.append(marker("signal", f"M{x},{y + 2} V{y + h - 2}", e.describe()))
        return "".join(out)

    plot.lane(label, LANE, cls, body)


def rejected_registrations(events: list[Ev]) -> list[Ev]:
    """Rejections the kubelet recorded, plus failed Register calls it did not (an injected reject)."""
    out, recorded = [], False
    for e in events:
        if e.kind == "kubelet.register" and not e.data.get("accepted"):
            out.append(e)
            recorded = True  # its Register call fails right after; do not mark it twice
        elif e.kind == "grpc.call" and e.data.get("method") == "Register" and e.data.get("side") == "server" \
                and e.data.get("outcome", "OK") != "OK":
            if not recorded:
                out.append(e)
            recorded = False
    return out


def registration_lane(plot: Plot, events: list[Ev]) -> None:
    rejected = rejected_registrations(events)

    def body(y: float, h: float) -> str:
        streams, registrations, mid = [], [], y + h / 2
        for e in events:
            x = plot.x(e.t)
            if e.kind == "kubelet.register" and e.data.get("accepted"):
                registrations.append(f'<circle class="mk reg-ok" {attrs(cx=x, cy=mid, r=5)}>'
                                     f"{tip(e.describe())}</circle>")
            elif e.kind == "grpc.stream_msg":
                streams.append(marker("stream-msg", f"M{x},{y + 3} V{y + h - 3}", e.describe()))
            elif e.kind == "kubelet.stream_end":
                streams.append(marker("stream-end", square(x, mid, 3.5), e.describe()))
        registrations += [marker("reg-bad", cross(plot.x(e.t), mid), e.describe()) for e in rejected]
        return "".join(streams + registrations)  # registrations on top

    plot.lane("register / ListAndWatch", LANE, "registration", body)


def label_rows(plot: Plot, marks: list[Ev], max_rows: int = 3) -> list[int | None]:
    """Greedy rows so that marker labels do not overlap; None where no row has room (the tooltip remains)."""
    ends: list[float] = []
    rows: list[int | None] = []
    for e in marks:
        x = plot.x(e.t)
        row = next((i for i, end in enumerate(ends) if end < x), None)
        if row is None and len(ends) < max_rows:
            row = len(ends)
            ends.append(0.0)
        if row is not None:
            ends[row] = x + 8 + 5.8 * len(short_label(e))
        rows.append(row)
    return rows


def fault_lane(plot: Plot, marks: list[Ev]) -> None:
    """Diamonds on one row, labels beneath them."""
    if not marks:
        return
    rows = label_rows(plot, marks)
    height = 14 + LABEL_ROW * (max((r for r in rows if r is not None), default=0) + 1)

    def body(y: float, h: float) -> str:
        out = []
        for e, row in zip(marks, rows, strict=True):
            x = plot.x(e.t)
            cls = "device-op" if e.kind.startswith("device.") else "fault"
            out.append(marker(cls, diamond(x, y + 7, 4.5), e.describe()))
            if row is not None:
                out.append(f'<text class="mk-label" {attrs(x=x + 3, y=y + 22 + LABEL_ROW * row)}>'
                           f"{escape(short_label(e))}</text>")
        return "".join(out)

    plot.lane("injected faults", height, "faults", body)


def device_lane(plot: Plot, dev: str, reported: list[Span], backend: list[Span] | None,
                temps: list[tuple[float, float]], temp_range: tuple[float, float] | None) -> None:
    """Upper bar: the last ListAndWatch list; lower bar: the fake backend; below: its temperature."""
    rows: list[tuple[str, float]] = [("listed", 11 if backend is not None else 16)]
    if backend is not None:
        rows.append(("backend", 8))
    if temp_range is not None:
        rows.append(("temp", 17))
    height = sum(h for _, h in rows) + 3 * (len(rows) + 1)

    def body(y: float, h: float) -> str:
        out, top = [], y + 3
        for name, row_h in rows:
            if name == "listed":
                out.append(span_rects(plot, reported, top, row_h, "h", f"{dev} listed"))
            elif name == "backend":
                out.append(span_rects(plot, backend or [], top, row_h, "h", f"{dev} backend"))
            else:
                out.append(temperature_line(plot, temps, temp_range or (0, 0), top, row_h))
            if len(rows) > 1:
                out.append(f'<text class="sublabel" {attrs(x=GUTTER - 6, y=top + row_h / 2 + 3)}>{name}</text>')
            top += row_h + 3
        return "".join(out)

    plot.lane(dev, height, "device", body, device=dev)


def temperature_line(plot: Plot, temps: list[tuple[float, float]], temp_range: tuple[float, float],
                     y: float, h: float) -> str:
    """A step line of one device's temperature, labelled where it changes; the band spans the check's range."""
    if not temps:
        return ""
    low, high = temp_range

    def scale(c: float) -> float:
        return y + h - 1.5 - (h - 11) * ((c - low) / (high - low) if high > low else 0.5)

    points, labels = [], []
    for i, (t, c) in enumerate(temps):
        if i:
            points.append(f"{plot.x(t)},{scale(temps[i - 1][1]):.1f}")
        points.append(f"{plot.x(t)},{scale(c):.1f}")
        if i == 0 or c != temps[i - 1][1]:
            labels.append(f'<text class="temp-label" {attrs(x=plot.x(t) + 3, y=scale(c) - 2.5)}>'
                          f"{c:g}\N{DEGREE SIGN}C</text>")
    points.append(f"{plot.x(plot.t_end)},{scale(temps[-1][1]):.1f}")
    title = "temperature: " + ", ".join(f"+{t:.3f}s {c:g} C" for t, c in temps)
    return f'<polyline class="temp" points="{" ".join(points)}">{tip(title)}</polyline>{"".join(labels)}'


def step_points(plot: Plot, run: list[tuple[float, int]], scale: Callable[[float], float], t_end: float) -> str:
    points, last = [], None
    for t, value in run:
        if value < 0:  # the kubelet stopped: the run ends here
            if last is not None:
                points.append(f"{plot.x(t)},{scale(last):.1f}")
            return " ".join(points)
        if last is not None:
            points.append(f"{plot.x(t)},{scale(last):.1f}")
        points.append(f"{plot.x(t)},{scale(value):.1f}")
        last = value
    if last is not None:
        points.append(f"{plot.x(t_end)},{scale(last):.1f}")
    return " ".join(points)


def count_panel(plot: Plot, events: list[Ev]) -> None:
    runs = device_counts(events)
    if not runs:
        return
    top = max((max(c, a) for rs in runs.values() for r in rs for _, c, a in r), default=1) or 1
    resources = sorted(runs)

    def body(y: float, h: float) -> str:
        scale = lambda v: y + h - 6 - (h - 14) * v / top  # noqa: E731
        out = [f'<text class="tick unit" {attrs(x=GUTTER - 8, y=scale(v) + 3)}>{v}</text>' for v in (0, top)]
        out.append(f'<line class="grid zero" {attrs(x1=GUTTER, y1=scale(0), x2=WIDTH - RIGHT, y2=scale(0))}/>')
        for i, resource in enumerate(resources):
            for run in runs[resource]:
                for field, index in (("capacity", 1), ("alloc", 2)):
                    series = [(point[0], point[index]) for point in run]
                    title = f"{resource} {'capacity' if field == 'capacity' else 'allocatable'}: " + ", ".join(
                        f"+{t:.3f}s={v}" for t, v in series if v >= 0)
                    out.append(f'<polyline class="{field} r{i % 4}" data-resource="{escape(resource)}" '
                               f'points="{step_points(plot, series, scale, plot.t_end)}">{tip(title)}</polyline>')
        return "".join(out)

    label = "capacity / allocatable" if len(resources) == 1 else "capacity / allocatable (per resource)"
    plot.lane(label, COUNT_PANEL, "counts", body)


def fault_rules(plot: Plot, marks: list[Ev]) -> list[str]:
    return [f'<line class="fault-rule" {attrs(x1=plot.x(e.t), y1=6, x2=plot.x(e.t), y2=plot.y - 4)}/>'
            for e in marks]


def reaction_overlay(plot: Plot, pair: tuple[Ev, Ev] | None, y: float) -> list[str]:
    if pair is None:
        return []
    x1, x2 = plot.x(pair[0].t), plot.x(pair[1].t)
    text = f"reaction {fmt_s(pair[1].t - pair[0].t)}"
    return [f'<g class="reaction"><path d="M{x1},{y - 4} V{y} H{x2} V{y - 4}"/>'
            f'<text {attrs(x=max(x2, x1 + 4) + 4, y=y + 4)}>{escape(text)}</text>'
            f"{tip(f'{pair[0].describe()}  ->  {pair[1].describe()}')}</g>"]


def timeline_svg(events: list[Ev]) -> str:
    t_end = max((e.t for e in events), default=0.0)
    plot = Plot(t_end * 1.02)
    marks = [e for e in events if is_injection(e)]
    fault_lane(plot, marks)
    pair = reaction(events)
    reaction_y = plot.y + 6
    if pair is not None:
        plot.y += 16
    process_lane(plot, "kubelet", "kubelet", events, "kubelet.start", "kubelet.stop", "instance")
    process_lane(plot, "plugin process", "plugin", events, "process.start", "process.exit", "pid")
    registration_lane(plot, events)
    drawn, hidden = drawn_devices(events)
    reported, backend = reported_health(events, plot.t_end, drawn), backend_health(events, plot.t_end)
    temps = temperatures(events)
    all_temps = [c for series in temps.values() for _, c in series]
    temp_range = (min(all_temps), max(all_temps)) if all_temps else None
    for dev in drawn:
        device_lane(plot, dev, reported.get(dev, []), backend.get(dev, []) if backend else None,
                    temps.get(dev, []), temp_range)
    if hidden:
        plot.lane(f"… and {hidden} more devices", 14, "more", lambda y, h: "")
    count_panel(plot, events)
    return plot.svg(fault_rules(plot, marks) + reaction_overlay(plot, pair, reaction_y))


# -- HTML ---------------------------------------------------------------------------------------------------------

CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:#1f2328;margin:0;background:#f6f8fa}
main{max-width:1240px;margin:0 auto;padding:20px 24px 60px;background:#fff}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px}
.meta{display:grid;grid-template-columns:max-content 1fr;gap:2px 14px;margin:10px 0;font-size:13px}
.meta dt{color:#59636e}.meta dd{margin:0}
.verdict{display:inline-block;padding:4px 12px;border-radius:6px;font-weight:700;color:#fff;letter-spacing:.03em}
.verdict.yes{background:#1a7f37}.verdict.no{background:#cf222e}
.counts{margin-left:12px;color:#59636e}.cause{margin:6px 0;overflow-wrap:anywhere}
ul.facts{padding-left:18px}ul.facts details{border:0;margin:0;background:none}
ul.facts summary{padding:0;font-weight:400}ul.facts details ul{font-size:12px;overflow-wrap:anywhere}
table{border-collapse:collapse;width:100%;font-size:13px}
th,td{text-align:left;padding:5px 8px;border-bottom:1px solid #d1d9e0;vertical-align:top}
th{background:#f6f8fa;font-weight:600}td.num{text-align:right;white-space:nowrap;font-variant-numeric:tabular-nums}
td.id{white-space:nowrap}td.detail{min-width:260px;overflow-wrap:anywhere}td.repro{width:22%}
.badge{display:inline-block;min-width:40px;text-align:center;padding:1px 6px;border-radius:10px;
 font-size:11px;font-weight:700;color:#fff;text-transform:uppercase}
.v-pass{background:#1a7f37}.v-fail{background:#cf222e}.v-skip{background:#818b98}.v-error{background:#9a6700}.v-not-exercised{background:#bf8700}.v-noresult{background:#9a6700}.v-na{background:#818b98}
code,pre{font:12px/1.4 ui-monospace,SFMono-Regular,Menlo,Consolas,monospace}
td code{overflow-wrap:anywhere;color:#59636e}
details{border:1px solid #d1d9e0;border-radius:6px;margin:8px 0;background:#fff}
details[open]{box-shadow:0 1px 3px rgba(0,0,0,.06)}
summary{cursor:pointer;padding:7px 10px;font-weight:600}
summary .title{font-weight:400}summary .aside{color:#59636e;font-weight:400;font-size:12px;margin-left:8px}
.body{padding:0 12px 12px}
pre{background:#f6f8fa;border:1px solid #d1d9e0;border-radius:6px;padding:8px 10px;white-space:pre-wrap;
 overflow-wrap:anywhere;margin:6px 0}
.none{color:#59636e;font-style:italic}
.capped{color:#9a6700;font-size:12px}
.legend{display:flex;flex-wrap:wrap;gap:4px 16px;font-size:12px;color:#59636e;margin:2px 0 8px;padding:0;
 list-style:none}
.legend svg{vertical-align:middle;margin-right:4px}
svg.timeline{display:block;font-family:system-ui,sans-serif}
.lane-bg{fill:#f6f8fa}.lane-label{font-size:11px;fill:#1f2328;text-anchor:end}
.grid{stroke:#d1d9e0;stroke-width:.6}.grid.zero{stroke:#818b98}
.tick{font-size:10px;fill:#59636e;text-anchor:middle}.tick.unit{text-anchor:end}
.h-ok{fill:#2da44e}.h-bad{fill:#cf222e}.h-absent{fill:#afb8c1}
.life-up{fill:#c8d7f5}.bar-label{font-size:9.5px;fill:#33415c}
.mk{stroke-width:1.2}
.kubelet-start,.plugin-start{fill:#0969da;stroke:#fff}
.kubelet-stop,.plugin-stop{fill:#57606a;stroke:#fff}.plugin-stop.failed{fill:#cf222e}
.signal{stroke:#9a6700;stroke-width:2}
.reg-ok{fill:#1a7f37;stroke:#fff}.reg-bad{stroke:#cf222e;stroke-width:2.4;fill:none}
.stream-msg{stroke:#0969da;stroke-width:1.6}.stream-end{fill:#fff;stroke:#57606a;stroke-width:1.5}
.fault{fill:#e16f24;stroke:#fff}.device-op{fill:#8250df;stroke:#fff}
.mk-label{font-size:10.5px;fill:#1f2328}
.fault-rule{stroke:#e16f24;stroke-width:.8;stroke-dasharray:3 3;opacity:.7}
.alloc,.capacity{fill:none;stroke-linejoin:round}.alloc{stroke:#0969da;stroke-width:1.8}
.capacity{stroke:#c4a7f5;stroke-width:6;opacity:.75}
.alloc.r1{stroke:#1a7f37}.alloc.r2{stroke:#bf3989}.alloc.r3{stroke:#9a6700}
.temp{fill:none;stroke:#bc4c00;stroke-width:1.4}.temp-label{font-size:9px;fill:#bc4c00}
.sublabel{font-size:9px;fill:#818b98;text-anchor:end}
.reaction path{fill:none;stroke:#1f2328;stroke-width:1.2}.reaction text{font-size:10.5px;font-weight:600}
"""

LEGEND = (
    ("h-ok", "rect", "Healthy"), ("h-bad", "rect", "Unhealthy"), ("h-absent", "rect", "not listed"),
    ("life-up", "rect", "kubelet / plugin running"), ("kubelet-start", "tri", "start"), ("kubelet-stop", "sq", "stop"),
    ("plugin-stop failed", "sq", "exit != 0"), ("reg-ok", "circle", "registration accepted"),
    ("reg-bad", "cross", "registration rejected"), ("stream-msg", "tick", "ListAndWatch message"),
    ("stream-end", "sq", "stream ended"), ("signal", "tick", "signal to plugin"),
    ("fault", "diamond", "injected fault"), ("device-op", "diamond", "device operation"),
    ("alloc", "line", "allocatable"), ("capacity", "line", "capacity"), ("temp", "line", "temperature"),
)


def legend() -> str:
    shapes = {"rect": '<rect x="1" y="3" width="16" height="8"/>', "tri": f'<path d="{triangle(7, 7)}"/>',
              "sq": f'<path d="{square(9, 7)}"/>', "circle": '<circle cx="9" cy="7" r="5"/>',
              "cross": f'<path d="{cross(9, 7, 4)}"/>', "tick": '<path d="M9,1 V13"/>',
              "diamond": f'<path d="{diamond(9, 7)}"/>', "line": '<path d="M1,7 H17"/>'}
    items = "".join(f'<li><svg width="18" height="14"><g class="mk {cls}">{shapes[shape]}</g></svg>'
                    f"{escape(text)}</li>" for cls, shape, text in LEGEND)
    note = ("<li>device lanes: <b>listed</b> = health in the last ListAndWatch list (blank: no open stream), "
            "<b>backend</b> = the fake device's own state, <b>temp</b> = its temperature</li>")
    return f'<ul class="legend">{items}{note}</ul>'


def first_line(text: str) -> str:
    return (text.splitlines() or [""])[0]


def fmt_reaction(value: float | None) -> str:
    return "n/a" if value is None else fmt_s(value)


def anchor(check_id: str) -> str:
    return "check-" + re.sub(r"[^A-Za-z0-9_-]", "_", check_id)


def header(report: SubjectReport) -> str:
    s = report.summary()
    ok = bool(s["conformant"])
    api = ", ".join(f"{k} {v}" for k, v in report.api_versions.items()) or "n/a"
    rows = [("subject", report.subject), ("defect", report.defect or "none"), ("profile", report.profile),
            ("seed", str(report.seed)), ("fakelet", report.fakelet_version), ("API versions", api),
            ("started", report.started_at or "n/a"), ("duration", f"{report.duration_s:.1f} s")]
    if report.fault_plan:
        rows.append(("fault plan", ", ".join(report.fault_plan)))
    # The provenance's few lines ("produced by: ...", "subject: ...") as more rows of the same list.
    rows += [(k, v) for k, _, v in (line.partition(": ") for line in provenance_lines(report.provenance))]
    meta = "".join(f"<dt>{escape(k)}</dt><dd>{escape(v)}</dd>" for k, v in rows)
    counts = (f"{s['pass']} pass, {s['fail']} fail, {s['not-exercised']} not exercised, {s['n/a']} n/a, "
              f"{s['skip']} skip, {s['error']} error of {s['total']}")
    cause = report.cause()
    return (f"<header><h1>fakelet conformance: {escape(report.subject)}</h1>"
            f'<p><span class="verdict {"yes" if ok else "no"}">{escape(report.status())}</span>'
            f'<span class="counts">{escape(counts)}</span></p>'
            f'<p class="cause">{escape(cause[:1].upper() + cause[1:])}.</p>{scenario_block(report)}'
            f'<dl class="meta">{meta}</dl></header>')


def findings_block(report: SubjectReport) -> str:
    findings = "".join(f"<li>{escape(f)}</li>" for f in report.findings)
    findings += "".join(f"<li>cleaned up: {escape(c)}</li>" for c in report.cleanup)
    return f'<h2>Findings</h2><ul class="findings">{findings}</ul>' if findings else ""


def facts_block(report: SubjectReport) -> str:
    """The subject-level facts, one line per kind, each one's whole text folded under it: a run's per-slot cgroup
    lines (25 of them) are there to look up, not to read before the checks."""
    items = "".join(fact_item(k, v) for k, v in report.facts.items() if k != "scenario")
    return f'<h2>Facts</h2><ul class="facts">{items}</ul>' if items else ""


def fact_item(kind: str, value: object) -> str:
    parts = fact_parts(value)
    line = fact_line(value, parts)
    if len(parts) <= 1 and len(line) <= FACT_LINE_CHARS:
        return f"<li>{escape(kind)}: {escape(line)}</li>"
    body = "".join(f"<li>{escape(p)}</li>" for p in parts)
    return (f'<li><details class="fact"><summary>{escape(kind)}: <span class="title">{escape(line)}</span>'
            f'</summary><ul>{body}</ul></details></li>')


def fact_parts(value: object) -> list[str]:
    """A fact's entries: a group of files per kind, or the '; '-joined parts of a text."""
    if isinstance(value, dict):
        return [f"{k}: {', '.join(map(str, v)) if isinstance(v, list) else v}" for k, v in value.items() if v]
    return str(value).split("; ")


def fact_line(value: object, parts: list[str]) -> str:
    """A fact in one line: counts per group of files, or a text's first entry and how many more there are."""
    if isinstance(value, dict):
        return ", ".join(f"{k}: {len(v)} file{'s' * (len(v) != 1)}" if isinstance(v, list) else f"{k}: {v}"
                         for k, v in value.items() if v) or "nothing"
    first = parts[0] if len(parts[0]) <= FACT_LINE_CHARS else parts[0][:FACT_LINE_CHARS - 3] + "..."
    return first + (f" (and {len(parts) - 1} more)" if len(parts) > 1 else "")


def scenario_block(report: SubjectReport) -> str:
    """A scenario run's outcome and the report it replays (fakelet scenario run)."""
    scenario = report.facts.get("scenario")
    if not isinstance(scenario, dict):
        return ""
    runs = scenario.get("runs", 1)
    tally = f" ({scenario.get('reproduced', 0)} of {runs} runs reproduced it)" if runs > 1 else ""
    link = scenario.get("upstream") or ""
    upstream = f'<a href="{escape(link)}">{escape(link)}</a>' if link else "none (a failed check, replayed)"
    return (f'<p class="scenario">Scenario <code>{escape(str(scenario.get("name")))}</code>: '
            f"<strong>{escape(str(scenario.get('outcome', '')).upper())}</strong>{escape(tally)}. "
            f"{escape(str(scenario.get('title', '')))}. Report: {upstream}</p>"
            f"<p class=\"scenario\">Correct: {escape(str(scenario.get('correct', '')))}<br>"
            f"The bug: {escape(str(scenario.get('bug', '')))}</p>")


def badge(verdict: str) -> str:
    return f'<span class="badge v-{css_name(verdict)}">{escape(verdict)}</span>'


def css_name(verdict: str) -> str:
    return re.sub(r"[^a-z-]", "", verdict)


def verdict_row(c: CheckResult, reaction_s: float | None) -> str:
    repro = f"<code>{escape(c.repro)}</code>" if c.verdict != "pass" and c.repro else ""
    return (f'<tr class="row-{css_name(c.verdict)}"><td class="id"><a href="#{anchor(c.id)}">{escape(c.id)}</a></td>'
            f"<td>{escape(c.title)}</td><td>{escape(c.level)}</td><td>{badge(c.verdict)}</td>"
            f'<td class="num">{c.duration_s:.2f} s</td><td class="num">{fmt_reaction(reaction_s)}</td>'
            f'<td class="detail">{escape(first_line(c.detail))}</td><td class="repro">{repro}</td></tr>')


def verdict_table(report: SubjectReport, reactions: dict[str, float | None]) -> str:
    head = "".join(f"<th>{h}</th>" for h in
                   ("ID", "check", "level", "verdict", "duration", "reaction", "detail", "reproduce"))
    before, after = around_missing(report.checks)
    missing = "".join(f'<tr class="row-error"><td class="id">{escape(m)}</td><td></td><td></td>'
                      f'<td>{badge("no result")}</td><td></td><td></td>'
                      f'<td class="detail">{escape(report.no_result())}</td><td></td></tr>'
                      for m in report.missing)
    rows = "".join(verdict_row(c, reactions.get(c.id)) for c in before) + missing + \
        "".join(verdict_row(c, reactions.get(c.id)) for c in after)
    return f'<table class="verdicts"><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>'


def capped_note(check_id: str, loaded: Loaded) -> str:
    """Where the whole timeline is, when the page shows only its beginning."""
    if not loaded.left_out:
        return ""
    link = f"artifacts/{check_id}/timeline.json"
    shown = loaded.size - loaded.left_out
    return (f'<p class="capped">Timeline capped: the plot shows its first {len(loaded.events)} events '
            f"({shown / 1e6:.1f} of {loaded.size / 1e6:.1f} MB). The whole timeline: "
            f'<a href="{escape(link)}">{escape(link)}</a></p>')


def check_section(c: CheckResult, loaded: Loaded | None, reaction_s: float | None) -> str:
    is_open = " open" if c.verdict in ("fail", "error") else ""
    summary = (f"<summary>{badge(c.verdict)} {escape(c.id)} <span class=\"title\">{escape(c.title)}</span>"
               f'<span class="aside">{escape(c.level)} &middot; {c.duration_s:.2f} s &middot; reaction '
               f"{fmt_reaction(reaction_s)}</span></summary>")
    events = loaded.events if loaded is not None else None
    plot = (timeline_svg(events) + legend()) if events else '<p class="none">no timeline recorded</p>'
    if loaded is not None:
        plot = capped_note(c.id, loaded) + plot
    detail = f"<pre class=\"detail\">{escape(c.detail)}</pre>" if c.detail else ""
    detail += "".join(f'<p class="note">{escape(n)}</p>' for n in c.notes)
    repro = f'<p>Reproduce:</p><pre class="repro">{escape(c.repro)}</pre>' if c.repro and c.verdict != "pass" else ""
    return f'<details id="{anchor(c.id)}" class="check"{is_open}>{summary}<div class="body">{plot}{detail}{repro}' \
           "</div></details>"


def render(report: SubjectReport, artifacts_dir: Path | None) -> str:
    """The whole report as one self-contained HTML document."""
    # One check's timeline in memory at a time: its plot is made and its events dropped before the next.
    reactions: dict[str, float | None] = {}
    parts = []
    for c in reading_order(report.checks):
        loaded = load_timeline(artifacts_dir, c.id)
        reactions[c.id] = reaction_time(loaded.events) if loaded is not None and loaded.events else None
        parts.append(check_section(c, loaded, reactions[c.id]))
    title = f"fakelet: {report.subject}" + (f" (defect {report.defect})" if report.defect else "")
    sections = "".join(parts)
    return ("<!DOCTYPE html>\n"
            f'<html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title>'
            f'<meta name="viewport" content="width=device-width, initial-scale=1"><style>{CSS}</style></head>'
            f"<body><main>{header(report)}<h2>Checks</h2>{verdict_table(report, reactions)}{findings_block(report)}"
            f"<h2>Timelines</h2>{sections}{facts_block(report)}</main></body></html>\n")


def write_html(report: SubjectReport, out_dir: Path) -> None:
    """Write out_dir/report.html, plotting out_dir/artifacts/<ID>/timeline.json where present."""
    out_dir.mkdir(parents=True, exist_ok=True)
    artifacts = out_dir / "artifacts"
    (out_dir / "report.html").write_text(render(report, artifacts if artifacts.is_dir() else None), encoding="utf-8")
