"""`fakelet` answers --help, --version and bad input without importing the harness's heavy parts.

Before, every invocation imported pytest, grpc, lightkube, pytest-kind and the Docker client (about 5 s on a
loaded machine) before it parsed a flag: a typo took seconds to be told. Which modules a path loads is asserted
here, not how long it takes (timings flake on a shared machine); `python -X importtime -m harness.run.cli ...`
shows the time.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

RUN_TIMEOUT_S = 120

# What only a run that starts something needs: the check framework, the wire, the API clients, kind, the
# container engine's client, the kubelets and worlds, and the suites (which hold all of these).
HEAVY = ("pytest", "_pytest", "grpc", "google.protobuf", "lightkube", "httpx2", "docker", "testcontainers",
         "pytest_kind", "pykube", "harness.world.env", "harness.node.kind.cluster", "harness.controlplane",
         "harness.controlplane.client", "harness.node.real.localnode", "harness.node.fake", "harness.run.session",
         "harness.run.provenance", "harness.run.scenariocli", "harness.scenarios.runner", "fake_devices.cli",
         "fake_devices.levelzero", "suites")

# cli.main as the `fakelet` command calls it, then the heavy modules it left in sys.modules.
SCRIPT = """
import json, sys
from harness.run import cli
try:
    code = cli.main(sys.argv[1:])
except SystemExit as done:  # argparse's --help and errors
    code = done.code
heavy = sorted(m for m in sys.modules if m in HEAVY or m.startswith(tuple(h + "." for h in HEAVY)))
print(json.dumps({"code": code, "heavy": heavy}))
"""


def startup(tmp: Path, *args: str) -> tuple[int, list[str], str]:
    """Exit code, the heavy modules imported, and stderr of `fakelet ARGS` in a fresh interpreter."""
    proc = subprocess.run([sys.executable, "-c", f"HEAVY = {HEAVY!r}\n{SCRIPT}", *args], capture_output=True,
                          text=True, cwd=tmp, timeout=RUN_TIMEOUT_S)
    assert proc.returncode == 0 or proc.returncode == 2, proc.stderr  # sys.exit is the script's, not fakelet's
    result = json.loads(proc.stdout.splitlines()[-1])
    return result["code"], result["heavy"], proc.stderr


@pytest.mark.parametrize(("args", "code", "said"), [
    (["--version"], 0, ""),
    (["--help"], 0, ""),
    (["run", "--help"], 0, ""),
    (["run", "--no-such-flag"], 2, "unrecognized arguments: --no-such-flag"),
    (["run", "--seed", "many"], 2, "invalid int value: 'many'"),
    (["run", "--subject", "no-such-plugin"], 2, "unknown subject 'no-such-plugin'"),
    (["run", "--subject", "reference-dp", "--inventory", "no-such-inventory"], 2, "no inventory 'no-such-inventory'"),
    (["run", "--subject", "reference-dp", "--jobs", "0"], 2, "--jobs 0: must be between 1"),
    (["run", "--subject", "reference-dp", "--control-plane", "kubeconfig:/no/such/file"], 2,
     "no such kubeconfig file"),
    (["up", "--for", "-1"], 2, "--for"),
    (["scenario", "no-such-scenario"], 2, "no scenario 'no-such-scenario'"),
    (["scenario", "run", "--repeat", "0", "no-such-scenario"], 2, "--repeat 0: must be between 1"),
    (["fidelity", "--jobs", "0"], 2, "--jobs 0: must be between 1"),
    (["subjects"], 0, ""),
    (["subject", "check", "reference-dp"], 0, ""),
])
def test_help_version_and_bad_input_import_nothing_heavy(tmp_path: Path, args: list[str], code: int,
                                                          said: str) -> None:
    got, heavy, err = startup(tmp_path, *args)
    assert got == code, err
    assert said in err
    assert heavy == [], f"fakelet {' '.join(args)} imported {heavy}"


def test_the_heavy_list_names_modules_a_run_does_import(tmp_path: Path) -> None:
    """The test above proves something only if these names are right: `fakelet checks` imports the suites,
    and with them the check framework and the wire."""
    got, heavy, err = startup(tmp_path, "checks")
    assert got == 0, err
    assert {"pytest", "grpc", "suites", "harness.world.env"} <= set(heavy)
