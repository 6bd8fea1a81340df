"""The harness's own tests on a machine that is not quiet (issue 28): a short `--reaction-bound` counts from
what the plugin reacts to, never from a process start a loaded machine delays; a crash during a call kills
the plugin before the request goes out, however late its death lands; hypothesis draws the same examples
in CI; and tools/stress.py, which runs a selection beside CPU hogs, leaks none of them."""

from __future__ import annotations

import configparser
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from harness.instruments.interceptors import RecordingClientInterceptor
from harness.instruments.timeline import Timeline
from harness.scenarios.plugin_steps import PluginSteps
from harness.spec.profiles import FAST, UPSTREAM
from harness.wire import dp
from harness.world.env import DPEnv

ROOT = Path(__file__).resolve().parent.parent
RUN_TIMEOUT_S = 300
# A plugin that needs this long to start (as Python does at a load average of 15) is held, under
# --reaction-bound LATE_START_BOUND_S, to its reactions only.
LATE_START_S = 3
LATE_START_BOUND_S = "2"
DEATH_DELAY_S = 0.5  # a SIGKILLed contained plugin dies only when its namespace's PID 1 runs again


def test_a_short_reaction_bound_counts_from_the_register_call_not_the_process_start(tmp_path: Path) -> None:
    plugin = (f"sh -c 'sleep {LATE_START_S} && exec {{python}} -m harness.reference.device_plugin "
              f"--plugin-dir {{plugin_dir}} --kubelet-socket {{kubelet_socket}} --resource fakelet.example.com/gpu "
              f"--inventory {ROOT / 'fixtures/inventories/basic.yaml'}'")
    # DP-REG-01 waits for the Register call, DP-RST-05 for a registration of a process it restarted.
    proc = subprocess.run([sys.executable, "-m", "harness.run.cli", "run", "--plugin-cmd", plugin,
                           "--resource", "fakelet.example.com/gpu", "--reaction-bound", LATE_START_BOUND_S,
                           "--check", "DP-REG-01", "--check", "DP-RST-05", "--jobs", "2", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    report = json.loads((tmp_path / "report.json").read_text())
    verdicts = {c["id"]: (c["verdict"], c["detail"]) for c in report["checks"]}
    assert {v for v, _ in verdicts.values()} == {"pass"}, (verdicts, proc.stderr[-2000:])
    assert report["timings"]["startup_s"] == 30.0 and report["timings"]["reaction_s"] == 2.0, report["timings"]


def test_under_the_kubelets_own_bounds_t_still_counts_from_the_process_start() -> None:
    env = DPEnv.__new__(DPEnv)  # only what the start-up waits read
    env.timeline, env.kind, env.spec = Timeline(), None, SimpleNamespace(name="plugin")
    env.timeline.record("process.start", "plugin", pid=1, start=1)
    env.timeline.record("kubelet.register_received", "kubelet", instance=1, call=1)
    for profile in (FAST, UPSTREAM):
        env.profile = profile
        assert not env.wait_started(0), profile.name  # no start-up of its own: T covers it, as it always did
    env.profile = FAST.with_reaction_bound(4)
    assert env.wait_started(0) and env.profile.startup_s == FAST.reaction_s
    assert not env.wait_started(env.timeline.now())  # a wait begun after the start awaits a reaction


class SlowDeath:
    """A plugin whose SIGKILL lands late, as a contained one's does on a loaded machine."""

    def __init__(self) -> None:
        self.dead = threading.Event()
        self.signals: list[int] = []

    def signal(self, sig: int) -> None:
        self.signals.append(sig)
        if len(self.signals) == 1:
            threading.Timer(DEATH_DELAY_S, self.dead.set).start()  # the machine's delay, not a sync point

    def wait_exit(self, timeout_s: float) -> int | None:
        return -signal.SIGKILL if self.dead.wait(timeout_s) else None

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        self.wait_exit(10)


def test_a_crash_during_a_call_kills_the_plugin_before_the_request_goes_out() -> None:
    timeline, plugin = Timeline(), SlowDeath()
    steps = PluginSteps()
    steps.env = SimpleNamespace(subject=plugin, timeline=timeline)  # type: ignore[assignment]
    steps.crashes, told = [], []
    steps.tell = told.append
    steps._arm_crash("Allocate", restart=False)
    at_send: dict[str, bool] = {}

    class Call:
        def result(self) -> dp.AllocateResponse:
            return dp.AllocateResponse()

    def send(details: Any, request: Any) -> Call:
        at_send["dead"] = plugin.dead.is_set()
        at_send["ended"] = steps.crashes[0].ended.is_set()
        return Call()

    details = SimpleNamespace(method="/v1beta1.DevicePlugin/Allocate")
    RecordingClientInterceptor(timeline, "kubelet").intercept_unary_unary(send, details, dp.AllocateRequest())
    assert at_send == {"dead": True, "ended": False}, "the request went out while the plugin could still answer"
    (crash,) = steps.crashes
    assert crash.ended.is_set()  # only now may the plugin start again
    crash.killer.join(10)
    assert [e.kind for e in timeline.events() if e.kind.startswith("fault.")] == ["fault.crash_during"]


HYPOTHESIS_SETTINGS = """
import importlib, inspect, json, sys
sys.path.insert(0, "tests")
import conftest  # what pytest loads before any test module
from hypothesis import HealthCheck
found = {}
for name in sys.argv[1:]:
    module = importlib.import_module(name)
    for attr, fn in inspect.getmembers(module, callable):
        s = getattr(fn, "_hypothesis_internal_use_settings", None)
        if s is not None:
            found[f"{name}.{attr}"] = [s.derandomize, s.deadline is None, s.print_blob, s.database is None,
                                       HealthCheck.too_slow in s.suppress_health_check]
print(json.dumps(found))
"""


def hypothesis_modules() -> list[str]:
    return sorted(p.stem for p in (ROOT / "tests").glob("test_*.py")
                  if "from hypothesis import" in p.read_text() and p.name != Path(__file__).name)


def test_every_hypothesis_test_draws_the_same_examples_in_ci() -> None:
    modules = hypothesis_modules()
    assert modules, "no test uses hypothesis: drop this test"
    proc = subprocess.run([sys.executable, "-c", HYPOTHESIS_SETTINGS, *modules], capture_output=True, text=True,
                          cwd=ROOT, env={**os.environ, "CI": "true"}, timeout=120, check=True)
    found = json.loads(proc.stdout)
    assert found, f"no @given test found in {modules}"
    assert {name: s for name, s in found.items() if not all(s)} == {}
    for module in modules:  # a profile of its own would undo the one conftest.py loads
        assert "load_profile" not in (ROOT / "tests" / f"{module}.py").read_text(), module


def test_tox_hands_ci_to_the_tests() -> None:
    """.ci/run sets CI=true, and tox hands a test env only the variables it names: without CI there,
    hypothesis ran randomized in CI."""
    tox = configparser.ConfigParser()
    tox.read(ROOT / "tox.ini")
    # tox takes the names one a line or comma-separated
    assert "CI" in tox["testenv"]["pass_env"].replace(",", " ").split()


def hogs_alive(marker: str) -> list[str]:
    out = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, check=True).stdout
    return [line for line in out.splitlines() if marker in line and "ps -eo" not in line]


def test_the_stress_tool_runs_pytest_beside_hogs_and_leaves_none(tmp_path: Path) -> None:
    (tmp_path / "test_one.py").write_text("import os\n\ndef test_ci():\n    assert os.environ['CI']\n")
    max_s = "1234.5"  # marks this run's hogs in ps
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "stress.py"), "--hogs", "2", "--max-s", max_s,
                           "--", "-q", "-p", "no:xdist", str(tmp_path / "test_one.py")],
                          capture_output=True, text=True, timeout=RUN_TIMEOUT_S, cwd=tmp_path,
                          env={k: v for k, v in os.environ.items() if k != "CI"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "beside 2 CPU hog(s)" in proc.stdout and "load average (1 min) min" in proc.stdout, proc.stdout
    assert hogs_alive(max_s) == []


@pytest.mark.parametrize(("args", "said"), [(["--hogs", "-1", "--", "x"], "--hogs -1: must be 0 or more"),
                                            (["--hogs", "two", "--", "x"], "invalid int value: 'two'"),
                                            (["--max-s", "0", "--", "x"], "--max-s 0: must be positive"),
                                            ([], "nothing to run")])
def test_the_stress_tool_says_what_was_wrong_in_one_line(args: list[str], said: str) -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "stress.py"), *args], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and said in proc.stderr, proc.stderr
