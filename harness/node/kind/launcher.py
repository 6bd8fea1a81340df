"""The subject on a kind cluster: its image deployed as the DaemonSet that ships it.

The process launcher's interface, the cluster's way: `start` applies the
rendered objects (manifests.py) and waits, bounded, for the DaemonSet's pod to
run on the node; `restart` deletes the pod, so that the DaemonSet controller
starts a new one, as after a crash (`crash=True`: grace period 0); `signal`
(SIGTERM) deletes the pod with its grace period, the way the kubelet stops a
container; `stop` deletes the DaemonSet and the objects made for it. Each
pod's phase is on the timeline (`process.start`, `process.exit`), so the
checks' waits read the same events as with any launcher.
"""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from typing import Any

from harness.controlplane.client import ApiError, KubeClient
from harness.instruments.timeline import Timeline
from harness.node.kind import manifests
from harness.spec.subjects import SubjectSpec

POD_READY_TIMEOUT_S = 120.0  # image already loaded into the node: a pod runs in seconds
WATCH_S = 30.0

PATHS = {"ServiceAccount": "/api/v1/namespaces/{ns}/serviceaccounts",
         "ClusterRole": "/apis/rbac.authorization.k8s.io/v1/clusterroles",
         "ClusterRoleBinding": "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
         "DaemonSet": "/apis/apps/v1/namespaces/{ns}/daemonsets"}


class DaemonSetLauncher:
    def __init__(self, spec: SubjectSpec, image: str, client: KubeClient, timeline: Timeline, log_path: Path,
                 node_name: str) -> None:
        self.name = spec.name
        self.app = f"fakelet-{spec.name}"[:63]
        self.objects = manifests.daemonset(spec, image, self.app)
        self.client, self.timeline, self.log_path, self.node_name = client, timeline, log_path, node_name
        self.starts = 0
        self.pod: str | None = None
        self._exited = threading.Event()

    def _path(self, obj: dict[str, Any]) -> str:
        return PATHS[obj["kind"]].format(ns=manifests.NAMESPACE)

    def start(self) -> DaemonSetLauncher:
        try:
            self.client.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                      "metadata": {"name": manifests.NAMESPACE}})
        except ApiError as err:
            if err.status != 409:
                raise
        for obj in self.objects:
            try:
                self.client.create(self._path(obj), obj)
            except ApiError as err:
                if err.status != 409:
                    raise
        self._await_pod()
        return self

    def _pods(self) -> list[dict[str, Any]]:
        return self.client.list(f"/api/v1/namespaces/{manifests.NAMESPACE}/pods",
                                label_selector=f"{manifests.APP_LABEL}={self.app}",
                                field_selector=f"spec.nodeName={self.node_name}")

    def _await_pod(self, not_named: str | None = None) -> None:
        """Until a pod of the DaemonSet (other than `not_named`) runs on the node, bounded."""
        deadline = self.timeline.now() + int(POD_READY_TIMEOUT_S * 1e9)
        path = (f"/api/v1/namespaces/{manifests.NAMESPACE}/pods?labelSelector={manifests.APP_LABEL}={self.app}"
                f"&fieldSelector=spec.nodeName={self.node_name}")
        while self.timeline.now() < deadline:
            items, version = self.client.list_with_version(path)
            for pod in items:
                if pod["metadata"]["name"] != not_named and (pod.get("status") or {}).get("phase") == "Running":
                    self._started(pod)
                    return
            for _ in self.client.watch(path, version, WATCH_S):
                break  # something changed: list again
        raise RuntimeError(f"the DaemonSet {self.app} ran no pod on {self.node_name} within {POD_READY_TIMEOUT_S:g}s")

    def _started(self, pod: dict[str, Any]) -> None:
        self.starts += 1
        self.pod = pod["metadata"]["name"]
        self._exited.clear()
        self.timeline.record("process.start", self.name, pid=None, start=self.starts, pod=self.pod)

    @property
    def running(self) -> bool:
        return self.pod is not None and not self._exited.is_set()

    pid = None
    main_pid = None
    proc = None

    def _delete_pod(self, grace: int | None) -> None:
        if self.pod is None:
            return
        path = f"/api/v1/namespaces/{manifests.NAMESPACE}/pods/{self.pod}"
        self.client.delete(path + (f"?gracePeriodSeconds={grace}" if grace is not None else ""))
        self.timeline.record("process.exit", self.name, pid=None, returncode=None, pod=self.pod)
        self._exited.set()

    def signal(self, sig: int) -> None:
        """SIGTERM: the pod deleted with its grace period; SIGKILL: at once. Other signals: not on a cluster."""
        self.timeline.record("process.signal", self.name, pid=None, signal=signal.Signals(sig).name)
        self._delete_pod(0 if sig == signal.SIGKILL else None)

    def wait_exit(self, timeout_s: float) -> int | None:
        return 0 if self._exited.wait(timeout_s) else None

    def kill(self) -> None:
        self.signal(signal.SIGKILL)

    def restart(self, crash: bool = False) -> None:
        """As the DaemonSet controller replaces a pod that is gone."""
        self.timeline.record("fault.plugin_restart", "harness", subject=self.name, crash=crash)
        old = self.pod
        self._delete_pod(0 if crash else None)
        self._await_pod(not_named=old)

    def stop(self, grace_s: float = 1.0) -> None:
        for obj in reversed(self.objects):
            name = obj["metadata"]["name"]
            try:
                self.client.delete(f"{self._path(obj)}/{name}")
            except (ApiError, OSError):
                pass
        if self.pod is not None and not self._exited.is_set():
            self.timeline.record("process.exit", self.name, pid=None, returncode=None, pod=self.pod)
            self._exited.set()

    def log_tail(self, lines: int = 20) -> str:
        if self.pod is None:
            return ""
        try:
            got = self.client.request("GET", f"/api/v1/namespaces/{manifests.NAMESPACE}/pods/{self.pod}/log",
                                      query={"tailLines": str(lines)}, raw=True)
        except (ApiError, OSError) as err:
            return f"(no log: {err})"
        return bytes(got).decode(errors="replace")

    def stderr_tail(self, lines: int = 20) -> str:
        return self.log_tail(lines)
