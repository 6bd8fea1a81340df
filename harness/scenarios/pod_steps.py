"""The pods of a scenario: created with N devices (a DRA pod: one claim for N devices), deleted,
bound while the kubelet is down and admitted when it starts.

A create or delete that waits (for the pod to run, to be gone) says its bound, and says every
PROGRESS_EVERY_S how long of it has passed, so a long wait never looks hung. `grace_period`
and `tolerations` need a Pod object: a node that has none for a pod (the fake kubelet's
device-plugin pods) makes the run inconclusive, saying so, rather than dropping them."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from harness.controlplane.base import RESOURCE_API
from harness.controlplane.client import ApiError
from harness.instruments.timeline import Event, WaitTimeout
from harness.node.interface import AdmissionError
from harness.node.real.cluster import POD_START_TIMEOUT_S, ClusterNode
from harness.scenarios.outcomes import UNEXPECTED_ADMISSION, Inconclusive, PodRecord
from harness.scenarios.state import StageState
from harness.scenarios.step import Step
from harness.scenarios.vocabulary import TOLERATION_KEYS, duration_s

# How often a pod wait that runs long says so: often enough that a person at a terminal never wonders whether it
# hangs, seldom enough that the narration stays readable (harness/instruments/progress.py's plain lines, for a
# scenario's own narration).
PROGRESS_EVERY_S = 10.0
PROGRESS_JOIN_S = 1.0  # a narration line being written never holds the step up longer
# A device-plugin pod's admission run beside a held Allocate: it ends by itself, each of its calls bounded (the fake
# kubelet's hang bound, the real node's pod-start bound); this only bounds a wait on one that somehow never does.
ADMISSION_JOIN_S = 2 * POD_START_TIMEOUT_S


def api_tolerations(tolerations: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """A scenario's tolerations as the API writes them (core/v1 Toleration and resource/v1 DeviceToleration alike:
    toleration_seconds is tolerationSeconds)."""
    return [{TOLERATION_KEYS[k]: v for k, v in t.items()} for t in tolerations or []]


def last_word(err: WaitTimeout) -> str:
    """What the node said last about pods while a pod wait ran, for a give-up line (the timeout's own text, the
    events it quotes, is for the report)."""
    said = [e for e in err.seen if e.get("error") or e.get("reason")]
    if not said:
        return ""
    last = said[-1]
    return f" (last from the node: {last.kind}: {str(last.get('error') or last.get('reason'))[:200]})"


class PodSteps(StageState):
    def _do_pod(self, step: Step) -> None:
        arg = step.arg
        if "delete" in arg:
            self._delete_pod(step)
            return
        name, count = arg["create"], arg.get("devices", 1)
        again = self.pods.get(name)
        if again is not None and again.phase != "Deleted":
            raise Inconclusive(f"pod {name} exists already in this scenario (delete it first to make it again)")
        options = {k: arg[k] for k in ("grace_period", "tolerations", "timeout") if k in arg}
        if self.is_dra:
            self._create_dra_pod(name, count, options, again)
            return
        if self.fake is not None and ({"grace_period", "tolerations"} & set(options)):
            raise Inconclusive(self._no_pod_object(step, name, sorted({"grace_period", "tolerations"} & set(options))))
        pod = self.pods[name] = PodRecord(name, f"{name}-{self.env.seed}", count, options=options)
        if not self.env.node.running:
            self.tell(f"pod {name} ({count} {self.env.spec.resource}) bound while the kubelet is down: pending")
            pod.phase = "Admit"  # admitted when a kubelet starts
            return
        self._admit(pod)

    @staticmethod
    def _no_pod_object(step: Step, name: str, keys: list[str]) -> str:
        return (f"{step.where}: pod {name}: {' and '.join(keys)} cannot be honoured here: the fake kubelet's "
                "device-plugin pods are no Pod objects (no API server holds them, nothing terminates them); "
                "run it on the real node (--node real)")

    @contextlib.contextmanager
    def _waiting(self, what: str, bound_s: float) -> Iterator[None]:
        """A wait of up to `bound_s`, narrated every PROGRESS_EVERY_S while it lasts: `waiting for pod p to run:
        20 s of 75 s`. The ticker only narrates; the wait itself wakes on timeline events."""
        stop = threading.Event()
        began = time.monotonic()

        def tick() -> None:
            while not stop.wait(PROGRESS_EVERY_S):
                self.tell(f"waiting for {what}: {time.monotonic() - began:.0f} s of {bound_s:g} s")

        ticker = threading.Thread(target=tick, daemon=True, name=f"pod-wait-{what[:30]}")
        ticker.start()
        try:
            yield
        finally:
            stop.set()
            ticker.join(PROGRESS_JOIN_S)

    # -- device-plugin pods ----------------------------------------------------------------------

    def _dp_spec(self, pod: PodRecord) -> dict[str, Any]:
        """What the create step sets in a device-plugin pod's spec (the real node's: the fake has no Pod)."""
        spec: dict[str, Any] = {}
        if "grace_period" in pod.options:
            spec["terminationGracePeriodSeconds"] = pod.options["grace_period"]
        if "tolerations" in pod.options:
            # In place of the blanket toleration the real node gives its pods (cluster.py runnable): the pod
            # tolerates what the scenario says, as a pod in a cluster does.
            spec["tolerations"] = api_tolerations(pod.options["tolerations"])
        return spec

    def _admit(self, pod: PodRecord) -> None:
        """Admit the pod; with an Allocate `hold` armed, beside the step: the kubelet's admission then waits for
        the held answer, as the pod does, and the step returns once the Allocate is held (or the admission ended
        without one), so that the scenario's next steps (a release, a kubelet restart) can happen meanwhile."""
        if not self._hold_armed("Allocate"):
            self._admit_now(pod)
            return
        timeline, since = self.env.timeline, self.env.timeline.now()

        def admit() -> None:
            try:
                self._admit_now(pod)
            except Exception as err:  # beside the steps, nothing else would see it: the timeline says so
                timeline.record("scenario.admission_error", "harness", pod=pod.name, error=repr(err)[:300])
            finally:
                timeline.record("scenario.admission_done", "harness", pod=pod.name)

        thread = threading.Thread(target=admit, daemon=True, name=f"admit-{pod.name}")
        self.admissions.append(thread)
        thread.start()
        event = timeline.wait_for(
            lambda e: (e.kind == "fault.fired" and e.get("method") == "Allocate")
            or (e.kind == "scenario.admission_done" and e.get("pod") == pod.name),
            ADMISSION_JOIN_S, f"pod {pod.name}'s admission or its Allocate held", since,
            relevant=("fault.fired", "scenario.admission_done", "grpc.call"))
        if event.kind == "fault.fired":
            self.tell(f"pod {pod.name}: the kubelet's Allocate for it is held: its admission waits, the pod "
                      f"{pod.phase}, until the plugin's answer reaches the kubelet")

    def _hold_armed(self, method: str) -> bool:
        """A `hold` of `method` armed and not yet met by any call."""
        hold = self.held_calls.get(method)
        return hold is not None and not hold.released and not hold.received()

    def _met_held_call(self, method: str, pod: PodRecord, since: int, bound: float,
                       done: Callable[[Event], bool], phase: str | None = None) -> bool:
        """Whether the kubelet's `method` for this pod step is held (a `hold` armed before it fired during the
        step): waits, from `since`, for that or for `done` (what the step waits for), under the step's bound. A held
        call keeps the pod where it is until released, so the step then returns at once and says so; `phase` is
        the pod's meanwhile where the node shows none of its own (the fake kubelet's before its pod worker's
        first word)."""
        hold = self.held_calls.get(method)
        # Armed, whether or not its call came already: on a loaded machine the kubelet can make it between the
        # step's API request and this wait, and a hold met then is still this step's (fired() below looks back).
        if hold is None or hold.released:
            return False
        began = self.step_began_ns

        def fired(e: Event) -> bool:
            return e.kind == "fault.fired" and e.get("method") == method and e.t_ns >= began

        event = self.env.timeline.wait_for(
            lambda e: done(e) or fired(e), bound, f"pod {pod.name} (or the kubelet's {method} held)", since,
            relevant=("fault.fired", "pod.running", "pod.killing", "pod.unprepare_failed", "pod.deleted", "node.pod"))
        if not fired(event):
            return False
        if phase is not None:
            pod.phase, pod.reason = phase, ""
        self.tell(f"pod {pod.name}: the kubelet's {method} for it is held: the pod waits ({self.pod_phase(pod)}) "
                  "until the plugin's answer reaches the kubelet")
        return True

    def join_admissions(self) -> None:
        """The fake kubelet's admissions run beside a held Allocate, finished: before a kubelet starts (one the
        stopped kubelet was in has given its pod back for the next one to admit) and at the end of the run. A real
        node's need no join: its kubelet admits its pods itself, and fakelet's side only watches them run, under
        its own bound."""
        if self.fake is None:
            return
        threads, self.admissions = self.admissions, []
        for thread in threads:
            thread.join(ADMISSION_JOIN_S)

    def _admit_now(self, pod: PodRecord) -> None:
        node, fake = self.env.node, self.fake
        pod.phase = "Pending"  # on its way through admission (a real node's own phase replaces it once it shows one)
        requests = {self.env.spec.resource: pod.devices}
        bound = duration_s(pod.options.get("timeout")) or POD_START_TIMEOUT_S
        instance = node.instance
        plan = fake.manager.faults if fake is not None and fake.manager is not None else None
        try:
            if isinstance(node, ClusterNode):
                with self._waiting(f"pod {pod.name} to run", bound):
                    given = node.admit_pod(pod.key, requests, spec=self._dp_spec(pod), timeout_s=bound)
            else:
                given = node.admit_pod(pod.key, requests)
        except AdmissionError as err:
            if plan is not None and (plan.answers_ended or node.instance != instance):
                # The kubelet stopped while it admitted the pod (its Allocate held as it went): the pod is still bound
                # to the node, and the next kubelet admits it, as a real kubelet admits the pods bound to it at start.
                pod.phase, pod.created = "Admit", ""
                self.tell(f"pod {pod.name}: its admission ended with kubelet instance {instance} ({err}); the next "
                          "kubelet admits it")
                return
            if fake is not None:
                # The fake kubelet's refusal at admission, and the phase a kubelet gives such a pod.
                pod.phase, pod.reason = "Failed", f"{UNEXPECTED_ADMISSION}: {err}"
                pod.created = f"refused at admission ({pod.reason})"
            else:
                pod.created = f"not running: {err}"  # the real node's pod, in whatever phase its kubelet holds it
            self._tell_gave_up(pod)
            return
        except WaitTimeout as err:
            # Still settling at the bound: the real node's pod stays in whatever phase its kubelet holds it.
            pod.created = f"gave up waiting for it to run within {bound:g} s{last_word(err)}"
            self._tell_gave_up(pod)
            return
        try:
            node.start_pod(pod.key)
        except AdmissionError as err:
            # As a real kubelet with a CreateContainerError: the pod stays Pending, its container not created.
            pod.reason, pod.created = str(err), f"admitted, its container not started: {err}"
            self._tell_gave_up(pod)
            return
        pod.phase = "Running"
        devices = [d for a in given for d in a.device_ids]
        self.tell(f"pod {pod.name} running with {', '.join(devices) or 'no devices'}")

    def _tell_gave_up(self, pod: PodRecord) -> None:
        """The step's outcome and, apart from it, the pod's phase as the node reports it."""
        self.tell(f"pod {pod.name}: {pod.created}; {self.pod_phase(pod)}")

    # -- DRA pods --------------------------------------------------------------------------------

    def _dra_bound(self, options: dict[str, Any]) -> float:
        """A DRA pod's wait: the step's timeout, else the kubelet's reaction plus one DRA call's timeout (the
        kubelet's NodePrepareResources and NodeUnprepareResources may take that long before they fail)."""
        env = self.env
        return duration_s(options.get("timeout")) or env.profile.reaction_s + env.profile.dra_call_timeout_s

    def _create_dra_pod(self, name: str, count: int, options: dict[str, Any], again: PodRecord | None) -> None:
        from harness.controlplane.scheduler import PodClaim

        env: Any = self.env  # a DRAEnv, or what stands in for one
        bound = self._dra_bound(options)
        # The claim's device tolerations: what tolerates a DeviceTaintRule or a taint its driver publishes.
        claim = PodClaim("gpu", count, tolerations=api_tolerations(options.get("tolerations")))
        spec = {"terminationGracePeriodSeconds": options["grace_period"]} if "grace_period" in options else None
        api_name, exact = name, False
        if again is not None and again.api is not None:
            # Made again as a manifest applied again is: under its old names, so its claim has its old name.
            api_name, exact = again.api["metadata"]["name"], True
            self._release_claims(again, bound)
        running = env.node.running
        since = env.now()
        # Only what the step asks for, so that a stand-in environment without these keywords still serves.
        asked: dict[str, Any] = {**({"exact_name": True} if exact else {}), **({"spec": spec} if spec else {})}
        try:
            api, claims = env.run_pod([claim], api_name, wait=False, **asked)
        except (AssertionError, WaitTimeout) as err:
            # Never scheduled: no node holds it, so it has no phase on one.
            pod = self.pods[name] = PodRecord(name, "", count, "", created=f"not scheduled: {str(err).splitlines()[0]}",
                                              options=options)
            self._tell_gave_up(pod)
            return
        except ApiError as err:
            raise Inconclusive(f"pod {name}: the API server refused it or its claim: {err}") from None
        pod = PodRecord(name, api["metadata"]["uid"], count, "Running" if running else "Pending", api=api,
                        claims=claims, options=options)
        self.pods[name] = pod
        devices = [d for c in claims for _, d in env.allocated_devices(c, env.driver)]
        made = f"{api['metadata']['name']}{' again, under its old names' if exact else ''}"
        if not running:
            self.tell(f"pod {made} scheduled on {', '.join(devices)} while the kubelet is down")
            return
        try:
            with self._waiting(f"pod {name} to run", bound):
                if self._met_held_call("NodePrepareResources", pod, since, bound,
                                       lambda e: e.kind == "pod.running" and e.get("pod_uid") == pod.key, "Pending"):
                    return
                env.wait_pod("pod.running", api, since, f"pod {api['metadata']['name']} running (its claims prepared)",
                             bound)
        except WaitTimeout as err:
            pod.phase, pod.reason = "Pending", ""
            pod.created = f"gave up waiting for it to run within {bound:g} s{last_word(err)}"
            self._tell_gave_up(pod)
            return
        self.remember_cdi(pod)
        took = (env.now() - since) / 1e9
        self.tell(f"pod {made} running with claim(s) on {', '.join(devices)} ({took:.1f} s of its {bound:g} s bound)")

    def _release_claims(self, old: PodRecord, bound: float) -> None:
        """The old claims of a pod about to be made again under its old names, deleted and waited for until they
        are gone (a bounded watch): the resource-claim controller removes their finalizer once no pod uses them."""
        env: Any = self.env
        client = env.need_api()
        plane = env.control_plane
        why = plane.controllers_error if plane is not None else "no control plane"
        for claim in old.claims:
            meta = claim["metadata"]
            collection = f"{RESOURCE_API}/namespaces/{meta['namespace']}/resourceclaims"
            client.delete(f"{collection}/{meta['name']}")
            deadline = time.monotonic() + bound
            while True:
                items, version = client.list_with_version(f"{collection}?fieldSelector=metadata.name={meta['name']}")
                if not items:
                    break
                remaining = deadline - time.monotonic()
                if why:
                    raise Inconclusive(f"pod {old.name} cannot be made again under its old names: its old claim "
                                       f"{meta['name']} keeps the finalizer only the resource-claim controller "
                                       f"removes, which does not run here ({why})")
                if remaining <= 0:
                    raise Inconclusive(f"pod {old.name} cannot be made again under its old names: its old claim "
                                       f"{meta['name']} was not gone within {bound:g} s of its deletion")
                for event in client.watch(f"{collection}?fieldSelector=metadata.name={meta['name']}", version,
                                          remaining):
                    if event.get("type") == "DELETED":
                        break
            self.tell(f"pod {old.name}: its old claim {meta['name']} deleted, to make it again under the same names")

    def remember_cdi(self, pod: PodRecord) -> None:
        """The CDI IDs the kubelet holds for the pod's prepared claims (kept: they outlive the claim cache)."""
        from harness.world.draenv import DRAEnv

        assert isinstance(self.env, DRAEnv)
        for claim in pod.claims:
            ids = self.env.prepared_cdi_ids(claim)
            if ids:
                pod.cdi_ids[claim["metadata"]["uid"]] = ids

    # -- deletion --------------------------------------------------------------------------------

    def _delete_pod(self, step: Step) -> None:
        arg = step.arg
        name, grace = arg["delete"], arg.get("grace_period")
        pod = self._pod(name)
        with_grace = f" with grace period {grace} s" if grace is not None else ""
        if self.is_dra:
            self._delete_dra_pod(pod, grace, self._dra_bound(arg), with_grace)
            return
        node = self.env.node
        if not isinstance(node, ClusterNode):
            if grace is not None:
                raise Inconclusive(self._no_pod_object(step, name, ["grace_period"]))
            node.delete_pod(pod.key)  # the fake kubelet frees the pod's devices at once: nothing to wait for
            pod.phase = "Deleted"
            self.tell(f"pod {name} deleted")
            return
        uid = node.pod_uid(pod.key)
        node.delete_pod(pod.key, grace=grace)
        if uid is None:
            pod.phase = "Deleted"
            self.tell(f"pod {name} was never made on the node ({pod.created or 'bound while the kubelet was down'}): "
                      "nothing to delete")
            return
        bound = duration_s(arg.get("timeout")) or POD_START_TIMEOUT_S
        self._wait_gone(pod, uid, bound, with_grace)

    def _delete_dra_pod(self, pod: PodRecord, grace: int | None, bound: float, with_grace: str) -> None:
        from harness.world.draenv import DRAEnv

        assert isinstance(self.env, DRAEnv)
        if pod.api is None:
            pod.phase = "Deleted"
            self.tell(f"pod {pod.name} was never made on the node ({pod.created}): nothing to delete")
            return
        uid = pod.api["metadata"]["uid"]
        if self.env.timeline.find(lambda e: e.kind == "pod.deleted" and e.get("pod_uid") == uid):
            # Gone already: evicted (a NoExecute taint on its device) before anyone deleted it.
            pod.phase = "Deleted"
            self.tell(f"pod {pod.name} deleted already (evicted)")
            return
        try:
            self.env.delete_pod(pod.api, grace)
        except ApiError as err:
            if err.status not in (404, 409):  # gone, or (its UID the precondition) replaced: not this pod any more
                raise
        self._wait_gone(pod, uid, bound, with_grace)

    def _wait_gone(self, pod: PodRecord, uid: str, bound: float, with_grace: str) -> None:
        """Until the Pod is gone from the API server (the kubelet finished it, or a grace period of 0 removed it at
        once). Counted from the scenario's start: a UID is one pod's, and an eviction may have deleted it while this
        step began. Not gone within the bound: the step could not run, with the bound and the pod's phase."""
        timeline = self.env.timeline
        began = time.monotonic()
        prepare = self.held_calls.get("NodePrepareResources")
        if self.is_dra and prepare is not None and prepare.in_flight() is not None and \
                not timeline.find(lambda e: e.kind == "pod.running" and e.get("pod_uid") == uid):
            # Its prepare is held: the kubelet's pod worker finishes the prepare before it turns to the deletion (a
            # real kubelet's too), so the pod goes only once the held call ends.
            self.tell(f"pod {pod.name}: deleted{with_grace} while the kubelet's NodePrepareResources for it is held: "
                      f"the kubelet finishes the deletion once that call ends; {self.pod_phase(pod)}")
            return
        try:
            with self._waiting(f"pod {pod.name} to be gone", bound):
                if self._met_held_call("NodeUnprepareResources", pod, 0, bound,
                                       lambda e: e.kind == "pod.deleted" and e.get("pod_uid") == uid):
                    return
                # No abort on the plugin's exit: a stopped driver does not stop the API server from removing it.
                timeline.wait_for(lambda e: e.kind == "pod.deleted" and e.get("pod_uid") == uid, bound,
                                  f"pod {pod.name} gone from the API server", 0,
                                  relevant=("pod.killing", "pod.unprepare_failed", "pod.deleted", "node.pod"))
        except WaitTimeout as err:
            raise Inconclusive(f"pod {pod.name} deleted{with_grace} and not gone from the API server within "
                               f"{bound:g} s (the step's bound); {self.pod_phase(pod)}{last_word(err)}") from None
        pod.phase = "Deleted"
        took = time.monotonic() - began
        self.tell(f"pod {pod.name} deleted{with_grace} (gone from the API server after {took:.1f} s of its "
                  f"{bound:g} s bound)")

    def _pod(self, name: str) -> PodRecord:
        if name not in self.pods:
            raise Inconclusive(f"no pod {name} in this scenario (create it first)")
        return self.pods[name]

    def _admit_pending(self) -> None:
        for pod in self.pods.values():
            if pod.phase == "Admit" and self.env.node.running:
                self._admit(pod)
