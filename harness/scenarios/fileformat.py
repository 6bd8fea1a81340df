"""The scenario file format for people: what docs/reference/scenario-file.md shows besides the meanings.

schema.py describes every top-level, case and `real:` key (TOP_FIELDS, CASE_FIELDS, REAL_FIELDS); manual.py
every step and condition. This adds what a person writing a file needs besides: a whole file and a YAML example
of every step and condition (tests/test_scenario_reference.py holds each to the validator), and where each of a
step's keys goes, beside the action key (`within: 5s`) or inside its mapping (`pod: {create: x, devices: 2}`).

Where a key goes is read off the validator's own code (vocabulary.py's checkers, walked as a syntax tree), not
written down here: a key someone adds to a checker shows on the page, as "not described yet" until manual.py
says what it means, and the tests fail until it does.
"""

from __future__ import annotations

import ast
import functools
import inspect
from dataclasses import dataclass
from typing import Any

from harness.scenarios import manual, vocabulary

# A whole file: every top-level key but `defect` (which would make the mutant the file's default run).
EXAMPLE_FILE = """\
title: allocatable stuck at 0 after the device plugin restarts
upstream: https://github.com/kubernetes/kubernetes/issues/62773
correct: >
  After the plugin restarts, allocatable returns to the number of healthy devices.
bug: >
  Allocatable stays 0 after the plugin restarts, while capacity is unchanged.
kind: device-plugin
subject: reference-dp
seed: 0
nodes: [fake, real]
real: {affected: ">=1.9, <1.11", fixed: ">=1.11"}
notes: >
  Fixed in 1.11. The reference plugin's stale-socket-crash mutant shows the symptom.
cases:
  - {subject: reference-dp, verdict: not reproduced}
  - {subject: reference-dp, defect: stale-socket-crash, verdict: reproduced}
  - {node: real, kubelet_version: "1.37", verdict: not reproduced, why: "fixed long before 1.37"}
steps:
  - kubelet: start
  - plugin: start
  - wait: {registered: true, allocatable: all}
  - plugin: kill
  - wait: {allocatable: 0}
  - plugin: start
  - expect: {allocatable: healthy}
    within: 30s
"""

# Steps as they stand under `steps:`, each checked for the kind example_kind names.
STEP_EXAMPLES: dict[str, str] = {
    "kubelet": "- kubelet: restart\n- kubelet: reboot\n  checkpoint: lost",
    "plugin": "- plugin: kill\n  during: Allocate\n- plugin: rolling-update\n"
              "  args: [\"--socket-name\", \"fakelet-dp-next.sock\"]",
    "pod": "- pod: {create: workload, devices: 2}\n- pod: {delete: workload}",
    "device": "- device: {fail: gpu-0}\n- device: {heat: \"@1\", to: 95}\n"
              "- device: {xid: \"@pod:workload\", code: 79}\n- device: {nvml-init-error: 999}",
    "script": "- script: {flap: gpu-0, period: 0.5, cycles: 3}\n"
              "- script: {ramp: gpu-1, from: 60, to: 95, step: 5, period: 1s}",
    "taint": "- taint: {device: gpu-0, effect: NoExecute, key: example.com/maintenance}\n"
             "- taint: {device: gpu-1, effect: None, key: example.com/notice}",
    "untaint": "- untaint: {device: gpu-0}",
    "hold": "- hold: 5s\n- hold: {call: Register}",
    "release": "- release: {call: Register}",
    "reject": "- reject: {call: Register}",
    "socket": "- socket: {delete: plugin}",
    "wait": "- wait: {registered: true, allocatable: all}\n  within: 60s",
    "expect": "- expect: {allocatable: healthy}\n- expect: {allocatable: 4}\n  throughout: 3s",
    "story": "- story: taint-eviction\n  toleration_seconds: 2",
    "check": "- check: DP-RST-01",
}
CONDITION_EXAMPLES: dict[str, str] = {
    "registered": "- wait: {registered: true}",
    "capacity": "- expect: {capacity: {at_least: 1}}\n- expect: {capacity: {resource: example.com/nic, count: 0}}",
    "allocatable": "- expect: {allocatable: healthy}\n- expect: {allocatable: {at_most: 3}}",
    "pod": "- expect: {pod: {name: workload, phase: Running}}\n"
           "- expect: {pod: {name: second, phase: Failed, reason: UnexpectedAdmissionError}}",
    "pod_devices": "- expect: {pod_devices: {pod: workload, count: 1}}",
    "pod_resources": "- expect: {pod_resources: {pod: workload, devices: 1, via: Get}}\n"
                     "- expect: {pod_resources: {allocatable: fakelet.example.com/gpu, devices: healthy}}",
    "resources_status": "- expect: {resources_status: {pod: workload, health: Unhealthy}}",
    "calls": "- expect: {calls: {method: Allocate, count: 1, since: step}}",
    "checkpoint": "- expect: {checkpoint: {pod: workload, devices: 1}}",
    "cdi": "- expect: {cdi: {pod: workload, present: false}}",
    "dialed": "- wait: {dialed: {socket: fakelet-dp-next.sock, plugin_instance: 2}}",
    "slices": "- wait: {slices: {devices: {at_least: 1}}}",
    "taints": "- expect: {taints: {only: [gpu-0], no_execute: [gpu-0]}}\n"
              "- expect: {taints: {no_execute: [gpu-0], from: both}}",
    "device_health": "- expect: {device_health: {healthy: [gpu-1], unhealthy: [gpu-0]}}",
    "held": "- wait: {held: {call: Register}}",
    "not": "- expect: {not: {pod: {name: workload, phase: Running}}}",
}
UNDESCRIBED = "not described yet (harness/scenarios/manual.py)"
BESIDE, INSIDE = "beside the action", "in the action's mapping"


def example_kind(name: str) -> str:
    """The kind of scenario an example of this step or condition is written for: a DRA driver's for what only
    DRA drivers take, else a device plugin's."""
    return "dra" if name in vocabulary.DRA_ONLY else "device-plugin"


def example(entry: manual.Entry) -> str:
    return (STEP_EXAMPLES if entry.what == "step" else CONDITION_EXAMPLES).get(entry.name, "")


# -- where a step's keys go, read off vocabulary.py -------------------------------------------------------

ARG, OPTIONS = "arg", "options"  # a checker's first two parameters: the action's value, the step's other keys
KEYS_OF = ("set", "iter", "next", "list", "sorted")  # calls whose result is (or is one of) a mapping's keys


@dataclass(frozen=True)
class Accepted:
    """The keys a step's checker accepts: options beside the action key, and keys of the action's mapping."""

    options: frozenset[str]
    inside: frozenset[str]


@functools.cache
def _module() -> tuple[dict[str, ast.FunctionDef], dict[str, frozenset[str]], dict[str, str]]:
    """vocabulary.py's functions, its tables of words (a tuple or set of strings, a dict's keys), and the checker
    of each action (check_step's dispatch table)."""
    tree = ast.parse(inspect.getsource(vocabulary))
    functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    tables: dict[str, frozenset[str]] = {}
    for node in tree.body:
        target, value = (node.targets[0], node.value) if isinstance(node, ast.Assign) and len(node.targets) == 1 \
            else (node.target, node.value) if isinstance(node, ast.AnnAssign) else (None, None)
        if isinstance(target, ast.Name) and value is not None:
            words = _literal_words(value)
            if words is not None:
                tables[target.id] = words
    checkers: dict[str, str] = {}
    for node in ast.walk(functions["check_step"]):
        if isinstance(node, ast.Dict) and all(isinstance(k, ast.Constant) for k in node.keys):
            checkers.update({k.value: v.id for k, v in zip(node.keys, node.values, strict=True)  # type: ignore
                             if isinstance(v, ast.Name)})
    return functions, tables, checkers


def _literal_words(node: ast.expr) -> frozenset[str] | None:
    try:
        value = ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None
    items = value.keys() if isinstance(value, dict) else value if isinstance(value, tuple | set | frozenset | list) \
        else None
    if items is None or not all(isinstance(i, str) for i in items):
        return None
    return frozenset(items)


@functools.cache
def accepted(action: str) -> Accepted:
    """The keys `action`'s checker in vocabulary.py accepts, as its code names them: `"k" in arg`, `arg["k"]`,
    `arg.get("k")`, `set(arg) - {...}`, `set(arg) != {...}`, `next(iter(arg)) in TABLE`, and for options the
    same plus the `allowed` of `_no_options(options, (...))`, followed into the checker's helpers. Keys a checker
    takes from a table by a variable (a device op, a script's keys) are not seen: manual.py lists those from the
    tables themselves."""
    functions, tables, checkers = _module()
    found: dict[str, set[str]] = {ARG: set(), OPTIONS: set()}
    name = checkers.get(action)
    if name in functions:
        params = [a.arg for a in functions[name].args.args]
        _walk(functions[name], dict(zip(params, (ARG, OPTIONS), strict=False)), found, functions, tables, set())
    return Accepted(frozenset(found[OPTIONS]), frozenset(found[ARG]))


def _walk(func: ast.FunctionDef, env: dict[str, Any], found: dict[str, set[str]],
          functions: dict[str, ast.FunctionDef], tables: dict[str, frozenset[str]], seen: set[Any]) -> None:
    """Collect the keys `func` names of the mappings `env` gives roles (ARG, OPTIONS); other names in `env` are
    the words a caller passed (a set of strings)."""
    signature = (func.name, tuple(sorted((k, v if isinstance(v, str) else tuple(sorted(v))) for k, v in env.items())))
    if signature in seen:
        return
    seen.add(signature)
    local = {n.targets[0].id: n.value for n in ast.walk(func)
             if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name)}

    def role(node: ast.expr) -> str | None:
        return env.get(node.id) if isinstance(node, ast.Name) and isinstance(env.get(node.id), str) else None

    def keys_role(node: ast.expr) -> str | None:
        """The role whose keys `node` is: set(arg), next(iter(arg)), ..."""
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in KEYS_OF and node.args:
            return role(node.args[0]) or keys_role(node.args[0])
        return None

    def words(node: ast.expr | None, depth: int = 0) -> set[str]:
        if node is None or depth > 8:
            return set()
        if isinstance(node, ast.Constant):
            return {node.value} if isinstance(node.value, str) else set()
        if isinstance(node, ast.Name):
            if node.id in env and not isinstance(env[node.id], str):
                return set(env[node.id])
            if node.id in local:
                return words(local[node.id], depth + 1)
            return set(tables.get(node.id, ()))
        if isinstance(node, ast.Tuple | ast.Set | ast.List):
            return set().union(*(words(e, depth + 1) for e in node.elts if not isinstance(e, ast.Starred)))
        if isinstance(node, ast.IfExp):
            return words(node.body, depth + 1) | words(node.orelse, depth + 1)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in (*KEYS_OF, "tuple") \
                and node.args:
            return words(node.args[0], depth + 1)
        return set()

    for node in ast.walk(func):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            for left, op, right in zip(sides, node.ops, sides[1:], strict=False):
                if isinstance(op, ast.In | ast.NotIn):
                    if (r := role(right) or keys_role(right)) is not None:
                        found[r] |= words(left)  # "k" in arg
                    elif (r := keys_role(left)) is not None:
                        found[r] |= words(right)  # next(iter(arg)) in TABLE
                elif isinstance(op, ast.Eq | ast.NotEq):
                    for one, other in ((left, right), (right, left)):
                        if (r := keys_role(one)) is not None:
                            found[r] |= words(other)  # set(arg) != {"k"}
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Sub) and (r := keys_role(node.left)):
            found[r] |= words(node.right)  # set(arg) - {"a", "b"}
        elif isinstance(node, ast.Subscript) and (r := role(node.value)):
            found[r] |= words(node.slice)  # arg["k"]
        elif isinstance(node, ast.Call):
            callee = node.func
            if isinstance(callee, ast.Attribute) and callee.attr == "get" and (r := role(callee.value)) and node.args:
                found[r] |= words(node.args[0])  # arg.get("k")
            elif isinstance(callee, ast.Name) and callee.id in functions:
                _follow(functions[callee.id], node, role, words, found, functions, tables, seen)


def _follow(func: ast.FunctionDef, call: ast.Call, role: Any, words: Any, found: dict[str, set[str]],
            functions: dict[str, ast.FunctionDef], tables: dict[str, frozenset[str]], seen: set[Any]) -> None:
    """Into a helper the checker hands a mapping to (its role), with the words the call gives its other
    parameters (or their defaults)."""
    params = [a.arg for a in func.args.args]
    defaults = dict(zip(params[len(params) - len(func.args.defaults):], func.args.defaults, strict=True))
    given: dict[str, ast.expr] = {**defaults, **dict(zip(params, call.args, strict=False)),
                                  **{k.arg: k.value for k in call.keywords if k.arg}}
    env: dict[str, Any] = {}
    for param, value in given.items():
        r = role(value)
        env[param] = r if r is not None else frozenset(words(value))
    if any(isinstance(v, str) for v in env.values()):
        _walk(func, env, found, functions, tables, seen)


# -- a step's keys, for the page --------------------------------------------------------------------------


def step_keys(entry: manual.Entry) -> list[tuple[manual.Key, str]]:
    """(key, where it goes) for each key of a step: manual.py's, then any the validator accepts that manual.py
    does not describe yet (listed, never left out)."""
    taken = accepted(entry.name)
    documented = {k.name for k in entry.keys} | {v for v, _ in entry.values}
    out = [(k, BESIDE if k.name in taken.options else INSIDE) for k in entry.keys]
    for name in sorted(taken.options - documented):
        out.append((manual.Key(name, "see `fakelet scenario check`", f"({UNDESCRIBED})", UNDESCRIBED), BESIDE))
    for name in sorted(taken.inside - documented):
        out.append((manual.Key(name, "see `fakelet scenario check`", f"({UNDESCRIBED})", UNDESCRIBED), INSIDE))
    return out


def undescribed() -> dict[str, list[str]]:
    """Per step, the keys its checker accepts that manual.py does not describe (the tests want none)."""
    out = {}
    for entry in manual.steps():
        missing = [k.name for k, _ in step_keys(entry) if k.meaning == UNDESCRIBED]
        if missing:
            out[entry.name] = missing
    return out
