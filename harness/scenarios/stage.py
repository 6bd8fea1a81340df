"""Carrying a scenario's steps out against one subject on one node, narrated as they happen.

A `Stage` holds the world of one run: the check environment (sandbox, kubelet,
subject, fake devices, one timeline) and the pods the scenario made. Actions
change the world; `wait` and `expect` steps watch it. Every wait is bounded
and wakes on timeline events, never on a timer.

Three ways a step ends besides success, and what they mean for the verdict:
- `Symptom`: an `expect` failed, so the reported bug's symptom appeared (reproduced);
- `Inconclusive`: a step could not run, or a `wait` (a precondition) never held;
- anything else is fakelet's own error.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from fake_devices.scripts import ecc_burst, flap, run_script, temperature_ramp, unplug_replug
from harness.env import DPEnv
from harness.interceptors import CallHook, arm_call_hook, disarm_call_hooks
from harness.kubelet import checkpoint as dp_checkpoint
from harness.kubelet import dracheckpoint
from harness.node import AdmissionError, FakeNode
from harness.scenarios.schema import Step
from harness.scenarios.vocabulary import duration_s
from harness.timeline import Event, WaitTimeout

CRASH_JOIN_S = 30.0  # a kill and a start of the plugin, at most
CORRUPT_CHECKPOINT = b"{not a checkpoint"  # what a half-written file looks like to the kubelet's JSON decoder
UNEXPECTED_ADMISSION = "UnexpectedAdmissionError"  # kubelet lifecycle/predicate.go: the reason of a failed Allocate


class Symptom(AssertionError):
    """An expectation of the correct behaviour failed: the bug's symptom appeared."""


class Inconclusive(RuntimeError):
    """A step could not be carried out, or a precondition never held: no verdict on the bug."""


@dataclass
class PodRecord:
    """A pod the scenario made, and what became of it."""

    name: str
    key: str  # the kubelet's handle: a DP pod's key, a DRA pod's uid
    devices: int
    phase: str = "Pending"
    reason: str = ""
    api: dict[str, Any] | None = None  # the Pod object (DRA)
    claims: list[dict[str, Any]] = field(default_factory=list)
    cdi_ids: dict[str, list[str]] = field(default_factory=dict)  # claim uid -> CDI IDs at prepare


class Stage:
    def __init__(self, env: DPEnv, say: Callable[[str], None]) -> None:
        self.env, self.say = env, say
        self.began = time.monotonic()
        self.began_ns = env.timeline.now()
        self.lines: list[str] = []
        self.pods: dict[str, PodRecord] = {}
        self.retired: list[Any] = []  # plugin instances a rolling update replaced, stopped at close
        self.measured: dict[str, float] = {}
        self.crashes: list[tuple[threading.Thread, bool, str]] = []  # fired crashes: thread, restart, call

    # -- narration -------------------------------------------------------------------------------

    def tell(self, text: str) -> None:
        line = f"+{time.monotonic() - self.began:7.3f}s  {text}"
        self.lines.append(line)
        self.say(line)

    @property
    def is_dra(self) -> bool:
        return self.env.spec.is_dra

    @property
    def fake(self) -> FakeNode | None:
        return self.env.node if isinstance(self.env.node, FakeNode) else None

    def run(self, step: Step) -> None:
        self._after_crashes()
        handler = getattr(self, f"_do_{step.action}")
        handler(step)

    def _after_crashes(self) -> None:
        """Finish the crashes that fired during the last step: the plugin starts again here, on this
        thread (a child's parent-death signal follows the thread that started it)."""
        fired, self.crashes = self.crashes, []
        for thread, restart, method in fired:
            thread.join(CRASH_JOIN_S)
            self.tell(f"the plugin was killed as the kubelet sent {method}")
            if restart:
                self.env.subject.start()
                self.tell("plugin started again (its DaemonSet restarts it)")

    def close(self) -> None:
        for hook in disarm_call_hooks(self.env.timeline):
            self.tell(f"the kubelet never sent {hook.method}: the crash armed for it did not happen")
        for thread, _, _ in self.crashes:
            thread.join(CRASH_JOIN_S)
        for instance in self.retired:
            instance.stop()

    # -- the kubelet -------------------------------------------------------------------------------

    def _do_kubelet(self, step: Step) -> None:
        op, fault = step.arg, step.options.get("checkpoint")
        node = self.env.node
        if op == "stop":
            node.stop_kubelet()
            self.tell("kubelet stopped (its sockets stay behind, as a real kubelet's do)")
            return
        if op == "reboot":
            self._reboot(fault)
            return
        if op in ("restart", "restart-keep-sockets"):
            node.stop_kubelet()
        if fault:
            self._checkpoint_fault(fault)
        if op == "restart-keep-sockets":
            if self.fake is None:
                raise Inconclusive("a kubelet that keeps the plugin sockets needs the fake kubelet")
            self.fake.start_kubelet(arm=lambda m: setattr(m, "keep_sockets", True))
        else:
            node.start_kubelet()
        what = {"start": "started", "restart": "restarted (the new instance deleted the plugin sockets)",
                "restart-keep-sockets": "restarted, keeping the plugin sockets"}[op]
        self.tell(f"kubelet {what}{f' with its checkpoint {fault}' if fault else ''}")
        self._readmit()
        self._admit_pending()

    def _checkpoint_fault(self, fault: str) -> None:
        paths = [self.env.sandbox.plugin_dir / dp_checkpoint.CHECKPOINT_NAME]
        if self.is_dra:
            paths.append(self.env.sandbox.state_dir / dracheckpoint.CHECKPOINT_NAME)
        for path in paths:
            if fault == "lost":
                path.unlink(missing_ok=True)
            elif path.exists():
                path.write_bytes(CORRUPT_CHECKPOINT)
        self.env.timeline.record("fault.checkpoint", "harness", fault=fault, files=[p.name for p in paths])

    def _reboot(self, fault: str | None) -> None:
        """Power off and on: everything stops, tmpfs paths (/run, /var/run/cdi, every socket) are wiped,
        /var/lib/kubelet and the plugin's own state stay; the kubelet boots, then the plugin's pod."""
        env = self.env
        env.timeline.record("fault.reboot", "harness")
        env.subject.stop()
        for instance in self.retired:
            instance.stop()
        env.node.stop_kubelet()
        wiped = _wipe_sockets(env.sandbox.path)
        if self.is_dra:
            wiped += _wipe_dir(env.sandbox.cdi_dir)
        if fault:
            self._checkpoint_fault(fault)
        self.tell(f"node rebooted: plugin and kubelet stopped, {len(wiped)} socket(s) and CDI file(s) wiped"
                  f"{f', the kubelet checkpoint {fault}' if fault else ''}")
        env.node.start_kubelet()
        self.tell("kubelet started (boot)")
        self._readmit()
        self._admit_pending()
        env.subject.start()
        self.tell("plugin started (its DaemonSet pod, after the kubelet)")

    def _readmit(self) -> None:
        """A starting kubelet admits the pods already bound to its node again (kubelet.go HandlePodAdditions).

        On the fake kubelet the scenario's running pods go through admission again: an allocation
        the checkpoint holds is reused; one it lost needs the plugin, and without it the pod fails
        with UnexpectedAdmissionError, as upstream's does. A real kubelet does this on its own."""
        fake = self.fake
        if fake is None or self.is_dra or fake.manager is None:
            return
        for pod in self.pods.values():
            if pod.phase != "Running":
                continue
            try:
                fake.admit_pod(pod.key, {self.env.spec.resource: pod.devices})
            except AdmissionError as err:
                pod.phase, pod.reason = "Failed", f"{UNEXPECTED_ADMISSION}: {err}"
                self.tell(f"pod {pod.name} re-admitted by the new kubelet: Failed, {pod.reason}")
            else:
                self.tell(f"pod {pod.name} re-admitted by the new kubelet: still Running")

    # -- the plugin ---------------------------------------------------------------------------------

    def _do_plugin(self, step: Step) -> None:
        subject, op = self.env.subject, step.arg
        if op == "start":
            if self.env.devices is not None and self.env.access is None:
                self.env.start_subject()
            else:
                subject.start()
            self.tell(f"plugin started{'' if self.env.node.running else ' (no kubelet.sock yet)'}")
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
            self._rolling_update(list(step.options.get("args", [])))

    def _arm_crash(self, method: str, restart: bool) -> None:
        """SIGKILL the plugin as the kubelet sends its next `method` call (and start it again for a crash):
        the call fails as it does when a plugin dies in mid-call. Whether the plugin had read the request
        by then is not known; the kubelet cannot tell either."""
        subject = self.env.subject

        def crash() -> None:
            self.env.timeline.record("fault.crash_during", "harness", method=method, restart=restart)
            subject.kill()

        def fire() -> None:
            # Off the calling thread: the kubelet's call goes out while the plugin dies.
            thread = threading.Thread(target=crash, name=f"crash-during-{method}", daemon=True)
            self.crashes.append((thread, restart, method))
            thread.start()

        arm_call_hook(self.env.timeline, CallHook(method, fire))
        self.tell(f"armed: the plugin is killed{' and started again' if restart else ''} as the kubelet "
                  f"sends its next {method}")

    def _rolling_update(self, args: list[str]) -> None:
        """A DaemonSet update with surge: the new pod (its command plus `args`) starts and registers while
        the old one still serves; then the old one gets SIGTERM."""
        env, old = self.env, self.env.subject
        twin = getattr(old, "twin", None)
        if twin is None:
            raise Inconclusive(f"a rolling update needs a second instance; the {type(old).__name__} has none")
        since = env.now()
        new = twin()
        new.argv = [*new.argv, *args]
        new.start()
        self.tell(f"rolling update: a second plugin instance started beside the first"
                  f"{' with ' + ' '.join(args) if args else ''}")
        try:
            self._wait_registration(since, "the new instance's registration")
        except WaitTimeout as err:
            new.stop()
            raise Symptom(str(err)) from None
        self.tell("rolling update: the new instance registered")
        old.stop()
        env.subject = new
        self.retired.append(old)
        self.tell("rolling update: the old instance stopped (SIGTERM)")

    def _wait_registration(self, since: int, awaiting: str) -> Event:
        if self.is_dra:
            return self.env.wait_dra_registered(since)  # type: ignore[attr-defined]
        if self.fake is None:
            # A real kubelet says so in its log (harness/realnode/localnode.py LOG_EVENTS).
            resource = self.env.spec.resource
            return self.env.timeline.wait_for(
                lambda e: e.kind == "kubelet.connected" and e.get("resource") == resource,
                self.env.profile.reaction_s, awaiting, since, relevant=("kubelet.connected", "kubelet.exit"))
        return self.env.wait_registered(since)

    # -- pods ----------------------------------------------------------------------------------------

    def _do_pod(self, step: Step) -> None:
        arg = step.arg
        if "delete" in arg:
            self._delete_pod(arg["delete"])
            return
        name, count = arg["create"], arg.get("devices", 1)
        if name in self.pods:
            raise Inconclusive(f"pod {name} exists already in this scenario")
        if self.is_dra:
            self._create_dra_pod(name, count)
            return
        pod = self.pods[name] = PodRecord(name, f"{name}-{self.env.seed}", count)
        if not self.env.node.running:
            self.tell(f"pod {name} ({count} {self.env.spec.resource}) bound while the kubelet is down: pending")
            pod.phase = "Admit"  # admitted when a kubelet starts
            return
        self._admit(pod)

    def _admit(self, pod: PodRecord) -> None:
        try:
            given = self.env.node.admit_pod(pod.key, {self.env.spec.resource: pod.devices})
            self.env.node.start_pod(pod.key)
        except AdmissionError as err:
            pod.phase, pod.reason = "Failed", f"{UNEXPECTED_ADMISSION}: {err}"
            self.tell(f"pod {pod.name}: Failed, {pod.reason}")
            return
        pod.phase = "Running"
        devices = [d for a in given for d in a.device_ids]
        self.tell(f"pod {pod.name} running with {', '.join(devices) or 'no devices'}")

    def _create_dra_pod(self, name: str, count: int) -> None:
        from harness.controlplane.scheduler import PodClaim
        from harness.draenv import DRAEnv

        env = self.env
        assert isinstance(env, DRAEnv)
        running = env.node.running
        try:
            api, claims = env.run_pod([PodClaim("gpu", count)], name, wait=running)
        except (AssertionError, WaitTimeout) as err:
            self.pods[name] = PodRecord(name, "", count, "Failed", str(err).splitlines()[0])
            self.tell(f"pod {name}: did not run: {str(err).splitlines()[0]}")
            return
        pod = PodRecord(name, api["metadata"]["uid"], count, "Running" if running else "Pending", api=api,
                        claims=claims)
        self.pods[name] = pod
        devices = [d for c in claims for _, d in env.allocated_devices(c, env.driver)]
        if not running:
            self.tell(f"pod {api['metadata']['name']} scheduled on {', '.join(devices)} while the kubelet is down")
            return
        self.remember_cdi(pod)
        self.tell(f"pod {api['metadata']['name']} running with claim(s) on {', '.join(devices)}")

    def remember_cdi(self, pod: PodRecord) -> None:
        """The CDI IDs the kubelet holds for the pod's prepared claims (kept: they outlive the claim cache)."""
        from harness.draenv import DRAEnv

        assert isinstance(self.env, DRAEnv)
        for claim in pod.claims:
            ids = self.env.prepared_cdi_ids(claim)
            if ids:
                pod.cdi_ids[claim["metadata"]["uid"]] = ids

    def _delete_pod(self, name: str) -> None:
        pod = self._pod(name)
        if self.is_dra:
            from harness.draenv import DRAEnv

            assert isinstance(self.env, DRAEnv) and pod.api is not None
            since = self.env.now()
            self.env.delete_pod(pod.api)
            self.env.wait_pod("pod.deleted", pod.api, since, f"the kubelet to finish pod {name}'s deletion",
                              self.env.profile.reaction_s + self.env.profile.dra_call_timeout_s)
        else:
            self.env.node.delete_pod(pod.key)
        pod.phase = "Deleted"
        self.tell(f"pod {name} deleted")

    def _pod(self, name: str) -> PodRecord:
        if name not in self.pods:
            raise Inconclusive(f"no pod {name} in this scenario (create it first)")
        return self.pods[name]

    def _admit_pending(self) -> None:
        for pod in self.pods.values():
            if pod.phase == "Admit" and self.env.node.running:
                self._admit(pod)

    # -- devices, scripts, taints ---------------------------------------------------------------

    def device(self, ref: str) -> str:
        """An inventory device ID from DEV: an ID, @N, or @pod:NAME."""
        env = self.env
        ids = [d.id for d in env.devices.devices()] if env.devices is not None else \
            [d["id"] for d in env.inventory or []]
        if ref.startswith("@pod:"):
            return self._pod_device(ref[5:])
        if ref.startswith("@"):
            n = int(ref[1:])
            if n >= len(ids):
                raise Inconclusive(f"{ref}: the inventory has {len(ids)} device(s)")
            return ids[n]
        if ref not in ids:
            raise Inconclusive(f"no device {ref} in the inventory ({', '.join(ids)})")
        return ref

    def _pod_device(self, name: str) -> str:
        pod = self._pod(name)
        if self.is_dra:
            from harness.draenv import DRAEnv

            assert isinstance(self.env, DRAEnv)
            for claim in pod.claims:
                for _, device in self.env.allocated_devices(claim, self.env.driver):
                    return device
            raise Inconclusive(f"pod {name} holds no device")
        devices = [d for ds in self.env.node.pod_devices(pod.key).values() for d in ds]
        if not devices:
            raise Inconclusive(f"pod {name} holds no device")
        pairs = self.env.mapping.pairs
        return pairs.get(devices[0], devices[0])

    def _backend(self) -> Any:
        if self.env.devices is None:
            raise Inconclusive("this subject has no fake hardware (give it an inventory with a backend)")
        return self.env.devices

    def _do_device(self, step: Step) -> None:
        arg = dict(step.arg)
        backend = self._backend()
        op = next(k for k in arg if k not in ("to", "count", "code"))
        if op in ("nvml-init-error", "nvml-wait-error"):
            code = int(arg[op])
            try:
                getattr(backend, op.replace("-", "_"))(code)
            except ValueError as err:
                raise Inconclusive(str(err)) from None
            self.tell(f"NVML {op[5:]} now answers {code}{' (works again)' if code == 0 else ''}")
            return
        device = self.device(arg[op])
        value = arg.get("to", arg.get("count", arg.get("code")))
        try:
            backend.apply(op, device, value)
        except ValueError as err:
            raise Inconclusive(f"device {op} {device}: {err}") from None
        self.tell(f"device {device}: {op}{f' {value:g}' if isinstance(value, int | float) else ''}")

    def _do_script(self, step: Step) -> None:
        arg = step.arg
        name = next(k for k in arg if k in ("flap", "ramp", "unplug-replug", "ecc-burst"))
        device = self.device(arg[name])
        if name == "flap":
            steps = flap(device, duration_s(arg["period"]) or 0, arg["cycles"])
        elif name == "ramp":
            steps = temperature_ramp(device, arg["from"], arg["to"], arg["step"], duration_s(arg["period"]) or 0)
        elif name == "unplug-replug":
            steps = unplug_replug(device, duration_s(arg["down"]) or 0)
        else:
            steps = ecc_burst(device, arg["count"], duration_s(arg["period"]) or 0)
        self.tell(f"fault script {name} on {device}: {len(steps)} change(s) over {steps[-1].at_s:g}s")
        run_script(self._backend(), steps, self.env.stop_scripts)
        self.tell(f"fault script {name} done")

    def _do_taint(self, step: Step) -> None:
        env = self._dra()
        device = self.device(step.arg["device"])
        assert env.taint_rules is not None
        pool = self._pool_of(device)
        effect = step.arg.get("effect", "NoExecute")
        key = step.arg.get("key", "fakelet.example.com/scenario")
        rule = env.taint_rules.add(f"{env.node_name}-{device}", {"key": key, "effect": effect},
                                   driver=env.driver, pool=pool, device=device)
        self.tell(f"DeviceTaintRule {rule['metadata']['name']} taints {device} {key}:{effect}")

    def _do_untaint(self, step: Step) -> None:
        env = self._dra()
        device = self.device(step.arg["device"])
        assert env.taint_rules is not None
        env.taint_rules.remove(f"{env.node_name}-{device}")
        self.tell(f"DeviceTaintRule on {device} removed")

    def _dra(self) -> Any:
        from harness.draenv import DRAEnv

        env = self.env
        if not isinstance(env, DRAEnv) or env.taint_rules is None:
            raise Inconclusive("taints need a DRA driver and an API server")
        return env

    def _pool_of(self, device: str) -> str:
        env = self._dra()
        for s in env.slices():
            for d in (s.get("spec") or {}).get("devices") or []:
                if d.get("name") == device:
                    return str(((s.get("spec") or {}).get("pool") or {}).get("name", ""))
        return env.node_name

    def _do_hold(self, step: Step) -> None:
        seconds = duration_s(step.arg) or 0.0
        self.tell(f"holding {seconds:g}s (a fault's duration, not a sync point)")
        self.env.outage(seconds)

    def _do_story(self, step: Step) -> None:
        from harness.scenarios import taint_eviction

        env = self._dra()
        story = taint_eviction.Story(self.tell)
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
        except (AssertionError, WaitTimeout) as err:
            raise Symptom(f"{step.arg} failed: {err}") from None
        self.tell(f"check {step.arg} passed")

    # -- wait and expect --------------------------------------------------------------------------

    def _do_wait(self, step: Step) -> None:
        from harness.scenarios.conditions import Conditions

        within = duration_s(step.options.get("within")) or self.env.profile.reaction_s
        ok, seen = Conditions(self).wait(step.arg, within)
        if not ok:
            raise Inconclusive(f"precondition never held within {within:g}s: {_show(step.arg)}; saw {seen}")
        self.tell(f"ok: {_show(step.arg)} ({seen})")

    def _do_expect(self, step: Step) -> None:
        from harness.scenarios.conditions import Conditions

        conditions = Conditions(self)
        if "throughout" in step.options:
            span = duration_s(step.options["throughout"]) or 0.0
            ok, seen = conditions.throughout(step.arg, span)
            if not ok:
                raise Symptom(f"expected {_show(step.arg)} throughout {span:g}s; saw {seen}")
            self.tell(f"held for {span:g}s: {_show(step.arg)} ({seen})")
            return
        within = duration_s(step.options.get("within")) or self.env.profile.reaction_s
        ok, seen = conditions.wait(step.arg, within)
        if not ok:
            raise Symptom(f"expected {_show(step.arg)} within {within:g}s; saw {seen}")
        self.tell(f"as expected: {_show(step.arg)} ({seen})")


def check_function(check_id: str) -> Callable[[Any], None]:
    """The function of a conformance check, by ID (its one argument is the check's environment)."""
    import importlib

    from harness.checks import CHECK_MODULES

    module = importlib.import_module(CHECK_MODULES[check_id])
    for value in vars(module).values():
        marks = getattr(value, "pytestmark", [])
        if any(m.name == "fakelet_check" and m.kwargs.get("id") == check_id for m in marks):
            return value
    raise Inconclusive(f"no function for check {check_id}")


def _show(conditions: dict[str, Any]) -> str:
    """Conditions as the scenario file wrote them (YAML flow style)."""
    return yaml.safe_dump(conditions, default_flow_style=True, sort_keys=False, width=1000).strip()[1:-1]


def _wipe_sockets(root: Path) -> list[str]:
    """Every socket under the sandbox: they live on tmpfs or die with their servers at power-off."""
    wiped = []
    for path in root.rglob("*"):
        try:
            if path.is_socket():
                path.unlink()
                wiped.append(str(path))
        except OSError:
            continue
    return wiped


def _wipe_dir(directory: Path) -> list[str]:
    wiped = []
    for path in sorted(directory.glob("*")):
        if path.is_file():
            path.unlink()
            wiped.append(str(path))
    return wiped
