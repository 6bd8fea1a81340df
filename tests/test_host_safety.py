"""Host safety under the mount-namespace launcher: the plugin writes where a container would, the host sees nothing.

A plugin whose binary (and PYTHONPATH) live under the temp dir writes into /tmp,
/run, /var/run/cdi, /etc/cdi and the device-plugins dir; the host's /tmp, /run,
CDI dirs and /var/lib/kubelet are the same before and after.

Other work on a machine adds and removes entries in the shared /tmp all the time, so
each launch runs in a mount namespace of its own whose /tmp is a fresh tmpfs: that /tmp
is the "host's" for the launcher under test, and this test's alone, so "unchanged" is
exact. /run, /etc and /var are the real host's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

import pytest

from harness.instruments.timeline import Timeline
from harness.launch import namespace, nsexec
from harness.launch import process as launchers
from harness.launch.namespace import NamespaceLauncher
from harness.launch.process import CONTAINER_PRIVATE_DIRS, HOST_DEVICE_PLUGIN_DIR, LaunchError

REPO = Path(__file__).resolve().parents[1]  # the checkout these tests belong to
WAIT_S = 20.0
RUN_TIMEOUT_S = 600  # a conformance run of two checks, with its binary already built
RUN_SKIP = ("/run/user",)  # per-login state, changes by itself
SAMPLE_ALLOCATE_FILES = ("/tmp/Dev-1", "/tmp/Dev-2")  # the sample plugin's Allocate writes /tmp/<device ID>

PLUGIN = f"""#!{sys.executable}
import os, sys
import fkhs_helper  # from PYTHONPATH, which points into the hidden /tmp
marker = sys.argv[1]
for d in sys.argv[2:]:
    path = os.path.join(d, marker)
    with open(path, "w") as f:
        f.write(fkhs_helper.CONTENT)
    with open(path) as f:
        assert f.read() == fkhs_helper.CONTENT
    print("wrote", d, flush=True)
print("entries of /tmp:", " ".join(sorted(os.listdir("/tmp"))), flush=True)
"""


def tree(root: str, skip: tuple[str, ...] = ()) -> list[str] | None:
    """Every path under `root` (names only, symlinks not followed), or None when it does not exist."""
    if not os.path.lexists(root):
        return None
    out = []
    for parent, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if os.path.join(parent, d) not in skip]
        out += [os.path.join(parent, n) for n in dirs + files]
    return sorted(out)


# This test's own interpreter and code may live under /tmp (a CI clone, a tox env there):
# each /tmp of our own puts them back, and listings leave them out.
KEEP = sorted({sys.prefix, sys.base_prefix, str(REPO)})


def kept_names() -> set[str]:
    return {Path(os.path.realpath(k)).relative_to("/tmp").parts[0] for k in KEEP
            if os.path.realpath(k).startswith("/tmp/")}


def snapshot() -> dict[str, Any]:
    return {
        "/tmp": sorted(set(os.listdir("/tmp")) - kept_names()),
        "/run": tree("/run", RUN_SKIP),
        "/var/run/cdi": tree("/var/run/cdi"),
        "/etc/cdi": tree("/etc/cdi"),
        "/var/lib/kubelet": tree("/var/lib/kubelet"),
    }


def on_own_tmp(function: str, *args: Any) -> dict[str, Any]:
    """This module's `function(*args)`, run where /tmp is a fresh tmpfs (see the module docstring)."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run([*launchers.namespace_prefix(), "--", sys.executable, __file__, function, json.dumps(args)],
                          capture_output=True, text=True, timeout=RUN_TIMEOUT_S, cwd="/", env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


@pytest.fixture(autouse=True)
def _mount_namespaces() -> None:
    try:
        launchers.namespace_prefix()
    except LaunchError as err:
        pytest.skip(f"no mount namespace here: {err}")


# -- run on a /tmp of their own ----------------------------------------------------


def launch_plugin(private_dirs: list[str], pid_namespace: bool = True) -> dict[str, Any]:
    if not pid_namespace:
        real = namespace.unshare_prefix

        def no_pid_namespace(mount: bool, pid: bool) -> list[str]:
            if pid:
                raise LaunchError("refused by the test")
            return real(mount, pid)
        namespace.unshare_prefix = no_pid_namespace  # this process is this launch's alone
    work = Path(tempfile.mkdtemp(prefix="fkhs-work-", dir="/tmp"))  # as the tests' sandboxes: under /tmp
    marker = f"fkhs-{uuid.uuid4().hex[:12]}"
    bin_dir, lib_dir, dp_dir = work / "bin", work / "pylib", work / "device-plugins"
    for d in (bin_dir, lib_dir, dp_dir):
        d.mkdir()
    script = bin_dir / "plugin"
    script.write_text(PLUGIN)
    script.chmod(0o755)
    (lib_dir / "fkhs_helper.py").write_text("CONTENT = 'written inside the namespace'\n")
    targets = [*CONTAINER_PRIVATE_DIRS, *private_dirs, HOST_DEVICE_PLUGIN_DIR]
    timeline = Timeline()
    launcher = NamespaceLauncher("plugin", [str(script), marker, *targets],
                                 {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(lib_dir)}, work / "plugin.log",
                                 timeline, binds={str(dp_dir): HOST_DEVICE_PLUGIN_DIR}, private_dirs=private_dirs)
    before = snapshot()
    try:
        launcher.start()
        code = launcher.wait_exit(WAIT_S)
    finally:
        launcher.stop()
    return {"marker": marker, "work": work.name, "targets": targets, "code": code, "log": launcher.log_tail(50),
            "contained": launcher.contained, "dp_files": os.listdir(dp_dir), "before": before, "after": snapshot(),
            "containment": [e.data for e in timeline.events(kind="process.containment")]}


def run_sample_plugin() -> dict[str, Any]:
    out = tempfile.mkdtemp(prefix="fkhs-out-", dir="/tmp")
    before = snapshot()
    proc = subprocess.run([sys.executable, "-m", "harness.run.cli", "run", "--subject", "sample-device-plugin",
                           "--check", "DP-ALC-01", "--check", "DP-ROB-01", "--out", out],
                          capture_output=True, text=True, timeout=RUN_TIMEOUT_S, cwd="/tmp")
    return {"code": proc.returncode, "output": proc.stdout + proc.stderr, "before": before, "after": snapshot()}


# -- the tests -----------------------------------------------------------------------------


def test_the_mount_plan_dedups_nests_and_puts_back_only_what_is_hidden(tmp_path: Path) -> None:
    sandbox = tmp_path / "sandbox"
    (sandbox / "sub").mkdir(parents=True)
    ops = nsexec.plan(binds=[(str(sandbox), "/var/run/cdi")],
                      privates=["/tmp", "/var/run", "/var/run/cdi", "/tmp", "/etc/cdi/inner"],
                      keeps=["/tmp", str(sandbox), str(sandbox / "sub"), "/usr", "/no/such/path"])
    try:
        run = os.path.realpath("/var/run")  # /run on Debian, where /var/run is a symlink
        assert {(op.kind, op.path) for op in ops} == {
            ("private", "/tmp"), ("private", run), ("bind", f"{run}/cdi"), ("private", "/etc/cdi/inner"),
            ("keep", str(sandbox)),  # under the hidden /tmp; /tmp itself and what is visible anyway are not
        }
        assert len(ops) == 5
        depths = [len(Path(op.path).parts) for op in ops]
        assert depths == sorted(depths), "parents are mounted before what lies in them"
    finally:
        for op in ops:
            if op.source_fd is not None:
                os.close(op.source_fd)


@pytest.mark.parametrize("private_dirs", [
    [],
    ["/var/run/cdi", "/tmp"],  # the defaults again, one through a symlink (/var/run -> /run on Debian)
    ["/var/run/fkhs-nested/inner", "/opt/fkhs-missing/deeper"],  # nested in a private dir; missing parents
], ids=["defaults", "repeated", "nested-and-missing"])
def test_the_host_sees_nothing_of_what_the_plugin_writes(private_dirs: list[str]) -> None:
    r = on_own_tmp("launch_plugin", private_dirs)
    assert r["code"] == 0, r["log"]
    assert r["contained"]
    for d in r["targets"]:
        assert f"wrote {d}\n" in r["log"] + "\n", r["log"]
    # The private /tmp held the plugin's file and what was put back for it (its own
    # directory's ancestor under /tmp), never the host's entries.
    listed = next(line for line in r["log"].splitlines() if line.startswith("entries of /tmp:"))
    assert set(listed.split()[3:]) - kept_names() == {r["marker"], r["work"]}, listed
    assert r["dp_files"] == [r["marker"]], "the device-plugins dir is the sandbox's"
    assert r["before"] == r["after"]
    assert r["before"]["/tmp"] == [r["work"]]
    assert not os.path.lexists("/opt/fkhs-missing") and not os.path.lexists("/run/fkhs-nested")


def test_without_a_pid_namespace_the_plugin_still_gets_private_dirs() -> None:
    r = on_own_tmp("launch_plugin", [], False)
    assert r["code"] == 0, r["log"]
    assert not r["contained"]
    assert r["containment"] == [{"pid_namespace": False, "reason": "refused by the test"}]
    assert r["before"] == r["after"]


@pytest.mark.subjects  # builds the upstream plugin from the Go module proxy (minutes when not cached)
def test_a_conformance_run_of_the_sample_plugin_leaves_the_host_alone() -> None:
    """The upstream sample plugin's Allocate writes /tmp/<device ID>: those land in its private /tmp."""
    from harness.launch.gobuild import GoUnavailable, build
    from harness.spec.subjects import load_subject
    spec = load_subject("sample-device-plugin")
    assert spec.build is not None
    try:
        build(Path(spec.build["module"]), spec.build["package"], spec.build.get("binary"))
    except (GoUnavailable, RuntimeError) as err:
        pytest.skip(f"cannot build the sample plugin here: {err}")
    r = on_own_tmp("run_sample_plugin")
    assert r["code"] == 0 and "CONFORMANT" in r["output"], r["output"]
    assert r["before"] == r["after"]
    assert not any(os.path.basename(p) in r["after"]["/tmp"] for p in SAMPLE_ALLOCATE_FILES)


def main() -> None:
    """In the namespace on_own_tmp made: a fresh /tmp, then the function asked for; its result on stdout."""
    nsexec.setup([], ["/tmp"], KEEP)
    print(json.dumps(globals()[sys.argv[1]](*json.loads(sys.argv[2]))))


if __name__ == "__main__":
    main()
