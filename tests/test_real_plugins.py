"""Real upstream device plugins and DRA drivers (tox -e subjects).

Go ones are built from the Go module proxy; the pydra driver comes from PyPI.

Their verdicts are findings and go into reports-subjects/ as they are; these
tests only insist that the harness produced a verdict for every check, with
no harness errors, and that every non-pass says why.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from harness.checks import catalog
from harness.cli import SUITES
from harness.subjects import load_subject, repo_root

REAL_SUBJECTS = ["sample-device-plugin", "generic-device-plugin", "dra-test-driver", "dra-example-driver",
                 "pydra-driver"]
OUT = repo_root() / "reports-subjects"
RUN_TIMEOUT_S = 1500  # includes a cold Go build of k8s.io/kubernetes code


@pytest.mark.subjects
@pytest.mark.parametrize("subject", REAL_SUBJECTS)
def test_real_plugin_gets_a_verdict_per_check(subject: str) -> None:
    spec = load_subject(subject)
    out = OUT / subject
    proc = subprocess.run([sys.executable, "-m", "harness.cli", "run", "--subject", subject,
                           "--profile", "upstream", "--out", str(out)],
                          capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    print(proc.stdout)
    assert proc.returncode in (0, 1), f"harness failure (exit {proc.returncode}):\n{proc.stderr}"
    report = json.loads((out / "report.json").read_text())
    assert report["subject"] == spec.name
    assert {c["id"] for c in report["checks"]} == set(catalog(SUITES[spec.kind]))
    errors = [c for c in report["checks"] if c["verdict"] == "error"]
    assert not errors, errors
    for c in report["checks"]:
        if c["verdict"] != "pass":
            assert c["detail"], c
            assert c["repro"].startswith(f"fakelet run --subject {subject}"), c
    assert (proc.returncode == 0) == report["summary"]["conformant"]
