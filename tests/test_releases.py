"""Which kubelet releases the real node builds (harness/node/real/releases.py) and how --kubelet-version
reads on each node.

The unit tests inject the proxy's version list, a release's go.mod and the go command, so they need
neither network nor builds. test_the_proxy_gives_a_module_for_a_release_without_a_committed_one asks the
real Go module proxy and runs `go mod tidy` (seconds); the kubelet build itself (~6-8 min cold) runs only
with FAKELET_BUILD_RELEASE=<release> set, e.g. FAKELET_BUILD_RELEASE=1.35.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from harness.config.runconfig import RunConfig, check_kubelet_version
from harness.controlplane import ControlPlaneUnavailable
from harness.kubelet import versions
from harness.launch import gobuild
from harness.node.real import localnode, releases
from harness.spec.subjects import ProfileError

# A go.mod in k8s.io/kubernetes's shape, written for these tests: staging modules replaced with
# ./staging/src copies (in a block and on a line of their own), and one replace that is not staging.
KUBE_GO_MOD = """\
module k8s.io/kubernetes

go 1.25.0

godebug default=go1.25

require (
\tk8s.io/api v0.0.0
\tk8s.io/klog/v2 v2.130.1
)

replace (
\tk8s.io/api => ./staging/src/k8s.io/api
\tk8s.io/kubelet => ./staging/src/k8s.io/kubelet
\tgithub.com/example/fork => github.com/example/fork v1.2.3
)

replace k8s.io/cri-api => ./staging/src/k8s.io/cri-api
"""
REAL_RUN_GO = gobuild.run_go
LISTED = ["v1.34.0", "v1.34.4", "v1.35.0", "v1.35.4", "v1.35.10", "v1.35.11-rc.0", "v1.36.3", "v1.37.0-alpha.1"]


@pytest.mark.parametrize(("text", "parsed"), [("1.35", (1, 35, None, "")), ("v1.35", (1, 35, None, "")),
                                              ("1.35.4", (1, 35, 4, "")), ("v1.35.0-rc.1", (1, 35, 0, "-rc.1"))])
def test_a_release_is_a_minor_or_a_patch(text: str, parsed: tuple[int, int, int | None, str]) -> None:
    assert versions.parse_release(text) == parsed


@pytest.mark.parametrize("text", ["", "1", "1.x", "2.0", "1.035", "1.35.4.1", "latest", " 1.35"])
def test_what_is_not_a_release_is_refused_with_the_forms(text: str) -> None:
    with pytest.raises(ValueError, match=r"write a minor \(1.35\) or a release"):
        versions.parse_release(text)


def test_a_real_release_takes_its_minors_model_and_keeps_its_name() -> None:
    release = versions.for_release("v1.35.4")
    assert release.name == "1.35.4"
    assert dataclasses.replace(release, name="1.35") == versions.get("1.35")
    assert versions.for_release("1.36") == versions.get("1.36")  # a modelled minor is its model
    assert versions.for_release("newest") == versions.get("newest")
    newer = versions.for_release("1.99")  # newer than every model: the newest one's, named 1.99
    assert newer.name == "1.99" and dataclasses.replace(newer, name=versions.NEWEST) == versions.get("newest")
    with pytest.raises(ValueError, match=f"older than {versions.FLOOR}"):
        versions.for_release("1.31.14")
    assert [versions.minor_of(n) for n in ("v1.35.4", "1.35", "newest", "default")] == \
        ["1.35", "1.35", "newest", "default"]


def test_each_node_says_what_it_accepts() -> None:
    assert check_kubelet_version("1.35.4", "real").name == "1.35.4"
    assert check_kubelet_version("1.34", "real").name == "1.34"
    assert check_kubelet_version("1.35", "fake").name == "1.35"
    with pytest.raises(ValueError, match=r"unknown kubelet version '1.35.4'; the fake kubelet models 1.32, .*"
                                         r"--node real builds any release from 1.32 on"):
        check_kubelet_version("1.35.4", "fake")
    with pytest.raises(ProfileError, match=r"^--node real --kubelet-version 1.31: .*older than 1.32"):
        check_kubelet_version("1.31", "real")
    with pytest.raises(ProfileError, match=r"^--node real --kubelet-version 1.3x: .*not a release"):
        check_kubelet_version("1.3x", "real")


def test_a_real_runs_release_survives_the_run_config_file() -> None:
    run = RunConfig.build(subject="reference-dp", node="real", kubelet_version="v1.35.4")
    assert run.kubelet_version.name == "1.35.4"
    again = RunConfig.from_dict(json.loads(json.dumps(run.to_dict())))
    assert again.kubelet_version == run.kubelet_version


def test_fidelity_runs_the_fake_model_of_the_real_releases_minor(tmp_path: Path) -> None:
    from harness.run import fidelity

    args = argparse.Namespace(profile="fast", seed=0, mutant_bound=6.0, kubelet_version="1.35.4")
    runs = fidelity.build_runs(fidelity.Target("reference-dp"), args, tmp_path)
    assert (runs["fake"].kubelet_version.name, runs["real"].kubelet_version.name) == ("1.35", "1.35.4")
    args.kubelet_version = "1.99"  # the real node could build it; the fake has no model of it
    with pytest.raises(ProfileError, match=r"^--kubelet-version 1\.99: the fake kubelet has no model of 1\.99"):
        fidelity.build_runs(fidelity.Target("reference-dp"), args, tmp_path)


def test_a_minor_is_its_newest_final_patch_in_the_proxys_list() -> None:
    assert releases.newest_patch("1.35", LISTED) == "v1.35.10"  # by number: 10 after 4, no rc
    assert releases.newest_patch("1.37", LISTED) is None  # only a pre-release
    assert releases.resolve("1.35", lambda: LISTED) == "v1.35.10"

    def never() -> list[str]:
        raise AssertionError("a full release needs no list")

    assert releases.resolve("1.35.4", never) == "v1.35.4"
    assert releases.resolve("v1.36.0-rc.1", never) == "v1.36.0-rc.1"
    with pytest.raises(releases.ReleaseUnavailable, match=r"^kubelet 1.37: the Go module proxy lists no release"):
        releases.resolve("1.37", lambda: LISTED)


def test_committed_modules_serve_their_release_by_minor_or_patch() -> None:
    for name in ("1.36", "v1.36", "1.36.3", "v1.36.3"):
        assert releases.committed_module(name) == "kubernetes", name
    assert releases.committed_module("1.37.2") == "kubernetes-1.37"
    for name in ("1.35", "1.36.1", "1.37.0"):
        assert releases.committed_module(name) is None, name


def test_the_wrapper_go_mod_pins_every_staging_module_the_release_replaces(tmp_path: Path) -> None:
    assert releases.staging_modules(KUBE_GO_MOD) == ["k8s.io/api", "k8s.io/cri-api", "k8s.io/kubelet"]
    assert releases.staging_version("v1.35.4") == "v0.35.4"
    assert releases.staging_version("v1.36.0-rc.1") == "v0.36.0-rc.1"
    text = releases.wrapper_go_mod("v1.35.4", KUBE_GO_MOD)
    lines = [line.strip() for line in text.splitlines()]
    assert "require k8s.io/kubernetes v1.35.4" in lines
    assert "go 1.25.0" in lines and "godebug default=go1.25" in lines
    for module in ("k8s.io/api", "k8s.io/cri-api", "k8s.io/kubelet"):
        assert f"{module} => {module} v0.35.4" in lines
    assert not any("example" in line for line in lines)
    (tmp_path / "go.mod").write_text(text)
    assert gobuild.required_version(tmp_path / "go.mod", releases.KUBELET_PACKAGE) == "v1.35.4"  # the build's name
    with pytest.raises(releases.ReleaseUnavailable, match="replaces no staging module"):
        releases.wrapper_go_mod("v1.35.4", "module k8s.io/kubernetes\n\ngo 1.25.0\n")


class FakeGo:
    """The go commands releases.py runs, answered from memory; records each."""

    def __init__(self, tmp: Path, served: bool = True) -> None:
        self.calls: list[list[str]] = []
        self.served = served
        self.go_mod = tmp / "kubernetes.mod"
        self.go_mod.write_text(KUBE_GO_MOD)

    def __call__(self, args: list[str], cwd: Path, timeout_s: float | None = None,
                 cgo: bool = False) -> subprocess.CompletedProcess[str]:
        self.calls.append(args)
        assert timeout_s is not None and timeout_s > 0  # every go command runs under a bound
        if args[:2] == ["list", "-m"]:
            return subprocess.CompletedProcess(args, 0, "k8s.io/kubernetes " + " ".join(LISTED) + "\n", "")
        if args[:2] == ["mod", "download"]:
            if not self.served:
                error = "k8s.io/kubernetes@v1.35.99: reading https://proxy.golang.org/...: 404 Not Found"
                return subprocess.CompletedProcess(args, 1, json.dumps({"Error": error}), "")
            return subprocess.CompletedProcess(args, 0, json.dumps({"GoMod": str(self.go_mod)}), "")
        if args[:2] == ["mod", "tidy"]:
            (cwd / "go.sum").write_text("tidied\n")
            return subprocess.CompletedProcess(args, 0, "", "")
        raise AssertionError(args)


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("FAKELET_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_a_release_without_a_committed_module_gets_one_generated_once(tmp_path: Path, cache: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    go = FakeGo(tmp_path)
    monkeypatch.setattr(gobuild, "run_go", go)
    module = Path(releases.module_for("1.35"))
    assert module.parent == cache / "modules" and module.name.startswith("kubernetes-v1.35.10.")
    assert "require k8s.io/kubernetes v1.35.10" in (module / "go.mod").read_text()
    assert "k8s.io/kubernetes/cmd/kubelet" in (module / "tools.go").read_text()
    assert [c[:2] for c in go.calls] == [["list", "-m"], ["mod", "download"], ["mod", "tidy"]]
    go.calls.clear()
    assert Path(releases.module_for("1.35")) == module  # the list and the module both cached
    assert go.calls == []
    assert sorted(p.name for p in module.parent.iterdir() if ".tmp" in p.name) == []  # no leftover work dir
    assert releases.module_for("1.36") == "kubernetes" and go.calls == []  # committed: no proxy


def test_the_version_list_is_fetched_again_once_stale(cache: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    go = FakeGo(tmp_path)
    monkeypatch.setattr(gobuild, "run_go", go)
    (cache / "modules").mkdir(parents=True)
    listing = cache / "modules" / "k8s.io-kubernetes-versions.json"
    listing.write_text(json.dumps({"fetched": time.time() - releases.LIST_TTL_S - 1, "versions": ["v1.35.1"]}))
    assert releases.list_versions() == LISTED and len(go.calls) == 1
    listing.write_text(json.dumps({"fetched": time.time(), "versions": ["v1.35.1"]}))
    assert releases.list_versions() == ["v1.35.1"] and len(go.calls) == 1
    listing.write_text(json.dumps({"fetched": 0, "versions": ["v1.35.1"]}))
    monkeypatch.setenv("PATH", "/nonexistent")  # the proxy out of reach: a stale list beats none
    monkeypatch.setattr(gobuild, "run_go", REAL_RUN_GO)
    assert releases.list_versions() == ["v1.35.1"]


def test_a_release_the_proxy_refuses_is_a_reason_naming_it(cache: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gobuild, "run_go", FakeGo(tmp_path, served=False))
    with pytest.raises(ControlPlaneUnavailable, match=r"^kubelet v1.35.99: the Go module proxy does not serve "
                                                      r"k8s.io/kubernetes v1.35.99: .*404 Not Found$"):
        localnode.find_kubelet("1.35.99")
    assert [p.name for p in (cache / "modules").iterdir() if not p.name.endswith(".lock")] == []  # nothing made


def test_without_go_the_reason_says_so(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(ControlPlaneUnavailable, match=r"^kubelet 1.35: cannot ask the Go module proxy .*"
                                                      r"go toolchain not found"):
        localnode.find_kubelet("1.35")


def _proxy_module(release: str) -> Path:
    if shutil.which("go") is None:
        pytest.skip("go toolchain not found on PATH (resolving a release asks the Go module proxy through it)")
    try:
        return Path(releases.module_for(release))
    except releases.ReleaseUnavailable as err:
        pytest.skip(str(err).splitlines()[0])


def test_the_proxy_gives_a_module_for_a_release_without_a_committed_one() -> None:
    """The newest 1.35 from the real proxy, its module generated and tidied in the user's cache (seconds;
    no build)."""
    module = _proxy_module("1.35")
    go_mod = (module / "go.mod").read_text()
    version = gobuild.required_version(module / "go.mod", releases.KUBELET_PACKAGE)
    assert version is not None and version.startswith("v1.35."), go_mod
    assert f"k8s.io/kubelet => k8s.io/kubelet v0.{version[3:]}" in go_mod
    assert (module / "go.sum").stat().st_size > 0


@pytest.mark.skipif(not os.environ.get("FAKELET_BUILD_RELEASE"),
                    reason="FAKELET_BUILD_RELEASE not set (a release to build, e.g. 1.35: ~6-8 min cold)")
def test_a_generated_module_builds_a_kubelet_of_its_release() -> None:
    release = os.environ["FAKELET_BUILD_RELEASE"]
    _proxy_module(release)
    try:
        binary, version = localnode.find_kubelet(release)
    except ControlPlaneUnavailable as err:
        pytest.skip(str(err).splitlines()[0])
    # The binary's own build info; its --version says v0.0.0-master (no -ldflags stamp, as for every
    # kube binary fakelet builds), so only the module it was built from names the release.
    info = subprocess.run(["go", "version", "-m", str(binary)], capture_output=True, text=True, timeout=60).stdout
    assert version is not None and f"mod\tk8s.io/kubernetes\t{version}\t" in info, info[:500]
    assert version.removeprefix("v").startswith(release.removeprefix("v")), version
