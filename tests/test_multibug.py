"""The multi-bug plugins explore's kill rate is measured on (harness/reference/multibug.py): each is a composed
defect its subject accepts, and each bug names an invariant, rules and a check that fit it."""

from __future__ import annotations

import pytest

from harness.explore.model import INVARIANTS
from harness.explore.rules import RULES, applicable, context_of
from harness.reference.multibug import MULTI_BUG, MultiBug
from harness.spec.subjects import load_subject


def test_the_table_has_three_or_four_plugins_on_both_kinds() -> None:
    assert 3 <= len(MULTI_BUG) <= 4
    assert {load_subject(m.subject).kind for m in MULTI_BUG} == {"device-plugin", "dra"}
    assert len({m.defect for m in MULTI_BUG}) == len(MULTI_BUG)


@pytest.mark.parametrize("plugin", MULTI_BUG, ids=[m.defect for m in MULTI_BUG])
def test_each_bug_fits_its_subject(plugin: MultiBug) -> None:
    spec = load_subject(plugin.subject)
    assert spec.defect_error(plugin.defect) is None
    assert 2 <= len(plugin.bugs) <= 3
    assert plugin.invariants() == {b.defect: b.invariant for b in plugin.bugs}
    kind_rules = {r.name for r in applicable(context_of(spec))}
    for bug in plugin.bugs:
        assert spec.defects[bug.defect].wall_s is None  # a mutant, not a hostile behaviour
        assert bug.check in spec.defects[bug.defect].kills, bug
        assert spec.kind in INVARIANTS[bug.invariant].kinds, bug
        assert set(bug.rules) <= set(RULES) and set(bug.rules) <= kind_rules, bug
    # Independent: no two bugs show after the same rules under the same invariant.
    assert len({(b.invariant, b.rules) for b in plugin.bugs}) == len(plugin.bugs)


def test_no_bug_hides_another() -> None:
    # Beside all-unhealthy-on-one, the failure that starts stuck-unhealthy's example already fails.
    for plugin in MULTI_BUG:
        names = {b.defect for b in plugin.bugs}
        assert not {"stuck-unhealthy", "all-unhealthy-on-one"} <= names, plugin.defect
