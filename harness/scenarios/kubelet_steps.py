"""The kubelet's steps of a scenario: start, stop, restart (with or without its sockets, with a lost or
corrupt checkpoint) and reboot, and the re-admission of running pods a starting kubelet does."""

from __future__ import annotations

from pathlib import Path

from harness.kubelet import checkpoint as dp_checkpoint
from harness.node.interface import AdmissionError
from harness.scenarios.outcomes import UNEXPECTED_ADMISSION, Inconclusive
from harness.scenarios.state import StageState
from harness.scenarios.step import Step

CORRUPT_CHECKPOINT = b"{not a checkpoint"  # what a half-written file looks like to the kubelet's JSON decoder


class KubeletSteps(StageState):
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
        if op == "drop-health-stream":
            self._drop_health_stream()
            return
        if op in ("restart", "restart-keep-sockets"):
            node.stop_kubelet()
        if fault:
            self._checkpoint_fault(fault)
        self.start_kubelet(keep_sockets=op == "restart-keep-sockets")
        what = {"start": "started", "restart": "restarted (the new instance deleted the plugin sockets)",
                "restart-keep-sockets": "restarted, keeping the plugin sockets"}[op]
        self.tell(f"kubelet {what}{f' with its checkpoint {fault}' if fault else ''}")
        self._readmit()
        self._admit_pending()

    def _drop_health_stream(self) -> None:
        """The kubelet's NodeWatchResources stream to the driver ends as a broken connection ends it; the kubelet
        opens the next one after its retry period. Only the fake kubelet's streams are in fakelet's reach."""
        from harness.node.fake import FakeNode

        node = self.env.node
        if not self.is_dra or not isinstance(node, FakeNode) or node.dra is None:
            raise Inconclusive("drop-health-stream needs a DRA driver on the fake kubelet (a running one)")
        driver = self.env.driver  # type: ignore[attr-defined]
        since = self.env.now()
        dropped = node.dra.drop_health_streams(driver)
        if dropped:
            # The step is done once the kubelet saw its stream end (and cleared what it held): event-driven, bounded.
            self.env.timeline.wait_for(
                lambda e: e.kind == "dra.health_stream" and e.get("driver") == driver and e.get("state") == "ended",
                self.env.profile.reaction_s, f"the kubelet's NodeWatchResources stream of {driver} to end", since)
        self.tell(f"kubelet: {dropped} NodeWatchResources stream(s) of {driver} dropped "
                  f"(re-opened after {self.env.profile.dra_health_retry_s:g}s)" if dropped else
                  "kubelet: no NodeWatchResources stream was open to drop")

    def _checkpoint_fault(self, fault: str) -> None:
        paths = [self.env.sandbox.plugin_dir / dp_checkpoint.CHECKPOINT_NAME]
        if self.is_dra:
            paths.append(self.env.dra_checkpoint())  # type: ignore[attr-defined]
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
        # The fake kubelet's pods are its own records, started again by its re-admission; a real
        # node's containers are killed, so its kubelet finds dead sandboxes when it boots.
        killed = 0 if self.fake is not None else env.node.power_off_pods()  # type: ignore[union-attr]
        # The real node's containerd stays up (its pods are dead): its socket is not the node's to lose.
        runtime = getattr(env.node, "workdir", None) if self.fake is None else None
        wiped = _wipe_sockets(env.sandbox.path, keep=runtime)
        if self.is_dra:
            wiped += _wipe_dir(env.sandbox.cdi_dir)
        if fault:
            self._checkpoint_fault(fault)
        self.tell(f"node rebooted: plugin and kubelet stopped, {f'{killed} container(s) killed, ' if killed else ''}"
                  f"{len(wiped)} socket(s) and CDI file(s) wiped{f', the kubelet checkpoint {fault}' if fault else ''}")
        self.start_kubelet()
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
                # The phase the kubelet gives a pod it refuses at admission; the refusal is the step's outcome.
                pod.phase, pod.reason = "Failed", f"{UNEXPECTED_ADMISSION}: {err}"
                self.tell(f"pod {pod.name}: refused at re-admission by the new kubelet ({pod.reason}); the fake "
                          f"kubelet reports phase {pod.phase}")
            else:
                self.tell(f"pod {pod.name} re-admitted by the new kubelet: phase still Running")


def _wipe_sockets(root: Path, keep: Path | None = None) -> list[str]:
    """Every socket under the sandbox but those under `keep`: they live on tmpfs or die with their servers
    at power-off."""
    wiped = []
    for path in root.rglob("*"):
        try:
            if keep is not None and path.is_relative_to(keep):
                continue
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
