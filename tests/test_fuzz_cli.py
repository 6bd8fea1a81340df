"""Property: whatever a careless or hostile user types, fakelet answers with a known exit code,
one clear line instead of a traceback, and leaves nothing behind (issue 13).

Command lines and subject files are drawn from fakelet's own vocabulary plus garbage, so
most are rejected up front; the few valid ones run one quick check.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

EXIT_CODES = {0, 1, 2, 3, 130}
FULL_ENV = "FAKELET_FUZZ"  # "full": the whole budget (tox -e fuzz); the default run takes a fixed few
# Each command-line example is a whole `fakelet run`: up to half a minute in CI beside the other envs.
EXAMPLES = 30 if os.environ.get(FULL_ENV, "").strip().lower() == "full" else 4
# On top of the active profile (conftest.py's "ci" in CI: derandomized, so the default run takes the same ones),
# whose suppressed health checks it keeps.
FUZZ = settings(max_examples=EXAMPLES, deadline=None,
                suppress_health_check=[*settings.default.suppress_health_check, HealthCheck.function_scoped_fixture])
RUN_TIMEOUT_S = 120

GARBAGE = st.sampled_from(["", " ", "-", "--", "{", "}", "{nope}", "{python}", "/", "..", "é", "9" * 30,
                          "-1", "0", "1e999", "nan", "a=b", "=", "x.example.com/y", "kubernetes.io/gpu"])
VALUES = {
    "--subject": st.sampled_from(["reference-dp", "no-such", ""]),
    "--defect": st.sampled_from(["register-storm", "opaque-ids", "nope"]),
    "--profile": st.sampled_from(["fast", "upstream", "slow"]),
    "--check": st.sampled_from(["DP-REG-02", "DP-REG-03", "DRA-REG-01", "XX-01"]),
    "--seed": st.sampled_from(["0", "7", "-3", "x", str(2**63), "9" * 30]),
    "--plugin-cmd": st.sampled_from(["", "true", "{python} -c pass", "/no/such/bin", "{nope} x", "'unclosed"]),
    "--resource": st.sampled_from(["x.example.com/gpu", "gpu", "kubernetes.io/gpu", ""]),
    "--kind": st.sampled_from(["dra", "device-plugin", "gpu"]),
    "--driver": st.sampled_from(["gpu.example.com", "Bad_Name", ""]),
    "--jobs": st.sampled_from(["1", "0", "100000", "two"]),
    "--inventory": st.sampled_from(["basic", "no-such", "/etc/passwd", "FIFO", "DANGLING"]),
    "--skin": st.sampled_from(["neutral", "drm", "plaid"]),
    "--env": st.sampled_from(["A=1", "noequals", "=x", "B={sysfs_root}", "C={nope}"]),
    "--pass-env": st.sampled_from(["PATH", "FAKELET_SURELY_UNSET"]),
    "--device-ids": st.sampled_from(["opaque", "inventory", "hashed"]),
    "--observes": st.sampled_from(["health", "health,smell", ""]),
    "--require": st.sampled_from(["DP-HLT", "DP-HLT-01", "bogus"]),
    "--reaction-bound": st.sampled_from(["4", "0", "-1", "999", "x", "nan", "inf"]),
    "--control-plane": st.sampled_from(["none", "local", "kubeconfig:/no/such", "elsewhere", "kubeconfig:FIFO"]),
    "--kubelet-version": st.sampled_from(["1.36", "newest", "0.1"]),
    "--subject-file": st.sampled_from(["/no/such.yaml", "/etc/passwd", "BAD_FILE", "FIFO", "DANGLING"]),
}
FLAGS = [*sorted(VALUES), "--mount-namespace", "--verbose", "--unknown-flag"]


@st.composite
def command_lines(draw: st.DrawFn) -> list[str]:
    argv = ["run"]
    for flag in draw(st.lists(st.sampled_from(FLAGS), max_size=4)):
        argv.append(flag)
        if flag in VALUES:
            argv.append(draw(st.one_of(VALUES[flag], GARBAGE)))
    if "--check" not in argv:
        argv += ["--check", "DP-REG-02"]  # a valid run stays short
    return argv


BAD_SUBJECT = """\
name: mine
kind: device-plugin
command: ["{python}", "-m", "harness.reference.device_plugin", "--plugin-dir", "{plugin_dir}"]
resource: x.example.com/gpu
devices: "text"
aliases: &a [*a]
"""


FILES = {"BAD_FILE": "bad.yaml", "FIFO": "fifo.yaml", "DANGLING": "dangling.yaml"}


def with_files(arg: str, work: Path) -> str:
    """A drawn value naming one of the special files, pointed at this example's copy (kubeconfig:FIFO too)."""
    for token, name in FILES.items():
        if token in arg:
            return arg.replace(token, str(work / name))
    return arg


def leftovers(tmp: Path) -> list[str]:
    return sorted(p.name for p in tmp.iterdir() if p.name.startswith("fakelet-"))


@pytest.mark.slow
@FUZZ
@given(argv=command_lines())
def test_any_command_line_gets_a_known_exit_and_no_traceback(argv: list[str], tmp: Path,
                                                              tmp_path_factory: pytest.TempPathFactory) -> None:
    work = tmp_path_factory.mktemp("fuzz")
    (work / "bad.yaml").write_text(BAD_SUBJECT)
    os.mkfifo(work / "fifo.yaml")  # no writer ever comes: reading it would block for good
    (work / "dangling.yaml").symlink_to(work / "gone.yaml")
    argv = [with_files(a, work) for a in argv]
    proc = subprocess.run([sys.executable, "-m", "harness.run.cli", *argv, "--out", str(work / "out")],
                          capture_output=True, text=True, timeout=RUN_TIMEOUT_S,
                          env=dict(os.environ, TMPDIR=str(tmp)), stdin=subprocess.DEVNULL)
    assert proc.returncode in EXIT_CODES, (argv, proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr, (argv, proc.stderr[-2000:])
    if proc.returncode == 2:
        assert len(proc.stderr.strip().splitlines()) == 1, (argv, proc.stderr)
    assert leftovers(tmp) == [], argv


SUBJECT_KEYS = ["name", "kind", "command", "resource", "driver", "launcher", "devices", "backend", "env", "pass_env",
                "defects", "defect_args", "private_dirs", "inventory", "socket", "build", "reference", "notes", "typo"]
YAML_VALUES = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-5, 10**12), st.text(max_size=12),
              st.sampled_from(["{python}", "{nope}", "device-plugin", "dra", "x.example.com/gpu", "/tmp", "basic"])),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)),
    max_leaves=8)


@pytest.mark.slow
@FUZZ
@given(doc=st.dictionaries(st.sampled_from(SUBJECT_KEYS), YAML_VALUES, max_size=8))
def test_any_subject_file_gets_a_known_exit_and_no_traceback(doc: dict, tmp: Path,
                                                              tmp_path_factory: pytest.TempPathFactory) -> None:
    import yaml
    work = tmp_path_factory.mktemp("fuzzsubject")
    path = work / "subject.yaml"
    path.write_text(yaml.safe_dump(doc, allow_unicode=True))
    proc = subprocess.run([sys.executable, "-m", "harness.run.cli", "run", "--subject-file", str(path),
                           "--check", "DP-REG-02", "--out", str(work / "out")],
                          capture_output=True, text=True, timeout=RUN_TIMEOUT_S,
                          env=dict(os.environ, TMPDIR=str(tmp)), stdin=subprocess.DEVNULL)
    assert proc.returncode in EXIT_CODES, (doc, proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr, (doc, proc.stderr[-2000:])
    if proc.returncode == 2:
        assert len(proc.stderr.strip().splitlines()) == 1, (doc, proc.stderr)
    assert leftovers(tmp) == [], doc
