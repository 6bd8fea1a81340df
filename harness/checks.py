"""What a conformance check is: an ID, a level, a title, and ways to fail clearly.

Suites mark each check with `@check(...)`; the pytest plugin turns outcomes
into verdicts. `expect` states what was expected and what was seen, so every
failing verdict explains itself.
"""

from __future__ import annotations

from typing import Any

import pytest

MUST = "MUST"
SHOULD = "SHOULD"
NOT_APPLICABLE = "not applicable: "


def check(check_id: str, level: str, title: str) -> Any:
    if level not in (MUST, SHOULD):
        raise ValueError(f"{check_id}: level must be MUST or SHOULD")
    return pytest.mark.fakelet_check(id=check_id, level=level, title=title)


def expect(condition: object, expected: str, seen: str) -> None:
    if not condition:
        raise AssertionError(f"expected {expected}; saw {seen}")


def not_applicable(reason: str) -> None:
    """Skip a check whose precondition the subject does not meet (not a failure, not a pass)."""
    pytest.skip(NOT_APPLICABLE + reason)
