"""docs/reference/checks.md: the check catalog, read off the suites themselves.

ID, level and title come from each check's `@check(...)` (harness/spec/checks.py's CATALOG). What a
check needs, the bounds it reads and the kubelets that can judge it are read off its source: the calls
it makes (directly or through helpers of its own module and suites/dra/common.py) to the environment's
`need_*` / `require_*` methods, the `profile.*` bounds it names, its `real_kubelet=` / `kind=` marks,
and whether it asks for the fake kubelet itself (`env.fake_*`, which a real kubelet cannot answer). The
named suites (`fakelet run --suite kep5970`) are there too, as `fakelet checks` lists them. Each check gets a
heading of its own (its anchor), under its area's heading and short table: the page fits a narrow screen.
"""

from __future__ import annotations

import ast
import importlib
import inspect
from dataclasses import dataclass, field, fields

from docgen.markdown import cell, code, field_comments, first_line, header, table

# What each environment method a check calls says it needs (harness/world/env.py, draenv.py).
NEEDS = {
    "need_api": "API server",
    "need_controllers": "kube-controller-manager",
    "need_devices": "a listed device mapped to the fake hardware",
}
# A named suite (`fakelet run --suite NAME`) judges through the Kubernetes API only: what it needs and where
# it runs is the suite's, not read off each check (harness/config/runconfig.py check_suite refuses the fake node;
# harness/run/pytest_plugin.py's kep_world fixture builds its world).
NAMED_SUITE_NEEDS = {"kep5970": ["an API server: the local one beside the real kubelet, or the live cluster's"]}
NAMED_SUITE_KUBELETS = {"kep5970": "real (`--node real`), a live cluster (`--cluster kubeconfig:PATH`); never fake: "
                                   "its checks judge what a kubelet does with real pods"}
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


def _kubelets(suite: str, mark: dict, reads: Reads) -> str:
    if suite in NAMED_SUITE_KUBELETS:
        return NAMED_SUITE_KUBELETS[suite]
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


def _area(check_id: str) -> str:
    return check_id.rsplit("-", 1)[0]


def _area_text(area: str, modules: list[str]) -> str:
    """What an area is about: the opening paragraph of its suite module's docstring, less the area's name."""
    docs = [first_line(importlib.import_module(m).__doc__) for m in modules]
    own = [d for d in docs if d.startswith(area + ":")] or [d for d in docs if d]
    text = own[0].split(": ", 1)[-1] if own else ""
    # A sentence's start, except where it opens with a name spelled in lower case (kubernetes/enhancements#5970).
    return text[:1].upper() + text[1:] if "/" not in text.split(" ", 1)[0] else text


@dataclass
class Entry:
    """One check as the page shows it."""

    check_id: str
    level: str
    title: str
    module: str
    needs: list[str]
    bounds: str
    kubelets: str


def _entries(suite: str, package: str) -> list[Entry]:
    from harness.spec.checks import CHECK_MODULES, catalog
    from harness.spec.profiles import UPSTREAM

    entries = catalog(package)
    out = []
    for module in sorted({CHECK_MODULES[i] for i in entries}):
        reads = reads_of(module)
        for check_id, (fn, kwargs) in sorted(_marks(module).items()):
            level, title = entries[check_id]
            r = reads.get(fn, Reads())
            needs = [*NAMED_SUITE_NEEDS.get(suite, []), *sorted(r.needs)]
            if kwargs.get("cluster_objects"):
                needs.append("an API server of its own when local (it writes DeviceTaintRules)")
            out.append(Entry(check_id, level, title, module, needs, _bounds(r, UPSTREAM),
                             _kubelets(suite, kwargs, r)))
    return sorted(out, key=lambda e: e.check_id)


def _suites() -> list[tuple[str, str, str]]:
    """(heading, package, key) per suite, in `fakelet checks`' order: the kinds' own, then the named ones."""
    from harness.spec.checks import NAMED_SUITES, SUITES

    return [*((kind, package, kind) for kind, package in SUITES.items()),
            *((f"{kind} ({name})", package, name) for name, (kind, package) in NAMED_SUITES.items())]


def _check_block(e: Entry) -> list[str]:
    # The heading is the ID alone: mkdocs' toc slugifies it to the ID in lower case (DP-REG-01 -> dp-reg-01),
    # an anchor that stays put when a title is reworded.
    return [f"#### {e.check_id}", "", f"**{e.level}**: {cell(e.title)}", "",
            f"- **module**: {code(e.module.replace('.', '/') + '.py')}",
            f"- **needs**: {cell('; '.join(e.needs)) or 'nothing beyond the running subject'}",
            f"- **bounds**: {e.bounds or 'none of its own'}",
            f"- **kubelets**: {e.kubelets}", ""]


def _suite_section(heading: str, package: str, suite: str) -> list[str]:
    entries = _entries(suite, package)
    out = [f"## {heading}", ""]
    areas: dict[str, list[Entry]] = {}
    for e in entries:
        areas.setdefault(_area(e.check_id), []).append(e)
    for area, members in areas.items():
        out += [f"### {area}", ""]
        about = _area_text(area, sorted({e.module for e in members}))
        if about:
            out += [cell(about), ""]
        out += table(["ID", "level", "what"],
                     [[f"[{e.check_id}](#{e.check_id.lower()})", e.level, cell(e.title)] for e in members])
        for e in members:
            out += _check_block(e)
    return out


def _bounds_section() -> list[str]:
    from harness.spec.profiles import PROFILES, Profile

    comments = field_comments(Profile)
    out = ["## Bounds", "",
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
    return out + table(["bound", *names, "what"], rows)


def render() -> str:
    out = header("Check catalog", "harness/spec/checks.py, suites/dp/, suites/dra/ and suites/kep5970/",
                 "Every conformance check, as the suites define it. `fakelet checks` prints the same list on the "
                 "terminal. A **MUST** check that fails makes the run NOT CONFORMANT; a **SHOULD** check's failure is "
                 "reported and does not. Every wait a check makes without a bound of its own is T "
                 "(`reaction_s`, the kubelet's 30 s).")
    out += ["Checks are grouped by suite, then by area (the ID less its number). Each area has a table of its "
            "checks; each check has an anchor of its own, its ID in lower case (`#dp-reg-01`), and these facts:",
            "",
            "- **module**: the suite module that defines it;",
            "- **needs**: what the check asks of the world before it can judge: without it the check is "
            "skipped with the reason (the API server, kube-controller-manager), or ends *not exercised* "
            "(the plugin reads no fake hardware, lists no mapped device, has no such surface);",
            "- **bounds**: the timing profile's bounds the check reads (values of the `upstream` profile; "
            "see [bounds](#bounds));",
            "- **kubelets**: *fake* is fakelet's own kubelet; *real* is a real kubelet (`--node real`, "
            "`fakelet fidelity`), judged on what any kubelet shows; *real (through the relay)* reads the real "
            "kubelet's side of the gRPC wire through fakelet's relay; *kind* is a kind cluster "
            "(`--cluster kind`); *a live cluster* is one where the driver is installed (`--cluster kubeconfig:PATH`, "
            "the KEP-5970 suite only). A check that injects a fault only the fake kubelet can inject is fake only.", ""]
    for heading, package, suite in _suites():
        out += _suite_section(heading, package, suite)
    out += _bounds_section()
    return "\n".join(out).rstrip() + "\n"
