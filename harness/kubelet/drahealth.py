"""The fake kubelet's DRA device health, with upstream v1.36 semantics.

Upstream: pkg/kubelet/cm/dra/healthinfo.go (the cache), manager.go
HandleWatchResourcesStream / buildDeviceHealth, plugin/dra_plugin_manager.go
add() (the stream loop). The kubelet opens NodeWatchResources on the plugin's
one gRPC connection, re-opens it 5 s after it ends, and stores each reported
device with the kubelet's receive time as LastUpdated. Timeouts are lazy
upstream: a reader (the pod status) sees Unknown once LastUpdated is older
than the device's timeout, and each later message sweeps unreported devices
to Unknown. Nothing upstream fires at the instant of the timeout; fakelet
records `dra.health_unknown` at that instant (what a status read would
show from then on) so that checks can wait for it instead of polling.
When the stream ends the driver's entries are cleared: every device reads
Unknown until the next message.
"""

from __future__ import annotations

import heapq
import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc

from harness.instruments.timeline import Timeline
from harness.kubelet.endpoint import go_status
from harness.kubelet.versions import HEALTH_SHORT, HEALTH_V1, HEALTH_V1ALPHA1
from harness.wire import drahealth_v1, drahealth_v1alpha1

HEALTH_STATE_NAME = "dra_health_state"  # kubelet cm/dra manager.go NewManager: filepath.Join(dir, "dra_health_state")
HEALTH_MESSAGE_MAX = 1024  # k8s.io/api core/v1 types.go ResourceHealthMessageMaxLength
# state/state.go DeviceHealthStatus values, which are also v1.ResourceHealthStatus strings.
HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"
UNKNOWN = "Unknown"

# The gRPC method each health version is served under (proto package + service).
HEALTH_METHODS = {
    HEALTH_V1ALPHA1: "/v1alpha1.DRAResourceHealth/NodeWatchResources",
    HEALTH_V1: "/v1.DRAResourceHealth/NodeWatchResources",
}


def health_messages(service: str) -> Any:
    """The message module for a health service."""
    return drahealth_v1 if service == HEALTH_V1 else drahealth_v1alpha1


def _status(value: int) -> str:
    """manager.go toDeviceHealthStatus: anything but HEALTHY/UNHEALTHY is Unknown."""
    return {1: HEALTHY, 2: UNHEALTHY}.get(value, UNKNOWN)


def truncate_message(message: str) -> str:
    """manager.go truncateHealthMessage (Go counts bytes; the cut is by bytes too)."""
    raw = message.encode()
    if len(raw) <= HEALTH_MESSAGE_MAX:
        return message
    return raw[:HEALTH_MESSAGE_MAX - 3].decode(errors="ignore") + "..."


@dataclass
class DeviceHealth:
    """state.go DeviceHealth; last_updated is wall-clock seconds (it is checkpointed)."""

    pool: str
    device: str
    health: str = UNKNOWN
    last_updated: float = 0.0
    timeout_s: float = 0.0  # 0 = the default timeout
    message: str = ""

    def to_go(self) -> dict:
        stamp = datetime.fromtimestamp(self.last_updated, UTC).isoformat().replace("+00:00", "Z")
        return {"PoolName": self.pool, "DeviceName": self.device, "Health": self.health, "LastUpdated": stamp,
                "HealthCheckTimeout": int(self.timeout_s * 1e9), "Message": self.message}

    @classmethod
    def from_go(cls, d: dict) -> DeviceHealth:
        stamp = str(d.get("LastUpdated") or "1970-01-01T00:00:00Z").replace("Z", "+00:00")
        try:
            last = datetime.fromisoformat(stamp).timestamp()
        except ValueError:
            last = 0.0
        return cls(d.get("PoolName", ""), d.get("DeviceName", ""), d.get("Health", UNKNOWN), last,
                   int(d.get("HealthCheckTimeout") or 0) / 1e9, d.get("Message", ""))


class HealthInfoCache:
    """healthinfo.go healthInfoCache: driver -> "pool/device" -> DeviceHealth, checkpointed on change."""

    def __init__(self, state_path: Path | None, default_timeout_s: float, timeline: Timeline,
                 observe_timeouts: bool = True) -> None:
        """`observe_timeouts`: record `dra.health_unknown` at each device's deadline (the fake kubelet's own
        cache); a copy kept from the wire in front of a real kubelet (the DRA relay's) only answers reads."""
        self.state_path, self.default_timeout_s, self.timeline = state_path, default_timeout_s, timeline
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._drivers: dict[str, dict[str, DeviceHealth]] = {}
        self._deadlines: list[tuple[float, str, str, float]] = []  # (expiry, driver, key, last_updated)
        self._stop = False
        self._observe = observe_timeouts
        self._thread: threading.Thread | None = None
        self._load()
        if observe_timeouts:
            self._thread = threading.Thread(target=self._watch_timeouts, daemon=True, name="dra-health-timeouts")
            self._thread.start()

    def close(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(2)

    # -- checkpoint (healthinfo.go loadFromCheckpoint / saveToCheckpointInternal) --

    def _load(self) -> None:
        if self.state_path is None:
            return
        try:
            doc = json.loads(self.state_path.read_text())
        except FileNotFoundError:
            return
        except (OSError, ValueError) as err:
            # Upstream logs "Failed to load health checkpoint, proceeding with empty cache".
            self.timeline.record("dra.health_checkpoint", "kubelet", error=str(err))
            return
        for driver, state in (doc or {}).items():
            devices = {k: DeviceHealth.from_go(v) for k, v in ((state or {}).get("Devices") or {}).items()}
            self._drivers[driver] = devices
            for key, dev in devices.items():
                self._arm(driver, key, dev)

    def _save(self) -> None:
        if self.state_path is None:
            return
        doc = {d: {"Devices": {k: v.to_go() for k, v in devs.items()}} for d, devs in self._drivers.items()}
        tmp = self.state_path.with_name(f".{self.state_path.name}.tmp")
        tmp.write_text(json.dumps(doc, separators=(",", ":"), sort_keys=True))
        os.replace(tmp, self.state_path)

    # -- reads and writes ------------------------------------------------------

    def _timeout(self, dev: DeviceHealth) -> float:
        return dev.timeout_s if dev.timeout_s > 0 else self.default_timeout_s

    def get(self, driver: str, pool: str, device: str) -> DeviceHealth:
        """healthinfo.go getHealthInfo: Unknown when absent or timed out."""
        with self._lock:
            dev = self._drivers.get(driver, {}).get(f"{pool}/{device}")
            if dev is None or time.time() - dev.last_updated > self._timeout(dev):
                return DeviceHealth(pool, device)
            return DeviceHealth(**vars(dev))

    def snapshot(self, driver: str) -> dict[str, DeviceHealth]:
        with self._lock:
            return {k: DeviceHealth(**vars(v)) for k, v in self._drivers.get(driver, {}).items()}

    def update(self, driver: str, reported: list[DeviceHealth]) -> list[DeviceHealth]:
        """healthinfo.go updateHealthInfo: store with the receive time; return the changed devices."""
        changed: list[DeviceHealth] = []
        with self._cond:
            now = time.time()
            current = self._drivers.setdefault(driver, {})
            keys = set()
            for dev in reported:
                dev.last_updated = now
                key = f"{dev.pool}/{dev.device}"
                keys.add(key)
                old = current.get(key)
                if old is None or (old.health, old.message, old.timeout_s) != (dev.health, dev.message,
                                                                                dev.timeout_s):
                    changed.append(dev)
                current[key] = dev
                self._arm(driver, key, dev)
            for key, old in current.items():
                # Devices the plugin stopped reporting turn Unknown once timed out.
                if key not in keys and old.health != UNKNOWN and now - old.last_updated > self._timeout(old):
                    old.health, old.message, old.last_updated = UNKNOWN, "", now
                    changed.append(old)
            if changed:
                self._save()
            self._cond.notify_all()
        return changed

    def clear_driver(self, driver: str) -> list[str]:
        """healthinfo.go clearDriver (on stream exit): the driver's devices read Unknown."""
        with self._lock:
            gone = sorted(self._drivers.pop(driver, {}))
            self._save()
        return gone

    # -- the timeout observer (fakelet's, see the module docstring) -------------

    def _arm(self, driver: str, key: str, dev: DeviceHealth) -> None:
        if dev.health != UNKNOWN and self._observe:
            heapq.heappush(self._deadlines, (dev.last_updated + self._timeout(dev), driver, key, dev.last_updated))

    def _watch_timeouts(self) -> None:
        with self._cond:
            while not self._stop:
                if not self._deadlines:
                    self._cond.wait()
                    continue
                expiry, driver, key, stamp = self._deadlines[0]
                remaining = expiry - time.time()
                if remaining > 0:
                    self._cond.wait(remaining)
                    continue
                heapq.heappop(self._deadlines)
                dev = self._drivers.get(driver, {}).get(key)
                if dev is not None and dev.last_updated == stamp and dev.health != UNKNOWN:
                    self.timeline.record("dra.health_unknown", "kubelet", driver=driver, pool=dev.pool,
                                         device=dev.device, last_health=dev.health,
                                         timeout_s=self._timeout(dev))


class HealthStream:
    """One plugin's NodeWatchResources loop (dra_plugin_manager.go add(): wait.UntilWithContext)."""

    def __init__(self, driver: str, channel: grpc.Channel, service: str, cache: HealthInfoCache,
                 timeline: Timeline, retry_s: float, stop_on_unimplemented: bool,
                 on_change: Callable[[str, list[DeviceHealth]], None] | None = None) -> None:
        self.driver, self.channel, self.service, self.cache = driver, channel, service, cache
        self.timeline, self.retry_s, self.stop_on_unimplemented = timeline, retry_s, stop_on_unimplemented
        self.on_change = on_change
        self.version = HEALTH_SHORT[service]
        self._stop = threading.Event()
        self._call_lock = threading.Lock()
        self._call: Any = None
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"dra-health-{driver}")

    def start(self) -> HealthStream:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Cancel the stream (the plugin's HealthStreamCancel) and end the loop."""
        self._stop.set()
        with self._call_lock:
            call = self._call
        if call is not None:
            call.cancel()
        if threading.current_thread() is not self._thread and self._thread.is_alive():
            self._thread.join(2)

    def drop(self) -> bool:
        """End the stream in flight as a broken connection does, and keep the loop: it opens the next one
        `retry_s` later (dra_plugin_manager.go add(): wait.UntilWithContext re-runs the stream function 5 s after
        it returned, whatever ended it; only the plugin's deregistration cancels the loop). False when no stream
        was open."""
        with self._call_lock:
            call = self._call
        if call is None or self._stop.is_set():
            return False
        self.timeline.record("fault.health_stream_drop", "harness", driver=self.driver, version=self.version)
        call.cancel()
        return True

    def _run(self) -> None:
        # JitterUntil with sliding=true: the period starts when the attempt returns.
        while not self._stop.is_set():
            if not self._attempt():
                return
            if self._stop.wait(self.retry_s):
                return
            self.timeline.record("dra.health_stream", "kubelet", driver=self.driver, state="retry",
                                 version=self.version, error=None)

    def _attempt(self) -> bool:
        """One stream; False when the loop must stop for good."""
        mod = health_messages(self.service)
        method = self.channel.unary_stream(HEALTH_METHODS[self.service],
                                           request_serializer=mod.NodeWatchResourcesRequest.SerializeToString,
                                           response_deserializer=mod.NodeWatchResourcesResponse.FromString)
        with self._call_lock:
            if self._stop.is_set():
                return False
            call = self._call = method(mod.NodeWatchResourcesRequest())
        self.timeline.record("dra.health_stream", "kubelet", driver=self.driver, state="open",
                             version=self.version, error=None)
        received = 0
        error: str | None = None
        code: grpc.StatusCode | None = None
        try:
            for response in call:
                received += 1
                self._handle(response)
        except grpc.RpcError as err:
            code = err.code() if hasattr(err, "code") else None
            error = go_status(err)
        finally:
            with self._call_lock:
                self._call = None
        if self._stop.is_set():
            # Deregistration or kubelet stop: the stream context was canceled, and HandleWatchResourcesStream's
            # deferred clearDriver runs all the same (v1.36.3 manager.go): a rolling update's old instance going
            # away clears what the new one reported too (kubernetes#140818).
            cleared = self.cache.clear_driver(self.driver)
            self.timeline.record("dra.health_stream", "kubelet", driver=self.driver, state="ended",
                                 version=self.version, error="context canceled", cleared=cleared)
            return False
        # An Unavailable before any message is grpc-go's NewStream failing (the handler never
        # ran, nothing is cleared); everything else ended a handled stream, which clears.
        established = not (received == 0 and code == grpc.StatusCode.UNAVAILABLE)
        cleared = self.cache.clear_driver(self.driver) if established else []
        self.timeline.record("dra.health_stream", "kubelet", driver=self.driver, state="ended",
                             version=self.version, error=error or "EOF", messages=received, cleared=cleared)
        if code == grpc.StatusCode.UNIMPLEMENTED and self.stop_on_unimplemented:
            self.timeline.record("dra.health_stream", "kubelet", driver=self.driver, state="stopped",
                                 version=self.version, error=error)
            return False
        return True

    def _handle(self, response: Any) -> None:
        devices = []
        for d in response.devices:
            timeout = d.health_check_timeout_seconds
            devices.append(DeviceHealth(d.device.pool_name, d.device.device_name, _status(d.health),
                                        timeout_s=float(timeout) if timeout > 0 else 0.0,
                                        message=truncate_message(d.message)))
        changed = self.cache.update(self.driver, devices)
        self.timeline.record("dra.health", "kubelet", driver=self.driver, version=self.version,
                             devices=[{"pool": d.pool, "device": d.device, "health": d.health, "reason": d.message,
                                       "timeout_s": d.timeout_s} for d in devices],
                             changed=[f"{d.pool}/{d.device}" for d in changed])
        if changed and self.on_change is not None:
            self.on_change(self.driver, changed)
