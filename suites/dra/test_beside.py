"""DRA-EXT-02: a DRA driver beside a device plugin for the same hardware (KEP-5004's one-node-at-a-time migration).

Vendors move a node's GPUs from a device plugin to a DRA driver a node, or a GPU, at a time: NVIDIA's device plugin
and DRA driver split a node's GPUs by configuration. Nothing upstream keeps the two apart. kube-scheduler sends a
pod's extended-resource request to the device plugin on a node whose allocatable has the resource and to DRA only
where it has none (dynamicresources extendeddynamicresources.go filterExtendedResources); the KEP forbids one node
serving one name both ways ("One node in a cluster cannot have both extended resource backed by DRA, and same named
extended resource backed by device plugin at the same time", keps/sig-scheduling/5004-dra-extended-resource). But a
ResourceClaim of the driver's class still takes devices from its ResourceSlices on that node, and neither the
kubelet's device manager nor its DRA manager knows what the other handed out (cm/devicemanager, cm/dra). So the
contract falls on the driver: told which devices the device plugin serves, it publishes none of them and prepares
none of them.

The subject file says how the driver is told (`device_plugin_beside:`, `{dp_devices}` or `{dp_uuids}`); a driver
without it has no way to be told, and the check does not apply to it. fakelet's reference device plugin serves the
lower half of the fake hardware (harness/world/dp_beside.py) beside the driver, registered with the fake kubelet's
device manager; the kubelet allocates every one of its devices. The check then allocates, one claim each, every
device the driver published, prepares them as the kubelet does, and expects no published device and no CDI device
the driver hands out to be one of the device plugin's, by device node path or by UUID, serial or PCI address.
"""

from __future__ import annotations

from typing import Any

from harness.controlplane.allocator import AllocationError
from harness.instruments.timeline import WaitTimeout
from harness.launch.process import LaunchError
from harness.node.fake import FakeNode
from harness.spec.checks import MUST, check, expect, not_applicable, not_exercised
from harness.world import dp_beside
from harness.world.draenv import DRAEnv, short_id
from harness.world.env import REGISTRATION_KINDS
from suites.dra.common import registered
from suites.dra.test_extended import resource_name

CHECKS = ("DRA-EXT-02",)


def published(env: DRAEnv) -> list[dict[str, Any]]:
    """The devices of the driver's ResourceSlices for this node."""
    return [d for s in env.slices() if (s.get("spec") or {}).get("driver") == env.driver
            for d in (s["spec"].get("devices") or [])]


def start_device_plugin(env: DRAEnv, beside: dp_beside.Beside) -> None:
    """The companion registered with the kubelet, every device of its share listed, and all of them allocated to a
    pod of the kubelet's: what it hands out is in `beside.allocated`."""
    since = env.now()
    try:
        beside.launcher.start()
    except LaunchError as err:
        not_exercised(f"the device plugin beside the driver cannot start: {err}")
    wanted = len(beside.share)
    try:
        env.timeline.wait_for(
            lambda e: e.kind == "kubelet.register" and bool(e.get("accepted")) and e.get("resource") == beside.resource,
            env.profile.startup_s, f"the device plugin beside the driver registered ({beside.resource})", since,
            abort=dp_beside.exited, relevant=REGISTRATION_KINDS)
        env.node.wait_resource(beside.resource, lambda _cap, alloc: alloc == wanted, since, env.profile.reaction_s,
                               f"{wanted} allocatable {beside.resource} from the device plugin beside the driver")
    except WaitTimeout as err:
        # fakelet's own device plugin, not the driver: the check could not be set up here.
        not_exercised(f"the device plugin beside the driver never served its {wanted} devices: {err}\n"
                      f"{beside.launcher.log_tail(8)}")
    node = env.node
    assert isinstance(node, FakeNode)
    beside.pod = f"beside-{short_id()}"
    for allocation in node.admit_pod(beside.pod, {beside.resource: wanted}):
        paths, found = dp_beside.allocate_evidence(allocation.response, env.sandbox.cdi_dir)
        for device_id in allocation.device_ids:
            beside.allocated[device_id] = dp_beside.identify(env.hardware(), paths, found)
    mine = {h.id for h in beside.share}
    handed = set().union(*beside.allocated.values()) if beside.allocated else set()
    if handed != mine:  # the reference device plugin on this hardware: fakelet's to fix
        raise RuntimeError(f"the device plugin beside the driver was to hand out {sorted(mine)}; its Allocate "
                           f"named {sorted(handed)}")


def describe(found: dict[str, set[str]]) -> str:
    """`name (hardware, ...)` for each entry, or "none"."""
    return ", ".join(f"{k} ({', '.join(sorted(v)) or 'no hardware told'})" for k, v in sorted(found.items())) or "none"


def stop_device_plugin(env: DRAEnv, beside: dp_beside.Beside) -> None:
    node = env.node
    if beside.pod and isinstance(node, FakeNode):
        node.delete_pod(beside.pod)
    beside.launcher.stop()
    beside.socket.unlink(missing_ok=True)


@check("DRA-EXT-02", MUST, "beside a device plugin for the same hardware, the driver publishes and prepares none "
                           "of the device plugin's devices")
def test_leaves_the_device_plugins_devices_alone(dra_env: DRAEnv) -> None:
    env = dra_env
    env.need_api()
    if env.spec.device_plugin_beside is None:
        not_applicable(f"the subject file ({env.spec.source}) has no device_plugin_beside: entry, so the driver "
                       "cannot be told which devices a device plugin beside it serves")
    if env.real:
        not_exercised("the device plugin beside the driver registers with the fake kubelet's device manager")
    if env.devices is None or not hasattr(env.subject, "argv"):
        not_exercised("the device plugin beside the driver reads the fake device backend, which this run has not")
    hardware = env.hardware()
    if len(hardware) < 2:
        not_exercised(f"the fake hardware has {len(hardware)} device(s): a device plugin and the driver need one "
                      "each")
    share, rest = dp_beside.split(hardware)
    empty = dp_beside.unnamed(env, share)
    if empty:
        not_exercised(f"the subject's device_plugin_beside uses {', '.join('{' + n + '}' for n in empty)}, which the "
                      "fake hardware leaves empty (its devices have no UUID): the driver would be told nothing")
    args, extra = dp_beside.driver_args(env, share)
    env.subject.argv = [*env.subject.argv, *args]
    env.subject.env = {**env.subject.env, **extra}
    env.note(f"the device plugin beside the driver serves {', '.join(h.id for h in share)}; the driver is left "
             f"{', '.join(h.id for h in rest)} (args {args}{f', env {extra}' if extra else ''})")
    registered(env)
    beside = dp_beside.launcher(env, resource_name(env), share)
    claims: list[dict[str, Any]] = []
    try:
        start_device_plugin(env, beside)
        env.wait_allocatable(1)
        theirs = {h.id for h in share}
        # The slices: no published device is one the device plugin serves.
        devices = published(env)
        named: dict[str, set[str]] = {}
        for d in devices:
            named[d["name"]] = dp_beside.identify(hardware, *dp_beside.slice_evidence(d))
        overlap = {n: sorted(h & theirs) for n, h in named.items() if h & theirs}
        expect(not overlap, f"the driver's ResourceSlices publish none of the device plugin's devices "
                            f"{sorted(theirs)}", f"{overlap} (device: the hardware it names)")
        # Each published device allocated on its own, and all of them prepared as the kubelet does.
        assert env.allocator is not None
        env.allocator.ensure_device_class(env.device_class, env.driver)
        pod = env.new_pod("beside")
        skipped = []
        for d in devices:
            claim = env.allocator.create_claim(env.node_name, f"beside-{short_id()}", env.device_class, 1)
            claims.append(claim)
            try:
                claims[-1] = env.allocator.allocate(claim, env.node_name, env.driver, pod, only={d["name"]})
            except AllocationError as err:  # a partition whose GPU another holds, a tainted device
                skipped.append(f"{d['name']}: {err}")
        allocated = [c for c in claims if (c.get("status") or {}).get("allocation")]
        if skipped:
            env.note(f"published devices not allocated on their own: {'; '.join(skipped)}")
        result = env.conn().node_prepare([env.claim_ref(c) for c in allocated],
                                         timeout_s=env.profile.dra_call_timeout_s)
        handed = set().union(*beside.allocated.values())
        prepared: dict[str, set[str]] = {}
        for c in allocated:
            answer = result.get(c["metadata"]["uid"]) or {}
            for device in answer.get("devices") or []:
                for cdi_id in device.get("cdi_ids") or []:
                    prepared[cdi_id] = dp_beside.identify(hardware, *dp_beside.cdi_evidence(env.sandbox.cdi_dir,
                                                                                           cdi_id))
        clash = {i: sorted(h & handed) for i, h in prepared.items() if h & handed}
        expect(not clash, f"the driver's CDI devices name none of the devices the device plugin's Allocate handed "
                          f"out ({sorted(handed)})", f"{clash} (CDI device: the hardware its edits name)")
        env.note(f"the driver published {describe(named)}; its CDI devices name {describe(prepared)}")
        if not any(named.values()) and not any(prepared.values()):
            not_exercised("neither the driver's ResourceSlices nor its CDI specs name a device of the fake hardware "
                          "(by device node, UUID, serial or PCI address): which devices it took cannot be told")
    finally:
        stop_device_plugin(env, beside)
        unprepare(env, claims)


def unprepare(env: DRAEnv, claims: list[dict[str, Any]]) -> None:
    """Best effort, after the verdict: the claims go with the check's namespace (DRAEnv.close)."""
    refs = [env.claim_ref(c) for c in claims if (c.get("status") or {}).get("allocation")]
    if not refs:
        return
    try:
        env.conn().node_unprepare(refs, timeout_s=env.profile.dra_call_timeout_s)
    except Exception as err:  # a driver that died already has its verdict: cleanup must not mask it
        env.note(f"unpreparing the check's claims after the verdict failed: {err}")
