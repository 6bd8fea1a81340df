"""The fake kubelet's pod worker: real Pods bound to its Node, run the way the kubelet runs them.

For each Pod whose `spec.nodeName` is this node, the worker does what the
kubelet's pod lifecycle does for DRA (pkg/kubelet/kubelet.go SyncPod and
SyncTerminatedPod, cm/dra/manager.go):

- admission: resolve the pod's ResourceClaims (a direct name, or the claim the
  resource-claim controller generated from a template, read from
  `status.resourceClaimStatuses`), wait until each is allocated and reserved
  for the pod, prepare them through the DRA manager (NodePrepareResources),
  then post the status the kubelet would: phase Running, conditions,
  container statuses with `allocatedResourcesStatus` from the health stream;
- deletion (`deletionTimestamp` set, by a user or by the device-taint eviction
  controller): stop the (fake) containers, unprepare the claims no other pod
  on the node still uses (NodeUnprepareResources), then finish the deletion
  with grace period 0, as the status manager does once the pod can be deleted;
- a pod removed outright (force-deleted) is unprepared the same way.

There are no containers: "running" is the status the worker posts. Failed
prepare or unprepare calls are retried after the pod worker's back-off, as
upstream's pod workers retry a failed sync.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from harness.controlplane.base import RESOURCE_API
from harness.controlplane.client import ApiError
from harness.instruments.timeline import Timeline
from harness.kubelet.nodestatus import rfc3339

if TYPE_CHECKING:
    from harness.controlplane.client import KubeClient
    from harness.kubelet.dramanager import DRAManager
    from harness.spec.profiles import Profile

WATCH_S = 5.0  # one watch request's server-side timeout; the loop re-lists and re-watches
RETRY_S = 1.0  # after a failed list or watch: the API server may be restarting
STOP_JOIN_S = 5.0
# A running pod's periodic sync, which regenerates its status (allocatedResourcesStatus read from the health cache
# then): kubelet config syncFrequency, default 1m (pkg/kubelet/apis/config/v1beta1 defaults.go), which the real
# node's config keeps.
SYNC_FREQUENCY_S = 60.0
# What makes the kubelet post a running pod's allocatedResourcesStatus again between its periodic syncs: a health
# message that changed a device (cm/dra manager.go HandleWatchResourcesStream sends the pods using the changed
# devices on m.update, v1.34 to v1.37 alike). A stream's end clears the driver's cache and a device's timeout
# passing changes it, but neither posts: the pod shows them at its next sync (kubernetes/kubernetes#140818,
# #140819).
HEALTH_UPDATE_EVENT = "dra.health"


def _spec_changed(old: dict, new: dict) -> bool:
    """Anything but the status (and the version stamps that follow it) differs: a change the kubelet syncs for."""
    def without_status(pod: dict) -> dict:
        meta = {k: v for k, v in _meta(pod).items() if k not in ("resourceVersion", "managedFields")}
        return {**{k: v for k, v in pod.items() if k != "status"}, "metadata": meta}

    return without_status(old) != without_status(new)


def _meta(obj: dict) -> dict:
    return obj.get("metadata") or {}


def pod_ref(pod: dict) -> dict[str, str]:
    """The {"name", "namespace", "uid"} the DRA manager keys pods by."""
    meta = _meta(pod)
    return {"name": meta.get("name", ""), "namespace": meta.get("namespace", ""), "uid": meta.get("uid", "")}


def claim_names(pod: dict) -> dict[str, str | None]:
    """Pod-level claim name -> the ResourceClaim's name (None while a template's claim is not generated yet).

    k8s.io/dynamic-resource-allocation resourceclaim.Name: a direct resourceClaimName, or the
    generated name the resource-claim controller recorded in status.resourceClaimStatuses.
    """
    generated = {s.get("name"): s.get("resourceClaimName")
                 for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []}
    out: dict[str, str | None] = {}
    for entry in (pod.get("spec") or {}).get("resourceClaims") or []:
        name = entry.get("name", "")
        out[name] = entry.get("resourceClaimName") or generated.get(name)
    return out


class _PodSync:
    """One pod's worker thread: admit, run, terminate; every step on the timeline."""

    def __init__(self, worker: PodWorker, pod: dict) -> None:
        self.worker, self.pod = worker, pod
        self.ref = pod_ref(pod)
        self.state = "pending"  # pending -> running -> terminated
        self.removed = False  # the API object is gone (force-deleted, or our own final delete)
        self.prepared = False
        self.started = ""  # when it began running (RFC 3339), for the container statuses
        self._kick = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"pod-{self.ref['name']}")
        self._thread.start()

    def update(self, pod: dict | None, sync: bool = True) -> None:
        """The pod's newest object; `sync` wakes the worker (a status-only change does not: the kubelet's pod
        config reconciles those without a sync, config.go checkAndUpdatePod)."""
        if pod is None:
            if not self.removed:
                # Gone from the API server before this kubelet finished it (a delete with grace period 0, a force
                # delete): the Pod is deleted now, while the worker has still to stop it and unprepare its claims.
                self.worker.timeline.record("pod.deleted", "kubelet", pod=self.ref["name"], pod_uid=self.ref["uid"],
                                            before_kubelet=True)
            self.removed = True
        else:
            self.pod = pod
        if sync:
            self._kick.set()

    def join(self, timeout_s: float) -> None:
        self._kick.set()
        self._thread.join(timeout_s)

    @property
    def deleting(self) -> bool:
        return self.removed or bool(_meta(self.pod).get("deletionTimestamp"))

    def _wait(self, seconds: float) -> bool:
        """Wait for news about this pod or the worker's stop; True when stopping."""
        self._kick.wait(seconds)
        self._kick.clear()
        return self.worker.stopping.is_set()

    def _run(self) -> None:
        try:
            while not self.worker.stopping.is_set() and self.state != "terminated":
                if self.deleting:
                    self._terminate()
                elif self.state == "pending":
                    self._admit()
                elif self._wait(SYNC_FREQUENCY_S):
                    return
                elif self.state == "running":
                    self.worker.post_health(self)
        except Exception as err:  # a worker thread must never die silently: say so on the timeline
            self.worker.timeline.record("pod.sync_error", "kubelet", pod=self.ref["name"], error=repr(err))

    # -- admission ----------------------------------------------------------------------------

    def _claims(self) -> list[dict] | str:
        """The pod's claims, allocated and reserved for it, or why they are not ready yet."""
        claims = []
        for pod_claim, name in claim_names(self.pod).items():
            if name is None:
                return f"claim {pod_claim}: no ResourceClaim generated yet"
            try:
                claim = self.worker.client.get(f"{RESOURCE_API}/namespaces/{self.ref['namespace']}"
                                               f"/resourceclaims/{name}")
            except ApiError as err:
                return f"claim {name}: {err}"
            status = claim.get("status") or {}
            if not status.get("allocation"):
                return f"claim {name}: not allocated"
            if not any(r.get("uid") == self.ref["uid"] for r in status.get("reservedFor") or []):
                return f"claim {name}: not reserved for the pod"
            claims.append(claim)
        return claims

    def _admit(self) -> None:
        worker = self.worker
        claims = self._claims()
        if isinstance(claims, str):
            worker.timeline.record("pod.waiting", "kubelet", pod=self.ref["name"], reason=claims)
            self._wait(worker.profile.pod_sync_backoff_s)
            return
        if claims:
            dra = worker.dra()
            if dra is None:
                self._wait(worker.profile.pod_sync_backoff_s)
                return
            try:
                dra.prepare_pod(self.ref, claims)
            except Exception as err:  # PrepareError: the pod worker's sync failed; retry after back-off
                worker.timeline.record("pod.sync_failed", "kubelet", pod=self.ref["name"], error=str(err))
                self._wait(worker.profile.pod_sync_backoff_s)
                return
            self.prepared = True
        worker.post_running(self)
        self.state = "running"
        worker.timeline.record("pod.running", "kubelet", pod=self.ref["name"], pod_uid=self.ref["uid"],
                               claims=sorted(_meta(c).get("name", "") for c in claims))

    # -- termination --------------------------------------------------------------------------

    def _terminate(self) -> None:
        worker, name = self.worker, self.ref["name"]
        worker.timeline.record("pod.killing", "kubelet", pod=name, pod_uid=self.ref["uid"],
                               removed=self.removed, grace_s=_meta(self.pod).get("deletionGracePeriodSeconds"))
        if self.prepared:
            dra = worker.dra()
            while True:
                try:
                    if dra is None:
                        raise RuntimeError("the kubelet has no DRA manager")
                    dra.unprepare_pod(self.ref)
                    break
                except Exception as err:  # UnprepareError: SyncTerminatedPod fails and is retried
                    worker.timeline.record("pod.unprepare_failed", "kubelet", pod=name, error=str(err))
                    if self._wait(worker.profile.pod_sync_backoff_s):
                        return
                    dra = worker.dra()
            self.prepared = False
        if not self.removed:
            worker.finish_deletion(self)
        self.state = "terminated"
        worker.timeline.record("pod.terminated", "kubelet", pod=name, pod_uid=self.ref["uid"])


class PodWorker:
    """Watches the Pods bound to one node and runs each in a `_PodSync` of its own."""

    def __init__(self, client: KubeClient, node_name: str, timeline: Timeline, profile: Profile,
                 dra: Callable[[], DRAManager | None]) -> None:
        self.client, self.node_name, self.timeline, self.profile = client, node_name, timeline, profile
        self.dra = dra
        self.stopping = threading.Event()
        self._pods: dict[str, _PodSync] = {}
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    def start(self) -> PodWorker:
        if not self._threads:
            for target, name in ((self._watch, "pod-watch"), (self._follow_health, "pod-health")):
                thread = threading.Thread(target=target, daemon=True, name=f"{name}-{self.node_name}")
                thread.start()
                self._threads.append(thread)
        return self

    def stop(self) -> None:
        """The kubelet stops: its pod workers stop too; pods keep their API state (and claims stay prepared)."""
        self.stopping.set()
        for thread in self._threads:
            thread.join(WATCH_S + STOP_JOIN_S)
        with self._lock:
            syncs = list(self._pods.values())
        for sync in syncs:
            sync.join(STOP_JOIN_S)

    def pods(self) -> dict[str, str]:
        """Pod name -> the worker's state for it."""
        with self._lock:
            return {s.ref["name"]: s.state for s in self._pods.values()}

    # -- watching -----------------------------------------------------------------------------

    def _watch(self) -> None:
        path, selector = "/api/v1/pods", f"spec.nodeName={self.node_name}"
        while not self.stopping.is_set():
            try:
                listed = self.client.get(f"{path}?fieldSelector={selector}")
                present = {_meta(p).get("uid", ""): p for p in listed.get("items") or []}
                for pod in present.values():
                    self._seen(pod)
                with self._lock:
                    gone = [s for uid, s in self._pods.items() if uid not in present]
                for sync in gone:
                    sync.update(None)
                version = listed["metadata"]["resourceVersion"]
                for event in self.client.watch(f"{path}?fieldSelector={selector}", version, WATCH_S):
                    if self.stopping.is_set():
                        return
                    pod = event.get("object") or {}
                    if event.get("type") in ("ADDED", "MODIFIED"):
                        self._seen(pod)
                    elif event.get("type") == "DELETED":
                        with self._lock:
                            sync = self._pods.get(_meta(pod).get("uid", ""))
                        if sync is not None:
                            sync.update(None)
            except (ApiError, OSError, KeyError, ValueError) as err:
                self.timeline.record("api.error", "kubelet", what="watching pods", error=str(err))
                if self.stopping.wait(RETRY_S):
                    return

    def _seen(self, pod: dict) -> None:
        uid = _meta(pod).get("uid", "")
        with self._lock:
            sync = self._pods.get(uid)
            if sync is None:
                self.timeline.record("pod.seen", "kubelet", pod=_meta(pod).get("name"), pod_uid=uid,
                                     claims=claim_names(pod))
                self._pods[uid] = _PodSync(self, pod)
                return
        sync.update(pod, sync=_spec_changed(sync.pod, pod))

    def _follow_health(self) -> None:
        """Re-post the allocatedResourcesStatus of the running pods on a device a health message changed."""
        index = len(self.timeline.events())
        while not self.stopping.is_set():
            events = self.timeline.after(index, 1.0)
            index += len(events)
            changed = [e for e in events if e.kind == HEALTH_UPDATE_EVENT and e.get("changed")]
            dra = self.dra() if changed else None
            if dra is None:
                continue
            uids: set[str] = set()
            for e in changed:
                uids |= dra.pods_using(e.get("driver", ""), set(e.get("changed")))
            with self._lock:
                syncs = [s for uid, s in self._pods.items() if s.state == "running" and uid in uids]
            for sync in syncs:
                sync.update(sync.pod)

    # -- writing the API ----------------------------------------------------------------------

    def _resources_status(self, sync: _PodSync) -> dict[str, list[dict]]:
        """Container name -> allocatedResourcesStatus, named by the pod's claim names (cm/dra/manager.go)."""
        dra = self.dra()
        by_claim = dra.allocated_resources_status(sync.ref["uid"]) if dra is not None else {}
        actual = claim_names(sync.pod)
        out: dict[str, list[dict]] = {}
        for container in (sync.pod.get("spec") or {}).get("containers") or []:
            statuses: list[dict] = []
            for use in (container.get("resources") or {}).get("claims") or []:
                claim = actual.get(use.get("name", ""))
                if not claim:
                    continue
                request = use.get("request") or ""
                keys = [f"claim:{claim}/{request}"] if request else \
                    [k for k in by_claim if k == f"claim:{claim}" or k.startswith(f"claim:{claim}/")]
                seen: set[str] = set()
                resources = []
                for key in keys:
                    for r in by_claim.get(key, []):
                        if r["resourceID"] not in seen:
                            seen.add(r["resourceID"])
                            resources.append(r)
                name = f"claim:{use['name']}/{request}" if request else f"claim:{use['name']}"
                statuses.append({"name": name, "resources": resources})
            out[container.get("name", "")] = statuses
        return out

    def _container_statuses(self, sync: _PodSync, started: str) -> list[dict]:
        health = self._resources_status(sync)
        statuses = []
        for container in (sync.pod.get("spec") or {}).get("containers") or []:
            name = container.get("name", "")
            status = {"name": name, "ready": True, "started": True, "restartCount": 0,
                      "image": container.get("image", ""), "imageID": "",
                      "containerID": f"fakelet://{sync.ref['uid']}/{name}",
                      "state": {"running": {"startedAt": started}}}
            if health.get(name):
                status["allocatedResourcesStatus"] = health[name]
            statuses.append(status)
        return statuses

    def post_running(self, sync: _PodSync) -> None:
        now = rfc3339()
        sync.started = now
        conditions = [{"type": kind, "status": "True", "lastTransitionTime": now}
                      for kind in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady",
                                   "PodScheduled")]
        status = {"phase": "Running", "conditions": conditions, "hostIP": "127.0.0.1",
                  "hostIPs": [{"ip": "127.0.0.1"}], "startTime": now,
                  "containerStatuses": self._container_statuses(sync, now)}
        self._patch_status(sync, status)

    def post_health(self, sync: _PodSync) -> None:
        statuses = self._container_statuses(sync, sync.started or rfc3339())
        current = {c.get("name"): c.get("allocatedResourcesStatus")
                   for c in (sync.pod.get("status") or {}).get("containerStatuses") or []}
        if {c["name"]: c.get("allocatedResourcesStatus") for c in statuses} != current:
            self._patch_status(sync, {"containerStatuses": statuses})
            self.timeline.record("pod.resources_status", "kubelet", pod=sync.ref["name"],
                                 status={c["name"]: c.get("allocatedResourcesStatus") for c in statuses})

    def _patch_status(self, sync: _PodSync, status: dict[str, Any]) -> None:
        path = f"/api/v1/namespaces/{sync.ref['namespace']}/pods/{sync.ref['name']}/status"
        try:
            sync.pod = self.client.patch(path, {"metadata": {"uid": sync.ref["uid"]}, "status": status})
        except ApiError as err:
            if err.status not in (404, 409):  # gone or replaced meanwhile: the watch tells the rest
                self.timeline.record("api.error", "kubelet", what=f"pod {sync.ref['name']} status", error=str(err))

    def finish_deletion(self, sync: _PodSync) -> None:
        """The status manager's final delete: grace period 0, only this incarnation of the pod (UID)."""
        path = f"/api/v1/namespaces/{sync.ref['namespace']}/pods/{sync.ref['name']}"
        body = {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0,
                "preconditions": {"uid": sync.ref["uid"]}}
        sync.removed = True  # before the request: the watch's DELETED for it is this deletion, not another's
        gone = False
        try:
            self.client.request("DELETE", path, body)
        except ApiError as err:
            gone = err.status in (404, 409)  # already gone (a grace period of 0 removed it) or replaced
        self.timeline.record("pod.deleted", "kubelet", pod=sync.ref["name"], pod_uid=sync.ref["uid"],
                             **({"before_kubelet": True} if gone else {}))

