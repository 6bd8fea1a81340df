"""The KEP-5970 checks' world: a driver already running, judged through the Kubernetes API only.

kubernetes/enhancements#5970 (DRA Driver Conformance Test Suite, provisional for 1.37) runs seven
behaviours against a live cluster where the driver is installed. This world holds what those
checks share: a namespace of its own, a watch-kept copy of its pods, events and claims and of the
driver's ResourceSlices (apimirror.py), and one story told once and read by every check:

    slices published -> first pod with a claim -> allocated -> past NodePrepareResources -> Running
    with the driver's environment -> deleted (NodeUnprepareResources) -> a second claim runs.

Each stage runs once, when the first check needs it, and keeps its outcome, so the seven checks
cost one story. Who allocates and binds is the caller's: a live cluster's kube-scheduler (pods
carry the default scheduler name), or on fakelet's local control plane its allocator and scheduler
(harness/controlplane/scheduler.py), which is then what KEP5970-03 judges beside the driver's slices.
Everything created is registered when it is created and removed on close, in reverse order.
"""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from harness.controlplane.allocator import AllocationError
from harness.controlplane.base import RESOURCE_API
from harness.controlplane.client import ApiError, KubeClient
from harness.controlplane.scheduler import Scheduler, claim_body
from harness.instruments.teardown import run_all
from harness.spec.profiles import Profile
from harness.world.apimirror import ApiMirror

NAMESPACE_PREFIX = "fakelet-kep5970-"
# The busybox upstream's e2e tests run (kubernetes test/utils/image/manifest.go BusyBox).
POD_IMAGE = "registry.k8s.io/e2e-test-images/busybox:1.36.1-1"
PREPARE_FAILED = "FailedPrepareDynamicResources"  # kubelet pkg/kubelet/events/event.go
# kubelet kuberuntime/kuberuntime_container.go ErrCreateContainer, ErrCreateContainerConfig and
# container/sync_result.go ErrRunContainer: a container the runtime would not create or start
RUNTIME_REFUSALS = ("CreateContainerError", "CreateContainerConfigError", "RunContainerError")
UNPREPARE_FAILED = "FailedUnprepareDynamicResources"  # the reason KEP-5970's sixth behaviour names
# What the kubelet says when a pod's claim names a driver it has not registered (pkg/kubelet/cm/dra
# plugin/dra_plugin_manager.go GetPlugin; older releases: "not found in the list of registered DRA plugins").
NOT_REGISTERED = re.compile(r"not registered|not found in the list of registered", re.IGNORECASE)
CDI_CONTAINERD = (1, 7)  # containerd applies CDI devices from CRI from 1.7 on (earlier releases ignore them)
PROBE, PLAIN, MAIN = "probe", "plain", "main"  # init containers with and without the claim, and the workload
ENV_CMD = ["sh", "-c", "env > /dev/termination-log"]  # the kubelet's default terminationMessagePath
WAIT_CMD = ["sh", "-c", "trap 'exit 0' TERM INT; sleep 2147483647 & wait"]  # stops at once on delete
REQUEST = "req-0"


@dataclass
class Stage:
    """One step of the story: ok True/False, or None when it could not be exercised (detail says why)."""

    ok: bool | None
    detail: str
    facts: dict[str, Any] = field(default_factory=dict)


@dataclass
class PodStory:
    name: str
    claim: str
    pod_uid: str = ""
    bound_ns: int = 0
    allocation: Stage | None = None
    prepare: Stage | None = None
    running: Stage | None = None
    env: Stage | None = None
    notes: list[str] = field(default_factory=list)


def short_id() -> str:
    return secrets.token_hex(3)


def env_of(message: str) -> dict[str, str]:
    out = {}
    for line in message.splitlines():
        key, sep, value = line.partition("=")
        if sep and key and " " not in key:
            out[key] = value
    return out


def containerd_version(runtime: str) -> tuple[int, int] | None:
    match = re.match(r"containerd://v?(\d+)\.(\d+)", runtime or "")
    return (int(match[1]), int(match[2])) if match else None


class KepWorld:
    def __init__(self, client: KubeClient, driver: str, device_class: str, profile: Profile, *,
                 node: str | None = None, scheduler: Scheduler | None = None,
                 runnable: Callable[[dict], dict] | None = None, image: str = POD_IMAGE,
                 namespace: str | None = None, allocated_by: str = "the cluster's kube-scheduler") -> None:
        """`node`: only this node's slices and pods count (a local node), else any node's; `scheduler`:
        fakelet's, which allocates and binds (a local control plane has no kube-scheduler), else the
        cluster's own; `runnable` adapts a pod for a local node (its image, host network)."""
        self.client, self.driver, self.device_class, self.profile = client, driver, device_class, profile
        self.node, self.scheduler, self.runnable, self.image = node, scheduler, runnable, image
        self.namespace = namespace or f"{NAMESPACE_PREFIX}{short_id()}"
        self._own_namespace = namespace is None
        self.mirror = ApiMirror(client)
        self._cleanup: list[Callable[[], None]] = []
        self._stages: dict[str, Any] = {}
        self.notes: list[str] = []
        self.allocated_by = allocated_by  # said in KEP5970-03's notes: whose allocation it judged

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> KepWorld:
        try:
            if self._own_namespace:
                self.client.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                          "metadata": {"name": self.namespace,
                                                                       "labels": {"app.kubernetes.io/managed-by":
                                                                                  "fakelet"}}})
                self._cleanup.append(lambda: self.client.delete(f"/api/v1/namespaces/{self.namespace}"))
            self._ensure_service_account()
            slices = f"spec.driver={self.driver}" + (f",spec.nodeName={self.node}" if self.node else "")
            ns = f"/api/v1/namespaces/{self.namespace}"
            self.mirror.with_collection("slices", f"{RESOURCE_API}/resourceslices", slices) \
                .with_collection("pods", f"{ns}/pods").with_collection("events", f"{ns}/events") \
                .with_collection("claims", f"{RESOURCE_API}/namespaces/{self.namespace}/resourceclaims").start()
            self._cleanup.append(self.mirror.stop)
        except BaseException:
            self.close()
            raise
        return self

    def _ensure_service_account(self) -> None:
        # The ServiceAccount admission plugin refuses pods whose account does not exist yet; a cluster's
        # controller makes "default" soon after the namespace, a bare local API server never does.
        try:
            self.client.create(f"/api/v1/namespaces/{self.namespace}/serviceaccounts", {
                "apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"},
                "automountServiceAccountToken": False})
        except ApiError as err:
            if err.status != 409:
                raise

    def close(self) -> None:
        steps, self._cleanup = list(reversed(self._cleanup)), []
        run_all(steps)

    def _delete_later(self, path: str) -> None:
        self._cleanup.append(lambda: self.client.delete(path))

    # -- reading the mirror ----------------------------------------------------------------------

    def _pod(self, name: str) -> dict[str, Any] | None:
        return next((p for p in self.mirror.items("pods") if p["metadata"]["name"] == name), None)

    def _claim(self, name: str) -> dict[str, Any] | None:
        return next((c for c in self.mirror.items("claims") if c["metadata"]["name"] == name), None)

    def events_for(self, pod: str, reason: str | None = None) -> list[dict[str, Any]]:
        found = [e for e in self.mirror.items("events") if (e.get("involvedObject") or {}).get("name") == pod
                 and (e.get("involvedObject") or {}).get("kind") == "Pod"]
        found = [e for e in found if reason is None or e.get("reason") == reason]
        return sorted(found, key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")

    def devices(self) -> list[tuple[str, str]]:
        return sorted((s["spec"].get("nodeName") or "", d["name"]) for s in self.mirror.items("slices")
                      for d in s["spec"].get("devices") or [])

    # -- the story -----------------------------------------------------------------------------

    def _once(self, name: str, make: Callable[[], Any]) -> Any:
        if name not in self._stages:
            self._stages[name] = make()
        return self._stages[name]

    def published(self) -> Stage:
        return self._once("published", self._published)

    def _published(self) -> Stage:
        found = self.mirror.wait(lambda: self.devices() or None, self.profile.reaction_s)
        where = f" on node {self.node}" if self.node else ""
        if not found:
            err = self.mirror.error("slices")
            return Stage(False, f"expected ResourceSlices of driver {self.driver}{where} with at least one device "
                                f"within {self.profile.reaction_s:g}s; saw {len(self.mirror.items('slices'))} slice(s) "
                                f"and no device{f' (API: {err})' if err else ''}")
        return Stage(True, f"{len(found)} device(s) in {len(self.mirror.items('slices'))} slice(s)",
                     {"devices": [d for _, d in found]})

    def first(self) -> PodStory:
        return self._once("first", lambda: self._pod_story("first"))

    def _pod_story(self, label: str) -> PodStory:
        story = PodStory(f"kep5970-{label}-{short_id()}", f"kep5970-{label}-{short_id()}")
        if not self.published().ok:
            story.allocation = Stage(None, f"the driver published no device: {self.published().detail}")
            return story
        self._create(story)
        story.allocation = self._allocated(story)
        if story.allocation.ok:
            story.prepare = self._past_prepare(story)
        if story.prepare is not None and story.prepare.ok:
            story.running = self._running(story)
        return story

    def _create(self, story: PodStory) -> None:
        claims = f"{RESOURCE_API}/namespaces/{self.namespace}/resourceclaims"
        claim = self.client.create(claims, claim_body(self.namespace, story.claim, self.device_class, 1))
        self._delete_later(f"{claims}/{story.claim}")
        uses = {"resources": {"claims": [{"name": "device"}]}}
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": story.name, "namespace": self.namespace,
                            "labels": {"app.kubernetes.io/managed-by": "fakelet"}},
               "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
                        "automountServiceAccountToken": False, "enableServiceLinks": False,
                        "resourceClaims": [{"name": "device", "resourceClaimName": story.claim}],
                        "initContainers": [{"name": PROBE, "command": ENV_CMD, **uses},
                                           {"name": PLAIN, "command": ENV_CMD}],
                        "containers": [{"name": MAIN, "command": WAIT_CMD, **uses}]}}
        if self.scheduler is not None:
            pod["spec"]["schedulerName"] = "fakelet"  # harness/controlplane/scheduler.py SCHEDULER_NAME
        for c in pod["spec"]["initContainers"] + pod["spec"]["containers"]:
            c["image"] = self.image
        if self.runnable is not None:
            pod = self.runnable(pod)
            main = pod["spec"]["containers"][0]
            for c in pod["spec"]["initContainers"]:  # the node's image for the init containers too
                c.update({k: main[k] for k in ("image", "imagePullPolicy") if k in main})
        created = self.client.create(f"/api/v1/namespaces/{self.namespace}/pods", pod)
        self._delete_later(f"/api/v1/namespaces/{self.namespace}/pods/{story.name}")
        story.pod_uid = created["metadata"]["uid"]
        story.bound_ns = time.monotonic_ns()
        if self.scheduler is not None and self.node is not None:
            try:
                self.scheduler.schedule(created, [claim], self.node, self.driver)
            except AllocationError as err:
                story.notes.append(f"fakelet's scheduler: {err}")
            story.bound_ns = time.monotonic_ns()

    def _allocated(self, story: PodStory) -> Stage:
        def allocated() -> dict[str, Any] | None:
            claim = self._claim(story.claim)
            results = (((claim or {}).get("status") or {}).get("allocation") or {}).get("devices", {})
            return claim if results.get("results") else None
        claim = self.mirror.wait(allocated, self.profile.reaction_s)
        if claim is None:
            pod = self._pod(story.name) or {}
            scheduled = [c for c in (pod.get("status") or {}).get("conditions") or [] if c.get("type") ==
                         "PodScheduled"]
            why = "; ".join([*story.notes, *(f"PodScheduled {c.get('status')}: {c.get('message', '')}"
                                             for c in scheduled)]) or "no word from the scheduler"
            return Stage(False, f"expected claim {story.claim} (device class {self.device_class}) allocated within "
                                f"{self.profile.reaction_s:g}s; it is not ({why})")
        results = claim["status"]["allocation"]["devices"]["results"]
        mine = [r for r in results if r.get("driver") == self.driver]
        if not mine:
            return Stage(False, f"expected claim {story.claim} allocated from driver {self.driver}; its devices "
                                f"come from {sorted({r.get('driver') for r in results})}")
        return Stage(True, f"allocated {', '.join(r['device'] for r in mine)}",
                     {"devices": sorted((r["pool"], r["device"]) for r in mine)})

    @staticmethod
    def _statuses(pod: dict[str, Any] | None) -> list[dict[str, Any]]:
        status = (pod or {}).get("status") or {}
        return (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or [])

    @classmethod
    def _refused(cls, pod: dict[str, Any] | None) -> list[str]:
        """What the runtime said when it refused to create a container of the pod (e.g. "CDI device injection
        failed: unresolvable CDI devices ..."): the kubelet asks it only once the claims are prepared."""
        return [f"{s.get('name')}: {w.get('reason')}: {w.get('message', '')}" for s in cls._statuses(pod)
                if (w := (s.get("state") or {}).get("waiting") or {}).get("reason") in RUNTIME_REFUSALS]

    @classmethod
    def _started(cls, pod: dict[str, Any] | None) -> bool:
        """A container of the pod started, or the runtime refused to create one: past the claims' preparation."""
        return bool(cls._refused(pod)) or any("running" in (s.get("state") or {}) or "terminated" in
                                              (s.get("state") or {}) for s in cls._statuses(pod))

    def _past_prepare(self, story: PodStory) -> Stage:
        """Past the kubelet's NodePrepareResources: a container of the pod started. A prepare failure counts once
        the reaction bound has passed with it the newest word (the kubelet retries; a driver registering late
        is a legal race); a prepare still in flight gets the kubelet's DRA call bound beside."""
        bound = self.profile.reaction_s
        started = self.mirror.wait(lambda: True if self._started(self._pod(story.name)) else None, bound)
        failures = self.events_for(story.name, PREPARE_FAILED)
        if started is None and not failures:
            started = self.mirror.wait(lambda: True if self._started(self._pod(story.name))
                                       or self.events_for(story.name, PREPARE_FAILED) else None,
                                       self.profile.dra_call_timeout_s)
            started = True if self._started(self._pod(story.name)) else None
            failures = self.events_for(story.name, PREPARE_FAILED)
        said = [f"{e.get('reason')}: {e.get('message', '')}" for e in failures]
        facts = {"prepare_failures": said}
        if started:
            if said:
                story.notes.append(f"the kubelet failed the prepare {len(said)} time(s) before it passed: {said[-1]}")
            refused = self._refused(self._pod(story.name))
            if refused:
                return Stage(True, f"the kubelet prepared its claim and asked the runtime for a container, which "
                                   f"refused it ({refused[0]})", facts)
            return Stage(True, "a container of the pod started (the kubelet prepared its claim)", facts)
        pod = self._pod(story.name) or {}
        where = (pod.get("spec") or {}).get("nodeName") or "no node"
        return Stage(False, f"expected pod {story.name} past NodePrepareResources on {where} within "
                            f"{bound:g}s (+{self.profile.dra_call_timeout_s:g}s for a call in flight); "
                            f"saw {said[-1] if said else 'no container started and no event'}", facts)

    def _running(self, story: PodStory) -> Stage:
        def state() -> str | None:
            phase = ((self._pod(story.name) or {}).get("status") or {}).get("phase")
            return phase if phase in ("Running", "Failed", "Succeeded") else None
        phase = self.mirror.wait(state, self.profile.reaction_s)
        if phase != "Running":
            refused = self._refused(self._pod(story.name))
            return Stage(False, f"expected pod {story.name} Running within {self.profile.reaction_s:g}s of its "
                                f"preparation; its phase is {phase or 'still Pending'}"
                                + (f" (the runtime refused {refused[0]})" if refused else ""))
        return Stage(True, "Running")

    def injected_env(self, story: PodStory) -> Stage:
        """What the claim added to a container's environment: the probe's env less the plain one's."""
        pod = self._pod(story.name) or {}
        node = (pod.get("spec") or {}).get("nodeName") or ""
        messages = {s["name"]: ((s.get("state") or {}).get("terminated") or {}).get("message")
                    for s in (pod.get("status") or {}).get("initContainerStatuses") or []}
        if messages.get(PROBE) is None or messages.get(PLAIN) is None:
            return Stage(False, f"expected the init containers' environment in their termination messages; saw "
                                f"{sorted(k for k, v in messages.items() if v is not None) or 'none'}")
        probe, plain = env_of(messages[PROBE]), env_of(messages[PLAIN])
        injected = sorted(k for k, v in probe.items() if plain.get(k) != v)
        runtime = ""
        try:
            runtime = self.client.get(f"/api/v1/nodes/{node}")["status"]["nodeInfo"]["containerRuntimeVersion"]
        except (ApiError, OSError, KeyError):
            pass
        if injected:
            return Stage(True, f"the claim's container got {', '.join(injected)} from the driver (runtime "
                               f"{runtime or '?'})", {"injected_env": injected})
        version = containerd_version(runtime)
        if version is not None and version < CDI_CONTAINERD:
            return Stage(None, f"node {node}'s runtime {runtime} does not apply CDI devices (containerd "
                               f"{'.'.join(map(str, CDI_CONTAINERD))} and later do), so no driver's environment "
                               "can reach a container there")
        return Stage(False, f"expected the claim to add the driver's environment variables to the container (CDI); "
                            f"its environment equals the container's without the claim (runtime {runtime or '?'})")

    def unprepared(self) -> Stage:
        return self._once("unprepared", self._unprepared)

    def _unprepared(self) -> Stage:
        story = self.first()
        if story.running is None or not story.running.ok:
            return Stage(None, "the first pod never ran, so there was nothing to unprepare")
        path = f"/api/v1/namespaces/{self.namespace}/pods/{story.name}"
        self.client.delete(path)
        bound = self.profile.reaction_s + self.profile.dra_call_timeout_s
        gone = self.mirror.wait(lambda: True if self._pod(story.name) is None else None, bound)
        failures = [f"{e.get('reason')}: {e.get('message', '')}" for e in self.events_for(story.name)
                    if e.get("reason") == UNPREPARE_FAILED]
        if not gone:
            return Stage(False, f"expected pod {story.name}'s deletion to complete (NodeUnprepareResources "
                                f"answered) within {bound:g}s; it is still there"
                                f"{': ' + failures[-1] if failures else ''}")
        if failures:
            return Stage(False, f"expected no {UNPREPARE_FAILED} events for pod {story.name}; saw {failures[-1]}")
        # The claim goes too, so that its device is free again for the second claim (KEP5970-07).
        self.client.delete(f"{RESOURCE_API}/namespaces/{self.namespace}/resourceclaims/{story.claim}")
        released = self.mirror.wait(lambda: True if self._claim(story.claim) is None else None,
                                    self.profile.reaction_s)
        facts = {"claim_released": bool(released)}
        return Stage(True, "deleted, with no unprepare failure", facts)

    def second(self) -> PodStory | Stage:
        return self._once("second", self._second)

    def _second(self) -> PodStory | Stage:
        done = self.unprepared()
        if not done.ok:
            return Stage(None, f"the first pod's device was never given back: {done.detail}")
        if not done.facts.get("claim_released"):
            return Stage(None, f"the first claim was not removed within {self.profile.reaction_s:g}s (its "
                               "finalizer is the resource-claim controller's), so its device stayed allocated")
        return self._pod_story("second")
