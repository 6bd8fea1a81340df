"""`fakelet subject check`: every problem of every subject file, where it is, and the exit code."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.run import commands, subjectcli

BAD = """\
name: my plugin
kind: device-plugin
comand: ["x"]
devices:
  expected_count: -1
  idz: opaque
env:
  1BAD: x
backend:
  skin: nope
rolling_update: {args: ["--x"]}
"""

PLACEHOLDERS = """\
name: p
kind: device-plugin
resource: vendor.example.com/gpu
command: ["{python}", "{nope}", "{plugin_dir", "{dp_devices}"]
env: {A: "{also_nope}"}
"""

GOOD = """\
name: mine
kind: device-plugin
resource: vendor.example.com/gpu
command: ["{python}", "plugin.py", "--dir", "{plugin_dir}"]
"""


def check(capsys: pytest.CaptureFixture[str], *targets: str) -> tuple[int, list[str]]:
    code = commands.main(["subject", "check", *targets])
    return code, capsys.readouterr().out.splitlines()


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_every_schema_and_rule_problem_is_reported_with_its_line(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    bad = write(tmp_path, "bad.yaml", BAD)
    code, out = check(capsys, bad)
    assert code == subjectcli.EXIT_INVALID == 2
    expected = [f"{bad}:1: name: must be letters", f"{bad}:3: comand: unknown field; did you mean 'command'?",
                f"{bad}:5: devices.expected_count: must not be negative",
                f"{bad}:6: devices.idz: unknown field; did you mean 'ids'?", f"{bad}:8: env.1BAD: key must be",
                f"{bad}:10: backend.skin: 'nope' is not one of", f"{bad}:9: backend: missing required key 'inventory'",
                f"{bad}: missing required key 'resource'", f"{bad}:11: rolling_update: is for kind dra"]
    for want in expected:
        assert any(line.startswith(want) for line in out), (want, out)
    assert out[-1] == f"{bad}: {len(out) - 1} problems"


def test_every_bad_placeholder_is_reported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, "ph.yaml", PLACEHOLDERS)
    code, out = check(capsys, path)
    assert code == 2
    assert [line.split(": ")[0] + ": " + line.split(": ")[1] for line in out[:-1]] == [
        f"{path}:4: command[1]", f"{path}:4: command[2]", f"{path}:4: command[3]", f"{path}:5: env.A"]
    assert "{nope}" in out[0] and "literal braces" in out[1] and "{dp_devices}" in out[2]
    assert out[-1] == f"{path}: 4 problems"


def test_valid_files_and_bundled_names_exit_0(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = write(tmp_path, "good.yaml", GOOD)
    code, out = check(capsys, good, "reference-dp")
    assert code == subjectcli.EXIT_VALID == 0
    assert out[0] == f"{good}: ok: device-plugin mine, launcher process, resource vendor.example.com/gpu"
    assert out[1].endswith("reference-dp.yaml: ok: device-plugin reference-dp, launcher process, "
                           "resource fakelet.example.com/gpu")


def test_one_bad_file_among_good_ones_fails_the_lot_and_each_is_named(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    good = write(tmp_path, "good.yaml", GOOD)
    missing = str(tmp_path / "missing.yaml")
    not_yaml = write(tmp_path, "broken.yaml", "name: [unclosed\n")
    code, out = check(capsys, good, missing, "no-such-subject", not_yaml)
    assert code == 2
    assert out[0].startswith(f"{good}: ok")
    assert f"{missing}: no such file" in out
    assert any(line.startswith("no-such-subject: no such file, and no bundled subject") for line in out)
    assert any(line.startswith(f"{not_yaml}:") and "not valid YAML" in line for line in out)


def test_an_unknown_inventory_is_reported_once_the_schema_holds(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, "inv.yaml", GOOD + "backend: {inventory: no-such-inventory}\n")
    code, out = check(capsys, path)
    assert code == 2
    assert out[0].startswith(f"{path}:5: backend.inventory: no inventory 'no-such-inventory'")


def test_a_file_that_is_not_a_mapping_is_one_problem(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, "list.yaml", "- a\n- b\n")
    code, out = check(capsys, path)
    assert code == 2
    assert out == [f"{path}: a subject file must be a mapping of fields, got list", f"{path}: 1 problem"]
