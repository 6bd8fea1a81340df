"""Carrying a scenario's steps out against one subject on one node, narrated as they happen.

A `Stage` holds the world of one run: the check environment (sandbox, kubelet,
subject, fake devices, one timeline) and the pods the scenario made. Actions
change the world (kubelet_steps.py, plugin_steps.py, pod_steps.py,
device_steps.py); `wait` and `expect` steps watch it (conditions.py). Every
wait is bounded and wakes on timeline events, never on a timer. How a step can
end besides success is in outcomes.py.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from harness.instruments.interceptors import disarm_call_hooks
from harness.instruments.timeline import WaitTimeout
from harness.node.fake import FakeNode
from harness.node.real.cluster import NotOnRealKubelet
from harness.scenarios.conditions import HOLD_S, Conditions, is_state
from harness.scenarios.device_steps import DeviceSteps
from harness.scenarios.kubelet_steps import KubeletSteps
from harness.scenarios.outcomes import Inconclusive, PodRecord, Symptom
from harness.scenarios.plugin_steps import CRASH_JOIN_S, PluginSteps
from harness.scenarios.pod_steps import PodSteps
from harness.scenarios.state import Crash
from harness.scenarios.step import Step, flow
from harness.scenarios.vocabulary import duration_s
from harness.scenarios.wire_steps import WireSteps
from harness.world.env import DPEnv

__all__ = ["Inconclusive", "PodRecord", "Stage", "Symptom", "check_function"]


class Stage(KubeletSteps, PluginSteps, PodSteps, DeviceSteps, WireSteps):
    def __init__(self, env: DPEnv, say: Callable[[str], None]) -> None:
        self.env, self.say = env, say
        self.began = time.monotonic()
        self.began_ns = env.timeline.now()
        self.step_began_ns = self.began_ns
        self.lines: list[str] = []
        self.pods: dict[str, PodRecord] = {}
        self.retired: list[Any] = []  # plugin instances a rolling update replaced, stopped at close
        self.crashes: list[Crash] = []
        self.held_calls = {}
        self.rejects = []
        self.armed_rejects = []
        self.admissions = []
        self.rules = {}

    # -- narration -------------------------------------------------------------------------------

    def tell(self, text: str) -> None:
        self._told(f"+{time.monotonic() - self.began:7.3f}s  {text}")

    def _told(self, line: str) -> None:
        """A narration line with its time on it already (a story stamps its own): one time to a line."""
        self.lines.append(line)
        self.say(line)

    def pod_phase(self, pod: PodRecord) -> str:
        return Conditions(self).phase_of(pod)

    @property
    def is_dra(self) -> bool:
        return self.env.spec.is_dra

    @property
    def fake(self) -> FakeNode | None:
        return self.env.node if isinstance(self.env.node, FakeNode) else None

    def run(self, step: Step) -> None:
        self._after_crashes()
        self.step_began_ns = self.env.timeline.now()
        handler = getattr(self, f"_do_{step.action}")
        handler(step)

    def close(self) -> None:
        self.release_all()
        self.join_admissions()  # released, they end: none outlives its kubelet
        for hook in disarm_call_hooks(self.env.timeline):
            self.tell(f"the kubelet never sent {hook.method}: the crash armed for it did not happen")
        for crash in self.crashes:
            crash.killer.join(CRASH_JOIN_S)
        for instance in self.retired:
            instance.stop()

    def _do_hold(self, step: Step) -> None:
        if isinstance(step.arg, dict):
            self._hold_call(step)
            return
        seconds = duration_s(step.arg) or 0.0
        self.tell(f"holding {seconds:g}s (a fault's duration, not a sync point)")
        self.env.outage(seconds)

    def _do_story(self, step: Step) -> None:
        from harness.scenarios import taint_eviction

        env = self._dra()
        # Its lines are timed from the scenario's start, as every other step's.
        story = taint_eviction.Story(self._told, began=self.began)
        try:
            notes = taint_eviction.run(env, story, step.options.get("toleration_seconds"))
        except (AssertionError, WaitTimeout) as err:
            raise Symptom(str(err)) from None
        self.lines.extend(notes)

    def _do_check(self, step: Step) -> None:
        """A conformance check run on this stage's environment: its failure is the symptom."""
        import pytest

        check = check_function(step.arg)
        self.tell(f"running check {step.arg}")
        try:
            check(self.env)
        except pytest.skip.Exception as skipped:
            raise Inconclusive(f"{step.arg} did not judge: {skipped.msg}") from None
        except NotOnRealKubelet as err:
            raise Inconclusive(f"{step.arg} did not judge on the real kubelet: {err}") from None
        except (AssertionError, WaitTimeout) as err:
            raise Symptom(f"{step.arg} failed: {err}") from None
        self.tell(f"check {step.arg} passed")

    # -- wait and expect --------------------------------------------------------------------------

    def _default_within(self, step: Step) -> float:
        """A step's `within:`, or the reaction bound, which then runs once a plugin still starting has started
        (a loaded machine starts a process late; `--reaction-bound` is for reactions)."""
        within = duration_s(step.options.get("within"))
        if within:
            return within
        start = self.env.current_start()
        if start is not None and self.env.node.running:  # with no kubelet there is nothing to start up to
            try:
                self.env.wait_started(start.t_ns)
            except WaitTimeout:
                pass  # it never got so far: the step's own wait says what it saw
        return self.env.profile.reaction_s

    def _reached(self, step: Step, within: float) -> tuple[bool, str, str]:
        """(ok, what was seen, how long it had to hold) for a wait or an expect that names no `throughout`: its
        states held for a node-status period, or their first glimpse when the step asks for one."""
        conditions = Conditions(self)
        if step.options.get("glimpse"):
            ok, seen = conditions.wait(step.arg, within)
            held = " (a glimpse counts)"
        else:
            ok, seen = conditions.settle(step.arg, within)
            held = f", held {HOLD_S:g}s" if any(is_state(key, want) for key, want in step.arg.items()) else ""
        if not ok:
            self._no_answer(step, conditions, f"within {within:g}s{held}")
        return ok, seen, held

    @staticmethod
    def _no_answer(step: Step, conditions: Conditions, span: str) -> None:
        """A step that ended on a condition it could not read has no verdict, either way."""
        if conditions.unread:
            raise Inconclusive(f"{flow(step.arg)} could not be judged {span}: {conditions.unread}")

    def _do_wait(self, step: Step) -> None:
        within = self._default_within(step)
        ok, seen, held = self._reached(step, within)
        if not ok:
            raise Inconclusive(f"precondition never held within {within:g}s{held}: {flow(step.arg)}; saw {seen}")
        self.tell(f"ok: {flow(step.arg)} ({seen})")

    def _do_expect(self, step: Step) -> None:
        conditions = Conditions(self)
        if "throughout" in step.options:
            span = duration_s(step.options["throughout"]) or 0.0
            ok, seen = conditions.throughout(step.arg, span)
            if not ok:
                self._no_answer(step, conditions, f"throughout {span:g}s")
                raise Symptom(f"expected {flow(step.arg)} throughout {span:g}s; saw {seen}")
            self.tell(f"held for {span:g}s: {flow(step.arg)} ({seen})")
            return
        within = self._default_within(step)
        ok, seen, held = self._reached(step, within)
        if not ok:
            raise Symptom(f"expected {flow(step.arg)} within {within:g}s{held}; saw {seen}")
        self.tell(f"as expected: {flow(step.arg)} ({seen})")


def check_function(check_id: str) -> Callable[[Any], None]:
    """The function of a conformance check, by ID (its one argument is the check's environment)."""
    import importlib

    from harness.spec.checks import CHECK_MODULES

    module = importlib.import_module(CHECK_MODULES[check_id])
    for value in vars(module).values():
        marks = getattr(value, "pytestmark", [])
        if any(m.name == "fakelet_check" and m.kwargs.get("id") == check_id for m in marks):
            return value
    raise Inconclusive(f"no function for check {check_id}")
