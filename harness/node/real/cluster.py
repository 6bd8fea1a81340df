"""The "real cluster" code path of the Node interface, shared by every real kubelet fakelet drives.

`ClusterNode` reads and does what a cluster operator would, through the API
server: capacity and allocatable from the Node's status (watched; each change
on the timeline as `node.status`), pod phases and container states from the
Pod (`node.pod`, plus the fake pod worker's `pod.running`/`pod.killing`/`pod.deleted`), pods
created with `nodeName` on the node's image, pod deletion. What differs from
one real node to the next sits behind a `NodeShell`: how its kubelet starts,
stops and restarts (which deletes the sockets, the real way), where its
PodResources socket is, and how to read a container's OCI spec from its
runtime. `LocalNode` (localnode.py) is this with a shell of local processes in
a namespace of their own; the kind tier (harness/node/kind/) is this with a shell
of `docker exec` into the kind node.
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from harness.controlplane.allocator import Allocator
from harness.controlplane.client import ApiError, KubeClient
from harness.instruments.timeline import Event, Timeline
from harness.kubelet.devicemanager import AdmissionError, ContainerAllocation
from harness.kubelet.podresources import read_pod_resources
from harness.node.real.view import ContainerView
from harness.spec.profiles import Profile

NAMESPACE = "fakelet-real"  # where a real node's pods live
WATCH_S = 60.0  # one watch request; the loop renews it
RETRY_S = 0.5  # after a failed watch
POD_START_TIMEOUT_S = 60.0  # a pod on a local image: sandbox, container, start (a few seconds here)
PODRES_TIMEOUT_S = 10.0
# kubelet pkg/kubelet/container/sync_result.go and images/types.go: a container that will not start
CONTAINER_REFUSALS = ("CreateContainerError", "CreateContainerConfigError", "RunContainerError",
                      "ErrImageNeverPull", "PreStartHookError")


class NotOnRealKubelet(RuntimeError):
    """A check asked for something only the fake kubelet can do (a fault it injects)."""


class NodeShell(Protocol):
    """What differs between real nodes: their kubelet's life, and two of the node's own files."""

    pod_image: str  # the image a pod runs on this node without a registry
    pod_resources_socket: Path  # the kubelet's PodResources socket, as fakelet reaches it

    @property
    def running(self) -> bool: ...
    @property
    def starts(self) -> int: ...  # kubelet instances so far: the number of the running one
    def prepare(self) -> None: ...
    def start_kubelet(self) -> None: ...
    def stop_kubelet(self, remove_socket: bool = False) -> None: ...
    def container_spec(self, container_id: str) -> dict[str, Any]: ...
    def kubelet_log_tail(self, lines: int = 15) -> str: ...
    def kubelet_file(self, name: str) -> Path | None: ...  # the node's /var/lib/kubelet/<name>, as fakelet reaches it
    def power_off_pods(self) -> int: ...  # kill every pod's containers as a power cut does; how many
    def close(self) -> None: ...


def _refused(pod_event: Event) -> str:
    """The runtime's refusal of a container, as the kubelet reports it (the pod stays Pending)."""
    for c in pod_event.get("containers") or []:
        waiting = (c.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in CONTAINER_REFUSALS:
            return f"{waiting['reason']}: {waiting.get('message', '')[:400]}"
    return ""


def view_of_spec(spec: dict[str, Any]) -> ContainerView:
    """What a container got, from its OCI spec: device nodes by major:minor, mounts, env."""
    view = ContainerView()
    for d in (spec.get("linux") or {}).get("devices") or []:
        view.devices[d["path"]] = (int(d.get("major", -1)), int(d.get("minor", -1)))
    for m in spec.get("mounts") or []:
        view.mounts[m["destination"]] = m.get("source", "")
    for item in (spec.get("process") or {}).get("env") or []:
        key, _, value = item.partition("=")
        view.env[key] = value
    return view


@dataclass
class _Pod:
    name: str
    uid: str
    container: str


class ClusterNode:
    """A real kubelet's node, seen and driven through the API server; its shell does the rest."""

    kind = "real"

    def __init__(self, shell: NodeShell, timeline: Timeline, profile: Profile, client: KubeClient,
                 node_name: str) -> None:
        self.shell, self.timeline, self.profile, self.client = shell, timeline, profile, client
        self.node_name = node_name
        self._pods: dict[str, _Pod] = {}
        self._running: set[str] = set()  # pod UIDs seen Running
        self._killing: set[str] = set()  # pod UIDs seen being deleted
        self._status: dict[str, Any] = {}  # the Node's status as last watched
        # The Node's resourceVersion once the previous kubelet had exited: a status newer than
        # this one was written by the current kubelet (a dead one's last write lands before).
        self._fence_rv = 0
        self._prepared = False
        self._stopping = threading.Event()
        self._watchers: list[threading.Thread] = []

    # -- lifecycle --------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self.shell.running

    @property
    def pod_resources_socket(self) -> Path:
        return self.shell.pod_resources_socket

    @property
    def instance(self) -> int:
        return self.shell.starts

    def prepare(self) -> ClusterNode:
        """Everything but the kubelet: the node's runtime (its shell), the namespace, the API watches."""
        if self._prepared:
            return self
        self.shell.prepare()
        self._prepared = True
        Allocator(client=self.client).ensure_namespace(NAMESPACE)
        self._watch(f"/api/v1/nodes?fieldSelector=metadata.name={self.node_name}", self._on_node)
        self._watch(f"/api/v1/pods?fieldSelector=spec.nodeName={self.node_name}", self._on_pod)
        return self

    def start_kubelet(self, arm: Callable[..., object] | None = None, **faults: Any) -> None:
        if arm is not None or any(faults.values()):
            raise NotOnRealKubelet("a fault injected into the kubelet itself needs the fake kubelet")
        if self.running:
            return
        self.prepare()
        self.shell.start_kubelet()

    def stop_kubelet(self, remove_socket: bool = False) -> None:
        if not self.running:
            return
        self.shell.stop_kubelet(remove_socket)
        self._fence_rv = self._node_version()

    def restart_kubelet(self, arm: Callable[..., object] | None = None, **faults: Any) -> None:
        if arm is not None or any(faults.values()):
            raise NotOnRealKubelet("a fault injected into the kubelet itself needs the fake kubelet")
        self.stop_kubelet()
        self.start_kubelet()

    def close(self) -> None:
        self._stopping.set()
        for pod in list(self._pods.values()):
            self._delete(pod.name, grace=0)
        self.shell.close()
        try:
            self.client.delete(f"/api/v1/nodes/{self.node_name}")
        except (ApiError, OSError):
            pass  # the API server may be gone first; the node object goes with it
        for thread in self._watchers:
            thread.join(2)

    def kubelet_log_tail(self, lines: int = 15) -> str:
        return self.shell.kubelet_log_tail(lines)

    def kubelet_file(self, name: str) -> Path | None:
        """The kubelet's own state file `name` (its checkpoints), where fakelet can read it; None if it cannot."""
        return self.shell.kubelet_file(name)

    def power_off_pods(self) -> int:
        """Every pod's containers gone, as after a power cut: a kubelet that starts next re-creates them."""
        return self.shell.power_off_pods()

    # -- what the API server shows ----------------------------------------------------------

    def _watch(self, path: str, on_object: Callable[[str, dict], None]) -> None:
        def run() -> None:
            while not self._stopping.is_set():
                try:
                    listed = self.client.get(path)
                    for obj in listed.get("items") or []:
                        on_object("ADDED", obj)
                    version = listed["metadata"]["resourceVersion"]
                    for event in self.client.watch(path, version, WATCH_S):
                        if self._stopping.is_set():
                            return
                        if event.get("type") in ("ADDED", "MODIFIED", "DELETED"):
                            on_object(event["type"], event.get("object") or {})
                except (ApiError, OSError, KeyError, ValueError) as err:
                    if self._stopping.is_set():
                        return
                    self.timeline.record("api.error", "node", what=f"watching {path}", error=str(err)[:300])
                    if self._stopping.wait(RETRY_S):
                        return
        thread = threading.Thread(target=run, daemon=True, name=f"realnode-watch-{len(self._watchers)}")
        self._watchers.append(thread)
        thread.start()

    def _node_version(self) -> int:
        try:
            return int(self.client.get(f"/api/v1/nodes/{self.node_name}")["metadata"]["resourceVersion"])
        except (ApiError, OSError, KeyError, ValueError):
            return 0

    def _on_node(self, kind: str, node: dict) -> None:
        status = node.get("status") or {}
        try:
            version = int((node.get("metadata") or {}).get("resourceVersion") or 0)
        except ValueError:
            version = 0
        self._status = {} if kind == "DELETED" else status
        extended = {k: (int(v), int((status.get("allocatable") or {}).get(k, 0)))
                    for k, v in (status.get("capacity") or {}).items() if "/" in k and str(v).isdigit()}
        self.timeline.record("node.status", "node", node=self.node_name, version=version,
                             resources={k: {"capacity": c, "allocatable": a} for k, (c, a) in extended.items()})

    def _on_pod(self, kind: str, pod: dict) -> None:
        meta, status = pod.get("metadata") or {}, pod.get("status") or {}
        uid = meta.get("uid")
        # The fake pod worker's event kinds, so that DRAEnv's waits read both kubelets alike.
        if meta.get("deletionTimestamp") and uid not in self._killing and kind != "DELETED":
            # The pod worker's pod.killing: the Pod is being deleted (by a user or an eviction), so the kubelet
            # stops its containers and, once they are gone, unprepares its claims and finishes the deletion.
            self._killing.add(uid)
            self.timeline.record("pod.killing", "node", pod=meta.get("name"), pod_uid=uid)
        if kind == "DELETED":
            self.timeline.record("pod.deleted", "node", pod=meta.get("name"), pod_uid=uid)
        elif status.get("phase") == "Running" and uid not in self._running:
            self._running.add(uid)
            self.timeline.record("pod.running", "node", pod=meta.get("name"), pod_uid=uid)
        self.timeline.record("node.pod", "node", pod=meta.get("name"), pod_uid=meta.get("uid"),
                             change=kind, phase=status.get("phase"), reason=status.get("reason"),
                             message=(status.get("message") or "")[:300],
                             containers=[{"name": c.get("name"), "id": c.get("containerID"),
                                          "ready": c.get("ready"), "state": c.get("state")}
                                         for c in status.get("containerStatuses") or []])

    def pod_name(self, pod: str) -> str | None:
        """The name of the Pod this node created for the caller's pod key (its `node.pod` events carry it)."""
        known = self._pods.get(pod)
        return known.name if known is not None else None

    def pod_uid(self, pod: str) -> str | None:
        """The Pod's UID, as the kubelet's checkpoint names it."""
        known = self._pods.get(pod)
        return known.uid if known is not None else None

    def _resource(self, resource: str, which: str) -> int | None:
        value = (self._status.get(which) or {}).get(resource)
        return None if value is None else int(value)

    def capacity(self, resource: str) -> int | None:
        return self._resource(resource, "capacity")

    def allocatable(self, resource: str) -> int | None:
        return self._resource(resource, "allocatable")

    def wait_resource(self, resource: str, test: Callable[[int | None, int | None], bool], since_ns: int,
                      timeout_s: float, awaiting: str) -> Event:
        """The first Node status after `since_ns`, written by the running kubelet, whose capacity and
        allocatable of `resource` pass `test`."""
        fence = self._fence_rv

        def ok(e: Event) -> bool:
            got = (e.get("resources") or {}).get(resource) or {}
            return (e.kind == "node.status" and e.get("version", 0) > fence
                    and test(got.get("capacity"), got.get("allocatable")))
        return self.timeline.wait_for(ok, timeout_s, awaiting, since_ns,
                                      abort=lambda e: e.kind == "kubelet.exit",
                                      relevant=("node.status", "kubelet.start", "kubelet.stop", "kubelet.exit"))

    # -- pods ------------------------------------------------------------------------------------

    def runnable(self, pod: dict) -> dict:
        """`pod` made runnable here: the node's own image (no registry), host network (no CNI), short grace."""
        spec = pod["spec"]
        spec.update({"hostNetwork": True, "automountServiceAccountToken": False,
                     "terminationGracePeriodSeconds": 1, "tolerations": [{"operator": "Exists"}]})
        for c in spec["containers"]:
            c.update({"image": self.shell.pod_image, "imagePullPolicy": "Never"})
        return pod

    def _pod_body(self, name: str, requests: dict[str, int], container: str,
                  spec: dict[str, Any] | None = None) -> dict:
        limits = {k: str(v) for k, v in requests.items()}
        body = self.runnable({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"app.kubernetes.io/managed-by": "fakelet"}},
            "spec": {
                "nodeName": self.node_name,  # no scheduler: straight to this kubelet
                "restartPolicy": "Never",
                "containers": [{"name": container, "resources": {"limits": limits, "requests": limits}}],
            },
        })
        body["spec"].update(spec or {})  # last: a scenario's grace period and tolerations over the defaults
        return body

    def admit_pod(self, pod: str, requests: dict[str, int], container: str = "main", *,
                  spec: dict[str, Any] | None = None, timeout_s: float = POD_START_TIMEOUT_S
                  ) -> list[ContainerAllocation]:
        """Create a Pod on this node asking for `requests`; once it runs, what each resource gave it.

        `spec` is set in the Pod's spec over the defaults; `timeout_s` bounds the wait for it to settle
        (WaitTimeout). The kubelet's admission refusal (the pod Failed, e.g. UnexpectedAdmissionError) raises
        AdmissionError with the kubelet's message, as the fake kubelet's does."""
        name = f"{pod}-{secrets.token_hex(3)}"
        since = self.timeline.now()
        created = self.client.create(f"/api/v1/namespaces/{NAMESPACE}/pods",
                                     self._pod_body(name, requests, container, spec))
        uid = created["metadata"]["uid"]
        self._pods[pod] = _Pod(name, uid, container)
        settled = self.timeline.wait_for(
            lambda e: e.kind == "node.pod" and e.get("pod_uid") == uid and (
                e.get("phase") in ("Running", "Failed", "Succeeded") or bool(_refused(e))),
            timeout_s, f"pod {name} running on the real kubelet", since, relevant=("node.pod",))
        refused = _refused(settled)
        if refused:
            raise AdmissionError(refused)
        if settled.get("phase") != "Running":
            raise AdmissionError(f"{settled.get('reason') or 'pod ' + str(settled.get('phase'))}: "
                                 f"{settled.get('message')}")
        devices = self.pod_devices(pod)
        view = self.container_view(pod)
        return [ContainerAllocation(container, resource, ids, {"runtime": view.__dict__})
                for resource, ids in devices.items() if resource in requests]

    def start_pod(self, pod: str) -> None:
        """Containers start as part of admit_pod on a real kubelet (PreStartContainer included)."""

    def pod_devices(self, pod: str) -> dict[str, list[str]]:
        """Device IDs per resource as the kubelet's PodResources API reports them."""
        known = self._pods.get(pod)
        if known is None:
            return {}
        listed = read_pod_resources(self.pod_resources_socket, PODRES_TIMEOUT_S)
        out: dict[str, list[str]] = {}
        for p in listed.get("pods") or []:
            if p.get("name") != known.name or p.get("namespace") != NAMESPACE:
                continue
            for c in p.get("containers") or []:
                for d in c.get("devices") or []:
                    out.setdefault(d["resource_name"], []).extend(d.get("device_ids") or [])
        return out

    def container_view(self, pod: str) -> ContainerView:
        """The container's OCI spec as its runtime holds it: what runc was asked to give it."""
        known = self._pods[pod]
        status = self.client.get(f"/api/v1/namespaces/{NAMESPACE}/pods/{known.name}").get("status") or {}
        ids = [c.get("containerID", "") for c in status.get("containerStatuses") or []
               if c.get("name") == known.container]
        if not ids or "://" not in ids[0]:
            raise AdmissionError(f"pod {known.name}: the kubelet reports no container {known.container}")
        return view_of_spec(self.shell.container_spec(ids[0].split("://", 1)[1]))

    def allocated_resources_status(self, pod: str) -> dict[str, list[dict]]:
        known = self._pods.get(pod)
        if known is None:
            return {}
        return self.allocated_resources_status_of(NAMESPACE, known.name)

    def allocated_resources_status_of(self, namespace: str, name: str) -> dict[str, list[dict]]:
        """Each container's allocatedResourcesStatus, as the API server shows any Pod on this node."""
        status = self.client.get(f"/api/v1/namespaces/{namespace}/pods/{name}").get("status") or {}
        return {c.get("name", ""): c.get("allocatedResourcesStatus") or []
                for c in status.get("containerStatuses") or []}

    def delete_pod(self, pod: str, grace: int | None = None) -> None:
        """Delete the Pod (`grace`: the DeleteOptions' gracePeriodSeconds; None: the Pod's own)."""
        known = self._pods.pop(pod, None)
        if known is not None:
            self._delete(known.name, grace=grace)

    def _delete(self, name: str, grace: int | None) -> None:
        path = f"/api/v1/namespaces/{NAMESPACE}/pods/{name}"
        if grace is not None:
            path += f"?gracePeriodSeconds={grace}"
        try:
            self.client.delete(path)
        except (ApiError, OSError):
            pass
