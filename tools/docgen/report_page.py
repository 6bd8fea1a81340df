"""docs/reference/report.md: the report's schema, read off reports/model.py and the writers.

Fields and their types come from the `SubjectReport` and `CheckResult` dataclasses, what each means from
reports/fields.py (which also names `summary`'s and `provenance`'s keys); verdicts, statuses, exit codes and
the schema version are the model's constants, what they mean reports/fields.py's words; the files of a
report directory are the names `reports.writers.write_all` writes.
"""

from __future__ import annotations

import ast
import inspect
import re
import typing
from dataclasses import fields

from docgen.markdown import cell, code, first_line, header, table


def _type_name(tp: object) -> str:
    text = tp.__name__ if isinstance(tp, type) else str(tp)
    return re.sub(r"\b(typing|reports\.model)\.", "", text)


def _field_rows(cls: type, prefix: str = "") -> list[list[str]]:
    from reports.fields import FIELDS

    hints = typing.get_type_hints(cls)
    return [[code(f.name), code(_type_name(hints.get(f.name, f.type))), cell(FIELDS.get(prefix + f.name, ""))]
            for f in fields(cls)]


def _key_rows(prefix: str) -> list[list[str]]:
    """The described keys under `prefix` (`summary.`, `provenance.`), as paths below it, in FIELDS' order."""
    from reports.fields import FIELDS

    return [[code(path.removeprefix(prefix)), cell(what)] for path, what in FIELDS.items() if path.startswith(prefix)]


def _written_files() -> list[str]:
    from reports import writers

    tree = ast.parse(inspect.getsource(writers.write_all))
    names = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
             and "." in n.value]
    from reports import html

    html_names = sorted({n for n in re.findall(r'"([\w.-]+\.html)"', inspect.getsource(html))})
    return [*names, *html_names]


def render() -> str:
    from reports import model
    from reports.fields import FIELDS, STATUSES, VERDICTS

    out = header("Report schema", "reports/model.py and reports/writers.py",
                 first_line(model.__doc__) + f" Schema version {code(model.SCHEMA_VERSION)}.")
    out += ["## Files", "",
            "`fakelet run --out DIR` writes, for one subject into `DIR` itself and for several into one directory "
            "per subject:", ""]
    out += [f"- {code(name)}" for name in _written_files()]
    out += ["", "plus `artifacts/<CHECK-ID>/` (the check's timeline and logs) and, for a failing check, "
            "`repro/<CHECK-ID>.yaml` (a scenario that replays it). With several subjects, the top of `DIR` has a "
            "`report.json` and a `summary.md` over all of them.", ""]
    out += ["## Verdicts (one per check)", ""]
    out += table(["verdict", "what"], [[code(v), cell(VERDICTS.get(v, ""))] for v in model.VERDICTS])
    out += ["## Run status and exit code", "", "A run's status is the most severe that applies to any "
            "subject, in this order (`fakelet run`'s exit codes; see the CLI reference for every command's):", ""]
    out += table(["status", "exit code", "when"], [[f"**{s}**", str(model.EXIT_CODES[s]), cell(STATUSES.get(s, ""))]
                                                    for s in model.SEVERITY])
    out += ["## `report.json`: one subject (`SubjectReport`)", "",
            "With several subjects, the top directory's `report.json` holds one of these per subject.", ""]
    out += table(["field", "type", "what"], _field_rows(model.SubjectReport))
    out += ["### `summary`", "", cell(FIELDS["summary"]), ""]
    out += table(["key", "what"], _key_rows("summary."))
    out += ["## One check (`CheckResult`, an entry of `checks`)", ""]
    out += table(["field", "type", "what"], _field_rows(model.CheckResult, "checks[]."))
    out += ["## `provenance`", "", cell(FIELDS["provenance"]) + " A key is absent where it does not apply "
            "(a `binary` for a subject without one, `shards` for a report that was not merged). `a.b` is key `b` "
            "of object `a`; `a[].b` is key `b` of each entry of list `a`.", ""]
    out += table(["key", "what"], _key_rows("provenance."))
    return "\n".join(out).rstrip() + "\n"
