"""One timeline event for "the kubelet dialed a plugin socket": `kubelet.dial`.

Every kubelet that puts its side of the plugin wire on the timeline records it,
the fake kubelet on each dial it makes (a device plugin's Register, the
plugins_registry socket, a DRA driver's endpoint) and the relay in front of a
real kubelet on each connection it passes on, so that a scenario's `dialed`
condition reads both the same way. The fields, all always present except
`plugin_instance`:

  socket           the socket's path, as the kubelet dialed it
  name             its base name (what a scenario's `dialed: {socket: NAME}` names)
  instance         the kubelet instance that dialed (1 for the first start, ...); None if unknown
  endpoint_id      an ID of the client connection, unique in the run (a device plugin's
                   endpoint_id, as its ListAndWatch events carry it)
  outcome          "OK", or the error the dial ended with
  plugin_instance  the plugin instance that answered, only when the recorder knows it (the
                   scenario conditions otherwise derive it from the subject's process starts)
"""

from __future__ import annotations

import itertools
import os

from harness.instruments.timeline import Event, Timeline

DIAL = "kubelet.dial"
OK = "OK"

# One sequence for every client connection a kubelet opens, so that an ID names one connection in a run
# whichever kubelet part opened it (device manager, plugin watcher, DRA manager).
endpoint_ids = itertools.count(1)


def record_dial(timeline: Timeline, socket: str, instance: int | None, endpoint_id: int, outcome: str,
                plugin_instance: int | None = None, source: str = "kubelet") -> Event:
    data: dict[str, object] = {"socket": socket, "name": os.path.basename(socket), "instance": instance,
                               "endpoint_id": endpoint_id, "outcome": outcome}
    if plugin_instance is not None:
        data["plugin_instance"] = plugin_instance
    return timeline.record(DIAL, source, **data)
