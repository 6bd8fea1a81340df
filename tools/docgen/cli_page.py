"""docs/reference/cli.md: every `fakelet` command and flag, walked from the argparse parsers themselves.

`fakelet devices`, `taint` and `pods` hand their arguments to parsers of their own (fake_devices/cli.py,
harness/run/sessioncli.py); the walk follows them there, so the page lists what each really accepts.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from docgen.markdown import cell, code, header, table
from harness.run import scheduler

# Help texts computed from the machine the parser is built on: rendered as the rule, not this machine's number.
MACHINE_DEPENDENT = {"max_jobs": f"{scheduler.JOBS_PER_CPU} per CPU"}


@contextmanager
def machine_independent() -> Iterator[None]:
    from harness.run import commands

    saved = {name: getattr(commands, name) for name in MACHINE_DEPENDENT}
    try:
        for name, text in MACHINE_DEPENDENT.items():
            setattr(commands, name, lambda text=text: text)
        yield
    finally:
        for name, value in saved.items():
            setattr(commands, name, value)


def _own_parsers() -> dict[str, Callable[[], argparse.ArgumentParser]]:
    """Commands whose arguments go to a parser of their own (argparse.REMAINDER in the main one)."""
    from fake_devices.cli import build_parser as devices_parser
    from harness.run.sessioncli import build_parser as session_parser

    return {"devices": devices_parser, "taint": lambda: session_parser("taint"),
            "pods": lambda: session_parser("pods")}


def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, str, argparse.ArgumentParser]]:
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            for name, sub in action.choices.items():
                out.append((name, helps.get(name, ""), sub))
    return out


def _usage_words(action: argparse.Action) -> str:
    if action.option_strings:
        flags = ", ".join(action.option_strings)
        if action.nargs == 0:
            return flags
        return f"{flags} {action.metavar or action.dest.upper()}"  # the choices have a column of their own
    return str(action.metavar or action.dest)


def _default(action: argparse.Action) -> str:
    value = action.default
    if value is None or value is False or value == [] or value == argparse.SUPPRESS or action.nargs == 0:
        return ""
    return code(value)


def _arguments(parser: argparse.ArgumentParser) -> list[list[str]]:
    rows = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction | argparse._HelpAction):
            continue
        if action.nargs == argparse.REMAINDER:
            continue
        repeat = " (repeatable)" if isinstance(action, argparse._AppendAction) and \
            "repeatable" not in (action.help or "") else ""
        choices = ", ".join(code(c) for c in action.choices) if action.choices else ""
        rows.append([code(_usage_words(action)), cell((action.help or "") + repeat), choices, _default(action)])
    return rows


def _exit_codes(path: list[str]) -> list[str]:
    """The command's exit codes (harness/run/exitcodes.py), when it has its own: a parent of subcommands has none."""
    from harness.run import exitcodes

    command = " ".join(path[1:])
    if command not in exitcodes.COMMANDS:
        return []
    return ["Exit codes:", "", *table(["exit code", "when"], [[f"**{code_}**", cell(when)] for code_, when in
                                                             exitcodes.of(command).items()])]


def _command(path: list[str], helptext: str, parser: argparse.ArgumentParser, own: dict, out: list[str]) -> None:
    name = " ".join(path)
    level = "#" * min(len(path) + 1, 4)
    out += [f"{level} `{name}`", ""]
    if helptext or parser.description:
        out += [cell(helptext or parser.description), ""]
    if len(path) == 2 and path[1] in own:
        parser = own[path[1]]()
        out += [f"Its arguments go to a parser of its own (`{parser.prog}`).", ""]
    rows = _arguments(parser)
    if rows:
        out += table(["argument", "what", "choices", "default"], rows)
    out += _exit_codes(path)
    for sub_name, sub_help, sub in _subcommands(parser):
        _command([*path, sub_name], sub_help, sub, own, out)


class _Recorder:
    """Stands in for pytest's parser: records what the fakelet plugin's pytest_addoption adds."""

    def __init__(self) -> None:
        self.options: list[tuple[tuple[str, ...], dict]] = []

    def getgroup(self, *args: object, **kwargs: object) -> _Recorder:
        return self

    def addoption(self, *names: str, **kwargs: object) -> None:
        self.options.append((names, kwargs))


def _pytest_options() -> list[list[str]]:
    from harness.run.pytest_plugin import pytest_addoption

    recorder = _Recorder()
    pytest_addoption(recorder)  # type: ignore[arg-type]
    rows = []
    for names, kw in recorder.options:
        metavar = kw.get("metavar") or ("" if kw.get("action") == "store_true" else names[0].lstrip("-").upper()
                                        .replace("-", "_"))
        repeat = " (repeatable)" if kw.get("action") == "append" else ""
        default = kw.get("default")
        shown = "" if default is None or default is False or default == [] else code(default)
        choices = ", ".join(code(c) for c in kw.get("choices") or ())
        rows.append([code(" ".join([", ".join(names), str(metavar)]).strip()), cell(str(kw.get("help", "")) + repeat),
                     choices, shown])
    return rows


def render() -> str:
    from harness.run.commands import build_parser

    with machine_independent():
        parser = build_parser()
    own = _own_parsers()
    from harness.run import exitcodes

    out = header("CLI reference", "the argparse parsers of harness/run/commands.py, harness/run/certify.py, "
                 "fake_devices/cli.py and harness/run/sessioncli.py, and harness/run/exitcodes.py",
                 "Every command and flag of `fakelet`, as its parser defines it. `fakelet COMMAND --help` "
                 "prints the same on the terminal. Bad input to any command is one line naming the flag or "
                 "file, and exit 2, before anything starts. Each command's exit codes follow its flags "
                 "(harness/run/exitcodes.py).")
    commands = _subcommands(parser)
    out += ["| command | what |", "| --- | --- |"]
    out += [f"| [`fakelet {n}`](#fakelet-{n}) | {cell(h)} |" for n, h, _ in commands]
    out += ["", "## `fakelet`", "", cell(parser.description or ""), ""]
    rows = _arguments(parser)
    if rows:
        out += table(["argument", "what", "choices", "default"], rows)
    out += ["Exit codes every command shares (each command's table below repeats them, with what they mean "
            "for it):", ""]
    out += table(["exit code", "when"], [[f"**{c}**", cell(when)] for c, when in exitcodes.COMMON.items()])
    for name, helptext, sub in commands:
        _command(["fakelet", name], helptext, sub, own, out)
    out += ["## pytest plugin options", "",
            "The `fakelet` distribution registers a pytest plugin (harness/run/pytest_plugin.py): "
            "`pytest --pyargs suites.dp --fakelet-subject NAME --fakelet-out DIR`. Its options, in the `fakelet` "
            "group of `pytest --help`, go through the same validation as `fakelet run`'s flags.", ""]
    out += table(["option", "what", "choices", "default"], _pytest_options())
    return "\n".join(out).rstrip() + "\n"
