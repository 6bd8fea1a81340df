"""Stopping is clean at any moment: an interrupt in a teardown, in a timeline being written or in the
reports being written leaves nothing behind and still ends in an INTERRUPTED report; writing reports is
bounded in memory, also for a plugin that lists 100,000 devices."""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import pytest
from inotify_simple import INotify
from inotify_simple import flags as IN
from test_cli import _processes_naming, _wait_for_plugin_socket, leftovers

import reports.html as html
from harness.instruments import bounds
from harness.instruments.teardown import run_all
from harness.instruments.timeline import Timeline
from harness.run import commands as cli
from harness.run.stopping import StopSignals
from harness.spec.profiles import FAST
from harness.spec.subjects import SubjectSpec
from harness.world.env import DPEnv
from reports.model import INTERRUPTED, CheckResult, SubjectReport

DEVICES = 20_000  # one ListAndWatch list of a plugin with this many devices is ~0.8 MB of JSON


def big_timeline(lists: int) -> Timeline:
    """`lists` ListAndWatch messages of DEVICES devices each; they share one device list, so that the
    timeline itself is small in memory while its dump is large."""
    devices = [{"ID": f"gpu-{n}", "health": "Healthy"} for n in range(DEVICES)]
    tl = Timeline()
    tl.record("kubelet.start", "kubelet", instance=1)
    for _ in range(lists):
        tl.record("grpc.stream_msg", "kubelet", endpoint_id=1, message={"devices": devices})
    return tl


def peak_bytes(action: object) -> int:
    tracemalloc.start()
    try:
        action()  # type: ignore[operator]
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_timeline_is_streamed_to_its_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: the dump copied every event (dataclasses.asdict) before writing, doubling a huge timeline."""
    monkeypatch.setattr(bounds, "MAX_ITEMS", DEVICES)  # whole lists, as a timeline without bounds is written
    tl = big_timeline(20)
    path = tmp_path / "timeline.json"
    peak = peak_bytes(lambda: tl.dump(str(path), cap_bytes=64 * 1024 * 1024))
    assert path.stat().st_size > 15_000_000
    assert peak < 6_000_000, f"dumping took {peak / 1e6:.1f} MB"
    lines = path.read_text().splitlines()
    assert lines[0] == "[" and lines[-1] == "]" and len(lines) == 2 + 21  # one event a line: readers may stop early
    events = json.loads(path.read_text())
    assert [e["kind"] for e in events[:2]] == ["kubelet.start", "grpc.stream_msg"]
    assert len(events[1]["data"]["message"]["devices"]) == DEVICES and "t_s" in events[1]
    assert not (tmp_path / "timeline.json.part").exists()


def test_the_html_report_caps_a_huge_timeline_and_says_where_the_whole_is(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: every check's whole timeline was parsed and held at once, and all of it plotted."""
    monkeypatch.setattr(html, "MAX_TIMELINE_BYTES", 1_000_000)
    monkeypatch.setattr(bounds, "MAX_ITEMS", DEVICES)  # whole lists: a timeline.json as large as an older fakelet's
    artifacts = tmp_path / "artifacts" / "DP-LAW-01"
    artifacts.mkdir(parents=True)
    big_timeline(12).dump(str(artifacts / "timeline.json"))
    report = SubjectReport(subject="hostile", profile="fast", seed=0, checks=[
        CheckResult(id="DP-LAW-01", level="MUST", title="lists", verdict="pass", duration_s=1.0)])
    peak = peak_bytes(lambda: html.write_html(report, tmp_path))
    assert peak < 40_000_000, f"writing the HTML report took {peak / 1e6:.1f} MB"
    page = (tmp_path / "report.html").read_text()
    assert "Timeline capped: the plot shows its first 2 events" in page
    assert 'href="artifacts/DP-LAW-01/timeline.json"' in page
    assert '<svg class="timeline"' in page and len(page) < 1_000_000


def test_a_small_timeline_is_embedded_whole(tmp_path: Path) -> None:
    artifacts = tmp_path / "artifacts" / "DP-LAW-01"
    artifacts.mkdir(parents=True)
    big_timeline(1).dump(str(artifacts / "timeline.json"))
    loaded = html.load_timeline(tmp_path / "artifacts", "DP-LAW-01")
    assert loaded is not None and loaded.left_out == 0 and len(loaded.events) == 2


def test_an_interrupt_while_the_timeline_is_written_still_removes_the_sandbox(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Before: the KeyboardInterrupt left DPEnv.close's finally block at the timeline, before the kubelet's
    sockets and the sandbox were removed."""
    spec = SubjectSpec(name="t", kind="device-plugin", command=["/bin/true"], resource="example.com/t")
    env = DPEnv(spec, FAST, artifacts=tmp_path / "artifacts")
    closed = []
    monkeypatch.setattr(env.node, "close", lambda: closed.append("node"))

    def interrupted(path: str, cap_bytes: int) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(env.timeline, "dump", interrupted)
    with pytest.raises(KeyboardInterrupt):
        env.close()
    assert closed == ["node"] and not env.sandbox.path.exists()


def test_run_all_runs_every_step_and_raises_the_first_error() -> None:
    done = []

    def fail(what: BaseException) -> None:
        done.append(type(what).__name__)
        raise what

    with pytest.raises(KeyboardInterrupt):
        run_all([lambda: fail(KeyboardInterrupt()), lambda: fail(OSError()), lambda: done.append("last")])
    assert done == ["KeyboardInterrupt", "OSError", "last"]


def test_only_the_first_stop_signal_raises() -> None:
    again: list[int] = []
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    stop = StopSignals(again.append).install()
    try:
        with stop.shielded():
            signal.raise_signal(signal.SIGTERM)  # noted, not raised: the shielded block runs to its end
        assert stop.requested and not stop.raised
        stop.requested = False
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
        signal.raise_signal(signal.SIGINT)  # a second Ctrl-C in the middle of the clean-up: only noted
        signal.raise_signal(signal.SIGTERM)
        assert again == [signal.SIGINT, signal.SIGTERM]
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _run(spec_name: str, checks: list[str]) -> object:
    return type("Run", (), {"spec": type("Spec", (), {"name": spec_name, "kind": "device-plugin"})(),
                            "checks": checks, "profile": FAST, "seed": 0, "defect": None})()


def test_an_interrupt_while_the_reports_are_written_ends_in_an_interrupted_report(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: a KeyboardInterrupt in the report writers was a traceback and a half-written report."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "report.json").write_text(json.dumps({"schema_version": "2", "earlier": True}))
    stage = cli.staging_dir(out)
    (stage / "report.json").write_text("{}")
    done = SubjectReport(subject="reference-dp", profile="fast", seed=0, checks=[
        CheckResult(id="DP-REG-02", level="MUST", title="version", verdict="pass", duration_s=1.0)])
    real_write_all = cli.write_all
    calls = []

    def write_all(report: SubjectReport, directory: Path) -> None:
        calls.append(report.interrupted)
        if len(calls) == 1:
            raise KeyboardInterrupt  # the stop arrives halfway through the first write
        real_write_all(report, directory)

    monkeypatch.setattr(cli, "write_all", write_all)
    monkeypatch.setattr(cli, "_stop", StopSignals())
    reports = cli.finish_reports([_run("reference-dp", ["DP-REG-02"])], [done], stage, out, False)  # type: ignore
    assert calls == [False, True]
    assert not stage.exists() and reports[0].status() == INTERRUPTED
    written = json.loads((out / "report.json").read_text())
    assert written["summary"]["status"] == INTERRUPTED and "earlier" not in written
    assert (out / cli.REPORT_MARK).is_file() and not (out / ".fakelet-owner").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no stage, no earlier report left beside it


# -- a real `fakelet run`, real signals ------------------------------------------------------------------------


def start_run(tmp: Path, *args: str) -> subprocess.Popen[str]:
    # Its own session: signals sent to its group reach fakelet alone, as a terminal's Ctrl-C reaches the
    # foreground group (the check run has a session of its own).
    return subprocess.Popen([sys.executable, "-m", "harness.run.cli", *args], env=dict(os.environ, TMPDIR=str(tmp)),
                            start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def await_line(proc: subprocess.Popen[str], text: str, deadline_s: float) -> list[str]:
    """Read fakelet's stderr until a line holds `text` (bounded); the lines read."""
    assert proc.stderr is not None
    seen: list[str] = []
    deadline = time.monotonic() + deadline_s
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stderr, selectors.EVENT_READ)
        while (left := deadline - time.monotonic()) > 0:
            if not sel.select(left):
                continue
            line = proc.stderr.readline()
            if not line:
                break
            seen.append(line)
            if text in line:
                return seen
    raise AssertionError(f"no line with {text!r} within {deadline_s}s; saw {seen}")


def await_path(base: Path, pattern: str, deadline_s: float) -> Path:
    """Block until a path matching `pattern` (one or two levels down) exists under `base` (inotify, bounded)."""
    deadline = time.monotonic() + deadline_s
    with INotify() as watcher:
        watched: set[Path] = set()
        while time.monotonic() < deadline:
            for d in [base, *base.glob("*")]:
                if d.is_dir() and d not in watched:
                    watcher.add_watch(str(d), IN.CREATE | IN.MOVED_TO)
                    watched.add(d)
            found = sorted(base.glob(pattern))
            if found:
                return found[0]
            watcher.read(timeout=int(max(0.0, deadline - time.monotonic()) * 1000))
    raise AssertionError(f"nothing like {pattern} appeared under {base} within {deadline_s}s")


def check_run_of(cli_pid: int) -> int:
    """The pytest process `fakelet run` started (setpriv execs it: same pid)."""
    children = Path(f"/proc/{cli_pid}/task/{cli_pid}/children").read_text().split()
    assert children, "fakelet run has no check run"
    return int(children[0])


def cgroups_of(pids: set[int]) -> list[str]:
    """fakelet cgroup run dirs (named `<pid>-<start ticks>`) owned by any of `pids`."""
    from harness.launch import cgroups as cg

    return sorted(run for (_, run) in cg._run_dirs() if int(run.split("-")[0]) in pids)


def stop(proc: subprocess.Popen[str], timeout_s: float) -> tuple[str, str]:
    try:
        return proc.communicate(timeout=timeout_s)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def earlier_report(out: Path) -> None:
    out.mkdir()
    (out / cli.REPORT_MARK).write_text("earlier\n")
    (out / "report.json").write_text(json.dumps({"schema_version": "2", "earlier": True}))


def test_a_second_interrupt_still_stops_cleanly_and_lists_every_check_not_run(tmp: Path, tmp_path: Path) -> None:
    """Before: the second Ctrl-C made fakelet exit while its check run tore down (a traceback, an ERROR
    report or a sandbox left), and with --jobs 2 an interrupted report listed no missing checks."""
    selected = ["DP-ALC-01", "DP-REG-02", "DP-RST-01", "DP-RST-04"]
    out = tmp_path / "out"
    proc = start_run(tmp, "run", *(a for c in selected for a in ("--check", c)), "--jobs", "2", "--out", str(out))
    try:
        _wait_for_plugin_socket(tmp, 120)
        ours, checks = set(_processes_naming(tmp)), check_run_of(proc.pid)
        os.killpg(proc.pid, signal.SIGINT)
        before = await_line(proc, "fakelet: stopping", 60)
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C again, while the checks tear down
        with contextlib.suppress(ProcessLookupError):  # and the check run told twice, as fakelet's exit once did
            os.killpg(checks, signal.SIGTERM)
    finally:
        _, stderr = stop(proc, 120)
    stderr = "".join(before) + stderr
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr and "still stopping" in stderr, stderr
    report = json.loads((out / "report.json").read_text())
    assert report["summary"]["status"] == INTERRUPTED, report["summary"]
    verdicts = {c["id"]: c["verdict"] for c in report["checks"]}
    assert sorted([*verdicts, *report["missing"]]) == selected, (verdicts, report["missing"])
    assert "pass" not in {verdicts.get("DP-RST-04")}
    assert leftovers(tmp) == [] and _processes_naming(tmp) == []
    assert cgroups_of(ours) == []
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_an_interrupt_while_the_control_plane_starts_writes_an_interrupted_report(tmp: Path, tmp_path: Path) -> None:
    """Before: Ctrl-C while etcd and kube-apiserver started left no report, and the earlier one was gone."""
    from harness.controlplane import ControlPlaneUnavailable
    from harness.controlplane.local import WORKDIR_PREFIX, find_etcd, find_kube_apiserver

    try:
        find_etcd()
        find_kube_apiserver()  # built once and cached: the run below then starts at once
    except ControlPlaneUnavailable as err:
        pytest.skip(f"no local control plane: {str(err).splitlines()[0]}")
    out = tmp_path / "out"
    earlier_report(out)
    proc = start_run(tmp, "run", "--subject", "reference-dra", "--check", "DRA-REG-01", "--check", "DRA-PRP-01",
                     "--out", str(out))
    try:
        await_path(tmp, f"{WORKDIR_PREFIX}*", 120)
        assert json.loads((out / "report.json").read_text()).get("earlier"), "the earlier report went first"
        os.killpg(proc.pid, signal.SIGINT)
    finally:
        _, stderr = stop(proc, 120)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr, stderr
    report = json.loads((out / "report.json").read_text())
    assert report["summary"]["status"] == INTERRUPTED and "earlier" not in report
    assert report["checks"] == [] and report["missing"] == ["DRA-PRP-01", "DRA-REG-01"]
    assert leftovers(tmp) == [] and _processes_naming(tmp) == []
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def _importing_grpc(pid: int) -> bool:
    """The process is inside the commands' imports: grpc's extension is mapped, and Python runs our code."""
    try:
        return "cygrpc" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_while_fakelet_is_still_importing_is_an_interrupted_run(sig: signal.Signals) -> None:
    """Before: SIGTERM during the seconds of imports (a loaded machine) killed fakelet by the signal
    (exit -15, seen in the leak test under load), and a Ctrl-C printed an import traceback."""
    proc = subprocess.Popen([sys.executable, "-X", "importtime", "-m", "harness.run.cli", "checks"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        # -X importtime makes the import window wide and its progress visible in /proc: strike inside it.
        while not _importing_grpc(proc.pid) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)  # polling /proc for the import to reach grpc: a bounded watch, not a sync sleep
        if proc.poll() is not None:
            pytest.skip("fakelet finished importing before the signal could be sent")
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    lines = [line for line in err.splitlines() if not line.startswith("import time:")]
    assert proc.returncode in (130, 0), lines  # 0: the imports won the race and `checks` finished
    assert "Traceback" not in err
    if proc.returncode == 130:
        assert lines[-1] in ("fakelet: interrupted before anything started",
                             "fakelet: interrupted; subjects stopped and sandboxes removed"), lines


def test_a_reader_that_stops_early_gets_no_error() -> None:
    """Before: `fakelet checks | head -1` (head gone before the output came) printed
    'fakelet: error: Broken pipe' and exited 2."""
    proc = subprocess.Popen([sys.executable, "-m", "harness.run.cli", "checks"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader is gone before fakelet writes (its imports take far longer than this)
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 0, err
    assert err == ""


def test_an_orphaned_check_run_kills_its_process_group_after_the_grace(monkeypatch: pytest.MonkeyPatch) -> None:
    """CI saw a check run outlive its SIGKILLed `fakelet run` by more than 120 s: nobody was left to end a hung
    teardown. On a stop signal with its parent gone, the backstop kills the group once the grace is over."""
    import threading

    from harness.run import stopping

    killed = threading.Event()
    calls: list[tuple[int, int]] = []
    monkeypatch.setattr(stopping.os, "getppid", lambda: 4242)
    backstop = stopping.OrphanBackstop(0.05)
    monkeypatch.setattr(stopping.os, "killpg", lambda pgid, sig: (calls.append((pgid, sig)), killed.set()))
    backstop(15)
    assert not calls  # its parent is alive: `fakelet run` stops it
    monkeypatch.setattr(stopping.os, "getppid", lambda: 1)
    backstop(15)
    assert killed.wait(5) and calls == [(stopping.os.getpgrp(), stopping.signal.SIGKILL)]


def test_an_orphaned_check_run_is_killed_even_when_no_python_of_it_runs_again() -> None:
    """CI saw a check run's controller alive 120 s after `fakelet run` was SIGKILLed: it hung in the interpreter's
    finalization (grpc's threads in futex waits), where neither a signal handler nor a thread runs Python again.
    The watchdog process kills the group once the parent is gone and the grace is over."""
    script = (
        "import os, signal, subprocess, sys, time\n"
        "from harness.run import stopping\n"
        "os.setpgid(0, 0)\n"
        "parent = subprocess.Popen(['sleep', '60'])\n"
        "backstop = stopping.OrphanBackstop(0.2)\n"
        "backstop.parent = parent.pid\n"
        "backstop.watch()\n"
        "parent.kill(); parent.wait()\n"
        "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})\n"
        "os.system('sleep 30')  # stands for the hang: blocked in C, no Python runs\n"
    )
    began = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", script], timeout=25, cwd=Path(__file__).resolve().parents[1])
    assert proc.returncode == -signal.SIGKILL
    assert time.monotonic() - began < 20


def test_a_check_cut_off_by_a_stop_is_interrupted_not_an_error(tmp: Path, tmp_path: Path) -> None:
    """Before: a check whose call the stop cut off (its worker never reported its verdict) was an ERROR, "no
    result ... (crashed or interrupted)", listed under Failures in summary.md (issue 39, defect 5). SIGTERM, as a
    CI job's timeout sends it; Ctrl-C takes the same path (StopSignals)."""
    selected = ["DP-REG-02", "DP-RST-04"]  # DP-RST-04 waits out a long kubelet outage: the stop finds it mid-call
    out = tmp_path / "out"
    proc = start_run(tmp, "run", *(a for c in selected for a in ("--check", c)), "--jobs", "2", "--out", str(out))
    try:
        _wait_for_plugin_socket(tmp, 120, proc)  # dp_env.start() is in a check's call: one has begun
        os.killpg(proc.pid, signal.SIGTERM)
    finally:
        _, stderr = stop(proc, 120)
    assert proc.returncode == 130, stderr
    report = json.loads((out / "report.json").read_text())
    assert report["summary"]["status"] == INTERRUPTED, report["summary"]
    verdicts = {c["id"]: c["verdict"] for c in report["checks"]}
    assert "error" not in verdicts.values(), report["checks"]
    assert report["missing"], "no check was cut off by the stop"
    assert sorted([*verdicts, *report["missing"]]) == selected, (verdicts, report["missing"])
    summary = (out / "summary.md").read_text()
    assert "## Failures" not in summary and "interrupted before its verdict" in summary, summary
    assert leftovers(tmp) == [] and _processes_naming(tmp) == []
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def assert_nothing_ran_report(out: Path, subject: str, checks: list[str]) -> None:
    report = json.loads((out / "report.json").read_text())
    assert report["summary"]["status"] == INTERRUPTED and report["subject"] == subject, report["summary"]
    assert report["checks"] == [] and report["missing"] == checks
    assert "before any check's verdict" in (out / "summary.md").read_text()


# -X importtime prints a line as each import ends: a module of the commands' own imports (fakelet is still
# importing them, its flags not yet parsed), or one the check catalog loads (`fakelet run` checks its flags).
@pytest.mark.parametrize(("window", "sig"), [("harness.run.matrix", signal.SIGTERM),
                                             ("harness.world.draenv", signal.SIGINT)])
def test_an_early_stop_still_writes_a_report_into_a_new_out(tmp: Path, tmp_path: Path, window: str,
                                                            sig: signal.Signals) -> None:
    """Before: a stop in fakelet's first seconds (its imports, its flags' checks) exited 130 with no report in a
    new --out (issue 39, defect 6); docs/isolation.md promises one at any moment."""
    out = tmp_path / "new"
    proc = subprocess.Popen([sys.executable, "-X", "importtime", "-m", "harness.run.cli", "run", "--subject",
                             "reference-dra", "--check", "DRA-REG-01", "--check", "DRA-PRP-01", "--out", str(out)],
                            env=dict(os.environ, TMPDIR=str(tmp)), start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        seen = await_line(proc, f" {window}\n", 60)
        os.killpg(proc.pid, sig)
    finally:
        _, err = stop(proc, 60)
    lines = [line for line in [*seen, *err.splitlines()] if not line.startswith("import time:")]
    assert proc.returncode == 130, lines
    assert "Traceback" not in err and "interrupted before anything started" not in err, lines
    assert_nothing_ran_report(out, "reference-dra", ["DRA-PRP-01", "DRA-REG-01"])
    assert leftovers(tmp) == [] and _processes_naming(tmp) == []
    assert [p.name for p in tmp_path.iterdir()] == ["new"]
