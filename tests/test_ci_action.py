"""CI integration as users write it: action.yml (a composite GitHub Action), ci/fakelet.gitlab-ci.yml (a
GitLab CI template), and the docs' pipeline examples that use them.

Statically: every input, step and variable referenced exists; every step after the run is `if: always()`
(a NOT CONFORMANT run is when the report is needed); no editable install, no `sudo -E`; the docs' YAML
passes only inputs the action has and gives every matrix job its own artifact. Then the run step and the
GitLab script run with a stand-in `fakelet` that records its argv and exits with a chosen code: the
command line is built as documented and the exit code reaches the outputs untouched.

The whole action, from a fresh venv with a real wheel (tools/ci_action_steps.sh, about two minutes), runs
when FAKELET_CI_ACTION_WHEEL names a wheel: `pip wheel --no-deps . -w dist` and
`FAKELET_CI_ACTION_WHEEL=dist/fakelet-0.1.0-py3-none-any.whl pytest tests/test_ci_action.py`.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

import ci_action_steps  # noqa: E402

ACTION = yaml.safe_load((ROOT / "action.yml").read_text())
STEPS: list[dict[str, Any]] = ACTION["runs"]["steps"]
TEMPLATE_TEXT = (ROOT / "ci" / "fakelet.gitlab-ci.yml").read_text()
TEMPLATE = yaml.safe_load(TEMPLATE_TEXT)
PAGES = [ROOT / "docs" / "install.md", ROOT / "docs" / "guides" / "ci-pipeline.md",
         ROOT / "docs" / "kep5970-shards-matrix.md"]
LOCAL_ACTION = "./.github/actions/fakelet"  # how the docs' examples use a copy of action.yml
WHEEL = os.environ.get("FAKELET_CI_ACTION_WHEEL")


def expressions(node: Any) -> list[str]:
    """Every ${{ }} expression anywhere under `node`."""
    if isinstance(node, dict):
        return [e for k, v in node.items() for e in expressions(k) + expressions(v)]
    if isinstance(node, list):
        return [e for v in node for e in expressions(v)]
    found = ci_action_steps.EXPRESSION.findall(node) if isinstance(node, str) else []
    return [f.strip() for f in found]


def references(prefix: str, node: Any) -> set[str]:
    """The names after `prefix.` in every expression and bare `if:` under `node` (inputs, steps)."""
    texts = expressions(node) + [s["if"] for s in (node if isinstance(node, list) else [node])
                                 if isinstance(s, dict) and isinstance(s.get("if"), str)]
    return {m for t in texts for m in re.findall(rf"\b{prefix}\.([A-Za-z0-9_-]+)", t)}


def code_of(text: str) -> str:
    """The text without its comment lines: what runs, not what the comments say about what not to run."""
    return "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))


def run_index() -> int:
    return next(n for n, s in enumerate(STEPS) if s.get("id") == "run")


def yaml_blocks(page: Path) -> list[Any]:
    text = page.read_text()
    return [yaml.safe_load(b) for b in re.findall(r"```yaml\n(.*?)```", text, re.S)]


# -- action.yml, statically -----------------------------------------------------------------------------------

def test_every_input_used_exists_and_every_input_is_used() -> None:
    declared = set(ACTION["inputs"])
    used = references("inputs", STEPS) | references("inputs", ACTION["outputs"])
    assert used - declared == set(), "referenced but not declared"
    assert declared - used == set(), "declared but never used"
    for name, spec in ACTION["inputs"].items():
        assert spec.get("description"), name
        assert spec.get("required") is False and "default" in spec, f"{name}: optional with a default"


def test_every_step_referenced_exists_before_it_is_read() -> None:
    seen: set[str] = set()
    for step in STEPS:
        for ref in references("steps", step):
            assert ref in seen, f"step {step.get('name')!r} reads steps.{ref} before it ran"
        if "id" in step:
            seen.add(step["id"])
    assert {o["value"] for o in ACTION["outputs"].values()} >= {"${{ steps.run.outputs.status }}",
                                                                "${{ steps.run.outputs.exit-code }}"}


def test_steps_after_the_run_always_run_and_the_last_exits_with_fakelets_code() -> None:
    after = STEPS[run_index() + 1:]
    assert after, "the run is not the last step"
    for step in after:
        assert "always()" in step.get("if", ""), f"{step.get('name')!r} would be skipped after a failing run"
    uses = [s["uses"].split("@")[0] for s in after if "uses" in s]
    assert "actions/upload-artifact" in uses and "actions/cache/save" in uses
    upload = next(s for s in after if s.get("uses", "").startswith("actions/upload-artifact@"))
    assert upload["with"]["path"] == "${{ inputs.out }}"
    last = STEPS[-1]
    assert last["env"]["FAKELET_CODE"] == "${{ steps.run.outputs.exit-code }}"
    assert 'exit "${FAKELET_CODE:-2}"' in last["run"]
    # The run step itself never fails on fakelet's verdict: it records the code (set +e ... code=$?).
    run = STEPS[run_index()]["run"]
    assert "set +e" in run and "code=$?" in run and 'echo "exit-code=$code"' in run


def test_the_steps_set_up_python_go_and_the_cache_before_the_run() -> None:
    before = [s.get("uses", "").split("@")[0] for s in STEPS[:run_index()]]
    for action in ("actions/setup-python", "actions/setup-go", "actions/cache/restore"):
        assert action in before, action
    assert any("prebuild" in s.get("run", "") for s in STEPS[:run_index()])
    install = next(s for s in STEPS if s.get("id") == "install")
    assert "~/.cache/fakelet" not in install["run"] and "$HOME/.cache/fakelet" in install["run"]
    assert 'echo "FAKELET_CACHE=' in install["run"]  # absolute, for root's run as for the cache steps


def test_run_steps_name_bash_and_take_inputs_from_env_never_pasted_into_the_script() -> None:
    for step in STEPS:
        if "run" in step:
            assert step.get("shell") == "bash", step.get("name")
            # An input pasted into the script is shell code (a flag with $( ) in it would run); env is data.
            assert "${{" not in step["run"], f"{step.get('name')!r} pastes an expression into its script"


@pytest.mark.parametrize("text", [(ROOT / "action.yml").read_text(), TEMPLATE_TEXT],
                         ids=["action.yml", "gitlab template"])
def test_no_editable_install_and_no_sudo_e(text: str) -> None:
    text = code_of(text)
    assert not re.search(r"pip[^\n]* install[^\n]* (-e|--editable)\b", text)
    assert "sudo -E" not in text


def test_fakelet_runs_as_root_with_its_path_and_the_callers_path() -> None:
    run = STEPS[run_index()]["run"]
    assert 'as_root=(sudo --preserve-env env "PATH=$PATH")' in run
    assert '"${as_root[@]}" "$FAKELET" "${words[@]}"' in run
    assert STEPS[run_index()]["env"]["FAKELET"] == "${{ steps.install.outputs.fakelet }}"


# -- the GitLab template, statically --------------------------------------------------------------------------

def test_gitlab_template_hidden_jobs_cache_and_artifacts() -> None:
    job = TEMPLATE[".fakelet"]
    assert set(TEMPLATE) == {".fakelet", ".fakelet-merge"}  # hidden: nothing runs until a job extends it
    variables = job["variables"]
    # GitLab caches inside the project directory only: fakelet is told where that is.
    assert variables["FAKELET_CACHE"] == "$CI_PROJECT_DIR/.fakelet-cache"
    assert job["cache"]["paths"] == [".fakelet-cache/"] and job["cache"]["when"] == "always"
    assert job["artifacts"]["when"] == "always" and job["artifacts"]["paths"] == ["$FAKELET_OUT/"]
    assert "$FAKELET_OUT/junit.xml" in job["artifacts"]["reports"]["junit"]
    merge = TEMPLATE[".fakelet-merge"]
    assert merge["extends"] == ".fakelet" and merge["when"] == "always"
    # Every FAKELET_ variable a script reads is one the template declares (a user sets only those).
    declared = set(variables) | set(merge["variables"])
    used = set(re.findall(r"\$\{?(FAKELET_[A-Z_]+)", TEMPLATE_TEXT))
    assert used - declared == set()


# -- the docs' examples ---------------------------------------------------------------------------------------

def action_uses(block: Any) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(job name, job, with:) of each step that uses the action, in a GitHub workflow block."""
    if not isinstance(block, dict) or "jobs" not in block:
        return []
    return [(name, job, step.get("with") or {}) for name, job in block["jobs"].items()
            for step in job.get("steps", []) if step.get("uses") == LOCAL_ACTION]


def test_docs_github_examples_use_the_action_as_it_is() -> None:
    inputs = set(ACTION["inputs"])
    found = 0
    for page in PAGES:
        text = page.read_text()
        assert "pip install -e" not in text and "sudo -E fakelet" not in text, page.name
        for block in yaml_blocks(page):
            for name, job, with_ in action_uses(block):
                found += 1
                assert set(with_) <= inputs, f"{page.name} {name}: {set(with_) - inputs}"
                matrix = job.get("strategy", {}).get("matrix", {})
                if matrix:  # each matrix job uploads under a name of its own, or the uploads collide
                    name_used = str(with_.get("upload-name", ""))
                    for key in matrix:
                        assert f"matrix.{key}" in name_used, f"{page.name} {name}: upload-name lacks matrix.{key}"
            if isinstance(block, dict) and "jobs" in block:
                for name, job in block["jobs"].items():
                    if job.get("needs"):  # a merge after shards runs after failed shards too
                        assert job.get("if") == "always()", f"{page.name} {name}"
    assert found >= 5


def test_docs_gitlab_examples_extend_the_template_with_its_variables() -> None:
    declared = set(TEMPLATE[".fakelet"]["variables"]) | set(TEMPLATE[".fakelet-merge"]["variables"])
    found = 0
    for page in PAGES:
        for block in yaml_blocks(page):
            if not isinstance(block, dict) or "include" not in block:
                continue
            assert block["include"] == [{"local": "ci/fakelet.gitlab-ci.yml"}]
            for name, job in block.items():
                if name == "include":
                    continue
                found += 1
                assert job["extends"] in (".fakelet", ".fakelet-merge"), name
                fakelet_vars = {k for k in job.get("variables", {}) if k.startswith("FAKELET_")}
                assert fakelet_vars <= declared, f"{page.name} {name}: {fakelet_vars - declared}"
                matrix = (job.get("parallel") or {}) if isinstance(job.get("parallel"), dict) else {}
                for row in matrix.get("matrix", []):  # every shard of every combination reports apart
                    out = job["variables"].get("FAKELET_OUT", "")
                    for key in row:
                        assert f"${key}" in out, f"{page.name} {name}: FAKELET_OUT lacks ${key}"
    assert found >= 4


# -- the run step and the GitLab script, with a stand-in fakelet ----------------------------------------------

def stand_in(directory: Path, code: int) -> Path:
    """A `fakelet` that records each call's argv (one file per call, NUL-separated) and exits `code`."""
    stub = directory / "fakelet"
    stub.write_text(f"#!/usr/bin/env bash\nn=$(ls {directory}/call-* 2>/dev/null | wc -l)\n"
                    f"printf '%s\\0' \"$@\" > {directory}/call-$n\nexit {code}\n")
    stub.chmod(0o755)
    return stub


def calls(directory: Path) -> list[list[str]]:
    return [p.read_bytes().decode().split("\0")[:-1] for p in sorted(directory.glob("call-*"))]


def run_step(tmp: Path, inputs: dict[str, str], code: int) -> tuple[ci_action_steps.Job, ci_action_steps.StepResult]:
    stubs = tmp / "stubs"
    stubs.mkdir()
    job = ci_action_steps.Job(tmp / "job", {name: str(spec.get("default", "")) for name, spec in
                                            ACTION["inputs"].items()} | inputs, tmp / "cache", tmp / "uploads")
    job.steps["install"] = {"outputs": {"fakelet": str(stand_in(stubs, code)), "python": sys.executable},
                            "outcome": "success"}
    return job, job.run_step(run_index() + 1, STEPS[run_index()], False)


@pytest.mark.skipif(os.geteuid() != 0, reason="as a user, the run step calls sudo")
@pytest.mark.parametrize(("code", "status"), [(0, "CONFORMANT"), (1, "NOT CONFORMANT"), (3, "INCOMPLETE"),
                                              (130, "INTERRUPTED"), (2, "ERROR")])
def test_run_step_records_fakelets_exit_code_and_status(tmp_path: Path, code: int, status: str) -> None:
    job, result = run_step(tmp_path, {"subject-file": "my plugin.yaml",
                                      "flags": "--require DP-HLT --plugin-arg '--x y' --shard 2/3"}, code)
    assert result.outcome == "success"  # the verdict is the last step's to give, not this one's
    assert job.steps["run"]["outputs"] == {"exit-code": str(code), "status": status}
    assert calls(tmp_path / "stubs") == [["run", "--subject-file", "my plugin.yaml", "--require", "DP-HLT",
                                          "--plugin-arg", "--x y", "--shard", "2/3", "--out", "fakelet-report"]]


@pytest.mark.skipif(os.geteuid() != 0, reason="as a user, the run step calls sudo")
def test_run_step_merge_expands_shard_patterns(tmp_path: Path) -> None:
    for n in (2, 1):
        (tmp_path / "job" / "workspace" / "shards" / f"shard-{n}").mkdir(parents=True)
    job, _ = run_step(tmp_path, {"command": "merge", "flags": "shards/*", "out": "merged"}, 1)
    assert calls(tmp_path / "stubs") == [["merge", "shards/shard-1", "shards/shard-2", "-o", "merged"]]
    assert job.steps["run"]["outputs"]["exit-code"] == "1"


def test_run_step_bad_flags_are_exit_2_without_running_fakelet(tmp_path: Path) -> None:
    job, result = run_step(tmp_path, {"flags": "--require 'DP-HLT"}, 0)
    assert result.outcome == "success" and job.steps["run"]["outputs"] == {"exit-code": "2", "status": "ERROR"}
    assert calls(tmp_path / "stubs") == []


def gitlab_script(tmp: Path, job: dict[str, Any], variables: dict[str, str], code: int) -> int:
    stubs = tmp / "stubs"
    stubs.mkdir(exist_ok=True)
    stand_in(stubs, code)
    env = {"PATH": f"{stubs}:/usr/bin:/bin", "HOME": str(tmp),
           **{k: str(v) for k, v in TEMPLATE[".fakelet"]["variables"].items()},
           **{k: str(v) for k, v in job.get("variables", {}).items()}, **variables}
    script = "set -eo pipefail\n" + "\n".join(job["script"])  # as GitLab's runner runs a job's script
    return subprocess.run(["bash", "-c", script], cwd=tmp, env=env, check=False).returncode


def test_gitlab_script_builds_the_command_and_exits_with_fakelets_code(tmp_path: Path) -> None:
    code = gitlab_script(tmp_path, TEMPLATE[".fakelet"],
                         {"FAKELET_SUBJECT_FILE": "my plugin.yaml", "FAKELET_SHARD": "2/3",
                          "FAKELET_FLAGS": "--require DP-HLT"}, 1)
    assert code == 1
    assert calls(tmp_path / "stubs") == [
        ["prebuild", "--subject-file", "my plugin.yaml"],
        ["run", "--subject-file", "my plugin.yaml", "--shard", "2/3", "--require", "DP-HLT", "--out",
         "fakelet-report"]]


def test_gitlab_merge_takes_every_shard_directory(tmp_path: Path) -> None:
    for n in (1, 2, 3):
        (tmp_path / f"fakelet-shard-{n}").mkdir()
    assert gitlab_script(tmp_path, {**TEMPLATE[".fakelet"], **TEMPLATE[".fakelet-merge"]}, {}, 0) == 0
    assert calls(tmp_path / "stubs") == [["merge", "fakelet-shard-1", "fakelet-shard-2", "fakelet-shard-3", "-o",
                                          "fakelet-merged"]]


# -- the whole action, from a fresh venv ----------------------------------------------------------------------

@pytest.mark.skipif(not WHEEL, reason="the action end to end: FAKELET_CI_ACTION_WHEEL=PATH_TO_WHEEL (about 2 min)")
def test_action_steps_end_to_end() -> None:
    proc = subprocess.run(["bash", str(ROOT / "tools" / "ci_action_steps.sh"), str(WHEEL)], capture_output=True,
                          text=True, timeout=900, check=False)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "ci_action_steps: every check held" in proc.stdout
