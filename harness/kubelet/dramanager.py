"""The fake kubelet's DRA manager, with upstream v1.36 semantics (other releases per versions.py).

Upstream: pkg/kubelet/cm/dra (manager.go, claiminfo.go, state/) and
pkg/kubelet/cm/dra/plugin (dra_plugin_manager.go, dra_plugin.go). The manager
is the plugin watcher's DRAPlugin handler: it validates the services a driver
advertises, opens one gRPC connection per registered plugin that serves every
service (NodePrepare/NodeUnprepare and the health stream), prepares and
unprepares a pod's claims in one call per driver, and checkpoints its claim
cache so a new kubelet instance knows what is prepared.

Retries: upstream never loops inside PrepareResources. A failure fails the pod
sync, and the pod worker syncs the pod again after backOffPeriod (10 s,
jittered); each sync calls PrepareResources from the top. `prepare_pod` is one
such sync and raises PrepareError; `prepare_pod_retrying` is the pod worker's
loop (profile pod_sync_backoff_s) for callers that want the kubelet's retries.
"""

from __future__ import annotations

import itertools
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from harness.instruments.dials import OK, endpoint_ids, record_dial
from harness.instruments.faults import FaultPlan
from harness.instruments.interceptors import RecordingClientInterceptor
from harness.instruments.timeline import Timeline
from harness.kubelet import dracheckpoint
from harness.kubelet.devicemanager import go_quote_list
from harness.kubelet.dracheckpoint import ClaimInfoState, Device
from harness.kubelet.drahealth import HEALTH_STATE_NAME, UNKNOWN, HealthInfoCache, HealthStream
from harness.kubelet.endpoint import go_status
from harness.kubelet.versions import (
    DRA_V1,
    DRA_V1ALPHA4,
    DRA_V1BETA1,
    HEALTH_SHORT,
    PICK_KUBELET_ORDER,
    SERVICE_SHORT,
    KubeletVersion,
)
from harness.kubelet.versions import default as default_version
from harness.spec.profiles import Profile
from harness.wire import dra_v1, dra_v1beta1

# kubelet pod_workers.go workerBackOffPeriodJitterFactor = 0.5 (wait.Jitter(backOffPeriod, 0.5)).
POD_SYNC_JITTER = 0.5
# The gRPC methods behind each DRA service (proto package + service name); the v1alpha4
# API (proto package v1alpha3, service Node) has v1beta1's messages field for field.
DRA_METHODS = {
    DRA_V1: "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/",
    DRA_V1BETA1: "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/",
    DRA_V1ALPHA4: "/v1alpha3.Node/",
}
DRA_MESSAGES = {DRA_V1: dra_v1, DRA_V1BETA1: dra_v1beta1, DRA_V1ALPHA4: dra_v1beta1}
INJECTED_REJECTION = "registration of DRA driver {driver} rejected by fakelet fault injection"


class KubeletWouldNotStart(AssertionError):
    """The kubelet cannot start from what it finds on disk: a failure of whoever wrote it, not of fakelet."""


class DRAError(RuntimeError):
    """A failed PrepareResources/UnprepareResources; the message is upstream's."""

    def __init__(self, message: str, claim: str | None = None, driver: str | None = None) -> None:
        super().__init__(message)
        self.claim, self.driver = claim, driver


class PrepareError(DRAError):
    pass


class UnprepareError(DRAError):
    pass


Claim = tuple[str, str, str]  # (namespace, uid, name), drapb.Claim


@dataclass
class PreparedClaim:
    """A claim as the node's claim cache holds it (claiminfo.go ClaimInfo)."""

    uid: str
    name: str
    namespace: str
    pods: set[str]
    devices: dict[str, list[Device]]  # driver -> devices NodePrepareResources returned
    prepared: bool

    @property
    def cdi_ids(self) -> list[str]:
        return [i for devs in self.devices.values() for d in devs for i in d.cdi_ids]


@dataclass
class _ClaimInfo:
    state: ClaimInfoState
    prepared: bool = False  # claiminfo.go: never checkpointed, so false after a restart

    def snapshot(self) -> PreparedClaim:
        s = self.state
        return PreparedClaim(s.uid, s.name, s.namespace, set(s.pod_uids),
                             {d: [Device(**vars(x)) for x in devs] for d, devs in s.drivers.items()}, self.prepared)


def _share_id(device: Any) -> str | None:
    # v1 only: v1beta1's Device has no share_id.
    if "share_id" in device.DESCRIPTOR.fields_by_name and device.HasField("share_id"):
        return str(device.share_id)
    return None


def results_to_dict(response: Any, unprepare: bool) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for uid, result in response.claims.items():
        entry: dict[str, Any] = {"error": result.error}
        if not unprepare:
            entry["devices"] = [
                {"pool": d.pool_name, "device": d.device_name, "requests": list(d.request_names),
                 "cdi_ids": list(d.cdi_device_ids), "share_id": _share_id(d)}
                for d in result.devices]
        out[uid] = entry
    return out


class DRAPluginConn:
    """One registered plugin of a driver (dra_plugin.go DRAPlugin): one channel for all services."""

    def __init__(self, driver: str, endpoint: str, service: str, health_service: str | None,
                 call_timeout_s: float, timeline: Timeline, dial_path: str | None = None,
                 kubelet_instance: int | None = None, source: str = "kubelet",
                 faults: FaultPlan | None = None) -> None:
        """`source`: who the calls are recorded as from (the harness's own client to a driver that a real
        kubelet registered records as "harness": the kubelet did not make those calls); `faults`: the kubelet's
        fault plan, whose holds keep the driver's answer from it (up to the call's deadline, as the kubelet's)."""
        self.driver, self.endpoint, self.service, self.source = driver, endpoint, service, source
        self.id, self.kubelet_instance = next(endpoint_ids), kubelet_instance
        self.service_version = SERVICE_SHORT[service]
        self.health_service = health_service
        self.health_version = HEALTH_SHORT[health_service] if health_service else None
        self.call_timeout_s, self.timeline = call_timeout_s, timeline
        self.connected = False
        self.registered_at = time.monotonic()
        # dra_plugin_manager.go add(): grpc.NewClient("unix:" + endpoint): created once, connects on demand.
        self.dial_path = dial_path or endpoint  # where fakelet finds the socket the plugin named
        self.raw = grpc.insecure_channel(f"unix:{self.dial_path}")
        self.channel = grpc.intercept_channel(self.raw, RecordingClientInterceptor(timeline, source, faults))
        self.health: HealthStream | None = None
        self._closed = False

    def describe(self) -> dict[str, Any]:
        return {"driver": self.driver, "endpoint": self.endpoint, "service_version": self.service_version,
                "health_version": self.health_version, "connected": self.connected}

    def _call(self, rpc: str, request: Any, response_type: Any, timeout_s: float | None) -> Any:
        method = self.channel.unary_unary(DRA_METHODS[self.service] + rpc,
                                          request_serializer=type(request).SerializeToString,
                                          response_deserializer=response_type.FromString)
        return method(request, timeout=self.call_timeout_s if timeout_s is None else timeout_s)

    def _claims(self, claims: list[Claim]) -> list[Any]:
        mod = DRA_MESSAGES[self.service]
        return [mod.Claim(namespace=ns, uid=uid, name=name) for ns, uid, name in claims]

    def node_prepare(self, claims: list[Claim], timeout_s: float | None = None, via: str = "raw") -> dict:
        """NodePrepareResources; {uid: {"devices": [...], "error": str}}. gRPC errors propagate."""
        mod = DRA_MESSAGES[self.service]
        request = mod.NodePrepareResourcesRequest(claims=self._claims(claims))
        return self._record("dra.prepare", claims, via, lambda: results_to_dict(
            self._call("NodePrepareResources", request, mod.NodePrepareResourcesResponse, timeout_s), False))

    def node_unprepare(self, claims: list[Claim], timeout_s: float | None = None, via: str = "raw") -> dict:
        """NodeUnprepareResources; {uid: {"error": str}}. gRPC errors propagate."""
        mod = DRA_MESSAGES[self.service]
        request = mod.NodeUnprepareResourcesRequest(claims=self._claims(claims))
        return self._record("dra.unprepare", claims, via, lambda: results_to_dict(
            self._call("NodeUnprepareResources", request, mod.NodeUnprepareResourcesResponse, timeout_s), True))

    def _record(self, kind: str, claims: list[Claim], via: str, call: Callable[[], dict]) -> dict:
        t0 = time.monotonic()
        event = {"driver": self.driver, "endpoint": self.endpoint, "service_version": self.service_version,
                 "claims": [uid for _, uid, _ in claims], "via": via}
        try:
            results = call()
        except grpc.RpcError as err:
            self.timeline.record(kind, self.source, outcome=go_status(err), results={},
                                 duration_s=round(time.monotonic() - t0, 6), **event)
            raise
        self.timeline.record(kind, self.source, outcome="OK", results=results,
                             duration_s=round(time.monotonic() - t0, 6), **event)
        return results

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self.health is not None:
            self.health.stop()
        self.raw.close()


class DRAManager:
    """One kubelet instance's DRA manager and DRA plugin handler; `FakeNode` makes one per restart."""

    _instances = itertools.count(1)

    def __init__(self, state_dir: Path, timeline: Timeline, profile: Profile,
                 version: KubeletVersion | None = None, *, health: bool | None = None,
                 wipe_slices: Callable[[str], None] | None = None,
                 translate: Callable[[str], str] | None = None, kubelet_instance: int | None = None,
                 faults: FaultPlan | None = None) -> None:
        """`kubelet_instance`: the number of the kubelet instance this manager is part of, on its `kubelet.dial`
        events (its own count of DRA managers when not given); `faults`: that kubelet instance's fault plan (its
        device manager's), whose holds keep a driver's NodePrepareResources or NodeUnprepareResources answer from
        the kubelet."""
        self.translate = translate  # a plugin's view of a path -> the harness's (mount-namespace launcher)
        self.state_dir, self.timeline, self.profile = Path(state_dir), timeline, profile
        self.version = version or default_version()
        # ResourceHealthStatus: None = the release's default; True forces the gate on (alpha releases).
        if health is None:
            self.health_services = self.version.health_versions
        else:
            self.health_services = self.version.gated_health_versions if health else ()
        self.wipe_slices = wipe_slices  # None: like a kubelet without an API client, nothing is wiped
        self.instance = next(self._instances)
        self.kubelet_instance = self.instance if kubelet_instance is None else kubelet_instance
        self.prepare_delay_s = 0.0  # fault: the kubelet holds each NodePrepareResources this long
        self.faults = faults
        self._lock = threading.RLock()
        self._store: dict[str, list[DRAPluginConn]] = {}  # driver -> plugins in registration order
        self._reject: dict[str, int] = {}
        self._wipes: dict[str, threading.Timer] = {}
        self._cache_lock = threading.RLock()
        self._claims: dict[str, _ClaimInfo] = {}  # "namespace/name" -> claim info (claimInfoCache)
        self._pods: dict[str, dict] = {}  # pod uid -> pod, for status lookups by name
        self._stopping = threading.Event()
        self.health_cache: HealthInfoCache | None = None
        self._started = False

    @property
    def checkpoint_path(self) -> Path:
        return self.state_dir / dracheckpoint.CHECKPOINT_NAME

    # -- lifecycle ---------------------------------------------------------

    def start(self) -> DRAManager:
        if self._started:
            return self
        self._started = True
        self.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            restored = dracheckpoint.read(self.checkpoint_path)
        except (ValueError, KeyError, TypeError, AttributeError, OSError) as err:
            self._started = False
            raise self._unreadable(err) from None
        with self._cache_lock:
            for state in restored:
                self._claims[f"{state.namespace}/{state.name}"] = _ClaimInfo(state)
        self.health_cache = HealthInfoCache(self.state_dir / HEALTH_STATE_NAME, self.profile.dra_health_timeout_s,
                                            self.timeline)
        self.timeline.record("dra.start", "kubelet", instance=self.instance, kubelet_version=self.version.name,
                             claims=sorted(c.uid for c in restored),
                             health_services=list(self.health_services))
        if self.wipe_slices is not None:
            # NewDRAPluginManager: no driver has registered yet, so wipe every driver's slices.
            threading.Thread(target=self._wipe, args=("", "startup"), daemon=True, name="dra-wipe").start()
        return self

    def _unreadable(self, err: BaseException) -> KubeletWouldNotStart:
        # Unlike the device manager, upstream does not go on without it: cm/dra manager.go NewManager
        # -> newClaimInfoCache -> checkpointer GetOrCreate fails ("failed to create claimInfo cache"),
        # so the container manager, and with it the kubelet, never starts.
        why = f"{type(err).__name__}: {err}"[:300]
        self.timeline.record("kubelet.checkpoint_unreadable", "kubelet", instance=self.instance,
                             checkpoint=dracheckpoint.CHECKPOINT_NAME, error=why,
                             finding=f"the kubelet's DRA checkpoint {dracheckpoint.CHECKPOINT_NAME} was unreadable "
                                     "at its start; a real kubelet refuses to start with it")
        return KubeletWouldNotStart(
            f"expected the kubelet to start; saw its DRA checkpoint {self.checkpoint_path.name} unreadable ({why}): "
            "a real kubelet fails to start (NewManager: failed to create claimInfo cache). Nothing but the kubelet "
            "writes that file, so the plugin (or something it started) did")

    def stop(self) -> None:
        """Close every connection and cancel pending wipes (DRAPluginManager.Stop); the checkpoint stays."""
        if not self._started or self._stopping.is_set():
            return
        self._stopping.set()
        with self._lock:
            plugins = [p for ps in self._store.values() for p in ps]
            timers = list(self._wipes.values())
            self._wipes.clear()
        for t in timers:
            t.cancel()
        for p in plugins:
            p.close()
        if self.health_cache is not None:
            self.health_cache.close()
        self.timeline.record("dra.stop", "kubelet", instance=self.instance)

    # -- fault knobs -------------------------------------------------------

    def reject_next_registration(self, driver: str, times: int = 1) -> None:
        """Make the next RegisterPlugin of `driver` fail, so the plugin is told registered=false."""
        with self._lock:
            self._reject[driver] = self._reject.get(driver, 0) + times

    # -- the DRAPlugin handler (cache.PluginHandler) -------------------------

    def _choose_service(self, versions: list[str]) -> tuple[str | None, str | None]:
        """validateSupportedServices: (service, None) or (None, error)."""
        if not versions:
            return None, "empty list of supported gRPC services (aka supported versions)"
        kubelet = self.version.dra_services
        if self.version.dra_pick == PICK_KUBELET_ORDER:
            chosen = next((s for s in kubelet if s in versions), self.version.dra_fallback)
        else:
            chosen = next((s for s in versions if s in kubelet), None)
        if chosen is None:
            return None, (f"none of services supported by the plugin ({go_quote_list(tuple(versions))}) "
                          f"are supported by the kubelet ({go_quote_list(kubelet)})")
        return chosen, None

    def _legacy(self) -> bool:
        # 1.32/1.33 (registration.go) word their errors differently from 1.34+ (dra_plugin_manager.go).
        return self.version.dra_fallback is not None

    def validate(self, name: str, endpoint: str, versions: list[str]) -> str | None:
        _, err = self._choose_service(versions)
        if err is None:
            return None
        if self._legacy():
            return f"invalid versions of plugin {name}: {err}"
        return f"invalid supported gRPC versions of DRA driver plugin {name} at endpoint {endpoint}: {err}"

    def _choose_health(self, versions: list[str]) -> str | None:
        if not self.health_services:
            return None
        if self.version.health_needs_advertising:
            return next((s for s in self.health_services if s in versions), None)  # pickHealthService
        return self.health_services[0]

    def register(self, name: str, endpoint: str, versions: list[str]) -> str | None:
        with self._lock:
            if self._reject.get(name, 0) > 0:
                self._reject[name] -= 1
                error = INJECTED_REJECTION.format(driver=name)
                self.timeline.record("dra.rejected", "kubelet", driver=name, endpoint=endpoint, error=error,
                                     injected=True)
                return error
        service, err = self._choose_service(versions)
        if service is None:
            if self._legacy():
                error = f"version check of plugin {name} failed: {err}"
            else:
                error = f"invalid supported gRPC versions of DRA driver plugin {name} at endpoint {endpoint}: {err}"
            self.timeline.record("dra.rejected", "kubelet", driver=name, endpoint=endpoint, error=error)
            return error
        replaced: list[DRAPluginConn] = []
        with self._lock:
            if self._stopping.is_set():
                return "kubelet is shutting down"
            existing = self._store.get(name, [])
            if self.version.replace_on_reregister:
                # 1.32 plugins_store.go add(): the new plugin replaces the old one, whatever its endpoint.
                replaced, existing = existing, []
            elif any(p.endpoint == endpoint for p in existing):
                # dra_plugin_manager.go add(): one plugin instance cannot hijack another's endpoint.
                what = "plugin" if self._legacy() else "DRA driver plugin"
                error = f"endpoint {endpoint} already registered for {what} {name}"
                self.timeline.record("dra.rejected", "kubelet", driver=name, endpoint=endpoint, error=error)
                return error
            health = self._choose_health(versions)
            conn = DRAPluginConn(name, endpoint, service, health, self.profile.dra_call_timeout_s, self.timeline,
                                 self.translate(endpoint) if self.translate else None, self.kubelet_instance,
                                 faults=self.faults)
            self._store[name] = [*existing, conn]
        for old in replaced:
            old.close()
        if health is not None and self.health_cache is not None:
            conn.health = HealthStream(name, conn.channel, health, self.health_cache, self.timeline,
                                       self.profile.dra_health_retry_s, self.version.health_stop_on_unimplemented)
        # conn.Connect() plus the stats handler: follow the connection so usability is known.
        conn.raw.subscribe(lambda state, c=conn: self._on_connectivity(c, state), try_to_connect=True)
        self.timeline.record("dra.registered", "kubelet", driver=name, endpoint=endpoint, versions=list(versions),
                             service_version=conn.service_version, health_version=conn.health_version,
                             replaced=[p.endpoint for p in replaced], plugins=len(self._store.get(name, [])))
        # Streamed only once the registration is on the timeline: checks look for the first health
        # message from the registration on, and a driver that sends it once only must not be missed.
        if conn.health is not None:
            conn.health.start()
        self._sync(name)
        return None

    def drop_health_streams(self, name: str) -> int:
        """End the driver's NodeWatchResources streams in flight, as a broken connection ends them; each loop opens
        its next stream after the retry period (drahealth.py HealthStream.drop). How many were open."""
        with self._lock:
            conns = list(self._store.get(name, []))
        return sum(1 for c in conns if c.health is not None and c.health.drop())

    def deregister(self, name: str, endpoint: str = "") -> None:
        """DeRegisterPlugin(driverName, endpoint): drop that plugin, close its connection and stream."""
        if self.version.replace_on_reregister:
            # 1.32 registration.go DeRegisterPlugin(pluginName) deletes by name: a stale registration
            # socket going away takes the plugin that replaced it along.
            endpoint = ""
        with self._lock:
            plugins = self._store.get(name, [])
            conn = next((p for p in plugins if not endpoint or p.endpoint == endpoint), None)
            if conn is None:
                return
            rest = [p for p in plugins if p is not conn]
            if rest:
                self._store[name] = rest
            else:
                del self._store[name]
        conn.close()  # outside the lock: closing may call back into _on_connectivity
        self.timeline.record("dra.deregistered", "kubelet", driver=name, endpoint=conn.endpoint,
                             plugins=len(rest))
        self._sync(name)

    def _on_connectivity(self, conn: DRAPluginConn, state: grpc.ChannelConnectivity) -> None:
        connected = state == grpc.ChannelConnectivity.READY
        with self._lock:
            if self._stopping.is_set():
                return
            # gRPC connects on demand and again after the plugin went away: each attempt ends READY or
            # TRANSIENT_FAILURE, and each is a dial of the plugin's socket.
            if not conn.closed and state in (grpc.ChannelConnectivity.READY,
                                             grpc.ChannelConnectivity.TRANSIENT_FAILURE):
                record_dial(self.timeline, conn.endpoint, conn.kubelet_instance, conn.id,
                            OK if connected else f"connection failed ({state.name})")
            if conn.connected == connected:
                return
            conn.connected = connected
        self.timeline.record("dra.connection", "kubelet", driver=conn.driver, endpoint=conn.endpoint,
                             connected=connected, state=state.name)
        self._sync(conn.driver)

    # -- ResourceSlice wiping (dra_plugin_manager.go sync / usable / wipeResourceSlices) --

    def _sync(self, driver: str) -> None:
        if self.wipe_slices is None or self._stopping.is_set():
            return
        with self._lock:
            usable = any(p.connected for p in self._store.get(driver, []))
            pending = self._wipes.get(driver)
            if usable:
                if pending is not None:
                    pending.cancel()
                    del self._wipes[driver]
                    self.timeline.record("dra.wipe_cancelled", "kubelet", driver=driver)
                return
            if pending is not None:
                return  # already queued: the original deadline stands
            timer = threading.Timer(self.profile.dra_wipe_delay_s, self._wipe, args=(driver, "unusable"))
            timer.daemon = True
            self._wipes[driver] = timer
            timer.start()
        self.timeline.record("dra.wipe_pending", "kubelet", driver=driver, delay_s=self.profile.dra_wipe_delay_s)

    def _wipe(self, driver: str, why: str) -> None:
        with self._lock:
            self._wipes.pop(driver, None)
            if self._stopping.is_set() or self.wipe_slices is None:
                return
        self.timeline.record("dra.wipe", "kubelet", driver=driver, why=why)
        try:
            self.wipe_slices(driver)
        except Exception as err:  # upstream retries with backoff inside; the hook owns that
            self.timeline.record("dra.wipe_error", "kubelet", driver=driver, error=f"{type(err).__name__}: {err}")

    # -- plugins -----------------------------------------------------------

    def plugin(self, driver: str) -> DRAPluginConn | None:
        """dra_plugin_manager.go get(): the newest connected plugin, else the newest one."""
        with self._lock:
            plugins = self._store.get(driver, [])
            for p in reversed(plugins):
                if p.connected:
                    return p
            return plugins[-1] if plugins else None

    def plugins(self, driver: str | None = None) -> list[DRAPluginConn]:
        with self._lock:
            if driver is not None:
                return list(self._store.get(driver, []))
            return [p for ps in self._store.values() for p in ps]

    def _get_plugin(self, driver: str) -> DRAPluginConn:
        """GetPlugin, with its errors."""
        if not driver:
            raise PrepareError("DRA driver name is empty")
        plugin = self.plugin(driver)
        if plugin is None:
            raise PrepareError(f"DRA driver {driver} is not registered", driver=driver)
        return plugin

    # -- claim cache -------------------------------------------------------

    def _checkpoint(self) -> None:
        with self._cache_lock:
            dracheckpoint.write(self.checkpoint_path, [c.state for c in self._claims.values()])

    def pods(self) -> dict[str, dict]:
        """Pods whose claims this instance prepared, by UID ({"name", "namespace", "uid"})."""
        with self._cache_lock:
            return {uid: dict(pod) for uid, pod in self._pods.items()}

    def claims(self) -> dict[str, PreparedClaim]:
        """The claim cache, by "namespace/name"."""
        with self._cache_lock:
            return {k: c.snapshot() for k, c in self._claims.items()}

    # -- PrepareResources --------------------------------------------------

    def prepare_pod(self, pod: dict, claims: list[dict]) -> dict[str, PreparedClaim]:
        """One pod sync's PrepareResources; returns the pod's claims by name. Raises PrepareError."""
        try:
            return self._prepare(pod, claims)
        except DRAError as err:
            error = PrepareError(f"prepare dynamic resources: {err}", err.claim, err.driver)
            self.timeline.record("dra.prepare_failed", "kubelet", pod=pod.get("name"), pod_uid=pod.get("uid"),
                                 error=str(error), claim=err.claim, driver=err.driver)
            raise error from err

    def prepare_pod_retrying(self, pod: dict, claims: list[dict], timeout_s: float) -> dict[str, PreparedClaim]:
        """The pod worker: sync again after backOffPeriod (jittered) until prepared or `timeout_s` passes."""
        deadline = time.monotonic() + timeout_s
        rng = random.Random(pod.get("uid", ""))
        while True:
            try:
                return self.prepare_pod(pod, claims)
            except PrepareError:
                # wait.Jitter(backOffPeriod, 0.5): backOffPeriod + rand * 0.5 * backOffPeriod
                delay = self.profile.pod_sync_backoff_s * (1 + rng.random() * POD_SYNC_JITTER)
                if time.monotonic() + delay > deadline:
                    raise
                self.timeline.record("dra.prepare_retry", "kubelet", pod=pod.get("name"), after_s=round(delay, 3))
                if self._stopping.wait(delay):
                    raise

    def _prepare(self, pod: dict, claims: list[dict]) -> dict[str, PreparedClaim]:
        pod_uid, pod_name = str(pod.get("uid", "")), str(pod.get("name", ""))
        namespace = str(pod.get("namespace", ""))
        infos: list[tuple[dict, ClaimInfoState, dict[str, DRAPluginConn]]] = []
        for claim in claims:
            meta, status = claim.get("metadata", {}), claim.get("status", {})
            name, uid = meta.get("name", ""), meta.get("uid", "")
            reserved = any(r.get("uid") == pod_uid for r in status.get("reservedFor") or [])
            if not reserved:
                raise PrepareError(f"pod {pod_name} ({pod_uid}) is not allowed to use ResourceClaim {name} ({uid})",
                                   claim=name)
            allocation = status.get("allocation")
            if allocation is None:  # newClaimInfoFromClaim
                raise PrepareError(f"ResourceClaim {name}: not allocated", claim=name)
            state = ClaimInfoState(uid, name, meta.get("namespace", namespace), set(),
                                   {r["driver"]: [] for r in (allocation.get("devices") or {}).get("results") or []})
            infos.append((claim, state, {d: self._get_plugin(d) for d in state.drivers}))

        batches: dict[str, list[Claim]] = {}
        to_prepare: dict[str, ClaimInfoState] = {}
        with self._cache_lock:
            self._pods[pod_uid] = dict(pod)
            for _, fresh, _ in infos:
                key = f"{fresh.namespace}/{fresh.name}"
                info = self._claims.get(key)
                if info is None:
                    info = self._claims[key] = _ClaimInfo(fresh)
                elif info.state.uid != fresh.uid:
                    raise PrepareError(f"old ResourceClaim with same name {fresh.name} and different UID "
                                       f"{info.state.uid} still exists (previous pod force-deleted?!)",
                                       claim=fresh.name)
                info.state.pod_uids.add(pod_uid)
                self._checkpoint()
                if info.prepared:
                    continue
                to_prepare[info.state.uid] = info.state
                for driver in info.state.drivers:
                    batches.setdefault(driver, []).append((info.state.namespace, info.state.uid, info.state.name))

        plugins = {d: p for _, _, ps in infos for d, p in ps.items()}
        for driver in sorted(batches):
            self._prepare_batch(plugins[driver], batches[driver])

        with self._cache_lock:
            for state in to_prepare.values():
                info = self._claims.get(f"{state.namespace}/{state.name}")
                if info is None:
                    raise PrepareError(f"internal error: unable to get claim info for ResourceClaim {state.name} "
                                       f"in namespace {state.namespace}", claim=state.name)
                info.prepared = True
            self._checkpoint()
            out = {}
            for _, fresh, _ in infos:
                info = self._claims.get(f"{fresh.namespace}/{fresh.name}")
                if info is not None:
                    out[fresh.name] = info.snapshot()
        self.timeline.record("dra.pod_prepared", "kubelet", pod=pod_name, pod_uid=pod_uid,
                             claims=sorted(out), called=sorted(to_prepare))
        return out

    def _prepare_batch(self, plugin: DRAPluginConn, claims: list[Claim]) -> None:
        if self.prepare_delay_s > 0:
            self.timeline.record("fault.dra_prepare_delay", "kubelet", driver=plugin.driver,
                                 delay_s=self.prepare_delay_s)
            self._stopping.wait(self.prepare_delay_s)  # an injected slow kubelet, interrupted by stop
        try:
            results = plugin.node_prepare(claims, via="pod")
        except grpc.RpcError as err:
            raise PrepareError(f"NodePrepareResources: {go_status(err)}", driver=plugin.driver) from err
        by_uid = {uid: (ns, name) for ns, uid, name in claims}
        for uid, result in results.items():
            if uid not in by_uid:
                raise PrepareError(f"NodePrepareResources returned result for unknown claim UID {uid}",
                                   driver=plugin.driver)
            ns, name = by_uid[uid]
            if result["error"]:
                raise PrepareError(f"NodePrepareResources failed for ResourceClaim {name}: {result['error']}",
                                   claim=name, driver=plugin.driver)
            with self._cache_lock:
                info = self._claims.get(f"{ns}/{name}")
                if info is None:
                    raise PrepareError(f"internal error: unable to get claim info for ResourceClaim {name} "
                                       f"in namespace {ns}", claim=name, driver=plugin.driver)
                # Up to 1.36 addDevice appends: a claim prepared again after a restart or a failed
                # sync lists its devices again (kubernetes#140471); 1.37 resets them first.
                if self.version.prepare_resets_devices:
                    info.state.drivers[plugin.driver] = []
                info.state.drivers.setdefault(plugin.driver, []).extend(
                    Device(d["pool"], d["device"], d["requests"], d["cdi_ids"], d["share_id"])
                    for d in result["devices"])
        unfinished = len(claims) - len(results)
        if unfinished:
            raise PrepareError(f"NodePrepareResources skipped {unfinished} ResourceClaims", driver=plugin.driver)

    # -- UnprepareResources ------------------------------------------------

    def unprepare_pod(self, pod: dict | str) -> None:
        """UnprepareResources for every claim the pod uses; a claim still used by another pod only loses the
        reference. Raises UnprepareError."""
        pod_uid = self._pod_uid(pod)
        try:
            self._unprepare(pod_uid)
        except DRAError as err:
            error = UnprepareError(f"unprepare dynamic resources: {err}", err.claim, err.driver)
            self.timeline.record("dra.unprepare_failed", "kubelet", pod_uid=pod_uid, error=str(error),
                                 claim=err.claim, driver=err.driver)
            raise error from err

    def _unprepare(self, pod_uid: str) -> None:
        batches: dict[str, list[Claim]] = {}
        done: list[str] = []
        with self._cache_lock:
            for key, info in self._claims.items():
                if pod_uid not in info.state.pod_uids:
                    continue
                if len(info.state.pod_uids) > 1:
                    info.state.pod_uids.discard(pod_uid)
                    continue
                done.append(key)
                for driver in info.state.drivers:
                    batches.setdefault(driver, []).append((info.state.namespace, info.state.uid, info.state.name))
        for driver in sorted(batches):
            plugin = self._get_plugin(driver)
            claims = batches[driver]
            try:
                results = plugin.node_unprepare(claims, via="pod")
            except grpc.RpcError as err:
                raise UnprepareError(f"NodeUnprepareResources: {go_status(err)}", driver=driver) from err
            names = {uid: name for _, uid, name in claims}
            for uid, result in results.items():
                if uid not in names:
                    raise UnprepareError(f"NodeUnprepareResources returned result for unknown claim UID {uid}",
                                         driver=driver)
                if result["error"]:
                    raise UnprepareError(f"NodeUnprepareResources failed for ResourceClaim {names[uid]}: "
                                         f"{result['error']}", claim=names[uid], driver=driver)
            unfinished = len(claims) - len(results)
            if unfinished:
                raise UnprepareError(f"NodeUnprepareResources skipped {unfinished} ResourceClaims", driver=driver)
        with self._cache_lock:
            for key in done:
                self._claims.pop(key, None)
            self._checkpoint()
            self._pods.pop(pod_uid, None)
        self.timeline.record("dra.pod_unprepared", "kubelet", pod_uid=pod_uid, claims=sorted(done))

    def _pod_uid(self, pod: dict | str) -> str:
        if isinstance(pod, dict):
            return str(pod.get("uid", ""))
        with self._cache_lock:
            if any(pod in c.state.pod_uids for c in self._claims.values()):
                return pod
            return next((uid for uid, p in self._pods.items() if p.get("name") == pod), pod)

    # -- status ------------------------------------------------------------

    def pods_using(self, driver: str, devices: set[str]) -> set[str]:
        """UIDs of the pods whose prepared claims hold one of the driver's "pool/device" keys (manager.go
        HandleWatchResourcesStream: the pods a changed device's health is sent for)."""
        with self._cache_lock:
            infos = [c.snapshot() for c in self._claims.values()]
        uids: set[str] = set()
        for info in infos:
            if any(f"{d.pool}/{d.device}" in devices for d in info.devices.get(driver, [])):
                uids |= set(info.pods)
        return uids

    def allocated_resources_status(self, pod: str) -> dict[str, list[dict]]:
        """UpdateAllocatedResourcesStatus for a container that uses every request of the pod's claims.

        `pod` is a pod UID or name. Keys are "claim:<claim>/<request>" ("claim:<claim>" for devices
        without request names); each device reads {"resourceID": first CDI ID (else
        "<driver>/<pool>/<device>"), "health": Healthy|Unhealthy|Unknown[, "message"]}, de-duplicated
        by resourceID. Empty when the kubelet's ResourceHealthStatus gate is off (kubelet_pods.go).
        """
        if not self.health_services or self.health_cache is None:
            return {}
        uid = self._pod_uid(pod)
        with self._cache_lock:
            infos = [c.snapshot() for c in self._claims.values() if uid in c.state.pod_uids]
        out: dict[str, list[dict]] = {}
        for info in sorted(infos, key=lambda c: c.name):
            requests = sorted({r for devs in info.devices.values() for d in devs for r in d.requests})
            for request in requests or [""]:
                name = f"claim:{info.name}/{request}" if request else f"claim:{info.name}"
                seen: set[str] = set()
                resources = []
                for driver, devices in info.devices.items():
                    for d in devices:
                        if request and d.requests and request not in d.requests:
                            continue
                        health = self.health_cache.get(driver, d.pool, d.device)
                        rid = d.cdi_ids[0] if d.cdi_ids else f"{driver}/{d.pool}/{d.device}"
                        if rid in seen:
                            continue
                        seen.add(rid)
                        entry = {"resourceID": rid, "health": health.health or UNKNOWN}
                        if self.version.health_message and health.message:
                            entry["message"] = health.message
                        resources.append(entry)
                if resources:
                    out[name] = resources
        return out
