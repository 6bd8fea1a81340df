"""docs/reference/report.md: the report's schema, read off reports/model.py and the writers.

Fields and their comments come from the `SubjectReport` and `CheckResult` dataclasses; verdicts,
statuses, exit codes and the schema version are the module's constants; the files of a report directory
are the names `reports.writers.write_all` writes.
"""

from __future__ import annotations

import ast
import inspect
import re
import typing
from dataclasses import fields

from docgen.markdown import cell, code, field_comments, first_line, header, table


def _type_name(tp: object) -> str:
    text = tp.__name__ if isinstance(tp, type) else str(tp)
    return re.sub(r"\b(typing|reports\.model)\.", "", text)


def _field_rows(cls: type) -> list[list[str]]:
    comments = field_comments(cls)
    hints = typing.get_type_hints(cls)
    rows = []
    for f in fields(cls):
        rows.append([code(f.name), code(_type_name(hints.get(f.name, f.type))), cell(comments.get(f.name, ""))])
    return rows


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
    out += [f"- {code(v)}" for v in model.VERDICTS]
    out += ["", "## Run status and exit code", "", "A run's status is the most severe that applies to any "
            "subject, in this order:", ""]
    out += table(["status", "exit code"], [[f"**{s}**", str(model.EXIT_CODES[s])] for s in model.SEVERITY])
    out += ["## `report.json`: one subject (`SubjectReport`)", ""]
    out += table(["field", "type", "what"], _field_rows(model.SubjectReport))
    empty = model.SubjectReport(subject="x", profile="fast", seed=0).summary()
    out += [f"`summary` (written beside the fields): {', '.join(code(k) for k in sorted(empty))}.", ""]
    out += ["## One check (`CheckResult`)", ""]
    out += table(["field", "type", "what"], _field_rows(model.CheckResult))
    return "\n".join(out).rstrip() + "\n"
