"""LocalNode: the Node interface on a real kubelet, against the local control plane's API server.

The kubelet (built from tests/go/kubernetes, like kube-apiserver) and Debian's
containerd run in a namespace of their own (namespace.py) where:

- /var/lib/kubelet, /var/lib/containerd, /run/containerd and /var/log/{pods,containers}
  are private tmpfs mounts, so the host's are never touched;
- the sandbox's device-plugins, plugins_registry and plugins dirs are bound at
  /var/lib/kubelet/..., so the plugin (which sees the same sandbox dirs) and the
  kubelet share one socket directory: the kubelet's own socket deletion on start
  is the real one;
- the kubelet's PodResources socket is bound out to the sandbox, for the harness.

What a check reads comes from where a cluster operator would read it: capacity
and allocatable from the Node's status (watched, every change on the timeline
as `node.status`), pod phases from the Pod (`node.pod`), the devices a container
got from the container runtime's own record of it (`ctr containers info`), and
device IDs from the kubelet's PodResources API.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inotify_simple import INotify
from inotify_simple import flags as IN

from harness.controlplane.allocator import Allocator
from harness.controlplane.base import ControlPlaneUnavailable
from harness.controlplane.client import ApiError, KubeClient
from harness.controlplane.local import _free_port as free_port
from harness.controlplane.local import find_kube_binary
from harness.kubelet.devicemanager import AdmissionError, ContainerAllocation
from harness.kubelet.podresources import read_pod_resources
from harness.profiles import Profile
from harness.realnode import configs, image
from harness.realnode.cgroups import CGROUP_PREFIX, make_cgroups, reap_cgroups, remove_cgroups
from harness.realnode.namespace import Daemon, NamespaceError, NodeNamespace
from harness.realnode.view import ContainerView
from harness.reaper import owner_tag
from harness.sandbox import Sandbox
from harness.timeline import Event, Timeline

KUBELET_PACKAGE = "k8s.io/kubernetes/cmd/kubelet"
HOST_KUBELET_ROOT = "/var/lib/kubelet"  # kubelet --root-dir default; device-plugins under it is fixed
PRIVATE_DIRS = ["/var/lib/kubelet", "/var/lib/containerd", "/run/containerd", "/var/log/pods",
                "/var/log/containers"]
NAMESPACE = "fakelet-real"  # where LocalNode's pods live
RUNTIME_READY_TIMEOUT_S = 30.0  # containerd to answer `ctr version` (about 1 s here)
CTR_TIMEOUT_S = 30.0  # one ctr call (an image import included)
WATCH_S = 60.0  # one watch request; the loop renews it
RETRY_S = 0.5  # after a failed watch
POD_START_TIMEOUT_S = 60.0  # a pod on the local image: sandbox, container, start (a few seconds here)
PODRES_TIMEOUT_S = 10.0
KUBELET_STOP_GRACE_S = 10.0
KUBELET_READY_TIMEOUT_S = 60.0  # start to kubelet.sock: about 0.8 s here
EXIT_CHECK_S = 0.5  # while waiting for kubelet.sock, how often to see whether the kubelet died instead
# Lines of the kubelet's log (at --v 2) that say what the fake kubelet records as events:
LOG_EVENTS = (
    # cm/devicemanager/plugin/v1beta1/server.go Register()
    (re.compile(r'"Got registration request from device plugin with resource" resourceName="(?P<resource>[^"]+)"'),
     "kubelet.register_received"),
    # cm/dra/plugin/dra_plugin_manager.go: the driver's gRPC connection is up (it registered)
    (re.compile(r'"Connection changed".*driverName="(?P<driver>[^"]+)".*connected=true'), "dra.registered"),
)
# kubelet pkg/kubelet/container/sync_result.go and images/types.go: a container that will not start
CONTAINER_REFUSALS = ("CreateContainerError", "CreateContainerConfigError", "RunContainerError",
                      "ErrImageNeverPull", "PreStartHookError")
TOOLS = {"containerd": "Debian package containerd", "ctr": "Debian package containerd",
         "containerd-shim-runc-v2": "Debian package containerd", "runc": "Debian package runc",
         "nsenter": "util-linux"}


class RealNodeUnavailable(RuntimeError):
    """This machine cannot run a real kubelet: checks on it skip with this one-line reason."""


class NotOnRealKubelet(RuntimeError):
    """A check asked for something only the fake kubelet can do (a fault it injects)."""


def unavailable() -> str | None:
    """Why a real kubelet cannot run here, in one line, or None."""
    if os.geteuid() != 0:
        return "the real kubelet needs root (it mounts, creates cgroups and device nodes)"
    for tool, package in TOOLS.items():
        if shutil.which(tool) is None and not Path("/usr/sbin", tool).exists():
            return f"{tool} not found ({package})"
    try:
        image.find_busybox()
    except image.ImageError as err:
        return str(err)
    return None


@dataclass(frozen=True)
class NodeAccess:
    """Where a real kubelet joins: the API server's kubeconfig (the kubelet's own credentials) and a client."""

    kubeconfig: Path
    client: KubeClient


def _refused(pod_event: Event) -> str:
    """The runtime's refusal of a container, as the kubelet reports it (the pod stays Pending)."""
    for c in pod_event.get("containers") or []:
        waiting = (c.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in CONTAINER_REFUSALS:
            return f"{waiting['reason']}: {waiting.get('message', '')[:400]}"
    return ""


@dataclass
class _Pod:
    name: str
    uid: str
    container: str


class LocalNode:
    """One real kubelet (restartable) and its container runtime, for one sandbox."""

    kind = "real"

    def __init__(self, sandbox: Sandbox, timeline: Timeline, profile: Profile, kubeconfig: Path,
                 client: KubeClient, node_name: str | None = None) -> None:
        self.sandbox, self.timeline, self.profile = sandbox, timeline, profile
        self.kubeconfig, self.client = Path(kubeconfig), client
        self.node_name = node_name or f"fakelet-real-{secrets.token_hex(4)}"
        self.workdir = sandbox.path / "node"
        self.podres_dir = self.workdir / "pod-resources"
        self.runtime_socket = self.workdir / "containerd.sock"
        # The owner tag lets the next run remove what a SIGKILLed one left (reap_cgroups).
        self.cgroup_root = f"/{CGROUP_PREFIX}{owner_tag()}-{secrets.token_hex(3)}"
        self.namespace: NodeNamespace | None = None
        self.containerd: Daemon | None = None
        self.kubelet: Daemon | None = None
        self.starts = 0
        self.kubelet_binary: Path | None = None
        self.kubelet_version: str | None = None
        self._pods: dict[str, _Pod] = {}
        self._running: set[str] = set()  # pod UIDs seen Running
        self._status: dict[str, Any] = {}  # the Node's status as last watched
        # The Node's resourceVersion once the previous kubelet had exited: a status newer than
        # this one was written by the current kubelet (a dead one's last write lands before).
        self._fence_rv = 0
        self._stopping = threading.Event()
        self._watchers: list[threading.Thread] = []

    # -- lifecycle --------------------------------------------------------------------------

    @property
    def kubelet_socket(self) -> Path:
        return self.sandbox.plugin_dir / "kubelet.sock"

    @property
    def pod_resources_socket(self) -> Path:
        return self.podres_dir / "kubelet.sock"

    @property
    def running(self) -> bool:
        return self.kubelet is not None and self.kubelet.running

    def prepare(self) -> LocalNode:
        """Everything but the kubelet: the namespace, containerd with the image, the API watches."""
        if self.namespace is not None:
            return self
        why = unavailable()
        if why:
            raise RealNodeUnavailable(why)
        try:
            self.kubelet_binary, self.kubelet_version = find_kube_binary("kubelet", KUBELET_PACKAGE)
        except ControlPlaneUnavailable as err:
            raise RealNodeUnavailable(str(err).splitlines()[0]) from None
        reap_cgroups()
        self.workdir.mkdir(mode=0o700, exist_ok=True)
        self.podres_dir.mkdir(mode=0o750, exist_ok=True)
        binds = {str(self.sandbox.plugin_dir): f"{HOST_KUBELET_ROOT}/device-plugins",
                 str(self.sandbox.registry_dir): f"{HOST_KUBELET_ROOT}/plugins_registry",
                 str(self.sandbox.plugins_dir): f"{HOST_KUBELET_ROOT}/plugins",
                 str(self.podres_dir): f"{HOST_KUBELET_ROOT}/pod-resources",
                 str(self.sandbox.cdi_dir): "/var/run/cdi"}
        try:
            self.namespace = NodeNamespace(binds, PRIVATE_DIRS, [HOST_KUBELET_ROOT],
                                           self.workdir / "namespace.log").start()
            self._start_runtime()
        except (NamespaceError, image.ImageError, OSError, subprocess.SubprocessError) as err:
            self.close()
            raise RealNodeUnavailable(f"the real node's runtime did not start: {err}") from None
        Allocator(client=self.client).ensure_namespace(NAMESPACE)
        self._watch(f"/api/v1/nodes?fieldSelector=metadata.name={self.node_name}", self._on_node)
        self._watch(f"/api/v1/pods?fieldSelector=spec.nodeName={self.node_name}", self._on_pod)
        return self

    def _start_runtime(self) -> None:
        assert self.namespace is not None
        config = self.workdir / "containerd.toml"
        config.write_text(configs.containerd_toml(self.runtime_socket, image.IMAGE_REF))
        self.containerd = self.namespace.enter("containerd", ["containerd", "--config", str(config)],
                                               self.workdir / "containerd.log")
        deadline = time.monotonic() + RUNTIME_READY_TIMEOUT_S
        while self._ctr(["version"], check=False).returncode != 0:
            if not self.containerd.running or time.monotonic() > deadline:
                raise NamespaceError(f"containerd did not serve {self.runtime_socket}: "
                                     f"{(self.workdir / 'containerd.log').read_text(errors='replace')[-300:]}")
            time.sleep(0.05)  # bounded by the deadline: containerd's socket has no readiness event
        archive = self.workdir / "image.tar"
        image.write_archive(archive)
        self._ctr(["-n", "k8s.io", "images", "import", str(archive)])
        archive.unlink()

    def _ctr(self, args: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(["ctr", "--address", str(self.runtime_socket), *args], capture_output=True,
                              text=True, timeout=CTR_TIMEOUT_S)
        if check and proc.returncode != 0:
            raise NamespaceError(f"ctr {' '.join(args[:3])} failed: {proc.stderr.strip()[-300:]}")
        return proc

    def start_kubelet(self, arm: Callable[..., object] | None = None, **faults: Any) -> None:
        if arm is not None or any(faults.values()):
            raise NotOnRealKubelet("a fault injected into the kubelet itself needs the fake kubelet")
        if self.running:
            return
        self.prepare()
        assert self.namespace is not None and self.kubelet_binary is not None
        make_cgroups(self.cgroup_root)
        config = self.workdir / "kubelet.json"
        config.write_text(configs.kubelet_config(self.runtime_socket, self.cgroup_root, free_port()))
        self.starts += 1
        # Watched before the kubelet runs: its start deletes every socket there, then serves a new kubelet.sock.
        with INotify() as inotify:
            inotify.add_watch(self.sandbox.plugin_dir, IN.CREATE | IN.MOVED_TO)
            self.kubelet = self.namespace.enter("kubelet", [
                str(self.kubelet_binary), "--config", str(config), "--kubeconfig", str(self.kubeconfig),
                "--hostname-override", self.node_name, "--node-ip", "127.0.0.1", "--v", "2",
            ], self.workdir / "kubelet.log", on_line=self._on_log)
            self.timeline.record("kubelet.start", "kubelet", instance=self.starts, real=True,
                                 socket=str(self.kubelet_socket), pid=self.kubelet.pid)
            watcher = threading.Thread(target=self._watch_exit, args=(self.kubelet, self.starts), daemon=True,
                                       name=f"realnode-kubelet-{self.starts}")
            watcher.start()
            self._wait_serving(inotify, self.kubelet)

    def _wait_serving(self, inotify: INotify, kubelet: Daemon) -> None:
        """Return once the kubelet serves its new kubelet.sock, as the fake kubelet's start does: a plugin
        started earlier would lose its socket to the kubelet's start-up cleanup."""
        deadline = time.monotonic() + KUBELET_READY_TIMEOUT_S
        while True:
            remaining = deadline - time.monotonic()
            if not kubelet.running or remaining <= 0:
                why = "exited" if not kubelet.running else f"served no kubelet.sock within {KUBELET_READY_TIMEOUT_S:g}s"
                raise RealNodeUnavailable(f"the real kubelet {why}:\n{self.kubelet_log_tail(8)}")
            # inotify's own timeout, in milliseconds; a short one so that an exit is noticed too.
            events = inotify.read(timeout=int(min(remaining, EXIT_CHECK_S) * 1000))
            if any(e.name == "kubelet.sock" for e in events):
                self.timeline.record("kubelet.serving", "kubelet", instance=self.starts, real=True)
                return

    def _on_log(self, line: str) -> None:
        """The real kubelet's own word for what the fake kubelet records of registrations."""
        for pattern, kind in LOG_EVENTS:
            match = pattern.search(line)
            if match:
                self.timeline.record(kind, "kubelet", instance=self.starts, real=True, **match.groupdict(),
                                     line=line[:300])

    def _watch_exit(self, kubelet: Daemon, instance: int) -> None:
        """A kubelet that exits on its own is on the timeline with its last words: waits end on it."""
        code = kubelet.outer.wait()
        if kubelet is self.kubelet:
            self.timeline.record("kubelet.exit", "kubelet", instance=instance, real=True, returncode=code,
                                 log=self.kubelet_log_tail(8))

    def stop_kubelet(self, remove_socket: bool = False) -> None:
        kubelet, self.kubelet = self.kubelet, None
        if kubelet is None:
            return
        code = kubelet.stop(grace_s=KUBELET_STOP_GRACE_S)
        self._fence_rv = self._node_version()
        if remove_socket:
            self.kubelet_socket.unlink(missing_ok=True)
        self.timeline.record("kubelet.stop", "kubelet", instance=self.starts, real=True, returncode=code)

    def restart_kubelet(self, arm: Callable[..., object] | None = None, **faults: Any) -> None:
        if arm is not None or any(faults.values()):
            raise NotOnRealKubelet("a fault injected into the kubelet itself needs the fake kubelet")
        self.stop_kubelet()
        self.start_kubelet()

    def close(self) -> None:
        self._stopping.set()
        for pod in list(self._pods.values()):
            self._delete(pod.name, grace=0)
        self.stop_kubelet()
        if self.containerd is not None:
            self.containerd.stop()
            self.containerd = None
        if self.namespace is not None:
            self.namespace.stop()
            self.namespace = None
        left = remove_cgroups(self.cgroup_root)
        if left:
            self.timeline.record("node.cleanup_failed", "node", cgroups=left)
        try:
            self.client.delete(f"/api/v1/nodes/{self.node_name}")
        except (ApiError, OSError):
            pass  # the API server may be gone first; the node object goes with it
        for thread in self._watchers:
            thread.join(2)

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

    @property
    def instance(self) -> int:
        return self.starts

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

    @staticmethod
    def runnable(pod: dict) -> dict:
        """`pod` made runnable here: the local image (no registry), host network (no CNI), short grace."""
        spec = pod["spec"]
        spec.update({"hostNetwork": True, "automountServiceAccountToken": False,
                     "terminationGracePeriodSeconds": 1, "tolerations": [{"operator": "Exists"}]})
        for c in spec["containers"]:
            c.update({"image": image.IMAGE_REF, "imagePullPolicy": "Never"})
        return pod

    def _pod_body(self, name: str, requests: dict[str, int], container: str) -> dict:
        limits = {k: str(v) for k, v in requests.items()}
        return self.runnable({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"app.kubernetes.io/managed-by": "fakelet"}},
            "spec": {
                "nodeName": self.node_name,  # no scheduler: straight to this kubelet
                "restartPolicy": "Never",
                "containers": [{"name": container, "resources": {"limits": limits, "requests": limits}}],
            },
        })

    def admit_pod(self, pod: str, requests: dict[str, int], container: str = "main") -> list[ContainerAllocation]:
        """Create a Pod on this node asking for `requests`; once it runs, what each resource gave it.

        The kubelet's admission refusal (the pod Failed, e.g. UnexpectedAdmissionError) raises
        AdmissionError with the kubelet's message, as the fake kubelet's does."""
        name = f"{pod}-{secrets.token_hex(3)}"
        since = self.timeline.now()
        created = self.client.create(f"/api/v1/namespaces/{NAMESPACE}/pods", self._pod_body(name, requests, container))
        uid = created["metadata"]["uid"]
        self._pods[pod] = _Pod(name, uid, container)
        settled = self.timeline.wait_for(
            lambda e: e.kind == "node.pod" and e.get("pod_uid") == uid and (
                e.get("phase") in ("Running", "Failed", "Succeeded") or bool(_refused(e))),
            POD_START_TIMEOUT_S, f"pod {name} running on the real kubelet", since, relevant=("node.pod",))
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
        """The container's OCI spec as containerd holds it: what runc was asked to give it."""
        known = self._pods[pod]
        status = self.client.get(f"/api/v1/namespaces/{NAMESPACE}/pods/{known.name}").get("status") or {}
        ids = [c.get("containerID", "") for c in status.get("containerStatuses") or []
               if c.get("name") == known.container]
        if not ids or "://" not in ids[0]:
            raise AdmissionError(f"pod {known.name}: the kubelet reports no container {known.container}")
        info = json.loads(self._ctr(["-n", "k8s.io", "containers", "info", ids[0].split("://", 1)[1]]).stdout)
        spec = info.get("Spec") or {}
        view = ContainerView()
        for d in (spec.get("linux") or {}).get("devices") or []:
            view.devices[d["path"]] = (int(d.get("major", -1)), int(d.get("minor", -1)))
        for m in spec.get("mounts") or []:
            view.mounts[m["destination"]] = m.get("source", "")
        for item in (spec.get("process") or {}).get("env") or []:
            key, _, value = item.partition("=")
            view.env[key] = value
        return view

    def allocated_resources_status(self, pod: str) -> dict[str, list[dict]]:
        known = self._pods.get(pod)
        if known is None:
            return {}
        status = self.client.get(f"/api/v1/namespaces/{NAMESPACE}/pods/{known.name}").get("status") or {}
        return {c.get("name", ""): c.get("allocatedResourcesStatus") or []
                for c in status.get("containerStatuses") or []}

    def delete_pod(self, pod: str) -> None:
        known = self._pods.pop(pod, None)
        if known is not None:
            self._delete(known.name, grace=None)

    def _delete(self, name: str, grace: int | None) -> None:
        path = f"/api/v1/namespaces/{NAMESPACE}/pods/{name}"
        if grace is not None:
            path += f"?gracePeriodSeconds={grace}"
        try:
            self.client.delete(path)
        except (ApiError, OSError):
            pass

    def kubelet_log_tail(self, lines: int = 15) -> str:
        try:
            text = (self.workdir / "kubelet.log").read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])
