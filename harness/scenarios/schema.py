"""Scenario files (fixtures/scenarios/*.yaml): a reported bug as data.

A scenario says what the report is (title, upstream link, what a correct
system does, what the bug looks like), what it runs on (a device plugin or a
DRA driver; the fake kubelet, a real one, and which real versions have the
bug), the verdicts the library promises (`cases`), and its steps. Each step is
a mapping with one action key (`kubelet`, `plugin`, `pod`, `device`, ...) and
that action's options; the vocabulary is in harness/scenarios/vocabulary.py.

Every problem is reported with the file, the line and the field, so a person
who has never read this code can write one.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.instruments.userinput import MAX_SEED
from harness.kubelet.versions import DEFAULT_KUBELET_VERSION
from harness.scenarios.step import Step
from harness.scenarios.vocabulary import ACTIONS, check_step
from harness.spec.subjects import KINDS, ProfileError, YamlDoc, load_yaml, parse_yaml

REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE = "reproduced", "not reproduced", "inconclusive"
OUTCOMES = (REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE)
NODES = ("fake", "real")
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]{0,62}")  # repro files are named by check ID (DP-RST-01)
URL = re.compile(r"https://\S+")
VERSION = re.compile(r"1\.\d{1,2}(\.\d{1,3})?")
VERSION_RANGE = re.compile(r"(<|<=|>=|>)?\s*1\.\d{1,2}(\.\d{1,3})?(\s*,\s*(<|<=|>=|>)?\s*1\.\d{1,2}(\.\d{1,3})?)?")


@dataclass(frozen=True)
class KeyDoc:
    """What one key of a scenario file is, for people: docs/reference/scenario-file.md is rendered from these
    (tools/docgen/scenario_file_page.py), and the key sets the loader accepts are their names, so a key cannot
    be accepted and left undescribed."""

    takes: str  # its type and the values it takes
    meaning: str
    example: str  # YAML, as it stands in a file
    required: bool = False
    default: str = ""  # what leaving it out means (required keys have none)


TOP_FIELDS: dict[str, KeyDoc] = {
    "title": KeyDoc("text", "the bug in a few words, as `fakelet scenario list` and the report show it",
                    "title: allocatable stuck at 0 after the device plugin restarts", required=True),
    "upstream": KeyDoc("an https:// link", "the bug's report (an issue or pull request); the bundled library "
                       "requires one (tests/test_scenarios.py), a failed check's repro file has none",
                       "upstream: https://github.com/kubernetes/kubernetes/issues/62773",
                       default="none: the report says a failed check, replayed"),
    "correct": KeyDoc("text", "what a correct system does: the behaviour the `expect` steps hold it to (a long "
                      "text folds onto several lines after `>`, as in the whole file above)",
                      "correct: After the plugin restarts, allocatable returns to the number of healthy devices.",
                      required=True),
    "bug": KeyDoc("text", "what the bug looks like: the symptom a failed `expect` shows",
                  "bug: Allocatable stays 0 after the plugin restarts, while capacity is unchanged.", required=True),
    "kind": KeyDoc(f"one of {', '.join(KINDS)}", "what the subject is, a device plugin or a DRA driver: it decides "
                   "the default subject and which steps and conditions the file may use", "kind: device-plugin",
                   required=True),
    "subject": KeyDoc("a bundled subject of the file's kind (`fakelet subjects`)", "the subject a run uses unless "
                      "--subject, --subject-file, --plugin-cmd or --image names another", "subject: reference-dp",
                      default="the kind's reference subject: reference-dp or reference-dra"),
    "defect": KeyDoc("a defect of the subject (`fakelet subjects`)", "the mutant a run uses unless --defect or "
                     "another subject is given (a failed check's repro file names the one that failed)",
                     "defect: stale-socket-crash", default="none: the subject as it ships"),
    "seed": KeyDoc(f"a whole number from 0 to {MAX_SEED}", "the seed of fault schedules, as --seed (which replaces "
                   "it)", "seed: 7", default="0"),
    "nodes": KeyDoc(f"a list of {', '.join(NODES)}", "the kubelets the scenario can run on: fake (fakelet's own) "
                    "and real (a real kubelet beside it; root). `--node` picks one; a case names its own",
                    "nodes: [fake, real]", default="[fake]"),
    "real": KeyDoc("a mapping of affected and fixed (the `real:` keys below); nodes must list real",
                   "which real kubelet releases have the bug and which do not, as the report says: shown by "
                   "`fakelet scenario show`, never checked", 'real: {affected: ">=1.9, <1.11", fixed: ">=1.11"}',
                   default="not said"),
    "cases": KeyDoc("a list of cases (the case keys below)", "the verdicts the file promises: each case a subject "
                    "(or mutant) on a node and kubelet release, and its outcome. `fakelet scenario run NAME --case "
                    "all` runs each and holds it to its promise; CI does so for the library",
                    "cases:\n  - {subject: reference-dp, verdict: not reproduced}\n"
                    "  - {subject: reference-dp, defect: stale-socket-crash, verdict: reproduced}",
                    default="none: `--case` has nothing to run"),
    "steps": KeyDoc("a non-empty list of steps (below)", "what happens, in order, each step bounded and narrated; "
                    "at least one `expect`, `story` or `check` step says what correct is",
                    "steps:\n  - kubelet: start\n  - plugin: start\n  - wait: {registered: true, allocatable: all}\n"
                    "  - plugin: kill\n  - plugin: start\n  - expect: {allocatable: healthy}", required=True),
    "notes": KeyDoc("text", "what a reader needs besides: what was read in which sources, why a case promises what "
                    "it does; `fakelet scenario show` prints it", "notes: >\n  Read in v1.36.3's "
                    "plugin/v1beta1 handler.go runClient.", default="none"),
}
CASE_FIELDS: dict[str, KeyDoc] = {
    "verdict": KeyDoc(f"one of {', '.join(OUTCOMES)}", "the outcome promised for this case: reproduced (an expect "
                      "failed: the bug shows), not reproduced (every expectation held), inconclusive (a step could "
                      "not run, or a wait never held)", "verdict: reproduced", required=True),
    "subject": KeyDoc("a bundled subject of the file's kind", "whose case it is", "subject: sample-device-plugin",
                      default="the file's subject"),
    "defect": KeyDoc("a defect of the case's subject", "the mutant the case runs", "defect: stale-socket-crash",
                     default="none: the subject as it ships"),
    "node": KeyDoc("one of the file's nodes", "the kubelet the case runs on", "node: real", default="fake"),
    "kubelet_version": KeyDoc("a release like \"1.37\" (quote it: YAML reads 1.30 as a number)",
                              "the kubelet release the case runs: on the real node a real kubelet of that release; "
                              "on the fake node the fake kubelet's model of it, which differs from the default only "
                              "by the release's named behaviours (the fake kubelet's releases, below)",
                              'kubelet_version: "1.37"',
                              default=f"the node's default release ({DEFAULT_KUBELET_VERSION})"),
    "why": KeyDoc("text", "why the case gives its verdict; shown beside the case by `fakelet scenario show`",
                  'why: "the fake kubelet imitates 1.36 by default"', default="none"),
}
REAL_FIELDS: dict[str, KeyDoc] = {
    "affected": KeyDoc("a version range: '<1.29', '>=1.29' or '>=1.27, <1.29'", "the real releases with the bug",
                       'affected: ">=1.25, <1.37"', default="not said"),
    "fixed": KeyDoc("a version range, as affected", "the real releases without it", 'fixed: ">=1.37"',
                    default="not said"),
}
TOP_KEYS = set(TOP_FIELDS)
# upstream is required of the library (tests/test_scenarios.py); a failed check's repro file has none.
REQUIRED = tuple(k for k, doc in TOP_FIELDS.items() if doc.required)
CASE_KEYS = set(CASE_FIELDS)
REAL_KEYS = set(REAL_FIELDS)


@dataclass(frozen=True)
class Case:
    """A verdict the library promises: this subject (or mutant) on this node gives this outcome."""

    verdict: str
    subject: str | None = None
    defect: str | None = None
    node: str = "fake"
    kubelet_version: str | None = None
    why: str = ""
    where: str = ""

    def describe(self) -> str:
        who = self.subject or "the scenario's subject"
        return (f"{who}{f' --defect {self.defect}' if self.defect else ''} on the {self.node} kubelet"
                f"{f' {self.kubelet_version}' if self.kubelet_version else ''}: {self.verdict}")


@dataclass(frozen=True)
class Scenario:
    name: str
    title: str
    upstream: str
    correct: str
    bug: str
    kind: str  # device-plugin | dra
    steps: tuple[Step, ...]
    subject: str | None = None  # the default subject; --subject and friends replace it
    defect: str | None = None  # the default mutant (a failed check's repro file names the one that failed)
    seed: int = 0  # the default seed (--seed replaces it)
    nodes: tuple[str, ...] = ("fake",)
    affected: str = ""  # real kubelet versions with the bug ("<1.29", "1.32, 1.33")
    fixed: str = ""  # and without it
    cases: tuple[Case, ...] = ()
    notes: str = ""
    source: str = ""
    lines: dict[str, int] = field(default_factory=dict)

    def summary(self) -> str:
        return f"{self.name:50} {self.title}  {self.upstream or '(no upstream report)'}"


def load(path: Path) -> Scenario:
    """One scenario file, validated; a ProfileError names the file, line and field of the first problem."""
    return from_doc(load_yaml(path), path)


def loads(text: str, source: str) -> Scenario:
    return from_doc(parse_yaml(text, source), Path(source))


def from_doc(doc: YamlDoc, path: Path) -> Scenario:
    scenario, problems = examine(doc, path)
    if problems:
        raise ProfileError(problems[0])
    assert scenario is not None
    return scenario


def examine(doc: YamlDoc, path: Path) -> tuple[Scenario | None, list[str]]:
    """Every problem of a scenario document (`file:line: field: problem`), first found first, and the scenario
    its well-formed parts make (its bad steps and cases left out), or None when too little is well formed
    (not a mapping, no valid kind, no list of steps). `fakelet scenario check` reports them all."""
    source = str(path)
    problems: list[str] = []

    def where(field_path: str) -> str:
        line = _line_of(doc.lines, field_path)
        return f"{source}:{line}: {field_path}" if line else f"{source}: {field_path}"

    for key, line in doc.duplicates:
        problems.append(f"{source}:{line}: {key}: given twice")
    data = doc.data
    if not isinstance(data, dict):
        return None, [*problems, f"{source}: a scenario is a mapping (title, upstream, correct, bug, kind, steps, "
                                 "...)"]
    problems += [f"{where(key)}: unknown field; known: {', '.join(sorted(TOP_KEYS))}"
                 for key in sorted(set(data) - TOP_KEYS, key=str)]
    problems += [f"{source}: {key}: required" for key in REQUIRED if key not in data]
    for key in ("title", "upstream", "correct", "bug", "notes", "subject", "defect"):
        if key in data and not (isinstance(data[key], str) and data[key].strip()):
            problems.append(f"{where(key)}: must be a non-empty string")
    if isinstance(data.get("upstream"), str) and not URL.fullmatch(data["upstream"].strip()):
        problems.append(f"{where('upstream')}: must be the report's https:// link")
    seed = data.get("seed", 0)
    if not (isinstance(seed, int) and not isinstance(seed, bool) and 0 <= seed <= MAX_SEED):
        problems.append(f"{where('seed')}: a whole number from 0 to {MAX_SEED} (as --seed)")
    kind = data.get("kind")
    if "kind" in data and kind not in KINDS:
        problems.append(f"{where('kind')}: {kind!r} is not one of {', '.join(KINDS)}")
    name = path.stem
    if not NAME.fullmatch(name):
        problems.append(f"{source}: the file name {name!r} is the scenario's name: letters, digits and '-'")
    nodes: tuple[str, ...] = ("fake",)
    affected = fixed = ""
    try:
        nodes = _nodes(data.get("nodes", ["fake"]), where)
        affected, fixed = _real(data.get("real"), where, nodes)
    except ProfileError as err:
        problems.append(str(err))
    # A kind that is wrong or missing: the steps are checked against both, and only what is wrong for both
    # is reported (the kind's own problem says the rest).
    steps, step_problems = _steps(data.get("steps"), where, kind) if "steps" in data else ((), [])
    problems += step_problems
    cases, case_problems = _cases(data.get("cases", []), where, nodes)
    problems += case_problems
    if kind not in KINDS or not steps or not all(isinstance(data.get(k), str) for k in REQUIRED if k != "steps"):
        return None, problems
    return Scenario(name=name, title=data["title"].strip(), upstream=str(data.get("upstream", "")).strip(),
                    correct=" ".join(data["correct"].split()), bug=" ".join(data["bug"].split()),
                    kind=kind, steps=steps, subject=_text(data.get("subject")), defect=_text(data.get("defect")),
                    seed=seed if isinstance(seed, int) else 0, nodes=nodes, affected=affected, fixed=fixed,
                    cases=cases, notes=" ".join(str(data.get("notes", "")).split()), source=source,
                    lines=dict(doc.lines)), problems


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value.strip() else None


def _line_of(lines: dict[str, int], field_path: str) -> int | None:
    """The line of `field_path`, or of the nearest field holding it: a field the file lacks has no
    line of its own, and its step's line is where the writer goes to add it."""
    path = field_path
    while path not in lines:
        holder = re.sub(r"(\.[^.\[\]]*|\[\d+\])$", "", path)  # drop the last ".key" or "[N]"
        if holder == path:
            return None
        path = holder
    return lines[path]


def _nodes(value: Any, where: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise ProfileError(f"{where('nodes')}: a list of {', '.join(NODES)}")
    bad = [v for v in value if v not in NODES]
    if bad:
        raise ProfileError(f"{where('nodes')}: {bad[0]!r} is not one of {', '.join(NODES)}")
    return tuple(dict.fromkeys(value))


def _real(value: Any, where: Any, nodes: tuple[str, ...]) -> tuple[str, str]:
    if value is None:
        return "", ""
    if "real" not in nodes:
        raise ProfileError(f"{where('real')}: versions of a real kubelet, but nodes does not list real")
    if not isinstance(value, dict):
        raise ProfileError(f"{where('real')}: a mapping with affected and fixed (version ranges like '<1.29')")
    unknown = sorted(set(value) - REAL_KEYS)
    if unknown:
        raise ProfileError(f"{where('real.' + unknown[0])}: unknown field; known: affected, fixed")
    out = []
    for key in ("affected", "fixed"):
        text = value.get(key, "")
        if text and not (isinstance(text, str) and VERSION_RANGE.fullmatch(text.strip())):
            raise ProfileError(f"{where('real.' + key)}: a version range like '<1.29', '>=1.29' or '>=1.27, <1.29'")
        out.append(str(text).strip())
    return out[0], out[1]


def _steps(value: Any, where: Any, kind: Any) -> tuple[tuple[Step, ...], list[str]]:
    """(the well-formed steps, a problem for each other one)."""
    if not isinstance(value, list) or not value:
        return (), [f"{where('steps')}: a non-empty list of steps"]
    steps, problems = [], []
    for n, raw in enumerate(value):
        path = f"steps[{n}]"
        if not isinstance(raw, dict) or not raw:
            problems.append(f"{where(path)}: a step is a mapping with one action ({', '.join(ACTIONS)})")
            continue
        actions = [k for k in raw if k in ACTIONS]
        if len(actions) != 1:
            what = f"{len(actions)} actions ({', '.join(actions)})" if actions else \
                f"no action (keys: {', '.join(map(str, raw))})"
            problems.append(f"{where(path)}: a step has exactly one action of {', '.join(ACTIONS)}; this one has "
                            f"{what}")
            continue
        action = actions[0]
        options = {k: v for k, v in raw.items() if k != action}
        step = Step(action, raw[action], options, where(path), n)
        problem, not_finite = _step_problem(step, kind), _not_finite(raw)
        if problem and not_finite and not_finite[0] == problem[0]:
            problem = (problem[0], f"{problem[1]} ({not_finite[1]})")
        problem = problem or not_finite
        if problem:
            field_path, message = problem
            problems.append(f"{where(path + ('.' + field_path if field_path else ''))}: {message}")
            continue
        steps.append(step)
    if not problems and not any(s.action in ("expect", "story", "check") for s in steps):
        problems.append(f"{where('steps')}: no expect step: a scenario must say what the correct behaviour is")
    return tuple(steps), problems


def _step_problem(step: Step, kind: Any) -> tuple[str, str] | None:
    """The step's problem for its scenario's kind; for a kind that is wrong or missing, the problem it has for
    every kind (none if it suits one of them)."""
    if kind in KINDS:
        return check_step(step, kind)
    found = [check_step(step, k) for k in KINDS]
    return found[0] if all(found) else None


def _not_finite(value: Any, path: str = "") -> tuple[str, str] | None:
    """The first NaN or infinity under a step (YAML's .nan, .inf) that its own check let through: no step takes one."""
    if isinstance(value, float) and not math.isfinite(value):
        return path, f"{value!r} is not a finite number"
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, inner in items:
        sub = f"{path}[{key}]" if isinstance(key, int) else f"{path}.{key}" if path else str(key)
        found = _not_finite(inner, sub)
        if found:
            return found
    return None


def _cases(value: Any, where: Any, nodes: tuple[str, ...]) -> tuple[tuple[Case, ...], list[str]]:
    """(the well-formed cases, a problem for each other one)."""
    if not isinstance(value, list):
        return (), [f"{where('cases')}: a list of {{verdict, subject, defect, node, kubelet_version}}"]
    cases, problems = [], []
    for n, raw in enumerate(value):
        path = f"cases[{n}]"
        problem = _case_problem(raw, path, where, nodes)
        if problem:
            problems.append(problem)
            continue
        cases.append(Case(raw["verdict"], raw.get("subject"), raw.get("defect"), raw.get("node", "fake"),
                          raw.get("kubelet_version"), raw.get("why", ""), where(path)))
    return tuple(cases), problems


def _case_problem(raw: Any, path: str, where: Any, nodes: tuple[str, ...]) -> str | None:
    if not isinstance(raw, dict):
        return f"{where(path)}: a mapping with verdict and the subject, defect, node it is for"
    unknown = sorted(set(raw) - CASE_KEYS, key=str)
    if unknown:
        return f"{where(path + '.' + str(unknown[0]))}: unknown field; known: {', '.join(sorted(CASE_KEYS))}"
    if raw.get("verdict") not in OUTCOMES:
        return f"{where(path + '.verdict')}: one of {', '.join(OUTCOMES)}"
    node = raw.get("node", "fake")
    if node not in nodes:
        return f"{where(path + '.node')}: {node!r} is not in the scenario's nodes ({', '.join(nodes)})"
    version = raw.get("kubelet_version")
    if version is not None and not (isinstance(version, str) and VERSION.fullmatch(version)):
        return f"{where(path + '.kubelet_version')}: a version like '1.36' (quote it in YAML)"
    for key in ("subject", "defect", "why"):
        if key in raw and not (isinstance(raw[key], str) and raw[key]):
            return f"{where(path + '.' + key)}: a non-empty string"
    return None
