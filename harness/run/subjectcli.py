"""`fakelet subject check FILE...`: a subject file checked completely before anything runs.

`fakelet run --subject-file` stops at a file's first problem; this reports every problem of every file, each
where it is (`file:line: field: problem`), as `fakelet scenario check` does for scenarios. It starts nothing:
what only a run can tell (the command's program is there, an image pulls, a placeholder this run's flags leave
unfilled) is left to the run.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from harness.config.runconfig import templates
from harness.spec.subjects import (
    BESIDE_PLACEHOLDERS,
    PLACEHOLDERS,
    POD_UID_PLACEHOLDER,
    ProfileError,
    SubjectSpec,
    check_subject_file,
    profile_paths,
    template_fields,
)

EXIT_VALID, EXIT_INVALID = 0, 2  # 2: fakelet's exit code for bad input (docs/reference/cli.md)


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    group = sub.add_parser("subject", help="check subject files before anything runs")
    commands = group.add_subparsers(dest="subject_command", required=True)
    what = ("check subject files completely before anything runs: every problem of each, with its file, line and "
            "field")
    check = commands.add_parser("check", help=what, description=f"{what}. Exit code 0 when every file is valid, "
                                "2 when one is not.")
    check.add_argument("files", nargs="+", metavar="FILE",
                       help="a subject file (or a bundled subject's name, as --subject takes it)")


def subject_path(target: str) -> Path:
    """A file, or a bundled subject by name (anything with a '/' or ending .yaml or .yml is a file)."""
    path = Path(target)
    if path.exists() or path.is_symlink() or "/" in target or target.endswith((".yaml", ".yml")):
        return path
    bundled = profile_paths()
    if target in bundled:
        return bundled[target]
    raise ProfileError(f"{target}: no such file, and no bundled subject of that name "
                       f"(fakelet subjects: {', '.join(bundled) or 'none'})")


def placeholder_problems(spec: SubjectSpec) -> list[str]:
    """Every template's unknown placeholders and malformed braces (the run would stop at the first)."""
    known = set(PLACEHOLDERS[spec.kind])
    problems = []
    for path, template in templates(spec):
        where = spec.where(path)
        extra = {POD_UID_PLACEHOLDER} if path.startswith("rolling_update.") else \
            set(BESIDE_PLACEHOLDERS) if path.startswith("device_plugin_beside.") else set()
        try:
            names = template_fields(template, where)
        except ProfileError as err:
            problems.append(str(err))
            continue
        for name in dict.fromkeys(names):
            if name not in known | extra:
                problems.append(f"{where}: unknown placeholder {{{name}}} in {template!r}; a {spec.kind} subject "
                                f"has {', '.join('{' + k + '}' for k in sorted(known | extra))}")
    return problems


def file_problems(target: str) -> tuple[Path | None, SubjectSpec | None, list[str]]:
    try:
        path = subject_path(target)
    except ProfileError as err:
        return None, None, [str(err)]
    if not path.is_file() and not path.is_symlink():
        return path, None, [f"{target}: {'not a file' if path.exists() else 'no such file'}"]
    spec, problems = check_subject_file(path)
    if spec is not None:
        problems = placeholder_problems(spec)
    return path, spec, problems


def main(args: argparse.Namespace) -> int:
    """Every problem of every file, then one line per file; exit 2 when any file has one."""
    bad = 0
    for target in args.files:
        path, spec, problems = file_problems(target)
        for problem in problems:
            print(problem)
        if problems:
            bad += 1
            print(f"{path or target}: {len(problems)} problem{'s' if len(problems) != 1 else ''}")
        elif spec is not None:
            print(f"{path}: ok: {spec.kind} {spec.name}, launcher {spec.launcher}, "
                  f"{'driver' if spec.is_dra else 'resource'} {spec.resource}")
    return EXIT_INVALID if bad else EXIT_VALID
