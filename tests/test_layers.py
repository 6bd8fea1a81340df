"""The rooms of harness/ and their one-way order (harness/README.md): what import-linter's `layers`
contract checks, plus circles between modules, read from the source with no dependency.

Every import counts, also one inside a function or under TYPE_CHECKING: a lazy import that runs
back up is still a circle someone has to understand.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Top down. A room may import itself and any room below it, never one above. fake_devices is the
# fake hardware beside harness/: subject profiles materialize it, and it records on the timeline.
LAYERS = (
    "harness.run",
    "harness.explore",
    "harness.scenarios",
    "harness.config",
    "harness.world",
    "harness.node",
    "harness.reference",
    "harness.kubelet",
    "harness.controlplane",
    "harness.launch",
    "harness.spec",
    "fake_devices",
    "harness.instruments",
    "harness.wire",
)
SCANNED = ("harness", "fake_devices")


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for top in SCANNED for p in (ROOT / top).rglob("*.py")}


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            for alias in node.names:  # `from harness.launch import cgroups` imports the module
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base)
    return {m for m in found if m.split(".")[0] in SCANNED}


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, set(modules)) for name, path in modules.items()}


def _room(module: str) -> int | None:
    rooms = [i for i, room in enumerate(LAYERS) if module == room or module.startswith(room + ".")]
    return rooms[0] if rooms else None


def test_no_module_is_left_in_the_hall() -> None:
    loose = sorted(p.name for p in (ROOT / "harness").glob("*.py") if p.name != "__init__.py")
    assert loose == [], f"modules directly in harness/ (give each a room): {loose}"


def test_every_module_has_a_room() -> None:
    homeless = sorted(m for m in _modules() if m != "harness" and _room(m) is None)
    assert homeless == [], f"modules in no room of LAYERS: {homeless}"


def test_no_import_runs_back_up() -> None:
    upward = [f"{src} -> {dst} ({LAYERS[_room(dst)]} is above {LAYERS[_room(src)]})"
              for src, targets in _graph().items() if _room(src) is not None
              for dst in sorted(targets) if _room(dst) is not None and _room(dst) < _room(src)]
    assert upward == [], "imports that run back up:\n" + "\n".join(upward)


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph.get(nxt, ())))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def test_the_import_graph_has_no_circle() -> None:
    assert _circles(_graph()) == []


def test_the_circle_finder_finds_one() -> None:
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


@pytest.mark.parametrize("old, new, name", [
    ("harness.env", "harness.world.env", "DPEnv"),
    ("harness.subjects", "harness.spec.subjects", "load_subject"),
    ("harness.profiles", "harness.spec.profiles", "get"),
    ("harness.launchers", "harness.launch.namespace", "NamespaceLauncher"),
    ("harness.reaper", "harness.launch.owners", "claim"),
    ("harness.realnode.localnode", "harness.node.real.localnode", "LocalNode"),
])
def test_old_import_paths_work_for_one_release_and_warn(old: str, new: str, name: str) -> None:
    # A fresh interpreter: the old name must resolve from nothing, as in a user's conftest.
    code = (f"import warnings, importlib; warnings.simplefilter('error', DeprecationWarning)\n"
            f"try:\n    importlib.import_module({old!r})\nexcept DeprecationWarning as w:\n    print(w)\n"
            f"warnings.simplefilter('ignore')\n"
            f"old, new = importlib.import_module({old!r}), importlib.import_module({new!r})\n"
            f"assert getattr(old, {name!r}) is getattr(new, {name!r})\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert " moved to harness." in proc.stdout


def test_old_node_names_still_resolve() -> None:
    import harness.node
    from harness.node.fake import FakeNode

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert harness.node.__getattr__("FakeNode") is FakeNode
    assert any(issubclass(w.category, DeprecationWarning) for w in caught)
