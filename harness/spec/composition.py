"""A composed defect: several of a reference subject's mutants in one plugin, written `a+b[+c]`.

A plugin with two or three independent bugs is what explore's kill rate is measured on (issue 38): each
bug must be reported on its own, not only the first one found. Only mutants compose. A hostile behaviour
bounds its run's wall time alone, and a benign one is judged alone against every check it can touch: in a
composition either would blur what is being measured.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Collection

SEPARATOR = "+"


def parts(defect: str | None) -> tuple[str, ...]:
    """The named defects a (composed) defect switches on; () for none."""
    return tuple(defect.split(SEPARATOR)) if defect else ()


def has(defect: str | None, name: str) -> bool:
    """Whether the named defect is one of `defect`'s parts (all of it, for a single defect)."""
    return name in parts(defect)


def is_composed(defect: str | None) -> bool:
    return defect is not None and SEPARATOR in defect


def composition_error(defect: str, known: Collection[str], composable: Collection[str]) -> str | None:
    """Why `defect` is neither one of `known` nor two or more distinct `composable` ones joined by '+', in
    one line naming the part at fault; None when it is fine."""
    if not is_composed(defect):
        return None if defect in known else f"unknown defect {defect!r}"
    seen: set[str] = set()
    for part in parts(defect):
        if not part:
            return f"defect {defect!r}: an empty part (write a{SEPARATOR}b)"
        if part in seen:
            return f"defect {defect!r}: {part!r} is named twice"
        if part not in known:
            return f"defect {defect!r}: unknown part {part!r}"
        if part not in composable:
            return f"defect {defect!r}: {part!r} is not a mutant, and only mutants compose"
        seen.add(part)
    return None


def argument_type(known: Collection[str], composable: Collection[str]) -> Callable[[str], str]:
    """An argparse `type` for a plugin's --defect: one known defect, or composable ones joined by '+'."""
    def parse(value: str) -> str:
        error = composition_error(value, known, composable)
        if error is not None:
            raise argparse.ArgumentTypeError(error)
        return value
    return parse
