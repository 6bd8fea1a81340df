"""What every kind of scenario step can reach: the Stage's state, declared once for its step mixins."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from harness.node.fake import FakeNode
from harness.scenarios.outcomes import PodRecord
from harness.world.env import DPEnv


@dataclass
class Crash:
    """A plugin crash that fired as the kubelet sent `method` (plugin_steps.py)."""

    method: str
    restart: bool
    killer: threading.Thread  # reaps what the SIGKILL left and releases the cgroup
    ended: threading.Event = field(default_factory=threading.Event)  # the call it crashed has failed


class StageState:
    """Declared here, set by Stage (harness/scenarios/stage.py)."""

    env: DPEnv
    began_ns: int  # the timeline when the scenario began: conditions count calls and dials from here
    step_began_ns: int  # and when the current step began (their `since: step`)
    pods: dict[str, PodRecord]
    retired: list[Any]  # plugin instances a rolling update replaced, stopped at close
    crashes: list[Crash]  # fired, not yet finished
    tell: Callable[[str], None]
    is_dra: bool
    fake: FakeNode | None
    held_calls: dict[str, Any]  # method -> the call `hold` armed (wire_steps.py HeldCall)
    rejects: list[str]  # calls `reject` armed while no kubelet ran: the next kubelet started refuses them
    armed_rejects: list[Any]  # those rejections as armed on the kubelet being started (instruments/faults.py Fault)
    admissions: list[threading.Thread]  # device-plugin pods admitted beside a held Allocate (pod_steps.py)
    rules: dict[str, dict[str, Any]]  # DeviceTaintRules made by taint steps: object name -> what made it

    def pod_phase(self, pod: PodRecord) -> str:
        """The pod's phase as the node reports it, in words (stage.py, through conditions.py)."""
        raise NotImplementedError

    def join_admissions(self) -> None:
        """Wait for the fake kubelet's admissions run beside a held Allocate (pod_steps.py)."""
        raise NotImplementedError

    def start_kubelet(self, keep_sockets: bool = False) -> None:
        """Start the kubelet with the faults armed for it (wire_steps.py)."""
        raise NotImplementedError

    def _after_rejection(self) -> None:
        """Follow up the rejections armed on a kubelet once the plugin can call it (wire_steps.py)."""
        raise NotImplementedError
