"""Writing a scenario file from the docs (issue 35): the scenario file reference page lists every key the loader
accepts and every step, option and condition the validator takes, each example on it is one the validator
accepts, `fakelet scenario show` reads a file as well as a bundled name, and a run on the fake kubelet's model of
a release says that it is only a model. The expectations are read off the code's own tables, so a key added to
the schema or the vocabulary and left off the page fails here."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import mkdocs_config

from harness.kubelet.release_model import BEHAVIOURS, behaviour_fields, behaviours, model_note
from harness.kubelet.versions import KUBELET_VERSIONS
from harness.run import scenariocli
from harness.run.scenariocli import fake_release_note
from harness.scenarios import fileformat, manual, schema
from harness.scenarios.check import DEFAULT_SUBJECT, ScenarioProblems, check_file
from harness.scenarios.library import scenario_dir
from harness.scenarios.runner import describe
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
from harness.spec.subjects import ProfileError, parse_yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

from docgen import scenario_file_page  # noqa: E402

RUN_TIMEOUT_S = 600


def fakelet(*args: str, cwd: Path | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "harness.run.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd)


@pytest.fixture(scope="module")
def page() -> str:
    return scenario_file_page.render()


def section(page: str, anchor: str) -> str:
    """The text under the heading with this anchor, up to the next heading of any level."""
    found = re.search(rf"^#+ .*\{{#{re.escape(anchor)}\}}\n(.*?)(?=^#)", page + "\n#", re.S | re.M)
    assert found, f"no section #{anchor} on the page"
    return found.group(1)


# -- the page ---------------------------------------------------------------------------------------------


def test_the_page_describes_every_key_the_loader_accepts(page):
    for fields, keys, prefix in ((schema.TOP_FIELDS, schema.TOP_KEYS, "key-"),
                                 (schema.CASE_FIELDS, schema.CASE_KEYS, "case-"),
                                 (schema.REAL_FIELDS, schema.REAL_KEYS, "real-")):
        assert set(fields) == keys  # the loader accepts exactly the described keys
        for key in keys:
            text = section(page, prefix + key.replace("_", "-"))
            assert fields[key].meaning[1:] in text and f"- takes: {fields[key].takes}" in text, key
            assert ("**required**" in text) == (key in schema.REQUIRED or fields[key].required), key
            assert f"```yaml\n{fields[key].example}\n```" in text, key
    assert set(schema.REQUIRED) == {"title", "correct", "bug", "kind", "steps"}


def test_the_page_describes_every_step_option_and_condition_the_validator_takes(page):
    ops = {"kubelet": KUBELET_OPS, "plugin": PLUGIN_OPS, "device": DEVICE_OPS, "script": tuple(SCRIPTS),
           "story": STORIES}
    for action in ACTIONS:
        text = section(page, f"step-{action}")
        for op in ops.get(action, ()):
            assert f"| `{op}` |" in text, (action, op)
        taken = fileformat.accepted(action)
        for key in taken.options:
            assert f"| `{key}` | {fileformat.BESIDE} |" in text, (action, key)
        for key in taken.inside:
            assert f"| `{key}` | {fileformat.INSIDE} |" in text, (action, key)
        assert "```yaml\n- " + action + ":" in text, f"no example of {action}"
    shapes = {**CONDITION_SHAPES, "pod_resources": {k: v for s in POD_RESOURCES_SHAPES.values() for k, v in s.items()},
              "capacity": RESOURCE_SHAPE, "allocatable": RESOURCE_SHAPE, "held": {"call": str}}
    for condition in CONDITIONS:
        text = section(page, f"condition-{condition}")
        for key in shapes.get(condition, {}):
            assert f"| `{key}` |" in text, (condition, key)
        assert re.search(rf"```yaml\n- (wait|expect): \{{{condition}:", text), f"no example of {condition}"


def test_the_keys_a_checker_takes_are_found_in_its_code():
    # What the walk of vocabulary.py's checkers finds for the steps whose keys are spelt out in code; a key a
    # checker takes from a table by a variable (a device op) is manual.py's to list.
    assert {"checkpoint"} <= fileformat.accepted("kubelet").options
    assert {"during", "args"} <= fileformat.accepted("plugin").options
    assert {"within", "glimpse"} <= fileformat.accepted("wait").options
    assert {"within", "throughout", "glimpse"} <= fileformat.accepted("expect").options
    assert {"create", "devices", "delete"} <= fileformat.accepted("pod").inside
    assert {"call"} <= fileformat.accepted("hold").inside and not fileformat.accepted("hold").options
    assert {"toleration_seconds"} <= fileformat.accepted("story").options
    assert not fileformat.accepted("pod").options and not fileformat.accepted("wait").inside
    assert not fileformat.accepted("check").options and not fileformat.accepted("check").inside


def test_manual_describes_every_key_the_validator_takes():
    # The page lists a key manual.py has not described yet ("not described yet"); this holds manual.py to it.
    assert fileformat.undescribed() == {}, "describe these in harness/scenarios/manual.py's step entries"


def test_every_example_is_one_the_validator_accepts(tmp_path):
    head = "title: t\ncorrect: c\nbug: b\nkind: {kind}\nsteps:\n"
    for entry in manual.entries():
        example = fileformat.example(entry)
        assert example, f"{entry.what} {entry.name} has no example in harness/scenarios/fileformat.py"
        kind = fileformat.example_kind(entry.name)
        steps = "\n".join("  " + line for line in example.splitlines())
        # A pod the example names, created first (a schema check does not look; the example still reads right).
        text = head.format(kind=kind) + "  - pod: {create: workload}\n" + steps + "\n  - expect: {registered: true}\n"
        scenario, problems = schema.examine(parse_yaml(text, "example.yaml"), Path("example.yaml"))
        assert not problems and scenario is not None, (entry.what, entry.name, problems)
    path = tmp_path / "whole.yaml"
    path.write_text(fileformat.EXAMPLE_FILE)
    scenario, problems = check_file(path)
    assert not problems and scenario is not None, problems
    assert {k for k in schema.TOP_KEYS if k in yaml.safe_load(fileformat.EXAMPLE_FILE)} == schema.TOP_KEYS - {"defect"}
    for fields in (schema.TOP_FIELDS, schema.CASE_FIELDS, schema.REAL_FIELDS):
        for key, doc in fields.items():
            assert key in yaml.safe_load(doc.example), key


def test_the_subject_default_names_the_reference_subjects():
    assert all(name in schema.TOP_FIELDS["subject"].default for name in DEFAULT_SUBJECT.values())


def test_the_page_names_the_reference_subjects_sockets_and_the_dra_eviction(page):
    from harness.reference.dra_driver import socket_names
    from harness.spec.subjects import load_subject

    dp, dra = load_subject("reference-dp"), load_subject("reference-dra")
    dp_text, dra_text = section(page, "reference-dp"), section(page, "reference-dra")
    assert f"`{dp.socket}`" in dp_text and "`kubelet.sock`" in dp_text and "--socket-name" in dp_text
    for name in (*socket_names(dra.driver), *socket_names(dra.driver, "UID")):
        assert f"`{name}`" in dra_text, name
    assert "--pod-uid" in dra_text and "SHA-256" in dra_text
    assert "under a DRA pod evicts it" in dra_text and f"{dra.driver}/unhealthy:NoExecute" in dra_text


def test_the_page_is_in_the_nav_and_linked_from_the_scenarios_page():
    nav = mkdocs_config(ROOT / "mkdocs.yml")["nav"]
    reference = next(item["Reference"] for item in nav if isinstance(item, dict) and "Reference" in item)
    assert {"Scenario file": "reference/scenario-file.md"} in reference
    assert "(reference/scenario-file.md)" in (ROOT / "docs" / "scenarios.md").read_text()
    import gen_docs

    assert gen_docs.PAGES["scenario-file.md"] is scenario_file_page.render


# -- the fake kubelet's releases ---------------------------------------------------------------------------


def test_every_behaviour_of_a_release_model_is_described(page):
    assert set(BEHAVIOURS) == set(behaviour_fields()), "describe each KubeletVersion field in release_model.py"
    table = section(page, "fake-releases")
    for behaviour in BEHAVIOURS.values():
        assert f"| {behaviour.title} |" in table
    assert all(f"| {name}" in table for name in KUBELET_VERSIONS)


def test_the_model_note_lists_what_the_subject_meets_and_only_where_a_release_was_asked_for():
    v133 = KUBELET_VERSIONS["1.33"]
    dp = model_note(v133, "device-plugin")
    assert "only through this named behaviour" in dp and "kubernetes#121994" in dp and "DRA services" not in dp
    assert "not about a real 1.33 kubelet" in dp
    dra = model_note(v133, "dra")
    assert all(line in dra for line in behaviours(v133, "dra")) and "device-plugin clients" not in dra
    assert fake_release_note("fake", "1.33", v133, "dra") == dra
    assert fake_release_note("real", "1.33", v133, "dra") == ""
    assert fake_release_note("fake", "default", KUBELET_VERSIONS["1.36"], "dra") == ""
    changed = dataclasses.replace(v133, dp_endpoints_per_socket=True)
    assert "kubernetes#121994 fixed" in model_note(changed, "device-plugin")


# -- fakelet scenario show FILE ----------------------------------------------------------------------------


def test_scenario_show_takes_a_file_from_another_directory_and_shows_it_as_a_bundled_one(tmp_path, monkeypatch):
    name = "dp-plugin-restart-allocatable-zero"
    (tmp_path / "mine").mkdir()
    shutil.copy(scenario_dir() / f"{name}.yaml", tmp_path / "mine" / f"{name}.yaml")
    by_name = fakelet("scenario", "show", name, cwd=tmp_path)
    by_path = fakelet("scenario", "show", f"mine/{name}.yaml", cwd=tmp_path)
    assert by_path.returncode == 0 and by_name.returncode == 0, by_path.stderr + by_name.stderr
    assert by_path.stdout == by_name.stdout and by_path.stdout.startswith(f"{name}: ")
    # A file of one's own, by a path relative to the working directory (in this process: each fakelet takes
    # seconds to start on a loaded machine).
    (tmp_path / "mine" / "own.yml").write_text(fileformat.EXAMPLE_FILE)
    monkeypatch.chdir(tmp_path)
    shown = "\n".join(describe(scenariocli.shown("mine/own.yml")))
    assert shown.startswith("own: allocatable stuck at 0") and "real:reference-dp@1.37" in shown


def test_scenario_show_of_a_missing_file_is_one_line_and_exit_2(tmp_path, monkeypatch):
    (tmp_path / "mine").mkdir()
    done = fakelet("scenario", "show", "mine/missing.yaml", cwd=tmp_path)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == "fakelet: error: mine/missing.yaml: no such file\n", done.stderr
    monkeypatch.chdir(tmp_path)
    for target, says in (("missing.yml", "missing.yml: no such file"), ("mine", "mine: not a file"),
                         ("no-such-scenario", "no-such-scenario: no such file, and no bundled scenario")):
        with pytest.raises(ProfileError) as err:
            scenariocli.shown(target)
        assert str(err.value).startswith(says) and "\n" not in str(err.value), err.value


def test_scenario_show_of_a_file_with_problems_lists_them(tmp_path, monkeypatch):
    (tmp_path / "bad.yaml").write_text("title: t\ncorrect: c\nbug: b\nkind: device-plugin\nsteps:\n"
                                       "  - kubelet: start\n  - expect: {registred: true}\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ScenarioProblems) as err:
        scenariocli.shown("bad.yaml")
    assert err.value.problems[0].startswith("bad.yaml:7: steps[1].expect.registred: unknown condition")


# -- a run on the fake kubelet's model of a release ---------------------------------------------------------

MODELLED = """\
title: the plugin registers
correct: it registers
bug: it does not
kind: device-plugin
cases:
  - {kubelet_version: "1.33", verdict: not reproduced}
steps:
  - kubelet: start
  - plugin: start
  - expect: {registered: true}
"""


def test_a_case_on_the_fake_kubelets_model_of_a_release_says_so_in_narration_and_report(tmp_path):
    (tmp_path / "modelled.yaml").write_text(MODELLED)
    out = tmp_path / "out"
    done = fakelet("scenario", "run", "--file", "modelled.yaml", "--case", "all", "--out", str(out), cwd=tmp_path,
                   timeout=RUN_TIMEOUT_S)
    assert done.returncode == 0, done.stdout + done.stderr
    note = model_note(KUBELET_VERSIONS["1.33"], "device-plugin")
    start = done.stdout.split("== case 1: reference-dp@1.33")[1]
    assert start.splitlines()[1].endswith("on the fake kubelet's model of 1.33 ()"), start
    assert start.splitlines()[2].strip() == note  # before the first step is narrated
    assert "not a verdict on a real 1.33 kubelet" in done.stdout
    report = next((out / "cases").glob("01-*"))
    assert json.loads((report / "report.json").read_text())["facts"]["fake kubelet release"] == note
    assert f"- fake kubelet release: {note}" in (report / "summary.md").read_text()
    assert "reference-dp@1.33 ran the fake's model of 1.33, not a real 1.33 kubelet" in (out / "cases.md").read_text()
