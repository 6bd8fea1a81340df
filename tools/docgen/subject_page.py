"""docs/reference/subject-file.md: the subject-file schema, walked from the validator's own tables.

Fields, types, required keys and allowed values come from harness/spec/subjects.py's SCHEMA; the rules
that span fields are read off `_check_rules` (each condition and the message it gives); placeholders and
limits are the module's constants; the bundled subjects are fixtures/subjects/*.yaml as the loader reads them.
"""

from __future__ import annotations

import ast
import inspect

from docgen.markdown import cell, code, header, returned_strings, table


def _types(spec: object) -> str:
    from harness.spec.subjects import _expected

    return _expected(spec.types)  # type: ignore[attr-defined]


def _rows(schema: dict, prefix: str, rows: list[list[str]]) -> None:
    for name, spec in schema.items():
        path = f"{prefix}{name}"
        what = []
        if spec.choices:
            what.append("one of " + ", ".join(code(c) for c in spec.choices))
        if spec.items is not None:
            item = spec.items
            what.append("each item: " + _types(item) +
                        (" (one of " + ", ".join(code(c) for c in item.choices) + ")" if item.choices else "") +
                        ("; " + "; ".join(returned_strings(item.check)) if item.check else ""))
        if spec.values is not None:
            what.append("values: mappings with the keys below" if spec.values.keys else
                        "values: " + _types(spec.values))
        if spec.key_check is not None:
            what.append("each key " + "; ".join(returned_strings(spec.key_check)))
        if spec.check is not None:
            what.append("; ".join(returned_strings(spec.check)))
        rows.append([code(path), _types(spec), "yes" if spec.required else "", cell("; ".join(what))])
        if spec.keys:
            _rows(spec.keys, path + ".", rows)
        if spec.values is not None and spec.values.keys:
            _rows(spec.values.keys, path + ".NAME.", rows)


def _rules() -> list[list[str]]:
    """Each `errors.add(field, message)` of `_check_rules`, with the condition it sits under."""
    from harness.spec import subjects

    tree = ast.parse(inspect.cleandoc("\n" + inspect.getsource(subjects._check_rules)))
    rows: list[list[str]] = []

    def visit(node: ast.AST, conditions: list[str]) -> None:
        if isinstance(node, ast.If):
            for child in node.body:
                visit(child, [*conditions, ast.unparse(node.test)])
            for child in node.orelse:
                visit(child, [*conditions, f"not ({ast.unparse(node.test)})"])
            return
        if isinstance(node, ast.For):
            for child in node.body:
                visit(child, [*conditions, f"{ast.unparse(node.target)} in {ast.unparse(node.iter)}"])
            return
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) and \
                isinstance(node.value.func, ast.Attribute) and node.value.func.attr == "add":
            field_node, message = node.value.args[0], node.value.args[1]
            where = field_node.value if isinstance(field_node, ast.Constant) else ast.unparse(field_node)
            text = message.value if isinstance(message, ast.Constant) else ast.unparse(message)
            rows.append([code(where or "(the file)"), code(" and ".join(conditions)), cell(text)])
            return
        for child in ast.iter_child_nodes(node):
            visit(child, conditions)

    for statement in tree.body[0].body:  # type: ignore[attr-defined]
        visit(statement, [])
    return rows


def render() -> str:
    from harness.spec import subjects

    out = header("Subject-file schema", "harness/spec/subjects.py (SCHEMA, _check_rules, PLACEHOLDERS) and "
                 "fixtures/subjects/",
                 "A subject file describes one plugin or DRA driver: how to launch it, what it registers, the fake "
                 "hardware it gets. `fakelet run --subject-file PATH` takes one of your own; the bundled ones are "
                 "`fixtures/subjects/*.yaml`. It is validated before anything starts, and every problem names the "
                 "file, line and field (`my.yaml:7: devices: must be a mapping, got str`), with a did-you-mean for "
                 "unknown fields.")
    out += ["## Fields", ""]
    rows: list[list[str]] = []
    _rows(subjects.SCHEMA, "", rows)
    out += table(["field", "type", "required", "values"], rows)
    out += ["## Rules across fields", "",
            "Checked once every field is well formed. `doc` is the file, `launcher` its launcher "
            f"(default {code('process')}), `backend` its backend mapping.", ""]
    out += table(["field", "when", "problem"], _rules())
    out += ["## Placeholders", "",
            "Commands, env values, `--plugin-cmd` and `--image-arg` are templates. An unknown placeholder, or one "
            "this run cannot fill, is an error before the run naming the template (write `{{` and `}}` for "
            "literal braces).", ""]
    kinds = sorted(subjects.PLACEHOLDERS)
    names = sorted({p for k in kinds for p in subjects.PLACEHOLDERS[k]})
    rows = [[code("{" + n + "}"), *("yes" if n in subjects.PLACEHOLDERS[k] else "" for k in kinds),
             cell(subjects.EMPTY_OK.get(n, ""))] for n in names]
    out += table(["placeholder", *kinds, "may render empty when"], rows)
    out += ["## Limits", "", "A subject file is untrusted input; past these it is refused.", ""]
    out += table(["limit", "value"], [
        ["file size", f"{subjects.MAX_YAML_BYTES:,} bytes"],
        ["YAML aliases", f"{subjects.MAX_ALIASES:,}"],
        ["nodes after alias expansion", f"{subjects.MAX_ALIAS_NODES:,}"],
        ["nesting depth", f"{subjects.MAX_DEPTH:,}"],
    ])
    thermal, hysteresis = subjects.DEFAULT_THERMAL
    out += [f"Without `backend.thermal`, a plugin's overtemperature limit is {thermal:g} °C with {hysteresis:g} °C "
            f"hysteresis; health checks heat a device {subjects.OVER_LIMIT_C:g} °C past the limit. Without a "
            f"`backend`, a `--plugin-cmd` gets the `{subjects.DEFAULT_INVENTORY}` inventory with the "
            f"`{subjects.DEFAULT_SKIN}` skin.", ""]
    out += ["## Bundled subjects", "", "`fakelet subjects` lists them with every defect and the checks it fails.", ""]
    rows = []
    for spec in sorted(subjects.all_subjects(), key=lambda s: s.name):
        rows.append([code(spec.name), spec.kind, spec.launcher, cell(spec.resource),
                     str(len(spec.defects)), cell(spec.description.splitlines()[0] if spec.description else "")])
    out += table(["subject", "kind", "launcher", "resource or driver", "defects", "what"], rows)
    return "\n".join(out).rstrip() + "\n"
