"""fakelet as its users get it: the built wheel, in a fresh venv, run from an empty directory.

    python tools/installed_check.py [--dist DIR] [--keep] [--only NAME ...]

Builds the sdist and, from it, the wheel (`python -m build`, as a release does), installs the wheel
into a fresh venv in a temporary directory outside the checkout, and there runs what a user runs
(STEPS): --version, doctor, the main job on both reference subjects, one check on each vendor skin,
an upstream subject built from the bundled Go module, a scenario, an explore sample, the pytest
plugin over a subject file of the user's own, bundle and verify, and `pipx run` from the wheel.

What proves that nothing is read from the checkout: the steps run in a private mount namespace where
the checkout is hidden under an empty tmpfs (a read fails there as on a user's machine), and every
Python process of the venv carries an audit hook that logs any open, listing or chdir under the
checkout's path; one logged access fails the check. Exit 0 when every step exits as expected and
nothing touched the checkout, 1 otherwise, 2 when the check itself cannot run (one line says why).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STEP_TIMEOUT_S = 900  # the longest step, the main job, takes about 2 minutes on 2 cores with binaries cached
BUILD_TIMEOUT_S = 600  # python -m build: an isolated env with setuptools from the index, then sdist and wheel
AUDIT_LOG = "checkout-access.log"
FORBID_ENV = "FAKELET_FORBIDDEN_ROOT"  # read by the audit hook below

# A device plugin described the way a vendor describes theirs, in a file of the user's own: the reference
# plugin's code, found in the installed package, and the bundled inventory by name.
SUBJECT_FILE = """\
name: my-plugin
kind: device-plugin
command: ["{python}", "-m", "harness.reference.device_plugin", "--plugin-dir", "{plugin_dir}",
          "--kubelet-socket", "{kubelet_socket}", "--resource", "{resource}",
          "--sysfs-root", "{sysfs_root}", "--dev-dir", "{dev_dir}"]
resource: example.com/gpu
socket: my-plugin.sock
backend: {inventory: basic, observes: [health, temperature, hotplug]}
"""

# (name, command, exit codes that pass). Each runs in the empty directory, `fakelet` being the venv's.
STEPS: list[tuple[str, str, tuple[int, ...]]] = [
    ("version", "fakelet --version", (0,)),
    ("doctor", "fakelet doctor", (0,)),
    ("main job", "fakelet run --jobs 4 --out main-report", (0,)),
    ("skin nvml", "fakelet run --subject reference-dp --skin nvml --check DP-HLT-01 --out skin-nvml", (0,)),
    ("skin drm", "fakelet run --subject reference-dp --skin drm --check DP-HLT-01 --out skin-drm", (0,)),
    ("upstream subject", "fakelet run --subject sample-device-plugin --check DP-REG-01 --out upstream", (0,)),
    # The file's mutant case, promised "reproduced": the case that proves the engine can see the bug.
    ("scenario", "fakelet scenario run dp-device-unhealthy-at-start-never-republished"
                 " --case reference-dp/stuck-unhealthy --out scenario", (0,)),
    # A planted bug found, shrunk and replayed: exit 1 is the finding (docs/explore.md); --first ends the search
    # there rather than spending the rest of the budget on the bugs this mutant does not have.
    ("explore", "fakelet explore --subject reference-dp --defect no-reregister --rules kubelet-restart,"
                "plugin-restart,device-fail,pod-admitted --budget 45s --seed 1 --reaction-bound 6 --first "
                "--out explore",
     (1,)),
    ("pytest plugin", "pytest -p no:cacheprovider --pyargs suites.dp --fakelet-subject-file my-plugin.yaml"
                      " --fakelet-check DP-REG-01 --fakelet-check DP-LAW-01 --fakelet-out pytest-report -q", (0,)),
    ("bundle", "fakelet bundle main-report -o main-report.tar.gz", (0,)),
    ("verify", "fakelet verify main-report.tar.gz", (0,)),
    ("pipx run", "pipx run --spec \"$FAKELET_WHEEL\" fakelet --version", (0,)),
]
AFTER = {"bundle": "main job", "verify": "bundle"}  # a step that reads what another wrote
PARALLEL_STEPS = 2

# Installed into the venv's site-packages as sitecustomize: every Python process of the venv logs a
# touch of the checkout. It writes with os.write on a descriptor opened once, outside the hook's reach.
AUDIT_HOOK = """\
import os, sys
_root = os.environ.get("@ENV@")
if _root:
    _root = _root.rstrip("/") + "/"
    _log = os.open(os.path.join(os.environ["FAKELET_AUDIT_DIR"], "@LOG@"), os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    _events = {"open", "os.listdir", "os.scandir", "os.chdir", "os.mkdir", "os.remove", "os.rename"}

    def _hook(event, args):
        if event not in _events or not args or not isinstance(args[0], (str, bytes, os.PathLike)):
            return
        try:
            path = os.fsdecode(args[0])
        except TypeError:
            return
        if path and (os.path.abspath(path) + "/").startswith(_root):
            os.write(_log, f"{os.getpid()} {event} {path} ({' '.join(sys.argv)[:200]})\\n".encode())

    sys.addaudithook(_hook)
""".replace("@ENV@", FORBID_ENV).replace("@LOG@", AUDIT_LOG)


class CannotCheck(RuntimeError):
    """The check cannot run here (no root for the mount namespace, a build that fails)."""


def say(line: str) -> None:
    print(f"installed-check: {line}", flush=True)


def build_dists(out: Path) -> Path:
    """sdist, then the wheel from it; the wheel's path."""
    say("building the sdist and, from it, the wheel (python -m build) ...")
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "build", "--outdir", str(out), str(REPO)], capture_output=True,
                          text=True, timeout=BUILD_TIMEOUT_S)
    if proc.returncode != 0:
        raise CannotCheck(f"python -m build failed: {proc.stderr.strip().splitlines()[-1:]}")
    wheels = sorted(out.glob("fakelet-*.whl"))
    if not wheels or not sorted(out.glob("fakelet-*.tar.gz")):
        raise CannotCheck(f"python -m build made no wheel and sdist in {out}")
    say(f"built {wheels[0].name} in {time.monotonic() - started:.0f}s")
    return wheels[0]


def make_venv(where: Path, wheel: Path) -> Path:
    say("installing the wheel into a fresh venv ...")
    started = time.monotonic()
    subprocess.run([sys.executable, "-m", "venv", str(where)], check=True, timeout=120)
    pip = [str(where / "bin" / "python"), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, str(wheel), "pipx"], check=True, timeout=BUILD_TIMEOUT_S)
    site = Path(subprocess.run([str(where / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_path("
                                "'purelib'))"], capture_output=True, text=True, check=True).stdout.strip())
    (site / "sitecustomize.py").write_text(AUDIT_HOOK)
    say(f"installed in {time.monotonic() - started:.0f}s")
    return where


def clean_env(venv: Path, work: Path, wheel: Path) -> dict[str, str]:
    """The environment a user's shell has: no PYTHONPATH, no tox or venv variables, the venv first on PATH."""
    keep = ("HOME", "LANG", "LC_ALL", "TERM", "TMPDIR", "GOPATH", "GOMODCACHE", "GOCACHE", "GOPROXY", "GOFLAGS",
            "FAKELET_CACHE", "CI")
    env = {k: os.environ[k] for k in keep if k in os.environ}
    go = shutil.which("go")
    path = [str(venv / "bin"), *([str(Path(go).parent)] if go else []), "/usr/local/sbin", "/usr/local/bin",
            "/usr/sbin", "/usr/bin", "/sbin", "/bin"]
    env.update(PATH=":".join(path), GRPC_VERBOSITY="ERROR", PIPX_HOME=str(work / "pipx"),
               PIPX_BIN_DIR=str(work / "pipx" / "bin"), FAKELET_WHEEL=str(wheel), FAKELET_AUDIT_DIR=str(work),
               **{FORBID_ENV: str(REPO)})
    return env


def run_hidden(steps: list[tuple[str, str, tuple[int, ...]]], empty: Path, env: dict[str, str]) -> list[dict]:
    """Each step in a private mount namespace where the checkout is an empty tmpfs; two at a time (most of a
    step is waiting on a plugin's bounds), but a step that reads another's output after it (AFTER)."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        raise CannotCheck("hiding the checkout needs root and unshare(1) (util-linux)")
    names = {name for name, _c, _ok in steps}
    first = [s for s in steps if AFTER.get(s[0]) not in names]
    then = [s for s in steps if AFTER.get(s[0]) in names]
    with ThreadPoolExecutor(PARALLEL_STEPS) as pool:
        done = dict(zip([s[0] for s in first], pool.map(lambda s: run_one(s, empty, env), first), strict=True))
    for step in then:  # in STEPS order, which puts each after what it reads
        done[step[0]] = run_one(step, empty, env)
    return [done[name] for name, _c, _ok in steps]


def run_one(step: tuple[str, str, tuple[int, ...]], empty: Path, env: dict[str, str]) -> dict:
    name, command, ok = step
    say(f"{name}: {command}")
    script = f'mount -t tmpfs -o size=1m,mode=0555 fakelet-hidden "$1" && cd "$2" && {command}'
    started = time.monotonic()
    try:
        proc = subprocess.run(["unshare", "--mount", "--propagation", "private", "--", "bash", "-c", script,
                               "hide", str(REPO), str(empty)], env=env, cwd=empty, timeout=STEP_TIMEOUT_S,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        code, output = proc.returncode, proc.stdout
    except subprocess.TimeoutExpired as err:
        code, output = None, f"did not finish within {STEP_TIMEOUT_S}s: {err.output or ''}"
    took = time.monotonic() - started
    passed = code in ok
    tail = "\n".join(output.strip().splitlines()[-12:])
    say(f"{name}: exit {code} in {took:.0f}s, {'as expected' if passed else f'expected {ok}'}")
    if not passed:
        print(f"--- {name}\n{tail}", flush=True)
    return {"step": name, "command": command, "exit": code, "expected": list(ok), "passed": passed,
            "seconds": round(took, 1), "tail": tail}


def control(empty: Path, env: dict[str, str], work: Path) -> None:
    """The check's own positive control: a listing of the checkout is logged, and finds it empty."""
    probe = f'import os, sys; sys.exit(len(os.listdir(os.environ["{FORBID_ENV}"])))'
    result = run_hidden([("control", f"python -c '{probe}'", (0,))], empty, env)[0]
    log = work / AUDIT_LOG
    logged = log.read_text() if log.is_file() else ""
    if not result["passed"] or "os.listdir" not in logged:
        raise CannotCheck(f"the control failed: the checkout was {'not hidden' if not result['passed'] else 'hidden'}"
                          f" and the audit hook logged {logged.strip()[:200] or 'nothing'}")
    log.unlink()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dist", type=Path, help="a directory with a built wheel (default: build one)")
    parser.add_argument("--only", action="append", default=[], metavar="STEP", help="run only this step")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory (its path is printed)")
    args = parser.parse_args(argv)
    steps = [s for s in STEPS if not args.only or s[0] in args.only]
    if args.only and len(steps) != len(args.only):
        print(f"installed-check: error: unknown step in {args.only}; steps: {[s[0] for s in STEPS]}",
              file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="fakelet-installed-"))
    out = Path.cwd() / "reports-installed"  # the wheel, the main job's report and each step's outcome
    try:
        if REPO in work.parents:
            raise CannotCheck(f"the temporary directory {work} is inside the checkout; set TMPDIR elsewhere")
        wheel = sorted(args.dist.glob("fakelet-*.whl"))[-1] if args.dist else build_dists(work / "dist")
        shutil.rmtree(out, ignore_errors=True)
        (out / "dist").mkdir(parents=True)
        shutil.copy2(wheel, out / "dist")  # tox -e installed hands it on to tools/ci_action_steps.sh
        venv = make_venv(work / "venv", wheel)
        empty = work / "empty"
        empty.mkdir()
        (empty / "my-plugin.yaml").write_text(SUBJECT_FILE)
        env = clean_env(venv, work, wheel)
        control(empty, env, work)
        results = run_hidden(steps, empty, env)
        log = work / AUDIT_LOG
        touched = log.read_text().splitlines() if log.is_file() else []
        if (empty / "main-report").is_dir():
            shutil.copytree(empty / "main-report", out / "main-report")
        (out / "steps.json").write_text(json.dumps({"steps": results, "checkout_access": touched}, indent=2))
    except (CannotCheck, subprocess.SubprocessError, OSError) as err:
        print(f"installed-check: cannot check: {err}", file=sys.stderr)
        return 2
    finally:
        if args.keep:
            say(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    failed = [r["step"] for r in results if not r["passed"]]
    for line in touched[:20]:
        print(f"installed-check: read from the checkout: {line}", flush=True)
    say(f"{len(results) - len(failed)} passed, {len(failed)} failed" +
        (f" ({', '.join(failed)})" if failed else "") + f"; {len(touched)} accesses to the checkout")
    return 0 if not failed and not touched else 1


if __name__ == "__main__":
    sys.exit(main())
