"""What a person writing a scenario uses (issue 24): `fakelet scenario vocabulary`, `fakelet scenario check`,
a run's templates rendered inside the sandbox, and the defects' descriptions in `fakelet subjects`. The
library's promised cases run through `--case all` in tests/test_scenarios.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.scenarios import manual
from harness.scenarios.check import check_file
from harness.scenarios.library import scenario_dir
from harness.scenarios.schema import INCONCLUSIVE, NOT_REPRODUCED
from harness.scenarios.vocabulary import (
    ACTIONS,
    CONDITION_SHAPES,
    CONDITIONS,
    DEVICE_OPS,
    KUBELET_OPS,
    PLUGIN_OPS,
    POD_RESOURCES_SHAPES,
    RESOURCE_SHAPE,
    SCRIPTS,
    STORIES,
)
from harness.spec.subjects import all_subjects

RUN_TIMEOUT_S = 600


def fakelet(*args: str, cwd: Path | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "harness.run.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd)


# -- fakelet subjects ------------------------------------------------------------------------------------


def test_every_defect_says_what_it_does():
    missing = [(s.name, d.name) for s in all_subjects() for d in s.defects.values() if not d.description.strip()]
    assert not missing, f"defects with no description in fixtures/subjects: {missing}"
    listed = fakelet("subjects").stdout
    assert "--defect stale-socket-crash" in listed
    assert "exits at start-up when a stale socket file is in its place" in listed


def test_the_python_reference_subjects_describe_their_defects_as_their_code_does():
    # The reference plugins' --defect help and the subject files say the same, so they cannot drift apart.
    from harness.reference.defects import DP_BENIGN, DP_DEFECTS, DP_HOSTILE
    from harness.reference.dra_defects import DRA_DEFECTS

    subjects = {s.name: s for s in all_subjects()}
    for name, table in (("reference-dp", DP_DEFECTS | DP_HOSTILE | DP_BENIGN), ("reference-dra", DRA_DEFECTS)):
        assert {d: subjects[name].defects[d].description for d in subjects[name].defects} == table, name


# -- fakelet scenario vocabulary ---------------------------------------------------------------------------


def test_the_vocabulary_documents_exactly_what_the_validator_takes():
    assert [e.name for e in manual.steps()] == list(ACTIONS)
    assert [e.name for e in manual.conditions()] == list(CONDITIONS)
    assert set(manual.OP_MEANING["kubelet"]) == set(KUBELET_OPS)
    assert set(manual.OP_MEANING["plugin"]) == set(PLUGIN_OPS)
    assert set(manual.OP_MEANING["device"]) == set(DEVICE_OPS)
    assert set(manual.OP_MEANING["script"]) == set(SCRIPTS)
    assert set(manual.OP_MEANING["story"]) == set(STORIES)
    keys = {(c, k) for c, shape in CONDITION_SHAPES.items() for k in shape}
    keys |= {("pod_resources", k) for shape in POD_RESOURCES_SHAPES.values() for k in shape}
    keys |= {(c, k) for c in ("capacity", "allocatable") for k in RESOURCE_SHAPE}
    keys |= {("held", "call")}  # vocabulary._call's one key
    assert set(manual.KEY_MEANING) == keys
    assert set(manual.OBSERVED) == set(CONDITIONS) and set(manual.CONDITION_MEANING) == set(CONDITIONS)
    documented = {(e.name, k.name) for e in manual.conditions() for k in e.keys}
    assert documented == keys


def test_scenario_vocabulary_prints_every_step_and_condition():
    whole = fakelet("scenario", "vocabulary")
    assert whole.returncode == 0, whole.stderr
    for name in (*ACTIONS, *CONDITIONS):
        assert f" {name}:  " in whole.stdout, name
    one = fakelet("scenario", "vocabulary", "calls").stdout
    assert "counted from the scenario's start" in one and "ListAndWatch" in one and "relay" in one
    page = fakelet("scenario", "vocabulary", "--format", "markdown").stdout
    assert page.startswith("# Scenario vocabulary") and "### `dialed`" in page and "| `plugin_instance` |" in page
    bad = fakelet("scenario", "vocabulary", "registred")
    assert bad.returncode == 2 and "known: kubelet, plugin" in bad.stderr and "Traceback" not in bad.stderr


# -- fakelet scenario check ------------------------------------------------------------------------------

EVERY_MISTAKE = """\
title: t
correct: c
bug: b
kind: device-plugin
cases:
  - {verdict: reproduced, defect: no-such-defect}
  - {verdict: not reproduced, subject: nope}
  - {verdict: not reproduced, kubelet_version: "1.99"}
  - {verdict: reproduced, subject: reference-dra}
steps:
  - kubelet: start
  - plugin: start
  - device: {fail: gpu-9}
  - device: {fail: "@7"}
  - device: {heat: "@0", to: .nan}
  - wait: {pod: {name: ghost, phase: Running}}
  - plugin: rolling-update
    args: ["--plugin-dir", "{plugins_dir}/{driver}"]
  - wait: {dialed: {socket: "{plugin_dir}/x.sock"}}
  - expect: {registred: true}
  - expect: {allocatable: all}
"""
EXPECTED = [
    ":6: cases[0].defect: 'no-such-defect' is not a defect of reference-dp",
    ":7: cases[1].subject: no bundled subject 'nope' for a device-plugin; known: ",
    ":8: cases[2].kubelet_version: '1.99': the fake kubelet imitates 1.32,",
    ":9: cases[3].subject: reference-dra is a dra; this scenario is for a device-plugin",
    ":13: steps[2].device.fail: no device 'gpu-9' in reference-dp's inventory; known: gpu-0",
    ":14: steps[3].device.fail: @7: reference-dp's inventory has 4 device(s)",
    ":15: steps[4].device.to: heat needs to: a temperature",
    ":16: steps[5].wait.pod.name: no pod 'ghost' was created before this step",
    ":18: steps[6].args[1]: unknown placeholder {plugins_dir}",
    ":19: steps[7].wait.dialed.socket: {plugin_dir} is never filled in here",
    ":20: steps[8].expect.registred: unknown condition",
]


def test_check_reports_every_problem_with_file_and_line(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text(EVERY_MISTAKE)
    _scenario, problems = check_file(path)
    assert len(problems) == len(EXPECTED), "\n".join(problems)
    for problem, expected in zip(problems, EXPECTED, strict=True):
        assert problem.startswith(str(path) + expected), (problem, expected)
    done = fakelet("scenario", "check", str(path), "dp-checkpoint-lost-reboot")
    assert done.returncode == 1 and done.stdout.count(str(path) + ":") == len(EXPECTED) + 1, done.stdout  # + total
    assert f"{path}: {len(EXPECTED)} problems" in done.stdout and "dp-checkpoint-lost-reboot.yaml: ok" in done.stdout


def test_run_refuses_a_file_with_problems_and_starts_nothing(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text(EVERY_MISTAKE)
    done = fakelet("scenario", "run", "--file", str(path), "--out", str(tmp_path / "out"))
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == len(EXPECTED), done.stderr
    assert all(line.startswith(f"fakelet: error: {path}:") for line in lines) and "Traceback" not in done.stderr
    assert not (tmp_path / "out").exists() and "scenario mine" not in done.stdout


@pytest.mark.parametrize("step", ["  - hold: .inf", "  - hold: .nan",
                                  "  - expect: {allocatable: all}\n    within: .nan",
                                  "  - device: {ecc: '@0', count: .inf}"])
def test_non_finite_numbers_are_refused(tmp_path, step):
    path = tmp_path / "nan.yaml"
    path.write_text(EVERY_MISTAKE.split("cases:")[0] + "steps:\n  - kubelet: start\n" + step +
                    "\n  - expect: {allocatable: all}\n")
    _scenario, problems = check_file(path)
    assert len(problems) == 1 and problems[0].startswith(f"{path}:"), problems
    assert ": steps[1]" in problems[0] and "not a finite number" in problems[0], problems


def test_every_bundled_scenario_passes_the_check():
    files = sorted(scenario_dir().glob("*.yaml"))
    done = fakelet("scenario", "check", *map(str, files))
    assert done.returncode == 0, done.stdout
    assert done.stdout.count(": ok: ") == len(files)


def test_case_selection_names_the_known_cases(tmp_path):
    done = fakelet("scenario", "run", "dp-plugin-restart-allocatable-zero", "--case", "nine",
                   "--out", str(tmp_path / "out"))
    assert done.returncode == 2 and "known: all, 1 (reference-dp), 2 (reference-dp/stale-socket-crash)" in done.stderr
    done = fakelet("scenario", "run", "dp-plugin-restart-allocatable-zero", "--case", "all", "--defect", "x",
                   "--out", str(tmp_path / "out"))
    assert done.returncode == 2 and "drop --defect" in done.stderr
    assert not (tmp_path / "out").exists()


# -- the sandbox -------------------------------------------------------------------------------------------

ROLLING_PATHS = """\
title: a rolling update whose new instance is told its paths
correct: the new instance serves under the sandbox's paths
bug: it does not
kind: {kind}
steps:
  - kubelet: start
  - plugin: start
  - wait: {ready}
  - plugin: rolling-update
    args: {args}
  - expect: {ready}
"""


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.mark.parametrize("kind", ["device-plugin", "dra"])
def test_path_arguments_render_inside_the_sandbox_and_nothing_lands_in_the_working_directory(tmp_path, kind):
    # kind: dra is the report: `{plugins_dir}/{driver}` reached the driver as text, and it made
    # ./{plugins_dir}/{driver}/next/ wherever fakelet was started.
    if kind == "dra":
        text = ROLLING_PATHS.format(kind="dra", ready="{registered: true, slices: {devices: {at_least: 1}}}",
                                    args='["--plugin-dir", "{plugins_dir}/{driver}/next"]')
    else:
        text = ROLLING_PATHS.format(kind="device-plugin", ready="{registered: true, allocatable: all}",
                                    args='["--socket-name", "fakelet-dp-next.sock", "--plugin-dir", "{plugin_dir}"]')
    work = tmp_path / "work"
    work.mkdir()
    (work / "paths.yaml").write_text(text)
    before = _tree(work)
    out = tmp_path / "out"
    # 1.37: the fake kubelet of 1.36 has kubernetes#121994, which a rolling update with surge reproduces.
    done = fakelet("scenario", "run", "--file", "paths.yaml", "--out", str(out), "--kubelet-version", "1.37",
                   cwd=work, timeout=RUN_TIMEOUT_S)
    report = json.loads((out / "report.json").read_text())
    outcome = report["facts"]["scenario"]["outcome"]
    assert _tree(work) == before, f"written outside the sandbox: {_tree(work) - before}"
    if outcome == INCONCLUSIVE and report["checks"][0].get("install"):
        pytest.skip(report["checks"][0]["detail"].splitlines()[0])
    log = "\n".join(report["checks"][0]["notes"])
    assert "{" not in log.split("rolling update:")[1].splitlines()[0], log
    if kind == "device-plugin":
        assert outcome == NOT_REPRODUCED and done.returncode == 0, done.stdout + done.stderr
