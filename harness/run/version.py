"""`fakelet --version`: the version, the commit and the check catalog's digest, without importing the checks.

The catalog digest a report records (harness/run/provenance.py catalog_facts) imports every suite
module, and with them grpc and the whole harness: a second on an idle machine, for a line a CI log
prints before every run. This reads the same (ID, level, title) triples from the suite modules'
source instead, so `fakelet --version` costs a git call and a parse; tests/test_doctor.py holds the
two digests equal.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
from importlib import metadata
from pathlib import Path
from typing import Any

from harness.spec import bundled
from reports.provenance import catalog_digest, short

SUITES_PACKAGE = "suites"  # every suite package is a sub-package of it (harness/spec/checks.py SUITES)
CHECK_DECORATOR = "check"  # harness/spec/checks.py check(ID, LEVEL, TITLE)
LEVELS = {"MUST": "MUST", "SHOULD": "SHOULD"}  # harness/spec/checks.py MUST and SHOULD, by the names suites use
SOURCE_VERSION = "0+source"  # harness/config/runconfig.py fakelet_version() without installed metadata


def version() -> str:
    # runconfig.fakelet_version says the same, but importing it imports most of the harness.
    try:
        return metadata.version("fakelet")
    except metadata.PackageNotFoundError:
        return SOURCE_VERSION


def suite_modules() -> list[Path]:
    """The modules harness/spec/checks.py catalog() imports: each suite package's own test_*.py."""
    spec = importlib.util.find_spec(SUITES_PACKAGE)  # finds, never runs, suites/__init__.py
    roots = list(spec.submodule_search_locations or []) if spec is not None else []
    return sorted(module for root in roots for package in sorted(Path(root).iterdir())
                  if (package / "__init__.py").is_file() for module in package.glob("test_*.py"))


def _literal(node: ast.expr) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Name):
        return LEVELS.get(node.id)
    return None


def checks_in(source: str) -> list[tuple[str, str, str]]:
    """The (ID, level, title) of every `@check(ID, LEVEL, TITLE, ...)` in a suite module's source."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for deco in node.decorator_list:
            if isinstance(deco, ast.Call) and isinstance(deco.func, ast.Name) and deco.func.id == CHECK_DECORATOR:
                ident, level, title = [*(_literal(arg) for arg in deco.args[:3]), None, None, None][:3]
                if ident and level and title:
                    found.append((ident, level, title))
    return found


def catalog_from_source() -> tuple[str, int]:
    """The catalog's SHA-256 (reports/provenance.py catalog_digest) and its number of checks."""
    entries = [entry for module in suite_modules() for entry in checks_in(module.read_text())]
    return catalog_digest(entries), len(entries)


def commit_text(info: dict[str, object]) -> str:
    """As a report's provenance says it (reports/provenance.py lines): 12 characters, and a dirty tree."""
    commit = info.get("commit")
    if not commit:
        return "commit unknown"
    return f"commit {str(commit)[:12]}" + (", dirty tree" if info.get("dirty") else "")


def version_line() -> str:
    """fakelet 0.1.0 (commit 24ab92a1b2c3, dirty tree, catalog sha256:47f796ff8e8f, 70 checks)"""
    try:
        digest, count = catalog_from_source()
        catalog = f"catalog sha256:{short(digest)}, {count} checks"
    except (OSError, SyntaxError, ValueError) as err:  # a broken install still says its version
        catalog = f"catalog unreadable: {err}"
    return f"fakelet {version()} ({commit_text(bundled.build_info())}, {catalog})"


class VersionAction(argparse.Action):
    """`--version` as argparse's own action, but the line is made only when asked (it runs git)."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        print(version_line())
        parser.exit()
