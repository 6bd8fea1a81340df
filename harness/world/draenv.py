"""One DRA check's world: the DP world plus a registry, an API server and a scheduler.

`DRAEnv` adds to `DPEnv` what a DRA driver needs around it: the fake
kubelet's plugins_registry and plugins directories, a CDI directory, a node
name of its own, and, when an API server is available, the Node object, a
DeviceClass, claims allocated from the driver's own ResourceSlices, and a
watch that puts every change of those slices on the timeline.

Checks that need the API server call `need_api()`: without one they skip
with the reason, and the rest of the DRA checks still run.
"""

from __future__ import annotations

import importlib.util
import secrets
import threading
import uuid
from pathlib import Path
from typing import Any

from harness.controlplane import ApiError, ControlPlane
from harness.controlplane.allocator import AllocationError, Allocator
from harness.controlplane.client import RESOURCE_API, KubeClient
from harness.controlplane.scheduler import PodClaim, Scheduler, pod_body
from harness.controlplane.taints import TaintRules, describe_taint
from harness.instruments.teardown import run_all
from harness.instruments.timeline import Event, WaitTimeout
from harness.kubelet import dracheckpoint
from harness.kubelet.dramanager import DRAError, DRAManager, DRAPluginConn
from harness.kubelet.versions import HEALTH_SHORT, SERVICE_SHORT, KubeletVersion
from harness.kubelet.versions import get as get_kubelet_version
from harness.node.fake import FakeNode
from harness.node.interface import NodeApi
from harness.node.real.localnode import LocalNode, NodeAccess, NotOnRealKubelet
from harness.spec.checks import unavailable, with_install
from harness.spec.profiles import Profile
from harness.spec.subjects import SubjectSpec
from harness.world.draprobe import DRAProbe
from harness.world.env import DPEnv, SubjectUnavailable

HOST_KUBELET_DIR = "/var/lib/kubelet"  # kubelet --root-dir default
HOST_CDI_DIR = "/var/run/cdi"  # CDI spec directory for dynamic specs (tags.cncf.io/container-device-interface)
ETCD_INSTALL = "apt-get install -y etcd-server"  # Debian's etcd (harness/controlplane/local.py)
# The fake hardware of the checks that need partitioned GPUs (harness/spec/checks.py PARTITIONED), when the
# subject's own inventory has none: fixtures/-relative, as a subject's backend inventory.
PARTITIONED_INVENTORY = "inventories/gpus-partitioned.yaml"
# The same for the checks that need a shareable device (harness/spec/checks.py SHARED).
SHARED_INVENTORY = "inventories/gpus-shared.yaml"
# The same for the checks that need a fabric-attached device (harness/spec/checks.py FABRIC).
FABRIC_INVENTORY = "inventories/nics-fabric.yaml"
REFERENCE_HEALTH_REFRESH_S = 1.0  # {health_refresh_s} for subjects that take it (the reference driver)
SLICE_WATCH_S = 5.0  # one watch request's server-side timeout; the loop re-lists and re-watches
DRA_KINDS = ("dra.registered", "dra.rejected", "dra.deregistered", "pluginwatcher.getinfo",
             "pluginwatcher.rejected", "process.exit", "kubelet.start", "kubelet.stop")

# What the pod worker and the DRA manager say about a pod, quoted when a wait for it times out.
POD_KINDS = ("pod.seen", "pod.waiting", "pod.sync_failed", "pod.running", "pod.killing", "pod.unprepare_failed",
             "pod.deleted", "pod.terminated", "pod.sync_error", "dra.prepare", "dra.unprepare", "api.slices",
             "process.exit", "device.fail", "device.recover", "device.heat", "device.cool")


def install_hint(control_plane_error: str) -> str:
    """The one command that installs what the local control plane missed, when it is a package."""
    if "etcd not found" in control_plane_error:
        return ETCD_INSTALL
    return ""


def short_id() -> str:
    return secrets.token_hex(4)


class DRAEnv(DPEnv):
    def __init__(self, spec: SubjectSpec, profile: Profile, defect: str | None = None, seed: int = 0,
                 binary: str | None = None, artifacts: Path | None = None, *,
                 kubelet_version: KubeletVersion | None = None, control_plane: ControlPlane | None = None,
                 control_plane_error: str = "no API server configured", real_node: NodeAccess | None = None,
                 partitioned: bool = False, shared: bool = False, fabric: bool = False) -> None:
        """`partitioned`: the check needs partitioned GPUs: the fake backend starts with PARTITIONED_INVENTORY when
        the subject's inventory has no partitions; `shared`, a shareable device: SHARED_INVENTORY when it has none;
        `fabric`, a fabric-attached device: FABRIC_INVENTORY when it has none."""
        if spec.needs_api and control_plane is None:
            raise SubjectUnavailable(with_install(
                f"subject {spec.name} cannot start without an API server: {control_plane_error}",
                install_hint(control_plane_error)))
        if spec.requires_python is not None:
            module = spec.requires_python["import"]
            try:
                found = importlib.util.find_spec(module) is not None
            except ImportError:
                found = False
            if not found:
                distribution = spec.requires_python["distribution"]
                raise SubjectUnavailable(with_install(
                    f"subject {spec.name}: Python package {distribution} not installed (no module {module})",
                    f"python3 -m pip install {distribution}"))
        self.kubelet_version = kubelet_version or get_kubelet_version("default")
        self.control_plane, self.control_plane_error = control_plane, control_plane_error
        self.node_name = f"fakelet-{short_id()}"  # also the namespace: checks sharing an API server never meet
        self.client: KubeClient | None = control_plane.client() if control_plane is not None else None
        self._slice_stop = threading.Event()
        self._slice_thread: threading.Thread | None = None
        self._api_objects = False
        # On a real kubelet: the harness's own connections to the driver, by endpoint (one per instance).
        self._own_conns: dict[str, DRAPluginConn] = {}
        self.retired: list[Any] = []  # instances a rolling update replaced (harness/world/surge.py), stopped at close
        super().__init__(spec, profile, defect, seed, binary, artifacts, real_node=real_node,
                         partitioned_inventory=PARTITIONED_INVENTORY if partitioned else None,
                         shared_inventory=SHARED_INVENTORY if shared else None,
                         fabric_inventory=FABRIC_INVENTORY if fabric else None)
        self.driver = spec.driver or spec.resource
        self.allocator = Allocator(self.client, self.timeline) if self.client is not None else None
        runnable = self.node.runnable if isinstance(self.node, LocalNode) else None
        self.scheduler = Scheduler(self.allocator, runnable) if self.allocator is not None else None
        self.taint_rules = TaintRules(self.client) if self.client is not None else None

    # -- setup -------------------------------------------------------------

    def _make_node(self) -> FakeNode | LocalNode:
        # plugins/<driver> too: DaemonSets mount it with DirectoryOrCreate, and some drivers
        # (the upstream e2e test driver) only create its parent.
        own = self.sandbox.plugins_dir / (self.spec.driver or self.spec.resource)
        for d in (self.sandbox.registry_dir, self.sandbox.plugins_dir, own, self.sandbox.cdi_dir, self.driver_state):
            d.mkdir(parents=True, exist_ok=True)
        if self.real_node is not None:
            return LocalNode(self.sandbox, self.timeline, self.profile, self.real_node.kubeconfig,
                             self.real_node.client, node_name=self.node_name, release=self.kubelet_version.name,
                             translate=self.host_path)
        api = NodeApi(self.client, self.node_name) if self.client is not None else None
        return FakeNode(self.sandbox.plugin_dir, self.sandbox.state_dir, self.timeline, self.profile,
                        registry_dir=self.sandbox.registry_dir, kubelet_version=self.kubelet_version,
                        translate=self.host_path, api=api)

    @property
    def driver_state(self) -> Path:
        return self.sandbox.path / "driver-state"

    @property
    def in_namespace(self) -> bool:
        """The driver sees the sandbox at the kubelet's host paths (a mount namespace or a container)."""
        return self.spec.host_view

    def _ready_dirs(self) -> list[Path]:
        # A DRA driver serves once its registration socket is in plugins_registry (a device plugin
        # registering through it counts too); a device plugin's socket lands in device-plugins.
        return [self.sandbox.registry_dir, self.sandbox.plugin_dir]

    def _namespace_binds(self) -> dict[str, str]:
        return {str(self.sandbox.kubelet_root): HOST_KUBELET_DIR, str(self.sandbox.cdi_dir): HOST_CDI_DIR}

    def _more_placeholders(self) -> dict[str, str]:
        kubelet = HOST_KUBELET_DIR if self.in_namespace else str(self.sandbox.kubelet_root)
        cdi = HOST_CDI_DIR if self.in_namespace else str(self.sandbox.cdi_dir)
        kubeconfig = ""
        if self.control_plane is not None:
            kubeconfig = str(self.control_plane.kubeconfig)
        return {
            "registry_dir": f"{kubelet}/plugins_registry", "plugins_dir": f"{kubelet}/plugins",
            "cdi_dir": cdi, "kubeconfig": kubeconfig, "node_name": self.node_name,
            "state_dir": str(self.driver_state), "driver": self.spec.driver or self.spec.resource,
            # Often enough that DRA-HLT-01 sees a refresh at once; well inside the 30 s health timeout.
            "health_refresh_s": f"{min(self.profile.dra_health_timeout_s / 3, REFERENCE_HEALTH_REFRESH_S):g}",
        }

    def host_path(self, path: str) -> str:
        """A path the subject named (its mount namespace's view) as the harness sees it."""
        if self.in_namespace:
            for host_dir, sandbox_dir in ((HOST_KUBELET_DIR, self.sandbox.kubelet_root),
                                          (HOST_CDI_DIR, self.sandbox.cdi_dir)):
                if path == host_dir or path.startswith(host_dir + "/"):
                    return str(sandbox_dir) + path[len(host_dir):]
        return path

    # -- lifecycle ---------------------------------------------------------

    def start_subject(self) -> None:
        if self.client is not None and not self._api_objects:
            # Drivers own their slices through the Node object; it must exist first.
            self._api_objects = True
            assert self.allocator is not None
            self.allocator.ensure_node(self.node_name)
            self.allocator.ensure_namespace(self.node_name)
            self._start_slice_watch()
        super().start_subject()

    def start(self) -> DRAEnv:
        super().start()
        return self

    @property
    def real(self) -> bool:
        """Whether the kubelet is a real one (harness/node/real), reached through the relay."""
        return not isinstance(self.node, FakeNode)

    def start_kubelet(self) -> None:
        since, started = self.now(), not self.node.running  # a check may start an env that runs already
        super().start_kubelet()
        if self.real and self.client is not None and started:
            # A real kubelet wipes every ResourceSlice of its node once it starts (dra_plugin_manager.go
            # NewDRAPluginManager, in the background): a driver started before that would see its first
            # slices deleted. The driver starts after the wipe, as after a kubelet that came up earlier.
            self.wait_wiped(since)

    def wait_wiped(self, since_ns: int) -> Event:
        """A real kubelet's start-up wipe of the node's ResourceSlices (its log's `dra.wipe`). Not seeing it is
        the harness's error, never the driver's failure: the kubelet does it, whatever the driver does."""
        try:
            return self.timeline.wait_for(
                lambda e: e.kind == "dra.wipe" and e.get("real"), self.profile.reaction_s,
                "the real kubelet's start-up deletion of the node's ResourceSlices", since_ns,
                abort=lambda e: e.kind == "kubelet.exit", relevant=("dra.wipe", "kubelet.start", "kubelet.exit"))
        except WaitTimeout as err:
            raise RuntimeError(f"the real kubelet's log did not show its start-up ResourceSlice wipe: {err}") from None

    def fake_dra(self) -> DRAManager:
        """The fake kubelet's DRA manager, for a fault only it injects (NotOnRealKubelet on a real node)."""
        if self.real:
            raise NotOnRealKubelet("the fault is injected into the fake kubelet's DRA manager (a real kubelet's "
                                   "cannot be made to reject a registration or hold a call)")
        assert isinstance(self.node, FakeNode) and self.node.dra is not None
        return self.node.dra

    def close(self) -> None:
        # As DPEnv.close: each step runs whatever an earlier one raised. Taint rules are cluster-wide: left
        # behind, they would taint other checks' devices.
        steps = [*(i.stop for i in self.retired), super().close, self._close_own_conn, self._slice_stop.set,
                 self._join_slice_watch]
        if self.taint_rules is not None:
            steps.append(self.taint_rules.close)
        if self.client is not None and self._api_objects:
            steps.append(self._delete_api_objects)
        run_all(steps)

    def _join_slice_watch(self) -> None:
        if self._slice_thread is not None:
            self._slice_thread.join(SLICE_WATCH_S + 2)

    def _delete_api_objects(self) -> None:
        """Best effort: a shared API server must not fill up with dead checks' objects."""
        assert self.client is not None
        paths = [f"/api/v1/namespaces/{self.node_name}", f"/api/v1/nodes/{self.node_name}",
                 f"{RESOURCE_API}/deviceclasses/{self.device_class}"]
        try:
            mine = f"spec.nodeName={self.node_name}"
            for s in self.client.list(f"{RESOURCE_API}/resourceslices", field_selector=mine):
                paths.append(f"{RESOURCE_API}/resourceslices/{s['metadata']['name']}")
        except (ApiError, OSError):
            pass
        for path in paths:
            try:
                self.client.delete(path)
            except (ApiError, OSError):
                pass

    # -- the API server ------------------------------------------------------

    def need_api(self) -> KubeClient:
        if self.client is None:
            unavailable(f"needs a kube-apiserver: {self.control_plane_error}", install_hint(self.control_plane_error))
        assert self.client is not None
        return self.client

    @property
    def device_class(self) -> str:
        return f"{self.node_name}-class"

    def slices(self) -> list[dict[str, Any]]:
        client = self.need_api()
        return client.list(f"{RESOURCE_API}/resourceslices", field_selector=f"spec.nodeName={self.node_name}")

    def _start_slice_watch(self) -> None:
        self._slice_thread = threading.Thread(target=self._watch_slices, daemon=True, name="slice-watch")
        self._slice_thread.start()

    def _watch_slices(self) -> None:
        """Record the node's full slice set on the timeline each time it changes."""
        assert self.client is not None
        path = f"{RESOURCE_API}/resourceslices"
        selector = f"spec.nodeName={self.node_name}"
        current: dict[str, dict[str, Any]] = {}
        while not self._slice_stop.is_set():
            try:
                listed = self.client.get(f"{path}?fieldSelector={selector}")
                fresh = {s["metadata"]["name"]: s for s in listed.get("items", [])}
                if fresh != current:
                    current = fresh
                    self._record_slices(current)
                version = listed["metadata"]["resourceVersion"]
                for event in self.client.watch(f"{path}?fieldSelector={selector}", version, SLICE_WATCH_S):
                    if self._slice_stop.is_set():
                        return
                    obj = event.get("object", {})
                    name = obj.get("metadata", {}).get("name")
                    if event.get("type") == "DELETED":
                        current.pop(name, None)
                    elif event.get("type") in ("ADDED", "MODIFIED"):
                        current[name] = obj
                    else:
                        continue
                    self._record_slices(current)
            except (ApiError, OSError, KeyError, ValueError) as err:
                self.timeline.record("api.error", "harness", what="watching ResourceSlices", error=str(err))
                if self._slice_stop.wait(1.0):  # the API server is away: retry on a timer, not in a spin
                    return

    def _record_slices(self, current: dict[str, dict[str, Any]]) -> None:
        devices = [d for s in current.values() for d in s["spec"].get("devices", [])]
        # Taints first: a timeout's "saw instead" shows the short fields before the cut slices.
        self.timeline.record("api.slices", "apiserver", node=self.node_name,
                             devices=sorted(d["name"] for d in devices),
                             taints={d["name"]: [describe_taint(t) for t in d["taints"]]
                                     for d in devices if d.get("taints")},
                             slices=[current[k] for k in sorted(current)])

    def wait_slices(self, predicate: Any, awaiting: str, since_ns: int = 0, timeout_s: float | None = None) -> Event:
        """The first slice set (an `api.slices` event) for which `predicate(event)` holds."""
        self.need_api()
        return self.timeline.wait_for(
            lambda e: e.kind == "api.slices" and predicate(e), timeout_s or self.profile.reaction_s, awaiting,
            since_ns, abort=self._exit_abort, relevant=("api.slices", "process.exit", "api.error"))

    def new_pod(self, name: str = "pod") -> dict[str, str]:
        """A pod the check drives by hand through the kubelet's DRA manager.

        With an API server it is a real Pod object, left unscheduled (no node runs it), so that
        the resource-claim controller keeps the claims reserved for it as it would for a pod
        the scheduler is still placing."""
        name = f"{name}-{short_id()}"
        if self.client is None:
            return {"name": name, "namespace": self.node_name, "uid": str(uuid.uuid4())}
        pod = self.client.create(f"/api/v1/namespaces/{self.node_name}/pods", pod_body(self.node_name, name, {}))
        return {"name": name, "namespace": self.node_name, "uid": pod["metadata"]["uid"]}

    def allocated_claim(self, pod: dict[str, str], count: int = 1, name: str = "claim") -> dict[str, Any]:
        """A claim for `count` of the driver's devices, allocated on this node and reserved for `pod`."""
        self.need_api()
        assert self.allocator is not None
        self.allocator.ensure_device_class(self.device_class, self.driver)
        claim = self.allocator.create_claim(self.node_name, f"{name}-{short_id()}", self.device_class, count)
        try:
            return self.allocator.allocate(claim, self.node_name, self.driver, pod)
        except AllocationError as err:  # what the driver published cannot be allocated: its verdict
            raise AssertionError(f"expected the driver's ResourceSlices to offer {count} allocatable device(s) "
                                 f"on node {self.node_name}; the scheduler saw: {err}") from None

    def wait_allocatable(self, count: int = 1, since_ns: int = 0) -> Event:
        """Slices that offer at least `count` devices (the driver has published)."""
        return self.wait_slices(lambda e: len(e.get("devices")) >= count,
                                f"ResourceSlices of {self.driver} for node {self.node_name} with {count}+ devices",
                                since_ns)

    # -- real pods ---------------------------------------------------------------

    def need_controllers(self) -> None:
        """Skip unless a controller manager evicts (the local one, or a cluster's own)."""
        self.need_api()
        assert self.control_plane is not None
        if self.control_plane.controllers_error:
            unavailable(f"needs kube-controller-manager's device-taint eviction controller: "
                        f"{self.control_plane.controllers_error}")

    def run_pod(self, claims: list[PodClaim], name: str = "pod", template: bool = False, wait: bool = True, *,
                exact_name: bool = False, spec: dict[str, Any] | None = None
                ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """A real Pod with claims of its own, scheduled onto this node and running (its claims prepared).

        With `template`, its one claim comes from a ResourceClaimTemplate through the resource-claim
        controller. Without `wait` it is only scheduled (a kubelet that is down runs it when it starts).
        The pod is named `name` plus a suffix of its own, or `name` itself with `exact_name` (a pod made again
        under its old names); `spec` is set in its spec over the defaults (terminationGracePeriodSeconds).
        Returns the pod as created and its allocated claims."""
        self.need_api()
        assert self.allocator is not None and self.scheduler is not None
        self.allocator.ensure_device_class(self.device_class, self.driver)
        pod_name = name if exact_name else f"{name}-{short_id()}"
        if template:
            (claim,) = claims
            try:
                pod, made = self.scheduler.create_pod_from_template(
                    self.node_name, pod_name, self.device_class, claim, self.profile.reaction_s, spec)
            except AllocationError as err:
                raise AssertionError(f"expected the resource-claim controller to generate the pod's claim; saw: "
                                     f"{err}") from None
        else:
            pod, made = self.scheduler.create_pod(self.node_name, pod_name, self.device_class, claims, spec)
        since = self.now()
        try:
            allocated = self.scheduler.schedule(pod, made, self.node_name, self.driver)
        except AllocationError as err:
            raise AssertionError(f"expected the driver's ResourceSlices to offer devices for pod "
                                 f"{pod['metadata']['name']}'s claims on node {self.node_name}; the scheduler "
                                 f"saw: {err}") from None
        if wait:
            self.wait_pod("pod.running", pod, since, f"pod {pod['metadata']['name']} running (its claims prepared)",
                          self.profile.reaction_s + self.profile.dra_call_timeout_s)
        return pod, allocated

    def wait_pod(self, kind: str, pod: dict[str, Any], since_ns: int, awaiting: str,
                 timeout_s: float | None = None) -> Event:
        """The pod worker's `kind` event (pod.running, pod.killing, pod.deleted, ...) for this pod."""
        uid = pod["metadata"]["uid"]
        return self.timeline.wait_for(
            lambda e: e.kind == kind and e.get("pod_uid") == uid, timeout_s or self.profile.reaction_s, awaiting,
            since_ns, abort=self._exit_abort,
            relevant=POD_KINDS)

    def delete_pod(self, pod: dict[str, Any], grace_period_s: int | None = None) -> None:
        """A graceful delete, as kubectl does: the kubelet finishes it. `grace_period_s` is the DeleteOptions'
        gracePeriodSeconds (kubectl delete --grace-period; None: the pod's own terminationGracePeriodSeconds);
        0 removes the Pod from the API server at once, whatever the kubelet has still to do
        (pkg/registry/core/pod/strategy.go CheckGracefulDelete)."""
        assert self.client is not None
        meta = pod["metadata"]
        path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}"
        if grace_period_s is None:
            self.client.delete(path)
            return
        # The pod's UID as a precondition: a pod made again under the same name is never the one deleted.
        self.client.request("DELETE", path, {"apiVersion": "v1", "kind": "DeleteOptions",
                                             "gracePeriodSeconds": grace_period_s,
                                             "preconditions": {"uid": meta["uid"]}})

    # -- registration ----------------------------------------------------------

    def wait_started(self, since_ns: int = 0) -> bool:
        """As DPEnv's, for a driver: its start-up ends with a socket in plugins_registry (or, from a real
        kubelet, which does not log finding one, the registration itself). What follows, GetInfo and the
        registration, is the driver's reaction to the kubelet and keeps the reaction bound."""
        if not self._starting_up(since_ns):
            return False
        self.timeline.wait_for(
            lambda e: e.kind == "pluginwatcher.found"
            or (e.kind == "dra.registered" and e.get("driver") == self.driver),
            self.profile.startup_s, "a registration socket in plugins_registry", since_ns, abort=self._exit_abort,
            relevant=(*DRA_KINDS, "pluginwatcher.found"))
        return True

    def wait_dra_registered(self, since_ns: int = 0, timeout_s: float | None = None) -> Event:
        if timeout_s is None:
            self.wait_started(since_ns)
        return self.timeline.wait_for(
            lambda e: e.kind == "dra.registered" and e.get("driver") == self.driver,
            timeout_s or self.profile.reaction_s, f"a registration of DRA driver {self.driver}",
            since_ns, abort=self._exit_abort, relevant=DRA_KINDS)

    def wait_getinfo(self, since_ns: int = 0, timeout_s: float | None = None) -> Event:
        """The fake kubelet's first GetInfo call to any registration socket, answered or not."""
        if timeout_s is None:
            self.wait_started(since_ns)
        return self.timeline.wait_for(
            lambda e: e.kind == "pluginwatcher.getinfo", timeout_s or self.profile.reaction_s,
            "a registration socket in plugins_registry answering GetInfo", since_ns,
            abort=self._exit_abort, relevant=(*DRA_KINDS, "pluginwatcher.found"))

    def negotiated(self) -> dict[str, str]:
        """The versions the fake kubelet settled on with the driver in this check, if it registered."""
        found = self.timeline.find(lambda e: e.kind == "dra.registered" and e.get("driver") == self.driver)
        if not found:
            return {}
        last = found[-1]
        if last.get("real"):
            # A real kubelet's choice: what its log said, else what its calls through the relay used.
            service = self._chosen(last, "dra.service_chosen", "service")
            used = self.timeline.find(lambda e: e.kind == "dra.prepare" and e.get("relay")
                                      and e.get("driver") == self.driver, last.t_ns)
            dra = SERVICE_SHORT.get(service or "") or (str(used[-1].get("service_version")) if used else None)
            streamed = self.timeline.find(lambda e: e.kind == "dra.health" and e.get("driver") == self.driver,
                                          last.t_ns)
            out = {"dra": dra} if dra else {}
            return {**out, "dra-health": str(streamed[-1].get("version")) if streamed else "none"}
        # The kubelet may open a health stream the driver does not serve: count only one that delivered.
        streamed = self.timeline.find(lambda e: e.kind == "dra.health" and e.get("driver") == self.driver)
        health = last.get("health_version") if streamed else None
        return {"dra": str(last.get("service_version")), "dra-health": str(health or "none")}

    def registration_socket(self) -> str:
        """The registry socket through which the driver last registered."""
        # The watcher records its own event just after the DRA manager's: wait for it, briefly.
        event = self.timeline.wait_for(
            lambda e: e.kind == "pluginwatcher.registered" and e.get("name") == self.driver,
            self.profile.reaction_s, f"a registration of {self.driver} through plugins_registry",
            relevant=("pluginwatcher.registered", "dra.registered"))
        return str(event.get("socket"))

    def conn(self) -> Any:
        """The kubelet's connection to the driver, for the calls a check makes as the kubelet would. On a real
        kubelet, whose connection fakelet cannot call on, it is the harness's own connection to the endpoint the
        driver registered, with the service versions that kubelet uses (its calls recorded as the harness's)."""
        if self.real:
            return self._real_conn()
        manager = self.node.dra
        plugin = manager.plugin(self.driver) if manager is not None else None
        if plugin is None:
            raise AssertionError(f"expected DRA driver {self.driver} to be registered with the kubelet; it is not")
        return plugin

    def _real_conn(self) -> DRAPluginConn:
        found = self.timeline.find(lambda e: e.kind == "dra.registered" and e.get("driver") == self.driver)
        if not found:
            raise AssertionError(f"expected DRA driver {self.driver} to be registered with the kubelet; it is not")
        return self._own_conn_to(found[-1])

    def conn_to(self, reg: Event) -> DRAPluginConn:
        """As conn(), for the plugin that one registration (its `dra.registered` event) made: one instance of a
        rolling update while the other is registered too."""
        endpoint = str(reg.get("endpoint"))
        if self.real:
            return self._own_conn_to(reg)
        manager = self.node.dra
        found = [p for p in (manager.plugins(self.driver) if manager is not None else []) if p.endpoint == endpoint]
        if not found:
            raise AssertionError(f"expected DRA driver {self.driver}'s plugin at {endpoint} to be registered with "
                                 "the kubelet; it is not")
        return found[-1]

    def _own_conn_to(self, reg: Event) -> DRAPluginConn:
        endpoint = str(reg.get("endpoint"))
        if endpoint in self._own_conns:
            return self._own_conns[endpoint]
        versions = list(reg.get("versions") or [])
        chosen = self._chosen(reg, "dra.service_chosen", "service")
        service = chosen if chosen in SERVICE_SHORT else next(
            (s for s in self.kubelet_version.dra_services if s in versions), self.kubelet_version.dra_services[0])
        streamed = {HEALTH_SHORT[h]: h for h in HEALTH_SHORT}
        opened = self.timeline.find(lambda e: e.kind == "dra.health_stream" and e.get("driver") == self.driver
                                    and e.get("state") == "open", reg.t_ns)
        health = streamed.get(str(opened[-1].get("version"))) if opened else next(
            (h for h in self.kubelet_version.health_versions if h in versions), None)
        conn = DRAPluginConn(self.driver, endpoint, service, health, self.profile.dra_call_timeout_s,
                             self.timeline, self.host_path(endpoint), source="harness")
        self._own_conns[endpoint] = conn
        return conn

    def _chosen(self, reg: Event, kind: str, key: str) -> str | None:
        """What the real kubelet's log said it chose for this registration (V(3) lines), if it said: logged
        while the kubelet registers the driver, just before the relay sees it notify the driver."""
        said = [e for e in self.timeline.find(lambda e: e.kind == kind and e.get("driver") == self.driver)
                if e.get("instance") == reg.get("instance")]
        return str(said[-1].get(key)) if said else None

    def _close_own_conn(self) -> None:
        conns, self._own_conns = list(self._own_conns.values()), {}
        for conn in conns:
            conn.close()

    def probe(self, register: Event) -> DRAProbe:  # type: ignore[override]
        """A client of its own to the endpoint the driver registered."""
        return DRAProbe(self.host_path(register.get("endpoint")), self.timeline)

    def prepare(self, pod: dict[str, str], claims: list[dict[str, Any]],
                retry_s: float | None = None) -> dict[str, Any]:
        """What the kubelet does at pod admission: NodePrepareResources for the pod's claims. With `retry_s`, as
        the pod worker goes on: synced again after its back-off until prepared or `retry_s` passed (a check
        judging a driver that has just come back: the kubelet's registration of it may still be settling)."""
        if self.real:
            raise NotOnRealKubelet("a real kubelet prepares a pod's claims when it runs the pod (run_pod), not "
                                   "on the harness's request")
        manager = self.node.dra
        assert manager is not None
        try:
            if retry_s is not None:
                return manager.prepare_pod_retrying(pod, claims, retry_s)
            return manager.prepare_pod(pod, claims)
        except DRAError as err:  # the driver failed the kubelet: a verdict, not a harness error
            raise AssertionError(f"expected the kubelet to prepare pod {pod['name']}'s claims; saw: {err}") from None

    def prepared_cdi_ids(self, claim: dict[str, Any]) -> list[str]:
        """The CDI IDs the kubelet holds for `claim` ([] when it is not prepared): the fake kubelet's claim
        cache, or what a real kubelet wrote of it to its checkpoint."""
        if not isinstance(self.node, FakeNode):
            uid = claim["metadata"]["uid"]
            return [i for c in self.kubelet_claims() if c.uid == uid for d in c.drivers.get(self.driver, [])
                    for i in d.cdi_ids]
        prepared = self.node.dra.claims() if self.node.dra is not None else {}
        key = f"{claim['metadata']['namespace']}/{claim['metadata']['name']}"
        return prepared[key].cdi_ids if key in prepared else []

    def holds_claim(self, claim: dict[str, Any]) -> bool:
        """Whether the kubelet still has `claim` in its claim cache (a real kubelet: in its checkpoint)."""
        if isinstance(self.node, FakeNode):
            key = f"{claim['metadata']['namespace']}/{claim['metadata']['name']}"
            return self.node.dra is not None and key in self.node.dra.claims()
        return any(c.uid == claim["metadata"]["uid"] for c in self.kubelet_claims())

    def dra_checkpoint(self) -> Path:
        """The kubelet's DRA checkpoint file: in the fake kubelet's state dir, or in a real node's private
        /var/lib/kubelet (AssertionError when this node's cannot be reached from here)."""
        if isinstance(self.node, FakeNode):
            return self.sandbox.state_dir / dracheckpoint.CHECKPOINT_NAME
        path = self.node.kubelet_file(dracheckpoint.CHECKPOINT_NAME)
        if path is None:
            raise AssertionError("this node's kubelet checkpoint cannot be read from here")
        return path

    def kubelet_claims(self) -> list[dracheckpoint.ClaimInfoState]:
        """The claims in the kubelet's DRA checkpoint, read without creating it ([] while there is none)."""
        path = self.dra_checkpoint()
        try:
            return dracheckpoint.decode(path.read_bytes(), path)
        except FileNotFoundError:
            return []

    @staticmethod
    def claim_ref(claim: dict[str, Any]) -> tuple[str, str, str]:
        meta = claim["metadata"]
        return meta["namespace"], meta["uid"], meta["name"]

    @staticmethod
    def allocated_devices(claim: dict[str, Any], driver: str) -> list[tuple[str, str]]:
        results = claim.get("status", {}).get("allocation", {}).get("devices", {}).get("results", [])
        return sorted((r["pool"], r["device"]) for r in results if r["driver"] == driver)
