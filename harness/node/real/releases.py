"""Which kubelet releases the real node can build, and the wrapper module each is built from.

A wrapper module pins k8s.io/kubernetes and its staging modules at one release; the
real node builds its kubelet from the module of the release asked for
(`--node real --kubelet-version`). The control plane always comes from the default
module.

1.36 and 1.37 have committed modules (fixtures/go/kubernetes*: reviewed, their go.sum in
the repository). Any other release the Go module proxy serves gets a module generated
on first use in fakelet's cache (~/.cache/fakelet/modules): a go.mod that requires
k8s.io/kubernetes at that release and replaces every staging module that release's own
go.mod replaces with ./staging/src/... by the published v0.Y.Z, then `go mod tidy`.
A minor ("1.35") means its newest patch in the proxy's list, which is cached for
LIST_TTL_S.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from harness.instruments.doctor import machine_lacks
from harness.instruments.progress import Progress, home_relative
from harness.kubelet.versions import parse_release
from harness.launch import gobuild
from harness.spec import bundled

REAL_KUBELET_MODULES = {
    "1.36": "kubernetes",  # fixtures/go/kubernetes: k8s.io/kubernetes v1.36.3
    "1.37": "kubernetes-1.37",  # fixtures/go/kubernetes-1.37: k8s.io/kubernetes v1.37.2
}
KUBERNETES = "k8s.io/kubernetes"
KUBELET_PACKAGE = "k8s.io/kubernetes/cmd/kubelet"
# A new patch release comes about monthly: a day-old list misses at most the newest one.
LIST_TTL_S = 24 * 3600.0
LIST_TIMEOUT_S = 60.0  # `go list -m -versions`: one request to the proxy
DOWNLOAD_TIMEOUT_S = 300.0  # `go mod download` of k8s.io/kubernetes: a ~20 MB zip
TIDY_TIMEOUT_S = 900.0  # `go mod tidy`: the go.mod and zip of every module the kubelet imports, cold
# In the generated directory's name: a change to what is generated makes new modules, never stale ones.
MODULE_FORMAT = 1
STAGING = re.compile(r"^\s*(?:replace\s+)?(k8s\.io/[\w.\-/]+)\s+=>\s+\./staging/src/\S+\s*$", re.M)


class ReleaseUnavailable(RuntimeError):
    """The real node cannot build this release here: its one-line reason names the release."""


def modules_dir() -> Path:
    return gobuild.cache_root() / "modules"


def kube_version(release: str) -> str | None:
    """k8s.io/kubernetes's version for a full release ("1.35.4" -> "v1.35.4"); None for a minor."""
    major, minor, patch, pre = parse_release(release)
    return None if patch is None else f"v{major}.{minor}.{patch}{pre}"


def staging_version(version: str) -> str:
    """The staging modules' tag of a release: v1.35.4 -> v0.35.4 (k8s.io/kubernetes publishes them so)."""
    return "v0." + version.removeprefix("v").split(".", 1)[1]


def newest_patch(minor: str, versions: list[str]) -> str | None:
    """The newest final release of `minor` ("1.35") in the proxy's list, or None."""
    found = []
    for v in versions:
        try:
            major, mnr, patch, pre = parse_release(v)
        except ValueError:
            continue  # the list holds only versions; this one is just not one of ours
        if f"{major}.{mnr}" == minor and patch is not None and not pre:
            found.append((patch, v))
    return max(found)[1] if found else None


def committed_module(release: str) -> str | None:
    """The committed module of a release, if any: "1.36" and "1.36.3" both name fixtures/go/kubernetes."""
    release = release.removeprefix("v")
    if release in REAL_KUBELET_MODULES:
        return REAL_KUBELET_MODULES[release]
    version = kube_version(release)
    if version is None:
        return None  # a minor without a module of its own: its newest patch may still be one (resolve)
    for module in REAL_KUBELET_MODULES.values():
        if gobuild.required_version(bundled.go_module(module) / "go.mod", KUBERNETES) == version:
            return module
    return None


def list_versions(now: Callable[[], float] = time.time) -> list[str]:
    """k8s.io/kubernetes's versions as the Go module proxy lists them, from a cache younger than LIST_TTL_S."""
    cache = modules_dir() / "k8s.io-kubernetes-versions.json"
    stale: list[str] | None = None
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        data = json.loads(cache.read_text())
        stale = [str(v) for v in data["versions"]]
        if 0 <= now() - float(data["fetched"]) < LIST_TTL_S:
            return stale
    with tempfile.TemporaryDirectory(prefix="fakelet-golist-") as work:  # outside any module
        try:
            proc = _go(["list", "-m", "-versions", KUBERNETES], Path(work), LIST_TIMEOUT_S)
        except ReleaseUnavailable:
            if stale is None:
                raise
            return stale  # the proxy is out of reach: an old list misses at most the newest patches
    if proc.returncode != 0:
        if stale is not None:
            return stale
        raise ReleaseUnavailable(machine_lacks(f"the Go module proxy did not list {KUBERNETES}'s releases: "
                                               f"{_last(proc.stderr)}"))
    versions = proc.stdout.split()[1:]  # "k8s.io/kubernetes v1.13.0 v1.13.1 ..."
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache.with_name(f"{cache.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps({"fetched": now(), "versions": versions}))
    tmp.replace(cache)  # parallel runs each write whole files: a reader never sees half of one
    return versions


def resolve(release: str, versions: Callable[[], list[str]] = list_versions) -> str:
    """k8s.io/kubernetes's version for a release: itself for a full one, the newest patch for a minor."""
    version = kube_version(release)
    if version is not None:
        return version
    newest = newest_patch(release.removeprefix("v"), versions())
    if newest is None:
        raise ReleaseUnavailable(f"kubelet {release}: the Go module proxy lists no release of "
                                 f"{KUBERNETES} {release.removeprefix('v')}")
    return newest


def staging_modules(kube_go_mod: str) -> list[str]:
    """The staging modules a k8s.io/kubernetes go.mod replaces with its own ./staging/src copies."""
    return sorted(set(STAGING.findall(kube_go_mod)))


def wrapper_go_mod(version: str, kube_go_mod: str) -> str:
    """A wrapper module's go.mod for k8s.io/kubernetes `version`, given that release's own go.mod.

    The release's go and godebug lines come along: the main module's decide the GODEBUG defaults,
    and these are the ones the release itself is built with."""
    modules = staging_modules(kube_go_mod)
    if not modules:
        raise ReleaseUnavailable(f"{KUBERNETES} {version}: its go.mod replaces no staging module; "
                                 "not a release fakelet knows how to build")
    go_line = re.search(r"^go\s+\S+$", kube_go_mod, re.M)
    godebug = re.findall(r"^godebug\s+.+$", kube_go_mod, re.M)
    staging = staging_version(version)
    lines = [f"module fakelet.generated/kubernetes-{version}", "",
             *([go_line.group(0), ""] if go_line else []), *godebug, *([""] if godebug else []),
             f"require {KUBERNETES} {version}", "",
             f"// {KUBERNETES} requires its staging modules at v0.0.0 and replaces them",
             f"// with ./staging/src/...; generated by fakelet: each pinned to {staging}.",
             "replace (",
             *(f"\t{m} => {m} {staging}" for m in modules),
             ")", ""]
    return "\n".join(lines)


TOOLS_GO = f"""//go:build tools

// Generated by fakelet: the import that keeps `go mod tidy` from dropping the kubelet.
package tools

import _ "{KUBELET_PACKAGE}"
"""


def module_for(release: str) -> str:
    """The wrapper module of a release: a committed one's path in the repository, else a generated one's
    (absolute). ReleaseUnavailable naming the release when the proxy cannot give it."""
    committed = committed_module(release)
    if committed is not None:
        return committed
    return str(generated_module(resolve(release)))


def generated_module(version: str) -> Path:
    """The generated wrapper module of k8s.io/kubernetes `version`, made on first use."""
    final = modules_dir() / f"kubernetes-{version}.f{MODULE_FORMAT}"
    if (final / "go.sum").is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    with _locked(final.with_name(final.name + ".lock"), f"kubelet {version} module"):
        if (final / "go.sum").is_file():  # another process made it while this one waited
            return final
        with Progress(f"kubelet {version} module", doing="generating", done="generated",
                      detail=f" for the real node, from the Go module proxy (first use; cached afterwards in "
                             f"{home_relative(modules_dir())})"):
            kube_go_mod = _download_go_mod(version)
            for dead in final.parent.glob(f"{final.name}.tmp*"):  # a killed generator's (this one holds the lock)
                shutil.rmtree(dead, ignore_errors=True)
            # Made beside its final place and renamed there: a killed run leaves no half module in use.
            work = Path(tempfile.mkdtemp(prefix=f"{final.name}.tmp", dir=final.parent))
            try:
                (work / "go.mod").write_text(wrapper_go_mod(version, kube_go_mod))
                (work / "tools.go").write_text(TOOLS_GO)
                proc = _go(["mod", "tidy"], work, TIDY_TIMEOUT_S)
                if proc.returncode != 0:
                    raise ReleaseUnavailable(f"kubelet {version}: go mod tidy of its generated module failed: "
                                             f"{_last(proc.stderr)}")
                shutil.rmtree(final, ignore_errors=True)  # a half-made one (no go.sum) from an older fakelet
                work.chmod(0o755)  # mkdtemp made it 0700: the module holds nothing secret
                work.rename(final)
            finally:
                shutil.rmtree(work, ignore_errors=True)  # gone already when renamed
    return final


def _download_go_mod(version: str) -> str:
    """The release's own go.mod, through the module cache (`go mod download -json` names the file)."""
    with tempfile.TemporaryDirectory(prefix="fakelet-godl-") as work:  # outside any module
        proc = _go(["mod", "download", "-json", f"{KUBERNETES}@{version}"], Path(work), DOWNLOAD_TIMEOUT_S)
    try:
        info = json.loads(proc.stdout)
    except ValueError:
        info = {}
    if proc.returncode != 0 or info.get("Error") or not info.get("GoMod"):
        why = info.get("Error") or _last(proc.stderr)
        raise ReleaseUnavailable(f"kubelet {version}: the Go module proxy does not serve {KUBERNETES} "
                                 f"{version}: {_last(why)}")
    return Path(info["GoMod"]).read_text()


def _go(args: list[str], cwd: Path, timeout_s: float) -> subprocess.CompletedProcess[str]:
    try:
        return gobuild.run_go(args, cwd, timeout_s)
    except (gobuild.GoUnavailable, RuntimeError) as err:
        raise ReleaseUnavailable(machine_lacks(f"cannot ask the Go module proxy for {KUBERNETES}: "
                                               f"{_last(str(err))}")) from None


def _last(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:300] if lines else "(no output)"


@contextlib.contextmanager
def _locked(path: Path, title: str) -> Iterator[None]:
    """One process generates a module; the others wait for it, no longer than its own steps may take."""
    with open(path, "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            deadline = time.monotonic() + DOWNLOAD_TIMEOUT_S + TIDY_TIMEOUT_S
            with Progress(title, detail=" (another process is generating it)", doing="waiting for",
                          done="waited for", quiet_s=2.0):
                while True:
                    try:
                        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        break
                    except BlockingIOError:
                        if time.monotonic() > deadline:
                            raise ReleaseUnavailable(f"{title}: another process held {path} past "
                                                     f"{DOWNLOAD_TIMEOUT_S + TIDY_TIMEOUT_S:g}s") from None
                        time.sleep(0.5)  # flock has no timeout of its own; the deadline bounds this
        yield
