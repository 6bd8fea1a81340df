"""`fakelet doctor`: what this machine can run, and what to install for the rest.

One line per tier: a status word (ok, missing, limited, or unknown for what was not checked), what
was found, and the fix (a command, a package, a flag). Then which of fakelet's tiers can run here:
the main job (reference-dp needs only Python; reference-dra an etcd and kube-apiserver and
kube-controller-manager, cached or buildable with Go), the real node, containers, kind, and the
upstream Go subjects. Exit code 0 when the main job can run, 1 when it cannot.

Every probe is bounded: an `unshare ... true`, `go version`, `go env`, one `go list -m -versions`
against the Go module proxy (none with --offline), a ping of the Docker engine, a probe cgroup
made and removed. Nothing is built, pulled or started. The refusals elsewhere that come from the
machine (no Go, no etcd, not root, no engine) point here (harness/instruments/doctor.py).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from harness.instruments import inotify_budget
from harness.instruments.doctor import DOCTOR_HINT
from harness.instruments.progress import elapsed_text, home_relative
from harness.kubelet.versions import DEFAULT_KUBELET_VERSION
from harness.launch import cgroups, gobuild
from harness.launch.containers import engine
from harness.node.real import image, releases
from harness.node.real import runtime as node_runtime
from harness.run import prebuild
from harness.run.prebuild import Binary
from harness.run.version import version_line
from harness.spec import bundled

# harness.controlplane, harness.node.kind.cluster, harness.node.real.localnode and harness.world.draenv are
# imported by the probes and tiers that use them: this module's parser is part of every fakelet command's, and
# they (lightkube, grpc, pytest-kind, the Docker client) took a second to import.

OK, MISSING, LIMITED, UNKNOWN = "ok", "missing", "limited", "unknown"
EXIT_OK, EXIT_CANNOT = 0, 1
PROBE_TIMEOUT_S = 5.0  # unshare, go version, go env, etcd --version: each answers in well under a second
PROXY_TIMEOUT_S = 15.0  # one `go list -m -versions` request: about 1 s with a route, a DNS timeout without
PROXY_MODULE = releases.KUBERNETES  # what the real node lists first (releases.list_versions)
GOPROXY_DEFAULT = "https://proxy.golang.org,direct"  # Go's own default GOPROXY
INSTALL_PREFIX = "Debian package "  # how localnode.TOOLS and image.BUSYBOX_HINT name a package
NAMESPACE_FLAGS = {"user": ["--user", "--map-root-user"], "mount": ["--mount", "--propagation", "private"],
                   "PID": ["--pid", "--fork", "--kill-child"]}  # as harness/launch/process.py unshare_prefix
CONTROL_PLANE_NEEDS = ("kube-apiserver", "kube-controller-manager")  # reference-dra's checks, eviction included


@dataclass
class Tier:
    key: str
    status: str
    what: str
    fix: str = ""

    def line(self) -> str:
        return f"{self.status:8} {self.what}" + (f"; fix: {self.fix}" if self.fix else "")


@dataclass
class Machine:
    """What the probes found; the tiers and the summary are read from it."""

    offline: bool
    files: Path | None = None
    files_error: str = ""
    root: bool = False
    namespaces: dict[str, str | None] = field(default_factory=dict)  # None: it works
    cgroup_version: str = ""
    cgroup_error: str | None = None
    go: Path | None = None
    go_version: tuple[int, int] | None = None
    go_text: str = ""
    go_needed: tuple[int, int] = (0, 0)
    goproxy: str = ""
    proxy_error: str | None = None  # None with proxy_checked: it answers
    proxy_checked: bool = False
    proxy_text: str = ""
    cc: str | None = None
    etcd: Path | None = None
    etcd_text: str = ""
    engine_error: str | None = None
    node_image: bool | None = None
    node_tools: list[tuple[str, str]] = field(default_factory=list)
    node_runtime: list[Binary] = field(default_factory=list)  # containerd 2 (harness/node/real/runtime.py)
    busybox_error: str | None = None
    inotify_limit: int | None = None
    inotify_used: int = 0
    binaries: dict[str, list[Binary]] = field(default_factory=dict)  # group -> its binaries
    subjects: dict[str, Binary] = field(default_factory=dict)
    found: dict[Binary, tuple[str, Path] | None] = field(default_factory=dict)  # ("path" | "cached", where)

    @property
    def go_usable(self) -> bool:
        return self.go is not None and self.go_version is not None and self.go_version >= self.go_needed

    @property
    def can_build(self) -> bool:
        """A build can run: Go that is new enough, and a proxy that answered or was not asked."""
        return self.go_usable and self.proxy_error is None

    def locate(self, b: Binary) -> tuple[str, Path] | None:
        """Where a run finds it without a build (asked once: a cache lookup hashes the module's files)."""
        if b not in self.found:
            path, cached = b.on_path(), b.cached()
            self.found[b] = ("path", path) if path is not None else ("cached", cached) if cached is not None \
                else None
        return self.found[b]

    def state(self, b: Binary) -> str:
        """"path", "cached", "buildable" or "missing"."""
        located = self.locate(b)
        if located is not None:
            return located[0]
        if self.can_build and (not b.cgo or self.cc is not None):
            return "buildable"
        return "missing"

    def ready(self, b: Binary) -> bool:
        return self.state(b) != "missing"


# -- probes ------------------------------------------------------------------------------------------------


def without_hint(text: str) -> str:
    """A refusal as doctor says it: the pointer at doctor is for the other places."""
    return text.replace(f" {DOCTOR_HINT}", "").replace(DOCTOR_HINT, "").strip()


def run_bounded(argv: list[str], timeout_s: float = PROBE_TIMEOUT_S, cwd: str | None = None,
                env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """(exit code, stdout, stderr); a command that cannot start or outlasts its bound is exit 127 with why."""
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, cwd=cwd, env=env)
    except (OSError, subprocess.SubprocessError) as err:
        return 127, "", str(err)
    return proc.returncode, proc.stdout, proc.stderr


def last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:200] if lines else "(no output)"


def probe_namespaces(root: bool) -> dict[str, str | None]:
    """Each namespace fakelet's launchers use, tried with `unshare ... true`: None when it works, else why.

    Without root, mount and PID namespaces come only inside a user namespace (process.py unshare_prefix)."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return {name: "'unshare' (util-linux) not found" for name in NAMESPACE_FLAGS}
    found: dict[str, str | None] = {}
    for name, flags in NAMESPACE_FLAGS.items():
        prefix = [] if root or name == "user" else NAMESPACE_FLAGS["user"]
        code, _, err = run_bounded([unshare, *prefix, *flags, "--", "true"])
        found[name] = None if code == 0 else (last_line(err) if err.strip() else f"exit code {code}")
    return found


def probe_cgroups() -> tuple[str, str | None]:
    """The cgroup hierarchies mounted and the one a subject gets (a probe cgroup made and removed), or why
    a subject gets none."""
    v2, v1 = cgroups.find_hierarchies()
    mounted = " and ".join([*([f"v1 ({', '.join(sorted(v1))})"] if v1 else []), *(["v2"] if v2 else [])])
    try:
        probe = cgroups.create("doctor")
    except (cgroups.CgroupUnavailable, OSError) as err:
        return mounted or "none mounted", str(err)
    used = f"v{probe.version}"
    probe.remove()
    return f"{mounted or 'none mounted'}; a subject gets one in {used}", None


def go_version(go: Path) -> tuple[tuple[int, int] | None, str]:
    code, out, err = run_bounded([str(go), "version"])
    match = re.search(r"\bgo(\d+)\.(\d+)(?:\.\d+)?", out)
    if code != 0 or match is None:
        return None, last_line(err or out)
    return (int(match.group(1)), int(match.group(2))), match.group(0)


def go_needed() -> tuple[int, int]:
    """The newest `go` line of fakelet's own wrapper modules: the oldest go that builds them all."""
    needed = (0, 0)
    for module in bundled.go_modules():
        match = re.search(r"^go\s+(\d+)\.(\d+)", (module / "go.mod").read_text(), re.M)
        if match:
            needed = max(needed, (int(match.group(1)), int(match.group(2))))
    return needed


def probe_proxy(go: Path) -> tuple[str, str | None, str]:
    """GOPROXY, why the proxy did not list k8s.io/kubernetes (None: it did), and what it listed."""
    code, out, _ = run_bounded([str(go), "env", "GOPROXY"])
    goproxy = out.strip() if code == 0 else ""
    if goproxy == "off":
        return goproxy, "GOPROXY=off: no module can be fetched", ""
    with tempfile.TemporaryDirectory(prefix="fakelet-doctor-") as work:  # outside any module
        env = dict(os.environ, GOFLAGS="-mod=mod")
        code, out, err = run_bounded([str(go), "list", "-m", "-versions", PROXY_MODULE], PROXY_TIMEOUT_S, work, env)
    if code != 0:
        return goproxy, last_line(err) if code != 127 else f"no answer within {PROXY_TIMEOUT_S:g}s", ""
    versions = out.split()[1:]
    return goproxy, None, f"{PROXY_MODULE} lists {len(versions)} versions" + (f", newest {versions[-1]}"
                                                                             if versions else "")


def probe_etcd() -> tuple[Path | None, str]:
    from harness.controlplane.base import ControlPlaneUnavailable
    from harness.controlplane.local import find_etcd

    try:
        etcd = find_etcd()
    except ControlPlaneUnavailable as err:
        return None, without_hint(str(err))
    _, out, _ = run_bounded([str(etcd), "--version"])
    match = re.search(r"etcd Version:\s*(\S+)", out)
    return etcd, (f"etcd {match.group(1)}" if match else "etcd") + f" at {etcd}"


def probe_node_image() -> bool | None:
    """Whether the engine holds kind's default node image (never pulled here); None when it cannot say."""
    from harness.node.kind.cluster import DEFAULT_NODE_IMAGE

    try:
        from docker.errors import DockerException, ImageNotFound

        client = engine.client(engine.PING_TIMEOUT_S)
    except (engine.EngineUnavailable, ImportError):
        return None
    try:
        client.images.get(DEFAULT_NODE_IMAGE)
        return True
    except ImageNotFound:
        return False
    except DockerException:
        return None
    finally:
        client.close()


def compiler() -> str | None:
    # As fake_devices/nvml/build.py library() looks for one.
    return shutil.which(os.environ.get("CC") or "cc") or shutil.which("gcc")


def probe(offline: bool) -> Machine:
    from harness.node.real import localnode

    m = Machine(offline=offline, root=os.geteuid() == 0)
    try:
        m.files = bundled.files_root()
    except bundled.FilesMissing as err:
        m.files_error = str(err)
    m.namespaces = probe_namespaces(m.root)
    m.cgroup_version, m.cgroup_error = probe_cgroups()
    found = shutil.which("go")
    m.go = Path(found) if found else None
    m.go_needed = go_needed() if m.files is not None else (0, 0)
    if m.go is not None:
        m.go_version, m.go_text = go_version(m.go)
        if not offline:
            m.goproxy, m.proxy_error, m.proxy_text = probe_proxy(m.go)
            m.proxy_checked = True
    m.cc = compiler()
    m.etcd, m.etcd_text = probe_etcd()
    m.engine_error = engine.unavailable()
    if m.engine_error is None:
        m.node_image = probe_node_image()
    m.node_tools = localnode.missing_tools()
    m.inotify_limit, m.inotify_used = inotify_budget.limit(), inotify_budget.in_use()
    try:
        image.find_busybox()
    except image.ImageError as err:
        m.busybox_error = str(err)
    if m.files is not None:
        m.binaries = binary_groups()
        m.subjects = prebuild.bundled_builds()
        m.node_runtime = prebuild.node_runtime()
    return m


def binary_groups() -> dict[str, list[Binary]]:
    """The kube binaries per committed release (the control plane's with the default one), and kind's."""
    groups = {DEFAULT_KUBELET_VERSION: [*prebuild.control_plane(), prebuild.kubelet(None)]}
    for release in releases.REAL_KUBELET_MODULES:
        if release != DEFAULT_KUBELET_VERSION:
            groups[release] = [prebuild.kubelet(release)]
    for made in sorted(releases.modules_dir().glob(f"kubernetes-v*.f{releases.MODULE_FORMAT}")):
        if (made / "go.sum").is_file():  # a release generated before (releases.generated_module)
            release = made.name.removeprefix("kubernetes-v").rsplit(".f", 1)[0]
            groups[release] = [Binary("kubelet", releases.KUBELET_PACKAGE, made, why="for the real node")]
    groups["kind"] = prebuild.kind_tier()
    return groups


# -- tiers -------------------------------------------------------------------------------------------------


def tiers(m: Machine) -> list[Tier]:
    found = [files_tier(m), root_tier(m), namespaces_tier(m), cgroups_tier(m), go_tier(m), proxy_tier(m)]
    if m.files is not None:
        found.append(cache_tier(m))
    found += [gcc_tier(m), etcd_tier(m), engine_tier(m), runtime_tier(m), inotify_tier(m)]
    if m.files is not None:
        found += [release_tier(m, group) for group in m.binaries if group != "kind"]
        found += [kind_tier(m), subjects_tier(m)]
    return found


def files_tier(m: Machine) -> Tier:
    if m.files is None:
        return Tier("files", MISSING, without_hint(m.files_error), "pip install --force-reinstall fakelet")
    where = "an install" if bundled.installed() else "a checkout"
    return Tier("files", OK, f"fakelet's own files: {m.files / 'fixtures'} ({where})")


def root_tier(m: Machine) -> Tier:
    if m.root:
        return Tier("root", OK, "root: running as root")
    return Tier("root", LIMITED, f"root: running as uid {os.geteuid()}: no --node real, no per-subject cgroups, "
                                 "namespaces only through a user namespace", "run as root (sudo fakelet ...)")


def namespaces_tier(m: Machine) -> Tier:
    failed = {name: why for name, why in m.namespaces.items() if why is not None}
    via = "" if m.root else " (inside a user namespace)"
    if not failed:
        return Tier("namespaces", OK, f"namespaces: user, mount and PID{via}")
    works = [name for name in m.namespaces if name not in failed]
    what = (f"namespaces: {', '.join(failed)} refused ({next(iter(failed.values()))})"
            f"{'; ' + ', '.join(works) + ' work' + via if works else ''}: mount-namespace subjects cannot run, "
            "and a subject's processes are contained only by its cgroup")
    fix = ("run as root, or allow unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1, "
           "user.max_user_namespaces > 0)") if not m.root else "run with CAP_SYS_ADMIN (docker run --privileged)"
    return Tier("namespaces", MISSING, what, fix)


def cgroups_tier(m: Machine) -> Tier:
    if m.cgroup_error is None:
        return Tier("cgroups", OK, f"cgroups: {m.cgroup_version} (pids and memory limits)")
    return Tier("cgroups", LIMITED, f"cgroups: {m.cgroup_version}; subjects run without a cgroup of their own "
                                    f"({m.cgroup_error})", "run as root" if not m.root else "")


def go_tier(m: Machine) -> Tier:
    needed = "{}.{}".format(*m.go_needed)
    if m.go is None:
        return Tier("go", MISSING, "Go: no go on PATH: kube binaries and Go subjects cannot be built",
                    gobuild.GO_FIX)
    if m.go_version is None:
        return Tier("go", MISSING, f"Go: {m.go} does not run ({m.go_text})", gobuild.GO_FIX)
    if not m.go_usable:
        return Tier("go", MISSING, f"Go: {m.go_text} at {m.go} is older than the {needed} fakelet's modules need",
                    gobuild.GO_FIX)
    return Tier("go", OK, f"Go: {m.go_text} at {m.go} (fakelet's modules need {needed}+)")


def proxy_tier(m: Machine) -> Tier:
    if m.go is None:
        return Tier("proxy", UNKNOWN, "Go module proxy: not checked (no go)")
    if not m.proxy_checked:
        return Tier("proxy", UNKNOWN, "Go module proxy: not checked (--offline)")
    where = m.goproxy or GOPROXY_DEFAULT
    if m.proxy_error is None:
        return Tier("proxy", OK, f"Go module proxy: {where} answers ({m.proxy_text})")
    fix = (f"go env -w GOPROXY={GOPROXY_DEFAULT}" if m.goproxy == "off" else
           "give this machine a route to the proxy (HTTPS_PROXY=...) or set GOPROXY to a mirror; or fill "
           "~/.cache/fakelet elsewhere with fakelet prebuild and copy it here")
    return Tier("proxy", MISSING, f"Go module proxy: {where}: {m.proxy_error}", fix)


def cache_tier(m: Machine) -> Tier:
    """Where the cache is, what it holds (as builds name their binaries), and what the main job still builds."""
    root = gobuild.cache_root()
    known = [b for group in m.binaries.values() for b in group] + list(m.subjects.values())
    held = {located[1]: b for b in known if (located := m.locate(b)) is not None and located[0] == "cached"}
    titles = sorted({b.title() for b in held.values()})
    older = [p for p in prebuild.cached_binaries() if p not in held]
    size = prebuild.mib(prebuild.cache_size(root)) if root.is_dir() else "empty"
    what = f"build cache: {home_relative(root)}, {size}: " + (", ".join(titles) if titles else "no binaries")
    if older:  # built from a module fakelet has since changed: nothing uses them
        what += f"; {len(older)} of older module versions ({prebuild.mib(sum(p.stat().st_size for p in older))})"
    main = [b for b in m.binaries.get(DEFAULT_KUBELET_VERSION, []) if b.name in CONTROL_PLANE_NEEDS]
    waiting = [b for b in main if m.locate(b) is None]
    if not waiting:
        return Tier("cache", OK, what)
    cost = sum(s for s in prebuild.costs(main, waiting).values() if s is not None)
    what += f"; the main job builds {', '.join(b.name for b in waiting)} first (~{elapsed_text(cost)} measured cold)"
    if m.can_build:
        return Tier("cache", LIMITED, what, "fakelet prebuild --all")
    return Tier("cache", MISSING, what, gobuild.GO_FIX if not m.go_usable else "see the Go module proxy")


def gcc_tier(m: Machine) -> Tier:
    if m.cc is not None:
        return Tier("gcc", OK, f"C compiler: {m.cc} (the fake NVML library, cgo subjects)")
    return Tier("gcc", MISSING, "C compiler: none: no fake NVML library (the nvml skins) and no cgo subjects",
                "apt-get install -y gcc")


def etcd_tier(m: Machine) -> Tier:
    from harness.world.draenv import ETCD_INSTALL

    if m.etcd is not None:
        return Tier("etcd", OK, m.etcd_text)
    return Tier("etcd", MISSING, f"{m.etcd_text}: no local API server, so no DRA checks", ETCD_INSTALL)


def engine_tier(m: Machine) -> Tier:
    if m.engine_error is not None:
        # The engine's reason ends with a fix of its own; the fix column says it once.
        return Tier("docker", MISSING, f"Docker engine: {without_hint(m.engine_error).split('; ')[0]}",
                    f"apt-get install -y docker.io and start dockerd, or set {engine.DOCKER_HOST_ENV}")
    return Tier("docker", OK, f"Docker engine: answers at {engine.host()}")


def packages(hints: list[str]) -> str:
    names = dict.fromkeys(h.removeprefix(INSTALL_PREFIX) for h in hints)
    return f"apt-get install -y {' '.join(names)}"


def runtime_tier(m: Machine) -> Tier:
    """The real node's runtime: containerd 2 (cached, to build, or not buildable: then Debian's, without CDI)."""
    missing = [tool for tool, _ in m.node_tools] + (["a static busybox"] if m.busybox_error else [])
    hints = [package for _, package in m.node_tools] + ([image.BUSYBOX_HINT] if m.busybox_error else [])
    if missing:
        return Tier("runtime", MISSING, f"containerd and runc: {', '.join(missing)} not found: no --node real",
                    packages(hints))
    found = "runc, nsenter and a static busybox found"
    states = {m.state(b) for b in m.node_runtime}
    name = f"containerd {node_runtime.pinned_version()}" if m.files is not None else "containerd 2"
    if m.node_runtime and states <= {"path", "cached"}:
        return Tier("runtime", OK, f"real node's runtime: {name} cached (applies CDI devices); {found}")
    if m.node_runtime and "missing" not in states:
        cost = sum(s for s in prebuild.costs(m.node_runtime, m.node_runtime).values() if s is not None)
        return Tier("runtime", LIMITED, f"real node's runtime: {name} to build (~{elapsed_text(cost)} measured, "
                                        f"once; it applies CDI devices); {found}",
                    "fakelet prebuild --all (or let the first --node real run build it)")
    return Tier("runtime", LIMITED, f"real node's runtime: {name} cannot be built, so Debian's containerd, which "
                                    f"applies no CDI devices: {node_runtime.CDI_CHECKS}; {found}",
                gobuild.GO_FIX if not m.go_usable else "see the Go module proxy")


def inotify_tier(m: Machine) -> Tier:
    """Each real-node check holds about 15 inotify instances: the limit bounds how many run at once."""
    if m.inotify_limit is None:
        return Tier("inotify", UNKNOWN, "inotify: fs.inotify.max_user_instances not readable")
    what = (f"inotify: fs.inotify.max_user_instances={m.inotify_limit}, about {m.inotify_used} in use: "
            f"room for {max(0, (m.inotify_limit - m.inotify_used) // inotify_budget.NEEDED_REAL_NODE)} "
            "real-node checks at once")
    if m.inotify_limit >= inotify_budget.RECOMMENDED:
        return Tier("inotify", OK, what)
    return Tier("inotify", LIMITED, what + " (more jobs fail with 'Too many open files')",
                inotify_budget.fix_command())


STATE_WORDS = {"path": "on PATH", "cached": "cached", "buildable": "to build", "missing": "cannot be built"}


def states_text(m: Machine, binaries: list[Binary]) -> str:
    return ", ".join(f"{b.name} {STATE_WORDS[m.state(b)]}" for b in binaries)


def release_tier(m: Machine, release: str) -> Tier:
    group = m.binaries[release]
    version = gobuild.required_version(group[0].module / "go.mod", releases.KUBERNETES) if group[0].module else None
    label = f"kube binaries {release}" + (f" ({version})" if version and version.lstrip("v") != release else "")
    states = {m.state(b) for b in group}
    what = f"{label}: {states_text(m, group)}"
    if states <= {"path", "cached"}:
        return Tier(f"kube-{release}", OK, what)
    if "missing" not in states:
        return Tier(f"kube-{release}", LIMITED, what, f"fakelet prebuild --kubelet-version {release} (or let the "
                                                      "first run build them)")
    return Tier(f"kube-{release}", MISSING, what, gobuild.GO_FIX if not m.go_usable else "see the Go module proxy")


def kind_tier(m: Machine) -> Tier:
    from harness.node.kind.cluster import DEFAULT_NODE_IMAGE

    group = m.binaries["kind"]
    image_text = {True: f"node image {DEFAULT_NODE_IMAGE} present",
                  False: f"node image {DEFAULT_NODE_IMAGE} pulled on first use",
                  None: "node image not checked (no engine)"}[m.node_image]
    what = f"kind: {states_text(m, group)}; {image_text}"
    if m.engine_error is not None or not all(m.ready(b) for b in group):
        return Tier("kind", MISSING, what, "a Docker engine (above)" if m.engine_error else gobuild.GO_FIX)
    if all(m.state(b) in ("path", "cached") for b in group):
        return Tier("kind", OK, what)
    return Tier("kind", LIMITED, what, "fakelet prebuild --all (or let the first run build them)")


def subjects_tier(m: Machine) -> Tier:
    what = "Go subjects: " + ", ".join(f"{name} {STATE_WORDS[m.state(b)]}" for name, b in m.subjects.items())
    states = {m.state(b) for b in m.subjects.values()}
    if states <= {"path", "cached"}:
        return Tier("subjects", OK, what)
    if "missing" not in states:
        return Tier("subjects", LIMITED, what, "fakelet prebuild --all (or let the first run build them)")
    fix = gobuild.GO_FIX if not m.go_usable else ("apt-get install -y gcc" if m.cc is None else
                                                  "see the Go module proxy")
    return Tier("subjects", MISSING, what, fix)


# -- what can run --------------------------------------------------------------------------------------------


def reasons(checks: list[tuple[bool, str]]) -> str | None:
    """The first failed requirement's reason, or None when every one holds."""
    return next((why for ok, why in checks if not ok), None)


def can_run(m: Machine) -> dict[str, str | None]:
    """Each of fakelet's tiers, and why it cannot run here (None: it can)."""
    plane = {b.name: b for b in m.binaries.get(DEFAULT_KUBELET_VERSION, [])}

    def have(name: str) -> tuple[bool, str]:
        return name in plane and m.ready(plane[name]), f"{name} neither cached nor buildable"

    files = (m.files is not None, "fakelet's own files are missing")
    etcd = (m.etcd is not None, "no etcd")
    main = reasons([files, etcd, have("kube-apiserver"), have("kube-controller-manager")])
    node_ns = (m.namespaces.get("mount") is None and m.namespaces.get("PID") is None, "no mount and PID namespaces")
    real = reasons([files, (m.root, "not root"), node_ns, (not m.node_tools and m.busybox_error is None,
                                                           "containerd, runc or busybox missing"),
                    etcd, have("kube-apiserver"), have("kubelet")])
    docker = (m.engine_error is None, "no Docker engine")
    kind = reasons([files, docker, *((m.ready(b), f"{b.name} neither on PATH, cached nor buildable")
                                     for b in m.binaries.get("kind", []))])
    subjects = reasons([files, *((m.ready(b), f"{name} neither cached nor buildable")
                                 for name, b in m.subjects.items())])
    verdicts = {"main job (reference-dp, reference-dra)": main}
    if main is not None and m.files is not None:  # the device-plugin half needs only Python
        verdicts["reference-dp alone (fakelet run --subject reference-dp)"] = None
    return {**verdicts, "--node real": real, "containers (--image)": reasons([docker]), "kind (--cluster kind)": kind,
            "upstream Go subjects": subjects}


# -- the command ---------------------------------------------------------------------------------------------


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    what = "what this machine can run and what is missing for the rest, one line per tier with the fix"
    p = sub.add_parser("doctor", help=f"{what}; exit 0 when the main job can run",
                       description=f"{what}. Exit code 0 when the main job (tox -e conformance) can run here, 1 when "
                                   "it cannot. Nothing is built, pulled or started; every probe is bounded.")
    p.add_argument("--offline", action="store_true", help="do not ask the Go module proxy (it is not checked)")
    p.add_argument("--json", action="store_true", help="the same as one JSON object, for machines")


def summary_lines(verdicts: dict[str, str | None]) -> list[str]:
    can = [name for name, why in verdicts.items() if why is None]
    cannot = [f"{name} ({why})" for name, why in verdicts.items() if why is not None]
    return [f"can run: {', '.join(can) or 'nothing'}", *([f"cannot run: {'; '.join(cannot)}"] if cannot else [])]


def main(args: argparse.Namespace, out: Callable[[str], None] = print) -> int:
    machine = probe(args.offline)
    found, verdicts = tiers(machine), can_run(machine)
    main_job = next(iter(verdicts.values())) is None
    if args.json:
        out(json.dumps({"version": version_line(), "tiers": [asdict(t) for t in found], "can_run": verdicts,
                        "main_job": main_job}, indent=2))
    else:
        out(version_line())
        for tier in found:
            out(tier.line())
        for line in summary_lines(verdicts):
            out(line)
    sys.stdout.flush()
    return EXIT_OK if main_job else EXIT_CANNOT
