"""A live copy of a few API collections, kept by watches, that a check waits on under a deadline.

The KEP-5970 checks judge through the Kubernetes API only: pods, their events, claims and
ResourceSlices. Each collection gets one thread that lists it and then watches it (re-listing
when a watch ends or expires); every change wakes whoever waits. A wait is a judge run on
the current copy after each change, until it answers or the deadline passes: no polling
interval, no sleep.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from harness.controlplane.client import ApiError, KubeClient

WATCH_CHUNK_S = 5.0  # one watch request's server-side timeout; the loop re-lists and re-watches
RETRY_S = 0.5  # after a failed list (the API server restarting): how long the thread waits to list again
T = TypeVar("T")


class ApiMirror:
    """Collections by name (a path plus an optional field selector), each kept current by a watch thread."""

    def __init__(self, client: KubeClient) -> None:
        self.client = client
        self._paths: dict[str, tuple[str, str | None]] = {}
        self._items: dict[str, dict[str, dict[str, Any]]] = {}
        self._synced: set[str] = set()
        self._errors: dict[str, str] = {}
        self._changed = threading.Condition()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def with_collection(self, name: str, path: str, field_selector: str | None = None) -> ApiMirror:
        self._paths[name] = (path, field_selector)
        return self

    def start(self) -> ApiMirror:
        for name in self._paths:
            t = threading.Thread(target=self._run, args=(name,), daemon=True, name=f"mirror-{name}")
            t.start()
            self._threads.append(t)
        return self

    def stop(self) -> None:
        self._stop.set()
        with self._changed:
            self._changed.notify_all()
        for t in self._threads:
            t.join(WATCH_CHUNK_S + 2)
        self._threads = []

    def items(self, name: str) -> list[dict[str, Any]]:
        with self._changed:
            return list(self._items.get(name, {}).values())

    def error(self, name: str) -> str:
        return self._errors.get(name, "")

    def wait(self, judge: Callable[[], T | None], timeout_s: float) -> T | None:
        """`judge()` after every change until it answers (not None), or None once `timeout_s` has passed."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while True:
                answer = judge()
                if answer is not None:
                    return answer
                left = deadline - time.monotonic()
                if left <= 0 or self._stop.is_set():
                    return None
                self._changed.wait(left)

    def _set(self, name: str, items: dict[str, dict[str, Any]]) -> None:
        with self._changed:
            self._items[name] = items
            self._synced.add(name)
            self._changed.notify_all()

    def _run(self, name: str) -> None:
        path, selector = self._paths[name]
        query = f"{path}?fieldSelector={selector}" if selector else path
        while not self._stop.is_set():
            try:
                listed = self.client.get(query)
                current = {_key(o): o for o in listed.get("items", [])}
                self._set(name, dict(current))
                version = listed.get("metadata", {}).get("resourceVersion", "")
                for event in self.client.watch(query, version, WATCH_CHUNK_S):
                    if self._stop.is_set():
                        return
                    obj = event.get("object") or {}
                    if event.get("type") == "DELETED":
                        current.pop(_key(obj), None)
                    elif event.get("type") in ("ADDED", "MODIFIED"):
                        current[_key(obj)] = obj
                    else:
                        continue
                    self._set(name, dict(current))
                self._errors.pop(name, None)
            except (ApiError, OSError, ValueError) as err:
                self._errors[name] = str(err)
                self._stop.wait(RETRY_S)  # not a synchronization: the API server is away, try again shortly


def _key(obj: dict[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"
