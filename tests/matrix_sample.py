"""Which kill-matrix cases a run takes: all of them in `tox -e matrix`, else what changed plus a fixed sample.

The whole matrix is about 120 full `fakelet run`s, most of the default `tox`'s half hour. The default
run keeps every reference subject's clean run (each check must still pass on it), a fixed third of
the mutants and benign behaviours, chosen by a stable hash of their names so that every run takes the
same ones, and every case that the change under test can touch:

- its behaviour's name appears in what changed of harness/reference/ or fixtures/subjects/ (a defect
  written, renamed or retuned);
- a check it must fail, or is limited to, is defined in a suites/ module that changed.

What changed is the diff against FAKELET_CHANGED_BASE (default HEAD~1: the last commit, or everything a
merge brought in) plus the work tree. A change elsewhere (the fake kubelet, the launchers) reaches every
case alike, and the sample and the clean runs stand for it; `tox -e matrix` (FAKELET_MATRIX=full) runs all.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from collections.abc import Iterable
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FULL_ENV = "FAKELET_MATRIX"  # "full": every case
BASE_ENV = "FAKELET_CHANGED_BASE"
SAMPLE_ONE_IN = 3
WATCHED = ("harness/reference/", "fixtures/subjects/", "suites/")


def full() -> bool:
    return os.environ.get(FULL_ENV, "").strip().lower() == "full"


def in_sample(subject: str, behaviour: str) -> bool:
    digest = hashlib.sha256(f"{subject}/{behaviour}".encode()).digest()
    return digest[0] % SAMPLE_ONE_IN == 0


def _git(*args: str) -> str:
    try:
        proc = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return proc.stdout if proc.returncode == 0 else ""


@cache
def changed() -> tuple[str, frozenset[str]]:
    """The added and removed lines of the watched paths, and the suites modules that changed."""
    base = os.environ.get(BASE_ENV) or "HEAD~1"
    diff = _git("diff", "--unified=0", base, "--", *WATCHED)
    lines = "\n".join(line[1:] for line in diff.splitlines()
                      if line[:1] in "+-" and not line.startswith(("+++", "---")))
    files = set(_git("diff", "--name-only", base, "--", "suites/").split())
    modules = frozenset(f.removesuffix(".py").replace("/", ".") for f in files if f.endswith(".py"))
    return lines, modules


def touched(behaviour: str, checks: Iterable[str], check_modules: dict[str, str]) -> bool:
    lines, modules = changed()
    if behaviour in lines:
        return True
    return any(check_modules.get(c) in modules for c in checks)


def why_deselected() -> str:
    return (f"outside the kill matrix's sample and untouched by the change (base "
            f"{os.environ.get(BASE_ENV) or 'HEAD~1'}); tox -e matrix runs every case")
