"""The pods of a scenario: created with N devices (a DRA pod: one claim for N devices), deleted,
bound while the kubelet is down and admitted when it starts."""

from __future__ import annotations

from typing import Any

from harness.instruments.timeline import WaitTimeout
from harness.node.interface import AdmissionError
from harness.scenarios.outcomes import UNEXPECTED_ADMISSION, Inconclusive, PodRecord
from harness.scenarios.state import StageState
from harness.scenarios.step import Step


class PodSteps(StageState):
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
        node, fake = self.env.node, self.fake
        pod.phase = "Pending"  # on its way through admission (a real node's own phase replaces it once it shows one)
        try:
            given = node.admit_pod(pod.key, {self.env.spec.resource: pod.devices})
        except AdmissionError as err:
            if fake is not None:
                # The fake kubelet's refusal at admission, and the phase a kubelet gives such a pod.
                pod.phase, pod.reason = "Failed", f"{UNEXPECTED_ADMISSION}: {err}"
                pod.created = f"refused at admission ({pod.reason})"
            else:
                pod.created = f"not running: {err}"  # the real node's pod, in whatever phase its kubelet holds it
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

    def _create_dra_pod(self, name: str, count: int) -> None:
        from harness.controlplane.scheduler import PodClaim

        env: Any = self.env  # a DRAEnv, or what stands in for one
        running = env.node.running
        since = env.now()
        try:
            api, claims = env.run_pod([PodClaim("gpu", count)], name, wait=False)
        except (AssertionError, WaitTimeout) as err:
            # Never scheduled: no node holds it, so it has no phase on one.
            pod = self.pods[name] = PodRecord(name, "", count, "", created=f"not scheduled: {str(err).splitlines()[0]}")
            self._tell_gave_up(pod)
            return
        pod = PodRecord(name, api["metadata"]["uid"], count, "Running" if running else "Pending", api=api,
                        claims=claims)
        self.pods[name] = pod
        devices = [d for c in claims for _, d in env.allocated_devices(c, env.driver)]
        if not running:
            self.tell(f"pod {api['metadata']['name']} scheduled on {', '.join(devices)} while the kubelet is down")
            return
        bound = env.profile.reaction_s + env.profile.dra_call_timeout_s
        try:
            env.wait_pod("pod.running", api, since, f"pod {api['metadata']['name']} running (its claims prepared)",
                         bound)
        except WaitTimeout as err:
            pod.phase, pod.reason = "Pending", ""
            pod.created = f"gave up waiting for it to run: {str(err).splitlines()[0]}"
            self._tell_gave_up(pod)
            return
        self.remember_cdi(pod)
        self.tell(f"pod {api['metadata']['name']} running with claim(s) on {', '.join(devices)}")

    def remember_cdi(self, pod: PodRecord) -> None:
        """The CDI IDs the kubelet holds for the pod's prepared claims (kept: they outlive the claim cache)."""
        from harness.world.draenv import DRAEnv

        assert isinstance(self.env, DRAEnv)
        for claim in pod.claims:
            ids = self.env.prepared_cdi_ids(claim)
            if ids:
                pod.cdi_ids[claim["metadata"]["uid"]] = ids

    def _delete_pod(self, name: str) -> None:
        pod = self._pod(name)
        if self.is_dra:
            from harness.controlplane.client import ApiError
            from harness.world.draenv import DRAEnv

            assert isinstance(self.env, DRAEnv)
            if pod.api is None:
                pod.phase = "Deleted"
                self.tell(f"pod {name} was never made on the node ({pod.created}): nothing to delete")
                return
            uid = pod.api["metadata"]["uid"]
            if self.env.timeline.find(lambda e: e.kind == "pod.deleted" and e.get("pod_uid") == uid):
                # Gone already: evicted (a NoExecute taint on its device) before anyone deleted it.
                pod.phase = "Deleted"
                self.tell(f"pod {name} deleted already (evicted)")
                return
            try:
                self.env.delete_pod(pod.api)
            except ApiError as err:
                if err.status != 404:
                    raise
            # From the start: a UID is one pod's, and an eviction may have deleted it while this step began.
            self.env.wait_pod("pod.deleted", pod.api, 0, f"the kubelet to finish pod {name}'s deletion",
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
