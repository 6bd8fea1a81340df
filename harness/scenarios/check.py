"""`fakelet scenario check`: everything about a scenario file that can be known before anything runs.

The schema (schema.py, vocabulary.py) says whether each step and case is well formed. This adds what
needs the world the file names: the subjects, defects and kubelet releases of its `cases:` (and of its
own `subject:`/`defect:`), the devices its steps name (in each of those subjects' inventories), the
pods its conditions name (created by an earlier step), the DeviceTaintRules its untaint steps name (made by
an earlier taint, by name or selector), and its templates (a rolling update's `args:`,
rendered as the subject's own command is, so that an unknown placeholder is an error here and never
text that reaches the plugin). Every problem is reported, as `file:line: field: problem`, not only
the first; `fakelet scenario run` runs the same check and refuses to start on any.
"""

from __future__ import annotations

import difflib
import os
import re
from pathlib import Path
from typing import Any

from harness.instruments.userinput import escape_controls
from harness.kubelet.versions import KUBELET_VERSIONS
from harness.launch.sandbox import longest_path
from harness.node.real.releases import REAL_KUBELET_MODULES
from harness.scenarios.schema import Case, Scenario, _line_of, examine
from harness.scenarios.step import Step
from harness.scenarios.vocabulary import DEVICE_OPS, NO_DEFECT, NVML_CONTROLS, SCRIPTS, chosen
from harness.spec.composition import is_composed
from harness.spec.subjects import PLACEHOLDERS, ProfileError, SubjectSpec, all_subjects, load_yaml, render
from harness.world.socket_paths import dirs_under, overflows

DEFAULT_SUBJECT = {"device-plugin": "reference-dp", "dra": "reference-dra"}  # a scenario file that names none
# Conditions that name a pod, and the key that names it.
POD_KEYS = {"pod": "name", "pod_devices": "pod", "pod_resources": "pod", "resources_status": "pod",
            "checkpoint": "pod", "cdi": "pod"}
PLACEHOLDER = re.compile(r"\{[A-Za-z_][A-Za-z0-9_]*\}")
MAX_LISTED = 12  # known values listed in full up to this many; past it, the nearest and where to find the rest


class ScenarioProblems(ProfileError):
    """Every problem of a scenario file, one per line (each line a `fakelet: error:` of its own)."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__(problems[0])
        self.problems = problems

    def __str__(self) -> str:
        return "\nfakelet: error: ".join(escape_controls(p) for p in self.problems)


def check_file(path: Path, run_subject: SubjectSpec | None = None) -> tuple[Scenario | None, list[str]]:
    """(the scenario, every problem of the file) for `path`; `run_subject` is the subject a run will use when
    it is not one the file names (--subject-file, --plugin-cmd): its inventory is checked too."""
    try:
        doc = load_yaml(path)
    except ProfileError as err:
        return None, [str(err)]
    scenario, problems = examine(doc, path)
    if scenario is not None:
        problems += world_problems(scenario, run_subject)
    return scenario, by_line(problems)


def world_problems(scenario: Scenario, run_subject: SubjectSpec | None = None) -> list[str]:
    """What the schema cannot see: subjects, defects, releases, devices, pods and templates."""
    known = {s.name: s for s in all_subjects()}
    where = _where(scenario)
    problems: list[str] = []
    subjects: dict[str, SubjectSpec] = {}
    default = scenario.subject or DEFAULT_SUBJECT[scenario.kind]
    spec = _subject(scenario, default, known, "subject" if scenario.subject else "kind", where, problems)
    if spec is not None:
        subjects[spec.name] = spec
        if scenario.defect:
            problems += _defect(spec, scenario.defect, where("defect"))
    problems += _case_problems(scenario, known, subjects, where)
    if run_subject is not None:
        subjects[run_subject.name] = run_subject
    problems += _step_problems(scenario, list(subjects.values()), where)
    return problems


def by_line(problems: list[str]) -> list[str]:
    """File order: by the line each names (a problem with none first), the order found within a line."""
    def line(problem: str) -> int:
        m = re.match(r"[^:]*:(\d+): ", problem)
        return int(m.group(1)) if m else 0
    return sorted(dict.fromkeys(problems), key=line)


def _where(scenario: Scenario) -> Any:
    def where(field_path: str) -> str:
        line = _line_of(scenario.lines, field_path)
        return f"{scenario.source}:{line}: {field_path}" if line else f"{scenario.source}: {field_path}"
    return where


def _known(values: list[str], got: str, what: str) -> str:
    """`known: a, b, c`, or for a long list the nearest and where the rest are listed."""
    if len(values) <= MAX_LISTED:
        return f"known: {', '.join(values) or '(none)'}"
    near = difflib.get_close_matches(got, values, n=3, cutoff=0.5)
    hint = f"did you mean {' or '.join(near)}? " if near else ""
    return f"{hint}{len(values)} known ({what})"


def _subject(scenario: Scenario, name: str, known: dict[str, SubjectSpec], field: str, where: Any,
             problems: list[str]) -> SubjectSpec | None:
    spec = known.get(name)
    if spec is None:
        names = sorted(n for n, s in known.items() if s.kind == scenario.kind)
        problems.append(f"{where(field)}: no bundled subject {name!r} for a {scenario.kind}; "
                        f"{_known(names, name, 'fakelet subjects')}")
        return None
    if spec.kind != scenario.kind:
        problems.append(f"{where(field)}: {name} is a {spec.kind}; this scenario is for a {scenario.kind}")
        return None
    return spec


def _defect(spec: SubjectSpec, defect: str, where: str) -> list[str]:
    if defect in spec.defects:
        return []
    if is_composed(defect):
        error = spec.defect_error(defect)
        return [f"{where}: {error}"] if error else []
    return [f"{where}: {defect!r} is not a defect of {spec.name}; "
            f"{_known(sorted(spec.defects), defect, f'fakelet subjects lists those of {spec.name}')}"]


def _case_problems(scenario: Scenario, known: dict[str, SubjectSpec], subjects: dict[str, SubjectSpec],
                   where: Any) -> list[str]:
    problems: list[str] = []
    seen: dict[tuple[Any, ...], str] = {}
    for case in scenario.cases:
        path = _case_path(case)
        name = case.subject or scenario.subject or DEFAULT_SUBJECT[scenario.kind]
        spec = _subject(scenario, name, known, f"{path}.subject" if case.subject else path, where, problems)
        if spec is not None:
            subjects.setdefault(spec.name, spec)
            if case.defect:
                problems += _defect(spec, case.defect, where(f"{path}.defect"))
        if case.kubelet_version is not None:
            releases = sorted(REAL_KUBELET_MODULES if case.node == "real" else KUBELET_VERSIONS)
            if case.kubelet_version not in releases:
                whose = "the real node builds" if case.node == "real" else "the fake kubelet imitates"
                problems.append(f"{where(f'{path}.kubelet_version')}: {case.kubelet_version!r}: {whose} "
                                f"{', '.join(releases)}")
        key = (name, case.defect, case.node, case.kubelet_version)
        if key in seen:
            problems.append(f"{where(path)}: the same case as {seen[key]} (subject, defect, node and kubelet "
                            "version): one promise each")
        seen.setdefault(key, path)
    return problems


def case_name(scenario: Scenario, case: Case) -> str:
    """A case's name for --case: [real:]SUBJECT[/DEFECT][@VERSION], e.g. reference-dp/stale-socket-crash."""
    subject = case.subject or scenario.subject or DEFAULT_SUBJECT[scenario.kind]
    return (f"{'real:' if case.node == 'real' else ''}{subject}{f'/{case.defect}' if case.defect else ''}"
            f"{f'@{case.kubelet_version}' if case.kubelet_version else ''}")


def _case_path(case: Case) -> str:
    m = re.search(r"cases\[\d+\]", case.where)
    return m.group(0) if m else "cases"


def _step_problems(scenario: Scenario, subjects: list[SubjectSpec], where: Any) -> list[str]:
    problems: list[str] = []
    inventories = {s.name: ids for s in subjects if (ids := inventory_ids(s)) is not None}
    pods: set[str] = set()
    rules: list[dict[str, Any]] = []
    for step in scenario.steps:
        path = f"steps[{step.index}]"
        problems += _placeholders(step, scenario.kind, path, where)
        problems += _socket_lengths(step, subjects, path, where)
        problems += _update_defect(step, subjects, path, where)
        for field, ref in _device_refs(step):
            problems += _device(ref, inventories, pods, where(f"{path}.{field}"))
        for field, pod in _pod_refs(step):
            if pod not in pods:
                problems.append(f"{where(f'{path}.{field}')}: no pod {pod!r} was created before this step "
                                f"(pod: {{create: {pod}}})")
        if step.action == "pod" and isinstance(step.arg, dict) and "create" in step.arg:
            pods.add(step.arg["create"])
        problems += _rule_refs(step, rules, path, where)
    return problems


def _rule_refs(step: Step, rules: list[dict[str, Any]], path: str, where: Any) -> list[str]:
    """An untaint that names a rule (by name or selector) no earlier taint made; `rules`: the taints so far."""
    arg = step.arg
    if not isinstance(arg, dict):
        return []
    if step.action == "taint":
        rules.append(arg)
        return []
    if step.action != "untaint":
        return []
    if "rule" in arg and not any(r.get("name") == arg["rule"] for r in rules):
        named = sorted({str(r["name"]) for r in rules if "name" in r})
        return [f"{where(f'{path}.untaint.rule')}: no earlier taint step names a rule {arg['rule']!r} "
                f"(taint: {{name: {arg['rule']}, ...}}); {_known(named, str(arg['rule']), 'the taint steps')}"]
    if "selector" in arg and not any(r.get("selector") == arg["selector"] for r in rules):
        return [f"{where(f'{path}.untaint.selector')}: no earlier taint step has this selector "
                f"({arg['selector']}): untaint removes the rules made with the same one"]
    return []


def inventory_ids(spec: SubjectSpec) -> list[str] | None:
    """The inventory device IDs a scenario's steps name for `spec` (None when fakelet cannot know them
    before the run: a subject with no inventory of fakelet's)."""
    source = (spec.backend or {}).get("inventory") or spec.inventory
    if not source:
        return None
    try:
        devices = load_yaml(Path(source)).data.get("devices") or []
    except (ProfileError, OSError, AttributeError):
        return None  # the run reports an unreadable inventory itself
    return [str(d["id"]) for d in devices if isinstance(d, dict) and "id" in d]


def _device_refs(step: Step) -> list[tuple[str, str]]:
    """(field, DEV) of each device a step names."""
    arg = step.arg
    if not isinstance(arg, dict):
        return []
    if step.action == "device":
        op = chosen(arg, DEVICE_OPS)
        return [] if op in NVML_CONTROLS else [(f"device.{op}", arg[op])]
    if step.action == "script":
        op = chosen(arg, SCRIPTS)
        return [(f"script.{op}", arg[op])]
    if step.action in ("taint", "untaint"):
        if "device" in arg:
            return [(f"{step.action}.device", arg["device"])]
        selector = arg.get("selector") or {}
        device = selector.get("device")
        # A device name that is no DEV form (the API's own names only) is still looked up: a typo is likelier.
        return [(f"{step.action}.selector.device", device)] if isinstance(device, str) else []
    return []


def _device(ref: str, inventories: dict[str, list[str]], pods: set[str], where: str) -> list[str]:
    if ref.startswith("@pod:"):
        pod = ref[5:]
        return [] if pod in pods else [f"{where}: no pod {pod!r} was created before this step (pod: {{create: "
                                       f"{pod}}})"]
    out = []
    for subject, ids in inventories.items():
        if ref.startswith("@"):
            if int(ref[1:]) >= len(ids):
                out.append(f"{where}: {ref}: {subject}'s inventory has {len(ids)} device(s), @0 to @{len(ids) - 1}")
        elif ref not in ids:
            out.append(f"{where}: no device {ref!r} in {subject}'s inventory; {_known(ids, ref, 'its inventory')}")
    return out


def _pod_refs(step: Step) -> list[tuple[str, str]]:
    """(field, pod name) of each pod a step names, other than the one it creates."""
    if step.action == "pod" and isinstance(step.arg, dict) and "delete" in step.arg:
        return [("pod.delete", step.arg["delete"])]
    if step.action not in ("wait", "expect"):
        return []
    return _condition_pods(step.arg, step.action)


def _condition_pods(conditions: dict[str, Any], path: str) -> list[tuple[str, str]]:
    out = []
    for key, value in conditions.items():
        if key == "not":
            out += _condition_pods(value, f"{path}.not")
        elif key in POD_KEYS and isinstance(value, dict) and POD_KEYS[key] in value:
            out.append((f"{path}.{key}.{POD_KEYS[key]}", value[POD_KEYS[key]]))
    return out


def _placeholders(step: Step, kind: str, path: str, where: Any) -> list[str]:
    """A rolling update's args render as the subject's command does (an unknown placeholder is an error);
    anywhere else a placeholder is never filled, so it would reach the run as text."""
    problems = []
    templates = step.options.get("args", []) if step.action == "plugin" and step.arg == "rolling-update" else []
    values = {name: f"<{name}>" for name in PLACEHOLDERS[kind]}
    for n, template in enumerate(templates):
        try:
            render(template, values, where(f"{path}.args[{n}]"))
        except ProfileError as err:
            problems.append(str(err))
    rest = {step.action: step.arg, **{k: v for k, v in step.options.items() if not templates or k != "args"}}
    for field, text in _strings(rest):
        found = PLACEHOLDER.search(text)
        if found:
            problems.append(f"{where(f'{path}.{field}')}: {found.group(0)} is never filled in here (placeholders "
                            "are filled in a rolling update's args only): it would reach the run as text")
    return problems


def _socket_lengths(step: Step, subjects: list[SubjectSpec], path: str, where: Any) -> list[str]:
    """A rolling update's args rendered against the longest sandbox this machine makes: a socket path one makes
    that a unix socket address cannot hold is refused here, with its length, rather than met as a new instance
    that exits at start (sockets.py)."""
    if step.action != "plugin" or step.arg != "rolling-update":
        return []
    problems = []
    sandbox = longest_path()
    for spec in subjects:
        dirs = dirs_under(sandbox, spec)
        values = {name: f"<{name}>" for name in PLACEHOLDERS[spec.kind]}
        values.update(sandbox=str(sandbox), plugin_dir=dirs.plugin_dir, registry_dir=dirs.registry_dir,
                      plugins_dir=os.path.dirname(dirs.driver_dir), driver=spec.driver or spec.resource,
                      kubelet_socket=os.path.join(dirs.plugin_dir, "kubelet.sock"))
        args = []
        for n, template in enumerate(step.options.get("args", [])):
            try:
                args.append(render(str(template), values, where(f"{path}.args[{n}]")))
            except ProfileError:
                return problems  # _placeholders reports it
        whose = f" (subject {spec.name}, sandbox {sandbox.parent}/)" if len(subjects) > 1 else \
            f" (sandbox {sandbox.parent}/)"
        problems += [f"{where(f'{path}.args[{o.index}]')}: {o.describe()}{whose}" for o in overflows(spec, args, dirs)]
    return problems


def _update_defect(step: Step, subjects: list[SubjectSpec], path: str, where: Any) -> list[str]:
    """A rolling update's `defect:` names a mutant of every subject the file runs (its subject's and its cases'),
    which the new instance runs as, as `--defect NAME` runs the first: a subject that has no such defect, or none
    at all to run (no defect_args: not a reference subject), would start a new instance that is not the mutant."""
    defect = step.options.get("defect") if step.action == "plugin" and step.arg == "rolling-update" else None
    if not isinstance(defect, str) or defect == NO_DEFECT:
        return []
    problems = []
    for spec in subjects:
        if not spec.defect_args:
            problems.append(f"{where(f'{path}.defect')}: {spec.name} has no defects to run the new instance as "
                            "(only a subject with defect_args, such as the reference subjects, runs one)")
        else:
            problems += _defect(spec, defect, where(f"{path}.defect"))
    return problems


def _strings(value: Any, path: str = "") -> list[tuple[str, str]]:
    if isinstance(value, str):
        return [(path, value)]
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    out = []
    for key, inner in items:
        out += _strings(inner, f"{path}[{key}]" if isinstance(key, int) else f"{path}.{key}" if path else str(key))
    return out
