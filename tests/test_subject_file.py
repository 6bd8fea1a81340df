"""Subject files of the user's own (`--subject-file`), the one-off subject flags, and the run config.

Bad input is exit 2 with one line naming the file, line and field (or the
flag), before anything starts; a good file runs; the run's description
survives the trip to the pytest process whole (`--fakelet-config`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness.config.runconfig import Overrides, RunConfig
from harness.run.pytest_plugin import OPTION_DEFAULTS, run_from_options
from harness.spec.profiles import FAST
from harness.spec.subjects import (
    DP_PLACEHOLDERS,
    DRA_PLACEHOLDERS,
    MAX_YAML_BYTES,
    ProfileError,
    SubjectSpec,
    all_subjects,
    fixtures_dir,
    load_subject_file,
    parse_yaml,
)
from harness.world.draenv import DRAEnv
from harness.world.env import DPEnv

RUN_TIMEOUT_S = 300
BAD_INPUT_TIMEOUT_S = 60
REFERENCE_DP_CMD = ("{python} -m harness.reference.device_plugin --plugin-dir {plugin_dir} "
                    "--kubelet-socket {kubelet_socket} --resource {resource} --sysfs-root {sysfs_root} "
                    "--dev-dir {dev_dir}")
REFERENCE_DP_COMMAND = ["{python}", "-m", "harness.reference.device_plugin", "--plugin-dir", "{plugin_dir}",
                        "--kubelet-socket", "{kubelet_socket}", "--resource", "{resource}",
                        "--sysfs-root", "{sysfs_root}", "--dev-dir", "{dev_dir}"]
GOOD = {"name": "my-plugin", "kind": "device-plugin", "resource": "fakelet.example.com/gpu",
        "command": REFERENCE_DP_COMMAND, "backend": {"inventory": "hw/my-inventory.yaml", "observes": ["health"]}}


def fakelet(tmp: Path, *args: str, timeout: float = RUN_TIMEOUT_S,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "harness.run.cli", *args], capture_output=True, text=True,
                          env=dict(os.environ, TMPDIR=str(tmp), **(env or {})), timeout=timeout)


def fakelet_entries(tmp: Path) -> list[str]:
    return sorted(p.name for p in tmp.glob("fakelet-*"))


def subject_dir(tmp_path: Path) -> Path:
    """A directory with an inventory next to where subject files go (relative paths resolve from there)."""
    (tmp_path / "hw").mkdir(exist_ok=True)
    shutil.copyfile(fixtures_dir() / "inventories" / "basic.yaml", tmp_path / "hw" / "my-inventory.yaml")
    return tmp_path


def write_subject(tmp_path: Path, text: str, name: str = "my.yaml") -> Path:
    path = subject_dir(tmp_path) / name
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


def good_yaml(**changes: object) -> str:
    doc = {**GOOD, **changes}
    return json.dumps({k: v for k, v in doc.items() if v is not None}, indent=1)  # JSON is YAML


# -- bad subject files: file:line: field: message, exit 2, nothing started ---------------------------

DP_HEAD = """
name: my-plugin
kind: device-plugin
resource: fakelet.example.com/gpu
command: ["{python}", "-m", "harness.reference.device_plugin", "--plugin-dir", "{plugin_dir}"]
"""

BAD_FILES = [
    ("wrong-type", DP_HEAD + "devices: text\n", "my.yaml:5: devices: must be a mapping, got str"),
    ("unknown-key", DP_HEAD + "comand: [x]\n", "my.yaml:5: comand: unknown field; did you mean 'command'?"),
    ("bad-choice", DP_HEAD.replace("kind: device-plugin", "kind: plugin"),
     "my.yaml:2: kind: 'plugin' is not one of device-plugin, dra"),
    ("empty-command", DP_HEAD.replace('command: ["{python}", "-m", "harness.reference.device_plugin", '
                                      '"--plugin-dir", "{plugin_dir}"]', "command: []"),
     "my.yaml:4: command: must not be empty"),
    ("env-int", DP_HEAD + "env:\n  FOO: 1\n", "my.yaml:6: env.FOO: must be a string, got int"),
    ("env-key", DP_HEAD + "env:\n  1BAD: x\n", "my.yaml:6: env.1BAD: key must be an environment variable name"),
    ("ids", DP_HEAD + "devices:\n  ids: hashed\n", "my.yaml:6: devices.ids: 'hashed' is not one of opaque, inventory"),
    ("nested-unknown", DP_HEAD + "devices:\n  expected_idz: [a]\n",
     "my.yaml:6: devices.expected_idz: unknown field; did you mean 'expected_ids'?"),
    ("backend-missing", DP_HEAD + "backend:\n  skin: neutral\n",
     "my.yaml:5: backend: missing required key 'inventory'"),
    ("backend-skin", DP_HEAD + "backend:\n  inventory: hw/my-inventory.yaml\n  skin: ntsc\n",
     "my.yaml:7: backend.skin: 'ntsc' is not one of neutral, drm"),
    ("no-inventory", DP_HEAD + "backend:\n  inventory: nope.yaml\n", "my.yaml:6: backend.inventory: no inventory"),
    ("thermal", DP_HEAD + "backend:\n  inventory: hw/my-inventory.yaml\n  thermal: {threshold_c: hot}\n",
     "my.yaml:7: backend.thermal.threshold_c: must be a number, got str"),
    ("poll", DP_HEAD + "backend:\n  inventory: hw/my-inventory.yaml\n  poll_s: 0\n",
     "my.yaml:7: backend.poll_s: must be greater than 0"),
    ("private-dirs", DP_HEAD + "private_dirs: [/tmp]\n", "my.yaml:5: private_dirs: needs launcher: mount-namespace"),
    ("relative-private-dir", DP_HEAD + "launcher: mount-namespace\nprivate_dirs: [tmp]\n",
     "my.yaml:6: private_dirs[0]: must be an absolute path"),
    ("missing-resource", DP_HEAD.replace("resource: fakelet.example.com/gpu\n", ""),
     "my.yaml: missing required key 'resource'"),
    ("bad-resource", DP_HEAD.replace("fakelet.example.com/gpu", "gpu"),
     "my.yaml:3: resource: must be an extended resource name"),
    ("dra-resource", DP_HEAD.replace("kind: device-plugin", "kind: dra") + "driver: gpu.example.com\n",
     "my.yaml:3: resource: a DRA subject names its driver, not a resource"),
    ("defect-kills", DP_HEAD + "defects:\n  slow: {description: x}\n",
     "my.yaml:6: defects.slow: missing required key 'kills'"),
    ("duplicate", DP_HEAD + "name: again\n", "my.yaml:1: name: given twice (again at line 5)"),
    ("not-a-mapping", "- a\n- b\n", "my.yaml: a subject file must be a mapping of fields, got list"),
    ("syntax", DP_HEAD + "env: {FOO: [}\n", "my.yaml:5: not valid YAML"),
    ("unknown-placeholder", DP_HEAD + 'defect_args: ["--defect", "{defekt}"]\n',
     "my.yaml:5: defect_args[1]: unknown placeholder {defekt}"),
    ("unavailable-placeholder", DP_HEAD + 'env:\n  ROOT: "{sysfs_root}"\n',
     "my.yaml:6: env.ROOT: {sysfs_root} in '{sysfs_root}' is unavailable: the subject has no fake device backend"),
    ("bin-unavailable", DP_HEAD.replace('["{python}", "-m"', '["{bin}", "-m"'),
     "my.yaml:4: command[0]: {bin} in '{bin}' is unavailable: the subject has no build and no --binary"),
    ("not-executable", DP_HEAD.replace('["{python}", "-m"', '["/nonexistent/plugin", "-m"'),
     "my.yaml:4: command[0]: '/nonexistent/plugin' is not an executable file"),
    ("device-map", DP_HEAD + "backend: {inventory: hw/my-inventory.yaml}\ndevices:\n  map: {card0: gpu-9}\n",
     "my.yaml:7: devices.map.card0: no device 'gpu-9' in the inventory"),
    ("pass-env-unset", DP_HEAD + "pass_env: [FAKELET_TEST_SURELY_UNSET]\n",
     "my.yaml:5: pass_env: FAKELET_TEST_SURELY_UNSET: not set in fakelet's environment"),
    ("billion-laughs", 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n' + "".join(
        f"{c}: &{c} [{', '.join(['*' + p] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi", strict=True)),
     "refused: aliases expand to more than 10000 nodes"),
    ("many-aliases", "x: &x 1\nl: [" + ", ".join(["*x"] * 101) + "]\n", "my.yaml:2: refused: more than 100 aliases"),
    ("deep", "a: " + "[" * 60 + "]" * 60 + "\n", "my.yaml:1: refused: nested deeper than 50 levels"),
]


@pytest.mark.parametrize(("text", "message"), [(t, m) for _, t, m in BAD_FILES], ids=[n for n, _, _ in BAD_FILES])
def test_bad_subject_file_is_one_clear_line(tmp: Path, tmp_path: Path, text: str, message: str) -> None:
    path = write_subject(tmp_path, text)
    proc = fakelet(tmp, "run", "--subject-file", str(path), "--out", str(tmp_path / "out"),
                   timeout=BAD_INPUT_TIMEOUT_S)
    assert proc.returncode == 2, proc
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert f"{tmp_path}/{message}" in lines[0] or message in lines[0], lines[0]
    assert fakelet_entries(tmp) == [] and not (tmp_path / "out").exists()


def test_huge_subject_file_is_refused_unread(tmp: Path, tmp_path: Path) -> None:
    path = tmp_path / "huge.yaml"
    path.write_text("# padding\n" * (MAX_YAML_BYTES // 10 + 1))
    proc = fakelet(tmp, "run", "--subject-file", str(path), timeout=BAD_INPUT_TIMEOUT_S)
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"fakelet: error: {path}: larger than 1 MiB; subject and inventory files are " \
                                  "small YAML documents"
    assert fakelet_entries(tmp) == []


def test_missing_subject_file(tmp: Path, tmp_path: Path) -> None:
    proc = fakelet(tmp, "run", "--subject-file", str(tmp_path / "nope.yaml"), timeout=BAD_INPUT_TIMEOUT_S)
    assert proc.returncode == 2
    assert f"{tmp_path}/nope.yaml: cannot read: No such file or directory" in proc.stderr
    assert fakelet_entries(tmp) == []


def test_billion_laughs_is_refused_at_once() -> None:
    text = 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n' + "".join(
        f"{c}: &{c} [{', '.join(['*' + p] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi", strict=True))
    with pytest.raises(ProfileError, match="aliases expand to more than"):
        parse_yaml(text, "laughs.yaml")


def test_a_few_aliases_are_fine() -> None:
    doc = parse_yaml("base: &b [x, y]\none: *b\ntwo: *b\n", "ok.yaml")
    assert doc.data == {"base": ["x", "y"], "one": ["x", "y"], "two": ["x", "y"]}
    assert doc.data["one"] is not doc.data["two"]  # expanded copies: nothing downstream can blow up
    assert doc.lines["two"] == 3


@pytest.mark.parametrize(("flags", "message"), [
    (["--resource", "example.com/x"], "--resource applies to --plugin-cmd and --image only; --subject-file"),
    (["--driver", "x.example.com"], "--driver applies to --plugin-cmd"),
    (["--kind", "dra"], "--kind applies to --plugin-cmd"),
    (["--mount-namespace"], "--mount-namespace applies to --plugin-cmd"),
    (["--subject", "reference-dp"], "give either --subject or --subject-file, not both"),
    (["--plugin-cmd", "/bin/true"], "give either --subject-file or --plugin-cmd, not both"),
])
def test_flags_that_do_not_apply_to_a_subject_file(tmp: Path, tmp_path: Path, flags: list[str], message: str) -> None:
    path = write_subject(tmp_path, good_yaml())
    proc = fakelet(tmp, "run", "--subject-file", str(path), *flags, timeout=BAD_INPUT_TIMEOUT_S)
    assert proc.returncode == 2, proc
    assert len(proc.stderr.strip().splitlines()) == 1 and message in proc.stderr, proc.stderr
    assert fakelet_entries(tmp) == []


# -- the schema and the bundled subjects ---------------------------------------------------------------


def test_bundled_subjects_load_and_survive_serialization() -> None:
    subjects = all_subjects()
    assert {s.name for s in subjects} >= {"reference-dp", "reference-dra"}
    for spec in subjects:
        assert SubjectSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec
        if spec.backend:
            assert Path(spec.backend["inventory"]).is_absolute() and Path(spec.backend["inventory"]).is_file()


def test_relative_inventory_resolves_from_the_file_then_fixtures(tmp_path: Path) -> None:
    own = load_subject_file(write_subject(tmp_path, good_yaml()))
    assert own.backend == {"inventory": str(tmp_path / "hw" / "my-inventory.yaml"), "skin": "neutral"}
    assert own.observes == ["health"] and own.field_lines["backend.inventory"] > 1
    bundled = load_subject_file(write_subject(tmp_path, good_yaml(backend={"inventory": "inventories/basic.yaml"}),
                                              "bundled.yaml"))
    assert bundled.backend is not None
    assert bundled.backend["inventory"] == str((fixtures_dir() / "inventories" / "basic.yaml").resolve())


def test_new_schema_fields(tmp_path: Path) -> None:
    path = write_subject(tmp_path, good_yaml(pass_env=["HOME"], devices={"ids": "opaque", "map": {"card0": "gpu-0"}}))
    spec = load_subject_file(path)
    assert spec.pass_env == ["HOME"] and spec.opaque_ids and spec.device_map == {"card0": "gpu-0"}
    polled = load_subject_file(write_subject(tmp_path, good_yaml(backend={
        "inventory": "inventories/basic.yaml", "poll_s": 5, "thermal": {"threshold_c": 100}}), "polled.yaml"))
    assert polled.poll_s == 5.0 and polled.thermal == (100.0, 5.0)
    assert SubjectSpec.from_dict(polled.to_dict()).poll_s == 5.0


def test_placeholder_sets_match_the_environments() -> None:
    """subjects.PLACEHOLDERS is what DPEnv and DRAEnv fill in; the up-front check depends on it."""
    dp = SubjectSpec(name="t", kind="device-plugin", command=["/bin/true"], resource="example.com/t")
    env = DPEnv(dp, FAST)
    try:
        assert set(env._placeholders()) == set(DP_PLACEHOLDERS)
    finally:
        env.close()
    dra = SubjectSpec(name="t", kind="dra", command=["/bin/true"], resource="t.example.com", driver="t.example.com")
    denv = DRAEnv(dra, FAST)
    try:
        assert set(denv._placeholders()) == set(DRA_PLACEHOLDERS)
    finally:
        denv.close()


# -- one-off flags and the run config ---------------------------------------------------------------------


def test_plugin_cmd_gets_the_default_backend_and_python_first_word() -> None:
    run = RunConfig.build(plugin_cmd=REFERENCE_DP_CMD, resource="fakelet.example.com/gpu")
    assert run.spec.backend is not None and run.spec.backend["skin"] == "neutral"
    assert run.spec.backend["inventory"].endswith("fixtures/inventories/basic.yaml")
    assert run.spec.observes == [] and not run.spec.inventory_expected


def test_one_off_flags_change_the_subject() -> None:
    run = RunConfig.build(plugin_cmd=REFERENCE_DP_CMD + " --extra {inventory}", resource="fakelet.example.com/gpu",
                          mount_namespace=True, overrides=Overrides(
                              inventory="gpus-seed7", skin="drm", env=["A={resource}", "B=x=y"], pass_env=["HOME"],
                              private_dirs=["/tmp"], device_ids="opaque", observes=["health", "hotplug"]))
    spec = run.spec
    assert spec.backend == {"inventory": str(fixtures_dir().resolve() / "inventories" / "gpus-seed7.yaml"),
                            "skin": "drm"}
    assert spec.env == {"A": "{resource}", "B": "x=y"} and spec.pass_env == ["HOME"]
    assert spec.private_dirs == ["/tmp"] and spec.opaque_ids and spec.inventory_expected
    assert spec.observes == ["health", "hotplug"] and spec.observes_from == "--observes"


def test_subject_keeps_its_backend_under_a_skin_change() -> None:
    spec = RunConfig.build(subject="reference-dp", overrides=Overrides(skin="drm")).spec
    assert spec.backend is not None and spec.backend["skin"] == "drm"
    assert spec.backend["inventory"].endswith("inventories/basic.yaml")
    assert spec.observes == ["health", "temperature", "hotplug"]
    assert re.fullmatch(r".*reference-dp\.yaml:\d+: backend\.observes", spec.observes_from), spec.observes_from


def test_a_subject_that_declares_nothing_leaves_observes_to_inference() -> None:
    """Defect 8 of issue 39: only a subject that declares nothing may be held to what fakelet infers."""
    spec = RunConfig.build(subject="reference-nvml").spec
    assert spec.observes == [] and spec.observes_from == ""


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"plugin_cmd": "  "}, "--plugin-cmd is empty"),
    ({"plugin_cmd": "{python} {nope}", "resource": "example.com/x"}, "--plugin-cmd: unknown placeholder {nope}"),
    ({"plugin_cmd": "{python} x", "resource": "kubernetes.io/x"}, "not an extended resource name"),
    ({"plugin_cmd": "{python} x", "kind": "dra", "driver": "Not_A_Name"}, "--driver 'Not_A_Name': not a DNS-1123"),
    ({"plugin_cmd": "{python} {kubeconfig}", "resource": "example.com/x"}, "unknown placeholder {kubeconfig}"),
    ({"subject": "sample-device-plugin", "overrides": Overrides(env=["X={inventory}"])},
     "--env X: {inventory} in '{inventory}' is unavailable: the subject has no inventory"),
    ({"subject": "reference-dp", "overrides": Overrides(env=["X={{y}"])}, "--env X: Single '}'"),
    ({"subject": "reference-dp", "overrides": Overrides(pass_env=["1X"])}, "--pass-env '1X': not an environment"),
    ({"subject": "reference-dp", "overrides": Overrides(observes=["smell"])}, "--observes smell: choose from"),
    ({"subject": "reference-dp", "overrides": Overrides(device_ids="hash")}, "--device-ids 'hash'"),
    ({"subject": "reference-dp", "overrides": Overrides(private_dirs=["/tmp"])}, "--private-dir needs the mount"),
    ({"plugin_cmd": "{python} x", "resource": "example.com/x", "mount_namespace": True,
      "overrides": Overrides(private_dirs=["tmp"])}, "--private-dir 'tmp': must be an absolute path"),
])
def test_bad_run_inputs(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ProfileError) as err:
        RunConfig.build(**kwargs)  # type: ignore[arg-type]
    assert message in str(err.value)


def test_env_and_pass_env_reach_the_plugin_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKELET_TEST_TOKEN", "s3cret")
    run = RunConfig.build(plugin_cmd=REFERENCE_DP_CMD, resource="fakelet.example.com/gpu",
                          overrides=Overrides(env=["WHERE={sysfs_root}", "RES={resource}"],
                                              pass_env=["FAKELET_TEST_TOKEN"]))
    assert "s3cret" not in run.to_json()  # values are read at launch, never written down
    env = DPEnv(run.spec, run.profile)
    try:
        plugin_env = env.subject.env
        assert plugin_env["FAKELET_TEST_TOKEN"] == "s3cret"
        assert plugin_env["RES"] == "fakelet.example.com/gpu"
        assert plugin_env["WHERE"] == str(env.sandbox.path / "hw")
    finally:
        env.close()


def test_run_config_round_trips_every_field() -> None:
    run = RunConfig.build(plugin_cmd=REFERENCE_DP_CMD, resource="fakelet.example.com/gpu", defect=None, seed=7,
                          checks=["DP-REG-02"], out="rep", profile="upstream",
                          overrides=Overrides(inventory="basic", env=["A=b"], observes=["health"]))
    again = RunConfig.from_json(run.to_json())
    assert again == run
    assert again.repro("DP-HLT-01") == run.repro("DP-HLT-01")


def test_repro_names_the_subject_file_and_flags(tmp_path: Path) -> None:
    path = write_subject(tmp_path, good_yaml())
    run = RunConfig.build(subject_file=str(path), overrides=Overrides(
        inventory=str(tmp_path / "hw" / "my-inventory.yaml"), skin="drm", env=["X=1 2"], pass_env=["HOME"],
        device_ids="inventory", observes=["health"]))
    assert run.repro("DP-REG-02") == (
        f"fakelet run --subject-file {path} --inventory {tmp_path}/hw/my-inventory.yaml --skin drm "
        f"--env 'X=1 2' --pass-env HOME --device-ids inventory --observes health --profile fast --seed 0 "
        f"--check DP-REG-02")


def test_pytest_options_carry_the_driver() -> None:
    """The individual --fakelet-* options go through RunConfig.build too: --fakelet-driver is not lost."""
    opt = SimpleNamespace(**{**OPTION_DEFAULTS, "fakelet_plugin_cmd": "{python} -m x --name {driver}",
                             "fakelet_kind": "dra", "fakelet_driver": "gpu.mine.example.com",
                             "fakelet_observes": ["health,temperature"]})
    run = run_from_options(opt)
    assert run.spec.is_dra and run.spec.driver == run.spec.resource == "gpu.mine.example.com"
    assert run.spec.observes == ["health", "temperature"]


def test_pytest_config_option_excludes_the_others(tmp_path: Path) -> None:
    path = RunConfig.build(subject="reference-dp").save(tmp_path / "run.json")
    opt = SimpleNamespace(**{**OPTION_DEFAULTS, "fakelet_config": str(path), "fakelet_seed": 3})
    with pytest.raises(ProfileError, match="drop --fakelet-seed"):
        run_from_options(opt)
    assert run_from_options(SimpleNamespace(**{**OPTION_DEFAULTS, "fakelet_config": str(path)})).spec.name == \
        "reference-dp"


# -- real runs ---------------------------------------------------------------------------------------------


def test_good_subject_file_with_relative_inventory_runs(tmp: Path, tmp_path: Path) -> None:
    path = write_subject(tmp_path, good_yaml())
    out = tmp_path / "out"
    proc = fakelet(tmp, "run", "--subject-file", str(path), "--check", "DP-REG-02", "--out", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["subject"] == "my-plugin"
    assert [(c["id"], c["verdict"]) for c in report["checks"]] == [("DP-REG-02", "pass")]
    assert fakelet_entries(tmp) == []


ENV_DUMPER = """
import json, os, sys
with open(os.environ["DUMP_TO"], "w") as f:
    json.dump(dict(os.environ), f)
os.execv(sys.executable, [sys.executable, "-m", "harness.reference.device_plugin", *sys.argv[1:]])
"""


def test_env_and_pass_env_values_reach_a_running_plugin(tmp: Path, tmp_path: Path) -> None:
    script = tmp_path / "dump_env.py"
    script.write_text(ENV_DUMPER)
    dump = tmp_path / "env.json"
    cmd = REFERENCE_DP_CMD.replace("-m harness.reference.device_plugin", str(script))
    proc = fakelet(tmp, "run", "--plugin-cmd", cmd, "--resource", "fakelet.example.com/gpu", "--check", "DP-REG-02",
                   "--env", f"DUMP_TO={dump}", "--env", "ROOT={sysfs_root}", "--pass-env", "FAKELET_TEST_TOKEN",
                   "--out", str(tmp_path / "out"), env={"FAKELET_TEST_TOKEN": "s3cret"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    seen = json.loads(dump.read_text())
    assert seen["FAKELET_TEST_TOKEN"] == "s3cret"
    assert seen["ROOT"].startswith(str(tmp)) and seen["ROOT"].endswith("/hw")
    assert fakelet_entries(tmp) == []


# -- careless input: special files, control characters, overrides that point nowhere (issue 28) -----------


def special_files(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    """Paths that are not regular files, with what the one-line error must say about each."""
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    dangling = tmp_path / "dangling.yaml"
    dangling.symlink_to(tmp_path / "gone.yaml")
    directory = tmp_path / "dir.yaml"
    directory.mkdir()
    return {"fifo": (fifo, "a FIFO, not a regular file"),
            "dangling": (dangling, f"a dangling symlink (to '{tmp_path}/gone.yaml')"),
            "directory": (directory, "a directory, not a regular file")}


@pytest.mark.parametrize("kind", ["fifo", "dangling", "directory"])
@pytest.mark.parametrize("flag", ["--subject-file", "--inventory"])
def test_a_special_file_is_refused_unread_in_one_line(tmp: Path, tmp_path: Path, kind: str, flag: str) -> None:
    # A FIFO used to block the read forever (no writer ever comes); a dangling symlink said "No such file".
    path, says = special_files(tmp_path)[kind]
    proc = fakelet(tmp, "run", flag, str(path), "--out", str(tmp_path / "out"), timeout=BAD_INPUT_TIMEOUT_S)
    assert proc.returncode == 2, proc
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and f"{path}: cannot read: {says}" in lines[0], proc.stderr
    assert fakelet_entries(tmp) == [] and not (tmp_path / "out").exists()


@pytest.mark.parametrize(("text", "says"), [
    ('name: x\nkind: device-plugin\n"ty\\rpo": 1\n', "x.yaml:3: 'ty\\rpo': unknown field"),
    ('name: x\nkind: device-plugin\nresource: a.example.com/b\ncommand: [x]\nenv: {"A\\rB": "1"}\n',
     "x.yaml:5: 'env.A\\rB': key must be an environment variable name"),
    ('name: x\nkind: device-plugin\nresource: a.example.com/b\ncommand: [x]\ndefects: {"d\\nx": 1}\n',
     "x.yaml:5: 'defects.d\\nx': must be a mapping"),
])
def test_control_characters_in_a_key_keep_the_error_on_one_line(tmp: Path, tmp_path: Path, text: str,
                                                                  says: str) -> None:
    # Found by hypothesis (test_fuzz_cli): a key holding a carriage return split the error in two.
    path = tmp_path / "x.yaml"
    path.write_text(text)
    proc = fakelet(tmp, "run", "--subject-file", str(path), timeout=BAD_INPUT_TIMEOUT_S)
    assert proc.returncode == 2, proc
    assert "\r" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, repr(proc.stderr)
    assert says in proc.stderr, proc.stderr


def test_a_file_name_with_a_newline_stays_on_one_line(tmp: Path, tmp_path: Path) -> None:
    path = tmp_path / "a\nb.yaml"
    path.write_text("name: [")
    proc = fakelet(tmp, "run", "--subject-file", str(path), timeout=BAD_INPUT_TIMEOUT_S)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, repr(proc.stderr)
    assert "a\\nb.yaml:1: not valid YAML" in proc.stderr


@pytest.mark.parametrize("where", ["/nowhere/at/all", "EMPTY_DIR"])
def test_a_fixtures_override_that_points_nowhere_is_an_error(tmp: Path, tmp_path: Path, where: str) -> None:
    # It used to fall back to the bundled fixtures in silence: the user's own were never used.
    value = str(tmp_path) if where == "EMPTY_DIR" else where
    proc = fakelet(tmp, "subjects", env={"FAKELET_FIXTURES": value}, timeout=BAD_INPUT_TIMEOUT_S)
    assert proc.returncode == 2, proc
    assert proc.stderr.strip() == (f"fakelet: error: FAKELET_FIXTURES={value}: not a fakelet fixtures directory "
                                   "(no subjects/ in it); unset it or point it at one"), proc.stderr


@pytest.mark.parametrize("seed", [-1, 2**63])
def test_seed_has_the_scenario_schemas_range(seed: int) -> None:
    with pytest.raises(ProfileError, match=r"--seed must be a non-negative integer \(at most 9223372036854775807\)"):
        RunConfig.build(subject="reference-dp", seed=seed)
    assert RunConfig.build(subject="reference-dp", seed=2**63 - 1).seed == 2**63 - 1
