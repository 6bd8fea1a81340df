"""The default run's share of the kill matrix (tests/matrix_sample.py): stable, and it follows the change."""

from __future__ import annotations

import matrix_sample
import pytest


def test_the_sample_is_stable_and_about_its_share() -> None:
    names = [f"behaviour-{n}" for n in range(300)]
    first = [n for n in names if matrix_sample.in_sample("reference-dp", n)]
    assert first == [n for n in names if matrix_sample.in_sample("reference-dp", n)]
    share = 300 / matrix_sample.SAMPLE_ONE_IN
    assert 0.6 * share <= len(first) <= 1.4 * share


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


def test_a_scenario_is_touched_by_its_file_or_its_defects(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(matrix_sample, "changed", lambda: ('"no-reregister": Defect(kills=["DP-RST-02"])', frozenset()))
    monkeypatch.setattr(matrix_sample, "changed_files",
                        lambda: frozenset({"fixtures/scenarios/dp-checkpoint-lost-reboot.yaml"}))
    assert matrix_sample.scenario_touched("dp-checkpoint-lost-reboot", [None])
    assert matrix_sample.scenario_touched("dp-not-reregistered-after-kubelet-restart", [None, "no-reregister"])
    assert not matrix_sample.scenario_touched("dra-getinfo-past-one-second", [None, "slow-getinfo"])


def test_the_base_is_given_or_a_branchs_fork_or_the_last_commit(monkeypatch: pytest.MonkeyPatch) -> None:
    matrix_sample.base.cache_clear()
    monkeypatch.setenv(matrix_sample.BASE_ENV, "abc123")
    assert matrix_sample.base() == "abc123"
    matrix_sample.base.cache_clear()
    monkeypatch.delenv(matrix_sample.BASE_ENV)
    answers = {("rev-parse", "--verify", "--quiet", "HEAD^{commit}"): "head\n",
               ("rev-parse", "--verify", "--quiet", "origin/main^{commit}"): "main\n",
               ("merge-base", "HEAD", "origin/main"): "fork\n",
               ("rev-parse", "--verify", "--quiet", "HEAD~1^{commit}"): "parent\n"}
    monkeypatch.setattr(matrix_sample, "_git", lambda *args: answers.get(args, ""))
    assert matrix_sample.base() == "fork"  # a branch: every commit it adds to origin/main
    matrix_sample.base.cache_clear()
    answers[("merge-base", "HEAD", "origin/main")] = "head\n"
    assert matrix_sample.base() == "HEAD~1"  # main itself (CI's fresh clone): the last commit
    matrix_sample.base.cache_clear()
    del answers[("rev-parse", "--verify", "--quiet", "HEAD~1^{commit}")]
    assert matrix_sample.base() is None  # a root commit: the sample alone
    matrix_sample.base.cache_clear()


def test_the_covering_sample_has_a_mutant_for_every_check() -> None:
    cases = [("reference-dp", f"mutant-{n}", [f"DP-X-{n % 7:02d}", f"DP-Y-{n % 5:02d}"]) for n in range(40)]
    cases += [("reference-dp", "benign", [])]
    chosen = matrix_sample.covering(cases)
    assert chosen == matrix_sample.covering(list(reversed(cases)))  # fixed, whatever the order
    assert {k for s, b, kills in cases if (s, b) in chosen for k in kills} == {k for *_, ks in cases for k in ks}
    assert ("reference-dp", "benign") not in chosen
    assert len(chosen) <= 7  # a greedy cover of 7 + 5 checks by mutants that each fail one of either kind
    wide = [("reference-dp", "wide", [f"DP-X-{n:02d}" for n in range(7)] + [f"DP-Y-{n:02d}" for n in range(5)])]
    assert matrix_sample.covering(cases + wide) == {("reference-dp", "wide")}  # one that fails all is enough
    # Each covering mutant runs only the checks it was taken for: every check once, by one that must fail it.
    plan = matrix_sample.cover_plan(cases)
    taken = [k for covers in plan.values() for k in covers]
    assert sorted(taken) == sorted({k for *_, ks in cases for k in ks})
    assert all(covers <= set(kills) for s, b, kills in cases if (covers := plan.get((s, b))) is not None)


def test_the_default_run_keeps_half_the_real_scenarios_and_runs_untouched_mutants_on_their_checks(
        request: pytest.FixtureRequest) -> None:
    """What this very session collected: the sample's choices as the tests see them."""
    import test_kill_matrix
    import test_scenarios

    if matrix_sample.full():
        pytest.skip("FAKELET_MATRIX=full: nothing is sampled")
    items = {item.nodeid: item for item in request.session.items}
    names = {n for n, _c in test_scenarios.REAL_CASES}
    real = [i for i in items.values() if getattr(i, "originalname", "") ==
            "test_each_scenario_gives_its_verdict_on_the_real_kubelet"]
    if real:  # collected (with -m real_kubelet): half the scenarios keep their first real case
        assert {n for n in names if matrix_sample.real_first_in_sample(n)} <= {i.callspec.params["name"] for i in real}
    kills_only = [i for i in items.values() if i.stash.get(matrix_sample.KILLS_ONLY, False)]
    for item in kills_only:  # the sample's and the covering mutants, never a benign behaviour (it kills nothing)
        subject, defect = item.callspec.params["subject"], item.callspec.params["defect"]
        assert item.stash[matrix_sample.KILLS_ONLY] <= set(test_kill_matrix.SPECS[subject].defects[defect].kills)
