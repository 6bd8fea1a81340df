"""The check run's scheduler (harness/run/scheduler.py): longest first, one check queued per worker, and
--jobs auto sized so that the longest check bounds the run."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from harness.run import scheduler


class FakeWorker:
    """What the scheduler sees of an xdist worker: it is sent indices, and it is shut down."""

    def __init__(self, name: str) -> None:
        self.gateway = SimpleNamespace(id=name)
        self.sent: list[int] = []
        self.shutting_down = False

    def send_runtest_some(self, indices: list[int]) -> None:
        self.sent.extend(indices)

    def shutdown(self) -> None:
        self.shutting_down = True


DURATIONS = {"a::short1": 1.0, "a::long": 36.0, "a::mid": 12.0, "a::short2": 2.0, "a::short3": 0.5,
             "a::mid2": 7.0}
COLLECTION = list(DURATIONS)


def started(workers: int) -> tuple[scheduler.LongestFirst, list[FakeWorker]]:
    sched = scheduler.LongestFirst(DURATIONS.__getitem__)
    nodes = [FakeWorker(f"gw{n}") for n in range(workers)]
    for node in nodes:
        sched.add_node(node)
    sched.add_node_collection(nodes[0], COLLECTION)
    sched.schedule()  # the first worker to collect starts at once
    return sched, nodes


def names(node: FakeWorker) -> list[str]:
    return [COLLECTION[i] for i in node.sent]


def test_the_longest_check_starts_first_with_the_shortest_behind_it() -> None:
    sched, (first, second) = started(2)
    assert names(first) == ["a::long", "a::short3"]  # nothing else ends before the long one: the least waits
    assert second.sent == []  # it has not collected yet
    sched.add_node_collection(second, COLLECTION)
    sched.schedule()
    assert names(second) == ["a::mid", "a::mid2"]  # the next longest, and the longest that fits behind it
    assert sched.has_pending and not sched.tests_finished


def test_every_check_runs_once_and_each_worker_is_shut_down() -> None:
    sched, nodes = started(2)
    sched.add_node_collection(nodes[1], COLLECTION)
    sched.schedule()
    while not all(n.shutting_down for n in nodes):
        for node in nodes:
            queue = sched.node2pending[node]
            if len(queue) >= 2 or (queue and node.shutting_down):
                sched.mark_test_complete(node, queue[0])
    assert sorted(i for n in nodes for i in n.sent) == list(range(len(COLLECTION)))


def test_a_crashed_workers_queued_check_goes_back() -> None:
    sched, (first, _second) = started(2)
    crashed = sched.remove_node(first)
    assert crashed == "a::long"
    assert "a::short3" in [COLLECTION[i] for i in sched.pending]


@pytest.mark.parametrize(("times", "jobs"), [
    ([36.0, 12.0, 7.0, 6.0, 2.0, 2.0, 1.0], 2),  # the rest fit beside the longest on one more worker
    ([30.0] * 38, 16),  # a plugin that hangs: each check waits a whole bound, all at once (capped)
    ([5.0], 1),
    ([], 1),
])
def test_auto_jobs(times: list[float], jobs: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scheduler.os, "cpu_count", lambda: 2)
    assert scheduler.auto_jobs(times) == jobs


def test_a_run_never_timed_gets_a_worker_per_check(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scheduler.os, "cpu_count", lambda: 2)
    monkeypatch.setenv("FAKELET_CACHE", str(tmp_path))
    assert scheduler.auto_jobs([2.0] * 38, known=False) == 16
    assert scheduler.auto_jobs([2.0] * 3, known=False) == 3
    assert scheduler.timed_before(scheduler.run_key("reference-dp", None, "fast"), ["DP-RST-04"])  # the seed's
    never = scheduler.run_key("my-plugin", None, "fast")
    assert not scheduler.timed_before(never, ["DP-REG-01"])
    scheduler.learn(never, {"DP-REG-01": 31.0})
    assert scheduler.timed_before(never, ["DP-REG-01"])
    assert not scheduler.timed_before(never, ["DP-REG-01", "DP-REG-02"])  # one check timed says nothing of another


def test_learned_durations_come_first(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKELET_CACHE", str(tmp_path))
    key = scheduler.run_key("reference-dp", "allocate-hang", "fast")
    seeded = scheduler.estimates_for(key)
    assert seeded("DP-RST-04") > seeded("DP-REG-01")  # from fixtures/check-durations.yaml
    assert seeded("NO-SUCH-01") == scheduler.DEFAULT_ESTIMATE_S
    scheduler.learn(key, {"DP-REG-01": 40.0})
    scheduler.learn(key, {"DP-REG-01": 20.0})
    assert scheduler.estimates_for(key)("DP-REG-01") == 30.0
    assert scheduler.estimates_for(scheduler.run_key("reference-dp", None, "fast"))("DP-REG-01") < 30.0


@pytest.mark.parametrize(("jobs", "checks", "workers"), [("4", ["DP-REG-01"], 1), ("4", ["DP-REG-01", "DP-LAW-01"], 2),
                                                         ("2", ["DP-REG-01", "DP-LAW-01", "DP-LAW-02"], 2)])
def test_a_given_jobs_never_starts_more_workers_than_checks(jobs: str, checks: list[str], workers: int) -> None:
    from harness.run.commands import jobs_for

    run = SimpleNamespace(checks=checks, suite_package="suites.dp")
    assert jobs_for(SimpleNamespace(jobs=jobs), run) == workers  # type: ignore[arg-type]
