"""The leak test, short: runs killed with SIGINT, SIGTERM and SIGKILL at random moments, then a
normal run; nothing may be left (benchmarks/p4_leaks.py, whose long form is 100 runs, 20 killed)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SPEC = importlib.util.spec_from_file_location("p4_leaks", Path(__file__).parent.parent / "benchmarks" / "p4_leaks.py")
assert SPEC is not None and SPEC.loader is not None
p4 = importlib.util.module_from_spec(SPEC)
sys.modules["p4_leaks"] = p4  # dataclasses resolve their module by name
SPEC.loader.exec_module(p4)

RUNS, KILLED, SEED = 3, 3, 13  # one kill per signal, then the normal run measure() always adds


@pytest.mark.slow
def test_killed_runs_leave_nothing() -> None:
    left, outcomes = p4.measure(RUNS, KILLED, SEED, log=False)
    assert sorted(o.signal for o in outcomes if o.signal) == ["SIGINT", "SIGKILL", "SIGTERM"]
    problems = [f"run {n + 1} ({o.signal or 'normal'}): {'; '.join(o.problems)}"
                for n, o in enumerate(outcomes) if o.problems]
    assert not problems, "\n".join(problems)
    assert not any(left.values()), {k: v for k, v in left.items() if v}
