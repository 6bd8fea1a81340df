"""Run every command a docs page marks runnable, and check it exits as the page says.

    python tools/doc_commands.py [PATH ...]   # default: every page under docs/

A page marks a code block runnable with an HTML comment on the line before its fence (invisible on
the site):

    <!-- runnable: exit 0 -->
    ```console
    $ fakelet checks
    ```

Every line of the block that starts with `$ ` is a command; the other lines are output the page shows,
not checked. A command runs from the repository root, without a shell (no pipes, redirections or `&&`:
the page shows one command a reader can paste), bounded by a timeout. `fakelet` is the installed entry
point, else this checkout's `python -m harness.run.cli`.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MARK = re.compile(r"^\s*<!--\s*runnable:\s*exit\s+(\d+)\s*-->\s*$")
FENCE = re.compile(r"^\s*(```+|~~~+)")
SHELL_WORDS = {"|", "||", "&&", ";", ">", ">>", "<", "&"}
TIMEOUT_S = 120.0  # a runnable command is a quick one (--help, checks, scenario check); a hang is a failure
TAIL_LINES = 15


@dataclass(frozen=True)
class Command:
    path: Path
    line: int  # 1-based, of the `$ ` line
    text: str
    exit_code: int

    def where(self) -> str:
        try:
            shown = self.path.relative_to(ROOT)
        except ValueError:
            shown = self.path
        return f"{shown}:{self.line}"


class PageError(ValueError):
    """A runnable mark that marks nothing runnable: the page promises a check that would not happen."""


def extract(path: Path) -> list[Command]:
    lines = path.read_text().splitlines()
    found: list[Command] = []
    n = 0
    while n < len(lines):
        mark = MARK.match(lines[n])
        n += 1
        if not mark:
            continue
        if n >= len(lines) or not FENCE.match(lines[n]):
            raise PageError(f"{path}:{n}: a runnable mark must sit on the line just before a code fence")
        fence = FENCE.match(lines[n]).group(1)  # type: ignore[union-attr]
        n += 1
        commands = []
        while n < len(lines) and not lines[n].strip().startswith(fence):
            if lines[n].lstrip().startswith("$ "):
                commands.append(Command(path, n + 1, lines[n].lstrip()[2:].strip(), int(mark.group(1))))
            n += 1
        if n >= len(lines):
            raise PageError(f"{path}: the code block after line {n} never closes")
        if not commands:
            raise PageError(f"{path}: the runnable block before line {n + 1} has no `$ ` command")
        found += commands
    return found


def argv_of(command: Command) -> list[str]:
    words = shlex.split(command.text)
    shell = SHELL_WORDS.intersection(words)
    if shell:
        raise PageError(f"{command.where()}: {' '.join(sorted(shell))} needs a shell; a runnable command is one "
                        "command")
    if words and words[0] == "fakelet" and shutil.which("fakelet") is None:
        return [sys.executable, "-m", "harness.run.cli", *words[1:]]
    if words and words[0] in ("python", "python3"):
        return [sys.executable, *words[1:]]
    return words


def run(command: Command, timeout_s: float = TIMEOUT_S) -> tuple[bool, str]:
    """Whether it exited as the page says, and one line (plus the output's tail when it did not)."""
    argv = argv_of(command)
    env = {**os.environ, "GRPC_VERBOSITY": "ERROR",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")]))}
    start = time.monotonic()
    try:
        proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s,
                              stdin=subprocess.DEVNULL, check=False)
    except subprocess.TimeoutExpired:
        return False, f"{command.where()}: $ {command.text}: no exit within {timeout_s:g}s"
    except OSError as err:
        return False, f"{command.where()}: $ {command.text}: cannot start: {err}"
    took = time.monotonic() - start
    if proc.returncode == command.exit_code:
        return True, f"{command.where()}: $ {command.text}: exit {proc.returncode}, as the page says ({took:.1f}s)"
    tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-TAIL_LINES:])
    return False, (f"{command.where()}: $ {command.text}: exit {proc.returncode}, the page says "
                   f"{command.exit_code}\n{tail}")


def pages(paths: list[str]) -> list[Path]:
    if paths:
        return [Path(p).resolve() for p in paths]
    return sorted((ROOT / "docs").rglob("*.md"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", metavar="PATH", help="Markdown pages (default: every page under docs/)")
    parser.add_argument("--list", action="store_true", help="only list the runnable commands")
    parser.add_argument("-j", "--jobs", type=int, default=2, help="commands run at once (default 2)")
    args = parser.parse_args(argv)
    try:
        commands = [c for page in pages(args.paths) for c in extract(page)]
        for c in commands:
            argv_of(c)  # every problem of a page before anything runs
    except PageError as err:
        print(f"doc_commands: {err}", file=sys.stderr)
        return 2
    if args.list:
        for c in commands:
            print(f"{c.where()}: exit {c.exit_code}: $ {c.text}")
        return 0
    failed = 0
    # Each command is a process of its own (mostly the interpreter's start-up): a thread waits on each.
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for ok, line in pool.map(run, commands):
            print(line, flush=True)
            failed += not ok
    print(f"doc_commands: {len(commands) - failed} of {len(commands)} runnable commands exited as their page says")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
