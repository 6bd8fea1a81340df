"""Running a scenario the way `fakelet run` runs checks: one subject, one sandbox, one report."""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from harness.checks import split_install
from harness.controlplane import ControlPlane, ControlPlaneUnavailable, open_control_plane
from harness.draenv import DRAEnv
from harness.runconfig import RunConfig
from harness.scenarios import taint_eviction
from reports.model import SKIP, CheckResult, SubjectReport

SCENARIOS = {taint_eviction.NAME: taint_eviction}
SCENARIO_LEVEL = "MUST"  # a story that breaks is a conformance failure of the subject


def repro(run: RunConfig, name: str, toleration_s: int | None) -> str:
    # The run's own reproduction line, with the scenario in place of the check.
    line = run.repro("-").removesuffix(" --check -").replace("fakelet run", f"fakelet scenario {name}", 1)
    return line + (f" --toleration-seconds {toleration_s}" if toleration_s is not None else "")


def run_scenario(run: RunConfig, name: str, say: Callable[[str], None], toleration_s: int | None = None) -> \
        SubjectReport:
    """Tell scenario `name` against the subject of `run`; its verdict is the report's one check."""
    module = SCENARIOS[name]
    started, began = datetime.datetime.now(datetime.UTC), time.monotonic()
    plane: ControlPlane | None = None
    env: DRAEnv | None = None
    report = SubjectReport(subject=run.spec.name, profile=run.profile.name, seed=run.seed, defect=run.defect,
                           kind=run.spec.kind, started_at=started.isoformat(timespec="seconds"))
    verdict, detail, steps, install = SKIP, "", [], ""
    try:
        try:
            plane = open_control_plane(run.control_plane).start()
        except ControlPlaneUnavailable as err:
            raise pytest.skip.Exception(f"needs a kube-apiserver: {err}") from None
        artifacts = Path(run.out) / "artifacts" / f"scenario-{name}" if run.out else None
        env = DRAEnv(run.spec, run.profile, run.defect, run.seed, run.resolve_binary(), artifacts,
                     kubelet_version=run.kubelet_version, control_plane=plane)
        report.facts["control plane"] = plane.describe()
        verdict, detail, steps = module.tell(env, say, toleration_s)
    except pytest.skip.Exception as skipped:
        detail, install = split_install(str(skipped.msg))
        say(f"skipped: {detail}")
    except KeyboardInterrupt:
        # Ctrl-C or SIGTERM: everything is torn down below, and the report says INTERRUPTED.
        say("interrupted")
        report.interrupted, report.missing = True, [f"SCENARIO-{name}"]
    finally:
        if env is not None:
            env.close()
            report.facts.update(env.facts)
            report.findings += env.findings
            report.cleanup += env.cleanup
            report.api_versions = env.negotiated()
        if plane is not None:
            plane.stop()
    report.duration_s = round(time.monotonic() - began, 3)
    if report.interrupted:
        return report
    report.checks.append(CheckResult(
        id=f"SCENARIO-{name}", level=SCENARIO_LEVEL, title=module.TITLE, verdict=verdict,
        duration_s=report.duration_s, detail=detail, repro=repro(run, name, toleration_s) if verdict != "pass" else "",
        notes=steps, install=install))
    return report
