"""The fake kubelet's device manager, with upstream v1.36 semantics.

Upstream: pkg/kubelet/cm/devicemanager (manager.go, endpoint.go,
plugin/v1beta1/server.go). It serves Registration on kubelet.sock, validates
and connects plugins, turns ListAndWatch into capacity and allocatable, admits
pods by calling GetPreferredAllocation / Allocate / PreStartContainer, and
checkpoints assignments so that they survive a restart.
"""

from __future__ import annotations

import itertools
import os
import socket
import stat
import threading
import time
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from harness.instruments.answers import Answers
from harness.instruments.faults import FaultPlan
from harness.instruments.grpcutil import SERVER_OPTIONS, over_kubelet_limit, status_of, unix_target
from harness.instruments.interceptors import RecordingServerInterceptor, to_dict
from harness.instruments.timeline import Timeline
from harness.kubelet import checkpoint
from harness.kubelet.endpoint import DialError, Endpoint, HungCall, OverLimit, go_status, record_over_limit
from harness.kubelet.versions import KubeletVersion
from harness.kubelet.versions import default as default_kubelet_version
from harness.spec.names import is_extended_resource_name
from harness.spec.profiles import Profile
from harness.wire import dp, dp_grpc

KUBELET_SOCKET = "kubelet.sock"  # deviceplugin v1beta1 constants.go KubeletSocket
SUPPORTED_VERSIONS = ("v1beta1",)  # deviceplugin v1beta1 constants.go SupportedVersions
HEALTHY = "Healthy"  # deviceplugin v1beta1 constants.go Healthy
UNHEALTHY = "Unhealthy"  # deviceplugin v1beta1 constants.go Unhealthy
PLUGIN_DIR_MODE = 0o750  # plugin/v1beta1 server.go Start: os.MkdirAll(s.socketDir, 0750)
# plugin/v1beta1 server.go error formats (Go's %q of a string and of a []string).
ERR_UNSUPPORTED_VERSION = ("requested API version {version} is not supported by kubelet. "
                           "Supported version is {supported}")
ERR_INVALID_RESOURCE_NAME = "the ResourceName {name} is invalid"
SHUTTING_DOWN = "kubelet is shutting down"
PROBE_TIMEOUT_S = 1.0  # harness observation for DP-REG-01, not a kubelet timer


def go_join(directory: Path, name: str) -> str:
    """Go's filepath.Join: an absolute `name` still lands under `directory`; '..' is resolved."""
    return os.path.normpath(os.path.join(str(directory), name.lstrip("/")))


_GO_ESCAPES = {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\v": "\\v",
               "\\": "\\\\", '"': '\\"'}


def go_quote(value: str) -> str:
    """Go's %q of a string (strconv.Quote): control and non-printable runes escaped."""
    out = []
    for ch in value:
        code = ord(ch)
        if ch in _GO_ESCAPES:
            out.append(_GO_ESCAPES[ch])
        elif ch.isprintable():  # unicode.IsPrint: letters, marks, numbers, punctuation, symbols, ASCII space
            out.append(ch)
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\x{code:02x}")
        elif code < 0x10000:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    return '"' + "".join(out) + '"'


def go_quote_list(values: tuple[str, ...]) -> str:
    return "[" + " ".join(go_quote(v) for v in values) + "]"


class AdmissionError(RuntimeError):
    pass


@dataclass
class ResourceState:
    endpoint: Endpoint | None
    options: dp.DevicePluginOptions = field(default_factory=dp.DevicePluginOptions)
    devices: dict[str, str] = field(default_factory=dict)  # manager.go allDevices: device ID -> health
    healthy_ids: set[str] = field(default_factory=set)  # manager.go healthyDevices
    unhealthy_ids: set[str] = field(default_factory=set)  # manager.go unhealthyDevices
    stopped_at: float | None = None
    stale_endpoints: list[Endpoint] = field(default_factory=list)
    _healthy_sorted: tuple[set[str], list[str]] | None = field(default=None, repr=False, compare=False)
    _healthy_json: tuple[set[str], bytes] | None = field(default=None, repr=False, compare=False)

    def healthy(self) -> list[str]:
        return list(self._sorted_healthy())

    def _sorted_healthy(self) -> list[str]:
        # Sorted once per set: the checkpoint written on every list sorts every resource's devices, and
        # healthy_ids is only ever replaced, never changed in place.
        cached = self._healthy_sorted
        if cached is None or cached[0] is not self.healthy_ids:
            cached = self._healthy_sorted = (self.healthy_ids, sorted(self.healthy_ids))
        return cached[1]

    def healthy_json(self) -> bytes:
        """healthy() as the checkpoint encodes it, once per set: a list changes one resource of many."""
        cached = self._healthy_json
        if cached is None or cached[0] is not self.healthy_ids:
            cached = self._healthy_json = (self.healthy_ids, checkpoint.device_ids_json(self._sorted_healthy()))
        return cached[1]

    def capacity(self) -> int:
        # GetCapacity adds the two sets' sizes: an ID listed both Healthy and not counts twice.
        return len(self.healthy_ids) + len(self.unhealthy_ids)

    def mark_unhealthy(self) -> None:
        """manager.go markResourceUnhealthy: every healthy device becomes unhealthy."""
        self.unhealthy_ids |= self.healthy_ids
        self.healthy_ids = set()


@dataclass
class ContainerAllocation:
    container: str
    resource: str
    device_ids: list[str]
    response: dict
    reused: bool = False


def probe_listening(path: str) -> dict:
    """Whether something listens at `path` now, by a bare connect (DP-REG-01's probe; the relay's too)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(PROBE_TIMEOUT_S)
    try:
        sock.connect(path)
        return {"ok": True}
    except OSError as err:
        return {"ok": False, "error": f"connect {path}: {err.strerror or err}"}
    finally:
        sock.close()


class DeviceManager:
    """One kubelet instance's device manager; `FakeNode` makes a new one per restart."""

    _instances = itertools.count(1)

    def __init__(self, plugin_dir: Path, state_dir: Path, timeline: Timeline, profile: Profile,
                 version: KubeletVersion | None = None) -> None:
        self.plugin_dir, self.timeline, self.profile = Path(plugin_dir), timeline, profile
        self.version = version or default_kubelet_version()
        self.state_dir = Path(state_dir)
        self.instance = next(self._instances)
        self.faults = FaultPlan(timeline, "kubelet")
        self._lock = threading.RLock()
        self._checkpoint_lock = threading.Lock()  # writes come from stream threads and admission
        self._register_calls = itertools.count(1)  # pairs a Register's arrival with its answer
        self._answers = Answers()
        self._resources: dict[str, ResourceState] = {}
        self._entries: list[checkpoint.PodDeviceEntry] = []
        self._server: grpc.Server | None = None
        # A kubelet that leaves plugin sockets in place at start (a scenario's fault; upstream always deletes).
        self.keep_sockets = False

    @property
    def socket_path(self) -> Path:
        return self.plugin_dir / KUBELET_SOCKET

    @property
    def checkpoint_path(self) -> Path:
        return self.plugin_dir / checkpoint.CHECKPOINT_NAME

    # -- lifecycle ---------------------------------------------------------

    def start(self) -> DeviceManager:
        self.plugin_dir.mkdir(mode=PLUGIN_DIR_MODE, parents=True, exist_ok=True)
        if not self.keep_sockets:
            self._cleanup_plugin_dir()
        self._restore_checkpoint()
        # Reads more than the kubelet would, to say what an oversized Register was (see register()).
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=16, thread_name_prefix="kubelet"),
                             interceptors=[RecordingServerInterceptor(self.timeline, "kubelet", self.faults)],
                             options=SERVER_OPTIONS)
        dp_grpc.add_RegistrationServicer_to_server(_RegistrationServicer(self), server)
        self._listen(server)
        server.start()
        self._server = server
        self.timeline.record("kubelet.start", "kubelet", instance=self.instance, socket=str(self.socket_path))
        return self

    def stop(self) -> None:
        """Stop serving; like the real kubelet, leave kubelet.sock and plugin sockets behind."""
        server, self._server = self._server, None
        if server is None:
            return
        self.faults.close()
        self._answers.flush()  # a Register it accepted is answered before it goes, as a Go kubelet's is
        server.stop(grace=0).wait(5)
        with self._lock:
            endpoints = [e for r in self._resources.values() for e in (r.endpoint, *r.stale_endpoints)
                         if e is not None]
        for ep in endpoints:
            ep.close()
        for ep in endpoints:
            ep.join(2)
        self.timeline.record("kubelet.stop", "kubelet", instance=self.instance)

    def _listen(self, server: grpc.Server) -> None:
        """Listen on kubelet.sock so that it outlives the listener, as upstream's does.

        grpc unlinks the path it bound when it stops, but a real kubelet leaves
        kubelet.sock behind on exit. So bind a private path, hard-link it into
        place (it appears atomically, already listening) and drop the private
        name: on stop grpc finds nothing to unlink and a dead kubelet.sock stays.
        """
        self.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        private = self.state_dir / f"kubelet-{self.instance}.sock"
        private.unlink(missing_ok=True)
        server.add_insecure_port(unix_target(str(private)))
        self.socket_path.unlink(missing_ok=True)
        os.link(private, self.socket_path)
        private.unlink()

    def _cleanup_plugin_dir(self) -> None:
        """Delete every socket except the checkpoint (upstream CleanupPluginDirectory)."""
        removed = []
        for entry in os.scandir(self.plugin_dir):
            if entry.path == str(self.checkpoint_path):
                continue
            try:
                mode = entry.stat(follow_symlinks=True).st_mode  # os.Stat follows symlinks
            except OSError:
                continue
            if stat.S_ISSOCK(mode):
                try:
                    os.unlink(entry.path)
                except FileNotFoundError:
                    # Its plugin removed it meanwhile (one exiting as the kubelet starts): Go's os.RemoveAll, which
                    # upstream calls, returns nil for a path already gone.
                    continue
                removed.append(entry.name)
        self.timeline.record("kubelet.cleanup", "kubelet", instance=self.instance, removed=sorted(removed))

    def _restore_checkpoint(self) -> None:
        try:
            data = checkpoint.read(self.checkpoint_path)
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
            # manager.go Start(): "Continue after failing to read checkpoint file. Device allocation
            # info may NOT be up-to-date" - a corrupt checkpoint (a plugin can write that directory)
            # costs the kubelet its allocations, never its start.
            self.timeline.record("kubelet.checkpoint_unreadable", "kubelet", instance=self.instance,
                                 error=f"{type(err).__name__}: {err}"[:300])
            data = checkpoint.CheckpointData()
        # Recorded first, so the grace period measured from this event is never short.
        self.timeline.record("kubelet.restored", "kubelet", instance=self.instance,
                             resources=sorted(data.registered), pods=len(data.entries))
        with self._lock:
            self._entries = list(data.entries)
            # Restored resources start with no devices and a stopped endpoint
            # (manager.go readCheckpoint): capacity 0 until the plugin re-registers.
            for resource in data.registered:
                self._resources[resource] = ResourceState(endpoint=None, stopped_at=time.monotonic())
        for resource in data.registered:
            self._record_devices(resource, "restored")

    def _write_checkpoint(self) -> None:
        with self._checkpoint_lock:
            with self._lock:
                registered = {r: s.healthy_json() for r, s in self._resources.items()}
                entries = list(self._entries)
            checkpoint.write_encoded(self.checkpoint_path, checkpoint.encode(entries, registered))

    # -- registration ------------------------------------------------------

    def register(self, request: dp.RegisterRequest, context: grpc.ServicerContext) -> dp.Empty:
        with self._answers.handling(context):
            return self._register(request, context)

    def _register(self, request: dp.RegisterRequest, context: grpc.ServicerContext) -> dp.Empty:
        call = next(self._register_calls)
        size = over_kubelet_limit(request)
        if size is not None:
            # grpc-go refuses it before the kubelet's handler runs: no validation, no dial.
            error = record_over_limit(self.timeline, "RegisterRequest", size, instance=self.instance)
            self.timeline.record("kubelet.register_received", "kubelet", instance=self.instance, call=call,
                                 bytes=size)
            self.timeline.record("kubelet.register", "kubelet", accepted=False, error=error, call=call,
                                 instance=self.instance, resource=request.resource_name[:100] + "…",
                                 endpoint=request.endpoint[:100], version=request.version[:100], bytes=size)
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, error)
        # Recorded on arrival: what follows (dial, GetDevicePluginOptions) may take the kubelet's bounds.
        self.timeline.record("kubelet.register_received", "kubelet", instance=self.instance, call=call,
                             resource=request.resource_name, endpoint=request.endpoint)
        probe = self._probe_endpoint(request.endpoint)
        event = {"instance": self.instance, "resource": request.resource_name, "version": request.version,
                 "endpoint": request.endpoint, "options": to_dict(request.options), "probe": probe, "call": call}
        error = self._validate(request)
        endpoint = options = None
        if error is None:
            endpoint, options, error = self._dial(request.resource_name,
                                                  go_join(self.plugin_dir, request.endpoint))
            # DP-REG-01: whether the endpoint spoke gRPC when the kubelet called it inside Register.
            event["options_call"] = {"ok": error is None, "error": error}
        if error is None and self._server is None:
            error = SHUTTING_DOWN
        if error is not None:
            if endpoint is not None:
                endpoint.close()
            self.timeline.record("kubelet.register", "kubelet", accepted=False, error=error, **event)
            context.abort(grpc.StatusCode.UNKNOWN, error)
        assert endpoint is not None and options is not None
        if not self._connect(endpoint, options):
            self.timeline.record("kubelet.register", "kubelet", accepted=False, error=SHUTTING_DOWN, **event)
            context.abort(grpc.StatusCode.UNKNOWN, SHUTTING_DOWN)
        self.timeline.record("kubelet.register", "kubelet", accepted=True, served_options=to_dict(options),
                             endpoint_id=endpoint.id, **event)
        return dp.Empty()

    def _dial(self, resource: str, path: str) -> tuple[Endpoint | None, dp.DevicePluginOptions | None, str | None]:
        """Dial a plugin's endpoint and fetch its options: (endpoint, options, None) or (None, None, error)."""
        endpoint = Endpoint(resource, path, self.timeline, self.profile.reaction_s, self.instance, self.faults)
        try:
            endpoint.dial(self.profile.dial_timeout_s)
            return endpoint, endpoint.fetch_options(), None
        except DialError as err:
            endpoint.close()
            return None, None, str(err)

    def connect_plugin(self, resource: str, path: str) -> str | None:
        """Connect the plugin at `path` (used as given) for `resource`; the error, or None.

        What Register does after validation, for a plugin that came through
        plugins_registry (plugin/v1beta1 handler.go RegisterPlugin -> connectClient).
        """
        endpoint, options, error = self._dial(resource, path)
        if error is None and self._server is None:
            error = SHUTTING_DOWN
        if error is not None:
            if endpoint is not None:
                endpoint.close()
            self.timeline.record("kubelet.connect", "kubelet", instance=self.instance, resource=resource,
                                 endpoint=path, accepted=False, error=error)
            return error
        assert endpoint is not None and options is not None
        if not self._connect(endpoint, options):
            self.timeline.record("kubelet.connect", "kubelet", instance=self.instance, resource=resource,
                                 endpoint=path, accepted=False, error=SHUTTING_DOWN)
            return SHUTTING_DOWN
        self.timeline.record("kubelet.connect", "kubelet", instance=self.instance, resource=resource,
                             endpoint=path, accepted=True, served_options=to_dict(options), endpoint_id=endpoint.id)
        return None

    def disconnect_plugin(self, resource: str) -> None:
        """Disconnect the resource's current client (plugin/v1beta1 handler.go DeRegisterPlugin).

        PluginDisconnected: every device unhealthy, capacity kept, and the
        resource goes after endpointStopGracePeriod.
        """
        with self._lock:
            state = self._resources.get(resource)
            if state is None or state.endpoint is None or state.stopped_at is not None:
                return
            endpoint = state.endpoint
            state.mark_unhealthy()
            state.stopped_at = time.monotonic()
            self.timeline.record("kubelet.disconnect", "kubelet", instance=self.instance, resource=resource,
                                 endpoint_id=endpoint.id)
        endpoint.close()
        self._record_devices(resource, "disconnected")

    def _validate(self, request: dp.RegisterRequest) -> str | None:
        if request.version not in SUPPORTED_VERSIONS:
            return ERR_UNSUPPORTED_VERSION.format(version=go_quote(request.version),
                                                  supported=go_quote_list(SUPPORTED_VERSIONS))
        if not is_extended_resource_name(request.resource_name):
            return ERR_INVALID_RESOURCE_NAME.format(name=go_quote(request.resource_name))
        return None

    def _probe_endpoint(self, endpoint: str) -> dict:
        """DP-REG-01's observation: is the endpoint listening at the moment Register arrives?

        A bare connect(), not an RPC: the plugin must see exactly the calls a
        kubelet makes. The kubelet's own GetDevicePluginOptions follows at once.
        """
        return probe_listening(go_join(self.plugin_dir, endpoint))

    def _connect(self, endpoint: Endpoint, options: dp.DevicePluginOptions) -> bool:
        """Make `endpoint` the resource's client and start its stream; False (and it is closed) once stopping."""
        # Upstream (plugin/v1beta1 handler.go connectClient) replaces the client
        # without disconnecting the old one, whose stream keeps feeding the same
        # resource; the device sets stay until the new stream's first list.
        with self._lock:
            if self._server is None:
                # stop() took the endpoints it closes under this lock: one added now would outlive the kubelet.
                connected = False
            else:
                connected = True
                self._install(endpoint, options)
        if not connected:
            endpoint.close()
            return False
        endpoint.run(self._on_list, self._on_stream_end)
        return True

    def _install(self, endpoint: Endpoint, options: dp.DevicePluginOptions) -> None:
        """The resource's state with `endpoint` as its client (under self._lock)."""
        old = self._resources.get(endpoint.resource)
        state = ResourceState(endpoint=endpoint, options=options)
        if old is not None:
            # PluginConnected only swaps the endpoint: the (un)healthy sets stay as
            # they are (all unhealthy after a disconnect) until the next list.
            state.devices = dict(old.devices)
            state.healthy_ids, state.unhealthy_ids = set(old.healthy_ids), set(old.unhealthy_ids)
            state.stale_endpoints = [e for e in (old.endpoint, *old.stale_endpoints) if e is not None]
        self._resources[endpoint.resource] = state

    def _on_list(self, endpoint: Endpoint, response: dp.ListAndWatchResponse, listed: dict) -> None:
        """One ListAndWatch message; `listed` is its dict (the timeline's event's, read only)."""
        with self._lock:
            state = self._resources.get(endpoint.resource)
            if state is None:
                return
            # Each message replaces the whole device set, whichever client of
            # the resource sent it (PluginListAndWatchReceiver keys by name);
            # genericDeviceUpdateCallback applies it even to a stopped endpoint.
            # One pass over the message's dict, which the event already made: every attribute read of a
            # wire message builds an object, and three passes over one took 1 ms per list of 1,024 devices.
            devices: dict[str, str] = {}
            healthy: set[str] = set()
            unhealthy: set[str] = set()
            for d in listed["devices"]:
                device_id, health = d["ID"], d["health"]
                devices[device_id] = health
                (healthy if health == HEALTHY else unhealthy).add(device_id)
            state.devices, state.healthy_ids, state.unhealthy_ids = devices, healthy, unhealthy
        # genericDeviceUpdateCallback -> writeCheckpoint. Written before the event: a check that sees the
        # event and reads the checkpoint finds this list (or a later one) in it.
        self._write_checkpoint()
        self._record_devices(endpoint.resource, "list")

    def _on_stream_end(self, endpoint: Endpoint, reason: str) -> None:
        # Up to 1.36 upstream's runClient disconnects whatever client is *current* for the
        # resource when any of its streams ends, even an older one's (kubernetes#121994).
        # 1.37 keeps clients per socket: an older client on another socket just goes.
        with self._lock:
            state = self._resources.get(endpoint.resource)
            if state is not None and self.version.dp_endpoints_per_socket and _drop_other_socket(state, endpoint):
                self.timeline.record("kubelet.stream_end", "kubelet", instance=self.instance,
                                     resource=endpoint.resource, endpoint_id=endpoint.id, reason=reason,
                                     disconnected=False)
                return
            disconnect = state is not None and state.stopped_at is None and not endpoint.stopped_by_kubelet
            current = state.endpoint if state is not None else None
            # Recorded before the stop time is taken: the grace period measured
            # from this event is never short.
            self.timeline.record("kubelet.stream_end", "kubelet", instance=self.instance,
                                 resource=endpoint.resource, endpoint_id=endpoint.id, reason=reason,
                                 disconnected=disconnect)
            if disconnect and state is not None:
                # PluginDisconnected: every device unhealthy, capacity kept; the
                # resource goes after endpointStopGracePeriod.
                state.mark_unhealthy()
                state.stopped_at = time.monotonic()
        if disconnect:
            if current is not None and current is not endpoint:
                current.close()
            self._record_devices(endpoint.resource, "disconnected")

    def _record_devices(self, resource: str, why: str) -> None:
        capacity, allocatable = self.capacity(resource), self.allocatable(resource)
        self.timeline.record("kubelet.devices", "kubelet", instance=self.instance, resource=resource,
                             why=why, capacity=capacity, allocatable=allocatable)

    # -- node status -------------------------------------------------------

    def _expire(self) -> None:
        now = time.monotonic()
        with self._lock:
            gone = [r for r, s in self._resources.items()
                    if s.stopped_at is not None and now - s.stopped_at > self.profile.endpoint_grace_s]
            for r in gone:
                del self._resources[r]
        for r in gone:
            self.timeline.record("kubelet.resource_removed", "kubelet", instance=self.instance, resource=r)
        if gone:
            self._write_checkpoint()  # GetCapacity: needsUpdateCheckpoint drops them from RegisteredDevices

    def allocations(self) -> list[checkpoint.PodDeviceEntry]:
        """Every container's device assignment (the checkpoint's PodDeviceEntries)."""
        with self._lock:
            return list(self._entries)

    def resources(self) -> list[str]:
        self._expire()
        with self._lock:
            return sorted(self._resources)

    def capacity(self, resource: str) -> int | None:
        self._expire()
        with self._lock:
            state = self._resources.get(resource)
            return None if state is None else state.capacity()

    def allocatable(self, resource: str) -> int | None:
        self._expire()
        with self._lock:
            state = self._resources.get(resource)
            return None if state is None else len(state.healthy())

    def devices(self, resource: str) -> dict[str, str]:
        with self._lock:
            state = self._resources.get(resource)
            return {} if state is None else dict(state.devices)

    def endpoint(self, resource: str) -> Endpoint | None:
        with self._lock:
            state = self._resources.get(resource)
            return None if state is None or state.stopped_at is not None else state.endpoint

    # -- pod admission -----------------------------------------------------

    def admit(self, pod_uid: str, container: str, resource: str, count: int) -> ContainerAllocation:
        """Give one container `count` devices, the way the kubelet does at admission."""
        with self._lock:
            for entry in self._entries:
                if (entry.pod_uid, entry.container, entry.resource) == (pod_uid, container, resource):
                    # Allocate once: the assignment lives in the checkpoint.
                    return ContainerAllocation(container, resource, list(entry.device_ids), {}, reused=True)
            state = self._resources.get(resource)
            if state is None:
                raise AdmissionError(f"unknown or unregistered resource {resource!r}")
            # devicesToAllocate checks health before counting (kubernetes#109595).
            if not state.healthy():
                raise AdmissionError(f"no healthy devices present; cannot allocate unhealthy devices {resource}")
            if state.endpoint is None or state.stopped_at is not None:
                raise AdmissionError(f"unknown or unregistered resource {resource!r}")
            in_use = {i for e in self._entries if e.resource == resource for i in e.device_ids}
            available = [i for i in state.healthy() if i not in in_use]
            endpoint, options = state.endpoint, state.options
        if len(available) < count:
            raise AdmissionError(f"requested number of devices unavailable for {resource}. "
                                 f"Requested: {count}, Available: {len(available)}")
        chosen = available[:count]
        if options.get_preferred_allocation_available:
            try:
                preferred = endpoint.preferred(available, [], count)
            except (HungCall, OverLimit) as err:
                raise AdmissionError(f"device plugin GetPreferredAllocation: {err}") from None
            except grpc.RpcError as err:
                raise AdmissionError("device plugin GetPreferredAllocation rpc failed with err: "
                                     f"{go_status(err)}") from None
            valid = [i for i in preferred if i in available][:count]
            chosen = valid + [i for i in available if i not in valid][: count - len(valid)]
        try:
            response = endpoint.allocate(chosen)
        except (HungCall, OverLimit) as err:
            raise AdmissionError(f"allocate for {resource}: {err}") from None
        except grpc.RpcError as err:
            raise AdmissionError(f"allocate for {resource} failed: {status_of(err)}") from None
        if not response.container_responses:
            # manager.go allocateContainerResources: refused before the pod's devices are recorded. The answer
            # shows as Go's %v of the generated message does.
            raise AdmissionError("no containers return in allocation response "
                                 "&AllocateResponse{ContainerResponses:[]*ContainerAllocateResponse{},}")
        with self._lock:
            self._entries.append(checkpoint.PodDeviceEntry(pod_uid, container, resource, tuple(chosen)))
        self._write_checkpoint()
        result = ContainerAllocation(container, resource, chosen, to_dict(response.container_responses[0]))
        self.timeline.record("kubelet.admitted", "kubelet", instance=self.instance, pod=pod_uid,
                             container=container, resource=resource, devices=chosen)
        return result

    def start_containers(self, pod_uid: str) -> None:
        """Container start: PreStartContainer where required (manager.go callPreStartContainerIfNeeded)."""
        with self._lock:
            work = [(e, self._resources.get(e.resource)) for e in self._entries if e.pod_uid == pod_uid]
        for entry, state in work:
            if state is None or state.endpoint is None or not state.options.pre_start_required:
                continue
            try:
                state.endpoint.pre_start(list(entry.device_ids), self.profile.prestart_timeout_s)
            except grpc.RpcError as err:
                raise AdmissionError(f"device plugin PreStartContainer rpc failed with err: {go_status(err)}") from None
            self.timeline.record("kubelet.prestarted", "kubelet", instance=self.instance, pod=pod_uid,
                                 container=entry.container, resource=entry.resource)

    def remove_pod(self, pod_uid: str) -> None:
        with self._lock:
            self._entries = [e for e in self._entries if e.pod_uid != pod_uid]
        self._write_checkpoint()

    def pod_devices(self, pod_uid: str) -> dict[str, list[str]]:
        with self._lock:
            out: dict[str, list[str]] = {}
            for e in self._entries:
                if e.pod_uid == pod_uid:
                    out.setdefault(e.resource, []).extend(e.device_ids)
            return out


    def allocated_resources_status(self, pod_uid: str) -> dict[str, list[dict]]:
        """Per container, what the pod status's allocatedResourcesStatus shows (ResourceHealthStatus).

        Upstream (manager.go UpdateAllocatedResourcesStatus): one entry per
        resource, named after it, with resourceID = device ID and health
        Healthy / Unhealthy, or Unknown for a device the plugin no longer lists.
        """
        with self._lock:
            out: dict[str, list[dict]] = {}
            for entry in self._entries:
                if entry.pod_uid != pod_uid:
                    continue
                state = self._resources.get(entry.resource)
                resources = [{"resourceID": i, "health": _health_of(state, i)} for i in entry.device_ids]
                out.setdefault(entry.container, []).append({"name": entry.resource, "resources": resources})
            return out


def _health_of(state: ResourceState | None, device_id: str) -> str:
    if state is not None and device_id in state.healthy_ids:
        return HEALTHY
    if state is not None and device_id in state.unhealthy_ids:
        return UNHEALTHY
    return "Unknown"  # core/v1 types.go ResourceHealthStatusUnknown


class _RegistrationServicer(dp_grpc.RegistrationServicer):
    def __init__(self, manager: DeviceManager) -> None:
        self._manager = manager

    def Register(self, request: dp.RegisterRequest, context: grpc.ServicerContext) -> dp.Empty:  # noqa: N802
        return self._manager.register(request, context)


def _drop_other_socket(state: ResourceState, ended: Endpoint) -> bool:
    """1.37 PluginDisconnected(resource, socketPath): True when `ended` was not the resource's last client on a
    live socket, so it goes alone; when it was the current one, a remaining one is promoted."""
    others = [e for e in (state.endpoint, *state.stale_endpoints)
              if e is not None and e is not ended and e.socket_path != ended.socket_path and not e.ended.is_set()]
    if not others:
        return False
    if state.endpoint is ended:
        state.endpoint = others[0]
    state.stale_endpoints = [e for e in state.stale_endpoints if e is not ended and e is not state.endpoint]
    return True
