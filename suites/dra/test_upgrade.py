"""DRA-UPG: a seamless upgrade of the driver, as drivers ship it today (kubernetes#129832, kubelets from 1.33).

A DaemonSet rolling update with surge starts the new pod beside the old one. With kubeletplugin's
RollingUpdate(pod UID) each instance names its sockets after its pod (`<driver>-<uid>-reg.sock`, `dra-<uid>.sock`),
so both register. The kubelet keeps both, calls the newest connected one (v1.36.3 dra_plugin_manager.go get()),
falls back to the other while that one is not connected, and drops the old one when its registration socket goes
(DeRegisterPlugin): its health stream ends then, and the kubelet clears the driver's whole health cache
(manager.go HandleWatchResourcesStream, clearDriver; kubernetes#140818). Upstream tells drivers that any call may
reach either instance (kubeletplugin draplugin.go RollingUpdate): a claim prepared by one is unprepared by the other,
so the instances keep what is prepared in state they share, under a file lock.

Which instance the kubelet calls is the kubelet's business (a scenario's); these checks judge the driver: what
each instance answers while the other runs, and what they share. The subject file says how an instance gets its
pod UID (`rolling_update:`); a driver without it runs as one instance only, and these checks are not exercised.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from harness.controlplane.allocator import CLAIM_FINALIZER
from harness.controlplane.client import RESOURCE_API, ApiError
from harness.controlplane.scheduler import PodClaim
from harness.instruments.timeline import Event
from harness.spec.checks import MUST, SHOULD, check, expect, not_applicable, not_exercised
from harness.spec.subjects import POD_UID_PLACEHOLDER, render
from harness.world.cdispecs import left_for_claim
from harness.world.draenv import DRAEnv
from harness.world.surge import CannotStart, ExitedEarly, NotRegistered, second_instance, start_beside, too_long
from suites.dra.common import device_set, health_started, registered
from suites.dra.test_health import DEVICE_EVENTS, HEALTHY, UNHEALTHY, backend_device, health_of, merged_health
from suites.dra.test_prepare import CDI_QUALIFIED

CONFLICT_RETRIES = 3  # a claim's status written while a controller writes it too: read it again and retry
# Exercised only for a driver whose subject file gives each instance its pod UID (rolling_update:).
ROLLING_UPDATE_CHECKS = ("DRA-UPG-01", "DRA-UPG-02", "DRA-UPG-03", "DRA-UPG-04")


@dataclass
class Upgrade:
    """A rolling update in progress: the old instance registered, and the new one once it is."""

    env: DRAEnv
    command: list[str]  # the subject's command without an instance's rolling-update args
    old: Event  # the old instance's registration
    old_instance: Any
    new: Event | None = None
    started_ns: int = 0  # when the new instance started
    gone: Event | None = None  # the old instance's deregistration
    notes: list[str] = field(default_factory=list)


def instance_args(env: DRAEnv, pod_uid: str) -> tuple[list[str], dict[str, str]]:
    """The subject's rolling_update args and env for one instance, with its pod UID."""
    rolling = env.spec.rolling_update or {}
    values = {**env.placeholders, POD_UID_PLACEHOLDER: pod_uid}
    args = [render(a, values, env.spec.where("rolling_update.args")) for a in rolling.get("args", [])]
    extra = {k: render(v, values, env.spec.where(f"rolling_update.env.{k}")) for k, v in rolling.get("env", {}).items()}
    return args, extra


def same_plugin(event: Event, reg: Event) -> bool:
    """Whether an event names the endpoint of the plugin `reg` registered: the driver's own path, or the one a real
    kubelet dials through the relay (its log's)."""
    return event.get("endpoint") in {reg.get("endpoint"), reg.get("kubelet_endpoint")} - {None, ""}


def old_instance(env: DRAEnv) -> Upgrade:
    """The driver started as the old pod of a rolling update (its own pod UID) and registered; the verdict that the
    update cannot be tried where it cannot."""
    if env.kubelet_version.replace_on_reregister:
        not_applicable(f"kubelet {env.kubelet_version.name} keeps one plugin per driver (a second registration "
                       "replaces the first): two instances at once need a kubelet from 1.33")
    if env.spec.rolling_update is None:
        not_exercised(f"the subject file ({env.spec.source}) gives the driver no pod UID (rolling_update:), so it "
                      "runs as one instance only: its sockets are not named per pod")
    try:
        second_instance(env)
        args, extra = instance_args(env, str(uuid.uuid4()))
        too_long(env, args)
    except CannotStart as err:
        not_exercised(f"no second instance of the driver can run here: {err}")
    subject = env.subject
    command = list(subject.argv)
    subject.argv = [*command, *args]
    subject.env = {**subject.env, **extra}
    reg = registered(env)
    return Upgrade(env, command, reg, subject)


def surge(up: Upgrade) -> Event:
    """The new pod started beside the old one and registered, and the kubelet connected to it (it prefers a
    connected plugin: before that its calls still go to the old one)."""
    env = up.env
    args, extra = instance_args(env, str(uuid.uuid4()))
    up.started_ns = env.now()
    try:
        start_beside(env, up.command, args, lambda since, new: env.wait_dra_registered(since), extra_env=extra)
    except CannotStart as err:
        not_exercised(f"no second instance of the driver can run here: {err}")
    except (ExitedEarly, NotRegistered) as err:
        raise AssertionError(f"expected the new instance to run beside the old one and register; saw: {err}") from None
    env.retired.append(up.old_instance)
    up.new = env.timeline.find(lambda e: e.kind == "dra.registered" and e.get("driver") == env.driver,
                               up.started_ns)[0]
    new = up.new
    env.timeline.wait_for(
        lambda e: e.kind == "dra.connection" and e.get("connected") in (True, "true") and same_plugin(e, new),
        env.profile.reaction_s, f"the kubelet connected to the new instance at {new.get('endpoint')}",
        up.started_ns, relevant=("dra.connection", "dra.registered", "dra.deregistered", "process.exit"))
    return new


def retire(up: Upgrade) -> Event:
    """The old pod's SIGTERM, once the new one serves; its deregistration, and the new one still registered."""
    env = up.env
    assert up.new is not None
    t = env.now()
    up.old_instance.stop()
    old = up.old
    up.gone = env.timeline.wait_for(
        lambda e: e.kind == "dra.deregistered" and same_plugin(e, old), env.profile.reaction_s,
        f"the kubelet to deregister the old instance at {old.get('endpoint')} once it stopped", t,
        relevant=("dra.deregistered", "dra.registered", "process.exit"))
    new = up.new
    dropped = env.timeline.find(lambda e: e.kind == "dra.deregistered" and same_plugin(e, new), up.started_ns)
    expect(not dropped, f"the new instance at {new.get('endpoint')} still registered once the old one went",
           f"deregistered at {env.at(dropped[0]) if dropped else ''}")
    return up.gone


def call_for(env: DRAEnv, kind: str, uid: str, since_ns: int, awaiting: str) -> Event:
    """The kubelet's first `dra.prepare` / `dra.unprepare` naming a claim since `since_ns`, however it ended."""
    return env.timeline.wait_for(
        lambda e: e.kind == kind and uid in (e.get("claims") or []) and e.get("via") == "pod",
        env.profile.reaction_s + env.profile.dra_call_timeout_s, awaiting, since_ns,
        relevant=("dra.prepare", "dra.unprepare", "dra.registered", "dra.deregistered", "pod.sync_failed",
                  "process.exit"))


def answered(call: Event, uid: str) -> str:
    """What a call said of one claim: "" for success, else the gRPC error or the claim's own error."""
    if call.get("outcome") != "OK":
        return str(call.get("outcome"))
    result = (call.get("results") or {}).get(uid)
    if result is None:
        return "no result for the claim"
    return str(result.get("error") or "")


def release(env: DRAEnv, claim: dict[str, Any]) -> None:
    """What the resource-claim controller does once no pod uses a claim: its reservation and allocation go, and
    with them the finalizer the scheduler put on it, so that its devices can be allocated again."""
    client = env.need_api()
    meta = claim["metadata"]
    path = f"{RESOURCE_API}/namespaces/{meta['namespace']}/resourceclaims/{meta['name']}"
    for attempt in range(CONFLICT_RETRIES):
        try:
            current = client.get(path)
            current["status"] = {}
            client.replace_status(path, current)
            current = client.get(path)
            current["metadata"]["finalizers"] = [f for f in current["metadata"].get("finalizers") or []
                                                 if f != CLAIM_FINALIZER]
            client.replace(path, current)
            return
        except ApiError as err:
            if err.status != 409 or attempt == CONFLICT_RETRIES - 1:
                raise


# -- DRA-UPG-01 ----------------------------------------------------------------------------------------


@check("DRA-UPG-01", MUST, "in a rolling update the old instance serves its claims until it goes, and the new "
       "one unprepares them once it has gone")
def test_the_new_instance_unprepares_the_old_ones_claims(dra_env: DRAEnv) -> None:
    env = dra_env
    env.need_api()
    up = old_instance(env)
    env.wait_allocatable(1)
    pod, (claim,) = env.run_pod([PodClaim("gpu")], "before-update")
    uid, name = claim["metadata"]["uid"], claim["metadata"]["name"]
    want = env.allocated_devices(claim, env.driver)
    surge(up)
    # A kubelet that falls back to the old instance (its newest plugin not connected) still gets the claim's devices.
    again = env.conn_to(up.old).node_prepare([env.claim_ref(claim)], timeout_s=env.profile.dra_call_timeout_s)
    expect(uid in again and not again[uid]["error"] and device_set(again[uid]) == want,
           f"the old instance, with the new one registered, to answer a prepare of claim {name} with its devices "
           f"{want}", repr(again.get(uid)))
    retire(up)
    t = env.now()
    env.delete_pod(pod)
    call = call_for(env, "dra.unprepare", uid, t, f"the kubelet to unprepare claim {name} of deleted pod "
                    f"{pod['metadata']['name']}")
    assert up.new is not None
    if not same_plugin(call, up.new):
        not_exercised(f"the kubelet sent the unprepare to {call.get('endpoint')}, not to the new instance at "
                      f"{up.new.get('endpoint')}")
    error = answered(call, uid)
    expect(not error, f"the new instance to unprepare claim {name}, which the old one prepared", error)
    env.wait_pod("pod.deleted", pod, t, f"pod {pod['metadata']['name']} deleted once its claim was unprepared",
                 env.profile.reaction_s + env.profile.dra_call_timeout_s)


# -- DRA-UPG-02 ----------------------------------------------------------------------------------------


@check("DRA-UPG-02", MUST, "once the new instance is registered beside the old one, it prepares new claims "
       "correctly while the old one still runs")
def test_the_new_instance_prepares_beside_the_old_one(dra_env: DRAEnv) -> None:
    env = dra_env
    env.need_api()
    up = old_instance(env)
    env.wait_allocatable(1)
    new = surge(up)
    t = env.now()
    pod, (claim,) = env.run_pod([PodClaim("gpu")], "after-update", wait=False)
    uid, name = claim["metadata"]["uid"], claim["metadata"]["name"]
    call = call_for(env, "dra.prepare", uid, t, f"the kubelet to prepare claim {name} of pod "
                    f"{pod['metadata']['name']}")
    if not same_plugin(call, new):
        not_exercised(f"the kubelet sent the prepare to {call.get('endpoint')}, not to the new instance at "
                      f"{new.get('endpoint')}")
    error = answered(call, uid)
    expect(not error, f"the new instance, with the old one still running, to prepare claim {name}", error)
    result = call.get("results")[uid]
    want = env.allocated_devices(claim, env.driver)
    expect(device_set(result) == want, f"devices {want} (the allocation)", str(device_set(result)))
    bad = [c for d in result["devices"] for c in d["cdi_ids"] if not CDI_QUALIFIED.match(c)]
    expect(all(d["cdi_ids"] for d in result["devices"]) and not bad, "fully qualified CDI IDs for every device",
           str([d["cdi_ids"] for d in result["devices"]]))
    env.wait_pod("pod.running", pod, t, f"pod {pod['metadata']['name']} running (its claim prepared by the new "
                 "instance)", env.profile.reaction_s + env.profile.dra_call_timeout_s)


# -- DRA-UPG-03 ----------------------------------------------------------------------------------------


@check("DRA-UPG-03", MUST, "the instances share what is prepared: the new one cleans up a claim the old one "
       "prepared, and a device released through the old one is free for the new one")
def test_the_instances_share_what_is_prepared(dra_env: DRAEnv) -> None:
    env = dra_env
    env.need_api()
    up = old_instance(env)
    offered = env.wait_allocatable(1).get("devices") or []
    if len(offered) < 2:
        not_exercised(f"the driver offers {len(offered)} device: two claims are needed, one for each instance to "
                      "release")
    deadline = env.profile.dra_call_timeout_s
    pod = env.new_pod()
    kept, released = env.allocated_claim(pod, name="kept"), env.allocated_claim(pod, name="released")
    refs = [env.claim_ref(kept), env.claim_ref(released)]
    first = env.conn_to(up.old).node_prepare(refs, timeout_s=deadline)
    for _, uid, name in refs:
        expect(uid in first and not first[uid]["error"], f"the old instance to prepare claim {name}",
               repr(first.get(uid)))
    kept_uid, kept_name = refs[0][1], refs[0][2]
    kept_ids = [c for d in first[kept_uid]["devices"] for c in d["cdi_ids"]]
    surge(up)
    assert up.new is not None
    # Either instance may get any call: here a kubelet that fell back to the old one unprepares a claim.
    gone = env.conn_to(up.old).node_unprepare([refs[1]], timeout_s=deadline)
    expect(refs[1][1] in gone and not gone[refs[1][1]]["error"],
           f"the old instance, with the new one registered, to unprepare claim {refs[1][2]}",
           repr(gone.get(refs[1][1])))
    retire(up)
    new = env.conn_to(up.new)
    # The claim's pod went: the controller deallocates it, the scheduler gives its device to the next claim.
    freed = env.allocated_devices(released, env.driver)
    release(env, released)
    pod2 = env.new_pod()
    later = env.allocated_claim(pod2, name="later")
    if env.allocated_devices(later, env.driver) != freed:
        not_exercised(f"the scheduler put the next claim on {env.allocated_devices(later, env.driver)}, not on "
                      f"{freed}, the device the old instance released")
    ref = env.claim_ref(later)
    result = new.node_prepare([ref], timeout_s=deadline)
    expect(ref[1] in result and not result[ref[1]]["error"],
           f"the new instance to prepare claim {ref[2]} on {freed}, released through the old instance (the "
           f"instances' shared record of what is prepared says it is free)", repr(result.get(ref[1])))
    # The old instance's claim, unprepared by the new one: nothing it made for the claim may stay.
    result = new.node_unprepare([refs[0]], timeout_s=deadline)
    expect(kept_uid in result and not result[kept_uid]["error"],
           f"the new instance to unprepare claim {kept_name}, which the old one prepared",
           repr(result.get(kept_uid)))
    left = left_for_claim(env.sandbox.cdi_dir, kept_uid, kept_ids)
    expect(not left, f"the CDI devices the old instance made for claim {kept_name} ({kept_ids}) removed by the new "
           "one's unprepare", ", ".join(f"{c} still defined in {f}" for c, f in sorted(left.items())))


# -- DRA-UPG-04 ----------------------------------------------------------------------------------------


@check("DRA-UPG-04", SHOULD, "health from the two instances agrees with the hardware: a failed device stays "
       "UNHEALTHY while both stream, and reads right again within the health timeout once the old one has gone")
def test_health_from_both_instances(dra_env: DRAEnv) -> None:
    env = dra_env
    if not env.kubelet_version.health_versions:
        not_applicable(f"kubelet {env.kubelet_version.name} does not call DRAResourceHealth")
    up = old_instance(env)
    first = health_started(env, up.old.t_ns)
    if first is None:
        expect("health" not in env.spec.observes, "a NodeWatchResources stream (the subject profile says the "
               "driver reports health)", f"no health message within {env.profile.reaction_s:g}s")
        not_applicable("the driver serves no DRAResourceHealth")
    assert first is not None
    device = backend_device(env, "health", first)
    devices = set(health_of(first))
    new = surge(up)
    relevant = ("dra.health", "dra.health_stream", "dra.health_unknown", "dra.deregistered", "process.exit",
                *DEVICE_EVENTS)
    opened = env.timeline.wait_for(
        lambda e: e.kind == "dra.health_stream" and e.get("driver") == env.driver and e.get("state") == "open",
        env.profile.reaction_s, f"the kubelet's health stream to the new instance at {new.get('endpoint')}",
        new.t_ns, relevant=relevant)
    env.timeline.wait_for(lambda e: e.kind == "dra.health" and e.get("driver") == env.driver,
                          env.profile.reaction_s, "a health message on the new instance's stream", opened.t_ns,
                          relevant=relevant)
    t = env.now()
    assert env.devices is not None
    env.devices.fail(device)

    def unhealthy(e: Event) -> bool:
        return e.kind == "dra.health" and e.get("driver") == env.driver and health_of(e).get(device) == UNHEALTHY

    down = env.timeline.wait_for(unhealthy, env.profile.reaction_s, f"{device} {UNHEALTHY} after it failed", t,
                                 relevant=relevant)
    # The other instance's report of the failure too (or a refresh): a message either sent before it saw the
    # change is behind it, not a contradiction.
    settled = env.timeline.wait_for(unhealthy, env.profile.reaction_s, f"{device} {UNHEALTHY} again (the other "
                                    "instance, or a refresh)", down.t_ns + 1, relevant=relevant)
    window = env.profile.quiet_window_s
    stale = env.timeline.wait_quiet(
        lambda e: e.kind == "dra.health" and e.get("driver") == env.driver and health_of(e).get(device) == HEALTHY,
        window, settled.t_ns + 1)
    expect(stale is None, f"{device} reported {UNHEALTHY} by both instances while it is failed ({window:g}s watched)",
           f"{HEALTHY} again at {env.at(stale) if stale else ''}: one instance's message overwrote the other's in the "
           "kubelet's health cache (one per driver)")
    gone = retire(up)
    timeout = env.profile.dra_health_timeout_s

    def right(e: Event) -> bool:
        if e.kind != "dra.health" or e.get("driver") != env.driver:
            return False
        view = merged_health(env, e)
        return view.get(device) == UNHEALTHY and all(view.get(d) == HEALTHY for d in devices - {device})

    # The old stream's end cleared the driver's health in the kubelet: the new instance must say it again.
    env.timeline.wait_for(right, timeout, f"the kubelet's view of the driver's devices right within {timeout:g}s "
                          f"(the health timeout) after the old instance went: {device} {UNHEALTHY}, the others "
                          f"{HEALTHY}", gone.t_ns, relevant=relevant)
