"""`fakelet prebuild`: the plan (--dry-run builds nothing), bad input, and real builds of a tiny Go module into
a temporary FAKELET_CACHE (never Kubernetes: that is minutes)."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.instruments.doctor import DOCTOR_HINT
from harness.instruments.progress import pin_stream
from harness.launch import gobuild
from harness.run import prebuild

RUN_TIMEOUT_S = 120.0  # a tiny module builds in about a second; the bound is for a loaded machine
TINY_MAIN = "package main\n\nfunc main() {}\n"
BROKEN_MAIN = "package main\n\nfunc main() { undefined() }\n"


def run(*args: str) -> int:
    """`fakelet prebuild ARGS` in this process (a bad flag or value raises, as commands.main turns into exit 2)."""
    from harness.run.commands import build_parser

    return prebuild.main(build_parser().parse_args(["prebuild", *args]))


def fakelet(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "harness.run.cli", *args], capture_output=True, text=True,
                          timeout=RUN_TIMEOUT_S, env=env)


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty fakelet cache of this test's own."""
    monkeypatch.setenv("FAKELET_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("KUBEBUILDER_ASSETS", raising=False)
    return tmp_path / "cache"


@pytest.fixture
def progress() -> Iterator[io.StringIO]:
    """The builds' progress lines (fakelet's pytest plugin pins them to the real stderr otherwise)."""
    lines = io.StringIO()
    before = pin_stream(lines, spinner=False)
    try:
        yield lines
    finally:
        pin_stream(before)


def tiny_subject(tmp_path: Path, main: str = TINY_MAIN) -> Path:
    """A subject file whose build: is a Go module with no requirements (nothing fetched from the proxy)."""
    module = tmp_path / "tiny"
    module.mkdir()
    (module / "go.mod").write_text(f"module example.com/tiny\n\ngo {gobuild.GO_MINIMUM}\n")
    (module / "main.go").write_text(main)
    subject = tmp_path / "tiny.yaml"
    subject.write_text("name: tiny\nkind: device-plugin\nbuild:\n  module: tiny\n  package: .\n  binary: tiny\n"
                       'command: ["{bin}"]\nresource: example.com/tiny\n')
    return subject


def needs_go() -> None:
    if shutil.which("go") is None:
        pytest.skip("go toolchain not found on PATH")


def test_dry_run_plans_the_main_job_without_building(cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run("--all", "--dry-run") == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("plan (") and out[0].endswith(f"cache {cache / 'bin'}):")
    # The measured cost of each kube build, in the order they share Go's build cache.
    first = next(line for line in out if line.strip().startswith("kube-apiserver v"))
    second = next(line for line in out if line.strip().startswith("kube-controller-manager v"))
    assert first.endswith(f"to build: ~{prebuild.elapsed_text(prebuild.FIRST_KUBE_BUILD_S['kube-apiserver'])}")
    assert second.endswith(f"to build: ~{prebuild.elapsed_text(prebuild.COLD_BUILD_S['kube-controller-manager'])}")
    assert any(line.strip().startswith("nvmlplugin") and "needs a C compiler (cgo)" in line for line in out)
    assert out[-1].startswith("to build: ") and " binaries, about " in out[-1]
    assert not (cache / "bin").exists()  # nothing built


def test_another_release_s_kubelet_is_a_first_kube_build(cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run("--kubelet-version", "1.37", "--dry-run") == 0
    out = capsys.readouterr().out.splitlines()
    names = [line.split()[0] for line in out[1:-1]]
    # The real node's containerd 2 with its kubelet (harness/node/real/runtime.py), at its measured cost.
    assert names == ["kubelet", "containerd", "containerd-shim-runc-v2", "ctr", "kube-apiserver",
                     "kube-controller-manager", "kube-scheduler"]
    assert out[1].startswith("  kubelet v1.37.")
    assert out[1].endswith(f"to build: ~{prebuild.elapsed_text(prebuild.FIRST_KUBE_BUILD_S['kubelet'])}")
    assert out[2].startswith("  containerd v2.")
    assert out[2].endswith(f"to build: ~{prebuild.elapsed_text(prebuild.COLD_BUILD_S['containerd'])}")


def test_the_total_says_which_builds_have_no_figure() -> None:
    one, two = (prebuild.Binary(name, "example.com/x", Path("/x")) for name in ("one", "two"))
    assert prebuild.total_line({one: 70, two: None}) == ("to build: 2 binaries, about 1m10s plus 1 not measured (as "
                                                          "measured on 2 cores; less when Go's own caches are warm)")
    assert prebuild.total_line({two: None}) == "to build: 1 binary (time not measured)"
    assert prebuild.total_line({}) == "nothing to build: every binary asked for is cached or on PATH"


def test_a_subject_without_a_build_needs_nothing(cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run("--subject", "reference-dp", "--dry-run") == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "subject reference-dp: nothing to build (its subject file has no build:)"
    assert out[-1] == "nothing to build: every binary asked for is cached or on PATH"


@pytest.mark.parametrize(("args", "says"), [
    (["--kubelet-version", "1.3x"], "not a release"),
    (["--kubelet-version", "1.31"], "older than"),
    (["--subject", "no-such-subject"], "unknown subject 'no-such-subject'"),
    ([], "nothing asked for"),
])
def test_bad_values_are_refused(cache: Path, args: list[str], says: str) -> None:
    with pytest.raises(ValueError, match=says):
        run(*args)


@pytest.mark.parametrize("args", [["prebuild"], ["prebuild", "--bogus"]])
def test_bad_input_is_one_line_and_exit_2(args: list[str]) -> None:
    proc = fakelet(*args)
    assert proc.returncode == 2
    assert proc.stdout == "" and len(proc.stderr.splitlines()) == 1, proc.stderr


def test_builds_into_the_cache_then_finds_it_there(tmp_path: Path, cache: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    needs_go()
    subject = tiny_subject(tmp_path)
    # The command itself once, for the progress lines on its stderr (pytest's own plugin pins them elsewhere here).
    proc = fakelet("prebuild", "--subject-file", str(subject), env=dict(os.environ))
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.splitlines()
    assert out[1].split() == ["tiny", "to", "build:", "cost", "not", "measured"]
    assert "fakelet: building tiny for subject tiny" in proc.stderr and "fakelet: built tiny in " in proc.stderr
    assert out[-1] == f"cache: {cache} holds 1 binary, {prebuild.mib(prebuild.cache_size(cache))}; a CI cache step " \
                      "keeps that directory"
    assert [p.name.split("-")[0] for p in prebuild.cached_binaries()] == ["tiny"]
    assert run("--subject-file", str(subject), "--dry-run") == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].split() == ["tiny", "cached"]
    assert out[-1] == "nothing to build: every binary asked for is cached or on PATH"


def test_a_failed_build_is_one_line_and_exit_1(tmp_path: Path, cache: Path, progress: io.StringIO,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    needs_go()
    assert run("--subject-file", str(tiny_subject(tmp_path, BROKEN_MAIN))) == 1
    assert progress.getvalue().splitlines()[-1].startswith("fakelet: building tiny failed after ")
    failed = [line for line in capsys.readouterr().err.splitlines() if line.startswith("failed:")]
    assert len(failed) == 1 and failed[0].startswith("failed: tiny: ") and "undefined" in failed[0], failed
    assert prebuild.cached_binaries() == []


def test_without_go_the_failure_names_the_fix_and_doctor(tmp_path: Path, cache: Path, progress: io.StringIO,
                                                         monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("PATH", os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep)
                                               if not (Path(p) / "go").exists()))
    assert run("--subject-file", str(tiny_subject(tmp_path))) == 1
    failed = [line for line in capsys.readouterr().err.splitlines() if line.startswith("failed:")]
    assert failed == [f"failed: tiny: go toolchain not found on PATH: {gobuild.GO_FIX} {DOCTOR_HINT}"]
