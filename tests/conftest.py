"""Fixtures shared by the harness's own tests."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

# CI (.ci/run sets CI=true, and tox.ini passes it on) draws the same examples on every run, so that a red
# build is the code's doing and replays from the log (print_blob); a developer's run keeps exploring new ones.
# No deadline and no too_slow health check: on a loaded machine one example, or drawing it, can take seconds
# without being slow code. Registered here rather than left to hypothesis's own CI detection, so that it does
# not depend on the hypothesis release; loaded before any test module is imported, so that each test's own
# @settings(...) inherits it.
settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True, database=None,
                          suppress_health_check=[HealthCheck.too_slow])
if os.environ.get("CI"):
    settings.load_profile("ci")


@pytest.fixture
def tmp() -> Iterator[Path]:
    """A private, short TMPDIR for a fakelet subprocess (unix socket paths must stay under 108 bytes)."""
    d = Path(tempfile.mkdtemp(prefix="fk-", dir="/tmp"))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="session")
def shared_kubeconfig() -> Iterator[Path]:
    """One local kube-apiserver + etcd for this test process; users isolate by node name and namespace.

    A start that fails although every binary is there fails the test: only a
    missing component (named in the reason) makes it skip.
    """
    from harness.controlplane import ControlPlaneUnavailable
    from harness.controlplane.local import ControlPlaneStartError, LocalControlPlane

    plane = LocalControlPlane()
    try:
        plane.start()
    except ControlPlaneStartError:
        raise
    except ControlPlaneUnavailable as err:
        pytest.skip(str(err))
    try:
        yield plane.kubeconfig
    finally:
        plane.stop()


@pytest.fixture(scope="module")
def control_plane() -> Iterator[Any]:
    """A local control plane (etcd, kube-apiserver, kube-controller-manager) of the test module's own."""
    from harness.controlplane import ControlPlaneUnavailable, open_control_plane

    try:
        cp = open_control_plane("local").start()
    except ControlPlaneUnavailable as err:
        pytest.skip(f"no API server: {str(err).splitlines()[0]}")
    try:
        yield cp
    finally:
        cp.stop()


SAMPLED_SCENARIO_TEST = "test_each_scenario_keeps_its_promises_on_the_fake_kubelet"
SAMPLED_REAL_SCENARIO_TEST = "test_each_scenario_gives_its_verdict_on_the_real_kubelet"
SAMPLE_NOTE: list[str] = []  # what the sample took, for the header and the summary
SAMPLE_NOTE_KEY = "fakelet_sample_note"  # in an xdist worker's workeroutput


@pytest.hookimpl(trylast=True)  # after -m and -k: the counts are of what this run selected
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    import matrix_sample

    if not matrix_sample.full():
        _sample(config, items)
    _longest_first(config, items)


def _longest_first(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Each xdist worker's share of the run starts with its longest tests (tests/longest_first.py)."""
    import longest_first

    workers = int(getattr(config, "workerinput", {}).get("workercount", 1))
    known = longest_first.load()
    items[:] = longest_first.interleave(items, [longest_first.expected(i.nodeid, known) for i in items], workers)


def _sample(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The kill matrix and the scenarios in the default run: what changed plus a fixed sample
    (tests/matrix_sample.py)."""
    import matrix_sample

    keep, drop = [], []
    taken = {"kill matrix": [0, 0], "scenarios": [0, 0], "scenarios on the real kubelet": [0, 0]}
    kills_only = 0
    for item in items:
        module = getattr(item.module, "__name__", "")
        params = getattr(getattr(item, "callspec", None), "params", {})
        if module == "test_kill_matrix" and (behaviour := params.get("defect") or params.get("behaviour")):
            group = "kill matrix"
            subject = params["subject"]
            case = item.module.SPECS[subject].defects[behaviour]
            touched = matrix_sample.touched(behaviour, [*case.kills, *(case.checks or [])], _check_modules())
            if not case.kills:
                wanted = touched or matrix_sample.in_sample(subject, behaviour, matrix_sample.BENIGN_SAMPLE_ONE_IN)
            else:
                whole = touched
                covers = _covering(item.module.SPECS).get((subject, behaviour))
                wanted = whole or covers is not None
                # A mutant the change did not touch runs just the checks it was taken to cover, each of which it
                # must fail: that it is caught is what it is there for; that it fails nothing else is tox -e
                # matrix's to show (each check runs clean on the reference subject's run anyway). Whole runs of the
                # hash sample took 600 s of CI's 25 min.
                if wanted and not whole:
                    item.stash[matrix_sample.KILLS_ONLY] = covers
                kills_only += wanted and not whole
        elif module == "test_scenarios" and item.originalname == SAMPLED_SCENARIO_TEST:
            group = "scenarios"
            name = params["name"]
            defects = [c.defect for n, c in item.module.FAKE_CASES if n == name]
            wanted = matrix_sample.scenario_in_sample(name) or matrix_sample.scenario_touched(name, defects)
        elif module == "test_scenarios" and item.originalname == SAMPLED_REAL_SCENARIO_TEST:
            group = "scenarios on the real kubelet"
            name, case = params["name"], params["case"]
            cases = [c for n, c in item.module.REAL_CASES if n == name]
            # Half the scenarios keep their first real case, the others (another release, a mutant) are sampled.
            first = case is cases[0] and matrix_sample.real_first_in_sample(name)
            wanted = first or matrix_sample.real_case_in_sample(item.callspec.id) \
                or matrix_sample.scenario_touched(name, [c.defect for c in cases])
        else:
            keep.append(item)  # every other test, and each reference subject's clean run
            continue
        taken[group][0] += wanted
        taken[group][1] += 1
        (keep if wanted else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
    since = matrix_sample.base() or "nothing"
    SAMPLE_NOTE[:] = [f"{what}: {k} of {n} cases (a fixed sample and what changed since {since}; "
                      f"tox -e {'fidelity' if 'real' in what else 'matrix'} runs all)"
                      for what, (k, n) in taken.items() if n]
    if kills_only:
        SAMPLE_NOTE.append(f"kill matrix: {kills_only} mutant(s) the change did not touch run only the checks they "
                           "must fail")


def pytest_terminal_summary(terminalreporter: Any) -> None:
    for line in SAMPLE_NOTE:
        terminalreporter.write_line(line)


_DURATIONS: list[Any] = []  # the recorder, when FAKELET_RECORD_DURATIONS names a file


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    import longest_first

    if not os.environ.get(longest_first.RECORD_ENV):
        return  # under xdist the controller hears every worker's reports too, and only it writes the file
    if not _DURATIONS:
        _DURATIONS.append(longest_first.Recorder())
    _DURATIONS[0].add(report.nodeid, report.duration)


def pytest_sessionfinish(session: pytest.Session) -> None:
    import longest_first

    if _DURATIONS and (path := os.environ.get(longest_first.RECORD_ENV)) \
            and getattr(session.config, "workerinput", None) is None:
        _DURATIONS[0].write(Path(path))
    # Under xdist the workers collect, not the controller that prints the summary: hand the note over.
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput[SAMPLE_NOTE_KEY] = list(SAMPLE_NOTE)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    note = getattr(node, "workeroutput", {}).get(SAMPLE_NOTE_KEY)
    if note and not SAMPLE_NOTE:
        SAMPLE_NOTE[:] = note


_COVERING: list[dict[tuple[str, str], frozenset[str]]] = []


def _covering(specs: dict[str, Any]) -> dict[tuple[str, str], frozenset[str]]:
    """The kill matrix's mutants in the sample, as few as give every check one that must fail it, each with the
    checks it was taken for."""
    import matrix_sample

    if not _COVERING:
        _COVERING.append(matrix_sample.cover_plan((s, d, c.kills) for s, spec in specs.items()
                                                  for d, c in spec.defects.items()))
    return _COVERING[0]


@functools.cache
def _check_modules() -> dict[str, str]:
    """Check ID -> the suites module that defines it (importing every suite fills the catalog's map)."""
    from harness.spec.checks import CHECK_MODULES, SUITES, catalog

    for package in SUITES.values():
        catalog(package)
    return CHECK_MODULES


@contextlib.contextmanager
def docker_engine_host() -> Iterator[str]:
    """The user's Docker engine if one answers, else a private dockerd for as long as the block runs
    (a skip with the reason when neither can be had)."""
    from harness.launch.containers import engine
    from harness.launch.containers.engine import EngineUnavailable, PrivateEngine

    if engine.unavailable() is None:
        yield engine.host()
        return
    why = PrivateEngine.unavailable()
    if why is not None:
        pytest.skip(f"no Docker engine: {why}")
    try:
        private = PrivateEngine().start()
    except EngineUnavailable as err:
        pytest.fail(f"dockerd is installed but did not start: {err}")
    try:
        yield private.host
    finally:
        private.stop()


# -- a scenario file run as a user runs it (the scenario tests share these) -----------------------------------

SCENARIO_RUN_TIMEOUT_S = 600  # one file's run on a loaded machine: a bound, never a wait


def scenario_run(out: Path, path: Path, *args: str,
                 timeout_s: float = SCENARIO_RUN_TIMEOUT_S) -> tuple[int, str, dict[str, Any]]:
    """`fakelet scenario run --file PATH --out OUT ARGS`: its exit code, its output and its report (or {})."""
    proc = subprocess.run([sys.executable, "-m", "harness.run.cli", "scenario", "run", "--file", str(path),
                           "--out", str(out), *args], capture_output=True, text=True, timeout=timeout_s)
    report = json.loads((out / "report.json").read_text()) if (out / "report.json").exists() else {}
    return proc.returncode, proc.stdout + proc.stderr, report


def outcome_of(report: dict[str, Any]) -> str | None:
    return (report.get("facts") or {}).get("scenario", {}).get("outcome")


def timeline_of(out: Path) -> list[dict[str, Any]]:
    return json.loads(sorted(out.rglob("run-*/timeline.json"))[0].read_text())


# A scenario whose one step under test sits between the plugin's start and an expectation: the vocabulary tests'.
ONE_STEP_SCENARIO = """\
title: t
correct: c
bug: b
kind: KIND
steps:
  - kubelet: start
  - plugin: start
  - STEP
  - expect: {registered: true}
"""


def one_step_scenario(step: str, kind: str) -> str:
    return ONE_STEP_SCENARIO.replace("KIND", kind).replace("STEP", step)


# -- ResourceSlices on a local API server, for the DRA areas' allocator tests (test_partitions, test_capacity) --

SLICE_DRIVER = "gpu.fakelet.example.com"  # the reference DRA driver's default name


def as_slices(parts: list[dict[str, Any]], pool: str = "node-a") -> list[dict[str, Any]]:
    """One pool's slices of SLICE_DRIVER from the parts a driver module publishes (spec fields each)."""
    return [{"metadata": {"name": f"s{i}"}, "spec": {"driver": SLICE_DRIVER, "nodeName": pool, **part,
                                                     "pool": {"name": pool, "generation": 1,
                                                              "resourceSliceCount": len(parts)}}}
            for i, part in enumerate(parts)]


@pytest.fixture
def slice_api(shared_kubeconfig: Path) -> Iterator[Any]:
    """fakelet's Allocator on the shared API server, with a node, namespace and device class of its own."""
    import uuid

    from harness.controlplane.allocator import Allocator
    from harness.controlplane.base import RESOURCE_API
    from harness.controlplane.client import KubeClient

    client = KubeClient.from_kubeconfig(shared_kubeconfig)
    node = f"fakelet-{uuid.uuid4().hex[:8]}"
    alloc = Allocator(client)
    alloc.ensure_namespace(node)
    alloc.ensure_node(node)
    alloc.ensure_device_class(node, SLICE_DRIVER)
    try:
        yield alloc, node
    finally:
        for s in alloc.slices(SLICE_DRIVER, node):
            client.delete(f"{RESOURCE_API}/resourceslices/{s['metadata']['name']}")
        client.delete(f"/api/v1/namespaces/{node}")
        client.delete(f"/api/v1/nodes/{node}")
        client.close()


def publish_slices(alloc: Any, node: str, parts: list[dict[str, Any]]) -> None:
    """The parts as one pool of node's, created in the API server (names made unique by the node)."""
    from harness.controlplane.base import RESOURCE_API

    for s in as_slices(parts, node):
        s["metadata"] = {"name": f"{node}-{s['metadata']['name']}"}
        alloc.client.create(f"{RESOURCE_API}/resourceslices", {"apiVersion": "resource.k8s.io/v1",
                                                               "kind": "ResourceSlice", **s})


def mkdocs_config(path: Path) -> dict[str, Any]:
    """mkdocs.yml as plain data: each `!ENV [NAME, default]` (MkDocs' own tag) read as its default."""
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    def env(loader: yaml.SafeLoader, node: yaml.Node) -> Any:
        value = loader.construct_sequence(node) if isinstance(node, yaml.SequenceNode) else [None]
        return value[-1]
    Loader.add_constructor("!ENV", env)
    return yaml.load(path.read_text(), Loader=Loader)
