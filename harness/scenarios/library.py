"""The scenario library: fixtures/scenarios/*.yaml, one reported bug per file, named by its file."""

from __future__ import annotations

from pathlib import Path

from harness.scenarios.schema import Scenario, load
from harness.spec.subjects import ProfileError, fixtures_dir


def scenario_dir() -> Path:
    return fixtures_dir() / "scenarios"


def all_scenarios() -> list[Scenario]:
    """Every bundled scenario, by name; a broken file is an error naming it (the library is tested)."""
    return [load(path) for path in sorted(scenario_dir().glob("*.yaml"))]


def names() -> list[str]:
    return sorted(path.stem for path in scenario_dir().glob("*.yaml"))


def find(name: str) -> Scenario:
    path = scenario_dir() / f"{name}.yaml"
    if not path.is_file():
        raise ProfileError(f"no scenario {name!r}; known: {', '.join(names())} (fakelet scenario list)")
    return load(path)
