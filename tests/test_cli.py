"""The `fakelet` command: bad input gets a clear error and exit 2, nothing leaks,
Ctrl-C tears everything down, and the main job writes its reports."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from inotify_simple import INotify
from inotify_simple import flags as IN

REPO = Path(__file__).resolve().parents[1]  # the checkout these tests belong to


RUN_TIMEOUT_S = 300


def fakelet(tmp: Path, *args: str, timeout: float = RUN_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, TMPDIR=str(tmp))
    return subprocess.run([sys.executable, "-m", "harness.run.cli", *args], capture_output=True, text=True,
                          env=env, timeout=timeout)


def _contents(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))[:20] if path.is_dir() else []


def leftovers(tmp: Path) -> list[str]:
    """Sandboxes left in TMPDIR, and processes still naming one."""
    found = [p.name for p in tmp.iterdir()]
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(tmp) in cmdline and "pytest" not in cmdline:
            found.append(f"pid {proc.name}: {cmdline[:120]}")
    return found


@pytest.mark.parametrize(("args", "message"), [
    (["run", "--subject", "no-such-plugin"], "unknown subject 'no-such-plugin'"),
    (["run", "--defect", "no-such-defect"], "has no defect 'no-such-defect'"),
    (["run", "--check", "DP-XXX-99"], "unknown check ID(s) DP-XXX-99"),
    (["run", "--plugin-cmd", "/bin/true"], "--plugin-cmd needs --resource"),
    (["run", "--plugin-cmd", "/nonexistent/plugin", "--resource", "example.com/x"], "not an executable file"),
    (["run", "--plugin-cmd", "'unbalanced", "--resource", "example.com/x"], "cannot parse"),
    (["run", "--subject", "reference-dp", "--plugin-cmd", "/bin/true", "--resource", "example.com/x"],
     "either --subject or --plugin-cmd"),
    (["run", "--profile", "warp"], "invalid choice: 'warp'"),
    (["run", "--seed", "many"], "invalid int value: 'many'"),
    (["run", "--subject", "reference-dra", "--kubelet-version", "1.12"], "unknown kubelet version '1.12'"),
    (["run", "--subject", "reference-dra", "--control-plane", "kubeconfig:/nonexistent"],
     "no such kubeconfig file"),
    (["run", "--subject", "reference-dra", "--control-plane", "cloud"], "--control-plane 'cloud'"),
    (["run", "--plugin-cmd", "/bin/true", "--kind", "dra"], "--plugin-cmd needs --driver"),
    (["run", "--plugin-cmd", "/bin/true", "--driver", "x.example.com"], "--driver is for --kind dra"),
])
def test_bad_input_is_a_clear_error(tmp: Path, tmp_path: Path, args: list[str], message: str) -> None:
    proc = fakelet(tmp, *args, "--out", str(tmp_path / "out"), timeout=60)
    assert proc.returncode == 2, proc
    assert message in proc.stderr, proc.stderr
    assert leftovers(tmp) == []


REFERENCE_DP_CMD = ("{python} -m harness.reference.device_plugin --plugin-dir {plugin_dir} "
                    "--kubelet-socket {kubelet_socket} --resource {resource} --sysfs-root {sysfs_root} "
                    "--dev-dir {dev_dir}")
REFERENCE_DRA_CMD = ("{python} -m harness.reference.dra_driver --driver-name {driver} --node-name {node_name} "
                     "--kubeconfig {kubeconfig} --registry-dir {registry_dir} --plugin-dir {plugins_dir}/{driver} "
                     "--cdi-dir {cdi_dir} --sysfs-root {sysfs_root} --state-dir {state_dir} "
                     "--health-refresh-s {health_refresh_s}")


@pytest.mark.parametrize(("args", "message"), [
    (["run", "--plugin-cmd", ""], "--plugin-cmd is empty"),
    (["run", "--plugin-cmd", "/bin/true", "--resource", "gpu"], "--resource 'gpu': not an extended resource name"),
    (["run", "--plugin-cmd", "/bin/true", "--kind", "dra", "--driver", "Bad_Name"], "--driver 'Bad_Name'"),
    (["run", "--jobs", "0"], "--jobs 0: must be between 1 and"),
    (["run", "--jobs", "100000"], "--jobs 100000: must be between 1 and"),
    (["run", "--subject", "reference-dp", "--resource", "example.com/x"], "--resource applies to --plugin-cmd"),
    (["run", "--subject", "reference-dp", "--mount-namespace"], "--mount-namespace applies to --plugin-cmd"),
    (["run", "--subject", "reference-dra", "--kind", "dra"], "--kind applies to --plugin-cmd"),
    (["run", "--subject", "reference-dra", "--driver", "x.example.com"], "--driver applies to --plugin-cmd"),
    (["run", "--plugin-cmd", "{pythn} -m x", "--resource", "example.com/x"],
     "--plugin-cmd: unknown placeholder {pythn} in '{pythn}'"),
    (["run", "--plugin-cmd", "{bin} --flag", "--resource", "example.com/x"],
     "--plugin-cmd: {bin} in '{bin}' is unavailable: the subject has no build and no --binary was given"),
    (["run", "--plugin-cmd", "{python} --kubeconfig {kubeconfig}", "--resource", "example.com/x"],
     "unknown placeholder {kubeconfig}"),
    (["run", "--env", "NOEQUALS"], "--env 'NOEQUALS': expected KEY=VALUE"),
    (["run", "--env", "X={sysfs}"], "--env X: unknown placeholder {sysfs}"),
    (["run", "--pass-env", "FAKELET_SURELY_UNSET"],
     "--pass-env FAKELET_SURELY_UNSET: not set in fakelet's environment"),
    (["run", "--private-dir", "/tmp"], "--private-dir needs the mount-namespace or container launcher"),
    (["run", "--subject", "sample-device-plugin", "--observes", "health"], "--observes: subject sample-device-plugin"),
    (["run", "--observes", "health,smell"], "--observes smell: choose from"),
    (["run", "--inventory", "no-such-inventory"], "--inventory: no inventory 'no-such-inventory'"),
    (["up", "--plugin-cmd", "", "--for", "1"], "--plugin-cmd is empty"),
    (["run", "--subject", ""], "argument --subject: empty; name a subject"),
    (["fidelity", "--subject", " "], "argument --subject: empty; name a subject"),
    (["up", "--subject", "reference-dp", "--resource", "example.com/x", "--for", "1"],
     "--resource applies to --plugin-cmd"),
])
def test_flag_misuse_is_one_clear_line(tmp: Path, tmp_path: Path, args: list[str], message: str) -> None:
    out = ["--out", str(tmp_path / "out")]
    proc = fakelet(tmp, *args, *out, timeout=60)
    assert proc.returncode == 2, proc
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], proc.stderr
    assert leftovers(tmp) == [] and not (tmp_path / "out").exists()


def test_plugin_cmd_gets_fake_hardware(tmp: Path, tmp_path: Path) -> None:
    """{sysfs_root} of a --plugin-cmd is a real backend tree, so the reference plugin's health checks run."""
    out = tmp_path / "out"
    proc = fakelet(tmp, "run", "--plugin-cmd", REFERENCE_DP_CMD, "--resource", "fakelet.example.com/gpu",
                   "--observes", "health", "--check", "DP-HLT-01", "--out", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((out / "report.json").read_text())
    assert [(c["id"], c["verdict"]) for c in report["checks"]] == [("DP-HLT-01", "pass")], report["checks"]
    assert leftovers(tmp) == []


def test_dra_plugin_cmd_keeps_its_driver(tmp: Path, tmp_path: Path) -> None:
    """--driver reaches the check process (it once got lost on the way: "--plugin-cmd needs --driver")."""
    out = tmp_path / "out"
    proc = fakelet(tmp, "run", "--kind", "dra", "--plugin-cmd", REFERENCE_DRA_CMD, "--driver", "gpu.mine.example.com",
                   "--control-plane", "none", "--check", "DRA-REG-01", "--out", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["kind"] == "dra"
    assert [(c["id"], c["verdict"]) for c in report["checks"]] == [("DRA-REG-01", "pass")], report["checks"]
    assert leftovers(tmp) == []


def test_long_tmpdir_is_a_clear_error(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 60)
    deep.mkdir()
    proc = fakelet(deep, "run", "--out", str(tmp_path / "out"), timeout=60)
    assert proc.returncode == 2
    assert "too long for unix socket paths" in proc.stderr and "set TMPDIR" in proc.stderr
    assert list(deep.iterdir()) == []


def test_bad_profile_names_the_file(tmp: Path, tmp_path: Path) -> None:
    fixtures = tmp_path / "fixtures"
    (fixtures / "subjects").mkdir(parents=True)
    (fixtures / "subjects" / "broken.yaml").write_text("name: broken\nkind: device-plugin\ncommand: [x]\n")
    env = dict(os.environ, TMPDIR=str(tmp), FAKELET_FIXTURES=str(fixtures))
    proc = subprocess.run([sys.executable, "-m", "harness.run.cli", "run", "--subject", "broken"],
                          capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 2
    assert "broken.yaml: missing required key 'resource'" in proc.stderr
    assert leftovers(tmp) == []


def test_subjects_lists_reference_and_defects(tmp: Path) -> None:
    proc = fakelet(tmp, "subjects", timeout=60)
    assert proc.returncode == 0
    assert "reference-dp (reference)" in proc.stdout
    assert "--defect register-before-serve" in proc.stdout and "fails DP-REG-01" in proc.stdout


def test_selected_checks_write_all_reports(tmp: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = fakelet(tmp, "run", "--check", "DP-REG-02", "--check", "DP-ALC-02", "--seed", "7", "--out", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["subject"] == "reference-dp" and report["seed"] == 7 and report["profile"] == "fast"
    assert [c["id"] for c in report["checks"]] == ["DP-ALC-02", "DP-REG-02"]
    assert report["summary"] == {"pass": 2, "fail": 0, "not-exercised": 0, "n/a": 0, "skip": 0, "error": 0,
                                 "total": 2, "missing": 0, "status": "CONFORMANT", "conformant": True,
                                 "not_exercised_must": []}
    suite = ET.parse(out / "junit.xml").getroot()
    assert suite.get("tests") == "2" and suite.get("failures") == "0"
    assert "CONFORMANT" in (out / "summary.md").read_text()
    assert "fake kubelet release" not in report["facts"], report["facts"]  # no release asked for: no model note
    assert leftovers(tmp) == []


def test_a_run_asking_the_fake_kubelet_for_a_release_says_what_models_it(tmp: Path, tmp_path: Path) -> None:
    """--kubelet-version on the fake kubelet: the narration and the report say, as a scenario run does, that
    the fake stands in for the release only through its named behaviours (harness/kubelet/release_model.py)."""
    out = tmp_path / "out"
    proc = fakelet(tmp, "run", "--check", "DP-REG-02", "--kubelet-version", "1.33", "--out", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    said = [line for line in proc.stdout.splitlines() if "the fake kubelet models 1.33" in line]
    assert len(said) == 1 and said[0].startswith("reference-dp: "), proc.stdout
    assert "device-plugin clients: one per resource" in said[0] and "not about a real 1.33 kubelet" in said[0]
    report = json.loads((out / "report.json").read_text())
    assert report["facts"]["fake kubelet release"] == said[0].removeprefix("reference-dp: "), report["facts"]
    assert "- fake kubelet release: the fake kubelet models 1.33 only through" in (out / "summary.md").read_text()
    assert report["provenance"]["kubelet"] == {"node": "fake", "model": "1.33"}


def test_failing_mutant_exits_1_with_repro(tmp: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = fakelet(tmp, "run", "--defect", "wrong-version", "--check", "DP-REG-02", "--out", str(out))
    assert proc.returncode == 1
    check = json.loads((out / "report.json").read_text())["checks"][0]
    assert check["verdict"] == "fail"
    assert "expected version in ['v1beta1']; saw version 'v1alpha'" in check["detail"]
    assert check["repro"] == ("fakelet run --subject reference-dp --defect wrong-version --profile fast "
                              "--seed 0 --check DP-REG-02")
    assert "reproduce: fakelet run" in proc.stdout
    suite = ET.parse(out / "junit.xml").getroot()
    assert suite.get("failures") == "1"
    assert leftovers(tmp) == []


# A fakelet run, its xdist worker, the sandbox and the plugin all start before the socket appears: seconds on a
# quiet machine, about a minute at a load of 30 on 2 cores. The wait ends early if the run exits first.
PLUGIN_SOCKET_WAIT_S = 150
KILLED_RUN_GONE_S = 120  # a SIGKILLed run's processes all gone (see the test)
INOTIFY_SLICE_MS = 500  # how often the wait looks whether the run is still alive


def _wait_for_plugin_socket(tmp: Path, deadline_s: float, run: subprocess.Popen | None = None) -> None:
    """Block until some sandbox under `tmp` has the reference plugin's socket (inotify, bounded); fail at once if
    `run` exited first."""
    deadline = time.monotonic() + deadline_s
    with INotify() as watcher:
        watched: set[Path] = set()
        while time.monotonic() < deadline:
            if run is not None and run.poll() is not None:
                raise AssertionError(f"the run exited ({run.returncode}) before its plugin's socket appeared")
            # Watch every directory on the way down before looking, so no creation is missed.
            for d in [tmp, *tmp.glob("*"), *tmp.glob("*/kubelet"), *tmp.glob("*/kubelet/device-plugins")]:
                if d.is_dir() and d not in watched:
                    watcher.add_watch(str(d), IN.CREATE)
                    watched.add(d)
            if any(tmp.glob("*/kubelet/device-plugins/fakelet-dp.sock")):
                return
            watcher.read(timeout=int(min(INOTIFY_SLICE_MS, max(0.0, deadline - time.monotonic()) * 1000)))
    raise AssertionError(f"no plugin socket appeared under {tmp} within {deadline_s}s")


# SIGINT to the process group is what a terminal's Ctrl-C does; SIGTERM is a CI timeout.
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupt_leaves_nothing_behind(tmp: Path, tmp_path: Path, sig: signal.Signals) -> None:
    env = dict(os.environ, TMPDIR=str(tmp))
    # DP-RST-04 keeps the kubelet down for a while: a long enough window to interrupt.
    proc = subprocess.Popen([sys.executable, "-m", "harness.run.cli", "run", "--check", "DP-RST-04",
                             "--out", str(tmp_path / "out")], env=env, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for_plugin_socket(tmp, PLUGIN_SOCKET_WAIT_S, proc)
        os.killpg(proc.pid, sig)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, stderr
    assert "interrupted" in stderr
    assert leftovers(tmp) == []
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "INTERRUPTED" in summary and "CONFORMANT" not in summary.replace("NOT CONFORMANT", "")


def _processes_naming(tmp: Path) -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and str(tmp).encode() in (proc / "environ").read_bytes():
                pids.append(int(proc.name))
        except OSError:
            continue
    return pids


def _cmdline(pid: int) -> str:
    try:
        return f"{pid}: " + (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode()[:300]
    except OSError:
        return f"{pid}: gone"


def test_a_killed_run_takes_its_checks_down_and_the_next_run_reaps_what_is_left(tmp: Path, tmp_path: Path) -> None:
    env = dict(os.environ, TMPDIR=str(tmp))
    proc = subprocess.Popen([sys.executable, "-m", "harness.run.cli", "run", "--check", "DP-RST-04",
                             "--out", str(tmp_path / "out")], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    _wait_for_plugin_socket(tmp, PLUGIN_SOCKET_WAIT_S, proc)
    proc.kill()  # SIGKILL: fakelet itself gets no say
    proc.wait()
    # Its check run got SIGTERM from the kernel (parent-death signal) and tears down, bounded: it waits up to
    # WORKER_TEARDOWN_S for its workers, xdist up to 10 s more, and a worker's own check teardown (a plugin's stop
    # grace among it) goes on meanwhile. 60 s was outlasted once in CI (one process left, at a load of about 3
    # with three suites' workers beside it); the leftover's command line now says which one it was.
    deadline = time.monotonic() + KILLED_RUN_GONE_S
    while _processes_naming(tmp) and time.monotonic() < deadline:
        time.sleep(0.2)  # polling /proc: no event tells when the last process of a tree is gone
    left = _processes_naming(tmp)
    assert left == [], [_cmdline(pid) for pid in left]
    again = fakelet(tmp, "run", "--check", "DP-REG-02", "--out", str(tmp_path / "again"), timeout=120)
    assert again.returncode == 0, again.stderr
    left = leftovers(tmp)
    # What a leftover still holds says how it was left (an owner file: whose; none: a removal cut short).
    assert left == [], {name: _contents(tmp / name) for name in left}


def test_plugin_cmd_in_mount_namespace_never_touches_host_kubelet_dir(tmp: Path, tmp_path: Path) -> None:
    host_dir = Path("/var/lib/kubelet")
    existed = host_dir.exists()
    before = sorted(p.name for p in host_dir.iterdir()) if existed else None
    inventory = REPO / "fixtures" / "inventories" / "basic.yaml"
    cmd = (f"{sys.executable} -m harness.reference.device_plugin --plugin-dir /var/lib/kubelet/device-plugins "
           f"--inventory {inventory} --dev-dir {{dev_dir}}")
    out = tmp_path / "out"
    proc = fakelet(tmp, "run", "--plugin-cmd", cmd, "--resource", "fakelet.example.com/gpu", "--mount-namespace",
                   "--check", "DP-REG-01", "--check", "DP-RST-01", "--check", "DP-ALC-01", "--out", str(out))
    if proc.returncode == 2 and "mount-namespace launcher needs root" in proc.stderr:
        pytest.skip("no root and no unprivileged user namespaces: the mount-namespace launcher cannot run here")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((out / "report.json").read_text())
    assert {c["id"]: c["verdict"] for c in report["checks"]} == {
        "DP-ALC-01": "pass", "DP-REG-01": "pass", "DP-RST-01": "pass"}
    assert host_dir.exists() == existed
    if existed:
        assert sorted(p.name for p in host_dir.iterdir()) == before
    assert leftovers(tmp) == []


@pytest.mark.parametrize(("version", "dra", "health"), [("1.32", "v1beta1", "none"), ("newest", "v1", "v1")])
def test_kubelet_version_decides_what_is_negotiated(tmp: Path, tmp_path: Path, version: str, dra: str,
                                                    health: str) -> None:
    """The version-skew matrix is one flag: the report says what the fake kubelet negotiated."""
    out = tmp_path / "out"
    proc = fakelet(tmp, "run", "--subject", "reference-dra", "--kubelet-version", version, "--control-plane", "none",
                   "--check", "DRA-REG-02", "--check", "DRA-HLT-03", "--out", str(out))
    report = json.loads((out / "report.json").read_text())
    assert report["kind"] == "dra"
    assert report["api_versions"]["dra"] == dra and report["api_versions"]["dra-health"] == health, report
    assert f"dra {dra}, dra-health {health}" in proc.stdout
    assert leftovers(tmp) == []


def test_pytest_plugin_runs_dra_checks(tmp: Path, tmp_path: Path) -> None:
    """`pytest --pyargs suites.dra --fakelet-subject ...` works in anyone's CI, API server or not."""
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--pyargs", "suites.dra",
                           "--fakelet-subject", "reference-dra", "--fakelet-control-plane", "none",
                           "--fakelet-check", "DRA-REG-01", "--fakelet-check", "DRA-PRP-01", "--fakelet-out", str(out)],
                          capture_output=True, text=True, env=dict(os.environ, TMPDIR=str(tmp)), timeout=RUN_TIMEOUT_S)
    report = json.loads((out / "report.json").read_text())
    verdicts = {c["id"]: (c["verdict"], c["detail"]) for c in report["checks"]}
    assert verdicts["DRA-REG-01"][0] == "pass", (verdicts, proc.stdout)
    assert verdicts["DRA-PRP-01"] == ("skip", "needs a kube-apiserver: no API server: control plane 'none' was chosen")
    assert report["summary"]["conformant"] is False  # a skipped MUST check is never a pass
    assert report["summary"]["status"] == "INCOMPLETE"
    assert leftovers(tmp) == []


@pytest.mark.parametrize(("value", "message"), [
    ("", "--out is empty"),
    ("/", "refusing to write a report into /"),
    ("~", "refusing to write a report into"),
    ("SOMEONES", "is not empty and holds no fakelet report"),
    ("FILE/sub", "is a file, not a directory, so nothing can be made under it"),
])
def test_out_that_would_clobber_is_refused(tmp: Path, tmp_path: Path, value: str, message: str) -> None:
    if value == "SOMEONES":
        (tmp_path / "thesis.tex").write_text("precious")
        value = str(tmp_path)
    if value == "FILE/sub":  # once "File exists: FILE", from mkdir
        (tmp_path / "thesis.tex").write_text("precious")
        value = str(tmp_path / "thesis.tex" / "sub")
    proc = fakelet(tmp, "run", "--check", "DP-REG-02", "--out", value, timeout=60)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert leftovers(tmp) == []
    assert not (tmp_path / "thesis.tex").exists() or (tmp_path / "thesis.tex").read_text() == "precious"


def test_an_earlier_report_is_replaced_whole(tmp: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    first = fakelet(tmp, "run", "--check", "DP-REG-02", "--out", str(out))
    assert first.returncode == 0, first.stderr
    stray = out / "artifacts" / "DP-OLD-01" / "timeline.json"
    stray.parent.mkdir(parents=True)
    stray.write_text("[]")
    second = fakelet(tmp, "run", "--check", "DP-REG-03", "--out", str(out))
    assert second.returncode == 0, second.stderr
    assert not stray.exists() and (out / "artifacts" / "DP-REG-03").is_dir()
    assert not (out / "artifacts" / "DP-REG-02").exists()


def test_a_kubeconfig_that_does_not_parse_is_bad_input(tmp: Path, tmp_path: Path) -> None:
    broken = tmp_path / "kubeconfig"
    broken.write_text("apiVersion: v1\nclusters: [")
    proc = fakelet(tmp, "run", "--subject", "reference-dra", "--control-plane", f"kubeconfig:{broken}",
                   "--out", str(tmp_path / "out"), timeout=60)
    assert proc.returncode == 2 and "not YAML" in proc.stderr, proc.stderr
    assert leftovers(tmp) == [] and not (tmp_path / "out").exists()


# -- careless input, second pass (issue 28): every command validates like `fakelet run` ----------------------

BAD_INPUT_TIMEOUT_S = 60


def one_line_usage_error(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 2, proc
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


@pytest.mark.parametrize(("value", "says"), [
    ("nan", "got nan"), ("inf", "got inf"), ("1e300", "got 1e+300"), ("0", "got 0"), ("-1", "got -1"),
])
def test_up_for_is_finite_and_bounded(tmp: Path, value: str, says: str) -> None:
    # nan stopped the session at once, inf and 1e300 were a traceback from threading's timer.
    line = one_line_usage_error(fakelet(tmp, "up", "--for", value, timeout=BAD_INPUT_TIMEOUT_S))
    assert line == f"fakelet: error: --for must be a positive number (at most 604800), {says}"
    assert leftovers(tmp) == []


@pytest.mark.parametrize(("kind", "says"), [
    ("nonempty", "is not empty and holds no fakelet report"),
    ("file", "exists and is not a directory"),
    ("dangling", "a dangling symlink"),
])
@pytest.mark.parametrize("command", ["up", "run"])
def test_out_that_cannot_be_a_report_dir_is_refused_before_anything_starts(
        tmp: Path, tmp_path: Path, kind: str, says: str, command: str) -> None:
    # `up --out` wrote into an unrelated non-empty directory; an --out that was a file left the whole sandbox
    # behind; a dangling symlink said "File exists".
    out = tmp_path / "out"
    if kind == "nonempty":
        out.mkdir()
        (out / "mine.txt").write_text("someone's\n")
    elif kind == "file":
        out.write_text("someone's\n")
    else:
        out.symlink_to(tmp_path / "nowhere")
    proc = fakelet(tmp, command, "--out", str(out), *(["--for", "1"] if command == "up" else []),
                   timeout=BAD_INPUT_TIMEOUT_S)
    assert says in one_line_usage_error(proc)
    assert leftovers(tmp) == []
    assert [p.name for p in tmp_path.iterdir()] == ["out"]
    if kind == "nonempty":
        assert [p.name for p in out.iterdir()] == ["mine.txt"]


@pytest.mark.parametrize(("args", "says"), [
    (["run", "--seed", "-1"], "--seed must be a non-negative integer (at most 9223372036854775807), got -1"),
    (["up", "--seed", str(2**64)], f"--seed must be a non-negative integer (at most 9223372036854775807), got {2**64}"),
    (["fidelity", "--mutant-bound", "nan"], "--mutant-bound must be a positive number (at most 30), got nan"),
    (["fidelity", "--mutant-bound", "45"], "--mutant-bound must be a positive number (at most 30), got 45"),
    (["pods", "create", "--count", "100000"], "--count must be a positive integer (at most 64), got 100000"),
    (["pods", "create", "--toleration-seconds", str(2**70)], "--toleration-seconds must be a non-negative integer "
                                                            f"(at most 3600), got {2**70}"),
    (["devices", "flap", "gpu-0", "--cycles", "1000000000"],
     "--cycles must be a positive integer (at most 10000), got 1000000000"),
    (["devices", "flap", "gpu-0", "--period", "1e300"],
     "--period must be a positive number (at most 3600), got 1e+300"),
    (["devices", "flap", "gpu-0", "--period", "nan"], "--period must be a positive number (at most 3600), got nan"),
    (["devices", "heat", "gpu-0", "1e9"], "heat temperature must be a number from -273.15 to 1000, got 1e+09"),
    (["devices", "ecc", "gpu-0", str(10**12)], "ecc count must be a positive integer (at most 1000000), got "
                                               f"{10**12}"),
    (["devices", "xid", "gpu-0", str(10**12)], f"xid must be a positive integer (at most 1000), got {10**12}"),
])
def test_numeric_flags_are_finite_and_in_range_everywhere(tmp: Path, args: list[str], says: str) -> None:
    # Checked before anything is reached: --socket names no session, and a run that slipped through stays short.
    socket = ["--socket", str(tmp / "none.sock")] if args[0] in ("pods", "devices") else []
    short = {"run": ["--check", "DP-REG-02"], "up": ["--for", "1"], "fidelity": ["--subject", "reference-dp"]}
    out = ["--out", str(tmp / "out")] if args[0] in short else []
    proc = fakelet(tmp, args[0], *socket, *args[1:], *short.get(args[0], []), *out, timeout=BAD_INPUT_TIMEOUT_S)
    assert one_line_usage_error(proc).endswith(says), proc.stderr
    assert leftovers(tmp) == []


@pytest.mark.parametrize("kind", ["fifo", "dangling"])
def test_a_kubeconfig_that_is_no_regular_file_is_refused_unread(tmp: Path, tmp_path: Path, kind: str) -> None:
    path = tmp_path / "kubeconfig"
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to(tmp_path / "gone")
    proc = fakelet(tmp, "run", "--subject", "reference-dra", "--control-plane", f"kubeconfig:{path}",
                   "--out", str(tmp_path / "out"), timeout=BAD_INPUT_TIMEOUT_S)
    says = "a FIFO, not a regular file" if kind == "fifo" else "a dangling symlink"
    assert f"kubeconfig {path}: cannot read: {says}" in one_line_usage_error(proc)
    assert leftovers(tmp) == []


def test_user_input_is_quoted_onto_one_line(tmp: Path) -> None:
    line = one_line_usage_error(fakelet(tmp, "run", "--check", "X\rY", timeout=BAD_INPUT_TIMEOUT_S))
    assert line.startswith("fakelet: error: unknown check ID(s) X\\rY; known:")


@pytest.mark.parametrize("args", [["run", "--seed", "x"], ["up", "--for", "soon"], ["scenario", "run", "x", "--repeat",
                                                                                  "y"], ["nonsense"], []])
def test_argparse_errors_are_one_line_too(tmp: Path, args: list[str]) -> None:
    line = one_line_usage_error(fakelet(tmp, *args, timeout=BAD_INPUT_TIMEOUT_S))
    assert line.startswith("fakelet") and ": error: " in line and line.endswith("--help)"), line


def test_checks_of_both_kinds_go_each_to_its_own_subjects_run() -> None:
    """`--check DP-... --check DRA-...` over the reference subjects: each run gets only its own checks (the device
    plugin's check run once ended in a pytest internal error, refusing the DRA ID as unknown)."""
    from harness.run.commands import build_parser, configs

    args = build_parser().parse_args(["run", "--check", "DP-REG-02", "--check", "DRA-REG-01", "--jobs", "2"])
    assert {r.spec.name: r.checks for r in configs(args)} == {"reference-dp": ["DP-REG-02"],
                                                              "reference-dra": ["DRA-REG-01"]}


def test_a_stop_signal_after_the_run_ended_changes_nothing() -> None:
    """A SIGINT'd run exited -2 with a CONFORMANT report: the signal came during the interpreter's teardown, after
    main() returned, when the default handlers are back. From then on the entry point blocks stop signals."""
    code = ("import atexit, os, signal, harness.run.cli as c\n"
            "c.main = lambda argv=None: 0\n"
            "atexit.register(lambda: os.kill(os.getpid(), signal.SIGTERM))\n"
            "c.entry()\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-500:])
