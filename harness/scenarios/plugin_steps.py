"""The plugin's steps of a scenario: start, stop, kill, restart, crash (also as the kubelet sends a
named call) and a DaemonSet rolling update."""

from __future__ import annotations

import signal
import threading
from typing import Any

from harness.instruments.interceptors import CallHook, arm_call_hook
from harness.instruments.timeline import Event
from harness.scenarios.outcomes import Inconclusive, Symptom
from harness.scenarios.state import Crash, StageState
from harness.scenarios.step import Step
from harness.scenarios.vocabulary import NO_DEFECT
from harness.spec.subjects import free_port, render
from harness.world.surge import CannotStart, ExitedEarly, NotRegistered, start_beside

CRASH_JOIN_S = 30.0  # a kill and a start of the plugin, at most


class PluginSteps(StageState):
    def _after_crashes(self) -> None:
        """Finish the crashes that fired during the last step: the plugin starts again here, on this
        thread (a child's parent-death signal follows the thread that started it)."""
        fired, self.crashes = self.crashes, []
        for crash in fired:
            # Not before the crashed call has failed: a plugin started again could answer it otherwise.
            crash.ended.wait(CRASH_JOIN_S)
            crash.killer.join(CRASH_JOIN_S)
            self.tell(f"the plugin was killed as the kubelet sent {crash.method}")
            if crash.restart:
                self.env.subject.start()
                self.tell("plugin started again (its DaemonSet restarts it)")

    def _do_plugin(self, step: Step) -> None:
        subject, op = self.env.subject, step.arg
        if op == "start":
            # Always through the environment: its first start makes what the subject needs beside it (the
            # fake hardware's access trace; a DRA driver's Node and the namespace its pods' claims live in),
            # whether or not the subject has fake hardware. Later starts only start the subject.
            self.env.start_subject()
            self.tell(f"plugin started{'' if self.env.node.running else ' (no kubelet.sock yet)'}")
            if self.armed_rejects and self.env.node.running:
                self._after_rejection()  # a rejection armed before the kubelet started, which then had no plugin
        elif op == "stop":
            subject.stop()
            self.tell("plugin stopped (SIGTERM)")
        elif op in ("kill", "crash") and "during" in step.options:
            self._arm_crash(step.options["during"], restart=op == "crash")
        elif op == "kill":
            subject.kill()
            self.tell("plugin killed (SIGKILL: no cleanup)")
        elif op == "restart":
            subject.restart()
            self.tell("plugin restarted (SIGTERM, then started again)")
        elif op == "crash":
            subject.restart(crash=True)
            self.tell("plugin crashed (SIGKILL) and was started again")
        else:
            self._rolling_update(step, self._rendered_args(step))

    def _arm_crash(self, method: str, restart: bool) -> None:
        """SIGKILL the plugin as the kubelet sends its next `method` call (and start it again for a crash):
        the call fails as it does when a plugin dies in mid-call, never with the plugin's answer. Whether
        the plugin had read the request by then is not known; the kubelet cannot tell either."""
        subject = self.env.subject
        crash = Crash(method, restart, threading.Thread(target=subject.kill, name=f"crash-during-{method}",
                                                        daemon=True))

        def fire() -> None:
            # The request waits until the plugin is dead, so even a plugin that answers in microseconds
            # cannot. A sent SIGKILL is not a dead plugin: a contained one dies only once its namespace's
            # PID 1, which the signal reaches, runs again, and on a loaded machine that can be after the
            # plugin answered. Reaping and the cgroup's release run beside the call.
            self.env.timeline.record("fault.crash_during", "harness", method=method, restart=restart)
            subject.signal(signal.SIGKILL)
            self.crashes.append(crash)
            crash.killer.start()
            if subject.wait_exit(CRASH_JOIN_S) is None:
                self.env.timeline.record("fault.crash_late", "harness", method=method, waited_s=CRASH_JOIN_S)

        arm_call_hook(self.env.timeline, CallHook(method, fire, crash.ended.set))
        self.tell(f"armed: the plugin is killed{' and started again' if restart else ''} as the kubelet "
                  f"sends its next {method}")

    def _rendered_args(self, step: Step) -> list[str]:
        """A rolling update's `args:` with their placeholders filled as the subject's own command's were: left
        as text, `{plugins_dir}/{driver}` reached the plugin literally and it wrote under fakelet's working
        directory. The new instance gets a port of its own, as a new pod would."""
        args = list(step.options.get("args", []))
        values = getattr(self.env, "placeholders", None)
        if not values:
            if any(isinstance(a, str) and "{" in a for a in args):
                raise Inconclusive(f"{step.where}: args: this node's subject has no placeholders to fill them with")
            return args
        fresh = {**values, "free_port": str(free_port())}
        return [render(a, fresh, f"{step.where}.args[{n}]") for n, a in enumerate(args)]

    def _new_command(self, step: Step, old_argv: list[str]) -> tuple[list[str], str]:
        """The new instance's command before its `args:`, and how the narration says what it runs as. Without a
        `defect:` it is the old instance's own. With one, it is the subject's command as the run rendered it (the
        same placeholders, so the same sandbox), plus the subject's defect_args for that defect, as `--defect
        NAME` makes a mutant of the first instance; `defect: none`, the subject's command alone: an upgrade from
        a correct plugin to a buggy one, or back."""
        defect = step.options.get("defect")
        if defect is None:
            return old_argv, ""
        spec, values = self.env.spec, getattr(self.env, "placeholders", None)
        if not values:
            raise Inconclusive(f"{step.where}.defect: this node's subject was not started from its subject's "
                               "command, so no mutant of it can be")
        command = [render(a, values, spec.source) for a in spec.command]
        if defect == NO_DEFECT:
            return command, " without a defect"
        if spec.defect_error(defect) is not None or not spec.defect_args:
            raise Inconclusive(f"{step.where}.defect: {defect!r} is not a defect of {spec.name} "
                               f"(known: {', '.join(spec.defects) or 'none'}; mutants compose as a+b)")
        mutant = {**values, "defect": defect}
        return [*command, *(render(a, mutant, spec.source) for a in spec.defect_args)], f" as mutant {defect}"

    def _rolling_update(self, step: Step, args: list[str]) -> None:
        """A DaemonSet update with surge: the new pod (its command plus `args`) starts and registers while
        the old one still serves (harness/world/surge.py); then the old one gets SIGTERM.

        An update that cannot happen (a socket path no address holds, a command that does not start, a new
        instance that exits before it registered) is inconclusive with its own error: the bug was never put to
        the test. A new instance that runs and is never registered is the symptom."""
        env, old = self.env, self.env.subject
        command, as_what = self._new_command(step, old.argv)

        def started() -> None:
            self.tell(f"rolling update: a second plugin instance started beside the first{as_what}"
                      f"{' with ' + ' '.join(args) if args else ''}")

        try:
            start_beside(env, command, args, lambda since, new: self._wait_registration(
                since, "the new instance's registration", new), on_started=started)
        except CannotStart as err:
            where = step.where if err.arg is None else f"{step.where}.args[{err.arg}]"
            raise Inconclusive(f"{where}: {err}") from None
        except ExitedEarly as err:
            raise Inconclusive(f"{step.where}: {err}") from None
        except NotRegistered as err:
            raise Symptom(f"the new instance ran and was not registered: {err}") from None
        self.tell("rolling update: the new instance registered")
        old.stop()
        self.retired.append(old)
        self.tell("rolling update: the old instance stopped (SIGTERM)")

    def _wait_registration(self, since: int, awaiting: str, instance: Any) -> Event:
        if self.is_dra:
            return self.env.wait_dra_registered(since)  # type: ignore[attr-defined]
        if self.fake is None:
            # A real kubelet says so in its log (harness/node/real/localnode.py LOG_EVENTS).
            resource = self.env.spec.resource
            return self.env.timeline.wait_for(
                lambda e: e.kind == "kubelet.connected" and e.get("resource") == resource,
                self.env.profile.reaction_s, awaiting, since, relevant=("kubelet.connected", "kubelet.exit"),
                abort=lambda e: e.kind == "process.exit" and e.get("pid") == instance.pid)
        return self.env.wait_registered(since)
