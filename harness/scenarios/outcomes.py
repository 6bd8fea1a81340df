"""How a scenario step can end besides success, and the pods a scenario makes.

- `Symptom`: an `expect` failed, so the reported bug's symptom appeared (reproduced);
- `Inconclusive`: a step could not run, or a `wait` (a precondition) never held.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

UNEXPECTED_ADMISSION = "UnexpectedAdmissionError"  # kubelet lifecycle/predicate.go: the reason of a failed Allocate


class Symptom(AssertionError):
    """An expectation of the correct behaviour failed: the bug's symptom appeared."""


class Inconclusive(RuntimeError):
    """A step could not be carried out, or a precondition never held: no verdict on the bug."""


@dataclass
class PodRecord:
    """A pod the scenario made, and what became of it.

    Its phase is the node's: a real node's Pod as the API server shows it, the fake DRA kubelet's pod worker.
    Only the fake kubelet's device-plugin pods, which no Pod object backs, have theirs kept here (`phase`,
    `reason`), as that kubelet would set it. How the step that made it ended is `created`, in words that are
    never a phase: a step that gave up on a pod does not make it Failed (a real kubelet may hold it Pending)."""

    name: str
    key: str  # the kubelet's handle: a DP pod's key, a DRA pod's uid ("" when no node ever held it)
    devices: int
    phase: str = "Pending"
    reason: str = ""
    api: dict[str, Any] | None = None  # the Pod object (DRA)
    claims: list[dict[str, Any]] = field(default_factory=list)
    cdi_ids: dict[str, list[str]] = field(default_factory=dict)  # claim uid -> CDI IDs at prepare
    created: str = ""  # when its create step gave up on it: why ("not admitted: ..."); "" when it ran as asked
    options: dict[str, Any] = field(default_factory=dict)  # its create step's grace_period, tolerations, timeout
