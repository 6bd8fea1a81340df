"""What every field of a report means: the words docs/reference/report.md shows beside reports/model.py's
dataclasses and the keys harness/run/provenance.py writes.

A field is named by its path in `report.json`: `subject`, `checks[].verdict` (a field of each entry of a
list), `provenance.host.load_start` (a key of a nested object). An object whose keys are data, not names
fixed by the code (`facts`, `api_versions`, `provenance.components`), is described as a whole (`MAPS`).
tests/test_report_fields.py fails on a dataclass field or a provenance key that has no description here.
"""

from __future__ import annotations

from typing import Any

from reports.model import (
    CONFORMANT,
    ERROR,
    FAIL,
    HARNESS_ERROR,
    INCOMPLETE,
    INTERRUPTED,
    NOT_APPLICABLE,
    NOT_CONFORMANT,
    NOT_EXERCISED,
    PASS,
    SKIP,
)

# What each run status (`summary.status`) means; a report's is the first of SEVERITY that applies.
STATUSES: dict[str, str] = {
    INTERRUPTED: "a Ctrl-C or SIGTERM stopped the run; the reports of what ran are written",
    NOT_CONFORMANT: "a MUST check failed, or a check `--require` names was not exercised",
    HARNESS_ERROR: "a check ended in fakelet's own error (verdict `error`)",
    INCOMPLETE: "a MUST check could not run on this machine (`skip`), a selected check has no result, or no check "
                "passed",
    CONFORMANT: "every MUST check that was exercised passed, none ended in an error, none is missing, and at least "
                "one check passed",
}

# What each verdict (`checks[].verdict`) means, as reports/model.py's docstring says it.
VERDICTS: dict[str, str] = {
    PASS: "the plugin was exercised and met the check",
    FAIL: "the plugin was exercised and did not meet the check (`detail` says what was expected and what was seen)",
    NOT_EXERCISED: "the check found nothing to test (no device, no device mapped to the inventory, a health source "
                   "fakelet does not drive): never a pass; with `--require` it fails the run",
    NOT_APPLICABLE: "an optional API feature the plugin does not advertise (GetPreferredAllocation, "
                    "PreStartContainer)",
    SKIP: "the check could not run on this machine (a component is missing; `install` names the fix when known)",
    ERROR: "fakelet's own failure, never the plugin's",
}

FIELDS: dict[str, str] = {
    # -- SubjectReport: one subject's run ---------------------------------------------------------------------
    "subject": "The subject's name: a bundled subject, the `name` of a subject file, or the name fakelet gives "
               "a `--plugin-cmd` or `--image` subject.",
    "profile": "The timing profile the checks ran with (`--profile`): `fast` or `upstream`; its bounds are in "
               "`timings`.",
    "seed": "The seed of the run's fault schedules (`--seed`): the same seed replays the same faults.",
    "defect": "The named defect the subject ran as (`--defect`, a mutant), or `null` for the subject as it is.",
    "kind": "What the subject is: `device-plugin` or `dra` (a DRA kubelet plugin).",
    "node": "Whose kubelet the checks ran on: `fake` (fakelet's own) or `real` (`--node real`).",
    "fakelet_version": "The version of fakelet that wrote the report (its commit is in `provenance.fakelet`).",
    "api_versions": "The kubelet APIs the run spoke, by API: `deviceplugin` for a device plugin; `kubelet`, "
                    "`pluginregistration`, and the `dra` and `dra-health` versions the driver negotiated for a "
                    "DRA driver (`none negotiated` when it served none).",
    "timings": "The timing profile the checks held the plugin to, field by field: its `name` and its bounds in "
               "seconds (see the check catalog's bounds).",
    "fault_plan": "The fault rules `fakelet explore` drew its steps from; empty for `run`.",
    "started_at": "When the check run started: ISO 8601 in UTC, to the second.",
    "duration_s": "How long the check run took, in seconds (merged shards, or the runs of `--repeat N`: the sum of "
                  "theirs).",
    "checks": "One entry per check that ran (see below), sorted by check ID.",
    "missing": "Check IDs selected for the run that have no result (a crashed worker, an interrupt): the run is "
               "then at best INCOMPLETE.",
    "interrupted": "Whether a Ctrl-C or SIGTERM stopped the run before its end: the status is then INTERRUPTED.",
    "facts": "Subject-level facts, by name: what the plugin read of the fake hardware, the device mapping, "
             "findings; merged across checks (counted lists add up, `none` gives way to what another check saw).",
    "findings": "What fakelet noticed of the plugin beside the verdicts, one line per kind: processes it left "
                "detached, how it exited, a resource limit it hit, what the fake kubelet saw it do past its "
                "limits.",
    "cleanup": "What fakelet's containment had to clean up after the plugin (processes, mounts, files).",
    "schema_version": "The version of the report schema this page describes.",
    "provenance": "What produced these verdicts: fakelet, the check catalog, the subject, the kubelet, the "
                  "components, the fake hardware and the host (keys below). A path in it is named against an "
                  "anchor, never as this host's absolute path: `<subject-dir>/`, `<cwd>/`, `<fakelet>/`, "
                  "`<python-env>/`, `~/`, a system directory as it is, else `<host>/.../NAME`.",
    "suite": "A named suite (`fakelet run --suite kep5970`) instead of the subject kind's own checks, or `null`: "
             "JUnit's testsuite name.",
    "require": "The `--require` patterns the run was given, as given (check IDs like `DP-HLT-01`, areas like "
               "`DP-HLT`): the status line names the one that made a not-exercised check fail the run "
               "(`--require DP-HLT: 4 required checks not exercised: ...`). Empty without `--require`, and in "
               "reports written before the field (their `checks[].required` still decides the status).",
    # -- summary: written beside the fields, from them (SubjectReport.summary) ----------------------------------
    "summary": "Counts and the status, computed from the fields when the report is written, for readers of the "
               "JSON; fakelet's own commands reading a report recompute them from the fields.",
    "summary.pass": "How many checks passed.",
    "summary.fail": "How many checks failed.",
    "summary.not-exercised": "How many checks found nothing to test.",
    "summary.n/a": "How many checks were not applicable (an optional API feature not advertised).",
    "summary.skip": "How many checks could not run on this machine.",
    "summary.error": "How many checks ended in fakelet's own error.",
    "summary.total": "How many checks have a result (`missing` ones not counted).",
    "summary.missing": "How many selected checks have no result.",
    "summary.status": "The subject's run status: CONFORMANT, NOT CONFORMANT, INCOMPLETE, ERROR or INTERRUPTED.",
    "summary.conformant": "Whether the status is CONFORMANT.",
    "summary.not_exercised_must": "The IDs of MUST checks that were not exercised, sorted.",
    # -- CheckResult: one check ----------------------------------------------------------------------------
    "checks[].id": "The check's ID (`DP-REG-01`): its entry in the check catalog.",
    "checks[].level": "`MUST` or `SHOULD`: a failed MUST check makes the run NOT CONFORMANT, a SHOULD check's "
                      "failure does not.",
    "checks[].title": "What the check holds the plugin to, as the catalog words it.",
    "checks[].verdict": "`pass`, `fail`, `not-exercised`, `n/a`, `skip` or `error` (see Verdicts).",
    "checks[].duration_s": "How long the check took, in seconds, its setup and teardown included (`--repeat N`: "
                           "the sum of its runs).",
    "checks[].detail": "Why the verdict: for a failure what was expected and what was seen; for not-exercised, "
                       "n/a, skip and error the reason. Empty for a pass.",
    "checks[].repro": "The one command that reruns this check alone (`--check ID`) with the same subject, profile, "
                      "seed and flags; empty for a pass.",
    "checks[].notes": "Facts worth reading on any verdict: a slow but in-bound reaction, the device mapping "
                      "used, a verdict decided near a bound under load.",
    "checks[].install": "The one command that installs what a skipped check needed, when fakelet knows it.",
    "checks[].required": "Whether `--require` named this check or its area: not exercised then fails the run.",
    "checks[].measured": "Reaction times the check measured, in seconds, by what reacted (registration, "
                         "re-registration, health; `--repeat N`: the median of the runs): `fakelet fidelity` sets the "
                         "fake kubelet's beside the real one's, and the near-bound mark reads them.",
    "checks[].samples": "Every run's measured times when the check ran more than once (`--repeat`), by what "
                        "reacted: the spread `fakelet compare` uses.",
    # -- provenance (harness/run/provenance.py, reports/provenance.py, reports/merge.py) ------------------------
    "provenance.format": "The version of the provenance's own layout.",
    "provenance.fakelet": "fakelet itself.",
    "provenance.fakelet.version": "fakelet's version.",
    "provenance.fakelet.commit": "fakelet's git commit: recorded at build time in an install, read from git in a "
                                 "checkout; absent where neither is known.",
    "provenance.fakelet.dirty": "Whether fakelet's checkout had uncommitted changes to tracked files.",
    "provenance.catalog": "The check catalog the verdicts belong to.",
    "provenance.catalog.sha256": "SHA-256 of the catalog: every (ID, level, title), sorted by ID; a changed "
                                 "title or level changes it. `fakelet merge` refuses shards of different "
                                 "catalogs; `bundle` names the catalog of its reports.",
    "provenance.catalog.checks": "How many checks the catalog has (every suite's, the named suites included).",
    "provenance.subject": "The subject as it was launched.",
    "provenance.subject.name": "The subject's name (as `subject`).",
    "provenance.subject.kind": "`device-plugin` or `dra` (as `kind`).",
    "provenance.subject.defect": "The defect it ran as, or `null` (as `defect`).",
    "provenance.subject.command": "The command that started the plugin: `--plugin-cmd`, or the subject's "
                                  "`command` as written, its placeholders (`{python}`, `{bin}`) unfilled.",
    "provenance.subject.launcher": "How the plugin was started: `process`, `mount-namespace` or `container`.",
    "provenance.subject.binary": "The subject's built or given binary (`{bin}`), when it has one.",
    "provenance.subject.binary_sha256": "SHA-256 of that binary; `null` when it could not be read.",
    "provenance.subject.image": "The container image the plugin ran from, when it ran from one.",
    "provenance.subject.image_id": "That image's ID as the container engine holds it; `null` when no engine "
                                   "answered.",
    "provenance.subject.subject_file": "The subject file the subject came from (`--subject-file`).",
    "provenance.subject.subject_file_sha256": "SHA-256 of that subject file.",
    "provenance.subject.image_digests": "That image's registry digests (`RepoDigests`), when it came from a "
                                        "registry.",
    "provenance.subject.code": "Each file the subject's command runs, so that the verdicts pin the plugin's code "
                               "and not only how it was started: the program (found on PATH as exec would) and, "
                               "when it is an interpreter, the script or `-m` module it runs. Absent for a "
                               "container subject, whose image pins it.",
    "provenance.subject.code[].role": "`program`, `script`, `module` or `inline` (code given in the command "
                                      "itself).",
    "provenance.subject.code[].path": "Where the file is, named against an anchor (see above).",
    "provenance.subject.code[].sha256": "The file's SHA-256.",
    "provenance.subject.code[].module": "The module `python -m` runs (role `module`).",
    "provenance.subject.code[].note": "Why the file has no `sha256`: not found, a directory, too large, a "
                                      "placeholder filled only in the sandbox, inline code.",
    "provenance.subject.code[].size": "A file too large to hash: its size in bytes.",
    "provenance.subject.code[].mtime": "A file too large to hash: its modification time (ISO 8601, UTC).",
    "provenance.subject.python_distributions": "A Python plugin's interpreter's installed distributions, "
                                               "`name==version`, sorted.",
    "provenance.subject.python_distributions_error": "Why they are missing or cut short (the interpreter did not "
                                                     "answer, too many).",
    "provenance.kubelet": "The kubelet the checks ran on.",
    "provenance.kubelet.node": "`fake` or `real` (as `node`).",
    "provenance.kubelet.model": "On the fake node: the kubelet release whose behaviour fakelet's kubelet "
                                "imitates (`--kubelet-version`).",
    "provenance.kubelet.release": "On the real node: the kubelet release asked for (`--kubelet-version`).",
    "provenance.kubelet.version": "On the real node: the version the kubelet binary reports (only when a check "
                                  "ran on it).",
    "provenance.kubelet.binary": "On the real node: the kubelet binary the checks ran (only when a check ran on "
                                 "it).",
    "provenance.kubelet.binary_sha256": "SHA-256 of that kubelet binary.",
    "provenance.components": "The versions of the other pieces the checks ran with, by name (kube-apiserver, "
                             "kube-controller-manager, kube-scheduler, etcd, containerd, runc), and where they "
                             "came from (a Debian package, a build); empty for a device plugin on the fake node.",
    "provenance.hardware": "The fake hardware the plugin was given; empty when the subject has no inventory.",
    "provenance.hardware.inventory": "The inventory file (`--inventory`, or the subject's).",
    "provenance.hardware.inventory_name": "The inventory's name: its file name less `.yaml`.",
    "provenance.hardware.skin": "The sysfs layout it was laid out in (`--skin`).",
    "provenance.hardware.inventory_sha256": "SHA-256 of the inventory file.",
    "provenance.hardware.sha256": "One digest of what the plugin saw: the inventory's bytes and the skin.",
    "provenance.host": "The machine the checks ran on.",
    "provenance.host.kernel": "The kernel release (`uname -r`).",
    "provenance.host.machine": "The CPU architecture (`uname -m`).",
    "provenance.host.cgroup": "`v1` or `v2`: the cgroup hierarchy the sandboxes were made in.",
    "provenance.host.cpus": "How many CPUs the machine has.",
    "provenance.host.load_start": "The 1-, 5- and 15-minute load averages when the check run started.",
    "provenance.host.load_end": "The same when it ended (a `--repeat` run: when its last repetition ended).",
    "provenance.near_bound": "Which verdicts were decided near a bound while the machine was overloaded.",
    "provenance.near_bound.rule": "The rule, in words, with the bound it was applied to.",
    "provenance.near_bound.judged": "The checks that measured a reaction, so that the rule could judge them.",
    "provenance.near_bound.marked": "The checks it marked (their `notes` say so).",
    "provenance.shards": "A merged report (`fakelet merge`): one entry per shard it was merged from.",
    "provenance.shards[].shard": "The shard, as `--shard K/N` gave it.",
    "provenance.shards[].dir": "The shard's report directory, as `fakelet merge` was given it.",
    "provenance.shards[].checks": "The check IDs that shard ran for this subject.",
    "provenance.shards[].provenance": "That shard's own provenance (the keys above).",
}

# Objects whose keys are data (an API's name, a fact's name, a bound's name), described as a whole above.
MAPS = frozenset({"api_versions", "timings", "facts", "checks[].measured", "checks[].samples",
                  "provenance.components", "provenance.shards[].provenance"})


def paths(value: Any, prefix: str = "") -> list[str]:
    """The field paths a report's JSON has (`report.to_dict()`), in FIELDS' notation."""
    out: list[str] = []
    if isinstance(value, dict):
        for key, item in value.items():
            path = f"{prefix}.{key}" if prefix else str(key)
            out.append(path)
            if path not in MAPS:
                out += paths(item, path)
    elif isinstance(value, list):
        for item in value:
            if isinstance(item, dict):
                out += paths(item, prefix + "[]")
    return list(dict.fromkeys(out))


def undescribed(report: dict[str, Any]) -> list[str]:
    """The paths of a report's JSON (`report.to_dict()`) that FIELDS does not describe."""
    return [p for p in paths(report) if not FIELDS.get(p)]
