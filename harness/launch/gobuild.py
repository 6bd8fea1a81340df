"""Build Go test-bench binaries (wire-compat program, real third-party plugins).

Go is only the test bench: this module compiles a package from a small module
directory in this repository (a go.mod that pins upstream modules from the Go
module proxy) and caches the binary, keyed by a hash of the module's files,
so that repeated runs and CI reruns on the same machine skip the build.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import IO

from harness.instruments.doctor import machine_lacks
from harness.instruments.progress import Progress, elapsed_text, home_relative
from harness.launch.owners import start_time
from harness.launch.process import die_with_parent

BUILD_TIMEOUT_S = 1200  # a cold k8s.io/kubernetes build on 2 cores takes minutes
WAIT_QUIET_S = 2.0  # another process finishing the same build this soon is not worth a word
# The newest `go` line of fakelet's own wrapper modules (fixtures/go/*/go.mod): builds run with the toolchain
# on PATH (no GOTOOLCHAIN download), so an older go refuses them. tests/test_doctor.py keeps it in step.
GO_MINIMUM = "1.26"
GO_DOWNLOAD = "https://go.dev/dl"
GO_FIX = f"install Go {GO_MINIMUM}+ ({GO_DOWNLOAD}) or put go on PATH"


# Wall time of one build into an empty fakelet cache on this project's 2-core machine, 2026-11-28, at a load of
# 3 to 6 (the first `tox -e conformance` run, then `fakelet prebuild --all --kubelet-version 1.37`, beside other
# test runs). The first kube build of a release also fills Go's module and build caches (~/go/pkg/mod,
# ~/.cache/go-build), and the kube builds after it share most of its packages: FIRST_KUBE_BUILD_S is what the
# first costs, COLD_BUILD_S what each costs after it. A binary without a figure was not measured.
FIRST_KUBE_BUILD_S: dict[str, int] = {
    "kube-apiserver": 403,  # 6m43s: v1.36.3 with empty Go module and build caches
    "kubelet": 509,  # 8m29s: v1.37.2, the first build of 1.37 (its modules downloaded), after 1.36's
}
COLD_BUILD_S: dict[str, int] = {
    "kube-controller-manager": 119,  # 1m59s, right after kube-apiserver
    "kube-scheduler": 18,  # after those two
    "kubelet": 55,  # v1.36.3, after those three
    "dra-test-driver": 13,  # k8s.io/kubernetes/test/e2e/dra/test-driver, after the kube binaries
    "kind": 11,  # v0.33.0, after the kube binaries
    "dra-example-kubeletplugin": 256,  # 4m16s: v0.4.0 on the k8s.io v0.36.2 modules, not the kube binaries'
    "nvmldra": 240,  # 4m00s: the same k8s.io modules, but cgo: nothing of the static builds' Go cache is reused
    "nvmlplugin": 28,  # cgo, after nvmldra
    # containerd v2.4.2 for the real node (fixtures/go/containerd), after the kube binaries, at a load of 9 to 18:
    # 4m06s for the three.
    "containerd": 233,  # 3m53s
    "containerd-shim-runc-v2": 3,  # after containerd
    "ctr": 9,  # after containerd
}

class GoUnavailable(RuntimeError):
    """No usable Go toolchain: callers turn this into a skip with this text."""


def cache_root() -> Path:
    """fakelet's cache: built binaries under bin/, generated wrapper modules beside them."""
    return Path(os.environ.get("FAKELET_CACHE") or Path.home() / ".cache" / "fakelet")


def cache_dir() -> Path:
    return cache_root() / "bin"


def _module_hash(module_dir: Path, package: str) -> str:
    h = hashlib.sha256(package.encode())
    for path in sorted(module_dir.rglob("*")):
        if path.is_file() and path.suffix in {".go", ".mod", ".sum"}:
            h.update(str(path.relative_to(module_dir)).encode())
            h.update(path.read_bytes())
    return h.hexdigest()[:16]


def go_binary() -> str:
    go = shutil.which("go")
    if go is None:
        raise GoUnavailable(machine_lacks(f"go toolchain not found on PATH: {GO_FIX}"))
    return go


def _go_env(cgo: bool = False) -> dict[str, str]:
    # Static unless a package must call a C library (go-nvml dlopens libnvidia-ml.so.1 through cgo).
    env = dict(os.environ, CGO_ENABLED="1" if cgo else "0", GOFLAGS="-mod=mod -buildvcs=false")
    # Go 1.27's default JSON experiment breaks some Kubernetes components.
    env.setdefault("GOEXPERIMENT", "nojsonv2")
    return env


def run_go(args: list[str], cwd: Path, timeout_s: float | None = None,
           cgo: bool = False) -> subprocess.CompletedProcess[str]:
    """One go command with the builds' environment, its output captured; the caller judges its exit code.
    GoUnavailable without go; RuntimeError when it outlasts `timeout_s` (None: a build's bound)."""
    timeout_s = BUILD_TIMEOUT_S if timeout_s is None else timeout_s  # read now: tests shorten the bound
    try:
        # Dies with its builder: a fakelet killed outright once left `go build` running, still writing.
        return subprocess.run(die_with_parent([go_binary(), *args]), cwd=cwd, env=_go_env(cgo),
                              capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        # A RuntimeError like any failed build: every caller turns those into a skip or a one-line error.
        raise RuntimeError(f"go {' '.join(args)} in {cwd} did not finish within {timeout_s:g}s") from None


def _go(args: list[str], cwd: Path, cgo: bool = False) -> None:
    proc = run_go(args, cwd, cgo=cgo)
    if proc.returncode != 0:
        raise RuntimeError(f"go {' '.join(args)} in {cwd} failed:\n{proc.stderr[-4000:]}")


def build(module_dir: Path, package: str = ".", name: str | None = None, get: str | None = None,
          cgo: bool = False, why: str = "") -> Path:
    """Build `package` inside `module_dir`; return the cached binary's path.

    `get` (module@version) resolves an unpinned requirement first, in a copy
    of the module directory, so that the repository's go.mod stays untouched.
    `why` ("for the local API server") goes into the progress lines of a build.
    """
    module_dir = Path(module_dir).resolve()
    if not (module_dir / "go.mod").is_file():
        raise FileNotFoundError(f"{module_dir}/go.mod not found")
    name = name or module_dir.name
    out = _artifact(module_dir, package, name, get, cgo)
    if out.is_file() and os.access(out, os.X_OK):
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    title = describe(module_dir, package, name, get)
    # Parallel check processes ask for the same binary at once: one builds, the others wait for it.
    with open(out.with_name(out.name + ".lock"), "w") as lock:
        _lock(lock, title)
        if out.is_file() and os.access(out, os.X_OK):
            return out
        _remove_dead_temps(out)
        with Progress(title, detail=_build_detail(module_dir, package, name, get, why)):
            return _build_to(out, module_dir, package, get, cgo)


def _artifact(module_dir: Path, package: str, name: str, get: str | None, cgo: bool) -> Path:
    return cache_dir() / f"{name}-{_module_hash(module_dir, package + (get or '') + ('+cgo' if cgo else ''))}"


def cached(module_dir: Path, package: str = ".", name: str | None = None, get: str | None = None,
           cgo: bool = False) -> Path | None:
    """The binary `build` would return, when it is already built; never builds (a report's provenance asks)."""
    module_dir = Path(module_dir).resolve()
    if not (module_dir / "go.mod").is_file():
        return None
    out = _artifact(module_dir, package, name or module_dir.name, get, cgo)
    return out if out.is_file() and os.access(out, os.X_OK) else None


def _remove_dead_temps(out: Path) -> None:
    """Temp binaries of builders that died before renaming theirs (a killed run): each is ~100 MB."""
    for tmp in out.parent.glob(f"{out.name}.tmp*"):
        pid = tmp.name.rpartition(".tmp")[2]
        if pid.isdigit() and start_time(int(pid)) is None:
            tmp.unlink(missing_ok=True)


def _build_detail(module_dir: Path, package: str, name: str, get: str | None, why: str) -> str:
    """Why the build runs, where its code comes from, what it costs, and that it happens once."""
    local = package == "." and not get
    source = f"{module_path(module_dir / 'go.mod') or module_dir.name} and the Go module proxy" if local \
        else "the Go module proxy"
    cost = worst_cost(name)
    took = f"; about {elapsed_text(cost)} on 2 cores with Go's caches cold" if cost else ""
    return (f"{' ' + why if why else ''}, from {source} (first use{took}; cached afterwards in "
            f"{home_relative(cache_dir())})")


def worst_cost(name: str) -> int | None:
    """What building `name` took at most as measured (the first kube build of a release fills Go's caches)."""
    found = [c for c in (FIRST_KUBE_BUILD_S.get(name), COLD_BUILD_S.get(name)) if c is not None]
    return max(found) if found else None


def _lock(lock: IO[str], title: str) -> None:
    """Take the build lock; say so when another process holds it (its build may be in another terminal)."""
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return
    except BlockingIOError:
        pass
    with Progress(title, detail=" (another process is building it)", doing="waiting for", done="waited for",
                  quiet_s=WAIT_QUIET_S):
        fcntl.flock(lock, fcntl.LOCK_EX)


def describe(module_dir: Path, package: str, name: str, get: str | None = None) -> str:
    """What a build makes, as a person names it: "kube-apiserver v1.36.3", "kind v0.33.0"."""
    version = required_version(module_dir / "go.mod", package, get)
    return f"{name} {version}" if version else name


def module_path(go_mod: Path) -> str | None:
    """The module's own path, from its `module` line."""
    try:
        match = re.search(r"^module\s+(\S+)", go_mod.read_text(), re.M)
    except OSError:
        return None
    return match.group(1) if match else None


def required_version(go_mod: Path, package: str, get: str | None = None) -> str | None:
    """The version go.mod (or `get`'s module@version) pins for the module that holds `package`."""
    if get and "@" in get:
        return get.rpartition("@")[2]
    try:
        text = go_mod.read_text()
    except OSError:
        return None
    # `require path version` lines, alone or inside a require ( ... ) block.
    pins = dict(re.findall(r"^\s*(?:require\s+)?([\w.\-~/]+\.[\w.\-~/]+)\s+(v\S+)", text, re.M))
    holders = [path for path in pins if package == path or package.startswith(path + "/")]
    return pins[max(holders, key=len)] if holders else None


def _build_to(out: Path, module_dir: Path, package: str, get: str | None, cgo: bool) -> Path:
    tmp = out.with_name(f"{out.name}.tmp{os.getpid()}")  # parallel builders never share a temp file
    try:
        if get:
            with tempfile.TemporaryDirectory(prefix="fakelet-gobuild-") as work:
                shutil.copytree(module_dir, work, dirs_exist_ok=True)
                _go(["get", get], Path(work), cgo)
                _go(["build", "-o", str(tmp), package], Path(work), cgo)
        else:
            _go(["build", "-o", str(tmp), package], module_dir, cgo)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    tmp.replace(out)
    return out
