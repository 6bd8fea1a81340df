"""harness/run/exitcodes.py: every command has its exit codes, and the codes commands return are among them."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from harness.run import exitcodes
from harness.run.commands import build_parser

TIMEOUT_S = 60


def _leaves(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> list[str]:
    """Every command a user types, as `run` or `scenario run`: the parsers without subcommands of their own."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        return [" ".join(path)] if path else []
    return [leaf for action in subs for name, sub in action.choices.items() for leaf in _leaves(sub, (*path, name))]


def test_every_command_has_its_exit_codes_and_every_table_a_command():
    commands = _leaves(build_parser())
    assert "run" in commands and "scenario run" in commands
    missing = [c for c in commands if c not in exitcodes.COMMANDS]
    assert not missing, f"commands without exit codes (add them to harness/run/exitcodes.py COMMANDS): {missing}"
    stale = sorted(set(exitcodes.COMMANDS) - set(commands))
    assert not stale, f"exit codes of commands the parser does not have: {stale}"


def test_each_table_says_every_code_with_words():
    for command in exitcodes.COMMANDS:
        table = exitcodes.of(command)
        assert {0, 2, 130} <= set(table), command  # success, bad input and an interrupt are every command's
        assert all(when.strip() for when in table.values()), command


@pytest.mark.parametrize(("argv", "expected"), [
    (["checks"], 0),
    (["scenario", "check", "no-such-dir/none.yaml"], 1),
    (["scenario", "vocabulary", "no-such-step"], 2),
    (["compare", "no-such-old", "no-such-new"], 2),
])
def test_a_command_exits_with_a_code_its_table_explains(tmp_path: Path, argv: list[str], expected: int):
    proc = subprocess.run([sys.executable, "-m", "harness.run.cli", *argv], cwd=tmp_path, capture_output=True,
                          text=True, timeout=TIMEOUT_S, check=False)
    assert proc.returncode == expected, proc.stderr[-2000:]
    assert expected in exitcodes.of(" ".join(argv[:2] if argv[0] == "scenario" else argv[:1]))
