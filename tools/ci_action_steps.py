"""Run the steps of action.yml in order, as GitHub would run the composite action, on a machine without GitHub.

    python tools/ci_action_steps.py JOB_DIR [--input NAME=VALUE ...] [--cache-store DIR] [--uploads DIR]
                                    [--shims DIR] [--action action.yml]

JOB_DIR is made empty-handed: a workspace (the steps' working directory), a HOME of its own (so the
cache and the venv start empty, as on a fresh runner) and RUNNER_TEMP. Each `run:` step is written to a
file with its `${{ }}` expressions substituted and run as GitHub runs `shell: bash` (bash --noprofile
--norc -eo pipefail), with the step's `env:`, GITHUB_OUTPUT, GITHUB_ENV, GITHUB_PATH and
GITHUB_STEP_SUMMARY files; `if:` is evaluated as GitHub evaluates it (success() unless a step says
otherwise, always(), ==, !=, &&, ||, !). The `uses:` steps have local stand-ins:

- actions/setup-python, actions/setup-go: find the interpreter or toolchain of that version on this
  machine (a failure if there is none) and put its directory on PATH;
- actions/cache/restore, actions/cache/save: copy the path from or to --cache-store/KEY (a restore
  key's newest match is a partial hit, cache-hit false, as on GitHub);
- actions/upload-artifact: copy the path to --uploads/NAME (if-no-files-found: warn is a warning).

It prints each step as it runs, writes JOB_DIR/result.json (each step's outcome and exit code, the
action's outputs, its exit code) and exits as the action would: with the exit code of the last step
that failed, else 0. tools/ci_action_steps.sh drives it; the lead's tox env runs that.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# What a step inherits from this machine: pip's own settings (a mirror, certificates), the locale, TMPDIR.
PASSED_ON = re.compile(r"^(PIP_[A-Z_]+|LANG|LC_[A-Z]+|TMPDIR|GOPROXY|GOFLAGS|GONOSUMDB|GOPRIVATE|SSL_CERT_FILE)$")
EXPRESSION = re.compile(r"\$\{\{(.*?)\}\}", re.S)


class ExpressionError(ValueError):
    """An expression this stand-in does not understand: the action uses more than GitHub's basics."""


# -- expressions: the part of GitHub's language the action uses -----------------------------------------------

TOKEN = re.compile(r"\s*(?:(?P<str>'(?:[^']|'')*')|(?P<num>\d+(?:\.\d+)?)|(?P<op>==|!=|&&|\|\||!|\(|\))"
                   r"|(?P<ref>[A-Za-z_][A-Za-z0-9_.-]*))")


def truthy(value: Any) -> bool:
    return value not in (None, "", 0, False)


class Evaluator:
    """A recursive-descent reading of one expression: or := and ('||' and)*; and := not ('&&' not)*;
    not := '!' not | cmp; cmp := primary (('==' | '!=') primary)?; primary := literal | ref | f() | (or)."""

    def __init__(self, context: dict[str, Any], failed: bool) -> None:
        self.context, self.failed = context, failed

    def evaluate(self, text: str) -> Any:
        self.tokens = self.tokenize(text)
        self.pos = 0
        value = self.or_()
        if self.pos != len(self.tokens):
            raise ExpressionError(f"cannot read {text!r} past {self.tokens[self.pos][1]!r}")
        return value

    @staticmethod
    def tokenize(text: str) -> list[tuple[str, str]]:
        tokens, pos = [], 0
        while pos < len(text.rstrip()):
            match = TOKEN.match(text, pos)
            if not match:
                raise ExpressionError(f"cannot read {text!r} at {text[pos:]!r}")
            kind = match.lastgroup
            assert kind is not None
            tokens.append((kind, match.group(kind)))
            pos = match.end()
        return tokens

    def peek(self) -> str | None:
        return self.tokens[self.pos][1] if self.pos < len(self.tokens) else None

    def take(self) -> tuple[str, str]:
        token = self.tokens[self.pos]
        self.pos += 1
        return token

    def or_(self) -> Any:
        value = self.and_()
        while self.peek() == "||":
            self.take()
            right = self.and_()
            value = value if truthy(value) else right  # the operand itself, as GitHub's ||
        return value

    def and_(self) -> Any:
        value = self.not_()
        while self.peek() == "&&":
            self.take()
            right = self.not_()
            value = right if truthy(value) else value
        return value

    def not_(self) -> Any:
        if self.peek() == "!":
            self.take()
            return not truthy(self.not_())
        return self.cmp()

    def cmp(self) -> Any:
        left = self.primary()
        if self.peek() in ("==", "!="):
            op = self.take()[1]
            right = self.primary()
            same = str(left).lower() == str(right).lower() if isinstance(left, str) or isinstance(right, str) \
                else left == right  # GitHub compares strings ignoring case
            return same if op == "==" else not same
        return left

    def primary(self) -> Any:
        kind, text = self.take()
        if text == "(":
            value = self.or_()
            if self.take()[1] != ")":
                raise ExpressionError("unbalanced parenthesis")
            return value
        if kind == "str":
            return text[1:-1].replace("''", "'")
        if kind == "num":
            return float(text) if "." in text else int(text)
        if kind != "ref":
            raise ExpressionError(f"unexpected {text!r}")
        if self.peek() == "(":
            self.take()
            if self.take()[1] != ")":
                raise ExpressionError(f"{text}() takes no argument here")
            functions = {"always": True, "success": not self.failed, "failure": self.failed, "cancelled": False}
            if text not in functions:
                raise ExpressionError(f"function {text}() is not one this stand-in knows")
            return functions[text]
        if text in ("true", "false", "null"):
            return {"true": True, "false": False, "null": None}[text]
        value: Any = self.context
        for part in text.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        return value


def to_text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def substitute(text: str, context: dict[str, Any], failed: bool) -> str:
    return EXPRESSION.sub(lambda m: to_text(Evaluator(context, failed).evaluate(m.group(1))), text)


def condition(text: str | None, context: dict[str, Any], failed: bool) -> bool:
    if text is None:
        return not failed  # success(), the default
    text = text.strip()
    match = EXPRESSION.fullmatch(text)
    return truthy(Evaluator(context, failed).evaluate(match.group(1) if match else text))


# -- one job --------------------------------------------------------------------------------------------------

@dataclass
class StepResult:
    name: str
    outcome: str  # success, failure, skipped
    exit_code: int | None = None
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)


@dataclass
class Job:
    directory: Path
    inputs: dict[str, str]
    cache_store: Path
    uploads: Path
    shims: Path | None = None
    env: dict[str, str] = field(default_factory=dict)  # GITHUB_ENV's
    path: list[str] = field(default_factory=list)  # GITHUB_PATH's, newest first
    steps: dict[str, dict[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.workspace = self.directory / "workspace"
        self.home = self.directory / "home"
        self.temp = self.directory / "runner-temp"
        for d in (self.workspace, self.home, self.temp):
            d.mkdir(parents=True, exist_ok=True)
        self.summary = self.directory / "step-summary.md"
        self.summary.touch()

    def context(self) -> dict[str, Any]:
        return {"inputs": self.inputs, "steps": self.steps, "env": self.env,
                "runner": {"os": "Linux", "arch": "X64", "temp": str(self.temp)},
                "github": {"workspace": str(self.workspace), "action_path": str(ROOT)}}

    def base_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if PASSED_ON.match(k)}
        dirs = [*([str(self.shims)] if self.shims else []), *self.path, SYSTEM_PATH]
        env.update(HOME=str(self.home), PATH=":".join(dirs), CI="true", GITHUB_ACTIONS="true",
                   RUNNER_OS="Linux", RUNNER_ARCH="X64", RUNNER_TEMP=str(self.temp),
                   GITHUB_WORKSPACE=str(self.workspace), GITHUB_STEP_SUMMARY=str(self.summary))
        env.update(self.env)
        return env

    # -- the uses: steps' stand-ins -------------------------------------------------------------------------

    def setup_python(self, with_: dict[str, str]) -> dict[str, str]:
        version = with_.get("python-version", "3")
        for name in (f"python{version}", "python3"):
            found = shutil.which(name)
            if not found:
                continue
            probe = subprocess.run([found, "-c", "import sys; print(sys.executable, '%d.%d' % sys.version_info[:2])"],
                                   capture_output=True, text=True, check=False)
            lines = probe.stdout.split()
            if probe.returncode == 0 and len(lines) == 2 and (lines[1] + ".").startswith(version + "."):
                self.path.insert(0, str(Path(lines[0]).parent))  # the real interpreter, not a pyenv shim
                return {"python-path": lines[0], "python-version": lines[1]}
        raise StepFailure(f"no Python {version} on this machine (setup-python would install one)")

    def setup_go(self, with_: dict[str, str]) -> dict[str, str]:
        version = with_.get("go-version", "")
        go = shutil.which("go")
        if not go:
            raise StepFailure("no go on this machine (setup-go would install one)")
        said = subprocess.run([go, "version"], capture_output=True, text=True, check=False).stdout
        if not re.search(rf"\bgo{re.escape(version)}(\.|\s|$)", said):
            raise StepFailure(f"go here is {said.strip()!r}, not {version}")
        self.path.insert(0, str(Path(go).resolve().parent))
        return {"go-version": said.split()[2].removeprefix("go")}

    def cache_restore(self, with_: dict[str, str]) -> dict[str, str]:
        path, key = Path(with_["path"]), with_["key"]
        self.cache_store.mkdir(parents=True, exist_ok=True)
        matched = key if (self.cache_store / key).is_dir() else None
        if matched is None:
            for prefix in filter(None, with_.get("restore-keys", "").splitlines()):
                older = sorted((p for p in self.cache_store.iterdir() if p.name.startswith(prefix.strip())),
                               key=lambda p: p.stat().st_mtime, reverse=True)
                if older:
                    matched = older[0].name
                    break
        if matched is None:
            return {"cache-hit": "false", "cache-primary-key": key}
        shutil.copytree(self.cache_store / matched, path, symlinks=True, dirs_exist_ok=True)
        return {"cache-hit": "true" if matched == key else "false", "cache-primary-key": key,
                "cache-matched-key": matched}

    def cache_save(self, with_: dict[str, str]) -> dict[str, str]:
        path, target = Path(with_["path"]), self.cache_store / with_["key"]
        if target.exists():
            raise StepWarning(f"cache entry {with_['key']} exists already; not saved again (as GitHub)")
        if not path.is_dir():
            raise StepWarning(f"{path} does not exist; nothing cached")
        shutil.copytree(path, target, symlinks=True)
        return {}

    def upload_artifact(self, with_: dict[str, str]) -> dict[str, str]:
        source, target = self.workspace / with_["path"], self.uploads / with_["name"]
        if target.exists():
            raise StepFailure(f"an artifact named {with_['name']} was uploaded already")
        if not source.exists():
            if with_.get("if-no-files-found", "warn") == "error":
                raise StepFailure(f"no files at {with_['path']}")
            self.uploads.mkdir(parents=True, exist_ok=True)
            (self.uploads / f"{with_['name']}.empty").write_text(f"no files were found at {with_['path']}\n")
            raise StepWarning(f"no files were found at {with_['path']}; no artifact uploaded")
        shutil.copytree(source, target, symlinks=True)
        return {"artifact-id": "local"}

    USES = {"actions/setup-python": setup_python, "actions/setup-go": setup_go,
            "actions/cache/restore": cache_restore, "actions/cache/save": cache_save,
            "actions/upload-artifact": upload_artifact}

    # -- steps -----------------------------------------------------------------------------------------------

    def run_shell(self, n: int, step: dict[str, Any], failed: bool) -> tuple[int, dict[str, str]]:
        if step.get("shell") != "bash":
            raise StepFailure(f"shell {step.get('shell')!r}: a composite action's run step names its shell (bash)")
        ctx = self.context()
        script = self.temp / f"step-{n}.sh"
        script.write_text(substitute(step["run"], ctx, failed))
        files = {name: self.temp / f"step-{n}.{name.lower()}" for name in ("GITHUB_OUTPUT", "GITHUB_ENV",
                                                                            "GITHUB_PATH")}
        for f in files.values():
            f.write_text("")
        env = {**self.base_env(), **{k: str(v) for k, v in files.items()},
               **{k: substitute(str(v), ctx, failed) for k, v in (step.get("env") or {}).items()}}
        code = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script)],
                              cwd=self.workspace, env=env, stdin=subprocess.DEVNULL, check=False).returncode
        self.env.update(read_pairs(files["GITHUB_ENV"].read_text()))
        self.path[:0] = reversed([p for p in files["GITHUB_PATH"].read_text().splitlines() if p])
        return code, read_pairs(files["GITHUB_OUTPUT"].read_text())

    def run_step(self, n: int, step: dict[str, Any], failed: bool) -> StepResult:
        name = step.get("name") or step.get("uses") or f"step {n}"
        if not condition(step.get("if"), self.context(), failed):
            return StepResult(name, "skipped")
        start = time.monotonic()
        outputs: dict[str, str] = {}
        result = StepResult(name, "success", 0)
        try:
            if "uses" in step:
                action = step["uses"].split("@", 1)[0]
                if action not in self.USES:
                    raise StepFailure(f"no local stand-in for {step['uses']}")
                ctx = self.context()
                with_ = {k: substitute(to_text(v), ctx, failed) for k, v in (step.get("with") or {}).items()}
                outputs = self.USES[action](self, with_)
            else:
                result.exit_code, outputs = self.run_shell(n, step, failed)
                if result.exit_code:
                    result.outcome = "failure"
        except StepWarning as warning:
            result.notes.append(f"warning: {warning}")
        except StepFailure as failure:
            result.outcome, result.exit_code = "failure", 1
            result.notes.append(f"error: {failure}")
        result.seconds = round(time.monotonic() - start, 1)
        if "id" in step:
            self.steps[step["id"]] = {"outputs": outputs, "outcome": result.outcome, "conclusion": result.outcome}
        return result


class StepFailure(RuntimeError):
    """The step failed, as its action would have."""


class StepWarning(RuntimeError):
    """The step succeeded with a warning (a ::warning:: line on GitHub)."""


def read_pairs(text: str) -> dict[str, str]:
    """GITHUB_OUTPUT / GITHUB_ENV: NAME=VALUE lines, or NAME<<DELIMITER ... DELIMITER blocks."""
    pairs: dict[str, str] = {}
    lines = text.splitlines()
    n = 0
    while n < len(lines):
        line = lines[n]
        n += 1
        if "<<" in line and ("=" not in line or line.index("<<") < line.index("=")):
            name, delimiter = line.split("<<", 1)
            body = []
            while n < len(lines) and lines[n] != delimiter:
                body.append(lines[n])
                n += 1
            n += 1
            pairs[name] = "\n".join(body)
        elif "=" in line:
            name, value = line.split("=", 1)
            pairs[name] = value
    return pairs


def run_action(action_file: Path, job: Job) -> dict[str, Any]:
    action = yaml.safe_load(action_file.read_text())
    if action.get("runs", {}).get("using") != "composite":
        raise SystemExit(f"{action_file}: not a composite action")
    declared = action.get("inputs") or {}
    unknown = set(job.inputs) - set(declared)
    if unknown:
        raise SystemExit(f"{action_file}: no input named {', '.join(sorted(unknown))}")
    job.inputs = {name: to_text(spec.get("default", "")) for name, spec in declared.items()} | job.inputs
    results: list[StepResult] = []
    failed = False
    steps = action["runs"]["steps"]
    for n, step in enumerate(steps, 1):
        name = step.get("name") or step.get("uses")
        print(f"\n== step {n}/{len(steps)}: {name}", flush=True)
        result = job.run_step(n, step, failed)
        for note in result.notes:
            print(f"   {note}", flush=True)
        print(f"== {result.outcome}" + (f" (exit {result.exit_code})" if result.exit_code else "")
              + (f", {result.seconds}s" if result.outcome != "skipped" else ""), flush=True)
        failed = failed or result.outcome == "failure"
        results.append(result)
    ctx = job.context()
    outputs = {name: substitute(to_text(spec.get("value", "")), ctx, failed)
               for name, spec in (action.get("outputs") or {}).items()}
    code = next((r.exit_code or 1 for r in reversed(results) if r.outcome == "failure"), 0)
    return {"steps": [asdict(r) for r in results], "step_outputs": job.steps, "outputs": outputs, "exit_code": code,
            "summary": str(job.summary), "uploads": str(job.uploads)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("job_dir", type=Path, help="an empty (or new) directory for the job")
    parser.add_argument("--action", type=Path, default=ROOT / "action.yml")
    parser.add_argument("--input", action="append", default=[], metavar="NAME=VALUE", help="an input of the action")
    parser.add_argument("--cache-store", type=Path, help="where saved caches live (default: JOB_DIR/../cache-store)")
    parser.add_argument("--uploads", type=Path, help="where artifacts are uploaded (default: JOB_DIR/uploaded)")
    parser.add_argument("--shims", type=Path, help="a directory put first on every step's PATH (sudo, id)")
    args = parser.parse_args(argv)
    job_dir = args.job_dir.resolve()
    if job_dir.exists() and any(job_dir.iterdir()):
        parser.error(f"{job_dir}: not empty; a job starts from nothing")
    inputs = dict(i.split("=", 1) for i in args.input)
    job = Job(job_dir, inputs, (args.cache_store or job_dir.parent / "cache-store").resolve(),
              (args.uploads or job_dir / "uploaded").resolve(), args.shims.resolve() if args.shims else None)
    try:
        result = run_action(args.action.resolve(), job)
    except ExpressionError as err:
        print(f"ci_action_steps: {err}", file=sys.stderr)
        return 2
    (job_dir / "result.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"\naction outputs: {json.dumps(result['outputs'])}; the action exits {result['exit_code']}")
    return result["exit_code"]


if __name__ == "__main__":
    sys.exit(main())
