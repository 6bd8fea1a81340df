"""Issue 39, defect 1: a run's artifacts stay bounded whatever the plugin sends, and the report says what was cut.

The checks judge from the timeline in memory, which stays whole; only what is written is bounded."""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path

import pytest
from test_cli import fakelet, leftovers

from harness.instruments import artifacts, bounds
from harness.instruments.timeline import Timeline
from harness.launch.process import LOG_CAP_BYTES, LOG_TAILS_BYTES, ProcessLauncher
from harness.spec.profiles import FAST
from harness.spec.subjects import SubjectSpec
from harness.world.env import DPEnv

HUGE = 10 * 1024 * 1024  # a 10 MB env value in an Allocate answer


def allocate_timeline() -> Timeline:
    tl = Timeline()
    tl.record("kubelet.start", "kubelet", instance=1)
    tl.record("grpc.call", "kubelet", method="Allocate", request={"container_requests": [{"devices_ids": ["d0"]}]},
              response={"container_responses": [{"envs": {"BIG": "x" * HUGE}}]}, outcome="OK")
    return tl


def test_an_event_with_a_10_mb_string_dumps_small_and_says_what_was_cut(tmp_path: Path) -> None:
    """Before: the whole 10 MB value went into timeline.json."""
    tl = allocate_timeline()
    path = tmp_path / "timeline.json"
    cut = tl.dump(str(path))
    assert path.stat().st_size < 1_000_000
    events = json.loads(path.read_text())
    value = events[1]["data"]["response"]["container_responses"][0]["envs"]["BIG"]
    assert value.startswith("x" * 100) and value.endswith(f"({HUGE - bounds.MAX_STRING_CHARS} bytes cut)")
    assert cut and "1 value over 4,096 characters" in cut.describe() and "10.5 MB not written" in cut.describe()
    # The checks judge from the events in memory: those are whole.
    assert len(tl.events(kind="grpc.call")[0].data["response"]["container_responses"][0]["envs"]["BIG"]) == HUGE


def test_long_lists_and_huge_keys_are_summarized() -> None:
    cut = bounds.Cut()
    value = bounds.bound({"devices": [{"ID": f"d{n}"} for n in range(5000)], "r" * 10_000: 1}, cut)
    devices = value["devices"]
    assert len(devices) == bounds.MAX_ITEMS + 1 and devices[-1] == "… (4,000 more items cut)"
    assert all(len(k) < 5000 for k in value) and cut.lists == 1 and cut.strings == 1


def test_a_timeline_over_its_bound_keeps_its_first_and_last_events_and_a_marker(tmp_path: Path) -> None:
    """Before: a registration flood's hundreds of thousands of events were all written."""
    tl = Timeline()
    for n in range(20_000):
        tl.record("kubelet.register", "kubelet", n=n, resource="example.com/" + "r" * 200)
    path = tmp_path / "timeline.json"
    cut = tl.dump(str(path), cap_bytes=500_000)
    assert path.stat().st_size <= 500_000
    events = json.loads(path.read_text())
    marker = next(e for e in events if e["kind"] == "timeline.cut")
    assert events[0]["data"]["n"] == 0 and events[-1]["data"]["n"] == 19_999
    dropped = marker["data"]["events"]
    assert dropped == 20_000 - len(events) + 1 and marker["data"]["kinds"] == {"kubelet.register": dropped}
    assert f"{dropped:,} events left out" in cut.describe()


def test_the_run_budget_bounds_a_checks_artifacts_and_the_check_says_so(tmp_path: Path) -> None:
    root = tmp_path / "artifacts"
    (root / "DP-OLD-01").mkdir(parents=True)
    (root / "DP-OLD-01" / "subject.log").write_bytes(b"x" * 3_000_000)  # the run's budget is nearly spent
    spec = SubjectSpec(name="t", kind="device-plugin", command=["/bin/true"], resource="example.com/t")
    env = DPEnv(spec, FAST, artifacts=root / "DP-LAW-01")
    env.subject.log_path.write_bytes(b"y" * 2_000_000)
    for _ in range(3):
        env.timeline.record("grpc.call", "kubelet", method="Allocate", response={"envs": {"BIG": "x" * 400_000}})
    budget = 3_000_000 + 600_000
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(artifacts, "RUN_ARTIFACTS_BYTES", budget)
        env.close()
    used = sum(f.stat().st_size for f in root.rglob("*") if f.is_file())
    assert used <= budget + 2 * artifacts.FILE_FLOOR_BYTES
    assert any(n.startswith("artifacts: timeline.json cut: 3 values over 4,096 characters") for n in env.notes)
    assert any(n.startswith("artifacts: subject.log cut:") for n in env.notes)
    assert "DP-LAW-01/subject.log" in env.facts["artifacts cut"]
    log = (root / "DP-LAW-01" / "subject.log").read_bytes()
    assert b"bytes cut here" in log and log.endswith(b"y" * 1000)


FLOOD = textwrap.dedent("""
    import os, sys
    chunk = b"z" * 65536
    for _ in range(int(sys.argv[1])):
        os.write(2, chunk)
""")


def test_the_plugin_log_cap_holds_across_starts(tmp_path: Path) -> None:
    """Before: the 8 MiB cap was per start; two starts of a flooding plugin wrote 16 MiB and more."""
    script = tmp_path / "flood.py"
    script.write_text(FLOOD)
    log = tmp_path / "subject.log"
    chunks = str(LOG_CAP_BYTES // 65536 + 40)  # each start alone goes past the cap
    launcher = ProcessLauncher("flood", [sys.executable, str(script), chunks], dict(os.environ), log, Timeline())
    for _ in range(3):
        launcher.start()
        assert launcher.wait_exit(30) == 0
        launcher.stop()
    size = log.stat().st_size
    assert size <= LOG_CAP_BYTES + LOG_TAILS_BYTES + 4096, size
    assert log.read_bytes().count(b"--- start") == 3
    assert launcher.log_tail(1).endswith("z" * 100)  # the newest output, also once the file has no room left


def test_a_log_flood_run_keeps_its_artifacts_bounded(tmp: Path, tmp_path: Path) -> None:
    """The hostile mutant that writes 200 MB to stderr: the run's artifacts stay within the bound."""
    out = tmp_path / "out"
    proc = fakelet(tmp, "run", "--subject", "reference-dp", "--defect", "log-flood", "--check", "DP-REG-01",
                   "--reaction-bound", "4", "--out", str(out))
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr[-2000:]
    used = sum(f.stat().st_size for f in (out / "artifacts").rglob("*") if f.is_file())
    assert used < LOG_CAP_BYTES + LOG_TAILS_BYTES + bounds.TIMELINE_CAP_BYTES
    report = json.loads((out / "report.json").read_text())
    notes = [n for c in report["checks"] for n in c.get("notes", [])]
    said = "artifacts: subject.log cut: the plugin's output past the log's 8 MiB cap"
    assert any(n.startswith(said) for n in notes), notes
    assert "DP-REG-01/subject.log cut" in report["facts"]["artifacts cut"]
    assert leftovers(tmp) == []
