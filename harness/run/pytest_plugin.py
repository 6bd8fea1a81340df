"""fakelet's pytest plugin: the --fakelet-* options, the fixtures, the verdicts.

Thin on purpose: objects come from the library, fixtures only wire them, and
the report model decides nothing it is not told. Registered through the
`pytest11` entry point, so `pytest --pyargs suites --fakelet-subject NAME`
works in anyone's CI. The run comes either from `--fakelet-config PATH` (the
serialized RunConfig `fakelet run` writes) or from the individual
`--fakelet-*` options, which go through the same `RunConfig.build` as the CLI.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
import pytest

from harness.config.runconfig import (
    SHARED_CONTROL_PLANE_ENV,
    UNAVAILABLE,
    Overrides,
    RunConfig,
    fakelet_version,
    parse_observes,
)
from harness.controlplane import ControlPlane, ControlPlaneUnavailable, open_control_plane
from harness.controlplane.client import KubeClient
from harness.controlplane.local import START_TIMEOUT_S
from harness.instruments import inotify_budget, progress
from harness.instruments.doctor import machine_lacks
from harness.instruments.timeline import WaitTimeout
from harness.launch.containers.engine import EngineUnavailable
from harness.node.real.image import ImageError
from harness.node.real.localnode import NodeAccess, NotOnRealKubelet
from harness.node.real.localnode import unavailable as realnode_unavailable
from harness.run import provenance, scheduler, sharedplane
from harness.run.stopping import OrphanBackstop, StopSignals
from harness.run.worker_death import worker_died
from harness.spec import bundled
from harness.spec.checks import (
    KIND_REASON,
    NOT_APPLICABLE,
    NOT_EXERCISED,
    catalog,
    check_ids_of,
    not_exercised,
    split_install,
    unavailable,
)
from harness.spec.subjects import DEVICE_IDS, KINDS, SKINS, ProfileError
from harness.world.draenv import DRAEnv
from harness.world.env import DPEnv, SubjectUnavailable
from reports.model import ERROR, FAIL, PASS, SKIP, CheckResult, SubjectReport, merge_facts, requires
from reports.model import NOT_APPLICABLE as NA
from reports.model import NOT_EXERCISED as NOT_EXERCISED_VERDICT
from reports.writers import write_all

if TYPE_CHECKING:
    from harness.node.kind.cluster import KindAccess
    from harness.world.kepworld import KepWorld

PENDING = "pending"  # a check whose setup passed and whose call has not reported yet


# Every --fakelet-* option with its default: anything else counts as given on purpose.
OPTION_DEFAULTS: dict[str, Any] = {
    "fakelet_config": None, "fakelet_subject": None, "fakelet_subject_file": None, "fakelet_defect": None,
    "fakelet_profile": "fast", "fakelet_seed": 0, "fakelet_check": [], "fakelet_out": None,
    "fakelet_plugin_cmd": None, "fakelet_resource": None, "fakelet_mount_namespace": False,
    "fakelet_binary": None, "fakelet_kind": None, "fakelet_driver": None, "fakelet_kubelet_version": "default",
    "fakelet_control_plane": "local", "fakelet_inventory": None, "fakelet_skin": None, "fakelet_env": [],
    "fakelet_pass_env": [], "fakelet_private_dir": [], "fakelet_device_ids": None, "fakelet_observes": [],
    "fakelet_require": [], "fakelet_reaction_bound": None, "fakelet_node": "fake", "fakelet_thermal_threshold": None,
}


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("fakelet", "fakelet conformance harness")
    add = group.addoption
    add("--fakelet-config", metavar="PATH",
        help="a whole run as written by `fakelet run` (RunConfig JSON); excludes the other --fakelet-* options")
    add("--fakelet-subject", help="subject profile name (fixtures/subjects); default reference-dp")
    add("--fakelet-subject-file", metavar="PATH", help="a subject profile YAML of your own")
    add("--fakelet-defect", help="run the subject as a mutant with this named defect")
    add("--fakelet-profile", default="fast", help="timing profile: fast or upstream")
    add("--fakelet-seed", type=int, default=0, help="seed for fault schedules and choices")
    add("--fakelet-check", action="append", default=[], metavar="ID", help="run only these check IDs")
    add("--fakelet-out", help="write report.json, junit.xml and summary.md here")
    add("--fakelet-plugin-cmd", help="launch this plugin command instead of a named subject")
    add("--fakelet-resource", help="resource name the --fakelet-plugin-cmd plugin registers")
    add("--fakelet-mount-namespace", action="store_true",
        help="run --fakelet-plugin-cmd in a private mount namespace over /var/lib/kubelet/device-plugins")
    add("--fakelet-binary", help="use this prebuilt binary for the subject's {bin}")
    add("--fakelet-kind", choices=list(KINDS),
        help="what --fakelet-plugin-cmd is: a device plugin (default) or a DRA driver")
    add("--fakelet-driver", help="DRA driver name of the --fakelet-plugin-cmd driver")
    add("--fakelet-kubelet-version", default="default",
        help="kubelet version to imitate for DRA: 1.32 ... newest (default 1.36)")
    add("--fakelet-control-plane", default="local",
        help="API server for DRA checks: local (kube-apiserver + etcd), kubeconfig:<path>, or none")
    add("--fakelet-inventory", metavar="PATH_OR_NAME", help="give the subject this fake hardware inventory")
    add("--fakelet-skin", choices=list(SKINS), help="the fake hardware's sysfs layout")
    add("--fakelet-env", action="append", default=[], metavar="KEY=VALUE", help="set in the plugin's env")
    add("--fakelet-pass-env", action="append", default=[], metavar="NAME", help="copy into the plugin's env")
    add("--fakelet-private-dir", action="append", default=[], metavar="PATH",
        help="give the mount-namespace plugin a private copy of this host directory")
    add("--fakelet-device-ids", choices=list(DEVICE_IDS), help="how the plugin names devices")
    add("--fakelet-observes", action="append", default=[], metavar="LIST",
        help="backend changes the plugin observes: health,temperature,hotplug")
    add("--fakelet-require", action="append", default=[], metavar="ID|AREA",
        help="a check ID or area that must be exercised (not exercised fails the run)")
    add("--fakelet-node", default="fake", help="whose kubelet: fake (fakelet's, default) or real (v1.36, local)")
    add("--fakelet-reaction-bound", type=float, metavar="SECONDS",
        help="hold the plugin to this bound instead of the kubelet's (kill matrices)")
    add("--fakelet-thermal-threshold", type=float, metavar="C",
        help="the plugin's own overtemperature limit in degrees C (default: the subject's)")


def _given(opt: Any) -> list[str]:
    """The --fakelet-* options given with a value other than their default."""
    return [k for k, default in OPTION_DEFAULTS.items() if getattr(opt, k, default) != default]


def _overrides(opt: Any) -> Overrides:
    return Overrides(inventory=opt.fakelet_inventory, skin=opt.fakelet_skin, env=list(opt.fakelet_env),
                     pass_env=list(opt.fakelet_pass_env), private_dirs=list(opt.fakelet_private_dir),
                     device_ids=opt.fakelet_device_ids, observes=parse_observes(opt.fakelet_observes),
                     thermal_threshold=opt.fakelet_thermal_threshold)


def run_from_options(opt: Any) -> RunConfig:
    """The run: the file `fakelet run` wrote, or the individual options through the same RunConfig.build."""
    if opt.fakelet_config:
        others = [k for k in _given(opt) if k != "fakelet_config"]
        if others:
            flag = "--" + others[0].replace("_", "-")
            raise ProfileError(f"--fakelet-config describes the whole run; drop {flag}")
        return RunConfig.load(opt.fakelet_config)
    return RunConfig.build(
        subject=opt.fakelet_subject, subject_file=opt.fakelet_subject_file, defect=opt.fakelet_defect,
        profile=opt.fakelet_profile, seed=opt.fakelet_seed, checks=opt.fakelet_check, out=opt.fakelet_out,
        plugin_cmd=opt.fakelet_plugin_cmd, resource=opt.fakelet_resource, driver=opt.fakelet_driver,
        mount_namespace=opt.fakelet_mount_namespace, binary=opt.fakelet_binary, kind=opt.fakelet_kind,
        kubelet_version=opt.fakelet_kubelet_version, control_plane=opt.fakelet_control_plane,
        overrides=_overrides(opt), require=opt.fakelet_require, reaction_bound=opt.fakelet_reaction_bound,
        node=opt.fakelet_node)


def pytest_configure(config: pytest.Config) -> None:
    # A check may build its subject or a kubelet for minutes: that progress goes to the stderr pytest leaves
    # alone (it captures the test's), in plain lines, since pytest and its xdist workers share that terminal.
    config.add_cleanup(progress.pin_real_stderr(spinner=False))
    config.addinivalue_line("markers", "fakelet_check(id, level, title): a fakelet conformance check")
    try:
        clash = bundled.clash_message()
        if clash is not None:
            raise ProfileError(clash)
        run = run_from_options(config.option)
    except (ProfileError, ValueError) as err:
        if _given(config.option):
            raise pytest.UsageError(f"fakelet: {err}") from None
        # Plain pytest runs load this plugin too: complain only if checks get collected.
        config.pluginmanager.register(Collector(None, str(err)), "fakelet-collector")
        return
    config.pluginmanager.register(Collector(run), "fakelet-collector")


@contextlib.contextmanager
def _started_plane(spec: str) -> Iterator[tuple[ControlPlane | None, str]]:
    """A control plane started for the block, stopped after it: (plane, "") or (None, why it did not start)."""
    try:
        plane = open_control_plane(spec).start()
    except ControlPlaneUnavailable as err:
        yield None, str(err)
        return
    try:
        yield plane, ""
    finally:
        plane.stop()


def _marker(item: pytest.Item) -> pytest.Mark | None:
    return item.get_closest_marker("fakelet_check")


DETAIL_CAP_CHARS = 16_000
# How long an interrupted run's xdist workers get to tear their checks down: under `fakelet run`'s own
# grace (harness/run/commands.py INTERRUPT_GRACE_S), after which it kills the whole check run.
WORKER_TEARDOWN_S = 25.0
# An orphaned check run's teardown, then its process group is killed (stopping.OrphanBackstop): what `fakelet
# run` itself allows an interrupted check run (commands.py INTERRUPT_GRACE_S), plus the time to write the report.
ORPHAN_GRACE_S = 40.0


class Collector:
    """Turns pytest outcomes of marked checks into the report tree."""

    def __init__(self, run: RunConfig | None, error: str = "") -> None:
        self._run, self._error = run, error
        self.results: dict[str, CheckResult] = {}
        self.selected: list[str] = []  # check IDs collected for this run
        self._collected: set[str] = set()  # node IDs the xdist workers collected, not yet in `selected`
        self._suite_import: threading.Thread | None = None
        self.facts: dict[str, Any] = {}
        self.findings: list[str] = []
        self.cleanup: list[str] = []
        self.interrupted = False
        self.died: dict[str, str] = {}  # check ID -> how its worker died (pytest_handlecrashitem)
        # Installed at session start, in this process and in each xdist worker.
        self.backstop = OrphanBackstop(ORPHAN_GRACE_S)
        self.stop = StopSignals(on_first=self.backstop)
        self.negotiated: dict[str, set[str]] = {}  # API -> versions the fake kubelet negotiated
        self.started = time.monotonic()
        self.started_at = datetime.now(UTC).isoformat(timespec="seconds")
        self.provenance_start = provenance.start()  # the load average as the checks begin

    @property
    def run(self) -> RunConfig:
        if self._run is None:
            raise pytest.UsageError(f"fakelet: {self._error}")
        return self._run

    @pytest.fixture(scope="session")
    def fakelet_run(self) -> RunConfig:
        return self.run

    @pytest.fixture
    def dp_env(self, request: pytest.FixtureRequest) -> Iterator[DPEnv]:
        mark = _marker(request.node)
        check_id = mark.kwargs["id"] if mark else request.node.name
        artifacts = self.run.out / "artifacts" / check_id if self.run.out else None
        real_node = self._real_node(request, mark) if self.run.node == "real" else None
        kind = self._kind(request, mark) if self.run.cluster == "kind" else None
        try:
            binary = self.run.resolve_binary()
            env = DPEnv(self.run.spec, self.run.profile, self.run.defect, self.run.seed, binary, artifacts,
                        real_node=real_node, kind=kind, kubelet_version=self.run.kubelet_version)
        except SubjectUnavailable as err:
            pytest.skip(str(err))
        try:
            yield env
        finally:
            try:
                env.close()
            finally:
                report_env(request, env)

    def _real_node(self, request: pytest.FixtureRequest, mark: pytest.Mark | None,
                   plane_of_check: tuple[ControlPlane | None, str] | None = None) -> NodeAccess:
        """Where the real kubelet joins, or end the check: not exercised there, or skipped with why not."""
        # Every DP and DRA check runs there, through the relays (harness/node/relay); one that needs a
        # fault only the fake kubelet injects ends as not exercised when it asks for it (NotOnRealKubelet).
        why = realnode_unavailable()
        if why:
            pytest.skip(f"real kubelet: {why}")
        plane, why = plane_of_check or request.getfixturevalue("fakelet_control_plane")
        if plane is None:
            pytest.skip(f"real kubelet: no API server to join ({why})")
        return NodeAccess(plane.kubeconfig, plane.client())

    def _kind(self, request: pytest.FixtureRequest, mark: pytest.Mark | None) -> KindAccess:
        """The run's kind cluster, or end the check: not exercised there, or skipped with why not."""
        if mark is None or not mark.kwargs.get("kind"):
            not_exercised(KIND_REASON)
        access, why = request.getfixturevalue("fakelet_kind")
        if access is None:
            pytest.skip(f"kind: {why}")
        return access

    @pytest.fixture(scope="session")
    def fakelet_kind(self) -> Iterator[tuple[KindAccess | None, str]]:
        """One kind cluster for the run, fed the subject's image and the pods' image."""
        from harness.launch.containers import images
        from harness.node.kind.cluster import KindAccess, KindTier, KindUnavailable
        from harness.node.real.image import find_busybox

        tier = KindTier(self.run.kind_image, self.run.keep_cluster)
        try:
            tier.start()
            pod_image = images.scratch_image(find_busybox(), "busybox")
            for image in (self.run.spec.image or "", pod_image):
                tier.load(image)
            client = KubeClient.from_kubeconfig(tier.kubeconfig)
        except (KindUnavailable, images.ImageError, ImageError, EngineUnavailable) as err:
            tier.stop()
            yield None, str(err).splitlines()[0]
            return
        try:
            yield KindAccess(tier, client, pod_image), ""
        finally:
            client.close()
            tier.stop()

    @pytest.fixture(scope="session")
    def fakelet_control_plane(self) -> Iterator[tuple[ControlPlane | None, str]]:
        """One API server for the session (each xdist worker): checks isolate by node name and namespace."""
        spec = self.run.control_plane
        if spec == "local":
            spec = os.environ.get(SHARED_CONTROL_PLANE_ENV, spec)
        if spec.startswith(sharedplane.PENDING):  # `fakelet run` is still starting it (harness/run/sharedplane.py)
            spec = sharedplane.await_plane(spec, 2 * START_TIMEOUT_S + sharedplane.WAIT_SLACK_S)
        if spec.startswith(UNAVAILABLE):
            yield None, spec.removeprefix(UNAVAILABLE)
            return
        with _started_plane(spec) as plane:
            yield plane

    @contextlib.contextmanager
    def _plane_of_check(self, shared: tuple[ControlPlane | None, str],
                        mark: pytest.Mark | None) -> Iterator[tuple[ControlPlane | None, str]]:
        """The run's shared API server, or, for a check that writes cluster-wide objects (CLUSTER_OBJECTS in
        harness/spec/checks.py) on a local one, an API server of its own for the check's lifetime."""
        if mark is None or not mark.kwargs.get("cluster_objects") or self.run.control_plane != "local" \
                or shared[0] is None:
            yield shared
            return
        with _started_plane("local") as plane:
            yield plane

    @pytest.fixture
    def dra_env(self, request: pytest.FixtureRequest,
                fakelet_control_plane: tuple[ControlPlane | None, str]) -> Iterator[DRAEnv]:
        mark = _marker(request.node)
        check_id = mark.kwargs["id"] if mark else request.node.name
        artifacts = self.run.out / "artifacts" / check_id if self.run.out else None
        if self.run.cluster == "kind":
            not_exercised(KIND_REASON)
        with self._plane_of_check(fakelet_control_plane, mark) as plane_of_check:
            yield from self._dra_env(request, mark, artifacts, plane_of_check)

    def _dra_env(self, request: pytest.FixtureRequest, mark: pytest.Mark | None, artifacts: Path | None,
                 plane_of_check: tuple[ControlPlane | None, str]) -> Iterator[DRAEnv]:
        # On the real kubelet every DRA check runs through the DRA relay (harness/node/relay/dra.py); one that
        # needs a fault only the fake kubelet injects ends as not exercised when it asks for it.
        real_node = self._real_node(request, mark, plane_of_check) if self.run.node == "real" else None
        plane, why = plane_of_check
        try:
            binary = self.run.resolve_binary()
            env = DRAEnv(self.run.spec, self.run.profile, self.run.defect, self.run.seed, binary, artifacts,
                         kubelet_version=self.run.kubelet_version, control_plane=plane, control_plane_error=why,
                         real_node=real_node, partitioned=bool(mark is not None and mark.kwargs.get("partitioned")),
                         shared=bool(mark is not None and mark.kwargs.get("shared")),
                         fabric=bool(mark is not None and mark.kwargs.get("fabric")))
        except SubjectUnavailable as err:
            pytest.skip(str(err))
        try:
            yield env
        finally:
            request.node.user_properties.append(("fakelet_negotiated", env.negotiated()))
            try:
                env.close()
            finally:
                report_env(request, env)

    @pytest.fixture(scope="session")
    def kep_world(self, request: pytest.FixtureRequest) -> Iterator[KepWorld]:
        """The KEP-5970 suite's one world for the session: a live cluster's installed driver
        (--cluster kubeconfig:PATH), or the subject launched here beside the local real kubelet,
        its claims allocated and its pods bound by fakelet's scheduler (harness/world/kepworld.py)."""
        from harness.world.kepworld import KepWorld

        run = self.run
        if run.cluster is not None and run.cluster.startswith("kubeconfig:"):
            client = KubeClient.from_kubeconfig(Path(run.cluster.removeprefix("kubeconfig:")))
            world = KepWorld(client, run.spec.driver or run.spec.resource, run.device_class or "", run.profile)
            try:
                world.start()
                yield world
            finally:
                try:
                    world.close()
                finally:
                    client.close()
            return
        if run.node != "real":
            unavailable("kep5970 judges what a kubelet does with real pods (containers, events, their "
                        "environment): run it with --node real, or against a cluster with --cluster kubeconfig:PATH")
        real_node = self._real_node(request, None)
        plane, why = request.getfixturevalue("fakelet_control_plane")
        artifacts = run.out / "artifacts" / "kep5970" if run.out else None
        try:
            env = DRAEnv(run.spec, run.profile, run.defect, run.seed, run.resolve_binary(), artifacts,
                         kubelet_version=run.kubelet_version, control_plane=plane, control_plane_error=why,
                         real_node=real_node)
        except SubjectUnavailable as err:
            pytest.skip(str(err))
        world = None
        try:
            env.start()
            # In a cluster the driver is installed, and registered, before the suite runs: here it has just
            # started. A real kubelet that gets the pod before the registration retries its prepare only at its
            # next resync (a minute on), so the story waits for the registration first, within the reaction
            # bound; a driver that never registers is KEP5970-01's to fail, not a setup error.
            with contextlib.suppress(WaitTimeout, AssertionError):
                env.wait_dra_registered()
            assert env.allocator is not None and env.client is not None
            env.allocator.ensure_device_class(env.device_class, env.driver)
            # The local API server's kube-scheduler allocates and binds, as in a cluster, when it runs (`fakelet run
            # --suite kep5970` starts it); otherwise fakelet's allocator and scheduler do (harness/controlplane).
            real_scheduler = plane_runs_scheduler(plane)
            world = KepWorld(env.client, env.driver, env.device_class, run.profile, node=env.node_name,
                             scheduler=None if real_scheduler else env.scheduler, runnable=env.node.runnable,
                             namespace=env.node_name,
                             allocated_by="the local kube-scheduler" if real_scheduler else FAKELET_ALLOCATOR)
            world.start()
            yield world
        finally:
            try:
                if world is not None:
                    world.close()
            finally:
                try:
                    env.close()
                finally:
                    # A named suite runs in this one process (no workers): what the world learned goes straight
                    # into the report, as report_env hands it over for the function-scoped worlds.
                    for api, version in env.negotiated().items():
                        self.negotiated.setdefault(api, set()).add(version)
                    merge_facts(self.facts, dict(env.facts))
                    self.findings.extend(f for f in env.findings if f not in self.findings)

    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        if not any(_marker(i) for i in items):
            return
        wanted = set(self.run.checks)
        if not wanted:
            return
        known = {m.kwargs["id"] for i in items if (m := _marker(i))}
        unknown = wanted - known
        if unknown:
            raise pytest.UsageError(f"fakelet: unknown check ID(s) {', '.join(sorted(unknown))}; "
                                    f"known: {', '.join(sorted(known))}")
        keep = [i for i in items if (m := _marker(i)) and m.kwargs["id"] in wanted]
        config.hook.pytest_deselected(items=[i for i in items if i not in keep])
        items[:] = keep

    @pytest.hookimpl(wrapper=True)
    def pytest_pyfunc_call(self, pyfuncitem: pytest.Function) -> Any:
        """A check that asked the real kubelet for what only the fake can do ends as not exercised there."""
        try:
            return (yield)
        except NotOnRealKubelet as err:
            not_exercised(f"on the real kubelet: {err}")

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[Any]) -> Any:
        """Where the check ran (this process or an xdist worker): judge the phase, attach it to the report."""
        report = yield
        mark = _marker(item)
        if mark is not None:
            verdict, detail, install = self._verdict(report, call)
            env = item.funcargs.get("dp_env") or item.funcargs.get("dra_env") if hasattr(item, "funcargs") else None
            if verdict in (FAIL, ERROR) and report.when == "call" and isinstance(env, DPEnv) \
                    and "last output:" not in detail:  # a check may quote it itself (DP-RST's restart cycle)
                said = env.failure_output(call.excinfo.value if call.excinfo is not None else None)
                detail = f"{detail}\n{said}" if said else detail
            if len(detail) > DETAIL_CAP_CHARS:  # a plugin's own strings can be huge: keep the report readable
                cut = len(detail) - DETAIL_CAP_CHARS
                detail = f"{detail[:DETAIL_CAP_CHARS]}\n[fakelet: detail cut, {cut} more characters]"
            report.user_properties.append(("fakelet", {
                "id": mark.kwargs["id"], "level": mark.kwargs["level"], "title": mark.kwargs["title"],
                "verdict": verdict, "detail": detail, "install": install}))
        return report

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self.selected = [m.kwargs["id"] for i in session.items if (m := _marker(i))]

    def _timing_key(self) -> str:
        return scheduler.run_key(self.run.spec.name, self.run.defect, scheduler.timing_label(self.run))

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_make_scheduler(self, config: pytest.Config, log: Any) -> Any:
        """A check run (`fakelet run -j N`) starts its longest checks first (harness/run/scheduler.py)."""
        if self._run is None or config.getvalue("dist") != "load":
            return None
        package = self.run.suite_package
        catalog(package)
        estimate = scheduler.estimates_for(self._timing_key())

        def of_nodeid(nodeid: str) -> float:
            ids = check_ids_of([nodeid], package)
            return max((estimate(i) for i in ids), default=scheduler.DEFAULT_ESTIMATE_S)

        return scheduler.LongestFirst(of_nodeid, log)

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node: Any, ids: list[str]) -> None:
        """The xdist controller collects nothing itself: its workers' collections say what was selected."""
        if self._run is None:
            return
        self._collected.update(ids)

    def pytest_runtest_logstart(self, nodeid: str, location: Any) -> None:
        # The xdist controller imported no suite module yet (check_ids_of needs them): seconds of CPU on a loaded
        # machine. xdist hands out the first check (the longest) only after the first worker's collection hooks
        # return, so they are imported beside the checks, once the first has begun.
        if self._collected and self._suite_import is None:
            self._suite_import = threading.Thread(target=catalog, args=(self.run.suite_package,), daemon=True,
                                                  name="suite-import")
            self._suite_import.start()

    def _suite_imported(self) -> None:
        """The suite's modules imported in this process (check_ids_of reads them), and what was collected known."""
        if self._suite_import is not None:
            self._suite_import.join()
        if self._collected:
            catalog(self.run.suite_package)  # at once if imported; an import that failed on the thread raises here
            ids, self._collected = sorted(self._collected), set()
            self.selected = sorted(set(self.selected) | set(check_ids_of(ids, self.run.suite_package)))

    def _await_workers(self, session: pytest.Session) -> None:
        """Let interrupted xdist workers finish their teardown before xdist ends them.

        xdist gives workers 10 s (NodeManager.EXIT_TIMEOUT) and then kills them, and execnet
        SIGINTs a worker still busy after 5 s: either cut a check's teardown short and left its
        sandbox, cgroup and temp dirs behind. Their last reports (teardown verdicts) are merged
        on the way; nothing else is dispatched, so no crashed worker is replaced and no check
        scheduled during the stop.
        """
        dsession = session.config.pluginmanager.get_plugin("dsession")
        nodes = getattr(dsession, "_active_nodes", None)
        events = getattr(dsession, "queue", None)
        if not nodes or events is None:
            return
        deadline = time.monotonic() + WORKER_TEARDOWN_S
        while nodes and (left := deadline - time.monotonic()) > 0:
            try:
                name, kwargs = events.get(timeout=left)
            except queue.Empty:
                return
            if name == "testreport":
                session.config.hook.pytest_runtest_logreport(report=kwargs["rep"])
            elif name in ("workerfinished", "errordown", "internal_error"):
                nodes.discard(kwargs["node"])

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Where reports are gathered (this process or the xdist controller): merge the phases.

        Only the call phase (or a setup that did not pass) gives a check its verdict: a
        passing setup is provisional, so a check whose worker died mid-call is never a pass.
        """
        phase = next((v for k, v in report.user_properties if k == "fakelet"), None)
        self._merge_properties(report, phase["id"] if phase else None)
        if phase is None:
            return
        check_id, verdict = phase["id"], phase["verdict"]
        previous = self.results.get(check_id)
        if report.when == "teardown" and previous is not None:
            if verdict == ERROR and previous.verdict in (PASS, PENDING):
                previous.verdict, previous.detail = ERROR, f"teardown failed: {phase['detail']}"
                previous.repro = self.run.repro(check_id)
            previous.duration_s = round(previous.duration_s + report.duration, 3)
            return
        if report.when == "setup" and verdict == PASS:
            verdict = PENDING
        if report.when == "call" or previous is None or verdict != PENDING:
            duration = report.duration + (previous.duration_s if previous else 0.0)
            notes = previous.notes if previous else []
            self.results[check_id] = CheckResult(
                id=check_id, level=phase["level"], title=phase["title"], verdict=verdict,
                duration_s=round(duration, 3), detail=phase["detail"], notes=notes, install=phase["install"],
                repro="" if verdict in (PASS, PENDING) else self.run.repro(check_id),
                required=required(check_id, self.run.require))

    def _merge_properties(self, report: pytest.TestReport, check_id: str | None) -> None:
        for key, value in report.user_properties:
            if key == "fakelet_negotiated":
                for api, version in value.items():
                    self.negotiated.setdefault(api, set()).add(version)
            elif key == "fakelet_notes" and check_id in self.results:
                self.results[check_id].notes.extend(n for n in value if n not in self.results[check_id].notes)
            elif key == "fakelet_measured" and check_id in self.results:
                self.results[check_id].measured.update(value)
            elif key == "fakelet_facts":
                merge_facts(self.facts, value)
            elif key == "fakelet_cleanup":
                seen = {finding_kind(f) for f in self.cleanup}
                self.cleanup.extend(f for f in value if finding_kind(f) not in seen)
            elif key == "fakelet_findings":
                # One finding per kind: each check's copy differs only in pids and paths.
                seen = {finding_kind(f) for f in self.findings}
                self.findings.extend(f for f in value if finding_kind(f) not in seen)

    @staticmethod
    def _verdict(report: pytest.TestReport, call: pytest.CallInfo[Any]) -> tuple[str, str, str]:
        """(verdict, detail, install command) for one phase of a check."""
        if report.passed:
            return PASS, "", ""
        if report.skipped:
            reason = str(report.longrepr[2]) if isinstance(report.longrepr, tuple) else str(report.longrepr)
            reason = reason.removeprefix("Skipped: ")
            for prefix, verdict in ((NOT_APPLICABLE, NA), (NOT_EXERCISED, NOT_EXERCISED_VERDICT)):
                if reason.startswith(prefix):
                    return verdict, reason.removeprefix(prefix), ""
            detail, install = split_install(reason)
            return SKIP, detail, install
        exc = call.excinfo.value if call.excinfo is not None else None
        text = str(exc) if exc is not None else str(report.longrepr)
        verdict = ERROR
        if report.when == "call" and isinstance(exc, (AssertionError, grpc.RpcError)):
            if isinstance(exc, grpc.RpcError):
                code = exc.code().name if hasattr(exc, "code") else "?"
                details = exc.details() if hasattr(exc, "details") else str(exc)
                text = f"expected the plugin to answer the call; it failed with {code}: {details}"
            verdict = FAIL
        else:
            text = f"harness error in {report.when}: {type(exc).__name__ if exc else ''}: {text}"
        machine = inotify_budget.out_of_instances()
        if machine is not None:
            # A plugin or kubelet that could not watch its files exits or stalls: the machine's doing, not its.
            return ERROR, f"{machine_lacks(machine)}; what the check saw then: {text}", ""
        return verdict, text, ""

    def _finalize(self) -> None:
        """Checks without a final verdict never pass. One a stop cut off (a graceful stop: its call was interrupted)
        has no result: it joins `missing`, beside the checks the stop kept from starting, and the report says
        INTERRUPTED. One whose process died, or that ended without a verdict in a run nobody stopped, is an error."""
        for c in list(self.results.values()):
            if c.verdict != PENDING:
                continue
            if self.interrupted and c.id not in self.died:
                del self.results[c.id]
                continue
            c.verdict, c.repro = ERROR, self.run.repro(c.id)
            c.detail = self.died.get(c.id) or "no result: the check's process ended before its verdict"

    @pytest.hookimpl(optionalhook=True)
    def pytest_handlecrashitem(self, crashitem: str, report: pytest.TestReport, sched: Any) -> None:
        """The xdist controller, on a worker that died running `crashitem`: say how in its checks' details."""
        if self._run is not None:
            said = worker_died(getattr(report, "node", None))
            self._suite_imported()
            for check_id in check_ids_of([crashitem], self.run.suite_package):
                self.died[check_id] = said

    def subject_report(self) -> SubjectReport:
        self._finalize()
        self._suite_imported()
        order = {cid: n for n, cid in enumerate(self.results)}
        missing = sorted(set(self.selected) - set(self.results))
        return SubjectReport(
            subject=self.run.spec.name, defect=self.run.defect, profile=self.run.profile.name,
            seed=self.run.seed, kind=self.run.spec.kind, node=self.run.node, fakelet_version=fakelet_version(),
            api_versions=self.api_versions(), timings=self.run.profile.describe(),
            started_at=self.started_at, duration_s=round(time.monotonic() - self.started, 3),
            checks=sorted(self.results.values(), key=lambda c: (c.id, order[c.id])),
            missing=missing, interrupted=self.interrupted, facts=dict(self.facts), findings=list(self.findings),
            cleanup=list(self.cleanup), suite=self.run.suite, require=list(self.run.require))

    def api_versions(self) -> dict[str, str]:
        if not self.run.spec.is_dra:
            return {"deviceplugin": "v1beta1"}
        versions = {"kubelet": self.run.kubelet_version.name, "pluginregistration": "v1"}
        for api in ("dra", "dra-health"):
            seen = sorted(self.negotiated.get(api, set()))
            if len(seen) > 1:  # checks that ended before the first health message saw none yet
                seen = [v for v in seen if v != "none"]
            versions[api] = ", ".join(seen) if seen else "none negotiated"
        return versions

    def pytest_keyboard_interrupt(self, excinfo: Any) -> None:
        self.interrupted = True

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_teardown(self, item: pytest.Item, nextitem: pytest.Item | None) -> Any:
        """A check's teardown runs to its end (its subject, cgroup and sandbox gone); a stop signal that came
        meanwhile then stops the session."""
        with self.stop.shielded():
            result = yield
        self.stop.raise_if_requested()
        return result

    @pytest.hookimpl(wrapper=True, tryfirst=True, specname="pytest_sessionfinish")
    def shield_sessionfinish(self, session: pytest.Session, exitstatus: int) -> Any:
        """Teardown and the report run to their end: a stop signal meanwhile only marks the run interrupted."""
        with self.stop.shielded():
            return (yield)

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if exitstatus == pytest.ExitCode.INTERRUPTED or self.stop.requested:
            self.interrupted = True
        if hasattr(session.config, "workerinput"):
            return  # an xdist worker: the controller writes the report
        if self.interrupted:
            self._await_workers(session)
        if self._run is not None:
            self._suite_imported()
        if self._run is not None and self._run.out is not None and (self.results or self.selected):
            report = self.subject_report()
            sharedplane.resolved_spec()  # the shared plane's description, for the provenance, if it came up
            provenance.finish(self.run, report, self.provenance_start)
            write_all(report, self.run.out)
            if not self.interrupted and self.run.node == "fake":
                # What each check took, for the next run's order (an error's time says nothing of the check).
                scheduler.learn(self._timing_key(), {c.id: c.duration_s for c in report.checks
                                                     if c.verdict not in (ERROR, SKIP, PENDING)})

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self.results:
            return
        r = self.subject_report()
        s = r.summary()
        terminalreporter.write_line(
            f"fakelet {r.subject}{f' [{r.defect}]' if r.defect else ''}: {s['pass']} pass, {s['fail']} fail, "
            f"{s['not-exercised']} not exercised, {s['n/a']} n/a, {s['skip']} skip, {s['error']} error: "
            f"{r.status_line()}")


FAKELET_ALLOCATOR = "fakelet's allocator and scheduler (harness/controlplane/allocator.py), not kube-scheduler"


def plane_runs_scheduler(plane: ControlPlane | None) -> bool:
    """Whether the API server the checks use has a kube-scheduler beside it: this process's own local plane,
    or the one `fakelet run` shared (what it announced for the reports' provenance)."""
    if plane is None:
        return False
    described: dict[str, Any] = {}
    with contextlib.suppress(Exception):
        described = plane.describe()
    if "kube-scheduler" not in described:
        with contextlib.suppress(ValueError):
            described = json.loads(os.environ.get(provenance.PLANE_ENV) or "{}")
    found = str(described.get("kube-scheduler", ""))
    return bool(found) and not found.startswith("not running")


def finding_kind(finding: str) -> str:
    return re.sub(r"\[.*\]|\d+", "#", finding)


def report_env(request: pytest.FixtureRequest, env: DPEnv) -> None:
    """Hand what the check's world learned to wherever reports are gathered (xdist-safe properties)."""
    request.node.user_properties.append(("fakelet_notes", list(env.notes)))
    request.node.user_properties.append(("fakelet_measured", dict(getattr(env, "measured", {}))))
    request.node.user_properties.append(("fakelet_facts", dict(env.facts)))
    request.node.user_properties.append(("fakelet_findings", list(env.findings)))
    request.node.user_properties.append(("fakelet_cleanup", list(getattr(env, "cleanup", []))))


def required(check_id: str, require: list[str]) -> bool:
    """--require takes check IDs and areas: `DP-HLT` requires DP-HLT-01 ... DP-HLT-05."""
    return any(requires(r, check_id) for r in require)


def pytest_sessionstart(session: pytest.Session) -> None:
    # SIGTERM (a CI timeout, `fakelet run` being stopped) must tear checks down like Ctrl-C does, so that no
    # subject process or sandbox is left behind; and no later signal may cut that teardown short.
    collector = session.config.pluginmanager.get_plugin("fakelet-collector")
    if isinstance(collector, Collector):
        collector.stop.install()
        if collector._run is not None and not hasattr(session.config, "workerinput") \
                and os.getpgrp() == os.getpid():
            collector.backstop.watch()  # the controller of `fakelet run`'s check run: it must not outlive it
