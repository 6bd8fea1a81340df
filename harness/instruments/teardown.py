"""Teardown that finishes: every step runs, whatever an earlier one raised.

A chain of try/finally blocks stops at the first step that raises inside a
`finally` (an interrupt, a disk that fills while a timeline is written), and
every step after it (the kubelet's sockets, the sandbox) is left behind.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable


def run_all(steps: Iterable[Callable[[], object]]) -> None:
    """Call each step in order; then raise the first exception any of them raised, if one did."""
    first: BaseException | None = None
    for step in steps:
        try:
            step()
        except BaseException as err:  # re-raised below, once the remaining steps ran
            if first is None:
                first = err
    if first is not None:
        raise first
