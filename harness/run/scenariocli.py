"""`fakelet scenario vocabulary`, `show`, `check` and `run --case`.

commands.py parses the flags and runs one scenario; this holds what a person writing a scenario
uses besides: the vocabulary as a reference, a file shown or checked before anything runs, the
file's promised cases run one by one and reported against their promises, and what a run on the
fake kubelet's model of a release says about that model.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from harness.kubelet.release_model import model_note
from harness.kubelet.versions import KubeletVersion
from harness.node.real.localnode import unavailable as realnode_unavailable
from harness.scenarios import library, manual
from harness.scenarios.check import DEFAULT_SUBJECT, ScenarioProblems, case_name, check_file
from harness.scenarios.schema import INCONCLUSIVE, Case, Scenario
from harness.spec.subjects import ProfileError
from reports.model import SubjectReport

# A case's result. Inconclusive (it ran and its outcome was inconclusive: a step could not run, a precondition
# never held) is neither kept nor broken, on either node, and so is skipped (it could not run here at all).
KEPT, BROKEN, SKIPPED, UNJUDGED = "kept", "BROKEN", "skipped", "inconclusive"
EXIT_KEPT, EXIT_BROKEN, EXIT_USAGE, EXIT_UNJUDGED = 0, 1, 2, 3  # 3: as an inconclusive scenario's
# The flags a case sets itself: with --case they would silently run something other than the promise.
CASE_FLAGS = (("subject", "--subject"), ("subject_file", "--subject-file"), ("plugin_cmd", "--plugin-cmd"),
              ("image", "--image"), ("defect", "--defect"))


# -- vocabulary -----------------------------------------------------------------------------------------


def cmd_vocabulary(args: argparse.Namespace) -> int:
    if args.format == "markdown":
        if args.name:
            raise ProfileError("--format markdown writes the whole reference page; give no NAME")
        print(manual.markdown(), end="")
        return 0
    if args.name is None:
        print(manual.text(), end="")
        return 0
    found = manual.find(args.name)
    if not found:
        raise ProfileError(f"no step or condition {args.name!r}; known: {', '.join(manual.names())}")
    print(manual.text(found), end="")
    return 0


# -- check ----------------------------------------------------------------------------------------------


def scenario_path(target: str) -> Path:
    """A file, or a bundled scenario by name."""
    path = Path(target)
    if path.exists() or path.is_symlink() or "/" in target or target.endswith((".yaml", ".yml")):
        return path
    bundled = library.scenario_dir() / f"{target}.yaml"
    if bundled.is_file():
        return bundled
    raise ProfileError(f"{target}: no such file, and no bundled scenario of that name "
                       f"(fakelet scenario list: {', '.join(library.names())})")


def shown(target: str) -> Scenario:
    """`fakelet scenario show TARGET`: a file (anything with a '/' or ending .yaml or .yml, relative to the
    working directory) or a bundled scenario's name, checked as `run` checks it; a file that is not there is one
    line naming it."""
    path = scenario_path(target)
    if not path.is_file():
        raise ProfileError(f"{target}: {'not a file' if path.exists() else 'no such file'}")
    scenario, problems = check_file(path)
    if problems:
        raise ScenarioProblems(problems)
    assert scenario is not None
    return scenario


def cmd_check(args: argparse.Namespace) -> int:
    """Every problem of every file, `file:line: field: problem`; exit 1 when any file has one."""
    bad = 0
    for target in args.files:
        try:
            path = scenario_path(target)
        except ProfileError as err:
            print(f"{err}")
            bad += 1
            continue
        scenario, problems = check_file(path)
        for problem in problems:
            print(problem)
        if problems:
            bad += 1
            print(f"{path}: {len(problems)} problem{'s' if len(problems) != 1 else ''}")
        elif scenario is not None:
            print(f"{path}: ok: {scenario.kind}, {len(scenario.steps)} steps, {len(scenario.cases)} promised "
                  f"case{'s' if len(scenario.cases) != 1 else ''}")
    return EXIT_BROKEN if bad else EXIT_KEPT


# -- the fake kubelet's model of a release -------------------------------------------------------------


def fake_release_note(node: str, asked: str | None, version: KubeletVersion, kind: str) -> str:
    """What a run on the fake kubelet that asked for a release (--kubelet-version, a case's kubelet_version)
    tells about it: the fake models the release only through its named behaviours, listed, so that "not
    reproduced on the fake 1.33" is never read as evidence about a real 1.33. "" on the real node, and when
    no release was asked for (the fake kubelet as it is)."""
    if node != "fake" or asked in (None, "default"):
        return ""
    return model_note(version, kind)


# -- promised cases ---------------------------------------------------------------------------------------


def select_cases(scenario: Scenario, selector: str, node: str | None) -> list[tuple[int, Case]]:
    """The cases `--case` names: all (those on --node only, when given), a name (case_name) or a number."""
    numbered = list(enumerate(scenario.cases, 1))
    if not numbered:
        raise ProfileError(f"scenario {scenario.name} promises no cases (its file has no cases:)")
    if selector == "all":
        picked = [(n, c) for n, c in numbered if node is None or c.node == node]
        if not picked:
            raise ProfileError(f"scenario {scenario.name} promises no case on the {node} kubelet")
        return picked
    picked = [(n, c) for n, c in numbered if selector in (str(n), case_name(scenario, c))]
    if not picked:
        known = ", ".join(f"{n} ({case_name(scenario, c)})" for n, c in numbered)
        raise ProfileError(f"--case {selector}: scenario {scenario.name} has no such case; known: all, {known}")
    return picked


def check_case_flags(args: argparse.Namespace) -> None:
    given = [flag for attr, flag in CASE_FLAGS if getattr(args, attr, None)]
    if args.kubelet_version not in (None, "default"):
        given.append("--kubelet-version")
    if given:
        raise ProfileError(f"--case runs each case's own subject, defect, node and kubelet; drop {', '.join(given)}")


@dataclass
class CaseRow:
    number: int
    name: str
    promised: str
    got: str
    status: str  # KEPT, BROKEN, SKIPPED or UNJUDGED
    why: str = ""
    report: str = ""
    fake_release: str = ""  # the release the fake kubelet stood in for (a case's kubelet_version on the fake node)


RunOne = Callable[[argparse.Namespace, Path], SubjectReport]


def run_cases(args: argparse.Namespace, scenario: Scenario, out: Path, run_one: RunOne) -> int:
    """Each selected case as its own run (out/cases/NN-NAME/), then the table of promises: exit 1 when one is
    broken, 3 when none is but some could not run here or ended inconclusive, 0 when every one ran and held."""
    check_case_flags(args)
    picked = select_cases(scenario, args.case, args.node)
    rows: list[CaseRow] = []
    for number, case in picked:
        name = case_name(scenario, case)
        print(f"\n== case {number}: {name}: promised {case.verdict}", flush=True)
        rows.append(_run_case(args, scenario, case, number, name, out, run_one))
    _write_table(scenario, rows, out)
    count = {status: sum(r.status == status for r in rows) for status in (KEPT, BROKEN, SKIPPED, UNJUDGED)}
    print(f"\npromises: {count[KEPT]} kept, {count[BROKEN]} broken, {count[SKIPPED]} skipped, {count[UNJUDGED]} "
          f"inconclusive (skipped: could not run here; inconclusive: ran, and gave no verdict)\nreports: {out}/")
    return EXIT_BROKEN if count[BROKEN] else EXIT_UNJUDGED if count[SKIPPED] or count[UNJUDGED] else EXIT_KEPT


def _run_case(args: argparse.Namespace, scenario: Scenario, case: Case, number: int, name: str, out: Path,
              run_one: RunOne) -> CaseRow:
    row = CaseRow(number, name, case.verdict, "", SKIPPED,
                  fake_release=case.kubelet_version if case.node == "fake" and case.kubelet_version else "")
    if case.node == "real":
        missing = realnode_unavailable()
        if missing:
            row.got, row.why = "-", f"the real kubelet cannot run here: {missing}"
            print(f"skipped: {row.why}")
            return row
    one = argparse.Namespace(**vars(args))
    one.case, one.node = None, case.node
    one.subject = case.subject or scenario.subject or DEFAULT_SUBJECT[scenario.kind]
    one.defect = case.defect
    one.kubelet_version = case.kubelet_version or "default"
    # The bound is for mutants that never react: a promised reproduction waits it out, while the correct side
    # keeps the kubelet's own (as the library's tests run them).
    one.reaction_bound = args.reaction_bound if case.verdict == "reproduced" else None
    directory = out / "cases" / f"{number:02d}-{re.sub(r'[^A-Za-z0-9.-]+', '-', name)}"
    row.report = str(directory)
    report = run_one(one, directory)
    facts = report.facts.get("scenario") or {}
    row.got = str(facts.get("outcome") or ("interrupted" if report.interrupted else "no verdict"))
    if report.interrupted:
        raise KeyboardInterrupt
    check = report.checks[0] if report.checks else None
    if row.got == INCONCLUSIVE and case.verdict != INCONCLUSIVE:
        # No verdict, on either node: a part this machine lacks (an API server: it could not run here, skipped),
        # or a step that could not run or a precondition that never held (inconclusive). Neither keeps the
        # promise nor breaks it.
        row.status = SKIPPED if check is not None and check.install else UNJUDGED
        row.why = (check.detail.splitlines() or [""])[0] if check is not None else ""
        return row
    row.status = KEPT if row.got == case.verdict else BROKEN
    if row.status == BROKEN and check is not None:
        row.why = (check.detail.splitlines() or [""])[0]
    return row


def _write_table(scenario: Scenario, rows: list[CaseRow], out: Path) -> None:
    width = max(len(r.name) for r in rows)
    lines = [f"{'case':{width + 4}} {'promised':15} {'got':15} result"]
    for r in rows:
        lines.append(f"{r.number:2}. {r.name:{width}} {r.promised:15} {r.got:15} {r.status}"
                     f"{f'  ({r.why[:160]})' if r.why else ''}")
    modelled = [r for r in rows if r.fake_release]
    # The table reads "@1.33 ... not reproduced"; say under it which of those rows were the fake's model.
    footnote = ("on the fake kubelet a release is modelled only through its named behaviours (each case's report "
                "lists them): " + ", ".join(f"{r.name} ran the fake's model of {r.fake_release}, not a real "
                                            f"{r.fake_release} kubelet" for r in modelled)) if modelled else ""
    print(f"\nscenario {scenario.name}: promised cases\n" + "\n".join(lines) + (f"\n{footnote}" if footnote else ""))
    out.mkdir(parents=True, exist_ok=True)
    (out / "cases.json").write_text(json.dumps(
        {"scenario": scenario.name, "upstream": scenario.upstream,
         "cases": [vars(r) for r in rows]}, indent=2) + "\n")
    table = ["| case | promised | got | result | why |", "| --- | --- | --- | --- | --- |"]
    table += [f"| {r.number}. `{r.name}` | {r.promised} | {r.got} | {r.status} | {r.why.replace('|', '/')} |"
              for r in rows]
    (out / "cases.md").write_text(f"# {scenario.name}: promised cases\n\n{scenario.upstream}\n\n"
                                  + "\n".join(table) + "\n" + (f"\n{footnote}\n" if footnote else ""))
