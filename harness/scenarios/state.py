"""What every kind of scenario step can reach: the Stage's state, declared once for its step mixins."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from harness.node.fake import FakeNode
from harness.scenarios.outcomes import PodRecord
from harness.world.env import DPEnv


class StageState:
    """Declared here, set by Stage (harness/scenarios/stage.py)."""

    env: DPEnv
    began_ns: int  # the timeline when the scenario began: conditions count calls and dials from here
    pods: dict[str, PodRecord]
    retired: list[Any]  # plugin instances a rolling update replaced, stopped at close
    crashes: list[tuple[threading.Thread, bool, str]]  # fired crashes: thread, restart, call
    tell: Callable[[str], None]
    is_dra: bool
    fake: FakeNode | None
