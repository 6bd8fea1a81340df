"""The kill matrix: each reference subject passes every check, each benign
behaviour (a legal quirk of real plugins) passes every check its quirk can touch
(its `checks:`), and each mutant fails exactly the checks its profile says it must (fixtures/subjects/reference-dp.yaml,
fixtures/subjects/reference-dra.yaml).

Each case is a full `fakelet run` in a subprocess, the way users run it. The
DRA runs share one local API server per test process. Mutants run with
`--reaction-bound`, a shorter bound than the kubelet's 30 s, so that catching
a plugin that never reacts costs seconds; the reference and the benign
behaviours run under the kubelet's real bounds, which is what they must meet.
A mutant's verdicts must not hang on how loaded the machine is: the short bound
counts from what the plugin reacts to, not from its process's start, and a
mutant whose every message is heavy work gets a bound sized to that work.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import matrix_sample
import pytest

from fake_devices.materialize import skin_parts
from harness.reference.defects import (
    DP_BENIGN,
    DP_DEFECTS,
    DP_HOSTILE,
    DP_LEVELZERO_BENIGN,
    DP_LEVELZERO_DEFECTS,
    DP_NVML_DEFECTS,
)
from harness.reference.dra_defects import DRA_DEFECTS
from harness.spec.checks import SUITES, catalog
from harness.spec.subjects import SubjectSpec, load_subject
from suites.dp.test_health import SURFACE_CHECKS
from suites.dra.test_beside import CHECKS as BESIDE_CHECKS
from suites.dra.test_binding import CHECKS as BINDING_CHECKS
from suites.dra.test_capacity import CHECKS as CAPACITY_CHECKS
from suites.dra.test_health import SURFACE_CHECKS as DRA_SURFACE_CHECKS
from suites.dra.test_partitions import CHECKS as PARTITION_CHECKS
from suites.dra.test_upgrade import ROLLING_UPDATE_CHECKS

SPEC = load_subject("reference-dp")
DRA_SPEC = load_subject("reference-dra")
NVML_SPEC = load_subject("reference-nvml")
LEVELZERO_SPEC = load_subject("reference-levelzero")
NVML_GO_SPEC = load_subject("reference-nvml-go")  # on NVIDIA's go-nvml: needs Go and a C compiler
NVML_DRA_GO_SPEC = load_subject("reference-nvml-dra-go")  # a DRA driver on go-nvml: Go, a C compiler, an API server
SPECS = {"reference-dp": SPEC, "reference-dra": DRA_SPEC, "reference-nvml": NVML_SPEC,
         "reference-levelzero": LEVELZERO_SPEC, "reference-nvml-go": NVML_GO_SPEC,
         "reference-nvml-dra-go": NVML_DRA_GO_SPEC}
CASES = [(name, None) for name in SPECS] + [(name, d) for name, spec in SPECS.items() for d in sorted(spec.defects)]
RUN_TIMEOUT_S = 600  # a hung run is a failed test, not a hung suite
REFERENCE_JOBS = "5"  # checks at once in a run under the kubelet's own bounds (the reference, benign behaviours)
# Checks at once in a mutant's run, under its short bound. Given, not `auto`: a defect never timed on this machine
# would get a worker per check (scheduler.auto_jobs), while three of these runs share 2 cores.
MUTANT_JOBS = "4"
# A covering run's checks all fail, most by waiting out a bound the mutant never meets (bad-resource-name's 30
# wait for a registration the kubelet refuses): up to this many at once, for the same CPU in less wall time.
COVERING_JOBS = 8
# Seconds: long enough for a prompt plugin's reaction on a loaded CI machine. A process's start-up does not
# count against it (its first Register call has the kubelet's 30 s: Profile.startup_s).
MUTANT_REACTION_BOUND_S = "4"
# Mutants whose every message is heavy work get a bound sized to it: huge-list's 100,000-device lists cost the
# plugin and the kubelet about 2 s each at a load of 8 on 2 cores, more at 15, and what it must fail for
# (DP-LAW-01, DP-HLT-03) is what the list holds, never how soon it came.
MUTANT_BOUNDS_S = {"huge-list": "15"}
BENIGN = set(DP_BENIGN)
# Benign behaviours by subject: each runs under the kubelet's own bounds, never as a mutant.
BENIGN_CASES = [("reference-dp", b) for b in sorted(DP_BENIGN)] + \
    [("reference-levelzero", b) for b in sorted(DP_LEVELZERO_BENIGN)]
PARTITIONING = {"reference-dra"}  # subjects whose driver publishes the fake GPUs' partitions (DRA-PRT)
SHARING = {"reference-dra"}  # subjects whose driver publishes the fake GPUs' shareable capacity (DRA-CAP)
FABRIC = {"reference-dra"}  # subjects whose driver attaches the fake fabric NICs and writes device status (DRA-BND)
# The main references: by default every check runs on them. The others (the reference plugin on NVML or Level-Zero, the
# Go plugin and driver on go-nvml) run the checks their own mutants must fail, so that each such kill stands beside
# a pass on the same check, and one check of registration and one of allocation in their own naming; the rest is
# the same protocol work the main references' runs cover. tox -e matrix runs every check on every reference.
MAIN_REFERENCES = {"reference-dp", "reference-dra"}
VARIANT_BASICS = {"device-plugin": ("DP-LAW-01", "DP-ALC-01"), "dra": ("DRA-REG-01", "DRA-PRP-01")}
HOSTILE_CORPUS_MIN = 30  # issue 13: at least this many hostile behaviours, each with a verdict and a wall bound


def fakelet_run(out: Path, *args: str, subject: str = "reference-dp", timeout_s: float = RUN_TIMEOUT_S
                ) -> tuple[int, dict]:
    proc = subprocess.run([sys.executable, "-m", "harness.run.cli", "run", "--subject", subject,
                           "--out", str(out), *args], capture_output=True, text=True, timeout=timeout_s)
    report_file = out / "report.json"
    assert report_file.exists(), f"no report; exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    report = json.loads(report_file.read_text())
    checks = report.get("checks") or []
    if checks and all(c["verdict"] == "skip" for c in checks):
        pytest.skip(checks[0]["detail"].splitlines()[0])  # the subject cannot run here (its build, say)
    return proc.returncode, report


def verdicts(report: dict, verdict: str) -> list[str]:
    return sorted(c["id"] for c in report["checks"] if c["verdict"] == verdict)


def explain(report: dict, ids: set[str]) -> str:
    return "\n".join(f"{c['id']} {c['verdict']}: {c['detail']}" for c in report["checks"] if c["id"] in ids)


def test_profile_documents_every_defect() -> None:
    assert set(SPEC.defects) == set(DP_DEFECTS) | set(DP_HOSTILE) | BENIGN
    assert all(SPEC.defects[b].kills == [] for b in BENIGN)
    assert set(DRA_SPEC.defects) == set(DRA_DEFECTS)
    assert set(NVML_SPEC.defects) == {"stuck-unhealthy", "ignore-temperature"} | set(DP_NVML_DEFECTS)
    assert set(LEVELZERO_SPEC.defects) == ({"stuck-unhealthy", "ignore-temperature"} | set(DP_LEVELZERO_DEFECTS)
                                           | set(DP_LEVELZERO_BENIGN))
    assert all(LEVELZERO_SPEC.defects[b].kills == [] for b in DP_LEVELZERO_BENIGN)
    assert set(NVML_GO_SPEC.defects) == {"never-recovers", "app-xid-fatal", "ignores-xid79", "ignores-temperature",
                                         "wait-error-keeps-healthy"}
    assert set(NVML_DRA_GO_SPEC.defects) == {"never-recovers", "app-xid-fatal", "ignores-xid79", "ignores-temperature",
                                             "wait-error-keeps-healthy", "single-stream", "no-refresh"}


def hostile_corpus() -> list[tuple[str, str]]:
    """Every behaviour with a bound on its run's wall time: the hostile corpus."""
    return [(s, d) for s, spec in SPECS.items() for d, defect in sorted(spec.defects.items())
            if defect.wall_s is not None]


def test_hostile_corpus_is_complete() -> None:
    corpus = hostile_corpus()
    assert len(corpus) >= HOSTILE_CORPUS_MIN, corpus
    assert {d for s, d in corpus if s == "reference-dp"} == set(DP_HOSTILE)
    for subject, name in corpus:
        defect = SPECS[subject].defects[name]
        assert defect.checks is None or set(defect.kills) <= set(defect.checks), (subject, name)


def other_surfaces(spec: SubjectSpec) -> set[str]:
    """Checks of a vendor surface the subject's fake hardware lacks (DP-HLT-06..08 and DRA-HLT-04/05 need the nvml
    skin, DP-HLT-09 the drm skin's sidecar): for this subject they can only be not exercised."""
    parts = skin_parts((spec.backend or {}).get("skin") or "neutral")
    surfaces = {c for table in (SURFACE_CHECKS, DRA_SURFACE_CHECKS) for s, checks in table.items() if s not in parts
                for c in checks}
    # Partitioned GPUs show only in the neutral tree's partitions/ dirs, which only the reference DRA driver reads:
    # for another driver the DRA-PRT checks find no counters (not exercised). Shareable devices likewise show only in
    # the neutral tree's sharing/ dirs: for another driver the DRA-CAP checks find no multi-allocatable device.
    # A DRA driver that runs as one instance only (no rolling_update: in its subject file): DRA-UPG too. Fabric NICs
    # show only in the neutral tree's fabric/ dirs: another driver publishes no binding conditions and writes no
    # device status (DRA-BND).
    single = set(ROLLING_UPDATE_CHECKS) if spec.is_dra and spec.rolling_update is None else set()
    return surfaces | (set() if spec.name in PARTITIONING else set(PARTITION_CHECKS)) | single \
        | (set() if spec.name in SHARING else set(CAPACITY_CHECKS)) \
        | (set() if spec.name in FABRIC else set(BINDING_CHECKS))


def run_args(spec: SubjectSpec, request: pytest.FixtureRequest, reference: bool = False,
             covering: int = 0) -> list[str]:
    """`covering`: the number of checks of a covering run (tests/matrix_sample.py KILLS_ONLY), 0 for another."""
    jobs = str(min(covering, COVERING_JOBS)) if covering > int(MUTANT_JOBS) else MUTANT_JOBS
    if not spec.is_dra:
        # The reference run's checks mostly wait (outages, quiet windows) under the kubelet's own bounds:
        # more of them at once costs little CPU; the longest start first (harness/run/scheduler.py).
        return ["--jobs", REFERENCE_JOBS if reference else jobs]
    # Most of a DRA mutant run is waiting out bounds (T) on checks it fails: more jobs, same CPU.
    return ["--jobs", jobs, "--control-plane", f"kubeconfig:{request.getfixturevalue('shared_kubeconfig')}"]


@pytest.mark.slow
@pytest.mark.parametrize("subject", sorted(SPECS))
def test_reference_passes_everything(subject: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    spec = SPECS[subject]
    surface_only = other_surfaces(spec)
    # The checks of a surface or feature the subject lacks can only say "not exercised", and each waits out its
    # bound to say so (reference-nvml-dra-go's ten of DRA-PRT, DRA-CAP and DRA-UPG took 110 s): the default run
    # leaves them to tox -e matrix, and the real upstream subjects (the subjects env) show the verdict on them.
    # A DRA driver whose subject file cannot tell it a device plugin's devices (no device_plugin_beside:): DRA-EXT-02
    # does not apply.
    alone = set(BESIDE_CHECKS) if spec.is_dra and spec.device_plugin_beside is None else set()
    chosen = set(catalog(SUITES[spec.kind])) - surface_only - alone
    if subject not in MAIN_REFERENCES:
        chosen &= {k for d in spec.defects.values() for k in d.kills} | set(VARIANT_BASICS[spec.kind])
    only = [] if matrix_sample.full() else [a for c in sorted(chosen) for a in ("--check", c)]
    code, report = fakelet_run(tmp_path, *run_args(spec, request, reference=True), *only, subject=subject)
    bad = {c["id"] for c in report["checks"] if c["verdict"] != "pass"
           and not (c["id"] in surface_only and c["verdict"] == "not-exercised")
           and not (c["id"] in alone and c["verdict"] == "n/a")}
    assert not bad, explain(report, bad)
    assert report["summary"]["conformant"] is True
    assert code == 0
    # Every check that ships is killed by at least one mutant (of any reference subject of its kind).
    killed = {k for s in SPECS.values() if s.kind == spec.kind for d in s.defects.values() for k in d.kills}
    assert {c["id"] for c in report["checks"]} <= killed


@pytest.mark.slow
@pytest.mark.parametrize(("subject", "behaviour"), BENIGN_CASES)
def test_benign_behaviour_passes_everything(subject: str, behaviour: str, tmp_path: Path) -> None:
    before = set(Path(tempfile.gettempdir()).glob("reference-dp-scratch-*"))
    # The checks its quirk can touch (its `checks:`): the reference run covers every other one.
    only = [a for c in SPECS[subject].defects[behaviour].checks or [] for a in ("--check", c)]
    code, report = fakelet_run(tmp_path, "--defect", behaviour, "--jobs", REFERENCE_JOBS, *only, subject=subject)
    bad = {c["id"] for c in report["checks"] if c["verdict"] != "pass"}
    assert not bad, explain(report, bad)
    assert code == 0 and report["summary"]["status"] == "CONFORMANT"
    # What a plugin leaves in its temp dir stays in its sandbox, never on the host.
    assert set(Path(tempfile.gettempdir()).glob("reference-dp-scratch-*")) == before


@pytest.mark.slow
@pytest.mark.parametrize(("subject", "defect"),
                         [(s, d) for s, d in CASES if d is not None and (s, d) not in BENIGN_CASES])
def test_mutant_fails_exactly_its_checks(subject: str, defect: str, tmp_path: Path,
                                         request: pytest.FixtureRequest) -> None:
    spec = SPECS[subject]
    case = spec.defects[defect]
    checks = case.checks
    covers = request.node.stash.get(matrix_sample.KILLS_ONLY, None)
    if covers:
        checks = sorted(covers)  # taken only to cover these, each a kill (tests/matrix_sample.py)
    only = [a for c in checks or [] for a in ("--check", c)]
    began = time.monotonic()
    bound = MUTANT_BOUNDS_S.get(defect, MUTANT_REACTION_BOUND_S)
    code, report = fakelet_run(tmp_path, "--defect", defect, "--reaction-bound", bound,
                               *only, *run_args(spec, request, covering=len(covers or ())), subject=subject,
                               timeout_s=case.wall_s or RUN_TIMEOUT_S)
    wall_s = time.monotonic() - began
    if case.wall_s is not None:
        assert wall_s <= case.wall_s, f"{defect}: the run took {wall_s:.0f}s, its bound is {case.wall_s:.0f}s"
    if checks is not None:
        assert {c["id"] for c in report["checks"]} == set(checks)
    findings = report.get("findings", [])
    for wanted in case.findings:
        assert any(wanted in f for f in findings), f"no finding with {wanted!r}: {findings}"
    errors = set(verdicts(report, "error"))
    assert not errors, explain(report, errors)
    expected = set(spec.defects[defect].kills) & set(checks or spec.defects[defect].kills)
    failed = set(verdicts(report, "fail"))
    assert failed == expected, explain(report, failed ^ expected)
    unexercised = set(verdicts(report, "not-exercised")) - other_surfaces(spec)
    assert unexercised <= expected, explain(report, unexercised)  # a mutant's bug may leave nothing to test
    for c in report["checks"]:
        if c["verdict"] == "fail":
            assert c["detail"].startswith("expected") or "expected" in c["detail"], c
            assert c["repro"].endswith(f"--check {c['id']}") and f"--defect {defect}" in c["repro"]
    must_killed = any(c["level"] == "MUST" and c["verdict"] == "fail" for c in report["checks"])
    passed = any(c["verdict"] == "pass" for c in report["checks"])
    assert code == (1 if must_killed else 0 if passed else 3)  # INCOMPLETE: nothing passed
    # A run of SHOULD checks alone that all fail (a covering mutant's) passed nothing: INCOMPLETE, not conformant.
    assert report["summary"]["conformant"] is (not must_killed and passed)
