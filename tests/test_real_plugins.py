"""Real upstream device plugins and DRA drivers (tox -e subjects).

Go ones are built from the Go module proxy; the pydra driver comes from PyPI.

Their verdicts are findings and go into reports-subjects/ as they are; these
tests only insist that the harness produced a verdict for every check, with
no harness errors, and that every non-pass says why.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from harness.run.commands import SUITES
from harness.spec.checks import catalog
from harness.spec.subjects import load_subject

REPO = Path(__file__).resolve().parents[1]  # the checkout these tests belong to

REAL_SUBJECTS = ["sample-device-plugin", "generic-device-plugin", "dra-test-driver", "dra-example-driver",
                 "pydra-driver"]
OUT = REPO / "reports-subjects"
RUN_TIMEOUT_S = 1500  # includes a cold Go build of k8s.io/kubernetes code
FULL_ENV = "FAKELET_SUBJECTS"  # "full": every subject under both profiles (tox -e subjects-full)
# The default env runs the upstream profile beside the fast one for one device plugin and one DRA driver (the
# cheapest of each kind): the upstream profile's run is the longer of the two, about a third of this env's time.
BOTH_PROFILES_SAMPLE = ("sample-device-plugin", "dra-test-driver")


def both_profiles(subject: str) -> bool:
    return subject in BOTH_PROFILES_SAMPLE or os.environ.get(FULL_ENV, "").strip().lower() == "full"


def run_subject(subject: str, profile: str, out_name: str) -> tuple[subprocess.CompletedProcess[str], dict]:
    out = OUT / out_name
    proc = subprocess.run([sys.executable, "-m", "harness.run.cli", "run", "--subject", subject,
                           # --jobs auto, as users run it: checks beside each other on the shared API server must
                           # not meet each other's claims or taint rules, even for pydra's one pool name per node.
                           "--profile", profile, "--out", str(out)],
                          capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    print(proc.stdout)
    # 0 conformant, 1 not conformant, 3 incomplete (the subject cannot be built here): never a harness error.
    assert proc.returncode in (0, 1, 3), f"harness failure (exit {proc.returncode}):\n{proc.stderr}"
    return proc, json.loads((out / "report.json").read_text())


@pytest.mark.subjects
@pytest.mark.parametrize("subject", REAL_SUBJECTS)
def test_real_plugin_gets_a_verdict_per_check(subject: str) -> None:
    spec = load_subject(subject)
    if not both_profiles(subject):
        proc, report = run_subject(subject, "fast", subject)
        fast = report
    else:
        # Both profiles at once: most of either run is waiting, and the test's wall time is the CI's.
        with ThreadPoolExecutor(2) as pool:
            fast_run = pool.submit(run_subject, subject, "fast", f"{subject}-fast")
            proc, report = run_subject(subject, "upstream", subject)
            _, fast = fast_run.result()
    assert report["subject"] == spec.name
    assert {c["id"] for c in report["checks"]} == set(catalog(SUITES[spec.kind]))
    errors = [c for c in report["checks"] if c["verdict"] == "error"]
    assert not errors, errors
    for c in report["checks"]:
        if c["verdict"] != "pass":
            assert c["detail"], c
        if c["verdict"] in ("fail", "error"):
            assert c["repro"].startswith(f"fakelet run --subject {subject}"), c
    assert (proc.returncode == 0) == report["summary"]["conformant"]
    # The same verdicts under the default `fast` profile: profiles change fakelet's timers, never a verdict.
    upstream_verdicts = {c["id"]: c["verdict"] for c in report["checks"]}
    fast_verdicts = {c["id"]: c["verdict"] for c in fast["checks"]}
    differ = {k: (upstream_verdicts[k], fast_verdicts.get(k)) for k in upstream_verdicts
              if fast_verdicts.get(k) != upstream_verdicts[k]}
    assert not differ, f"upstream vs fast verdicts differ: {differ}"
