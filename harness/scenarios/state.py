"""What every kind of scenario step can reach: the Stage's state, declared once for its step mixins."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from harness.env import DPEnv
from harness.node import FakeNode
from harness.scenarios.outcomes import PodRecord


class StageState:
    """Declared here, set by Stage (harness/scenarios/stage.py)."""

    env: DPEnv
    pods: dict[str, PodRecord]
    retired: list[Any]  # plugin instances a rolling update replaced, stopped at close
    crashes: list[tuple[threading.Thread, bool, str]]  # fired crashes: thread, restart, call
    tell: Callable[[str], None]
    is_dra: bool
    fake: FakeNode | None
