"""Progress of long steps: announced, kept alive (a spinner on a terminal, a plain line every 30 s
elsewhere), timed, quiet when quick, on stderr only, and reaching the terminal from the
`fakelet` command and from the pytest processes it runs the checks in (issue 28)."""

from __future__ import annotations

import fcntl
import io
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.instruments import progress
from harness.instruments.progress import ERASE_LINE, Progress, elapsed_text
from harness.launch import gobuild

REPO = Path(__file__).resolve().parents[1]  # the checkout these tests belong to

EVENT_TIMEOUT_S = 30.0
CLI_TIMEOUT_S = 300.0


class Clock:
    """A monotonic clock that moves only when the test says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def step(stream: io.StringIO, clock: Clock, **kwargs: object) -> Progress:
    return Progress("kube-apiserver v1.36.3", detail=" from the Go module proxy", stream=stream, clock=clock,
                    background=False, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(("seconds", "text"), [(0, "0s"), (45.9, "45s"), (90, "1m30s"), (252, "4m12s"),
                                               (3723, "1h02m03s")])
def test_elapsed_reads_as_a_person_says_it(seconds: float, text: str) -> None:
    assert elapsed_text(seconds) == text


def test_a_step_announces_itself_and_ends_with_its_elapsed_time() -> None:
    out, clock = io.StringIO(), Clock()
    with step(out, clock):
        assert out.getvalue() == "fakelet: building kube-apiserver v1.36.3 from the Go module proxy ...\n"
        clock.advance(252)
    assert out.getvalue().splitlines()[-1] == "fakelet: built kube-apiserver v1.36.3 in 4m12s"


def test_without_a_terminal_a_plain_line_every_30s() -> None:
    out, clock = io.StringIO(), Clock()
    with step(out, clock) as s:
        for seconds in (10, 20, 15, 15, 30, 5):  # at 10, 30, 45, 60, 90, 95 s
            clock.advance(seconds)
            s.tick()
    lines = out.getvalue().splitlines()
    assert lines[1:] == ["fakelet: ... still building kube-apiserver v1.36.3, 30s",
                         "fakelet: ... still building kube-apiserver v1.36.3, 1m00s",
                         "fakelet: ... still building kube-apiserver v1.36.3, 1m30s",
                         "fakelet: built kube-apiserver v1.36.3 in 1m35s"]
    assert "\r" not in out.getvalue()


def test_on_a_terminal_a_spinner_with_the_elapsed_time() -> None:
    out, clock = Terminal(), Clock()
    with step(out, clock) as s:
        for _ in range(3):
            clock.advance(0.25)
            s.tick()
        clock.advance(89.25)
        s.tick()
    text = out.getvalue()
    spinning = text.split("\n", 1)[1]
    frames = spinning.split(ERASE_LINE)
    assert frames[1:4] == ["/ building kube-apiserver v1.36.3, 0s", "- building kube-apiserver v1.36.3, 0s",
                           "\\ building kube-apiserver v1.36.3, 0s"]
    assert frames[4] == "| building kube-apiserver v1.36.3, 1m30s"
    assert frames[5] == "fakelet: built kube-apiserver v1.36.3 in 1m30s\n"  # the spinner's line, erased
    assert "still" not in text


def test_a_quick_step_prints_nothing() -> None:
    out, clock = Terminal(), Clock()
    with step(out, clock, quiet_s=2.0) as s:
        clock.advance(1.5)
        s.tick()
    assert out.getvalue() == ""


def test_a_quiet_step_that_runs_long_is_announced_late() -> None:
    out, clock = io.StringIO(), Clock()
    with step(out, clock, quiet_s=2.0) as s:
        clock.advance(1)
        s.tick()
        assert out.getvalue() == ""
        clock.advance(2)
        s.tick()
        clock.advance(31)
        s.tick()
    assert out.getvalue().splitlines() == [
        "fakelet: building kube-apiserver v1.36.3 from the Go module proxy ...",
        "fakelet: ... still building kube-apiserver v1.36.3, 34s",
        "fakelet: built kube-apiserver v1.36.3 in 34s"]


@pytest.mark.parametrize(("error", "said"), [(RuntimeError("go build failed"), "failed after 5s"),
                                             (KeyboardInterrupt(), "stopped after 5s")])
def test_a_failed_or_interrupted_step_says_so_and_raises(error: BaseException, said: str) -> None:
    out, clock = io.StringIO(), Clock()
    with pytest.raises(type(error)), step(out, clock):
        clock.advance(5)
        raise error
    assert out.getvalue().splitlines()[-1] == f"fakelet: building kube-apiserver v1.36.3 {said}"


def test_a_closed_stderr_never_fails_the_step() -> None:
    out, clock = io.StringIO(), Clock()
    out.close()
    with step(out, clock) as s:
        clock.advance(60)
        s.tick()


def test_the_ticker_is_a_daemon_that_stops_with_the_step() -> None:
    out = io.StringIO()
    with Progress("x", stream=out, quiet_s=3600) as s:
        ticker = s._thread
        assert ticker is not None and ticker.daemon and ticker.is_alive()
    assert not ticker.is_alive()
    assert out.getvalue() == ""


def test_progress_goes_to_stderr_by_default(capsys: pytest.CaptureFixture[str]) -> None:
    before = progress.pin_stream(None)  # what the fakelet command has: nothing pinned
    try:
        with Progress("x", background=False):
            pass
    finally:
        progress.pin_stream(before, spinner=False)
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "fakelet: building x ..." in captured.err


def test_a_pinned_stream_without_spinner_gets_plain_lines_on_a_terminal() -> None:
    out, clock = Terminal(), Clock()
    before = progress.pin_stream(out, spinner=False)
    try:
        with Progress("x", clock=clock, background=False) as s:
            clock.advance(30)
            s.tick()
    finally:
        progress.pin_stream(before)
    assert out.getvalue().splitlines() == ["fakelet: building x ...", "fakelet: ... still building x, 30s",
                                           "fakelet: built x in 30s"]


def test_pytest_leaves_the_pinned_real_stderr_alone(capfd: pytest.CaptureFixture[str]) -> None:
    """The plugin pins fd 2 before pytest captures it: a check's build is seen, not swallowed."""
    assert progress._pinned is not None and progress._pinned.fileno() != 2
    read, write = os.pipe()
    restore = None
    saved = os.dup(2)
    try:
        os.dup2(write, 2)
        restore = progress.pin_real_stderr()
        os.dup2(saved, 2)  # what pytest does to fd 2 during a test: the pinned copy still reaches the pipe
        with Progress("x", background=False):
            pass
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        if restore is not None:
            restore()
        os.close(write)
    with os.fdopen(read) as pipe:
        assert pipe.read() == "fakelet: building x ...\nfakelet: built x in 0s\n"
    assert "building x" not in capfd.readouterr().err


# -- Go builds ---------------------------------------------------------------------------------


def test_a_build_is_named_with_the_version_its_module_pins() -> None:
    kube = REPO / "fixtures/go/kubernetes"
    assert gobuild.describe(kube, "k8s.io/kubernetes/cmd/kube-apiserver", "kube-apiserver") == "kube-apiserver v1.36.3"
    assert gobuild.describe(REPO / "fixtures/go/kind", "sigs.k8s.io/kind", "kind") == "kind v0.33.0"
    assert gobuild.describe(REPO / "fixtures/go/generic-device-plugin", "github.com/squat/generic-device-plugin",
                            "generic-device-plugin", "github.com/squat/generic-device-plugin@latest") \
        == "generic-device-plugin latest"
    assert gobuild.describe(REPO / "tests/go/wirecompat", ".", "wirecompat") == "wirecompat"


def tiny_module(root: Path, body: str = "func main() {}") -> Path:
    module = root / "tiny"
    module.mkdir()
    (module / "go.mod").write_text("module fakelet.test/tiny\n\ngo 1.22\n")
    (module / "main.go").write_text(f"package main\n\n{body}\n")
    return module


@pytest.fixture
def go() -> str:
    try:
        return gobuild.go_binary()
    except gobuild.GoUnavailable as err:
        pytest.skip(str(err))


@pytest.fixture
def pinned() -> Iterator[io.StringIO]:
    out = io.StringIO()
    before = progress.pin_stream(out)
    yield out
    progress.pin_stream(before)


def test_a_build_shows_progress_and_a_cache_hit_prints_nothing(go: str, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch,
                                                               pinned: io.StringIO) -> None:
    monkeypatch.setenv("FAKELET_CACHE", str(tmp_path / "cache"))
    module = tiny_module(tmp_path)
    built = gobuild.build(module, name="tiny", why="for a test")
    lines = pinned.getvalue().splitlines()
    assert lines[0] == ("fakelet: building tiny for a test, from fakelet.test/tiny and the Go module proxy "
                        f"(first use; cached afterwards in {tmp_path}/cache/bin) ...")
    assert lines[-1].startswith("fakelet: built tiny in ")
    pinned.truncate(0)
    pinned.seek(0)
    assert gobuild.build(module, name="tiny") == built
    assert pinned.getvalue() == ""


def test_a_dead_builders_temp_binary_is_removed(go: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                pinned: io.StringIO) -> None:
    """Before: a run killed during a build left `<binary>.tmp<pid>` (~100 MB for a kubelet) in the cache."""
    monkeypatch.setenv("FAKELET_CACHE", str(tmp_path / "cache"))
    module = tiny_module(tmp_path)
    built = gobuild.build(module, name="tiny")
    built.unlink()
    dead = built.with_name(f"{built.name}.tmp4194303")  # above any pid_max: a builder that cannot be alive
    dead.write_bytes(b"half a binary")
    live = built.with_name(f"{built.name}.tmp{os.getppid()}")  # alive, and not this builder's own name
    live.write_bytes(b"another builder's, still writing")
    assert gobuild.build(module, name="tiny") == built
    assert not dead.exists() and live.exists()


class Announced(io.StringIO):
    """A stream that tells the test when a line containing `text` was written."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text, self.seen = text, threading.Event()

    def write(self, s: str) -> int:
        n = super().write(s)
        if self.text in self.getvalue():
            self.seen.set()
        return n


def test_waiting_for_another_processs_build_is_said(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gobuild, "WAIT_QUIET_S", 0.0)
    out = Announced("waiting for kube-apiserver")
    before = progress.pin_stream(out)
    lock_path = tmp_path / "kube-apiserver.lock"
    try:
        with open(lock_path, "w") as holder, open(lock_path, "w") as waiter:
            fcntl.flock(holder, fcntl.LOCK_EX)  # another process's build
            thread = threading.Thread(target=gobuild._lock, args=(waiter, "kube-apiserver"), daemon=True)
            thread.start()
            assert out.seen.wait(EVENT_TIMEOUT_S), out.getvalue()
            fcntl.flock(holder, fcntl.LOCK_UN)
            thread.join(EVENT_TIMEOUT_S)
            assert not thread.is_alive()
    finally:
        progress.pin_stream(before)
    lines = out.getvalue().splitlines()
    assert lines[0] == "fakelet: waiting for kube-apiserver (another process is building it) ..."
    assert lines[-1].startswith("fakelet: waited for kube-apiserver in ")


# -- end to end: the command's stderr ----------------------------------------------------------------


SCENARIO = "dp-plugin-restart-allocatable-zero"


@pytest.mark.parametrize(("command", "builds"), [
    # Once from the command before the checks, once from the xdist worker whose check tried again.
    (["run", "--check", "DP-REG-01", "--jobs", "2"], 2),
    (["scenario", "run", SCENARIO], 1),
], ids=["run", "scenario"])
def test_the_command_shows_an_uncached_build_on_stderr(go: str, tmp: Path, tmp_path: Path, command: list[str],
                                                       builds: int) -> None:
    """The build fails at once (a compile error), so no proxy and no minutes are needed: what matters is
    that its announcement reaches the command's stderr, from the command and from its check processes."""
    module = tiny_module(tmp_path, "func main() { undefined() }")
    subject = tmp_path / "tiny.yaml"
    subject.write_text(f"name: tiny\nkind: device-plugin\nresource: fakelet.example.com/tiny\n"
                       f"build: {{module: {module}, package: ., binary: tinyplugin}}\ncommand: ['{{bin}}']\n")
    env = dict(os.environ, TMPDIR=str(tmp), FAKELET_CACHE=str(tmp_path / "cache"))
    proc = subprocess.run([sys.executable, "-m", "harness.run.cli", *command, "--subject-file", str(subject),
                           "--out", str(tmp_path / "out")], capture_output=True, text=True, env=env,
                          timeout=CLI_TIMEOUT_S)
    announcement = "fakelet: building tinyplugin for subject tiny, from fakelet.test/tiny and the Go module proxy"
    assert proc.stderr.count(announcement) == builds, proc.stderr
    assert proc.stderr.count("fakelet: building tinyplugin failed after ") == builds, proc.stderr
    assert "building tinyplugin" not in proc.stdout
    assert "cannot build" in proc.stdout  # the check or the scenario says why it could not run


def test_a_slow_compile_of_the_fake_nvml_library_is_shown(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          pinned: io.StringIO) -> None:
    from fake_devices.nvml import build

    monkeypatch.setenv("FAKELET_CACHE", str(tmp_path))
    monkeypatch.setattr(build, "COMPILE_QUIET_S", 0.0)  # as if this machine were slow
    try:
        build.library()
    except build.NvmlBuildError as err:
        pytest.skip(str(err))
    lines = pinned.getvalue().splitlines()
    assert lines[0].startswith("fakelet: building the fake NVML library (libnvidia-ml.so.1) with ")
    assert lines[0].endswith(f"(first use; cached afterwards in {tmp_path}/nvml) ...")
    assert lines[-1].startswith("fakelet: built the fake NVML library (libnvidia-ml.so.1) in ")


def test_a_build_that_overruns_its_bound_is_a_failed_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          pinned: io.StringIO) -> None:
    """Not a TimeoutExpired that the front doors do not expect: the build's bound is a build failure."""
    stub = tmp_path / "stub"
    stub.mkdir()
    (stub / "go").write_text("#!/bin/sh\nexec sleep 60\n")  # a go that never finishes
    (stub / "go").chmod(0o755)
    monkeypatch.setenv("PATH", f"{stub}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKELET_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(gobuild, "BUILD_TIMEOUT_S", 0.2)
    with pytest.raises(RuntimeError, match=r"did not finish within 0\.2s"):
        gobuild.build(tiny_module(tmp_path), name="tiny")
    assert pinned.getvalue().splitlines()[-1].startswith("fakelet: building tiny failed after ")


def test_no_stderr_at_all_never_fails_the_step(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stderr", None)  # python started with its stderr closed
    before = progress.pin_stream(None)
    try:
        with Progress("x", background=False) as s:
            s.tick()
    finally:
        progress.pin_stream(before, spinner=False)
