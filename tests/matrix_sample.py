"""Which kill-matrix and scenario cases a run takes: all of them in `tox -e matrix`, else what changed plus a
fixed sample.

The whole matrix is about 140 full `fakelet run`s and the scenario library about 25 `fakelet scenario run`s,
most of the default `tox`'s time. The default run keeps every reference subject's clean run (each check must
still pass on the main references; the others run the checks their own mutants must fail), as few mutants as
give every check one it must fail (`covering`), a fixed share of the
benign behaviours and scenarios, chosen by a stable hash of their names so that every run takes the same ones,
and every case that the change under test can touch:

- a kill-matrix case whose behaviour's name appears in what changed of harness/reference/ or
  fixtures/subjects/ (a defect written, renamed or retuned), or whose checks (those it must fail, or is
  limited to) are defined in a suites/ module that changed;
- a scenario whose file changed, or whose defects appear in what changed of those paths.

On the real kubelet (tox -e real-kubelet), half the scenarios run their first real case; the further cases
(another release, a mutant) are a fixed third of them; plus what changed; `tox -e fidelity` runs all.

A mutant touched by the change runs every check (it must fail exactly its own); one taken to cover a check
runs just the checks it must fail (`KILLS_ONLY`), which costs seconds instead of a whole profile. `tox -e
matrix` runs every mutant against every check.

What changed is the diff against FAKELET_CHANGED_BASE, else against where HEAD left origin/main (a branch's
commits), else HEAD~1 (the last commit, or everything a merge brought in), plus the work tree: each works on a
fresh clone with nothing but its own history. A change elsewhere (the fake kubelet, the launchers) reaches
every case alike, and the sample and the clean runs stand for it; `tox -e matrix` (FAKELET_MATRIX=full) runs
all, and the default run says in its header how many it took and against which base.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from collections.abc import Iterable
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FULL_ENV = "FAKELET_MATRIX"  # "full": every case
BASE_ENV = "FAKELET_CHANGED_BASE"
SAMPLE_ONE_IN = 8  # the default share of in_sample (the kill matrix's mutants are chosen by covering instead)
BENIGN_SAMPLE_ONE_IN = 6  # by this hash one of 16, incremental-list (a third took six, 270 s of worker time in CI)
SCENARIO_SAMPLE_ONE_IN = 4  # a quarter of the scenarios run on the fake kubelet (a third took 420 s of worker time)
REAL_FIRST_SAMPLE_ONE_IN = 2  # half the scenarios run their first real-kubelet case by default
REAL_CASE_SAMPLE_ONE_IN = 3  # a third of the scenarios' further real-kubelet cases
WATCHED = ("harness/reference/", "fixtures/subjects/", "suites/", "fixtures/scenarios/")
UPSTREAM_REF = "origin/main"
KILLS_ONLY = pytest.StashKey[frozenset[str]]()  # an untouched mutant's test runs only these checks it must fail


def full() -> bool:
    return os.environ.get(FULL_ENV, "").strip().lower() == "full"


def in_sample(subject: str, behaviour: str, one_in: int = SAMPLE_ONE_IN) -> bool:
    digest = hashlib.sha256(f"{subject}/{behaviour}".encode()).digest()
    return digest[0] % one_in == 0


def covering(cases: Iterable[tuple[str, str, Iterable[str]]]) -> frozenset[tuple[str, str]]:
    """As few mutants as leave no check without one that must fail it: (subject, behaviour) pairs."""
    return frozenset(cover_plan(cases))


def cover_plan(cases: Iterable[tuple[str, str, Iterable[str]]]) -> dict[tuple[str, str], frozenset[str]]:
    """The covering mutants, each with the checks it was taken for (those no mutant taken before it covers).

    A greedy set cover: each round takes the mutant that must fail the most checks not yet covered, ties going to
    the first in the order of their hashes, so that the choice is fixed whatever order the cases come in. About 30
    of the matrix's 130 mutants cover every check; a hash sample on top of them (an eighth) ran a dozen more mutants,
    each a run of its own, for checks already covered. A mutant taken only to cover runs only the checks it was taken
    for: two mutants that never register both fail some 30 checks, and the second was taken for one of them.
    """
    def order(case: tuple[str, str, frozenset[str]]) -> str:
        return hashlib.sha256(f"{case[0]}/{case[1]}".encode()).hexdigest()

    ranked = sorted(((s, b, frozenset(k)) for s, b, k in cases if k), key=order)
    left = {k for *_, kills in ranked for k in kills}
    plan: dict[tuple[str, str], frozenset[str]] = {}
    while left:
        subject, behaviour, kills = max(ranked, key=lambda c: len(c[2] & left))  # max keeps the first of a tie
        plan[(subject, behaviour)] = frozenset(kills & left)
        left -= kills
    return plan


def scenario_in_sample(name: str) -> bool:
    return in_sample("scenario", name, SCENARIO_SAMPLE_ONE_IN)


def real_first_in_sample(name: str) -> bool:
    """Whether a scenario's first real-kubelet case runs by default: half of them (each is a real node)."""
    return in_sample("scenario-real-first", name, REAL_FIRST_SAMPLE_ONE_IN)


def real_case_in_sample(case_id: str) -> bool:
    """A scenario's real-kubelet case beyond its first (which always runs): a fixed share of them."""
    return in_sample("scenario-real", case_id, REAL_CASE_SAMPLE_ONE_IN)


def _git(*args: str) -> str:
    try:
        proc = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return proc.stdout if proc.returncode == 0 else ""


def _resolves(rev: str) -> str:
    return _git("rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}").strip()


@cache
def base() -> str | None:
    """The commit the change is measured from (module docstring); None when there is none (a root commit)."""
    given = os.environ.get(BASE_ENV)
    if given:
        return given
    head = _resolves("HEAD")
    if _resolves(UPSTREAM_REF):
        fork = _git("merge-base", "HEAD", UPSTREAM_REF).strip()
        if fork and fork != head:
            return fork
    return "HEAD~1" if _resolves("HEAD~1") else None


@cache
def changed() -> tuple[str, frozenset[str]]:
    """The added and removed lines of the watched paths, and the suites modules that changed."""
    since = base()
    if since is None:
        return "", frozenset()
    diff = _git("diff", "--unified=0", since, "--", *WATCHED)
    lines = "\n".join(line[1:] for line in diff.splitlines()
                      if line[:1] in "+-" and not line.startswith(("+++", "---")))
    modules = frozenset(f.removesuffix(".py").replace("/", ".") for f in changed_files()
                        if f.startswith("suites/") and f.endswith(".py"))
    return lines, modules


@cache
def changed_files() -> frozenset[str]:
    since = base()
    return frozenset(_git("diff", "--name-only", since, "--", *WATCHED).split()) if since else frozenset()


def touched(behaviour: str, checks: Iterable[str], check_modules: dict[str, str]) -> bool:
    lines, modules = changed()
    if behaviour in lines:
        return True
    return any(check_modules.get(c) in modules for c in checks)


def scenario_touched(name: str, defects: Iterable[str]) -> bool:
    lines, _modules = changed()
    return f"fixtures/scenarios/{name}.yaml" in changed_files() or any(d in lines for d in defects if d)


def why_deselected() -> str:
    return (f"outside the kill matrix's sample and untouched by the change (base {base() or 'none'}); "
            "tox -e matrix runs every case")
