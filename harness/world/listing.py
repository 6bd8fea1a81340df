"""A device plugin's settled device list, as the kubelet's device manager holds it.

The kubelet applies every ListAndWatch message wholesale (devicemanager
`genericDeviceUpdateCallback`): an empty first list followed by the full one
a millisecond later, many small updates, identical repeats, health-only
updates and reordering are all legal. So no check judges "the first message":
it waits until the applied list is non-empty and has not changed for a short
settle window, under the kubelet's reaction bound, and judges that.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from harness.instruments.timeline import Event, Timeline, WaitTimeout

# fakelet's own window, not a bound on the plugin: a list unchanged this long is settled.
# A plugin still changing its list after it is judged, not failed.
SETTLE_S = 0.5
HEALTHY = "Healthy"  # deviceplugin v1beta1 constants.go
UNHEALTHY = "Unhealthy"  # deviceplugin v1beta1 constants.go
LIST_EVENTS = ("grpc.stream_msg", "kubelet.stream_end", "kubelet.register", "process.exit")


def devices_of(message: Event) -> dict[str, str]:
    """Device ID -> health, as the kubelet applies one ListAndWatch response."""
    return {d.get("ID", ""): d.get("health", "") for d in message.get("message", {}).get("devices", [])}


@dataclass(frozen=True)
class Listing:
    """The device list the kubelet holds for one endpoint at one moment."""

    event: Event | None  # the message that made it (None: no message yet)
    devices: dict[str, str] = field(default_factory=dict)
    messages: int = 0  # how many responses the stream carried up to here
    settled: bool = False  # unchanged for SETTLE_S

    @property
    def ids(self) -> list[str]:
        return sorted(self.devices)

    @property
    def healthy(self) -> list[str]:
        return sorted(i for i, h in self.devices.items() if h == HEALTHY)

    def describe(self) -> str:
        shown = ", ".join(f"{i}={h}" for i, h in sorted(self.devices.items())[:12])
        more = f" (+{len(self.devices) - 12} more)" if len(self.devices) > 12 else ""
        return f"[{shown}{more}] after {self.messages} response(s)"


def wait_settled(timeline: Timeline, endpoint_id: int, bound_s: float, since_ns: int = 0,
                 abort: Callable[[Event], bool] | None = None, settle_s: float = SETTLE_S) -> Listing:
    """Wait until the endpoint's applied list is non-empty and unchanged for `settle_s`, within `bound_s`.

    Returns the settled listing, or, when the bound runs out first, the last one
    (possibly empty, `settled` False): the caller decides whether that is a failure
    or a check with nothing to exercise. Raises WaitTimeout when no response came at
    all, or when `abort` (a process exit, the stream's end) shows none will.
    """
    deadline = time.monotonic() + bound_s
    seen = 0
    last: Listing = Listing(None)
    changed_at = time.monotonic()
    while True:
        events = timeline.after(seen, max(0.0, min(deadline, changed_at + settle_s) - time.monotonic()))
        for e in events:
            if e.t_ns < since_ns:
                continue
            if e.kind == "grpc.stream_msg" and e.get("endpoint_id") == endpoint_id and e.source == "kubelet":
                state = devices_of(e)
                if state != last.devices or last.event is None:
                    changed_at = time.monotonic()
                last = Listing(e, state, last.messages + 1)
            elif e.kind == "kubelet.stream_end" and e.get("endpoint_id") == endpoint_id:
                return _ended(timeline, last, f"the ListAndWatch stream ended ({e.get('reason')})", bound_s, since_ns)
            elif abort is not None and abort(e):
                return _ended(timeline, last, f"{e.kind} {e.data}", bound_s, since_ns)
        seen += len(events)
        now = time.monotonic()
        if last.devices and now - changed_at >= settle_s:
            return Listing(last.event, last.devices, last.messages, settled=True)
        if now >= deadline:
            if last.event is None:
                raise WaitTimeout("a ListAndWatch response", bound_s, timeline.events(since_ns), timeline.origin_ns)
            return last


def _ended(timeline: Timeline, last: Listing, why: str, bound_s: float, since_ns: int) -> Listing:
    """The stream or the plugin ended: what was applied stands, unless nothing ever was."""
    if last.event is None:
        raise WaitTimeout(f"a ListAndWatch response (gave up: {why})", bound_s,
                          [e for e in timeline.events(since_ns) if e.kind in LIST_EVENTS], timeline.origin_ns)
    return last
