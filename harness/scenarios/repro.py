"""Every failing check becomes a scenario: `repro/<CHECK-ID>.yaml` in the report tree.

The file names the check, the subject, the mutant and the seed that led to the
failure, and lists the faults the check injected (from the report's notes), so
`fakelet scenario run --file repro/<CHECK-ID>.yaml` replays it, on the fake
kubelet or (`--node real`) on a real one.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from harness.config.runconfig import RunConfig
from harness.spec.subjects import all_subjects
from reports.model import FAIL, SubjectReport

REPRO_DIR = "repro"


def write_repros(report: SubjectReport, run: RunConfig, out: Path) -> list[Path]:
    """One scenario file per failed check; nothing when every check passed."""
    failed = [c for c in report.checks if c.verdict == FAIL and not c.id.startswith("SCENARIO-")]
    if not failed:
        return []
    directory = out / REPRO_DIR
    directory.mkdir(parents=True, exist_ok=True)
    bundled = {s.name for s in all_subjects()}
    written = []
    for check in failed:
        scenario = {
            "title": f"{check.id} failed: {check.title}",
            "correct": f"{check.id} ({check.level}) passes: {check.title}.",
            "bug": " ".join(check.detail.split())[:2000] or f"{check.id} failed",
            "kind": run.spec.kind,
            **({"subject": run.spec.name} if run.spec.name in bundled else {}),
            **({"defect": run.defect} if run.defect else {}),
            "seed": run.seed,
            # A real kubelet judges every device-plugin check through the relay (harness/node/relay).
            "nodes": ["fake"] if run.spec.is_dra else ["fake", "real"],
            "steps": [{"check": check.id}],
        }
        header = (f"# Written by `fakelet run` when {check.id} failed for {run.spec.name}"
                  f"{f' --defect {run.defect}' if run.defect else ''} (seed {run.seed}).\n"
                  f"# Replay: fakelet scenario run --file {REPRO_DIR}/{check.id}.yaml"
                  f"{'' if run.spec.name in bundled else ' plus the run subject flags: ' + check.repro}\n")
        path = directory / f"{check.id}.yaml"
        path.write_text(header + yaml.safe_dump(scenario, sort_keys=False, width=100))
        written.append(path)
    return written
