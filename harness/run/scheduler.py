"""Which check runs next, and on which xdist worker: the longest first, the next the moment a worker frees.

A run's wall time is at least its longest check (DP-RST-04 waits the kubelet's 30 s away, then the plugin's
re-registration): the goal (issue 27, P1) is a full profile in at most 1.1x that. xdist's own schedulers hand
out tests in collection order, in chunks, after every worker has started; a long check collected last then
starts last, and a chunk queued behind it waits it out. This scheduler instead

- orders the checks by their expected duration, longest first (LPT scheduling): what a check took in earlier
  runs of the same subject and defect (learned, in fakelet's cache), else what it takes on the reference
  subjects (fixtures/check-durations.yaml, measured), else a default;
- starts as soon as the first worker has collected, instead of waiting for all of them;
- keeps exactly one check queued behind each running one. An xdist worker needs its next test before it
  runs the current one (pytest's `nextitem`), so that queued check waits out the running one: it is the
  longest pending check that still ends by the run's expected end, else the shortest one.

Estimates change only the order in which checks start and how many workers run them (`--jobs auto`), never
what a check does or the bound it holds a plugin to: every verdict is the same in any order.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import yaml

from harness.launch.gobuild import cache_root
from harness.spec.subjects import fixtures_dir

DEFAULT_ESTIMATE_S = 2.0  # a check nobody has timed yet: about a typical reference check
SEED_FILE = "check-durations.yaml"
LEARNED_FILE = "check-durations.json"
LEARN_WEIGHT = 0.5  # a new run's duration against what was known: recent runs count, one odd run does not rule
# Workers a check run may start per CPU (the checks mostly wait on bounds, a worker mostly sleeps; each costs
# about 2 s of CPU to start and 100 MB): `--jobs` above it only thrashes.
JOBS_PER_CPU = 8


def max_jobs() -> int:
    return JOBS_PER_CPU * (os.cpu_count() or 1)


def run_key(subject: str, defect: str | None, timing: str = "") -> str:
    """What a check's duration depends on besides the check: the subject, its defect, the timing profile (with
    a shortened bound, if any)."""
    return f"{subject}/{defect or ''}/{timing}"


def timing_label(run: Any) -> str:
    """A RunConfig's timing profile, with its shortened bound if any (a mutant under --reaction-bound)."""
    profile = run.profile
    return profile.name + (f"@{profile.reaction_s:g}" if profile.shortened else "")


def _learned_path() -> Path:
    return cache_root() / LEARNED_FILE


def _read_learned() -> dict[str, dict[str, float]]:
    try:
        data = json.loads(_learned_path().read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _seed() -> dict[str, Any]:
    try:
        data = yaml.safe_load((fixtures_dir() / SEED_FILE).read_text()) or {}
    except (OSError, yaml.YAMLError):
        return {}
    return data if isinstance(data, dict) else {}


def seed_estimates() -> dict[str, float]:
    """Seconds per check ID on the reference subjects (fixtures/check-durations.yaml)."""
    return {str(k): float(v) for k, v in (_seed().get("seconds") or {}).items()}


def timed_before(key: str, checks: Iterable[str]) -> bool:
    """Whether each of these checks was timed for this run: learned for it, or a reference subject's own clean
    run (the seed). One check timed says nothing of the others."""
    subject, defect, _timing = key.split("/", 2)
    learned = _read_learned().get(key, {})
    seeded = seed_estimates() if not defect and subject in (_seed().get("measured_on") or []) else {}
    return all(c in learned or c in seeded for c in checks)


def estimates_for(key: str) -> Callable[[str], float]:
    """Check ID -> expected seconds for a run (run_key): learned for it, else for its subject without a defect,
    else the seed."""
    learned = _read_learned()
    subject, _defect, timing = key.split("/", 2)
    exact = learned.get(key, {})
    plain = learned.get(run_key(subject, None, timing), {})
    seed = seed_estimates()

    def estimate(check_id: str) -> float:
        for table in (exact, plain, seed):
            if check_id in table:
                return float(table[check_id])
        return DEFAULT_ESTIMATE_S

    return estimate


def learn(key: str, durations: dict[str, float]) -> None:
    """Fold one run's check durations into the cache (a hint for the order: losing a concurrent update is fine)."""
    if not durations:
        return
    path = _learned_path()
    with contextlib.suppress(OSError):
        data = _read_learned()
        table = data.setdefault(key, {})
        for check_id, seconds in durations.items():
            old = table.get(check_id)
            table[check_id] = round(seconds if old is None else LEARN_WEIGHT * seconds + (1 - LEARN_WEIGHT) * old, 3)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".check-durations-", dir=path.parent)
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=0, sort_keys=True)
        os.replace(tmp, path)


def auto_jobs(expected: Iterable[float], known: bool = True) -> int:
    """Workers for these checks: the longest alone on one, the others packed into its time on the rest.

    With LPT order that ends the run about when its longest check ends, which is the best any count can do;
    more workers would only cost their start-up. A run of checks that each wait a whole bound (a plugin that
    hangs) gets one worker per check, up to max_jobs(): waiting costs no CPU. So does a run never timed
    (`known` false): any of its checks may wait a whole bound, and a worker too many costs about 2 s of CPU
    where a worker too few costs a bound per check.
    """
    times = sorted(expected, reverse=True)
    if not times:
        return 1
    if not known:
        return max(1, min(len(times), max_jobs()))
    longest = max(times[0], 1e-3)
    others = math.ceil(sum(times[1:]) / longest)
    return max(1, min(len(times), 1 + others, max_jobs()))


class LongestFirst:
    """An xdist scheduler (pytest_xdist_make_scheduler): LPT order, one check queued per worker, no chunks.

    Implements xdist's Scheduling protocol (xdist/scheduler/protocol.py) on the shape of its LoadScheduling.
    """

    def __init__(self, estimate: Callable[[str], float], log: Any = None) -> None:
        self.log = log.loadsched if log is not None else (lambda *a: None)
        self.estimate_of_nodeid = estimate
        self.node2collection: dict[Any, list[str]] = {}
        self.node2pending: dict[Any, list[int]] = {}
        self.collection: list[str] | None = None
        self.pending: list[int] = []  # not yet sent, longest first
        self.est: list[float] = []
        self.began: dict[Any, float] = {}  # node -> when its running check began (monotonic)
        self.t0 = time.monotonic()  # when the first check was handed out

    # --- the protocol's state ---
    @property
    def nodes(self) -> list[Any]:
        return list(self.node2pending)

    @property
    def collection_is_completed(self) -> bool:
        # Start with the first worker that has collected: the longest check should not wait for the others.
        return bool(self.node2collection)

    @property
    def tests_finished(self) -> bool:
        if not self.collection_is_completed or self.pending:
            return False
        return all(len(p) < 2 for p in self.node2pending.values())

    @property
    def has_pending(self) -> bool:
        return bool(self.pending) or any(self.node2pending.values())

    def add_node(self, node: Any) -> None:
        assert node not in self.node2pending
        self.node2pending[node] = []

    def add_node_collection(self, node: Any, collection: Sequence[str]) -> None:
        assert node in self.node2pending
        if self.collection is not None and list(collection) != self.collection:
            from xdist.report import report_collection_diff

            other = next(iter(self.node2collection))
            self.log(report_collection_diff(self.collection, list(collection), other.gateway.id, node.gateway.id))
            return  # a worker that collected something else gets nothing to run
        self.node2collection[node] = list(collection)

    def mark_test_complete(self, node: Any, item_index: int, duration: float = 0) -> None:
        self.node2pending[node].remove(item_index)
        self.began[node] = time.monotonic()  # its queued check starts now
        self._top_up(node)

    def mark_test_pending(self, item: str) -> None:
        assert self.collection is not None
        self._put_back([self.collection.index(item)])
        for node in self.nodes:
            self._top_up(node)

    def remove_pending_tests_from_node(self, node: Any, indices: Sequence[int]) -> None:
        raise NotImplementedError()

    def remove_node(self, node: Any) -> str | None:
        pending = self.node2pending.pop(node)
        self.node2collection.pop(node, None)
        self.began.pop(node, None)
        if not pending:
            return None
        assert self.collection is not None
        crashitem = self.collection[pending.pop(0)]
        self._put_back(pending)
        for other in self.nodes:
            self._top_up(other)
        return crashitem

    def schedule(self) -> None:
        if self.collection is None:
            self.collection = next(iter(self.node2collection.values()))
            self.est = [self.estimate_of_nodeid(nodeid) for nodeid in self.collection]
            self.pending = sorted(range(len(self.collection)), key=lambda i: (-self.est[i], i))
            self.t0 = time.monotonic()
        for node in self.nodes:
            self._top_up(node)

    # --- the policy ---
    def _put_back(self, indices: Iterable[int]) -> None:
        self.pending = sorted({*self.pending, *indices}, key=lambda i: (-self.est[i], i))

    def _expected_end(self, node: Any, now: float) -> float:
        """When the node's running and queued checks should both be done."""
        queue = self.node2pending.get(node, [])
        if not queue:
            return now
        running_left = max(0.0, self.began.get(node, now) + self.est[queue[0]] - now)
        return now + running_left + sum(self.est[i] for i in queue[1:])

    def _top_up(self, node: Any) -> None:
        """Give the node a check to run (if idle) and one queued behind it; shut it down when none is left."""
        if node.shutting_down or node not in self.node2collection:
            return
        queue = self.node2pending[node]
        while len(queue) < 2:
            if not self.pending:
                node.shutdown()  # its last queued check runs, then the worker ends
                return
            now = time.monotonic()
            if not queue:
                pick = self.pending[0]  # an idle worker takes the longest check left
                self.began[node] = now
            else:
                pick = self._follower(node, now)
            self.pending.remove(pick)
            queue.append(pick)
            node.send_runtest_some([pick])

    def _follower(self, node: Any, now: float) -> int:
        """The check to queue behind the node's running one: it starts when that one ends."""
        starts = self._expected_end(node, now)
        ends = [self._expected_end(n, now) for n in self.nodes if n in self.node2collection]
        # The run cannot end before its longest check or before any worker's current work.
        horizon = max([*ends, self.t0 + max(self.est, default=0.0)])
        for i in self.pending:  # longest first: the longest one that still ends by the horizon
            if starts + self.est[i] <= horizon:
                return i
        return self.pending[-1]  # nothing fits: the shortest, so that the least waits behind this worker
