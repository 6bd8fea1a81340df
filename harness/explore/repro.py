"""A shrunk finding as a scenario file: `repro/explore-<hash>.yaml`, replayed by `fakelet scenario run --file`.

The steps are the example's own, in the library's vocabulary. The invariants that held on the
way become `wait` steps (preconditions: a replay where one of them does not hold is another
story, inconclusive), and the invariant that failed is the one `expect`: a replay that shows it
again is *reproduced*.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import yaml

from harness.config.runconfig import RunConfig
from harness.explore import nodes
from harness.explore.machine import Finding
from harness.explore.model import INVARIANTS
from harness.scenarios.step import flow
from harness.spec.subjects import all_subjects

REPRO_DIR = "repro"  # beside `fakelet run`'s repro files (harness/scenarios/repro.py)


def scenario_steps(finding: Finding) -> list[dict[str, Any]]:
    last = max(n for n, step in enumerate(finding.steps) if "expect" in step)
    out: list[dict[str, Any]] = []
    for n, step in enumerate(finding.steps[:last + 1]):
        if "expect" in step and n != last:
            # Its options too: judged as the exploration judged it (a first glimpse; a bound widened by a fault the
            # kubelet takes a while to get over, as a dropped health stream's retry), or the replay is another story.
            step = {"wait": step["expect"], **{k: v for k, v in step.items() if k != "expect"}}
        out.append(step)
    return out


def document(finding: Finding, run: RunConfig, seed: int, explored_steps: int) -> dict[str, Any]:
    invariant = INVARIANTS[finding.invariant]
    bundled = run.spec.name in {s.name for s in all_subjects()}
    return {
        "title": f"explore: {invariant.id} broken for {run.spec.name}"
                 f"{f' --defect {run.defect}' if run.defect else ''}: {invariant.title}",
        "correct": f"{invariant.title} ({invariant.bound}).",
        "bug": " ".join(finding.detail.split())[:2000],
        "kind": run.spec.kind,
        **({"subject": run.spec.name} if bundled else {}),
        **({"defect": run.defect} if run.defect else {}),
        "seed": run.seed,
        "nodes": nodes.scenario_nodes(finding.steps),  # `fakelet scenario run --node real` replays it too
        "notes": f"Found by fakelet explore --seed {seed} ({finding.invariant} after {finding.key[1]}); hypothesis "
                 f"shrank it to {len(finding.steps)} steps "
                 f"(the sequence first found had {explored_steps}). The waits are the invariants that held on the "
                 "way; the expect is the one that failed.",
        "steps": scenario_steps(finding),
    }


def name_of(doc: dict[str, Any]) -> str:
    digest = hashlib.sha256(yaml.safe_dump(doc, sort_keys=True).encode()).hexdigest()[:10]
    return f"explore-{digest}"


def write(finding: Finding, run: RunConfig, seed: int, explored_steps: int, out: Path) -> Path:
    doc = document(finding, run, seed, explored_steps)
    directory = out / REPRO_DIR
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name_of(doc)}.yaml"
    header = (f"# Written by `fakelet explore` when {finding.invariant} failed for {run.spec.name}"
              f"{f' --defect {run.defect}' if run.defect else ''}.\n"
              f"# Replay (from the report directory): {replay_command(run, Path(REPRO_DIR) / path.name)}\n")
    path.write_text(header + yaml.safe_dump(doc, sort_keys=False, width=100))
    return path


def replay_command(run: RunConfig, path: Path) -> str:
    """The run's own reproduction line with the scenario file in place of the checks (runner.py repro)."""
    line = run.repro("-").removesuffix(" --check -")
    return line.replace("fakelet run", f"fakelet scenario run --file {path}", 1)


def timeline(finding: Finding) -> list[str]:
    """The shrunk sequence as a person reads it: each step with the rule it came from."""
    return [f"{n + 1:2}. {flow(step):70} ({origin})" for n, (step, origin) in
            enumerate(zip(finding.steps, finding.rules, strict=True))]
