"""The machine's inotify instances: counted for real, a real node refused without room for one, and a check
that failed while none were left an error naming the limit (CI's fidelity runs side by side ran out of the
kernel's 128: a plugin exited 1 and the real kubelet exited, and both read as the plugin's failures)."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from inotify_simple import INotify

from harness.instruments import inotify_budget
from harness.run.pytest_plugin import Collector


def test_in_use_counts_this_process_instances() -> None:
    # This process's own count: other test workers open and close instances meanwhile (CI saw 31, then 32).
    before = inotify_budget.held_by(os.getpid())
    watchers = [INotify() for _ in range(3)]
    try:
        assert inotify_budget.held_by(os.getpid()) == before + 3
        assert inotify_budget.in_use() >= 3
    finally:
        for w in watchers:
            w.close()


def test_shortage_names_the_limit_and_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(inotify_budget, "in_use", lambda uid=None: 126)
    monkeypatch.setattr(inotify_budget, "limit", lambda: 128)
    why = inotify_budget.shortage(inotify_budget.NEEDED_REAL_NODE)
    assert why is not None
    assert "fs.inotify.max_user_instances=128" in why and "about 126" in why
    assert "sysctl -w fs.inotify.max_user_instances=1024" in why
    monkeypatch.setattr(inotify_budget, "limit", lambda: 1024)
    assert inotify_budget.shortage(inotify_budget.NEEDED_REAL_NODE) is None


def test_no_limit_file_means_no_shortage(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(inotify_budget, "LIMIT_FILE", tmp_path / "absent")
    assert inotify_budget.limit() is None
    assert inotify_budget.shortage() is None


def _failed_call(exc: BaseException) -> tuple[Any, Any]:
    report = SimpleNamespace(passed=False, skipped=False, when="call", longrepr=str(exc))
    return report, SimpleNamespace(excinfo=SimpleNamespace(value=exc))


def test_a_failure_while_out_of_instances_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    report, call = _failed_call(AssertionError("expected a registration (gave up: process.exit returncode=1)"))
    monkeypatch.setattr(inotify_budget, "out_of_instances", lambda: None)
    assert Collector._verdict(report, call)[0] == "fail"
    monkeypatch.setattr(inotify_budget, "out_of_instances", lambda: "the machine is out of inotify instances")
    verdict, detail, _ = Collector._verdict(report, call)
    assert verdict == "error"
    assert detail.startswith("the machine is out of inotify instances")
    assert "gave up: process.exit returncode=1" in detail  # what the check saw stays in the detail


def test_a_real_node_is_refused_without_room(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from harness.node.real import localnode

    monkeypatch.setattr(localnode, "unavailable", lambda: None)
    monkeypatch.setattr(inotify_budget, "in_use", lambda uid=None: 120)
    monkeypatch.setattr(inotify_budget, "limit", lambda: 128)
    node = object.__new__(localnode.LocalShell)
    node.namespace = None
    with pytest.raises(localnode.RealNodeUnavailable, match="out of inotify instances"):
        node.prepare()
