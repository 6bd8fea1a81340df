"""The default run's share of the kill matrix (tests/matrix_sample.py): stable, and it follows the change."""

from __future__ import annotations

import matrix_sample
import pytest


def test_the_sample_is_stable_and_about_a_third() -> None:
    names = [f"behaviour-{n}" for n in range(300)]
    first = [n for n in names if matrix_sample.in_sample("reference-dp", n)]
    assert first == [n for n in names if matrix_sample.in_sample("reference-dp", n)]
    assert 60 <= len(first) <= 140


def test_a_case_is_touched_by_its_name_or_by_its_checks_module(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(matrix_sample, "changed",
                        lambda: ('"huge-list": Defect(kills=["DP-LAW-01"])', frozenset({"suites.dp.test_health"})))
    modules = {"DP-HLT-03": "suites.dp.test_health", "DP-REG-01": "suites.dp.test_registration"}
    assert matrix_sample.touched("huge-list", [], modules)
    assert matrix_sample.touched("stuck-unhealthy", ["DP-HLT-03"], modules)
    assert not matrix_sample.touched("no-reregister", ["DP-REG-01"], modules)


def test_full_means_every_case(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(matrix_sample.FULL_ENV, "full")
    assert matrix_sample.full()
    monkeypatch.setenv(matrix_sample.FULL_ENV, "")
    assert not matrix_sample.full()
