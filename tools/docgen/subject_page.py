"""docs/reference/subject-file.md: the subject-file schema, walked from the validator's own tables.

Fields, types, required keys and allowed values come from harness/spec/subjects.py's SCHEMA; what each field
means, its default and an example, what each placeholder expands to and the cross-field rules in words come
from harness/spec/subject_fields.py (tests/test_subject_fields.py keeps the two in step); limits are the loader's
constants; the bundled subjects are fixtures/subjects/*.yaml as the loader reads them.
"""

from __future__ import annotations

from typing import Any

from docgen.markdown import cell, code, header, returned_strings, table


def _types(spec: Any) -> str:
    from harness.spec.subjects import _expected

    return str(_expected(spec.types))


def _values(spec: Any) -> str:
    """What the schema allows beyond the type: choices, item and key rules, the field's own check."""
    what = []
    if spec.choices:
        what.append("one of " + ", ".join(code(c) for c in spec.choices))
    if spec.items is not None:
        item = spec.items
        what.append("each item " + _types(item) +
                    (" (one of " + ", ".join(code(c) for c in item.choices) + ")" if item.choices else "") +
                    ("; " + "; ".join(returned_strings(item.check)) if item.check else ""))
    if spec.values is not None:
        what.append("each value a mapping with the keys below" if spec.values.keys else
                    "each value " + _types(spec.values))
    if spec.key_check is not None:
        what.append("each key " + "; ".join(returned_strings(spec.key_check)))
    if spec.check is not None:
        what.append("; ".join(returned_strings(spec.check)))
    return "; ".join(what)


def schema_paths(schema: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """(field path, Field) for every field the loader accepts, nested ones after their parent; a free key (a
    defect's name) is NAME."""
    from harness.spec.subject_fields import NAME

    out: list[tuple[str, Any]] = []
    for name, spec in schema.items():
        path = f"{prefix}{name}"
        out.append((path, spec))
        if spec.keys:
            out += schema_paths(spec.keys, path + ".")
        if spec.values is not None and spec.values.keys:
            out += schema_paths(spec.values.keys, f"{path}.{NAME}.")
    return out


def _parents(path: str) -> list[str]:
    """The parent keys a nested field's example sits under, as YAML lines."""
    from harness.spec.subject_fields import NAME

    parents = path.split(".")[:-1]
    return [f"{'  ' * n}{'my-defect' if key == NAME else key}:" for n, key in enumerate(parents)]


def _field_section(path: str, spec: Any) -> list[str]:
    from harness.spec.subject_fields import FIELDS, NAME

    doc = FIELDS[path]
    depth = min(3 + sum(key != NAME for key in path.split(".")[:-1]), 6)  # a defect's NAME is no level of its own
    if spec.required or doc.default.startswith("required"):  # always, or under a rule across fields
        need = f"**{doc.default if not spec.required else 'required'}**"
    else:
        need = f"default: {doc.default or 'none'}"
    facts = [f"*{_types(spec)}*", need]
    values = _values(spec)
    out = ["#" * depth + f" `{path}`", "", " · ".join(facts), "", doc.meaning, ""]
    if values:
        out += [f"Allowed: {values}.", ""]
    if doc.example:
        out += ["```yaml", *_parents(path), doc.example, "```", ""]
    return out


def _placeholder_rows() -> list[list[str]]:
    from harness.spec import subjects
    from harness.spec.subject_fields import PLACEHOLDER_DOCS

    rows = []
    for name, meaning in PLACEHOLDER_DOCS.items():
        if name in subjects.DP_PLACEHOLDERS:
            where = "every subject"
        elif name in subjects.DRA_PLACEHOLDERS:
            where = "DRA drivers"
        elif name == subjects.POD_UID_PLACEHOLDER:
            where = "`rolling_update` of a DRA driver"
        else:
            where = "`device_plugin_beside` of a DRA driver"
        rows.append([code("{" + name + "}"), where, cell(meaning), cell(subjects.EMPTY_OK.get(name, ""))])
    return rows


def render() -> str:
    from harness.spec import subjects
    from harness.spec.subject_fields import MINIMAL_EXAMPLE, RULES

    out = header("Subject-file schema", "harness/spec/subjects.py (SCHEMA, PLACEHOLDERS), "
                 "harness/spec/subject_fields.py and fixtures/subjects/",
                 "A subject file describes one plugin or DRA driver: how to launch it, what it registers, the fake "
                 "hardware it gets. `fakelet run --subject-file PATH` takes one of your own; the bundled ones are "
                 "`fixtures/subjects/*.yaml`. It is validated before anything starts, and every problem names the "
                 "file, line and field (`my.yaml:7: devices: must be a mapping, got str`), with a did-you-mean for "
                 "unknown fields.")
    out += ["## A minimal subject file", "", "```yaml", *MINIMAL_EXAMPLE.splitlines(), "```", "",
            "`fakelet subject check my-plugin.yaml` reports every problem of the file, each with its line and "
            "field, without starting anything.", ""]
    out += ["## Fields", "", "Every field the loader accepts; nested fields under their parent. A field not listed "
            "here is an error.", ""]
    for path, spec in schema_paths(subjects.SCHEMA):
        out += _field_section(path, spec)
    out += ["## Rules across fields", "", "Checked with the fields above; each broken rule is one problem.", ""]
    out += [f"- {rule}" for rule in RULES] + [""]
    out += ["## Placeholders", "",
            "Commands, `defect_args`, `env` values, `mounts` host paths, `rolling_update` and "
            "`device_plugin_beside` entries, `--plugin-cmd` and `--image-arg` are templates: `{name}` is replaced "
            "when the subject starts. An unknown placeholder, or one this run cannot fill (`{bin}` without a "
            "`build` or `--binary`, `{sysfs_root}` without a `backend`), is an error before the run naming the "
            "template; write `{{` and `}}` for literal braces.", ""]
    out += table(["placeholder", "for", "expands to", "may be empty when"], _placeholder_rows())
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
