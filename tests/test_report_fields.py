"""reports/fields.py: every field a report can hold is described, so docs/reference/report.md explains it."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

from reports.fields import FIELDS, MAPS, STATUSES, VERDICTS, paths, undescribed
from reports.merge import ShardDir, _merge_subject
from reports.model import SEVERITY, CheckResult, SubjectReport
from reports.model import VERDICTS as ALL_VERDICTS

WHERE = "describe it in reports/fields.py FIELDS"


def test_every_dataclass_field_of_the_model_is_described():
    names = [f.name for f in fields(SubjectReport)] + [f"checks[].{f.name}" for f in fields(CheckResult)]
    missing = [n for n in names if not FIELDS.get(n)]
    assert not missing, f"report fields without a description ({WHERE}): {missing}"


def test_every_verdict_and_status_is_described():
    assert [v for v in ALL_VERDICTS if not VERDICTS.get(v)] == []
    assert [s for s in SEVERITY if not STATUSES.get(s)] == []


def test_every_provenance_key_a_run_writes_is_described():
    from harness.config.runconfig import RunConfig
    from harness.run import provenance

    run = RunConfig.build(subject="reference-dp", overrides=None)
    report = SubjectReport(subject="reference-dp", profile="fast", seed=0, checks=[
        CheckResult("DP-REG-01", "MUST", "a title", "pass", 1.0, measured={"registration": 0.2})])
    provenance.finish(run, report, provenance.start())
    merged = _merge_subject([(ShardDir(Path("shard-1"), {"shard": "1/2"}, [report]), report)])
    missing = undescribed(merged.to_dict())
    assert not missing, f"report keys without a description ({WHERE}): {missing}"


def test_paths_name_list_entries_and_stop_at_maps():
    report = {"checks": [{"id": "X", "measured": {"registration": 1.0}}], "facts": {"NVML calls": "none"},
              "provenance": {"host": {"cpus": 2}}, "summary": {"pass": 1}}
    assert paths(report) == ["checks", "checks[].id", "checks[].measured", "facts", "provenance",
                             "provenance.host", "provenance.host.cpus", "summary", "summary.pass"]
    assert undescribed(report) == []
    assert undescribed({**report, "new": {"key": 1}}) == ["new", "new.key"]
    assert MAPS <= set(FIELDS)
