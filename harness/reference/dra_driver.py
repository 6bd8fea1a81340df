"""fakelet's reference DRA kubelet plugin: a conformant driver, and its mutants.

It follows upstream's kubeletplugin helper (k8s.io/dynamic-resource-allocation
kubeletplugin: draplugin.go, registrationserver.go, nonblockinggrpcserver.go,
endpoint.go) and adds what a careful driver does on top:

- serve `<plugin-dir>/dra.sock` (v1 and v1beta1 DRAPlugin, DRAResourceHealth)
  first, then create `<registry-dir>/<driver>-reg.sock`; stale sockets are
  removed before listening, ours are removed on exit;
- watch both sockets with inotify and recreate one that is deleted (the helper
  does not; a node agent or a harness fault may delete it);
- publish the node's devices as one ResourceSlice pool named after the node
  (harness/reference/dra_slices.py), and republish on hot-plug;
- prepare claims from their API objects, one CDI spec file per claim
  (harness/reference/cdi.py), with per-claim errors and a checkpoint
  (harness/reference/dra_checkpoint.py) so that a restarted driver can still
  unprepare and re-prepare with the same answer;
- stream device health: the full list at once, on every change, and every
  --health-refresh-s seconds, well inside the kubelet's 30 s health timeout.

`--defect NAME` switches on one named bug (harness/reference/dra_defects.py); `--defect a+b` several at once.

    python -m harness.reference.dra_driver --driver-name D --node-name N --kubeconfig K \
        --registry-dir R --plugin-dir P --cdi-dir C --sysfs-root S --state-dir X
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import itertools
import logging
import math
import os
import re
import select
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc
from inotify_simple import INotify
from inotify_simple import flags as IN

from harness.controlplane.base import RESOURCE_API
from harness.controlplane.taints import RULE_VERSIONS, rule_matches
from harness.instruments.grpcutil import unix_target
from harness.launch.sandbox import SOCKET_PATH_MAX
from harness.reference import (
    cdi,
    dra_admin,
    dra_beside,
    dra_binding,
    dra_capacity,
    dra_extended,
    dra_partitions,
    wakeup,
)
from harness.reference.dra_checkpoint import Checkpoint
from harness.reference.dra_defects import DRA_DEFECTS
from harness.reference.dra_slices import SlicePublisher, dns_label
from harness.reference.sources import HEALTHY as HW_HEALTHY
from harness.reference.sources import UNHEALTHY as HW_UNHEALTHY
from harness.reference.sources import SysfsSource
from harness.spec import composition
from harness.wire import (
    dra_v1,
    dra_v1_grpc,
    dra_v1beta1,
    dra_v1beta1_grpc,
    drahealth_v1,
    drahealth_v1_grpc,
    drahealth_v1alpha1,
    drahealth_v1alpha1_grpc,
    reg,
    reg_grpc,
)

log = logging.getLogger("reference-dra")

DRA_PLUGIN_TYPE = "DRAPlugin"  # pluginregistration v1 constants.go DRAPlugin
SERVICE_V1 = "v1.DRAPlugin"  # kubelet pkg/apis/dra/v1 types.go DRAPluginService
SERVICE_V1BETA1 = "v1beta1.DRAPlugin"  # kubelet pkg/apis/dra/v1beta1 types.go DRAPluginService
HEALTH_V1 = "v1.DRAResourceHealth"  # kubelet@v0.37 pkg/apis/dra-health/v1 types.go DRAResourceHealthService
HEALTH_V1ALPHA1 = "v1alpha1.DRAResourceHealth"  # kubelet pkg/apis/dra-health/v1alpha1 types.go
REG_SOCKET_SUFFIX = "-reg.sock"  # kubeletplugin draplugin.go Start: o.driverName + uidPart + "-reg.sock"
DRA_SOCKET = "dra.sock"  # kubeletplugin draplugin.go Start: "dra" + uidPart + ".sock"
# kubeletplugin draplugin.go New: under RollingUpdate, path.Join(pluginDataDirectoryPath, "serialize.lock"), the
# file lock that serializes prepare and unprepare across every instance of the driver (serializeGRPCIfEnabled).
SERIALIZE_LOCK = "serialize.lock"
DEVICES_LOCK = "devices.lock"  # waits-for-old-instance: the lock its old instance holds until it exits


UID_DIGEST_CHARS = 12  # hex digits of a UID's SHA-256 that stand for it in a socket name too long with it


def socket_names(driver: str, pod_uid: str = "", registry_dir: Path | str | None = None,
                 plugin_dir: Path | str | None = None) -> tuple[str, str]:
    """(registration, endpoint) socket names: kubeletplugin draplugin.go Start's, where uidPart is "-" + the pod's
    UID under RollingUpdate(uid), so that two instances of a rolling update never take each other's sockets.

    Upstream's directories are /var/lib/kubelet's, where a 36-character pod UID fits; a sandbox's are longer,
    and `<driver>-<UID>-reg.sock` under one comes to about 116 bytes, past the SOCKET_PATH_MAX a unix socket
    address holds. When a name would not fit under the directories given, its UID part is the first
    UID_DIGEST_CHARS hex digits of the UID's SHA-256 instead: still one name per UID, and the same name each
    time, so a restarted instance of the same pod finds its own sockets."""
    def named(part: str) -> tuple[str, str]:
        uid_part = f"-{part}" if part else ""
        return f"{driver}{uid_part}{REG_SOCKET_SUFFIX}", f"{DRA_SOCKET.removesuffix('.sock')}{uid_part}.sock"

    names = named(pod_uid)
    if pod_uid and not _fit(names, registry_dir, plugin_dir):
        names = named(hashlib.sha256(pod_uid.encode()).hexdigest()[:UID_DIGEST_CHARS])
    return names


def _fit(names: tuple[str, str], registry_dir: Path | str | None, plugin_dir: Path | str | None) -> bool:
    paths = [os.path.join(d, n) for d, n in zip((registry_dir, plugin_dir), names, strict=True) if d is not None]
    return all(len(p) <= SOCKET_PATH_MAX for p in paths)


KUBELET_HEALTH_TIMEOUT_S = 30.0  # kubelet cm/dra/healthinfo.go DefaultHealthTimeout
# Declared per device (health_check_timeout_seconds): three refresh periods, so
# one late message never makes the kubelet call a device Unknown.
HEALTH_TIMEOUT_PERIODS = 3
CDI_CLASS = "gpu"
# Taint keys under the driver's own domain (a taint key is a qualified name, like a label key).
TAINT_UNHEALTHY, TAINT_TEMPERATURE = "unhealthy", "temperature"
NO_EXECUTE, NO_SCHEDULE = "NoExecute", "NoSchedule"  # k8s.io/api resource/v1 DeviceTaintEffect

# Mutant timings.
GETINFO_SLOW_S = 1.5  # past pluginmanager operation_generator.go GetInfo's 1 s timeout
SLOW_REFRESH_PERIODS = 4  # slow-health-refresh: longer than the declared HEALTH_TIMEOUT_PERIODS
WRONG_ENDPOINT = "plugin.sock"
SPLIT_HEALTH_SOCKET = "health.sock"

# DRAResourceHealth HealthStatus values, by name (identical in v1alpha1 and v1).
HEALTHY, UNHEALTHY, UNKNOWN = "HEALTHY", "UNHEALTHY", "UNKNOWN"


@dataclass(frozen=True)
class HwDevice:
    """One device as the fake backend's sysfs tree shows it."""

    id: str
    cls: str
    uuid: str
    model: str
    vendor: str
    numa: int
    pci_address: str
    memory_mib: int
    health: str
    temperature_c: float | None
    node: str
    host_path: str
    layout: dra_partitions.Layout | None = None  # MIG-style partitions, when the backend cut the GPU into some
    sharing: dra_capacity.Sharing | None = None  # its shared capacities, when the backend makes it shareable
    fabric: dra_binding.Fabric | None = None  # its fabric attachment, when the backend makes it fabric-attached


class DraSysfsSource(SysfsSource):
    """SysfsSource (same layout, same watches) with the attributes a ResourceSlice publishes."""

    def read_devices(self) -> list[HwDevice]:
        out = []
        for d in self._device_dirs():
            try:
                device = self._read_full(d)
            except (OSError, ValueError):
                continue  # half-removed during a hot-unplug: it is going away
            if device is not None:
                out.append(device)
        return out

    def _read_full(self, d: Path) -> HwDevice | None:
        def value(name: str, default: str = "") -> str:
            f = d / name
            return f.read_text().strip() if f.is_file() else default

        if value("present", "1") in ("0", "false"):
            return None
        milli, node = value("temperature"), value("node")
        return HwDevice(id=d.name, cls=d.parent.name, uuid=value("uuid"), model=value("model"),
                        vendor=value("vendor"), numa=int(value("numa_node", "0") or 0),
                        pci_address=value("pci_address"), memory_mib=int(value("memory_mib", "0") or 0),
                        health=value("health", HW_HEALTHY), temperature_c=int(milli) / 1000 if milli else None,
                        node=node, host_path=str(self.root / "dev" / node) if node else "/dev/null",
                        layout=dra_partitions.read_layout(d, self.root / "dev"),
                        sharing=dra_capacity.read_sharing(d), fabric=dra_binding.read_fabric(d))


def _notify(cond: threading.Condition) -> None:
    with cond:
        cond.notify_all()


# -- gRPC services -------------------------------------------------------------


def _share_id(pb: ModuleType, device: dict[str, Any]) -> dict[str, str]:
    # v1's Device names the share (kubelet pkg/apis/dra/v1 api.proto share_id); v1beta1's has no field for it.
    if device.get("share_id") and "share_id" in pb.Device.DESCRIPTOR.fields_by_name:
        return {"share_id": device["share_id"]}
    return {}


def _dra_servicer(pb: ModuleType, pb_grpc: ModuleType, driver: ReferenceDriver) -> Any:
    """DRAPlugin for one API version; v1 and v1beta1 differ only in their message modules."""

    class DRAPluginService(pb_grpc.DRAPluginServicer):  # type: ignore[name-defined]
        def NodePrepareResources(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
            if driver.has("prepare-hang") and request.claims:
                driver.stopping.wait()
                context.abort(grpc.StatusCode.UNAVAILABLE, "shutting down")
            if driver.has("dies-mid-prepare") and request.claims:
                log.error("crashing in NodePrepareResources")
                os._exit(3)
            results = driver.prepare([(c.namespace, c.uid, c.name) for c in request.claims])
            resp = pb.NodePrepareResourcesResponse()
            for uid, result in results.items():
                resp.claims[uid].CopyFrom(pb.NodePrepareResourceResponse(
                    error=result.get("error", ""),
                    devices=[pb.Device(request_names=d["requests"], pool_name=d["pool"], device_name=d["device"],
                                       cdi_device_ids=d["cdi_ids"], **_share_id(pb, d))
                             for d in result.get("devices", [])]))
            return resp

        def NodeUnprepareResources(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
            if driver.has("unprepare-hang") and request.claims:
                driver.stopping.wait()
                context.abort(grpc.StatusCode.UNAVAILABLE, "shutting down")
            errors = driver.unprepare([(c.namespace, c.uid, c.name) for c in request.claims])
            resp = pb.NodeUnprepareResourcesResponse()
            for uid, error in errors.items():
                resp.claims[uid].CopyFrom(pb.NodeUnprepareResourceResponse(error=error))
            return resp

    return DRAPluginService()


def _health_servicer(pb: ModuleType, pb_grpc: ModuleType, driver: ReferenceDriver) -> Any:
    class DRAResourceHealthService(pb_grpc.DRAResourceHealthServicer):  # type: ignore[name-defined]
        def NodeWatchResources(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:  # noqa: N802
            for devices in driver.watch_health(context):
                yield pb.NodeWatchResourcesResponse(devices=[
                    pb.DeviceHealth(device=pb.DeviceIdentifier(pool_name=d["pool"], device_name=d["device"]),
                                    health=pb.HealthStatus.Value(d["health"]),
                                    last_updated_time=int(time.time()),
                                    health_check_timeout_seconds=driver.declared_health_timeout_s,
                                    message=d["reason"])
                    for d in devices])

    return DRAResourceHealthService()


class RegistrationService(reg_grpc.RegistrationServicer):
    """registrationserver.go, answering NotifyRegistrationStatus(false) without an error."""

    def __init__(self, driver: ReferenceDriver) -> None:
        self.d = driver

    def GetInfo(self, request: reg.InfoRequest, context: grpc.ServicerContext) -> reg.PluginInfo:  # noqa: N802
        if self.d.has("one-kubelet-only") and self.d.accepted:
            context.abort(grpc.StatusCode.UNAVAILABLE, "registration already done")
        if self.d.has("getinfo-hang"):
            self.d.stopping.wait()
            context.abort(grpc.StatusCode.UNAVAILABLE, "shutting down")
        if self.d.has("getinfo-slow"):
            self.d.stopping.wait(GETINFO_SLOW_S)
        endpoint = self.d.plugin_dir / WRONG_ENDPOINT if self.d.has("wrong-endpoint") else self.d.dra_socket
        # Health is advertised too: a 1.37 kubelet opens the stream only for plugins that list it.
        health = [] if self.d.has("no-health") or self.d.has("split-health-socket") else [HEALTH_V1, HEALTH_V1ALPHA1]
        return reg.PluginInfo(type=DRA_PLUGIN_TYPE, name=self.d.driver, endpoint=str(endpoint),
                              supported_versions=[SERVICE_V1, SERVICE_V1BETA1, *health])

    def NotifyRegistrationStatus(  # noqa: N802
        self, request: reg.RegistrationStatus, context: grpc.ServicerContext
    ) -> reg.RegistrationStatusResponse:
        if request.plugin_registered:
            log.info("registered with the kubelet")
            # one-kubelet-only's bug: a registrar that thinks its job is done once accepted.
            self.d.accepted = True
            return reg.RegistrationStatusResponse()
        # The kubelet keeps our socket in its desired state and retries with
        # backoff, so staying up and serving is all recovery needs.
        log.warning("the kubelet rejected the registration: %s; still serving", request.error)
        if self.d.has("dies-on-reject"):
            log.error("registration rejected, exiting")
            os._exit(1)
        return reg.RegistrationStatusResponse()


# -- the driver ----------------------------------------------------------------


class ReferenceDriver:
    def __init__(self, args: argparse.Namespace) -> None:
        self.defect: str | None = args.defect
        self.driver: str = args.driver_name.replace(".", "_", 1) if self.has("bad-driver-name") else args.driver_name
        self.node: str = args.node_name
        self.pool = self.node
        # Absolute, not resolved: the kubelet dials exactly the path we were told to use.
        self.plugin_dir = Path(os.path.abspath(args.plugin_dir))
        self.registry_dir = Path(os.path.abspath(args.registry_dir))
        self.cdi_dir = Path(os.path.abspath(args.cdi_dir))
        self.state_dir = Path(os.path.abspath(args.state_dir))
        reg_name, dra_name = socket_names(self.driver, args.pod_uid, self.registry_dir, self.plugin_dir)
        self.dra_socket = self.plugin_dir / dra_name
        self.reg_socket = self.registry_dir / reg_name
        for path in (self.dra_socket, self.reg_socket):
            if len(str(path)) > SOCKET_PATH_MAX:
                raise ValueError(f"socket path {path} is {len(str(path))} bytes, longer than the "
                                 f"{SOCKET_PATH_MAX} a unix socket address holds")
        self.source = DraSysfsSource(Path(args.sysfs_root))
        # A device plugin's devices beside this driver: never published, never prepared (dra_beside.py).
        self.excluded = dra_beside.parse(getattr(args, "exclude_devices", "") or "")
        self.threshold_c, self.hysteresis_c = args.temp_threshold_c, args.temp_hysteresis_c
        self.refresh_s: float = args.health_refresh_s
        self.declared_health_timeout_s = max(1, math.ceil(HEALTH_TIMEOUT_PERIODS * self.refresh_s))
        self.stream_refresh_s = self.refresh_s * (SLOW_REFRESH_PERIODS if self.has("slow-health-refresh") else 1)
        # forgets-after-restart names CDI devices per process; the good driver by claim UID only.
        self.nonce = uuid.uuid4().hex[:8] if self.has("forgets-after-restart") else ""

        self.overheated: set[str] = set()
        self.warning_c = args.temp_warning_c if args.temp_warning_c is not None else self.threshold_c - 10
        # (device id, taint key, effect) -> when it was first published: republishing a slice must not
        # move a taint's timeAdded, or the eviction controller's tolerationSeconds would start again.
        self.taints_since: dict[tuple[str, str, str], str] = {}
        self.ever_tainted: set[tuple[str, str, str]] = set()  # taint-never-cleared
        self.indexes: dict[str, int] = {}  # device id -> stable "index" attribute
        self.frozen: dict[str, dict[str, Any]] | None = None  # no-hotplug: the set seen at start
        self.initial_health: dict[str, tuple[str, str]] | None = None  # stale-health
        self.devices: list[dict[str, Any]] = []
        self.generation = 0
        self.changed = threading.Condition()
        self.streams = itertools.count()
        self.stopping = threading.Event()
        self.terminating = threading.Event()
        self._wake_r, self._wake_w = wakeup.self_pipe()

        # Under a rolling update (--pod-uid) two instances share --state-dir, and the kubelet may call either:
        # each call reads the checkpoint again under a file lock both take (kubeletplugin RollingUpdate: "load
        # shared state from a file at the start of a call, execute and then store the updated shared state").
        self.rolling = bool(args.pod_uid)
        private = self.rolling and self.has("private-checkpoint")
        self.checkpoint = Checkpoint(self.state_dir / args.pod_uid if private else self.state_dir)
        self.serialize_lock = self.plugin_dir / SERIALIZE_LOCK
        self.claims_lock = threading.Lock()  # the helper serializes prepare and unprepare (Serialize)
        self.mine: set[str] = set()  # refuses-old-claims: the claims this process prepared
        self.devices_fd: int | None = None  # waits-for-old-instance: its lock on DEVICES_LOCK, once it got it
        self.prepared: dict[str, dict[str, Any]] = {} if self.has("forgets-after-restart") else self.checkpoint.load()
        self.released_once = False  # the stuck-after-unprepare mutant: set by its first release of a claim

        self.client: Any = None
        self.api_error: type[Exception] = Exception
        if args.kubeconfig:
            from harness.controlplane.client import ApiError, KubeClient

            self.client = KubeClient.from_kubeconfig(Path(args.kubeconfig))
            self.api_error = ApiError
        self.publisher: SlicePublisher | None = None
        self.dra_server: grpc.Server | None = None
        self.health_server: grpc.Server | None = None  # split-health-socket only
        self.reg_server: grpc.Server | None = None
        self.accepted = False  # a kubelet accepted the registration (one-kubelet-only stops answering then)

    def has(self, defect: str) -> bool:
        return composition.has(self.defect, defect)

    @contextlib.contextmanager
    def _serialized(self) -> Iterator[None]:
        """One prepare or unprepare at a time: in this process, and under a rolling update across the instances
        (a blocking flock, as the helper's fileutil.LockFile), with the checkpoint as the other one left it."""
        with self.claims_lock:
            if not self.rolling:
                yield
                return
            self.plugin_dir.mkdir(parents=True, exist_ok=True)
            with open(self.serialize_lock, "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)  # released as the file closes
                if not self.has("loads-checkpoint-once"):
                    self.prepared = self.checkpoint.load()
                yield

    def _hold_devices(self) -> bool:
        """waits-for-old-instance: whether this process holds DEVICES_LOCK (taken at once if free)."""
        if self.devices_fd is None:
            self.state_dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.state_dir / DEVICES_LOCK, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                return False
            self.devices_fd = fd
        return True

    def _newer_instance(self) -> bool:
        """old-health-wins: another registration socket of this driver, made after ours (an update's new pod)."""
        try:
            mine = self.reg_socket.stat().st_mtime_ns
            others = [p for p in self.registry_dir.iterdir() if p != self.reg_socket
                      and p.name.startswith(f"{self.driver}-") and p.name.endswith(REG_SOCKET_SUFFIX)]
        except OSError:
            return False
        for p in others:
            with contextlib.suppress(OSError):
                if p.stat().st_mtime_ns > mine:
                    return True
        return False

    # -- devices -----------------------------------------------------------

    def _hot(self, d: HwDevice) -> bool:
        """Over the threshold, and not yet cooled below threshold minus hysteresis."""
        if d.temperature_c is None or self.has("ignore-temperature"):
            return False
        if d.id in self.overheated:
            if d.temperature_c < self.threshold_c - self.hysteresis_c:
                self.overheated.discard(d.id)
        elif d.temperature_c > self.threshold_c:
            self.overheated.add(d.id)
        return d.id in self.overheated

    def _health(self, d: HwDevice) -> tuple[str, str]:
        hot = self._hot(d)
        if d.health == HW_UNHEALTHY:
            return UNHEALTHY, "the device reports Unhealthy"
        if d.health != HW_HEALTHY:
            return UNKNOWN, f"the device reports {d.health!r}"
        if hot:
            return UNHEALTHY, f"overtemperature: {d.temperature_c:g} C (threshold {self.threshold_c:g} C)"
        return HEALTHY, ""

    def _effective(self, seen: list[HwDevice]) -> list[dict[str, Any]]:
        for d in sorted(seen, key=lambda d: d.id):
            self.indexes.setdefault(d.id, len(self.indexes))
        out = []
        for d in seen:
            health, reason = self._health(d)
            out.append({"id": d.id, "name": dns_label(d.id), "index": self.indexes[d.id], "cls": d.cls,
                        "uuid": d.uuid, "model": d.model, "vendor": d.vendor, "numa": d.numa,
                        "pci_address": d.pci_address, "memory_mib": d.memory_mib, "node": d.node,
                        "host_path": d.host_path, "health": health, "reason": reason, "layout": d.layout,
                        "sharing": d.sharing, "fabric": d.fabric})
        self._taint(out, seen)
        if self.has("no-hotplug"):
            if self.frozen is None:
                self.frozen = {d["id"]: d for d in out}
            current = {d["id"]: d for d in out}
            out = [current.get(i, frozen) for i, frozen in self.frozen.items()]
        if self.has("stale-health"):
            if self.initial_health is None:
                self.initial_health = {d["id"]: (d["health"], d["reason"]) for d in out}
            for d in out:
                d["health"], d["reason"] = self.initial_health.setdefault(d["id"], (d["health"], d["reason"]))
        return out

    def _wanted_taints(self, d: HwDevice) -> list[tuple[str, str, str]]:
        """(key, value, effect) this device deserves: a failed or critically hot device evicts its pods
        (NoExecute); a warm one only keeps new claims away (NoSchedule)."""
        out = []
        if d.health == HW_UNHEALTHY:
            out.append((f"{self.driver}/{TAINT_UNHEALTHY}", "", NO_EXECUTE))
        if d.id in self.overheated:
            out.append((f"{self.driver}/{TAINT_TEMPERATURE}", "critical", NO_EXECUTE))
        elif d.temperature_c is not None and d.temperature_c > self.warning_c and not self.has("ignore-temperature"):
            effect = NO_EXECUTE if self.has("noexecute-at-warning") else NO_SCHEDULE
            out.append((f"{self.driver}/{TAINT_TEMPERATURE}", "warning", effect))
        return out

    def _taint(self, out: list[dict[str, Any]], seen: list[HwDevice]) -> None:
        """Put each device's taints on its entry, keeping every taint's first timeAdded."""
        wanted = {d.id: self._wanted_taints(d) for d in seen}
        if self.has("taints-wrong-device"):
            # The bug: an index mix-up puts every taint on the next device.
            ids = sorted(wanted)
            wanted = {ids[(i + 1) % len(ids)]: wanted[dev] for i, dev in enumerate(ids)} if ids else {}
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        for d in out:
            keys = [(d["id"], key, effect) for key, _, effect in wanted.get(d["id"], [])]
            values = {(d["id"], key, effect): value for key, value, effect in wanted.get(d["id"], [])}
            if self.has("taint-never-cleared"):
                self.ever_tainted.update(keys)
                keys = sorted(k for k in self.ever_tainted if k[0] == d["id"])
            for k in keys:
                self.taints_since.setdefault(k, now)
            for k in [k for k in self.taints_since if k[0] == d["id"] and k not in keys]:
                del self.taints_since[k]
            d["taints"] = [{"key": key, "value": values.get((dev, key, effect), "tainted"), "effect": effect,
                            "timeAdded": self.taints_since[(dev, key, effect)]}
                           for dev, key, effect in keys]

    @staticmethod
    def _slice_view(devices: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{k: v for k, v in d.items() if k not in ("health", "reason")} for d in devices]

    def refresh(self) -> None:
        """Re-read the devices; tell the health streams and the slice publisher what changed."""
        try:
            devices = self._effective(dra_beside.kept(self.source.read_devices(), self.excluded, self.defect))
        except (OSError, ValueError) as err:
            log.warning("devices unreadable, keeping the last list: %s", err)
            return
        if devices == self.devices:
            return
        slices_changed = self._slice_view(devices) != self._slice_view(self.devices)
        with self.changed:
            self.devices = devices
            self.generation += 1
            self.changed.notify_all()
        log.info("devices: %s", ", ".join(f"{d['name']}={d['health']}" for d in devices) or "none")
        if slices_changed and self.publisher is not None:
            self.publisher.update(devices)

    def _devices_now(self) -> list[dict[str, Any]]:
        with self.changed:
            return list(self.devices)

    def device(self, name: str) -> dict[str, Any] | None:
        with self.changed:
            found = next((d for d in self.devices if d["name"] == name), None)
            return found or dra_partitions.find(self.devices, name, whole_gpu=self.has("prepares-whole-gpu"))

    # -- health --------------------------------------------------------------

    def watch_health(self, context: grpc.ServicerContext) -> Iterator[list[dict[str, str]]]:
        """The full device list at once, on every change, and every refresh period."""
        cond = self.changed
        context.add_callback(lambda: _notify(cond))
        if self.has("health-silent") or (next(self.streams) > 0 and self.has("single-stream")):
            # The bug: updates go to the channel the first stream consumed.
            with cond:
                while context.is_active() and not self.stopping.is_set():
                    cond.wait()
            return
        seen, due = -1, 0.0
        last: list[dict[str, str]] | None = None  # old-health-wins: what this stream sent before a newer instance
        while context.is_active() and not self.stopping.is_set():
            with cond:
                now = time.monotonic()
                if self.generation == seen and now < due:
                    cond.wait(due - now)
                    continue
                seen = self.generation
                devices = [{"pool": self.pool, "device": d["name"], "health": d["health"], "reason": d["reason"]}
                           for d in self.devices] + dra_partitions.health_entries(self.devices, self.pool)
            if self.has("old-health-wins") and last is not None and self._newer_instance():
                devices = last  # the bug: it handed the devices over, and still speaks for them
            else:
                last = devices
            yield devices
            due = time.monotonic() + self.stream_refresh_s

    # -- prepare / unprepare -------------------------------------------------

    def _fetch_claim(self, namespace: str, uid: str, name: str) -> dict[str, Any] | str:
        """The allocated ResourceClaim, or why not (draplugin.go getResourceClaims, per claim)."""
        ref = f"{namespace}/{name}"
        if self.client is None:
            return f"no API server (--kubeconfig is empty): cannot read ResourceClaim {ref}"
        try:
            claim = self.client.get(f"{RESOURCE_API}/namespaces/{namespace}/resourceclaims/{name}")
        except self.api_error as err:
            if getattr(err, "status", None) == 404:
                return f"ResourceClaim {ref} not found"
            return f"retrieve claim {ref}: {err}"
        except OSError as err:
            return f"retrieve claim {ref}: {err}"
        if claim.get("metadata", {}).get("uid") != uid:
            return f"claim {ref} got replaced (UID {claim.get('metadata', {}).get('uid')}, expected {uid})"
        if not (claim.get("status") or {}).get("allocation"):
            return f"claim {ref} not allocated"
        return claim

    def prepare(self, claims: list[tuple[str, str, str]]) -> dict[str, dict[str, Any]]:
        if self.has("drops-claims-in-batch"):
            claims = claims[:1]
        if self.has("waits-for-old-instance") and claims and not self._hold_devices():
            return {uid: {"devices": [], "error": f"claim {ns}/{name}: the devices are held by another instance "
                                                  "of the driver"} for ns, uid, name in claims}
        # Slow API calls before serializing, like the helper.
        with self.claims_lock:
            known = set(self.prepared)
        fetched = {uid: self._fetch_claim(ns, uid, name) for ns, uid, name in claims if uid not in known}
        results: dict[str, dict[str, Any]] = {}
        with self._serialized():
            before = dict(self.prepared)
            for ns, uid, name in claims:
                try:
                    results[uid] = self._prepare_one(ns, uid, name, fetched.get(uid))
                except (OSError, ValueError) as err:
                    results[uid] = {"devices": [], "error": f"prepare claim {ns}/{name}: {err}"}
            if self.prepared != before:
                self.checkpoint.save(self.prepared)
        log.info("prepared %s", ", ".join(f"{u}: {r['error'] or 'OK'}" for u, r in results.items()) or "nothing")
        return results

    def _prepare_one(self, namespace: str, uid: str, name: str,
                     fetched: dict[str, Any] | str | None) -> dict[str, Any]:
        record = self.prepared.get(uid)
        if record is not None:
            if self.has("non-idempotent-prepare"):
                return {"devices": [], "error": f"claim {namespace}/{name} is already prepared"}
            # Idempotent: the same answer, and the CDI spec back if someone removed it.
            spec_file = Path(record["cdi_spec"])
            if not spec_file.exists():
                cdi.write_spec(spec_file, record["spec"])
            return {"devices": record["devices"], "error": ""}
        if self.released_once and self.has("stuck-after-unprepare"):
            return {"devices": [], "error": f"claim {namespace}/{name}: timed out waiting for the device lock"}
        if fetched is None:  # prepared meanwhile by a concurrent call, then unprepared
            fetched = self._fetch_claim(namespace, uid, name)
        if isinstance(fetched, str):
            return {"devices": [], "error": fetched}
        refused = dra_extended.refusal(fetched, self.defect)
        if refused is not None:
            return {"devices": [], "error": refused}
        allocation = fetched["status"]["allocation"]
        ours = [r for r in (allocation.get("devices") or {}).get("results") or [] if r.get("driver") == self.driver]
        in_use = dra_admin.in_use(self.prepared, self.defect)  # admin-access claims hold no device
        devices: list[dict[str, Any]] = []
        cdi_devices: dict[str, dict[str, Any]] = {}
        for r in ours:
            device_name, pool = r.get("device", ""), r.get("pool", "")
            device = self.device(device_name)
            if pool != self.pool or device is None:
                return {"devices": [], "error": f"claim {namespace}/{name}: device {pool}/{device_name} "
                                                f"is not one of this node's devices"}
            share_id = r.get("shareID") if device.get("sharing") else None
            if share_id:
                if self.has("shared-prepared-once") and device_name in in_use:
                    # The bug: a device is prepared once; a second claim on it gets the first one's answer.
                    first = self.prepared[in_use[device_name]]
                    self.prepared[uid] = {"namespace": namespace, "name": name, "devices": first["devices"],
                                          "cdi_spec": first["cdi_spec"], "spec": first["spec"]}
                    self.mine.add(uid)
                    return {"devices": first["devices"], "error": ""}
                # Admin access consumes no share of the capacity, and is never refused for it.
                over = None if dra_admin.granted(r) else dra_capacity.over_capacity(device, r,
                                                                                     dra_admin.ordinary(self.prepared))
                if over is not None:
                    return {"devices": [], "error": f"claim {namespace}/{name}: {over}"}
            elif device_name in in_use and not dra_admin.exempt(r, self.defect):
                # The last line of defense the helper asks drivers to be (draplugin.go PrepareResourceClaims).
                return {"devices": [], "error": f"claim {namespace}/{name}: device {device_name} is already "
                                                f"prepared for claim {in_use[device_name]}"}
            with self.changed:
                shared = None if dra_admin.exempt(r, self.defect) else dra_partitions.clash(self.devices, device_name,
                                                                                            in_use)
            if shared is not None:
                return {"devices": [], "error": f"claim {namespace}/{name}: device {device_name} shares memory "
                                                f"slices with device {shared[0]}, prepared for claim {shared[1]}"}
            cdi_name = cdi.device_name(uid, device_name, self.nonce)
            cdi_devices.setdefault(cdi_name, {
                "name": cdi_name,
                "node": f"/dev/{device['node']}" if device["node"] else f"/dev/fakelet/{device_name}",
                "host": device["host_path"],
                "env": {f"FAKELET_DEVICE_{device['index']}": device_name,
                        f"FAKELET_DEVICE_{device['index']}_UUID": device["uuid"],
                        **(dra_capacity.share_env(device, r, self.defect) if share_id else {}), **dra_admin.env(r)},
            })
            cdi_id = cdi_name if self.has("wrong-cdi-id") else cdi.qualified_id(self.driver, CDI_CLASS, cdi_name)
            # Subrequest names are stripped, as the helper does (draplugin.go stripSubrequestNames).
            entry: dict[str, Any] = {"requests": [dra_extended.request_name(fetched, r, self.defect)], "pool": pool,
                                     "device": device_name, "cdi_ids": [cdi_id]}
            if share_id:
                entry.update(share_id=str(share_id), consumed=dict(r.get("consumedCapacity") or {}))
            entry.update(dra_admin.entry_fields(r))
            devices.append(entry)
        spec_file = cdi.spec_path(self.cdi_dir, self.driver, CDI_CLASS, uid)
        # cdi-kind-mismatch: the spec's kind names another class than the IDs handed back (a runtime resolves none)
        spec_class = "device" if self.has("cdi-kind-mismatch") else CDI_CLASS
        spec = cdi.build_spec(self.driver, spec_class, uid, list(cdi_devices.values()))
        cdi.write_spec(spec_file, spec)
        self.prepared[uid] = {"namespace": namespace, "name": name, "devices": devices,
                              "cdi_spec": str(spec_file), "spec": spec}
        self.mine.add(uid)
        return {"devices": devices, "error": ""}

    def unprepare(self, claims: list[tuple[str, str, str]]) -> dict[str, str]:
        errors: dict[str, str] = {}
        with self._serialized():
            before = dict(self.prepared)
            for ns, uid, name in claims:
                if self.has("unprepare-drops-share"):
                    # The bug: the device is torn down, and with it every share of it other claims still hold.
                    for other in dra_capacity.sharing_claims(self.prepared, uid):
                        cdi.remove_spec(Path(self.prepared.pop(other)["cdi_spec"]))
                if self.has("admin-unprepare-resets"):
                    # The bug: releasing the device resets it, wiping every other claim's CDI spec on it.
                    for other in dra_admin.reset_claims(self.prepared, uid):
                        cdi.remove_spec(Path(self.prepared[other]["cdi_spec"]))
                record = self.prepared.pop(uid, None)
                try:
                    if record is not None and self.has("refuses-old-claims") and uid not in self.mine:
                        self.prepared[uid] = record
                        errors[uid] = f"claim {ns}/{name} was not prepared by this instance"
                        continue
                    if record is not None and self._evicted_defect(record):
                        if self.has("unprepare-fails-after-eviction"):
                            self.prepared[uid] = record
                            errors[uid] = f"claim {ns}/{name}: device is tainted NoExecute, refusing to release it"
                            continue
                        errors[uid] = ""  # leaves-cdi-after-eviction: forgets the claim, keeps its CDI spec
                        continue
                    if record is not None:
                        cdi.remove_spec(Path(record["cdi_spec"]))
                        self.released_once = True
                    elif self.has("unprepare-unknown-errors"):
                        errors[uid] = f"claim {ns}/{name} ({uid}) is not prepared"
                        continue
                    elif not (self.has("forgets-after-restart") or self.has("private-checkpoint")):
                        # Unknown is success (idempotent); a spec of ours left by a crash goes too.
                        cdi.remove_spec(cdi.spec_path(self.cdi_dir, self.driver, CDI_CLASS, uid))
                    errors[uid] = ""
                except OSError as err:
                    if record is not None:
                        self.prepared[uid] = record  # try again next time
                    errors[uid] = f"unprepare claim {ns}/{name}: {err}"
            if self.prepared != before:
                self.checkpoint.save(self.prepared)
        log.info("unprepared %s", ", ".join(f"{u}: {e or 'OK'}" for u, e in errors.items()) or "nothing")
        return errors

    def _evicted_defect(self, record: dict[str, Any]) -> bool:
        """For the eviction mutants only: does a NoExecute taint (ours or a DeviceTaintRule's) sit on one of
        the claim's devices?"""
        if not (self.has("unprepare-fails-after-eviction") or self.has("leaves-cdi-after-eviction")):
            return False
        names = {d["device"] for d in record["devices"]}
        with self.changed:
            if any(t["effect"] == NO_EXECUTE for d in self.devices if d["name"] in names for t in d.get("taints", [])):
                return True
        if self.client is None:
            return False
        for version in RULE_VERSIONS:
            try:
                rules = self.client.list(f"/apis/resource.k8s.io/{version}/devicetaintrules")
            except (self.api_error, OSError):
                continue
            if any(((rule.get("spec") or {}).get("taint") or {}).get("effect") == NO_EXECUTE
                   and any(rule_matches(rule, self.driver, self.pool, name) for name in names) for rule in rules):
                return True
            return False
        return False

    # -- serving and registering ---------------------------------------------

    def _start_server(self, path: Path, add: list[Callable[[grpc.Server], None]], name: str) -> grpc.Server:
        # endpoint.go listen: remove a stale socket first, listen would fail otherwise.
        _unlink(path)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=32, thread_name_prefix=name))
        for fn in add:
            fn(server)
        if server.add_insecure_port(unix_target(str(path))) == 0:
            raise OSError(f"cannot listen on {path}")
        server.start()
        log.info("serving %s on %s", name, path)
        return server

    def _health_services(self) -> list[Callable[[grpc.Server], None]]:
        # v1 for kubelets from 1.37, v1alpha1 for 1.34 to 1.36: the same stream on both.
        return [
            lambda s: drahealth_v1_grpc.add_DRAResourceHealthServicer_to_server(
                _health_servicer(drahealth_v1, drahealth_v1_grpc, self), s),
            lambda s: drahealth_v1alpha1_grpc.add_DRAResourceHealthServicer_to_server(
                _health_servicer(drahealth_v1alpha1, drahealth_v1alpha1_grpc, self), s),
        ]

    def serve_dra(self) -> None:
        self.stop_dra()
        self.plugin_dir.mkdir(parents=True, exist_ok=True)
        services: list[Callable[[grpc.Server], None]] = [
            lambda s: dra_v1beta1_grpc.add_DRAPluginServicer_to_server(
                _dra_servicer(dra_v1beta1, dra_v1beta1_grpc, self), s)]
        if not self.has("unserved-version"):
            services.append(lambda s: dra_v1_grpc.add_DRAPluginServicer_to_server(
                _dra_servicer(dra_v1, dra_v1_grpc, self), s))
        if self.has("split-health-socket"):
            self.health_server = self._start_server(self.plugin_dir / SPLIT_HEALTH_SOCKET, self._health_services(),
                                                    "health")
        elif not self.has("no-health"):
            services += self._health_services()
        self.dra_server = self._start_server(self.dra_socket, services, "dra")

    def stop_dra(self) -> None:
        for attr, path in (("dra_server", self.dra_socket), ("health_server", self.plugin_dir / SPLIT_HEALTH_SOCKET)):
            server = getattr(self, attr)
            setattr(self, attr, None)
            if server is not None:
                _notify(self.changed)  # let health streams see the stop
                server.stop(grace=1.0).wait(5)
                _unlink(path)

    def serve_registrar(self) -> None:
        self.stop_registrar()
        self.registry_dir.mkdir(parents=True, exist_ok=True)
        self.reg_server = self._start_server(
            self.reg_socket, [lambda s: reg_grpc.add_RegistrationServicer_to_server(RegistrationService(self), s)],
            "registration")

    def stop_registrar(self) -> None:
        server, self.reg_server = self.reg_server, None
        if server is not None:
            server.stop(grace=0).wait(5)
            _unlink(self.reg_socket)

    def run(self) -> None:
        if self.has("stale-socket-crash"):
            for path in (self.dra_socket, self.reg_socket):
                if path.exists():
                    log.error("listen unix %s: bind: address already in use", path)
                    sys.exit(1)
        self.plugin_dir.mkdir(parents=True, exist_ok=True)
        self.registry_dir.mkdir(parents=True, exist_ok=True)
        watcher = INotify()
        sockets = IN.DELETE | IN.MOVED_FROM
        reg_wd = watcher.add_watch(str(self.registry_dir), sockets)
        plugin_wd = watcher.add_watch(str(self.plugin_dir), sockets)
        self.source.watch(watcher)
        self.refresh()
        if self.has("waits-for-old-instance"):
            self._hold_devices()  # for its lifetime: a newer instance cannot have the devices until this one exits
        if self.client is not None:
            self.publisher = SlicePublisher(self.client, self.driver, self.node,
                                            duplicate_first=self.has("bad-slice"),
                                            empty=self.has("empty-slice"),
                                            layout=lambda devices: dra_binding.pool_slices(
                                                devices, dra_capacity.pool_slices(
                                                    devices, self.defect, dra_partitions.pool_slices(devices,
                                                                                                     self.defect)))
                                            ).start()
            self.publisher.update(self.devices)
            if dra_binding.has_fabric(self.devices):  # attaches devices and writes their status on claims
                dra_binding.ClaimWatcher(self.client, self.api_error, self.driver, self.pool, self._devices_now,
                                         self.defect, self.stopping).start()
        # Serve first: the kubelet dials the endpoint as soon as it sees the registration socket.
        self.serve_dra()
        self.serve_registrar()
        while not self.terminating.is_set():
            ready, _, _ = select.select([watcher.fileno(), self._wake_r], [], [])
            if self._wake_r in ready:
                wakeup.drain(self._wake_r)
            if watcher.fileno() not in ready:
                continue
            devices_changed = False
            for event in watcher.read(timeout=0):
                if event.wd == reg_wd:
                    self._on_registry_event(event.name)
                elif event.wd == plugin_wd:
                    if event.name == self.dra_socket.name and not self.dra_socket.exists():
                        log.info("%s deleted; serving again", self.dra_socket)
                        self.serve_dra()
                elif self.source.owns(event.wd, event.name):
                    devices_changed = True
            if devices_changed:
                self.source.watch(watcher)  # new device or class directories
                self.refresh()

    def _on_registry_event(self, name: str) -> None:
        if name != self.reg_socket.name or self.reg_socket.exists():
            return  # not ours, or an older socket's deletion (our own stale-socket cleanup)
        if self.has("no-reregister") or self.has("one-kubelet-only"):
            log.info("registration socket %s deleted; not recreating it", self.reg_socket)
            return
        log.info("registration socket %s deleted; recreating it", self.reg_socket)
        if self.dra_server is None or not self.dra_socket.exists():
            self.serve_dra()
        self.serve_registrar()

    @property
    def wake_fd(self) -> int:
        """The loop's self-pipe, for signal.set_wakeup_fd (harness/reference/wakeup.py)."""
        return self._wake_w

    def request_stop(self) -> None:
        """From the SIGTERM handler: only set a flag and wake the loop (see device_plugin.py)."""
        self.terminating.set()
        wakeup.wake(self._wake_w)

    def shutdown(self) -> None:
        self.stopping.set()
        _notify(self.changed)
        # Registration first, so the kubelet stops sending calls to a driver on its way out.
        self.stop_registrar()
        if self.publisher is not None:
            self.publisher.stop()  # the slices stay: see dra_slices.py
        self.stop_dra()


def _unlink(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass


POD_UID = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]{0,62}")  # a UID goes into a socket's file name: no path


def _uid(value: str) -> str:
    if value and not POD_UID.fullmatch(value):  # argparse passes the empty default through here too
        raise argparse.ArgumentTypeError(f"{value!r}: letters, digits and '-' (it names a socket file)")
    return value


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="reference-dra", description=__doc__.splitlines()[0])
    parser.add_argument("--driver-name", required=True, help="DRA driver name (a DNS subdomain)")
    parser.add_argument("--node-name", required=True, help="this node; also the name of the device pool")
    parser.add_argument("--kubeconfig", default="", help="API server access; empty: no slices, prepare fails")
    parser.add_argument("--registry-dir", required=True, help="the kubelet's plugins_registry directory")
    parser.add_argument("--plugin-dir", required=True, help="where dra.sock goes (plugins/<driver>)")
    parser.add_argument("--cdi-dir", required=True, help="where CDI spec files go")
    parser.add_argument("--sysfs-root", required=True, help="root of the fake device backend's tree")
    parser.add_argument("--state-dir", required=True, help="where the prepared-claims checkpoint lives")
    parser.add_argument("--health-refresh-s", type=float, default=10.0,
                        help=f"resend device health this often (default 10; below the kubelet's "
                             f"{KUBELET_HEALTH_TIMEOUT_S:g} s health timeout)")
    parser.add_argument("--temp-threshold-c", type=float, default=85.0, help="overtemperature: UNHEALTHY above")
    parser.add_argument("--temp-hysteresis-c", type=float, default=5.0,
                        help="HEALTHY again only below threshold minus this")
    parser.add_argument("--temp-warning-c", type=float, default=None,
                        help="warm: a NoSchedule taint above this (default threshold minus 10)")
    parser.add_argument("--defect", type=composition.argument_type(DRA_DEFECTS, DRA_DEFECTS), metavar="NAME[+NAME...]",
                        help="run as a mutant with this bug (several joined by '+')")
    parser.add_argument("--exclude-devices", default="", metavar="ID,ID",
                        help="devices a device plugin beside the driver serves (by the backend's IDs): never "
                             "published or prepared")
    parser.add_argument("--pod-uid", default="", type=_uid,
                        help="this instance's pod UID, for a DaemonSet rolling update (kubeletplugin RollingUpdate): "
                             "its sockets are <driver>-<uid>-reg.sock and dra-<uid>.sock, not the shared names")
    args = parser.parse_args(argv)
    if not 0 < args.health_refresh_s < KUBELET_HEALTH_TIMEOUT_S:
        parser.error(f"--health-refresh-s must be above 0 and below {KUBELET_HEALTH_TIMEOUT_S:g}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s reference-dra %(levelname)s %(message)s")
    try:
        driver = ReferenceDriver(args)
    except (OSError, ValueError, RuntimeError, ImportError) as err:
        # RuntimeError: the API client's errors (an unusable kubeconfig).
        print(f"reference-dra: {err}", file=sys.stderr)
        return 2

    def on_term(signum: int, frame: object) -> None:
        driver.request_stop()

    signal.signal(signal.SIGTERM, on_term)
    wakeup.wake_on_signals(driver.wake_fd)
    try:
        driver.run()
        log.info("terminating")
    except KeyboardInterrupt:
        log.info("interrupted")
    finally:
        driver.shutdown()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    sys.exit(main())
