"""The fake kubelet's plugin watcher, with upstream v1.36 semantics.

Upstream: pkg/kubelet/pluginmanager (pluginwatcher/plugin_watcher.go,
reconciler/reconciler.go, operationexecutor/operation_generator.go). Sockets
appearing under <root>/plugins_registry go into a desired state (inotify); a
reconciler compares it with the actual state every second and registers or
de-registers: dial, GetInfo, pick the handler by PluginInfo.type, validate,
register, NotifyRegistrationStatus.
"""

from __future__ import annotations

import os
import select
import stat
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import grpc
from inotify_simple import INotify
from inotify_simple import flags as IN

from harness.instruments.dials import OK, endpoint_ids, record_dial
from harness.instruments.filewatch import is_socket
from harness.instruments.grpcutil import CHANNEL_OPTIONS, unix_target
from harness.instruments.interceptors import RecordingClientInterceptor
from harness.instruments.timeline import Timeline
from harness.kubelet.devicemanager import DeviceManager, go_quote
from harness.kubelet.endpoint import go_status
from harness.spec.names import is_extended_resource_name
from harness.spec.profiles import Profile
from harness.wire import reg, reg_grpc

PLUGINS_REGISTRY = "plugins_registry"  # kubelet config.DefaultKubeletPluginsRegistrationDirName
REGISTRY_DIR_MODE = 0o755  # pluginwatcher plugin_watcher.go init: os.MkdirAll(w.path, 0755)
RECONCILE_PERIOD_S = 1.0  # kubelet.go pluginmanager.NewPluginManager(..., loopSleepDuration = 1 * time.Second)
GETINFO_TIMEOUT_S = 1.0  # pluginmanager operation_generator.go GetInfo: context.WithTimeout(..., time.Second)
NOTIFY_TIMEOUT_S = 5.0  # pluginmanager operation_generator.go notifyTimeoutDuration = 5 * time.Second
# util/goroutinemap/exponentialbackoff exponential_backoff.go: a failed operation may
# not run again before initialDurationBeforeRetry, doubling up to maxDurationBeforeRetry.
BACKOFF_INITIAL_S = 0.5  # exponentialbackoff initialDurationBeforeRetry = 500 * time.Millisecond
BACKOFF_MAX_S = 122.0  # exponentialbackoff maxDurationBeforeRetry = 2*time.Minute + 2*time.Second

# pluginregistration v1 types.go plugin types.
DEVICE_PLUGIN = "DevicePlugin"
CSI_PLUGIN = "CSIPlugin"
DRA_PLUGIN = "DRAPlugin"

DEVICE_PLUGIN_VERSION = "v1beta1"  # deviceplugin v1beta1 constants.go Version


class Handler(Protocol):
    """A plugin consumer (upstream cache.PluginHandler): each returns an error message or None."""

    def validate(self, name: str, endpoint: str, versions: list[str]) -> str | None: ...

    def register(self, name: str, endpoint: str, versions: list[str]) -> str | None: ...

    def deregister(self, name: str, endpoint: str) -> None: ...


def go_list(values: list[str]) -> str:
    """Go's %v of a []string."""
    return "[" + " ".join(values) + "]"


class DevicePluginHandler:
    """The device manager as a plugins_registry consumer (devicemanager plugin/v1beta1 handler.go)."""

    def __init__(self, manager: DeviceManager) -> None:
        self.manager = manager

    def validate(self, name: str, endpoint: str, versions: list[str]) -> str | None:
        # handler.go ValidatePlugin
        if DEVICE_PLUGIN_VERSION not in versions:
            return (f"manager version, {DEVICE_PLUGIN_VERSION}, is not among plugin supported versions "
                    f"{go_list(versions)}")
        if not is_extended_resource_name(name):
            return f"invalid name of device plugin socket: the ResourceName {go_quote(name)} is invalid"
        return None

    def register(self, name: str, endpoint: str, versions: list[str]) -> str | None:
        # handler.go RegisterPlugin -> connectClient(name, endpoint): the endpoint as given.
        return self.manager.connect_plugin(name, endpoint)

    def deregister(self, name: str, endpoint: str = "") -> None:
        # handler.go DeRegisterPlugin(pluginName, endpoint) -> disconnectClient(pluginName): by name only.
        self.manager.disconnect_plugin(name)


@dataclass
class _Registered:
    """One entry of the actual state of the world (cache/actual_state_of_world.go PluginInfo)."""

    timestamp: float
    type: str
    name: str
    endpoint: str
    handler: Handler


class PluginWatcher:
    """Watches a plugins_registry directory and registers the plugins whose sockets appear there."""

    def __init__(self, registry_dir: Path, timeline: Timeline, profile: Profile,
                 handlers: dict[str, Handler], kubelet_instance: int | None = None) -> None:
        """`kubelet_instance`: the kubelet instance this watcher belongs to, on its `kubelet.dial` events."""
        self.registry_dir, self.timeline, self.profile = Path(registry_dir), timeline, profile
        self.kubelet_instance = kubelet_instance
        self.handlers = dict(handlers)
        self._lock = threading.Lock()
        self._desired: dict[str, float] = {}  # socket path -> timestamp (desired_state_of_world.go)
        self._actual: dict[str, _Registered] = {}  # socket path -> plugin (actual_state_of_world.go)
        self._pending: set[str] = set()  # sockets with an operation running (nestedpendingoperations)
        self._backoff: dict[str, tuple[float, float]] = {}  # socket -> (not before, last delay)
        self._ops: list[threading.Thread] = []
        self._stop = threading.Event()
        self._inotify: INotify | None = None
        self._wds: dict[int, Path] = {}
        self._wake_r = self._wake_w = -1
        self._threads: list[threading.Thread] = []
        self._started = False
        # Fault: the kubelet holds each GetInfo call this long after dialing (a slow kubelet).
        self.getinfo_delay_s = 0.0

    # -- lifecycle ---------------------------------------------------------

    def start(self) -> PluginWatcher:
        if self._started:
            return self
        self._started = True
        self.registry_dir.mkdir(mode=REGISTRY_DIR_MODE, parents=True, exist_ok=True)
        self._wake_r, self._wake_w = os.pipe()
        self._inotify = INotify()
        self._add_watch(self.registry_dir)
        self.timeline.record("pluginwatcher.start", "pluginwatcher", directory=str(self.registry_dir))
        self._traverse(self.registry_dir)
        self._threads = [threading.Thread(target=self._watch, daemon=True, name="pluginwatcher"),
                         threading.Thread(target=self._reconcile_loop, daemon=True, name="pluginreconciler")]
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> None:
        """Stop watching and reconciling; registered plugins stay registered, as when a kubelet exits."""
        if not self._started or self._stop.is_set():
            return
        self._stop.set()
        os.write(self._wake_w, b"x")
        for t in self._threads:
            t.join(2)
        with self._lock:
            ops = list(self._ops)
        for t in ops:
            t.join(2)
        if self._inotify is not None:
            self._inotify.close()
            self._inotify = None
        os.close(self._wake_r)
        os.close(self._wake_w)
        self.timeline.record("pluginwatcher.stop", "pluginwatcher", directory=str(self.registry_dir))

    def registered(self) -> dict[str, str]:
        """Socket path -> plugin name, for every plugin in the actual state."""
        with self._lock:
            return {path: p.name for path, p in self._actual.items()}

    # -- desired state: inotify (plugin_watcher.go) --------------------------

    def _add_watch(self, directory: Path) -> None:
        assert self._inotify is not None
        # fsnotify Create = IN_CREATE|IN_MOVED_TO, Remove = IN_DELETE_SELF|IN_DELETE; renames
        # away (IN_MOVED_FROM) are not handled upstream.
        wd = self._inotify.add_watch(str(directory), IN.CREATE | IN.MOVED_TO | IN.DELETE)
        self._wds[wd] = directory

    def _traverse(self, directory: Path) -> None:
        """plugin_watcher.go traversePluginDir: watch every sub-directory, treat every socket as created."""
        for root, dirs, files in os.walk(directory):
            for d in sorted(dirs):
                path = Path(root) / d
                try:
                    self._add_watch(path)
                except OSError as err:
                    self.timeline.record("pluginwatcher.error", "pluginwatcher", path=str(path), error=str(err))
            for f in sorted(files):
                path = Path(root) / f
                if is_socket(path):
                    self._on_create(path)

    def _on_create(self, path: Path) -> None:
        """plugin_watcher.go handleCreateEvent."""
        if path.name.startswith("."):
            return
        try:
            mode = os.stat(path).st_mode
        except OSError:
            return  # gone already
        if stat.S_ISDIR(mode):
            try:
                self._add_watch(path)
            except OSError:
                return
            self._traverse(path)
            return
        if not stat.S_ISSOCK(mode):
            return
        with self._lock:
            # desired_state_of_world.go AddOrUpdatePlugin: a new timestamp each time.
            self._desired[str(path)] = time.monotonic()
        self.timeline.record("pluginwatcher.found", "pluginwatcher", socket=str(path))

    def _on_delete(self, path: Path) -> None:
        """plugin_watcher.go handleDeleteEvent: desiredStateOfWorld.RemovePlugin."""
        with self._lock:
            removed = self._desired.pop(str(path), None) is not None
        if removed:
            self.timeline.record("pluginwatcher.removed", "pluginwatcher", socket=str(path))

    def _watch(self) -> None:
        assert self._inotify is not None
        while not self._stop.is_set():
            ready, _, _ = select.select([self._inotify.fileno(), self._wake_r], [], [])
            if self._wake_r in ready:
                return
            for event in self._inotify.read(timeout=0):
                directory = self._wds.get(event.wd)
                if directory is None or not event.name:
                    continue
                path = directory / event.name
                if event.mask & (IN.CREATE | IN.MOVED_TO):
                    self._on_create(path)
                elif event.mask & IN.DELETE:
                    self._on_delete(path)

    # -- reconciler (reconciler.go) -----------------------------------------

    def _reconcile_loop(self) -> None:
        while not self._stop.wait(RECONCILE_PERIOD_S):  # the reconciler's period: a timer
            self._reconcile()

    def _reconcile(self) -> None:
        now = time.monotonic()
        with self._lock:
            # Unregister first: plugins gone from the desired state, or re-created (new timestamp).
            for path, plugin in self._actual.items():
                if path in self._pending:
                    continue
                if self._desired.get(path) != plugin.timestamp:
                    self._spawn(path, self._unregister, path, plugin)
            for path, timestamp in self._desired.items():
                if path in self._pending or path in self._actual:
                    continue
                not_before, _ = self._backoff.get(path, (0.0, 0.0))
                if now < not_before:
                    continue
                self._spawn(path, self._register, path, timestamp)

    def _spawn(self, path: str, target: object, *args: object) -> None:
        """Run one operation for a socket on its own thread (operation_executor: a goroutine each)."""
        self._pending.add(path)

        def run() -> None:
            try:
                target(*args)  # type: ignore[operator]
            finally:
                with self._lock:
                    self._pending.discard(path)

        t = threading.Thread(target=run, daemon=True, name=f"pluginop-{os.path.basename(path)}")
        self._ops = [o for o in self._ops if o.is_alive()] + [t]
        t.start()

    def _failed(self, path: str, error: str, notified: str | None) -> None:
        with self._lock:
            _, last = self._backoff.get(path, (0.0, 0.0))
            delay = BACKOFF_INITIAL_S if last == 0.0 else min(last * 2, BACKOFF_MAX_S)
            self._backoff[path] = (time.monotonic() + delay, delay)
        self.timeline.record("pluginwatcher.rejected", "pluginwatcher", socket=path, error=error,
                             notified=notified, retry_after_s=delay)

    # -- operations (operation_generator.go) ---------------------------------

    def _register(self, path: str, timestamp: float) -> None:
        """operation_generator.go GenerateRegisterPluginFunc."""
        raw = grpc.insecure_channel(unix_target(path), options=CHANNEL_OPTIONS)
        dial = next(endpoint_ids)
        try:
            try:
                grpc.channel_ready_future(raw).result(timeout=self.profile.dial_timeout_s)
            except grpc.FutureTimeoutError:
                record_dial(self.timeline, path, self.kubelet_instance, dial, "context deadline exceeded")
                self._failed(path, f"RegisterPlugin error -- dial failed at socket {path}, "
                                   "err: context deadline exceeded", None)
                return
            record_dial(self.timeline, path, self.kubelet_instance, dial, OK)
            client = reg_grpc.RegistrationStub(
                grpc.intercept_channel(raw, RecordingClientInterceptor(self.timeline, "kubelet")))
            self._register_with(client, path, timestamp)
        finally:
            raw.close()

    def _register_with(self, client: reg_grpc.RegistrationStub, path: str, timestamp: float) -> None:
        if self.getinfo_delay_s > 0:
            self.timeline.record("fault.getinfo_delay", "pluginwatcher", socket=path, delay_s=self.getinfo_delay_s)
            if self._stop.wait(self.getinfo_delay_s):  # an injected delay, cut short by stop()
                return
        try:
            info = client.GetInfo(reg.InfoRequest(), timeout=GETINFO_TIMEOUT_S)
        except grpc.RpcError as err:
            outcome = go_status(err)
            self.timeline.record("pluginwatcher.getinfo", "pluginwatcher", socket=path, outcome=outcome)
            self._failed(path, "RegisterPlugin error -- failed to get plugin info using RPC GetInfo at socket "
                               f"{path}, err: {outcome}", None)
            return
        versions = list(info.supported_versions)
        self.timeline.record("pluginwatcher.getinfo", "pluginwatcher", socket=path, outcome="OK", type=info.type,
                             name=info.name, endpoint=info.endpoint, versions=versions)
        handler = self.handlers.get(info.type)
        if handler is None:
            message = f"RegisterPlugin error -- no handler registered for plugin type: {info.type} at socket {path}"
            self._notify_failure(client, path, message, message)
            return
        endpoint = info.endpoint or path  # an empty endpoint: the registry socket serves the plugin too
        error = handler.validate(info.name, endpoint, versions)
        if error is not None:
            self._notify_failure(client, path, f"RegisterPlugin error -- plugin validation failed with err: {error}",
                                 "RegisterPlugin error -- pluginHandler.ValidatePluginFunc failed")
            return
        # Into the actual state before the handler's Register, so that a delete
        # during registration is handled as a de-registration.
        plugin = _Registered(timestamp, info.type, info.name, endpoint, handler)
        with self._lock:
            self._actual[path] = plugin
        error = handler.register(info.name, endpoint, versions)
        if error is not None:
            # Upstream removes the plugin from the actual state and returns notifyPlugin's
            # result, which is the error itself even when the plugin was told: the operation
            # failed, so the reconciler retries it after the exponential backoff.
            with self._lock:
                if self._actual.get(path) is plugin:
                    del self._actual[path]
            message = f"RegisterPlugin error -- plugin registration failed with err: {error}"
            notify_error = self._notify(client, False, message)
            self._failed(path, notify_error or message, message if notify_error is None else None)
            return
        notify_error = self._notify(client, True, "")
        if notify_error is not None:
            handler.deregister(info.name, endpoint)
            with self._lock:
                if self._actual.get(path) is plugin:
                    del self._actual[path]
            self.timeline.record("pluginwatcher.deregistered", "pluginwatcher", socket=path, type=info.type,
                                 name=info.name, why="notify failed")
            self._failed(path, "RegisterPlugin error -- failed to send registration status at socket "
                               f"{path}, err: {notify_error}", None)
            return
        with self._lock:
            self._backoff.pop(path, None)
        self.timeline.record("pluginwatcher.registered", "pluginwatcher", socket=path, type=info.type,
                             name=info.name, endpoint=endpoint, versions=versions)

    def _notify_failure(self, client: reg_grpc.RegistrationStub, path: str, status: str, error: str) -> None:
        notify_error = self._notify(client, False, status)
        if notify_error is not None:
            self._failed(path, f"RegisterPlugin error -- failed to send error at socket {path}, "
                               f"err: {notify_error}", None)
        else:
            self._failed(path, error, status)

    def _notify(self, client: reg_grpc.RegistrationStub, registered: bool, error: str) -> str | None:
        """operation_generator.go notifyPlugin: the error, or None."""
        try:
            client.NotifyRegistrationStatus(reg.RegistrationStatus(plugin_registered=registered, error=error),
                                            timeout=NOTIFY_TIMEOUT_S)
        except grpc.RpcError as err:
            self.timeline.record("pluginwatcher.notify", "pluginwatcher", registered=registered,
                                 code=err.code().name, details=err.details())
            return f"{error}: {go_status(err)}" if error else go_status(err)
        self.timeline.record("pluginwatcher.notify", "pluginwatcher", registered=registered, code="OK", details="")
        return None

    def _unregister(self, path: str, plugin: _Registered) -> None:
        """operation_generator.go GenerateUnregisterPluginFunc."""
        plugin.handler.deregister(plugin.name, plugin.endpoint)
        with self._lock:
            if self._actual.get(path) is plugin:
                del self._actual[path]
            why = "socket replaced" if path in self._desired else "socket removed"
        self.timeline.record("pluginwatcher.deregistered", "pluginwatcher", socket=path, type=plugin.type,
                             name=plugin.name, why=why)

