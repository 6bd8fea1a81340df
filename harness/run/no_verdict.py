"""The report of a run a stop signal ended before its first verdict.

Its own module: `fakelet run`, `fakelet matrix` and `fakelet fidelity` all owe one, and commands.py imports the
other two.
"""

from __future__ import annotations

from harness.config.runconfig import RunConfig
from harness.spec.checks import catalog
from reports.model import SubjectReport


def nothing_ran(run: RunConfig) -> SubjectReport:
    """Every selected check of `run` without a verdict, the run marked interrupted."""
    selected = run.checks or list(catalog(run.suite_package))
    return SubjectReport(subject=run.spec.name, profile=run.profile.name, seed=run.seed, defect=run.defect,
                         kind=run.spec.kind, missing=sorted(selected), interrupted=True)
