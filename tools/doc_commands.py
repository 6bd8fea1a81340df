"""Run every command a docs page marks runnable, and check it exits as the page says.

    python tools/doc_commands.py [PATH ...]   # default: the README and every page under docs/

A page marks a code block runnable with an HTML comment on the line before its fence (invisible on
the site):

    <!-- runnable: exit 0 -->
    ```console
    $ fakelet checks
    ```

Every line of the block that starts with `$ ` is a command; the other lines are output the page shows,
not checked. A command runs without a shell (no pipes, redirections or `&&`: the page shows one command
a reader can paste; a trailing `# comment` is dropped, as a shell drops it), bounded by a timeout.
`fakelet` is the installed entry point, else this checkout's `python -m harness.run.cli`.

A page's commands run one after another, in the page's order, in one empty directory of their own that
is removed afterwards: a later command reads what an earlier one wrote (`bundle` the report a `run`
wrote, `merge` its shards), as a reader following the page finds it, and nothing is left behind. Pages
run side by side. A file the page shows its reader writing is marked the same way, with its name:

    <!-- file: my-bug.yaml -->
    ```yaml
    title: ...
    ```

and is written into that directory before the page's first command runs.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

ROOT = Path(__file__).resolve().parent.parent
MARK = re.compile(r"^\s*<!--\s*(runnable|file):\s*(.*?)\s*-->\s*$")
EXIT = re.compile(r"exit\s+(\d+)")
FENCE = re.compile(r"^\s*(```+|~~~+)")
SHELL_WORDS = {"|", "||", "&&", ";", ">", ">>", "<", "&"}
TIMEOUT_S = 120.0  # a runnable command is a quick one (--help, a small check set); a hang is a failure
TAIL_LINES = 15


@dataclass(frozen=True)
class Command:
    path: Path
    line: int  # 1-based, of the `$ ` line
    text: str
    exit_code: int

    def where(self) -> str:
        return f"{_shown(self.path)}:{self.line}"


@dataclass(frozen=True)
class PageFile:
    """A file the page shows its reader writing, for its commands to read."""

    name: str
    text: str


@dataclass(frozen=True)
class Page:
    path: Path
    commands: tuple[Command, ...]
    files: tuple[PageFile, ...]


class PageError(ValueError):
    """A runnable mark that marks nothing runnable: the page promises a check that would not happen."""


def _shown(path: Path) -> Path:
    try:
        return path.relative_to(ROOT)
    except ValueError:
        return path


def _blocks(path: Path) -> Iterator[tuple[str, str, int, list[tuple[int, str]]]]:
    """(kind, value, mark's line, the block's lines with their 1-based numbers) of every marked code block."""
    lines = path.read_text().splitlines()
    n = 0
    while n < len(lines):
        mark = MARK.match(lines[n])
        n += 1
        if not mark:
            continue
        if n >= len(lines) or not FENCE.match(lines[n]):
            raise PageError(f"{path}:{n}: a {mark.group(1)} mark must sit on the line just before a code fence")
        fence = FENCE.match(lines[n]).group(1)  # type: ignore[union-attr]
        n += 1
        body: list[tuple[int, str]] = []
        while n < len(lines) and not lines[n].strip().startswith(fence):
            body.append((n + 1, lines[n]))
            n += 1
        if n >= len(lines):
            raise PageError(f"{path}: the code block after line {n} never closes")
        yield mark.group(1), mark.group(2), n - len(body) - 1, body


def extract(path: Path) -> list[Command]:
    found: list[Command] = []
    for kind, value, line, body in _blocks(path):
        if kind != "runnable":
            continue
        exit_code = EXIT.fullmatch(value)
        if exit_code is None:
            raise PageError(f"{path}:{line}: a runnable mark says `runnable: exit N`, got {value!r}")
        commands = [Command(path, n, text.lstrip()[2:].strip(), int(exit_code.group(1)))
                    for n, text in body if text.lstrip().startswith("$ ")]
        if not commands:
            raise PageError(f"{path}: the runnable block before line {line + len(body) + 2} has no `$ ` command")
        found += commands
    return found


def files_of(path: Path) -> list[PageFile]:
    found: dict[str, PageFile] = {}
    for kind, name, line, body in _blocks(path):
        if kind != "file":
            continue
        pure = PurePosixPath(name)
        # The file lands in the page's own directory: a name that climbs out of it would write elsewhere.
        if not name or pure.is_absolute() or ".." in pure.parts:
            raise PageError(f"{path}:{line}: a file mark names a relative path inside the page's directory, "
                            f"got {name!r}")
        if name in found:
            raise PageError(f"{path}:{line}: the file {name} is marked twice")
        found[name] = PageFile(name, "".join(text + "\n" for _, text in body))
    return list(found.values())


def page_of(path: Path) -> Page:
    return Page(path, tuple(extract(path)), tuple(files_of(path)))


def argv_of(command: Command) -> list[str]:
    words = shlex.split(command.text, comments=True)
    shell = SHELL_WORDS.intersection(words)
    if shell:
        raise PageError(f"{command.where()}: {' '.join(sorted(shell))} needs a shell; a runnable command is one "
                        "command")
    if words and words[0] == "fakelet" and shutil.which("fakelet") is None:
        return [sys.executable, "-m", "harness.run.cli", *words[1:]]
    if words and words[0] in ("python", "python3"):
        return [sys.executable, *words[1:]]
    return words


def run(command: Command, timeout_s: float = TIMEOUT_S, cwd: Path = ROOT) -> tuple[bool, str]:
    """Whether it exited as the page says, and one line (plus the output's tail when it did not)."""
    argv = argv_of(command)
    env = {**os.environ, "GRPC_VERBOSITY": "ERROR",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")]))}
    start = time.monotonic()
    try:
        proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s,
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


def run_page(page: Page, timeout_s: float = TIMEOUT_S) -> list[tuple[bool, str]]:
    """The page's commands in order, in an empty directory of their own with the page's files, removed after."""
    with tempfile.TemporaryDirectory(prefix="fakelet-doc-") as tmp:
        where = Path(tmp)
        for f in page.files:
            (where / f.name).parent.mkdir(parents=True, exist_ok=True)
            (where / f.name).write_text(f.text)
        return [run(c, timeout_s, where) for c in page.commands]


def pages(paths: list[str]) -> list[Path]:
    if paths:
        return [Path(p).resolve() for p in paths]
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", metavar="PATH",
                        help="Markdown pages (default: the README and every page under docs/)")
    parser.add_argument("--list", action="store_true", help="only list the runnable commands")
    parser.add_argument("-j", "--jobs", type=int, default=2, help="pages run at once (default 2)")
    args = parser.parse_args(argv)
    try:
        found = [page_of(p) for p in pages(args.paths)]
        for c in (c for page in found for c in page.commands):
            argv_of(c)  # every problem of a page before anything runs
    except PageError as err:
        print(f"doc_commands: {err}", file=sys.stderr)
        return 2
    found = [page for page in found if page.commands]
    if args.list:
        for page in found:
            for f in page.files:
                print(f"{_shown(page.path)}: file {f.name}")
            for c in page.commands:
                print(f"{c.where()}: exit {c.exit_code}: $ {c.text}")
        return 0
    total = failed = 0
    # Each command is a process of its own (mostly the interpreter's start-up): a thread waits on each page's.
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for results in pool.map(run_page, found):
            for ok, line in results:
                print(line, flush=True)
                total += 1
                failed += not ok
    print(f"doc_commands: {total - failed} of {total} runnable commands exited as their page says")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
