"""fakelet's reference device plugin: a conformant v1beta1 plugin, and its mutants.

Best practice it follows: serve before registering; watch the directory with
inotify for its own socket (re-serve when deleted) and for kubelet.sock
(register when it appears); retry a failed Register with backoff; send the
full device list on every change; exit cleanly on SIGTERM. A health change
in the device tree is read from the files inotify names, one device, not by
re-reading the whole tree (a hot-plug, or an overflowed event queue, still
re-reads it all). With `--cdi-dir`, the devices it names as CDI devices in
Allocate have their spec there before the answer (a runtime that applies CDI,
containerd 2 or CRI-O, refuses a container with an undefined one), as upstream's
sample-device-plugin does with CDI_ENABLED. `--defect NAME` switches on one
named bug (harness/reference/defects.py); `--defect a+b` several mutants at once.

    python -m harness.reference.device_plugin --plugin-dir DIR --inventory FILE [--cdi-dir DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import select
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path

import grpc
import yaml
from inotify_simple import Event, INotify
from inotify_simple import flags as IN

from harness.instruments.grpcutil import insecure_unix_channel, unix_target
from harness.reference import cdi, hostile, wakeup
from harness.reference.defects import (
    DP_BENIGN,
    DP_DEFECTS,
    DP_HOSTILE,
    DP_LEVELZERO_BENIGN,
    DP_LEVELZERO_DEFECTS,
    DP_NVML_DEFECTS,
)
from harness.reference.levelzero_source import LevelZeroSource
from harness.reference.nvml_source import DeviceNodeFallback, NvmlError, NvmlSource
from harness.reference.sources import ALL_DEVICES, HEALTHY, UNHEALTHY, InventorySource, SeenDevice, SysfsSource
from harness.spec import composition
from harness.wire import dp, dp_grpc

log = logging.getLogger("reference-dp")

API_VERSION = "v1beta1"  # deviceplugin v1beta1 constants.go Version
KUBELET_SOCKET = "kubelet.sock"  # deviceplugin v1beta1 constants.go KubeletSocket
REGISTER_TIMEOUT_S = 15.0  # must exceed the kubelet's 10 s dial inside Register
BACKOFF_START_S, BACKOFF_MAX_S = 0.1, 2.0
STORM_PERIOD_S = 0.2  # register-storm mutant
BOUNDED_RETRY_S = 2.0  # bounded-retry mutant gives up after this long without kubelet.sock
REGISTER_BEFORE_SERVE_LAG_S = 0.3  # register-before-serve mutant serves this late
CLOSE_STREAM_AFTER_S = 0.1  # close-stream mutant ends ListAndWatch this long after its first response
SLOW_HEALTH_S = 40.0  # slow-health mutant reports every change this late (past the kubelet's 30 s bound)
SLOW_REREGISTER_S = 10.0  # slow-reregister: the upstream sample-device-plugin waits this long after kubelet.sock
SLOW_REGISTER_RETRY_S = 30.0  # slow-register-retry: a vendor's GPU plugin retried a rejected Register this late
REPEAT_PERIOD_S = 0.1  # repeat-lists: the identical list again this often
# Mutants that edit the device messages after they are built: those never come from (or go into) the reuse cache.
_EDITS_DEVICES = ("empty-device-id", "negative-numa", "bad-health-string")


class DevicePluginService(dp_grpc.DevicePluginServicer):
    def __init__(self, plugin: ReferencePlugin) -> None:
        self.p = plugin
        self._scratch: list[dp.ContainerAllocateResponse] = []  # racy-allocate's shared state

    def GetDevicePluginOptions(self, request: dp.Empty, context: grpc.ServicerContext) -> dp.DevicePluginOptions:  # noqa: N802
        if self.p.has("options-hang"):
            self.p.stopping.wait()
        return self.p.options

    def ListAndWatch(self, request: dp.Empty, context: grpc.ServicerContext) -> Iterator[dp.ListAndWatchResponse]:  # noqa: N802
        cond = self.p.changed
        context.add_callback(lambda: _notify(cond))
        # When the kubelet goes away, this fires at once on a gRPC thread; the
        # main loop may see kubelet.sock's deletion only later, under load.
        context.add_callback(self.p.stream_ended)
        seen = -1
        sent: dict[str, str] = {}  # partial-list mutant: what this stream last said per device
        close_at: float | None = None  # close-stream mutant
        responses = 0
        if self.p.has("self-kill"):
            log.error("killing myself")
            os.kill(os.getpid(), signal.SIGKILL)
        if self.p.has("listandwatch-silent"):
            hostile.wait_until_ended(context, self.p.stopping)
            return
        if self.p.has("empty-first-list"):
            yield dp.ListAndWatchResponse(devices=[])
        while context.is_active() and not self.p.stopping.is_set():
            with cond:
                if self.p.generation == seen:
                    remaining = None if close_at is None else close_at - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        return
                    if self.p.has("list-flood"):
                        cond.wait(hostile.FLOOD_PERIOD_S)
                        seen = -1  # say the same again
                        continue
                    if self.p.has("repeat-lists"):
                        if not cond.wait(REPEAT_PERIOD_S if remaining is None else min(remaining, REPEAT_PERIOD_S)):
                            seen = -1  # nothing changed: say the same again
                        continue
                    cond.wait(remaining)
                    continue
                seen = self.p.generation
                devices = self.p.device_list()
            if self.p.has("partial-list") and sent:
                # The bug: only what changed since the last response.
                devices = [d for d in devices if sent.get(d.ID) != d.health]
            if self.p.has("partial-list"):
                sent = {d.ID: d.health for d in self.p.device_list()}
            if self.p.has("incremental-list") and responses == 0:
                for n in range(1, len(devices)):
                    yield dp.ListAndWatchResponse(devices=devices[:n])
            if self.p.has("reorder-list") and devices:
                shift = responses % len(devices)
                devices = list(reversed(devices[shift:] + devices[:shift]))
            responses += 1
            yield dp.ListAndWatchResponse(devices=devices)
            if self.p.has("close-stream") and close_at is None:
                # Not at once: the kubelet should have started using the devices first.
                close_at = time.monotonic() + CLOSE_STREAM_AFTER_S

    def GetPreferredAllocation(  # noqa: N802
        self, request: dp.PreferredAllocationRequest, context: grpc.ServicerContext
    ) -> dp.PreferredAllocationResponse:
        if self.p.has("preferred-hang"):
            self.p.stopping.wait()
        responses = []
        for req in request.container_requests:
            if self.p.has("preferred-wrong-size"):
                ids = list(req.available_deviceIDs)
            else:
                rest = sorted(set(req.available_deviceIDs) - set(req.must_include_deviceIDs),
                              key=self.p.numa_order)
                ids = (list(req.must_include_deviceIDs) + rest)[: req.allocation_size]
            responses.append(dp.ContainerPreferredAllocationResponse(deviceIDs=ids))
        return dp.PreferredAllocationResponse(container_responses=responses)

    def Allocate(self, request: dp.AllocateRequest, context: grpc.ServicerContext) -> dp.AllocateResponse:  # noqa: N802
        if self.p.has("allocate-hang"):
            self.p.stopping.wait()
        if self.p.has("crash-in-allocate"):
            log.error("crashing in Allocate")
            os._exit(3)
        if self.p.allocate_delay_s > 0:
            # --allocate-delay-ms: an injected latency fault (benchmarks), cut short on shutdown.
            self.p.stopping.wait(self.p.allocate_delay_s)
        known = {self.p.wire_id(d["id"]) for d in self.p.devices}
        for req in request.container_requests:
            unknown = [i for i in req.devices_ids if i not in known]
            if unknown and not self.p.has("allocate-unknown-ok"):
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unknown device IDs: {unknown}")
        responses = [self._container_response(list(r.devices_ids)) for r in request.container_requests]
        self.p.define_cdi_devices([i for r in request.container_requests for i in r.devices_ids])
        if self.p.has("huge-allocate-response"):
            for r in responses:
                r.envs["FAKELET_PAD"] = "x" * hostile.OVER_KUBELET_LIMIT_BYTES
        if self.p.has("allocate-one-response"):
            responses = responses[:1]
        if self.p.has("scratch-files"):
            # Legal in a container, whose /tmp is its own; fakelet must keep it off the host.
            fd, _ = tempfile.mkstemp(prefix="reference-dp-scratch-")
            os.write(fd, ",".join(i for r in request.container_requests for i in r.devices_ids).encode())
            os.close(fd)
        return dp.AllocateResponse(container_responses=responses)

    def _container_response(self, ids: list[str]) -> dp.ContainerAllocateResponse:
        bad = self.p.has("bad-allocate-response")
        resp = dp.ContainerAllocateResponse(
            envs={"FAKELET_DEVICES": ",".join(ids)},
            annotations={"fakelet.example.com/devices": ",".join(ids)},
            mounts=[dp.Mount(container_path="fakelet" if bad else "/run/fakelet",
                             host_path=str(self.p.dev_dir), read_only=True)],
            devices=[dp.DeviceSpec(container_path=f"/dev/fakelet/{i}", host_path=self.p.dev_path(i),
                                   permissions="rwx" if bad else "rw") for i in ids],
            # Named only where their spec can be written: an undefined CDI device is a refused container.
            cdi_devices=[dp.CDIDevice(name=f"{i}" if self.p.has("bad-cdi-name") else f"{self.p.resource}={i}")
                         for i in ids] if self.p.cdi_dir is not None else [],
        )
        if not self.p.has("racy-allocate"):
            return resp
        # The bug: a response parked in shared state while "talking to the driver".
        self._scratch.append(resp)
        time.sleep(0.01)
        return self._scratch[-1]

    def PreStartContainer(  # noqa: N802
        self, request: dp.PreStartContainerRequest, context: grpc.ServicerContext
    ) -> dp.PreStartContainerResponse:
        if self.p.has("prestart-hang"):
            self.p.stopping.wait()
        return dp.PreStartContainerResponse()


def cdi_env_name(device_id: str) -> str:
    """The variable a device's CDI spec sets in the container: FAKELET_CDI_<ID> (gpu-0: FAKELET_CDI_GPU_0)."""
    return "FAKELET_CDI_" + "".join(c if c.isalnum() else "_" for c in device_id).upper()


def cdi_spec(resource: str, ids: list[str]) -> dict:
    """One spec of kind `resource` (vendor.com/class) with one device per ID, each setting its own variable."""
    return {"cdiVersion": cdi.CDI_VERSION, "kind": resource,
            "devices": [{"name": i, "containerEdits": {"env": [f"{cdi_env_name(i)}={i}"]}} for i in sorted(ids)]}


def _notify(cond: threading.Condition) -> None:
    with cond:
        cond.notify_all()


class ReferencePlugin:
    def __init__(self, args: argparse.Namespace) -> None:
        self.plugin_dir = Path(args.plugin_dir)
        self.kubelet_socket = Path(args.kubelet_socket or self.plugin_dir / KUBELET_SOCKET)
        self.socket_name = args.socket_name
        self.socket_path = self.plugin_dir / self.socket_name
        self.resource = args.resource
        self.source: InventorySource | SysfsSource | NvmlSource | DeviceNodeFallback | LevelZeroSource
        if args.nvml:
            try:
                self.source = NvmlSource(Path(args.dev_dir or "/dev"), args.defect)
            except NvmlError:
                if not composition.has(args.defect, "init-error-keeps-healthy"):
                    raise  # no NVML, no GPUs it can vouch for: exit, as a blind plugin should
                self.source = DeviceNodeFallback(Path(args.dev_dir or "/dev"))
        elif args.sysfs_root and args.levelzero:
            self.source = LevelZeroSource(Path(args.sysfs_root), Path(args.levelzero), args.defect)
        elif args.sysfs_root:
            self.source = SysfsSource(Path(args.sysfs_root))
        else:
            inventory = Path(args.inventory)
            self.source = InventorySource(inventory, Path(args.dev_dir) if args.dev_dir else inventory.parent)
        self.dev_dir = Path(args.dev_dir) if args.dev_dir else Path("/dev")
        self.cdi_dir = Path(args.cdi_dir) if args.cdi_dir else None
        self._cdi_defined: set[str] = set()
        self._cdi_lock = threading.Lock()
        self.threshold_c, self.hysteresis_c = args.temp_threshold_c, args.temp_hysteresis_c
        self.overheated: set[str] = set()
        self.stuck: set[str] = set()  # stuck-unhealthy mutant
        self.frozen: dict[str, dict] | None = None  # no-hotplug mutant: the set seen at start
        self.defect = args.defect
        self.allocate_delay_s: float = args.allocate_delay_ms / 1000
        self.options = dp.DevicePluginOptions(pre_start_required=True, get_preferred_allocation_available=True)
        self.only: set[str] | None = set(args.only_devices.split(",")) - {""} if args.only_devices else None
        self.seen: list[SeenDevice] = []  # what the source said at the last read, device by device
        self._seen_at: dict[str, int] | None = None  # device id -> index in seen; None: ids repeat, no partial reads
        self.devices: list[dict] = self._effective(self._read_all())  # what the kubelet is told (published)
        self.latest = self.devices  # what the last read made of it (slow-health publishes it late)
        self._listed: tuple[list[dict], list[dp.Device]] | None = None  # device_list() of one published list
        self._built: dict[int, tuple[dict, dp.Device]] = {}  # id(entry) -> (entry, its message), the last list's
        self.generation = 0
        self.changed = threading.Condition()
        self.stopping = threading.Event()
        self.last_stream_end: float | None = None  # when the kubelet's last ListAndWatch ended
        self.terminating = threading.Event()
        self._wake_r, self._wake_w = wakeup.self_pipe()
        self.server: grpc.Server | None = None
        self._silent: socket.socket | None = None  # silent-endpoint, garbage-endpoint
        self._flooded = False  # register-flood
        self._plugin_wd: int | None = None  # run() watches the plugin dir

    def define_cdi_devices(self, ids: list[str]) -> None:
        """Every device Allocate named as a CDI device, defined in the spec file before the answer goes out."""
        if self.cdi_dir is None or self.has("no-cdi-spec") or self.has("bad-cdi-name"):
            return
        with self._cdi_lock:
            if set(ids) <= self._cdi_defined:
                return
            self._cdi_defined |= set(ids)
            vendor, _, cls = self.resource.partition("/")
            cdi.write_spec(self.cdi_dir / f"{vendor}-{cls}.json", cdi_spec(self.resource, sorted(self._cdi_defined)))

    def has(self, defect: str) -> bool:
        return composition.has(self.defect, defect)

    def wire_id(self, device_id: str) -> str:
        """The device's ID on the wire: its inventory ID, or (opaque-ids) a hash of it."""
        if self.has("opaque-ids"):
            return "dev-" + hashlib.sha256(device_id.encode()).hexdigest()[:12]
        return device_id

    # -- devices -----------------------------------------------------------

    def device_list(self) -> list[dp.Device]:
        # One build per published list: a list of 1,024 devices costs milliseconds to build, and the
        # messages are copied into each response, never changed after.
        listed, published = self._listed, self.devices
        if listed is not None and listed[0] is published:
            return list(listed[1])
        out = self._build_list(published)
        self._listed = (published, out)
        return list(out)

    def _build_list(self, published: list[dict]) -> list[dp.Device]:
        devices = published[:-1] if self.has("missing-device") else list(published)
        if any(map(self.has, _EDITS_DEVICES)):
            out = [self._device(d) for d in devices]  # edited below: messages of this list's own
        else:
            out = self._reuse(devices)
        if self.has("duplicate-ids") and out:
            out.append(out[0])
        if self.has("empty-device-id") and out:
            out[-1].ID = ""
        if self.has("negative-numa"):
            for d in out:
                d.topology.nodes[0].ID = -1
        if self.has("bad-health-string"):
            for d in out:
                d.health = d.health.lower()
        return out + hostile.phantom_devices(self.defect)

    def _device(self, d: dict) -> dp.Device:
        return dp.Device(ID=self.wire_id(d["id"]), health=d.get("health", "Healthy"),
                         topology=dp.TopologyInfo(nodes=[dp.NUMANode(ID=0 if self.has("wrong-numa") else d["numa"])]))

    def _reuse(self, devices: list[dict]) -> list[dp.Device]:
        """The messages of an entry the last list had too (entries are never changed, a change is a new entry):
        building 1,024 of them took 4 ms of every list P3's plugins sent for a change of one device."""
        built, fresh = self._built, {}
        out = []
        for d in devices:
            hit = built.get(id(d))
            msg = hit[1] if hit is not None and hit[0] is d else self._device(d)
            fresh[id(d)] = (d, msg)
            out.append(msg)
        self._built = fresh
        return out

    def numa_order(self, device_id: str) -> tuple[int, str]:
        numa = {self.wire_id(d["id"]): d.get("numa", 0) for d in self.devices}
        return numa.get(device_id, 0), device_id

    def dev_path(self, device_id: str) -> str:
        for d in self.devices:
            if self.wire_id(d["id"]) == device_id:
                return str(d["dev"])
        return "/dev/null"

    def _hot(self, d: SeenDevice) -> bool:
        """Over the threshold, and not yet cooled below threshold minus hysteresis."""
        if d.temperature_c is None or self.has("ignore-temperature"):
            return False
        if d.id in self.overheated:
            if d.temperature_c < self.threshold_c - self.hysteresis_c:
                self.overheated.discard(d.id)
        elif d.temperature_c > self.threshold_c:
            self.overheated.add(d.id)
        return d.id in self.overheated

    def _effective_one(self, d: SeenDevice) -> dict | None:
        """What to tell the kubelet of one device: None when absent, unhealthy when failed or overheated."""
        if not d.present:
            return None  # hot-unplugged: no longer listed
        healthy = d.health == HEALTHY and not self._hot(d)
        if self.has("stuck-unhealthy"):
            if d.id in self.stuck:
                healthy = False
            elif not healthy:
                self.stuck.add(d.id)
        return {"id": d.id, "numa": d.numa, "health": HEALTHY if healthy else UNHEALTHY, "dev": d.host_path}

    def _effective(self, seen: list[SeenDevice]) -> list[dict]:
        """What to tell the kubelet: the present devices."""
        out = [e for e in map(self._effective_one, seen) if e is not None]
        if self.has("no-hotplug"):
            if self.frozen is None:
                self.frozen = {d["id"]: d for d in out}
            current = {d["id"]: d for d in out}
            out = [current.get(i, frozen) for i, frozen in self.frozen.items()]
        if self.has("all-unhealthy-on-one") and any(d["health"] == UNHEALTHY for d in out):
            out = [{**d, "health": UNHEALTHY} for d in out]
        return out

    def _read_all(self) -> list[SeenDevice]:
        # --only-devices: the plugin's share of the node's devices, a DRA driver serving the others (DRA-EXT-02).
        seen = [d for d in self.source.read() if self.only is None or d.id in self.only]
        self.seen = seen
        at = {d.id: i for i, d in enumerate(seen)}
        self._seen_at = at if len(at) == len(seen) else None
        return seen

    def _reread(self, dirs: set[Path]) -> tuple[list[dict], list[dict]] | None:
        """The list with only these device dirs read again, and their entries; None when it takes a full read.

        A full read is the answer whenever the set of devices may have changed: a dir that is no device (now),
        a device not seen before, or one whose presence flipped.
        """
        if self._seen_at is None or not isinstance(self.source, SysfsSource) or self.has("all-unhealthy-on-one"):
            return None  # all-unhealthy-on-one: one device's health is every device's, so it takes them all
        updated: dict[str, dict] = {}
        for d in sorted(dirs):
            fresh = self.source.read_one(d)
            i = self._seen_at.get(d.name)
            if fresh is None or i is None or fresh.present != self.seen[i].present:
                return None
            self.seen[i] = fresh
            entry = self._effective_one(fresh)  # also moves the overheat and stuck-unhealthy state, as a full read
            if entry is not None:
                updated[fresh.id] = entry
        # no-hotplug's frozen list is spliced the same way: a device it does not list stays unlisted.
        devices = [updated.get(e["id"], e) for e in self.latest]
        return devices, [e for e in devices if updated.get(e["id"]) is e]

    def refresh(self, dirs: set[Path] | None = None) -> None:
        """Re-read the devices (only these device dirs, when given); tell the streams if anything changed."""
        partial = self._reread(dirs) if dirs else None
        if partial is not None:
            devices, changed = partial
        else:
            try:
                devices = self._effective(self._read_all())
            except (OSError, ValueError, yaml.YAMLError) as err:
                log.warning("devices unreadable, keeping the last list: %s", err)
                return
            changed = None
        self.latest = devices
        if devices == self.devices:  # after a splice: identity for the untouched entries, so cheap
            return
        if self.has("slow-health"):
            threading.Timer(SLOW_HEALTH_S, self._publish, args=(devices, changed)).start()
            return
        self._publish(devices, changed)

    def _publish(self, devices: list[dict], changed: list[dict] | None = None) -> None:
        with self.changed:
            self.devices = devices
            self.generation += 1
            self.changed.notify_all()
        if changed is None:
            log.info("devices: %s", ", ".join(f"{d['id']}={d['health']}" for d in devices) or "none")
        else:  # the whole list on every one of a thousand changes would be most of the plugin's work
            log.info("devices changed: %s (%d listed)", ", ".join(f"{d['id']}={d['health']}" for d in changed),
                     len(devices))

    # -- serving and registering ---------------------------------------------

    def serve(self) -> None:
        self.stop_serving()
        if self.socket_path.exists():
            if self.has("stale-socket-crash"):
                log.error("listen unix %s: bind: address already in use", self.socket_path)
                sys.exit(1)
            self.socket_path.unlink()
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=32, thread_name_prefix="dp"))
        dp_grpc.add_DevicePluginServicer_to_server(DevicePluginService(self), server)
        server.add_insecure_port(unix_target(str(self.socket_path)))
        server.start()
        self.server = server
        log.info("serving on %s", self.socket_path)

    def stop_serving(self) -> None:
        server, self.server = self.server, None
        if server is not None:
            # Streams must see the stop: wake ListAndWatch loops.
            server.stop(grace=0).wait(5)

    def register(self) -> bool:
        # Serve before registering, even if the deletion event is still queued.
        broken = ("register-before-serve", "no-socket-recreate")
        if not any(map(self.has, broken)) and (self.server is None or not self.socket_path.exists()):
            self.serve()
        options = dp.DevicePluginOptions()
        options.CopyFrom(self.options)
        if self.has("options-mismatch"):
            options.pre_start_required = not options.pre_start_required
        endpoint = self.socket_name
        if self.has("endpoint-traversal"):
            endpoint = f"../{self.plugin_dir.name}/{self.socket_name}"
        elif self.has("silent-endpoint"):
            endpoint = self._silent_socket()
        elif self.has("garbage-endpoint"):
            endpoint = self._garbage_socket()
        elif self.has("absolute-endpoint"):
            endpoint = str(self.socket_path)
        elif self.has("endpoint-is-kubelet"):
            endpoint = self.kubelet_socket.name
        request = dp.RegisterRequest(
            version="v1alpha" if self.has("wrong-version") else API_VERSION,
            endpoint=endpoint,
            resource_name=self.resource.split("/")[-1] if self.has("bad-resource-name") else self.resource,
            options=options,
        )
        if self.has("huge-register"):
            request.resource_name += "-" * hostile.OVER_KUBELET_LIMIT_BYTES
        if self.has("register-flood") and not self._flooded:
            self._flooded = True
            hostile.register_flood(str(self.kubelet_socket), request)
        channel = insecure_unix_channel(str(self.kubelet_socket))
        try:
            dp_grpc.RegistrationStub(channel).Register(request, timeout=REGISTER_TIMEOUT_S)
        except grpc.RpcError as err:
            log.warning("Register failed: %s", err.details() if hasattr(err, "details") else err)
            if self.has("daemon-exits-on-reject") and err.code() != grpc.StatusCode.UNAVAILABLE:
                log.error("the kubelet rejected the registration; exiting")
                raise SystemExit(2) from None  # an answer, not an absent kubelet: exiting non-zero is a legal reaction
            return False
        finally:
            channel.close()
        log.info("registered %s at %s", self.resource, self.kubelet_socket)
        self._after_register()
        return True

    def _after_register(self) -> None:
        """The hostile behaviours that strike once the kubelet has accepted the plugin."""
        if self.has("kill-parent"):
            log.error("killing my parent %d", os.getppid())
            hostile.kill(os.getppid())

    def _garbage_socket(self) -> str:
        """garbage-endpoint: a socket that answers every connection with random bytes."""
        name = "garbage-" + self.socket_name
        if self._silent is None:
            self._silent = hostile.garbage_server(self.plugin_dir / name)
        return name

    def _silent_socket(self) -> str:
        """silent-endpoint: a socket the kernel accepts connections on, and nobody ever answers."""
        name = "silent-" + self.socket_name
        if self._silent is None:
            (self.plugin_dir / name).unlink(missing_ok=True)
            self._silent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self._silent.bind(str(self.plugin_dir / name))
            self._silent.listen(64)
        return name

    def run(self) -> None:
        watcher = INotify()
        self._plugin_wd = watcher.add_watch(str(self.plugin_dir), IN.CREATE | IN.DELETE | IN.MOVED_TO | IN.MOVED_FROM)
        self.source.watch(watcher)
        self.refresh()  # anything that changed before the watches were in place
        if self.has("no-wait-for-kubelet") and not self.kubelet_socket.exists():
            log.error("kubelet socket %s not found, exiting", self.kubelet_socket)
            sys.exit(1)
        pending = self.kubelet_socket.exists()
        if self.has("register-before-serve"):
            early = _Background(self.register)
            self.stopping.wait(REGISTER_BEFORE_SERVE_LAG_S)
            self.serve()
            pending = not early.result(REGISTER_TIMEOUT_S)
        else:
            self.serve()
        loop = _RegisterLoop(self, pending=pending)
        while not self.terminating.is_set():
            loop.step()
            timeout = loop.timeout_ms()
            # The NVML source's event wait, or the Level-Zero source's poll, says "look again".
            nvml_wake = getattr(self.source, "wake_r", None)
            ready, _, _ = select.select([watcher.fileno(), self._wake_r, *([nvml_wake] if nvml_wake else [])], [], [],
                                        None if timeout is None else timeout / 1000)
            if self._wake_r in ready:
                wakeup.drain(self._wake_r)
            if nvml_wake is not None and nvml_wake in ready:
                os.read(nvml_wake, 4096)
                self.refresh()
            if watcher.fileno() in ready:
                self.on_events(watcher.read(timeout=0), watcher, loop)

    def on_events(self, events: list[Event], watcher: INotify, loop: _RegisterLoop | None) -> None:
        """One batch of inotify events: the plugin dir's, then one device read for all the batch's tree events."""
        everything, dirs = False, set()
        for event in events:
            if event.mask & IN.Q_OVERFLOW:
                everything = True  # events were dropped: which devices changed is unknown
            elif event.wd == self._plugin_wd:
                assert loop is not None
                self._on_event(event, loop)
            elif self.source.owns(event.wd, event.name):
                what = self.source.device_of(event) if isinstance(self.source, SysfsSource) else ALL_DEVICES
                if what == ALL_DEVICES:
                    everything = True
                elif isinstance(what, Path):
                    dirs.add(what)
        if everything:
            self.source.watch(watcher)  # new device or class directories
            self.refresh()
        elif dirs:
            self.refresh(dirs)

    def stream_ended(self) -> None:
        self.last_stream_end = time.monotonic()

    @property
    def wake_fd(self) -> int:
        """The loop's self-pipe, for signal.set_wakeup_fd (harness/reference/wakeup.py)."""
        return self._wake_w

    def request_stop(self) -> None:
        """From the SIGTERM handler: only set a flag and wake the loop.

        Raising from a signal handler can be swallowed when it lands inside a
        blocking gRPC call; a flag and a self-pipe cannot be lost.
        """
        self.terminating.set()
        wakeup.wake(self._wake_w)

    def _on_event(self, event, loop: _RegisterLoop) -> None:  # noqa: ANN001 - inotify_simple.Event
        if event.name == self.socket_name and event.mask & (IN.DELETE | IN.MOVED_FROM):
            if self.socket_path.exists():
                return  # an older socket's deletion (our own stale-socket cleanup); we are serving
            if self.has("no-socket-recreate"):
                log.info("socket %s deleted; not re-serving", self.socket_path)
            else:
                log.info("socket %s deleted; serving again", self.socket_path)
                self.serve()
        elif event.name == self.kubelet_socket.name and event.mask & (IN.DELETE | IN.MOVED_FROM):
            if self.has("corrupt-checkpoint"):
                # While the kubelet is down: the next one starts from the garbage.
                hostile.corrupt(self.plugin_dir / hostile.DP_CHECKPOINT_NAME)
            loop.kubelet_gone()
        elif event.name == self.kubelet_socket.name and event.mask & (IN.CREATE | IN.MOVED_TO):
            loop.kubelet_appeared()

    def shutdown(self) -> None:
        self.stopping.set()
        _notify(self.changed)
        self.stop_serving()
        if self.has("leave-socket"):
            _dead_socket(self.socket_path)


class _RegisterLoop:
    """When to (re-)register: on kubelet.sock appearing, with backoff on failure."""

    def __init__(self, plugin: ReferencePlugin, pending: bool) -> None:
        self.p = plugin
        self.pending = pending
        self.attempted = False  # no-reregister mutant
        self.gave_up = False
        self.backoff = BACKOFF_START_S
        self.next_try = time.monotonic()
        self.gone_since: float | None = None

    def kubelet_gone(self) -> None:
        self.gone_since = time.monotonic()

    def kubelet_appeared(self) -> None:
        # The outage began at the earlier of the stream's end and the socket's deletion being seen:
        # inotify events carry no time, and a busy loop may read a deletion and a creation together.
        began = [t for t in (self.gone_since, self.p.last_stream_end) if t is not None]
        outage = time.monotonic() - min(began) if began else 0.0
        self.gone_since = self.p.last_stream_end = None
        if self.p.has("bounded-retry") and outage > BOUNDED_RETRY_S:
            log.warning("kubelet was gone %.1fs; giving up on it", outage)
            self.gave_up = True
        # no-reregister: once it has tried, never again (even if that try was cut short by this very restart).
        if self.gave_up or (self.p.has("no-reregister") and self.attempted):
            self.pending = False
            return
        self.pending, self.backoff, self.next_try = True, BACKOFF_START_S, time.monotonic()
        if self.p.has("slow-reregister"):
            self.next_try += SLOW_REREGISTER_S

    def step(self) -> None:
        if not self.pending or time.monotonic() < self.next_try:
            return
        self.attempted = True
        if self.p.register():
            self.pending = self.p.has("register-storm")
            self.next_try = time.monotonic() + STORM_PERIOD_S
        elif self.p.has("give-up-on-reject"):
            log.warning("giving up on registration")
            self.pending = False
        elif self.p.has("slow-register-retry"):
            log.warning("registration failed; retrying in %gs", SLOW_REGISTER_RETRY_S)
            self.next_try = time.monotonic() + SLOW_REGISTER_RETRY_S
        else:
            self.next_try = time.monotonic() + self.backoff
            self.backoff = min(self.backoff * 2, BACKOFF_MAX_S)

    def timeout_ms(self) -> int | None:
        if not self.pending:
            return None
        return max(0, int((self.next_try - time.monotonic()) * 1000))


class _Background:
    """Run a call on a thread and collect its boolean result later, under a deadline."""

    def __init__(self, fn: Callable[[], bool]) -> None:
        self._result = False
        self._thread = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self._thread.start()

    def _run(self, fn: Callable[[], bool]) -> None:
        self._result = fn()

    def result(self, timeout_s: float) -> bool:
        self._thread.join(timeout_s)
        return self._result


def _dead_socket(path: Path) -> None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(str(path))
    except OSError:
        pass
    finally:
        sock.close()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="reference-dp", description=__doc__.splitlines()[0])
    parser.add_argument("--plugin-dir", required=True, help="the kubelet's device-plugins directory")
    parser.add_argument("--kubelet-socket", help="default: PLUGIN_DIR/kubelet.sock")
    parser.add_argument("--socket-name", default="fakelet-dp.sock", help="endpoint file name")
    parser.add_argument("--resource", default="fakelet.example.com/gpu")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--inventory", help="inventory YAML with a 'devices' list")
    source.add_argument("--sysfs-root", help="root of the fake device backend's tree (ROOT/sys/class/...)")
    source.add_argument("--nvml", action="store_true",
                        help="GPUs and their health from NVML (libnvidia-ml.so.1 on the library path)")
    parser.add_argument("--levelzero", metavar="SOCKET",
                        help="with --sysfs-root: health and temperature from this Level-Zero sidecar, by PCI address")
    parser.add_argument("--temp-threshold-c", type=float, default=85.0, help="overtemperature: Unhealthy above")
    parser.add_argument("--temp-hysteresis-c", type=float, default=5.0,
                        help="Healthy again only below threshold minus this")
    parser.add_argument("--dev-dir", help="where device nodes live (default: the inventory's directory)")
    parser.add_argument("--cdi-dir", help="where the runtime reads CDI specs (/var/run/cdi on a node): Allocate "
                                          "names its devices as CDI devices, defined there; without it, none")
    parser.add_argument("--only-devices", metavar="ID,ID",
                        help="serve only these devices of the source (by ID), leaving the others to a DRA driver")
    mutants = DP_DEFECTS | DP_NVML_DEFECTS | DP_LEVELZERO_DEFECTS
    every = mutants | DP_HOSTILE | DP_BENIGN | DP_LEVELZERO_BENIGN
    parser.add_argument("--defect", type=composition.argument_type(every, mutants), metavar="NAME[+NAME...]",
                        help="run as a mutant with this bug (several mutants joined by '+'), or with this hostile "
                             "behaviour or benign quirk")
    parser.add_argument("--allocate-delay-ms", type=int, default=0, metavar="N",
                        help="answer every Allocate N ms late (an injected latency fault; default 0)")
    args = parser.parse_args(argv)
    if args.allocate_delay_ms < 0:
        parser.error("--allocate-delay-ms must be >= 0")
    return args


def daemonize() -> None:
    """The daemonize quirk: what a wrapper script that backgrounds the plugin does."""
    if os.fork() > 0:
        os._exit(0)
    os.setsid()
    if os.fork() > 0:
        os._exit(0)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.defect in ("daemonize", "daemon-exits-on-reject"):
        daemonize()
    hostile.at_start(args.defect)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s reference-dp %(levelname)s %(message)s")
    try:
        plugin = ReferencePlugin(args)
    except (OSError, ValueError, yaml.YAMLError, NvmlError) as err:
        print(f"reference-dp: {err}", file=sys.stderr)
        return 2

    def on_term(signum: int, frame: object) -> None:
        plugin.request_stop()

    if plugin.has("ignore-sigterm"):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGTERM, on_term)
        wakeup.wake_on_signals(plugin.wake_fd)
    try:
        plugin.run()
        log.info("terminating")
    except KeyboardInterrupt:
        log.info("interrupted")
    finally:
        plugin.shutdown()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    sys.exit(main())
