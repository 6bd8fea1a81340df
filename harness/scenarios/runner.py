"""Running a scenario as `fakelet run` runs checks: one subject, fresh sandboxes, one report.

Each run (of `--repeat N`) gets a new environment: the sandbox, the fake
kubelet (or a real one), the subject and the fake devices. The steps are
carried out in order and narrated; the first expectation that fails ends the
run as *reproduced*, a step that cannot run ends it as *inconclusive*, and a
run whose every expectation held is *not reproduced*.

In the report the scenario is one check, SCENARIO-<name>: reproduced is a
fail (the system under test shows the reported bug), not reproduced a pass,
inconclusive a skip with its reason; the outcome itself is in the report's
`scenario` facts.
"""

from __future__ import annotations

import dataclasses
import datetime
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from harness.config.runconfig import RunConfig
from harness.controlplane import ControlPlane, ControlPlaneUnavailable, open_control_plane
from harness.instruments.timeline import WaitTimeout
from harness.launch.process import LaunchError
from harness.node.real.localnode import NodeAccess, RealNodeUnavailable
from harness.node.real.localnode import unavailable as realnode_unavailable
from harness.scenarios.check import case_name
from harness.scenarios.schema import INCONCLUSIVE, NOT_REPRODUCED, REPRODUCED, Scenario
from harness.scenarios.stage import Inconclusive, Stage, Symptom
from harness.spec.checks import split_install
from harness.world.draenv import DRAEnv
from harness.world.env import DPEnv, SubjectUnavailable
from reports.model import FAIL, PASS, SKIP, CheckResult, SubjectReport, merge_facts

SCENARIO_LEVEL = "MUST"  # a reported bug that reproduces is a conformance failure of the system under test
VERDICT_OF = {REPRODUCED: FAIL, NOT_REPRODUCED: PASS, INCONCLUSIVE: SKIP}


@dataclass
class Outcome:
    """One run of a scenario: its outcome, why, and what happened step by step."""

    outcome: str
    detail: str
    steps: list[str] = field(default_factory=list)
    install: str = ""
    duration_s: float = 0.0


def repro(run: RunConfig, scenario: Scenario, file: str | None, repeat: int, node: str) -> str:
    """The command that runs this again: the run's own reproduction line with the scenario in place of the checks."""
    line = run.repro("-").removesuffix(" --check -")
    target = f"--file {file}" if file else scenario.name
    line = line.replace("fakelet run", f"fakelet scenario run {target}", 1)
    return line + (f" --repeat {repeat}" if repeat > 1 else "")


def run_scenario(run: RunConfig, scenario: Scenario, say: Callable[[str], None], *, repeat: int = 1,
                 node: str = "fake", file: str | None = None, toleration_s: int | None = None) -> SubjectReport:
    """Run `scenario` `repeat` times against the subject of `run`; the report's one check is its verdict."""
    started, began = datetime.datetime.now(datetime.UTC), time.monotonic()
    report = SubjectReport(subject=run.spec.name, profile=run.profile.name, seed=run.seed, defect=run.defect,
                           kind=run.spec.kind, node=node, started_at=started.isoformat(timespec="seconds"))
    outcomes: list[Outcome] = []
    plane: ControlPlane | None = None
    try:
        plane, why = _control_plane(run, node)
        for n in range(repeat):
            if repeat > 1:
                say(f"run {n + 1} of {repeat}")
            artifacts = _artifacts(run, scenario) / f"run-{n + 1}" if run.out else None
            outcomes.append(_one_run(run, scenario, say, plane, why, node, artifacts, report, toleration_s))
    except KeyboardInterrupt:
        say("interrupted")
        report.interrupted, report.missing = True, [f"SCENARIO-{scenario.name}"]
    finally:
        if plane is not None:
            plane.stop()
    report.duration_s = round(time.monotonic() - began, 3)
    if report.interrupted:
        return report
    outcome, detail = overall(outcomes)
    last = outcomes[-1]
    if run.out:
        _keep_timeline(_artifacts(run, scenario), outcomes)
    report.facts["scenario"] = {
        "name": scenario.name, "title": scenario.title, "upstream": scenario.upstream, "outcome": outcome,
        "correct": scenario.correct, "bug": scenario.bug, "runs": len(outcomes),
        "reproduced": sum(1 for o in outcomes if o.outcome == REPRODUCED),
        "outcomes": [o.outcome for o in outcomes],
        **({"file": file} if file else {})}
    report.checks.append(CheckResult(
        id=f"SCENARIO-{scenario.name}", level=SCENARIO_LEVEL, title=f"{scenario.title} ({scenario.upstream})",
        verdict=VERDICT_OF[outcome], duration_s=report.duration_s, detail=f"{outcome}: {detail}",
        repro=repro(run, scenario, file, repeat, node) if outcome != NOT_REPRODUCED else "",
        notes=last.steps, install=last.install))
    return report


def _artifacts(run: RunConfig, scenario: Scenario) -> Path:
    """Where the scenario's runs keep their timelines and logs: under its check ID, as a check's are."""
    assert run.out is not None
    return Path(run.out) / "artifacts" / f"SCENARIO-{scenario.name}"


def _keep_timeline(directory: Path, outcomes: list[Outcome]) -> None:
    """The timeline the report plots: the first run that reproduced the bug, else the last run."""
    pick = next((n for n, o in enumerate(outcomes) if o.outcome == REPRODUCED), len(outcomes) - 1)
    source = directory / f"run-{pick + 1}" / "timeline.json"
    if source.is_file():
        shutil.copyfile(source, directory / "timeline.json")


def overall(outcomes: list[Outcome]) -> tuple[str, str]:
    """Reproduced when any run showed the symptom (a race shows up in some runs); inconclusive when none ran."""
    n = len(outcomes)
    hits = [o for o in outcomes if o.outcome == REPRODUCED]
    ran = [o for o in outcomes if o.outcome != INCONCLUSIVE]
    if hits:
        of = f" (in {len(hits)} of {n} runs)" if n > 1 else ""
        return REPRODUCED, f"{hits[0].detail}{of}"
    if not ran:
        return INCONCLUSIVE, outcomes[-1].detail
    unfinished = n - len(ran)
    note = f" ({unfinished} of {n} runs inconclusive: {outcomes[-1].detail})" if unfinished else \
        (f" (in all {n} runs)" if n > 1 else "")
    return NOT_REPRODUCED, f"the correct behaviour held{note}"


def _control_plane(run: RunConfig, node: str) -> tuple[ControlPlane | None, str]:
    """An API server when the scenario needs one: DRA drivers, and the real kubelet's node."""
    if not run.spec.is_dra and node == "fake":
        return None, ""
    try:
        return open_control_plane(run.control_plane).start(), ""
    except ControlPlaneUnavailable as err:
        return None, str(err)


def _one_run(run: RunConfig, scenario: Scenario, say: Callable[[str], None], plane: ControlPlane | None, why: str,
             node: str, artifacts: Path | None, report: SubjectReport, toleration_s: int | None) -> Outcome:
    began = time.monotonic()
    env: DPEnv | None = None
    stage: Stage | None = None
    try:
        env = _environment(run, plane, why, node, artifacts)
        if run.out:
            env.artifacts_root = Path(run.out) / "artifacts"  # the budget is the run's, not one scenario run's
        if plane is not None:
            report.facts["control plane"] = plane.describe()
        stage = Stage(env, say)
        stage.tell(f"scenario {scenario.name}: {scenario.title}")
        for step in scenario.steps:
            if toleration_s is not None and step.action == "story":
                step = dataclasses.replace(step, options={**step.options, "toleration_seconds": toleration_s})
            stage.run(step)
        outcome = Outcome(NOT_REPRODUCED, "every expectation held", stage.lines)
    except Symptom as err:
        first = str(err).splitlines()[0]
        _tell(stage, say, f"REPRODUCED: {first}")
        outcome = Outcome(REPRODUCED, str(err), _lines(stage))
    except (Inconclusive, SubjectUnavailable, LaunchError, RealNodeUnavailable) as err:
        # A step that could not run (a command that does not start, a build refused, a real kubelet that did not
        # start): no verdict on the bug.
        _tell(stage, say, f"INCONCLUSIVE: {err}")
        outcome = Outcome(INCONCLUSIVE, str(err), _lines(stage))
    except pytest.skip.Exception as skipped:
        detail, install = split_install(str(skipped.msg))
        _tell(stage, say, f"INCONCLUSIVE: {detail}")
        outcome = Outcome(INCONCLUSIVE, detail, _lines(stage), install)
    except (WaitTimeout, AssertionError) as err:
        # An action's own wait (a pod that never ran, a registration a rolling update waited for).
        _tell(stage, say, f"INCONCLUSIVE: a step could not finish: {str(err).splitlines()[0]}")
        outcome = Outcome(INCONCLUSIVE, f"a step could not finish: {err}", _lines(stage))
    finally:
        if stage is not None:
            stage.close()
        if env is not None:
            env.close()
            merge_facts(report.facts, env.facts)  # a repeated scenario's runs: united, never last-wins
            report.findings += [f for f in env.findings if f not in report.findings]
            report.cleanup += env.cleanup
            if isinstance(env, DRAEnv):
                report.api_versions = env.negotiated()
    outcome.duration_s = round(time.monotonic() - began, 3)
    return outcome


def _environment(run: RunConfig, plane: ControlPlane | None, why: str, node: str, artifacts: Path | None) -> DPEnv:
    binary = run.resolve_binary()
    real: NodeAccess | None = None
    if node == "real":
        missing = realnode_unavailable()
        if missing:
            raise Inconclusive(f"the real kubelet cannot run here: {missing}")
        if plane is None:
            raise Inconclusive(f"the real kubelet needs an API server to join: {why}")
        real = NodeAccess(plane.kubeconfig, plane.client())
    if run.spec.is_dra:
        return DRAEnv(run.spec, run.profile, run.defect, run.seed, binary, artifacts,
                      kubelet_version=run.kubelet_version, control_plane=plane, control_plane_error=why or
                      "no API server", real_node=real)
    return DPEnv(run.spec, run.profile, run.defect, run.seed, binary, artifacts, real_node=real,
                 kubelet_version=run.kubelet_version)


def _tell(stage: Stage | None, say: Callable[[str], None], text: str) -> None:
    if stage is not None:
        stage.tell(text)
    else:
        say(text)


def _lines(stage: Stage | None) -> list[str]:
    return list(stage.lines) if stage is not None else []


def describe(scenario: Scenario) -> list[str]:
    """`fakelet scenario show`: the scenario as a person reads it."""
    out = [f"{scenario.name}: {scenario.title}", f"  upstream: {scenario.upstream}",
           f"  correct:  {scenario.correct}", f"  bug:      {scenario.bug}",
           f"  kind:     {scenario.kind}; subject: {scenario.subject or 'the reference'}; "
           f"nodes: {', '.join(scenario.nodes)}"]
    if scenario.affected or scenario.fixed:
        out.append(f"  real kubelet: affected {scenario.affected or '?'}, fixed {scenario.fixed or '?'}")
    if scenario.notes:
        out.append(f"  notes:    {scenario.notes}")
    out.append("  steps:")
    out += [f"    {n + 1:2}. {s.describe()}" for n, s in enumerate(scenario.steps)]
    if scenario.cases:
        out.append("  expected verdicts (fakelet scenario run NAME --case N|CASE|all):")
        out += [f"    {n}. {case_name(scenario, c)}: {c.describe()}{f'  ({c.why})' if c.why else ''}"
                for n, c in enumerate(scenario.cases, 1)]
    return out


def facts_of(report: SubjectReport) -> dict[str, Any]:
    return dict(report.facts.get("scenario") or {})
