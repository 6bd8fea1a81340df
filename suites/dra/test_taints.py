"""DRA-TNT: device taints, published by the driver or by an admin's DeviceTaintRule, and eviction.

The path is the real one: the driver's ResourceSlices and DeviceTaintRules in
the API server, the harness scheduling real Pods (allocating around blocking
taints), kube-controller-manager's device-taint eviction controller deleting
pods whose devices carry a NoExecute taint they do not tolerate, and the fake
kubelet's pod worker unpreparing their claims before it finishes the deletion.
fakelet never fakes the eviction: checks that need it skip where no
controller manager runs.
"""

from __future__ import annotations

import time
from typing import Any

from harness.controlplane.allocator import AllocationError
from harness.controlplane.scheduler import PodClaim, claim_body
from harness.controlplane.taints import (
    NO_EXECUTE,
    NO_SCHEDULE,
    blocking,
    describe_taint,
    device_taints,
    time_added,
)
from harness.instruments.timeline import Event, wall_time
from harness.spec.checks import MUST, SHOULD, check, expect, not_applicable, not_exercised
from harness.spec.subjects import OVER_LIMIT_C
from harness.world.cdispecs import left_for_claim
from harness.world.draenv import DRAEnv
from suites.dra.common import published

EVICT_KEY = "fakelet.example.com/evict"  # the harness's own taint key in the rules it creates
TOLERATION_S = 3  # tolerationSeconds of the pod that may stay a little while
CANCEL_TOLERATION_S = 5  # DRA-TNT-04: long enough for a driver to clear its taint (ms here) well before
CLOCK_SLACK_S = 1.0  # timeAdded is stored truncated to the second: an eviction may come up to 1 s "early"
SLICE_KINDS = ("api.slices", "device.fail", "device.recover", "device.heat", "device.cool", "process.exit")


def taints_of(event: Event) -> dict[str, list[dict[str, Any]]]:
    return device_taints(event.get("slices") or [])


def current_slices(env: DRAEnv) -> Event:
    """The newest slice set on the timeline (the driver has published)."""
    found = env.timeline.find(lambda e: e.kind == "api.slices")
    expect(found, "the driver's ResourceSlices", "none")
    return found[-1]


def target_device(env: DRAEnv) -> str:
    """A published device that is also a fake device, so the backend can fail or heat it."""
    names = set(taints_of(current_slices(env)))
    assert env.devices is not None
    device = next((d for d in sorted(env.devices.ids()) if d in names), "")
    if not device:
        not_exercised(f"no published device is named like a fake device ({sorted(names)[:8]}): fakelet cannot "
                      "tell which one to fail")
    return device


def wait_taints(env: DRAEnv, since: int, awaiting: str, test: Any) -> Event:
    return env.timeline.wait_for(lambda e: e.kind == "api.slices" and test(taints_of(e)), env.profile.reaction_s,
                                 awaiting, since, abort=env._exit_abort, relevant=SLICE_KINDS)


def newly_tainted(before: dict[str, list[dict]], now: dict[str, list[dict]]) -> set[str]:
    """Devices with a blocking taint now that had none before."""
    return {d for d, t in now.items() if blocking(t) and not blocking(before.get(d, []))}


# -- DRA-TNT-01 ------------------------------------------------------------------------------------


def _failure_taints(env: DRAEnv, device: str) -> bool:
    """Fail the device: its taint, on it alone, then gone on recovery. False when the driver published none."""
    assert env.devices is not None
    before = taints_of(current_slices(env))
    t = env.now()
    env.devices.fail(device)
    first = env.timeline.wait_quiet(lambda e: e.kind == "api.slices" and newly_tainted(before, taints_of(e)),
                                    env.profile.reaction_s, t)
    if first is None:
        env.devices.recover(device)
        return False
    tainted = newly_tainted(before, taints_of(first))
    expect(tainted == {device}, f"a taint on the failed device {device} only",
           f"new taints on {sorted(tainted)} at {env.at(first)}")
    env.note(f"failed {device}: tainted {', '.join(describe_taint(x) for x in blocking(taints_of(first)[device]))}")
    t = env.now()
    env.devices.recover(device)
    wait_taints(env, t, f"the taint on {device} removed after it recovered",
                lambda taints: not blocking(taints.get(device, [])))
    return True


def _temperature_taints(env: DRAEnv, device: str) -> bool:
    """Warm (below the overtemperature threshold): never NoExecute. Critical: tainted. Cooled: untainted."""
    assert env.devices is not None
    threshold, hysteresis = env.thermal()
    limit = f"(the driver's limit: {env.spec.thermal_limit()})"
    before = taints_of(current_slices(env))
    t = env.now()
    env.devices.heat(device, threshold - 1)
    early = env.timeline.wait_quiet(
        lambda e: e.kind == "api.slices" and any(x.get("effect") == NO_EXECUTE for x in taints_of(e).get(device, [])
                                                 if x not in before.get(device, [])),
        env.profile.quiet_window_s, t)
    expect(early is None, f"no NoExecute taint on {device} at {threshold - 1:g} C, below the overtemperature "
           f"limit {limit} (a warm device may be NoSchedule; NoExecute evicts its pods)",
           f"{', '.join(describe_taint(x) for x in taints_of(early).get(device, []))} at {env.at(early)}"
           if early is not None else "")
    t = env.now()
    env.devices.heat(device, threshold + OVER_LIMIT_C)
    hot = env.timeline.wait_quiet(lambda e: e.kind == "api.slices" and blocking(taints_of(e).get(device, [])),
                                  env.profile.reaction_s, t)
    cool = threshold - hysteresis - OVER_LIMIT_C
    if hot is None:
        env.devices.cool(device, cool)
        return False
    t = env.now()
    env.devices.cool(device, cool)
    wait_taints(env, t, f"the taint on {device} removed after it cooled to {cool:g} C {limit}",
                lambda taints: not blocking(taints.get(device, [])))
    return True


@check("DRA-TNT-01", SHOULD, "a driver that publishes device taints taints a failed or overheated device (that "
       "device only, NoExecute only when critical) and removes the taint on recovery")
def test_driver_taints(dra_env: DRAEnv) -> None:
    env = dra_env
    published(env)
    if not (env.drives("health") or env.drives("temperature")):
        env.require_drive("health")  # waits for the driver's first read before it says not exercised
    health, temperature = env.drives("health"), env.drives("temperature")
    device = target_device(env)
    tainted = _failure_taints(env, device) if health else False
    if temperature:
        tainted = _temperature_taints(env, device) or tainted
    if not tainted:
        not_applicable(f"the driver published no device taint when {device} "
                       f"{'failed or ' if health else ''}{'overheated' if temperature else ''}".rstrip(" or")
                       + " (it reports health through DRAResourceHealth only)")


# -- DRA-TNT-02 ------------------------------------------------------------------------------------


def unprepare_calls(env: DRAEnv, uid: str, since: int) -> list[Event]:
    return env.timeline.find(lambda e: e.kind == "dra.unprepare" and uid in (e.get("claims") or []), since)


def _evicted_cleanly(env: DRAEnv, pod: dict, claim: dict, since: int) -> Event:
    """The pod deleted by the controller, its claim unprepared once, without error, its CDI devices gone."""
    name, uid = pod["metadata"]["name"], claim["metadata"]["uid"]
    key = f"{claim['metadata']['namespace']}/{claim['metadata']['name']}"
    cdi_ids = env.prepared_cdi_ids(claim)
    killing = env.wait_pod("pod.killing", pod, since, f"pod {name} evicted (deleted by the device-taint eviction "
                           "controller) after a NoExecute taint on its device",
                           env.profile.reaction_s)
    env.wait_pod("pod.deleted", pod, since, f"the kubelet to unprepare evicted pod {name}'s claim and finish its "
                 "deletion", env.profile.reaction_s + env.profile.dra_call_timeout_s)
    calls = unprepare_calls(env, uid, since)
    expect(len(calls) == 1 and calls[0].get("outcome") == "OK",
           f"exactly one NodeUnprepareResources for claim {uid}, answered OK",
           "; ".join(f"{e.get('outcome')} at {env.at(e)}" for e in calls) or "none")
    expect(not env.holds_claim(claim), f"claim {key} gone from the kubelet's checkpoint", "still there")
    left = left_for_claim(env.sandbox.cdi_dir, uid, cdi_ids)
    expect(not left, f"the claim's own CDI devices (of {cdi_ids}, those named after claim {uid}) removed",
           ", ".join(f"{c} still defined in {f}" for c, f in sorted(left.items())))
    return killing


@check("DRA-TNT-02", MUST, "a NoExecute taint evicts pods that do not tolerate it (after tolerationSeconds when "
       "set); the kubelet unprepares each claim once and the driver unprepares it cleanly", cluster_objects=True)
def test_eviction(dra_env: DRAEnv) -> None:
    env = dra_env
    env.need_controllers()
    published(env)
    # One pod a device: as many of the three as the driver has devices (a one-device driver is legal).
    devices = len(taints_of(current_slices(env)))
    evicted, (evicted_claim,) = env.run_pod([PodClaim("gpu")], "evicted")
    toleration = {"key": EVICT_KEY, "operator": "Exists", "effect": NO_EXECUTE}
    delayed = delayed_claim = staying = None
    if devices >= 2:
        delayed, (delayed_claim,) = env.run_pod(
            [PodClaim("gpu", tolerations=[{**toleration, "tolerationSeconds": TOLERATION_S}])], "delayed")
    if devices >= 3:
        staying, _ = env.run_pod([PodClaim("gpu", tolerations=[toleration])], "tolerating")
    if staying is None:
        env.note(f"the driver publishes {devices} device(s): only "
                 f"{'the untolerating pod' if devices == 1 else 'the untolerating and the delayed pod'} ran")
    assert env.taint_rules is not None
    pool = evicted_claim["status"]["allocation"]["devices"]["results"][0]["pool"]
    t = env.now()
    rule = env.taint_rules.add(f"{env.node_name}-evict", {"key": EVICT_KEY, "effect": NO_EXECUTE},
                               driver=env.driver, pool=pool)
    added = time_added(rule["spec"]["taint"])
    first = _evicted_cleanly(env, evicted, evicted_claim, t)
    env.note(f"untolerated: evicted {(wall_time(first) - added) * 1000:.0f} ms after the taint's timeAdded")
    if delayed is not None:
        second = _evicted_cleanly(env, delayed, delayed_claim, t)
        late = wall_time(second) - added
        expect(late >= TOLERATION_S - CLOCK_SLACK_S, f"pod {delayed['metadata']['name']} evicted no earlier than "
               f"its tolerationSeconds {TOLERATION_S} after the taint's timeAdded", f"evicted after {late:.3f}s")
        env.note(f"tolerationSeconds {TOLERATION_S}: evicted {late * 1000:.0f} ms after the taint's timeAdded")
    if staying is not None:
        # The quiet window counts from the taint: the evictions above were part of it.
        window = max(0.0, env.profile.quiet_window_s - (env.now() - t) / 1e9)
        gone = env.timeline.wait_quiet(
            lambda e: e.kind == "pod.killing" and e.get("pod_uid") == staying["metadata"]["uid"], window, t)
        expect(gone is None, f"pod {staying['metadata']['name']}, which tolerates the taint, left running",
               f"killed at {env.at(gone)}" if gone is not None else "")


# -- DRA-TNT-03 ------------------------------------------------------------------------------------


@check("DRA-TNT-03", MUST, "a claim allocated while a device carries a NoSchedule or NoExecute taint never lands "
       "on it; a claim that tolerates the taint may, and prepares", cluster_objects=True)
def test_tainted_device_not_allocated(dra_env: DRAEnv) -> None:
    env = dra_env
    published(env)
    # A device the backend can fail when the driver reads its health; else any published one, for a rule.
    device = target_device(env) if env.drives("health") else sorted(taints_of(current_slices(env)))[0]
    before = taints_of(current_slices(env))
    source = "the driver"
    t = env.now()
    if env.drives("health"):
        assert env.devices is not None
        env.devices.fail(device)
        tainted = env.timeline.wait_quiet(lambda e: e.kind == "api.slices" and newly_tainted(before, taints_of(e)),
                                          env.profile.reaction_s, t)
    else:
        tainted = None
    if tainted is None:
        # No taint of the driver's own: an admin's rule on the device, which the driver must honour too.
        assert env.taint_rules is not None
        source = "a DeviceTaintRule"
        env.taint_rules.add(f"{env.node_name}-noschedule", {"key": EVICT_KEY, "effect": NO_SCHEDULE},
                            driver=env.driver, device=device)
    env.note(f"{device} tainted by {source}")
    free = len(taints_of(current_slices(env))) - 1
    landed: list[str] = []
    for _ in range(free + 1):  # one more than the untainted devices: that one must find none
        pod = env.new_pod()
        try:
            claim = env.allocated_claim(pod)
        except AssertionError:
            break  # fewer untainted devices than expected: the ones left are tainted
        landed += [d for _, d in env.allocated_devices(claim, env.driver)]
    expect(device not in landed, f"no claim allocated on the tainted device {device}",
           f"claims landed on {sorted(landed)}")
    tolerant = env.new_pod("tolerant")
    assert env.allocator is not None
    claim = env.allocator.client.create(
        f"/apis/resource.k8s.io/v1/namespaces/{env.node_name}/resourceclaims",
        claim_body(env.node_name, f"tolerant-{tolerant['uid'][:8]}", env.device_class, 1, [{"operator": "Exists"}]))
    try:
        claim = env.allocator.allocate(claim, env.node_name, env.driver, tolerant)
    except AllocationError as err:
        raise AssertionError(f"expected a claim tolerating every taint to be allocated; saw {err}") from None
    uid = claim["metadata"]["uid"]
    result = env.conn().node_prepare([env.claim_ref(claim)], timeout_s=env.profile.dra_call_timeout_s)
    expect(uid in result and not result[uid]["error"], "the tolerating claim prepared without error",
           repr(result.get(uid)))


# -- DRA-TNT-04 ------------------------------------------------------------------------------------


@check("DRA-TNT-04", SHOULD, "a NoExecute taint the driver removes before tolerationSeconds elapse cancels the "
       "eviction: the pod keeps running and nothing is unprepared")
def test_eviction_cancelled(dra_env: DRAEnv) -> None:
    env = dra_env
    env.need_controllers()
    published(env)
    env.require_drive("health")
    toleration = {"operator": "Exists", "effect": NO_EXECUTE, "tolerationSeconds": CANCEL_TOLERATION_S}
    pod, claims = env.run_pod([PodClaim("gpu", tolerations=[toleration])], "tolerating")
    (_, device), = env.allocated_devices(claims[0], env.driver)
    assert env.devices is not None
    if device not in env.devices.ids():
        not_exercised(f"the pod's device {device} is not named like a fake device: fakelet cannot fail it")
    t = env.now()
    env.devices.fail(device)
    tainted = env.timeline.wait_quiet(
        lambda e: e.kind == "api.slices" and any(x.get("effect") == NO_EXECUTE for x in taints_of(e).get(device, [])),
        env.profile.reaction_s, t)
    if tainted is None:
        env.devices.recover(device)
        not_applicable(f"the driver published no NoExecute taint on {device} when it failed")
    assert tainted is not None
    added = min(time_added(x) for x in taints_of(tainted)[device]
                if x.get("effect") == NO_EXECUTE and x.get("timeAdded"))
    env.devices.recover(device)
    t = env.now()
    wait_taints(env, t, f"the NoExecute taint on {device} removed after it recovered, before the pod's "
                f"tolerationSeconds {CANCEL_TOLERATION_S} ran out",
                lambda taints: not any(x.get("effect") == NO_EXECUTE for x in taints.get(device, [])))
    # Watch past the moment the eviction would have fired.
    window = max(0.0, added + CANCEL_TOLERATION_S + CLOCK_SLACK_S - time.time()) + env.profile.quiet_window_s
    uid = claims[0]["metadata"]["uid"]
    bad = env.timeline.wait_quiet(
        lambda e: (e.kind == "pod.killing" and e.get("pod_uid") == pod["metadata"]["uid"])
        or (e.kind == "dra.unprepare" and uid in (e.get("claims") or [])), window, t)
    expect(bad is None, f"pod {pod['metadata']['name']} still running and its claim prepared "
           f"{window:.1f}s after the taint was removed", f"{bad.kind} at {env.at(bad)}" if bad is not None else "")
