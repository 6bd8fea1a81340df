"""The reports of a run a stop signal ended: a subject's before its first verdict, and a whole run's.

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


def interrupted_reports(runs: list[RunConfig], reports: list[SubjectReport]) -> list[SubjectReport]:
    """Every subject marked interrupted; a subject that never ran lists every selected check as missing. `reports`
    are those of the first of `runs`, in order."""
    for report in reports:
        report.interrupted = True
    return reports + [nothing_ran(run) for run in runs[len(reports):]]
