"""The code a subject's command runs, pinned for its report's provenance (`provenance.subject.code`).

The subject file says how to start the plugin, not what the plugin is: `{python} my_plugin.py` runs
whatever my_plugin.py holds that day. So each file the command names is hashed: the program (resolved
on PATH as exec would), and when the program is an interpreter (python, a shell, node, perl, ruby),
the script it runs, or for `python -m MODULE` the module's file. For a Python plugin the interpreter's
installed distributions (name==version, from importlib.metadata in that interpreter) are recorded too.

Bounded: a file over HASH_LIMIT_BYTES is recorded by size and modification time, a directory is never
walked, and the interpreter gets DISTRIBUTIONS_TIMEOUT_S. Paths are recorded against named anchors
(reports/provenance.py host_path), never as this host's absolute paths. A container subject's files
are in its image: the image's ID and digests pin it (harness/run/provenance.py).
"""

from __future__ import annotations

import datetime
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import harness
from harness.config.runconfig import RunConfig
from reports.provenance import host_path, sha256_file

HASH_LIMIT_BYTES = 256 << 20  # a plugin's binary is tens of MiB; past this, hashing costs more than it tells
DISTRIBUTIONS_TIMEOUT_S = 10.0  # importlib.metadata over a large environment: well under a second here
MAX_DISTRIBUTIONS = 2000
PYTHON_PLACEHOLDER, BIN_PLACEHOLDER = "{python}", "{bin}"  # harness/spec/subjects.py DP_PLACEHOLDERS

# Interpreters by the program's file name, each with the options that run inline code (nothing to hash
# but the command itself), the options that take the next word as their value, and the one naming a module.
INTERPRETERS: dict[str, tuple[re.Pattern[str], frozenset[str], frozenset[str], str | None]] = {
    "python": (re.compile(r"(python|pypy)[0-9.]*"), frozenset({"-c"}),
               frozenset({"-W", "-X", "--check-hash-based-pycs"}), "-m"),
    "shell": (re.compile(r"(ba|da|z|k|mk)?sh"), frozenset({"-c"}), frozenset({"-o", "+o", "-O", "+O"}), None),
    "node": (re.compile(r"node(js)?"), frozenset({"-e", "--eval", "-p", "--print"}),
             frozenset({"-r", "--require", "--import", "--loader", "--experimental-loader", "-C", "--conditions"}),
             None),
    "perl": (re.compile(r"perl[0-9.]*"), frozenset({"-e", "-E"}), frozenset({"-I", "-M", "-m"}), None),
    "ruby": (re.compile(r"ruby[0-9.]*"), frozenset({"-e"}), frozenset({"-r", "-I", "-C"}), None),
}

# Run by the plugin's interpreter: its distributions, and the source file `-m MODULE` would run. The module
# is looked up as the import system finds it (sys.path, an editable install's finder) without importing it
# or its parent packages: that would run the plugin's package code.
PROGRAM = r"""
import importlib.machinery, json, os, sys
from importlib.metadata import distributions
names = set()
for d in distributions():
    name = d.metadata["Name"] if d.metadata else None
    if name:
        names.add(f"{name}=={d.version}")
def top(name):
    for finder in sys.meta_path:
        try:
            spec = finder.find_spec(name, None)
        except Exception:
            spec = None
        if spec is not None:
            return spec
def locate(name):
    parts = name.split(".")
    spec = top(parts[0])
    for n in range(1, len(parts)):
        if spec is None or not spec.submodule_search_locations:
            return None
        spec = importlib.machinery.PathFinder.find_spec(".".join(parts[:n + 1]), list(spec.submodule_search_locations))
    if spec is not None and spec.submodule_search_locations:
        spec = importlib.machinery.PathFinder.find_spec(name + ".__main__", list(spec.submodule_search_locations))
    return os.path.abspath(spec.origin) if spec is not None and spec.origin and os.path.isfile(spec.origin) else None
module = locate(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1] else None
print(json.dumps({"distributions": sorted(names), "module": module}))
"""


def anchors(run: RunConfig) -> list[tuple[str, str | None]]:
    """The directories a recorded path is named against, the most telling first."""
    subject_dir = os.path.dirname(run.subject_file) if run.subject_file else None
    fakelet = str(Path(harness.__file__).resolve().parent.parent)
    venv = sys.prefix if sys.prefix != sys.base_prefix else None  # a system Python's files are under /usr
    return [("<subject-dir>", subject_dir), ("<cwd>", os.getcwd()), ("<fakelet>", fakelet), ("<python-env>", venv)]


def file_record(role: str, path: str, where: Sequence[tuple[str, str | None]]) -> dict[str, Any]:
    """One file the command names: its path (anchored), and its SHA-256, or why there is none."""
    out: dict[str, Any] = {"role": role, "path": host_path(path, where)}
    try:
        info = os.stat(path)
    except OSError as err:
        out["note"] = f"not found ({err.strerror})"
        return out
    if os.path.isdir(path):
        out["note"] = "a directory: not hashed (its tree may be large)"
    elif info.st_size > HASH_LIMIT_BYTES:
        stamp = datetime.datetime.fromtimestamp(info.st_mtime, datetime.UTC).isoformat(timespec="seconds")
        out.update(size=info.st_size, mtime=stamp,
                   note=f"over {HASH_LIMIT_BYTES >> 20} MiB: recorded by size and modification time, not hashed")
    else:
        try:
            out["sha256"] = sha256_file(path)
        except OSError as err:
            out["note"] = f"unreadable ({err.strerror})"
    return out


def interpreter_kind(program: str) -> str | None:
    name = os.path.basename(program)
    return next((kind for kind, (pattern, *_) in INTERPRETERS.items() if pattern.fullmatch(name)), None)


def script_of(kind: str, args: list[str]) -> tuple[str, str] | None:
    """What an interpreter's arguments run: ("script", PATH), ("module", NAME), ("inline", OPTION), or None."""
    _, inline, valued, module_flag = INTERPRETERS[kind]
    words = iter(args)
    for word in words:
        if word == "--":
            rest = next(words, None)
            return ("script", rest) if rest else None
        if word in inline:
            return ("inline", word)
        if module_flag and word == module_flag:
            name = next(words, None)
            return ("module", name) if name else None
        if module_flag and word.startswith(module_flag) and len(word) > len(module_flag):
            return ("module", word[len(module_flag):])  # python -mpkg
        if word in valued:
            next(words, None)
            continue
        if word == "-":
            return None  # the script comes on stdin
        if word.startswith(("-", "+")):
            continue
        return ("script", word)
    return None


def strip_env(words: list[str]) -> list[str]:
    """The command less a leading `env [-i] [VAR=VALUE...]`: the program env starts is the one that matters."""
    if not words or os.path.basename(words[0]) != "env":
        return words
    rest = words[1:]
    while rest and (rest[0].startswith("-") or "=" in rest[0]):
        rest = rest[1:]
    return rest


def resolve_program(word: str, path_env: str) -> str | None:
    """The program's file as exec would find it: a path (relative to the working directory) or a PATH lookup."""
    if "/" in word:
        return os.path.abspath(word)
    return shutil.which(word, path=path_env)


def fill(word: str, run: RunConfig, binary: str | None) -> str | None:
    """A command word with {python} and {bin} filled in; None when another placeholder makes it unknown now."""
    word = word.replace(PYTHON_PLACEHOLDER, sys.executable)
    if BIN_PLACEHOLDER in word:
        if not binary:
            return None
        word = word.replace(BIN_PLACEHOLDER, binary)
    return None if re.search(r"(?<!\{)\{[a-z_]+\}(?!\})", word) else word


def pin(run: RunConfig, binary: str | None) -> dict[str, Any]:
    """`code` (each file the command names) and, for a Python plugin, `python_distributions` (or
    `python_distributions_error`): nothing for a container subject, whose files are in its image."""
    spec = run.spec
    if spec.launcher == "container" or not spec.command:
        return {}
    where = anchors(run)
    words = strip_env(list(spec.command))
    if not words:
        return {}
    program_word = fill(words[0], run, binary)
    if program_word is None:
        return {"code": [{"role": "program", "path": words[0], "note": "named by a placeholder filled only in the "
                                                                         "sandbox: not hashed"}]}
    path_env = spec.env.get("PATH") or os.environ.get("PATH", os.defpath)
    program = resolve_program(program_word, path_env)
    code: list[dict[str, Any]] = []
    if program is None:
        code.append({"role": "program", "path": host_path(program_word, where), "note": "not found on PATH"})
        return {"code": code}
    if not (binary and os.path.realpath(program) == os.path.realpath(binary)):  # a built binary is hashed already
        code.append(file_record("program", program, where))
    kind = interpreter_kind(program) or ("python" if words[0] == PYTHON_PLACEHOLDER else None)
    if kind is None:
        return {"code": code}
    out: dict[str, Any] = {"code": code}
    ran = script_of(kind, words[1:])
    module = None
    if ran is not None:
        what, value = ran
        filled = fill(value, run, binary) if what != "inline" else None
        if what == "inline":
            code.append({"role": "inline", "path": value, "note": "code given in the command itself"})
        elif filled is None:
            code.append({"role": what, "path": value, "note": "named by a placeholder filled only in the sandbox: "
                                                               "not hashed"})
        elif what == "script":
            code.append(file_record("script", os.path.abspath(filled), where))
        else:
            module = filled
    if kind == "python":
        found = python_environment(program, module)
        if module is not None:
            located = found.get("module")
            code.append(file_record("module", located, where) | {"module": module} if located else
                        {"role": "module", "module": module, "note": "no source file found on the interpreter's "
                                                                      "sys.path"})
        out.update({k: v for k, v in found.items() if k != "module"})
    return out


def python_environment(interpreter: str, module: str | None) -> dict[str, Any]:
    """The interpreter's installed distributions and MODULE's source file, asked of the interpreter itself."""
    try:
        done = subprocess.run([interpreter, "-c", PROGRAM, module or ""], capture_output=True, text=True,
                              timeout=DISTRIBUTIONS_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return {"python_distributions_error": f"the interpreter did not answer within {DISTRIBUTIONS_TIMEOUT_S:g}s"}
    except OSError as err:
        return {"python_distributions_error": f"could not run the interpreter ({err.strerror})"}
    try:
        found = json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else None
    except (ValueError, IndexError):
        found = None
    if not isinstance(found, dict):
        last = (done.stderr.strip().splitlines() or ["no output"])[-1][:200]
        return {"python_distributions_error": f"exit {done.returncode}: {last}"}
    names = [str(n) for n in found.get("distributions") or []]
    out: dict[str, Any] = {"python_distributions": names[:MAX_DISTRIBUTIONS], "module": found.get("module")}
    if len(names) > MAX_DISTRIBUTIONS:
        out["python_distributions_error"] = f"{len(names)} distributions: the first {MAX_DISTRIBUTIONS} recorded"
    return out
