"""Every subject-file field, placeholder and cross-field rule the loader knows has its words in subject_fields.py,
so that the generated reference page (docs/reference/subject-file.md) covers everything a subject file may hold."""

from __future__ import annotations

import ast
import inspect
import sys
from pathlib import Path

import pytest

from harness.spec import subjects
from harness.spec.subject_fields import FIELDS, MINIMAL_EXAMPLE, PLACEHOLDER_DOCS, RULES

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from docgen import subject_page


def test_every_field_the_loader_accepts_is_described() -> None:
    accepted = [path for path, _ in subject_page.schema_paths(subjects.SCHEMA)]
    assert sorted(set(accepted) - set(FIELDS)) == [], "fields without a description in subject_fields.FIELDS"
    assert sorted(set(FIELDS) - set(accepted)) == [], "descriptions of fields the loader does not accept"


@pytest.mark.parametrize("path", sorted(FIELDS))
def test_each_description_has_a_meaning_and_an_example(path: str) -> None:
    doc = FIELDS[path]
    assert doc.meaning.strip() and doc.example.strip()


def test_every_placeholder_is_described() -> None:
    known = {*subjects.DRA_PLACEHOLDERS, subjects.POD_UID_PLACEHOLDER, *subjects.BESIDE_PLACEHOLDERS}
    assert set(PLACEHOLDER_DOCS) == known


def test_every_cross_field_rule_is_in_words() -> None:
    """One sentence per problem `_check_rules` can give: a new rule without its words fails here."""
    tree = ast.parse(inspect.cleandoc("\n" + inspect.getsource(subjects._check_rules)))
    adds = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
            and n.func.attr == "add"]
    assert len(RULES) == len(adds)


def test_the_pages_minimal_example_is_a_valid_subject(tmp_path: Path) -> None:
    path = tmp_path / "my-plugin.yaml"
    path.write_text(MINIMAL_EXAMPLE)
    spec, problems = subjects.check_subject_file(path)
    assert problems == [] and spec is not None


def test_the_page_shows_every_field_and_placeholder() -> None:
    page = subject_page.render()
    for path in FIELDS:
        assert f"# `{path}`" in page
    for name in PLACEHOLDER_DOCS:
        assert f"`{{{name}}}`" in page
    assert "doc.get(" not in page  # rules in words, not Python
