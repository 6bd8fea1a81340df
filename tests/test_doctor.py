"""`fakelet --version` and `fakelet doctor`: what they print, and their exit codes, on this machine and on
the same machine without Go and without root. Each doctor run is --offline (no proxy request) and bounded."""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.instruments.doctor import DOCTOR_HINT, machine_lacks
from harness.launch import gobuild
from harness.run import doctor, prebuild, version

RUN_TIMEOUT_S = 60.0  # a doctor run is a few seconds: imports, unshare probes, go version
VERSION_LINE = re.compile(r"^fakelet \S+ \((commit [0-9a-f]{12}(, dirty tree)?|commit unknown), "
                          r"catalog sha256:[0-9a-f]{12}, \d+ checks\)$")
NOBODY = "65534"  # Debian's nobody and nogroup


def fakelet(*args: str, env: dict[str, str] | None = None,
            prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*prefix, sys.executable, "-m", "harness.run.cli", *args], capture_output=True, text=True,
                          timeout=RUN_TIMEOUT_S, env=env)


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory anyone may use (pytest's tmp_path is 0700: another user could not reach into it)."""
    d = Path(tempfile.mkdtemp(prefix="fk-doctor-", dir="/tmp"))
    d.chmod(0o777)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def doctor_env(cache: Path, path: str | None = None) -> dict[str, str]:
    """The environment of a doctor run with its own build cache (empty unless the test fills it)."""
    env = {k: v for k, v in os.environ.items() if k not in ("KUBEBUILDER_ASSETS", "DOCKER_HOST")}
    env.update(FAKELET_CACHE=str(cache), HOME=str(cache))
    if path is not None:
        env["PATH"] = path
    return env


def run_doctor(env: dict[str, str], prefix: tuple[str, ...] = ()) -> tuple[int, dict]:
    proc = fakelet("doctor", "--offline", "--json", env=env, prefix=prefix)
    assert proc.returncode in (0, 1), proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def doctor_here(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> tuple[int, dict]:
    """`fakelet doctor --offline --json` in this process, under `env` (no second interpreter's imports)."""
    for key in ("KUBEBUILDER_ASSETS", "DOCKER_HOST"):
        monkeypatch.delenv(key, raising=False)
    for key in ("FAKELET_CACHE", "HOME", "PATH"):
        monkeypatch.setenv(key, env[key])
    printed: list[str] = []
    code = doctor.main(argparse.Namespace(offline=True, json=True), printed.append)
    return code, json.loads("\n".join(printed))


def tier(result: dict, key: str) -> dict:
    return next(t for t in result["tiers"] if t["key"] == key)


def fake_cached(names: tuple[str, ...]) -> None:
    """Put stand-ins where gobuild.cached() looks for these control-plane binaries in $FAKELET_CACHE (never
    run here)."""
    for b in prebuild.control_plane():
        if b.name in names:
            assert b.module is not None
            path = gobuild._artifact(b.module, b.package, b.name, b.get, b.cgo)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("#!/bin/sh\nexit 1\n")
            path.chmod(0o755)


# -- fakelet --version ----------------------------------------------------------------------------------


def test_version_prints_version_commit_and_catalog_without_the_harness() -> None:
    # cli.main answers --version before importing the commands: neither grpc nor the suites are loaded.
    script = ("import sys\nfrom harness.run import cli\ncode = cli.main(['--version'])\n"
              "print(sorted({'grpc', 'harness.run.commands', 'suites.dp'} & set(sys.modules)))\nsys.exit(code)")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr
    line, imported = proc.stdout.splitlines()
    assert VERSION_LINE.match(line), line
    assert imported == "[]"


def test_version_through_the_parser_says_the_same(capsys: pytest.CaptureFixture[str]) -> None:
    from harness.run.commands import main

    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert VERSION_LINE.match(capsys.readouterr().out.strip())


def test_the_catalog_digest_read_from_source_is_the_reports() -> None:
    from harness.run.provenance import catalog_facts

    digest, count = version.catalog_from_source()
    assert catalog_facts() == {"sha256": digest, "checks": count}


@pytest.mark.parametrize(("info", "text"), [
    ({}, "commit unknown"),
    ({"commit": "0123456789abcdef0123", "dirty": False}, "commit 0123456789ab"),
    ({"commit": "0123456789abcdef0123", "dirty": True}, "commit 0123456789ab, dirty tree"),
])
def test_commit_text(info: dict, text: str) -> None:
    assert version.commit_text(info) == text


# -- the pointer at doctor --------------------------------------------------------------------------------


def test_a_refusal_points_at_doctor_once() -> None:
    once = machine_lacks("etcd not found")
    assert once == f"etcd not found {DOCTOR_HINT}"
    assert machine_lacks(once) == once  # passed on through another layer: still once


def test_missing_go_says_the_fix_and_points_at_doctor(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(gobuild.GoUnavailable) as err:
        gobuild.go_binary()
    assert str(err.value) == f"go toolchain not found on PATH: {gobuild.GO_FIX} {DOCTOR_HINT}"


def test_the_go_minimum_is_the_modules_own() -> None:
    assert gobuild.GO_MINIMUM == "{}.{}".format(*doctor.go_needed())


# -- fakelet doctor ----------------------------------------------------------------------------------------


def test_doctor_on_this_machine(shared_dir: Path) -> None:
    if os.geteuid() != 0 or shutil.which("go") is None or shutil.which("etcd") is None:
        pytest.skip("this test describes the project's machine: root, with Go and etcd")
    proc = fakelet("doctor", "--offline", env=doctor_env(shared_dir))
    lines = proc.stdout.splitlines()
    assert VERSION_LINE.match(lines[0])
    # One line per tier: a status word, what was found, and the fix where one is needed.
    for line in lines[1:-2]:
        assert line.split()[0] in ("ok", "missing", "limited", "unknown"), line
        assert line.split()[0] == "ok" or "; fix: " in line or line.startswith("unknown"), line
    assert "ok       root: running as root" in lines
    assert any(line.startswith("ok       Go: go1.") for line in lines)
    assert "unknown  Go module proxy: not checked (--offline)" in lines
    # An empty cache: the main job builds its kube binaries, with Go, first.
    cache = next(line for line in lines if "build cache:" in line)
    assert cache.startswith("limited") and "kube-apiserver, kube-controller-manager" in cache
    assert cache.endswith("fix: fakelet prebuild --all")
    assert lines[-2].startswith("can run: main job (reference-dp, reference-dra)")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert DOCTOR_HINT not in proc.stdout  # doctor is where the pointer points


def test_without_go_doctor_names_it_and_the_main_job_needs_the_cache(shared_dir: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    go = shutil.which("go")
    if go is None or shutil.which("etcd") is None:
        pytest.skip("needs go on PATH (to take it away) and etcd")
    go_dir = str(Path(go).parent)
    path = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if p and p != go_dir)
    if shutil.which("go", path=path) is not None:
        pytest.skip(f"go is in more than one PATH directory ({shutil.which('go', path=path)})")
    code, result = doctor_here(monkeypatch, doctor_env(shared_dir, path))
    go_tier = tier(result, "go")
    assert go_tier["status"] == "missing" and go_tier["fix"] == gobuild.GO_FIX
    assert "install Go 1." in go_tier["fix"] and "https://go.dev/dl" in go_tier["fix"]
    # Nothing cached and nothing can be built: the DRA reference cannot have its API server.
    assert code == 1 and result["main_job"] is False
    why = result["can_run"]["main job (reference-dp, reference-dra)"]
    assert why == "kube-apiserver neither cached nor buildable"
    # With the control plane's binaries in the cache, Go is not needed for the main job.
    monkeypatch.setenv("FAKELET_CACHE", str(shared_dir))
    fake_cached(doctor.CONTROL_PLANE_NEEDS)
    code, result = doctor_here(monkeypatch, doctor_env(shared_dir, path))
    assert code == 0 and result["main_job"] is True
    assert tier(result, "go")["status"] == "missing"
    assert result["can_run"]["upstream Go subjects"].endswith("neither cached nor buildable")


def test_not_root_doctor_names_root_as_the_missing_piece(shared_dir: Path) -> None:
    setpriv = shutil.which("setpriv")
    if os.geteuid() != 0 or setpriv is None:
        pytest.skip("needs root and setpriv to run doctor as another user")
    # CAP_DAC_READ_SEARCH and nothing else: the test's own interpreter may sit under a directory only root may
    # enter (tox makes .tox 0700), and reading it is all the capability gives; doctor sees uid 65534.
    prefix = (setpriv, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--inh-caps=+dac_read_search",
              "--ambient-caps=+dac_read_search", "--")
    code, result = run_doctor(doctor_env(shared_dir), prefix)
    root = tier(result, "root")
    assert root["status"] == "limited" and root["fix"] == "run as root (sudo fakelet ...)"
    assert result["can_run"]["--node real"] == "not root"
    namespaces = tier(result, "namespaces")
    if namespaces["status"] != "ok":  # no unprivileged user namespaces here: doctor says so, and the fix
        assert "refused" in namespaces["what"] and "user namespaces" in namespaces["fix"]
    else:
        assert "inside a user namespace" in namespaces["what"]
    assert tier(result, "cgroups")["status"] == "limited"
    # The main job needs no root: etcd, and the kube binaries buildable with Go (or cached).
    assert code == (0 if result["main_job"] else 1)
