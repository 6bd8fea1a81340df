"""One ResourceClaim's changes on the timeline: what a check waits on instead of polling the API server.

`ClaimWatch(client, timeline, namespace, name)` lists the claim and watches it (a field selector on its name),
recording an `api.claim` event with the whole object each time it changes, until closed. The DRA-BND checks wait
on these for what kube-scheduler's PreBind polls for (harness/controlplane/binding.py): the driver's
status.devices entries.
"""

from __future__ import annotations

import threading
from types import TracebackType
from typing import Any

from harness.controlplane.base import RESOURCE_API
from harness.controlplane.client import ApiError, KubeClient
from harness.instruments.timeline import Timeline

WATCH_S = 5.0  # one watch request's server-side timeout; the loop re-lists and re-watches
RETRY_S = 1.0  # the API server is away: retry on a timer, not in a spin


class ClaimWatch:
    def __init__(self, client: KubeClient, timeline: Timeline, namespace: str, name: str) -> None:
        self.client, self.timeline, self.namespace, self.name = client, timeline, namespace, name
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"claim-watch-{name}")

    def __enter__(self) -> ClaimWatch:
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        """Stop watching. Not joined: the thread is blocked in a watch request until its WATCH_S timeout at the
        latest, then ends; a check must not wait for that (its events after this are never read)."""
        self._stop.set()

    def _record(self, claim: dict[str, Any]) -> None:
        self.timeline.record("api.claim", "apiserver", name=f"{self.namespace}/{self.name}",
                             uid=claim.get("metadata", {}).get("uid"),
                             version=claim.get("metadata", {}).get("resourceVersion"), claim=claim)

    def _run(self) -> None:
        path = f"{RESOURCE_API}/namespaces/{self.namespace}/resourceclaims"
        selector = f"fieldSelector=metadata.name={self.name}"
        seen = ""
        while not self._stop.is_set():
            try:
                listed = self.client.get(f"{path}?{selector}")
                for claim in listed.get("items", []):
                    if claim["metadata"].get("resourceVersion") != seen:
                        seen = claim["metadata"].get("resourceVersion", "")
                        self._record(claim)
                for event in self.client.watch(f"{path}?{selector}", listed["metadata"]["resourceVersion"],
                                               WATCH_S):
                    if self._stop.is_set():
                        return
                    if event.get("type") in ("ADDED", "MODIFIED"):
                        claim = event.get("object") or {}
                        seen = claim.get("metadata", {}).get("resourceVersion", "")
                        self._record(claim)
            except (ApiError, OSError, KeyError, ValueError) as err:
                self.timeline.record("api.error", "harness", what=f"watching ResourceClaim {self.name}",
                                     error=str(err))
                if self._stop.wait(RETRY_S):
                    return
