"""`fakelet prebuild`: fill fakelet's build cache ahead of a run, for a CI cache step.

A first run builds what it needs from the Go module proxy as it goes (harness/launch/gobuild.py):
minutes of kube-apiserver before the first DRA check. A CI pipeline would rather do that once, in
a step of its own, and keep the cache between pipelines. This says what it will build and what
each build costs, builds each with the same progress lines a run shows, and ends with the one
directory to cache.

    fakelet prebuild --all                       # the default release's kube binaries, containerd 2, kind, Go subjects
    fakelet prebuild --kubelet-version 1.37      # the real node's kubelet of 1.37 and containerd 2, the control plane
    fakelet prebuild --subject sample-device-plugin --subject-file my-plugin.yaml
    fakelet prebuild --all --dry-run             # the plan only

Exit code: 0 when everything asked for is cached (or on PATH) afterwards, 1 when a build failed
(one line each), 2 on bad input.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from harness.instruments.progress import elapsed_text, home_relative
from harness.instruments.userinput import subject_name
from harness.kubelet.versions import for_release
from harness.launch import gobuild
from harness.node.real import releases, runtime
from harness.spec import bundled
from harness.spec.subjects import SubjectSpec, load_subject, load_subject_file, profile_paths, resolve_build

# harness.controlplane.local and harness.node.kind.cluster are imported where a plan needs them: with them
# (lightkube, pytest-kind, the Docker client) every fakelet command's parser, which holds this one's, took a second.

EXIT_OK, EXIT_FAILED, EXIT_INTERRUPTED = 0, 1, 130

# The measured cost of each build: harness/launch/gobuild.py, which says it as a build starts.
FIRST_KUBE_BUILD_S = gobuild.FIRST_KUBE_BUILD_S
COLD_BUILD_S = gobuild.COLD_BUILD_S
CACHE_ENV = "FAKELET_CACHE"  # harness/launch/gobuild.py cache_root()
PLAN_WIDTH = 40  # the title column of the plan


@dataclass(frozen=True)
class Binary:
    """One binary fakelet builds with Go: where from, and how a run finds it."""

    name: str
    package: str
    module: Path | None  # None: a release's wrapper module, generated from the proxy before the build
    release: str | None = None  # the k8s.io/kubernetes version of a module still to be generated
    get: str | None = None
    cgo: bool = False
    lookup: Callable[[str], Path | None] | None = None  # a run takes it from here first (PATH) when there
    why: str = ""

    def title(self) -> str:
        if self.module is None:
            return f"{self.name} {self.release}"
        return gobuild.describe(self.module, self.package, self.name, self.get)

    def key(self) -> tuple[object, ...]:
        return self.name, self.package, self.module or self.release, self.get, self.cgo

    def on_path(self) -> Path | None:
        return self.lookup(self.name) if self.lookup is not None else None

    def cached(self) -> Path | None:
        if self.module is None:
            return None
        return gobuild.cached(self.module, self.package, self.name, self.get, self.cgo)

    def build(self) -> Path:
        module = self.module
        if module is None:  # generates the release's module first, with its own progress lines
            module = Path(releases.module_for(str(self.release)))
        return gobuild.build(module, self.package, self.name, self.get, self.cgo, why=self.why)


def _which(name: str) -> Path | None:
    found = shutil.which(name)
    return Path(found) if found else None


def control_plane() -> list[Binary]:
    """The local API server's binaries, always of the default module (harness/controlplane/local.py)."""
    from harness.controlplane.local import (
        KUBE_APISERVER_PACKAGE,
        KUBE_CONTROLLER_MANAGER_PACKAGE,
        KUBE_SCHEDULER_PACKAGE,
        _from_path_or_assets,
        _kube_module,
    )

    module = _kube_module()
    return [Binary("kube-apiserver", KUBE_APISERVER_PACKAGE, module, lookup=_from_path_or_assets,
                   why="for the local API server"),
            Binary("kube-controller-manager", KUBE_CONTROLLER_MANAGER_PACKAGE, module, lookup=_from_path_or_assets,
                   why="for the DRA controllers beside the local API server"),
            Binary("kube-scheduler", KUBE_SCHEDULER_PACKAGE, module, lookup=_from_path_or_assets,
                   why="for the kep5970 suite's allocations")]


def kubelet(release: str | None) -> Binary:
    """The real node's kubelet of `release` (None: the default module's), as localnode.find_kubelet builds it.

    ValueError for a release that is not one, or that the proxy does not serve; a proxy out of reach leaves the
    release unresolved, for its build to fail with the proxy's reason."""
    from harness.controlplane.local import _kube_module

    if release is None:
        return Binary("kubelet", releases.KUBELET_PACKAGE, _kube_module(), why="for the real node")
    name = for_release(release).name  # ValueError: not a release, or older than the floor
    committed = releases.committed_module(name)
    if committed is not None:
        return Binary("kubelet", releases.KUBELET_PACKAGE, _kube_module(committed), why="for the real node")
    try:
        version = releases.resolve(name)
    except releases.ReleaseUnavailable as err:
        if "lists no release" in str(err):
            raise ValueError(str(err)) from None  # the proxy answered: there is no such release
        # The proxy is out of reach: the build says so, as one failure line, when it tries again.
        return Binary("kubelet", releases.KUBELET_PACKAGE, None, release=name, why="for the real node")
    made = releases.modules_dir() / f"kubernetes-{version}.f{releases.MODULE_FORMAT}"  # releases.generated_module
    return Binary("kubelet", releases.KUBELET_PACKAGE, made if (made / "go.sum").is_file() else None,
                  release=version, why="for the real node")


def node_runtime() -> list[Binary]:
    """The real node's containerd 2 (daemon, runc shim, ctr), as harness/node/real/runtime.py builds it."""
    return [Binary(name, package, runtime.module(), why=runtime.WHY) for name, package in runtime.COMMANDS.items()]


def kind_tier() -> list[Binary]:
    """kind and kubectl, as harness/node/kind/cluster.py finds or builds them."""
    from harness.controlplane.local import _kube_module
    from harness.node.kind.cluster import KIND_MODULE, KIND_PACKAGE, KUBECTL_PACKAGE

    return [Binary("kind", KIND_PACKAGE, bundled.go_module(KIND_MODULE), lookup=_which, why="for the kind tier"),
            Binary("kubectl", KUBECTL_PACKAGE, _kube_module(), lookup=_which, why="for the kind tier")]


def subject_binary(spec: SubjectSpec) -> Binary | None:
    """The binary a subject's `build:` makes (harness/config/runconfig.py resolve_binary), or None."""
    return build_binary(spec.name, spec.build) if spec.build else None


def build_binary(subject: str, build: dict[str, Any]) -> Binary:
    """A subject's `build:`, its module resolved to a directory (subjects.resolve_build)."""
    return Binary(build.get("binary") or Path(build["module"]).name, build["package"], Path(build["module"]),
                  get=build.get("get"), cgo=bool(build.get("cgo")), why=f"for subject {subject}")


def bundled_builds() -> dict[str, Binary]:
    """Every bundled subject that is built, by name. Only their `build:` is read, with libyaml: they are
    fakelet's own files (their tests check them whole), and the checking loader parses all of them in pure
    Python, a second of `fakelet doctor`'s few."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    found = {}
    for name, path in profile_paths().items():
        text = path.read_text()
        if not re.search(r"^build:", text, re.M):
            continue
        build = resolve_build((yaml.load(text, Loader=loader) or {}).get("build"), path.parent, str(path))
        if build:
            found[name] = build_binary(name, build)
    return found


def default_binaries() -> list[Binary]:
    """`--all`: the default release's kube binaries, the real node's containerd 2, kind, and every bundled subject
    that is built."""
    return unique([*control_plane(), kubelet(None), *node_runtime(), *kind_tier(), *bundled_builds().values()])


def unique(binaries: Iterable[Binary]) -> list[Binary]:
    seen: dict[tuple[object, ...], Binary] = {}
    for b in binaries:
        seen.setdefault(b.key(), b)
    return list(seen.values())


# -- the command -------------------------------------------------------------------------------------------


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    what = ("build what runs will need into fakelet's cache ahead of time (a CI cache step): the plan and each "
            "build's cost first, then the builds")
    p = sub.add_parser("prebuild", help=what, description=f"{what}. The cache is ~/.cache/fakelet, or $FAKELET_CACHE. "
                       "Exit code 0 when everything asked for is cached afterwards, 1 when a build failed, 2 on bad "
                       "input.")
    p.add_argument("--kubelet-version", action="append", default=[], metavar="VERSION",
                   help="the real node's kubelet of this release (a minor: its newest patch; repeatable) and its "
                        "containerd 2, with the control plane's kube-apiserver, kube-controller-manager and "
                        "kube-scheduler")
    p.add_argument("--subject", action="append", default=[], metavar="NAME", type=subject_name,
                   help="a bundled subject's binary (repeatable; fakelet subjects lists them)")
    p.add_argument("--subject-file", action="append", default=[], metavar="PATH",
                   help="the binary a subject file's build: makes (repeatable)")
    p.add_argument("--all", action="store_true",
                   help="the default release's kube binaries, the real node's containerd 2, kind and kubectl, "
                        "and every bundled subject that is built with Go")
    p.add_argument("--dry-run", action="store_true", help="print the plan only")


def wanted(args: argparse.Namespace) -> tuple[list[Binary], list[str]]:
    """What the flags ask for, and notes on what needs no build; ValueError on bad input (exit 2)."""
    if not (args.all or args.kubelet_version or args.subject or args.subject_file):
        raise ValueError("prebuild: nothing asked for; give --all, --kubelet-version VERSION, --subject NAME or "
                         "--subject-file PATH")
    found: list[Binary] = default_binaries() if args.all else []
    notes = []
    for release in args.kubelet_version:
        try:
            found += [kubelet(release), *node_runtime(), *control_plane()]
        except ValueError as err:
            raise ValueError(f"--kubelet-version {release}: {err}") from None
    specs = [load_subject(name) for name in args.subject] + [load_subject_file(p) for p in args.subject_file]
    for spec in specs:
        binary = subject_binary(spec)
        if binary is None:
            notes.append(f"subject {spec.name}: nothing to build (its subject file has no build:)")
        else:
            found.append(binary)
    return unique(found), notes


def is_kube(b: Binary) -> bool:
    return b.package.startswith(releases.KUBERNETES + "/")


def costs(binaries: list[Binary], todo: list[Binary]) -> dict[Binary, int | None]:
    """What each build in `todo` costs, in order, in seconds (None: not measured). The first kube build of a
    release fills Go's build cache for the others, and costs what kube-apiserver's first build did."""
    warm = {b.module for b in [*binaries, *control_plane()] if is_kube(b) and b.cached() is not None}
    found: dict[Binary, int | None] = {}
    for b in todo:
        if is_kube(b) and (b.module is None or b.module not in warm):
            found[b] = FIRST_KUBE_BUILD_S.get(b.name, max(FIRST_KUBE_BUILD_S.values()))
            warm.add(b.module)
        else:
            found[b] = COLD_BUILD_S.get(b.name)
    return found


def cost_text(seconds: int | None) -> str:
    return f"~{elapsed_text(seconds)}" if seconds is not None else "cost not measured"


def plan_lines(binaries: list[Binary]) -> tuple[list[str], list[Binary]]:
    """The plan as printed, and the binaries it will build."""
    todo: list[Binary] = []
    states: dict[Binary, str] = {}
    for b in binaries:
        path = b.on_path()
        if path is not None:
            states[b] = f"on PATH ({path}): runs use it, nothing to build"
        elif b.cached() is not None:
            states[b] = "cached"
        else:
            todo.append(b)
    cost = costs(binaries, todo)
    for b in todo:
        cgo = ", needs a C compiler (cgo)" if b.cgo else ""
        generated = ", after its module is generated from the Go module proxy" if b.module is None else ""
        states[b] = f"to build: {cost_text(cost[b])}{cgo}{generated}"
    head = f"plan ({count(len(binaries))}, cache {home_relative(gobuild.cache_dir())}):"
    return [head, *(f"  {b.title():{PLAN_WIDTH}} {states[b]}" for b in binaries), total_line(cost)], todo


def total_line(cost: dict[Binary, int | None]) -> str:
    if not cost:
        return "nothing to build: every binary asked for is cached or on PATH"
    known = [s for s in cost.values() if s is not None]
    unknown = len(cost) - len(known)
    if not known:
        return f"to build: {count(len(cost))} (time not measured)"
    more = f" plus {unknown} not measured" if unknown else ""
    return (f"to build: {count(len(cost))}, about {elapsed_text(sum(known))}{more} (as measured on 2 "
            "cores; less when Go's own caches are warm)")


def count(n: int) -> str:
    return f"{n} binary" if n == 1 else f"{n} binaries"


def cache_size(root: Path) -> int:
    total = 0
    for path in root.rglob("*"):
        try:
            if path.is_file() and not path.is_symlink():
                total += path.stat().st_size
        except OSError:
            continue  # a temp file another build renamed meanwhile
    return total


def mib(n: int) -> str:
    return f"{n / (1 << 20):.0f} MiB"


def cached_binaries() -> list[Path]:
    """The built binaries in the cache (`name-hash`, executable), without locks and half-written temps."""
    directory = gobuild.cache_dir()
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir() if p.is_file() and os.access(p, os.X_OK) and ".tmp" not in p.name)


def cache_line() -> str:
    root = gobuild.cache_root()
    where = home_relative(root) + ("" if os.environ.get(CACHE_ENV) else f" (${CACHE_ENV} moves it)")
    held = len(cached_binaries())
    return (f"cache: {where} holds {count(held)}, {mib(cache_size(root) if root.is_dir() else 0)}; "
            "a CI cache step keeps that directory")


def build_all(todo: list[Binary]) -> list[str]:
    """Build each in turn (gobuild prints the progress lines); one line per failure."""
    failures = []
    for b in todo:
        try:
            b.build()
        except (gobuild.GoUnavailable, releases.ReleaseUnavailable, FileNotFoundError, RuntimeError) as err:
            # The last two lines: go's reason and, from a proxy, its server's own words (runconfig's way).
            last = [line.strip() for line in str(err).splitlines() if line.strip()][-2:] or ["?"]
            failures.append(f"failed: {b.title()}: {' '.join(last)[:400]}")
    return failures


def main(args: argparse.Namespace) -> int:
    binaries, notes = wanted(args)
    for note in notes:
        print(note)
    lines, todo = plan_lines(binaries)
    print("\n".join(lines), flush=True)
    if args.dry_run:
        return EXIT_OK
    try:
        failures = build_all(todo)
    except KeyboardInterrupt:  # gobuild removed the half-built binary; the finished ones stay
        print(f"fakelet: prebuild interrupted; {cache_line()}", file=sys.stderr)
        return EXIT_INTERRUPTED
    for line in failures:
        print(line, file=sys.stderr)
    print(cache_line())
    return EXIT_FAILED if failures else EXIT_OK
