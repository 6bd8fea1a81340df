"""docs/reference/checks.md: the check catalog, read off the suites themselves.

ID, level and title come from each check's `@check(...)` (harness/spec/checks.py's CATALOG). What a
check needs, the bounds it reads and the kubelets that can judge it are read off its source: the calls
it makes (directly or through helpers of its own module and suites/dra/common.py) to the environment's
`need_*` / `require_*` methods, the `profile.*` bounds it names, its `real_kubelet=` / `kind=` marks,
and whether it asks for the fake kubelet itself (`env.fake_*`, which a real kubelet cannot answer).
"""

from __future__ import annotations

import ast
import importlib
import inspect
from dataclasses import dataclass, field, fields

from docgen.markdown import cell, code, field_comments, header, table

# What each environment method a check calls says it needs (harness/world/env.py, draenv.py).
NEEDS = {
    "need_api": "API server",
    "need_controllers": "kube-controller-manager",
    "need_devices": "a listed device mapped to the fake hardware",
}
SURFACES = {"nvml": "the NVML surface (`nvml` skin)", "levelzero": "the Level-Zero sidecar (`drm` skin)"}


@dataclass
class Reads:
    needs: set[str] = field(default_factory=set)
    bounds: set[str] = field(default_factory=set)
    fake_only: set[str] = field(default_factory=set)


def _functions(module: object) -> dict[str, ast.FunctionDef]:
    tree = ast.parse(inspect.getsource(module))  # type: ignore[arg-type]
    return {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}


def _arg(call: ast.Call, n: int) -> str | None:
    if len(call.args) > n and isinstance(call.args[n], ast.Constant) and isinstance(call.args[n].value, str):
        return call.args[n].value
    return None


def _scan(fn: ast.FunctionDef, local: dict[str, ast.FunctionDef], reads: Reads, seen: set[str]) -> None:
    if fn.name in seen:
        return
    seen.add(fn.name)
    for node in ast.walk(fn):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute) and \
                node.value.attr == "profile":
            reads.bounds.add(node.attr)
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Name) and func.id in local:
            _scan(local[func.id], local, reads, seen)
        elif isinstance(func, ast.Attribute):
            if func.attr in NEEDS:
                reads.needs.add(NEEDS[func.attr])
            elif func.attr == "require_drive":
                what = _arg(node, 0)
                reads.needs.add(f"the plugin to read its {what} from the fake hardware" if what else
                                "the plugin to read the fake hardware it is tested on")
            elif func.attr == "require_surface_read":
                surface = _arg(node, 1) or ""
                reads.needs.add(SURFACES.get(surface, surface))
            elif func.attr.startswith("fake_"):
                reads.fake_only.add(func.attr)


def reads_of(check_module: str) -> dict[str, Reads]:
    """Per test function of a suite module: what it needs and reads."""
    module = importlib.import_module(check_module)
    local = _functions(module)
    # Helpers it imports from its suite's shared module count as its own.
    package = check_module.rsplit(".", 1)[0]
    try:
        common = importlib.import_module(package + ".common")
        for name, fn in _functions(common).items():
            local.setdefault(name, fn)
    except ModuleNotFoundError:
        pass
    out = {}
    for name, fn in local.items():
        if name.startswith("test_"):
            reads = Reads()
            _scan(fn, local, reads, set())
            out[name] = reads
    return out


def _marks(check_module: str) -> dict[str, tuple[str, dict]]:
    """check ID -> (test function name, the check's mark kwargs)."""
    module = importlib.import_module(check_module)
    out = {}
    for name, obj in vars(module).items():
        for mark in getattr(obj, "pytestmark", []):
            if mark.name == "fakelet_check":
                out[mark.kwargs["id"]] = (name, mark.kwargs)
    return out


def _kubelets(kind: str, mark: dict, reads: Reads) -> str:
    where = ["fake"]
    if reads.fake_only:
        pass  # it asks the fake kubelet itself for a fault: not exercised on a real one
    elif mark.get("real_kubelet"):
        where.append("real")
    else:
        where.append("real (through the relay)")
    if mark.get("kind"):
        where.append("kind")
    return ", ".join(where)


def _bounds(reads: Reads, upstream: object) -> str:
    return ", ".join(f"{code(b)} ({getattr(upstream, b):g} s)" for b in sorted(reads.bounds)
                     if isinstance(getattr(upstream, b, None), float))


def render() -> str:
    from harness.spec.checks import CHECK_MODULES, SUITES, catalog
    from harness.spec.profiles import PROFILES, UPSTREAM, Profile

    out = header("Check catalog", "harness/spec/checks.py, suites/dp/ and suites/dra/",
                 "Every conformance check, as the suites define it. `fakelet checks` prints the same list on the "
                 "terminal. A **MUST** check that fails makes the run NOT CONFORMANT; a **SHOULD** check's failure is "
                 "reported and does not. Every wait a check makes without a bound of its own is T "
                 "(`reaction_s`, the kubelet's 30 s).")
    out += ["How to read the columns:", "",
            "- **needs**: what the check asks of the world before it can judge: without it the check is "
            "skipped with the reason (the API server, kube-controller-manager), or ends *not exercised* "
            "(the plugin reads no fake hardware, lists no mapped device, has no such surface);",
            "- **bounds**: the timing profile's bounds the check reads (values of the `upstream` profile; "
            "see [bounds](#bounds));",
            "- **kubelets**: *fake* is fakelet's own kubelet; *real* is a real kubelet (`--node real`, "
            "`fakelet fidelity`), judged on what any kubelet shows; *real (through the relay)* reads the real "
            "kubelet's side of the gRPC wire through fakelet's relay; *kind* is a kind cluster "
            "(`--cluster kind`). A check that injects a fault only the fake kubelet can inject is fake only.", ""]
    for kind, package in SUITES.items():
        entries = catalog(package)
        out += [f"## {kind}", ""]
        modules = sorted({CHECK_MODULES[i] for i in entries})
        rows = []
        for module in modules:
            reads = reads_of(module)
            marks = _marks(module)
            for check_id, (fn, kwargs) in sorted(marks.items()):
                level, title = entries[check_id]
                r = reads.get(fn, Reads())
                needs = sorted(r.needs)
                if kwargs.get("cluster_objects"):
                    needs.append("an API server of its own when local (it writes DeviceTaintRules)")
                rows.append([f"**{check_id}**", level, cell(title), code(module.replace(".", "/") + ".py"),
                             cell("; ".join(needs)), _bounds(r, UPSTREAM),
                             _kubelets(kind, kwargs, r)])
        rows.sort(key=lambda row: row[0])
        out += table(["ID", "level", "what", "module", "needs", "bounds", "kubelets"], rows)
    comments = field_comments(Profile)
    out += ["## Bounds", "",
            "The timing profiles (`--profile`, harness/spec/profiles.py). Every bound a plugin is held to is the "
            "kubelet's own in both; `fast` shrinks only the fake kubelet's internal timers and sets a budget "
            "past which an in-bound reaction passes with a *slow* note.", ""]
    names = sorted(PROFILES)
    rows = []
    for f in fields(Profile):
        if f.name == "name":
            continue
        values = [getattr(PROFILES[n], f.name) for n in names]
        rows.append([code(f.name), *(cell("none" if v is None else f"{v:g}" if isinstance(v, float) else v)
                                     for v in values), cell(comments.get(f.name, ""))])
    out += table(["bound", *names, "what"], rows)
    return "\n".join(out).rstrip() + "\n"
