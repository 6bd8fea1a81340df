"""The taint-eviction story, step by step, narrated as it happens.

A device under a running pod overheats; the driver taints it NoExecute (or,
for a driver that publishes no taints, an admin's DeviceTaintRule does);
kube-controller-manager's device-taint eviction controller deletes the pod
once its tolerationSeconds (if any) have passed since the taint's timeAdded;
the kubelet stops the pod, calls NodeUnprepareResources and finishes the
deletion; the driver removes the claim's CDI spec; the resource-claim
controller deallocates the claim. Each step is bounded, timed and checked;
the first step that does not happen ends the story with its reason.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from harness.controlplane.base import RESOURCE_API
from harness.controlplane.client import ApiError
from harness.controlplane.scheduler import PodClaim
from harness.controlplane.taints import NO_EXECUTE, describe_taint, device_taints, time_added
from harness.instruments.timeline import WaitTimeout, wall_time
from harness.spec.subjects import OVER_LIMIT_C
from harness.world.cdispecs import left_for_claim
from harness.world.draenv import DRAEnv

NAME = "taint-eviction"
TITLE = "a NoExecute taint on a device under a running pod: eviction, unprepare, CDI cleanup, deallocation"
CLAIM_GONE_S = 30.0  # the resource-claim controller's reaction to the pod's deletion


@dataclass
class Story:
    """What happened, one line a step, with each step's time since the story began."""

    say: Callable[[str], None]
    began: float = field(default_factory=time.monotonic)
    steps: list[str] = field(default_factory=list)

    def step(self, text: str) -> None:
        line = f"+{time.monotonic() - self.began:7.3f}s  {text}"
        self.steps.append(line)
        self.say(line)


def _driver_taint(env: DRAEnv, device: str, since: int) -> dict[str, Any] | None:
    """Heat the device past its threshold; the NoExecute taint the driver publishes on it, if any."""
    if env.devices is None or device not in env.devices.ids() or not env.drives("temperature"):
        return None
    threshold, _ = env.thermal()
    env.devices.heat(device, threshold + OVER_LIMIT_C)
    event = env.timeline.wait_quiet(
        lambda e: e.kind == "api.slices" and any(t.get("effect") == NO_EXECUTE
                                                 for t in device_taints(e.get("slices") or []).get(device, [])),
        env.profile.reaction_s, since)
    if event is None:
        return None
    return next(t for t in device_taints(event.get("slices") or [])[device] if t.get("effect") == NO_EXECUTE)


def claim_released(env: DRAEnv, claim: dict[str, Any]) -> str:
    """Wait (a bounded watch) until the claim is deallocated or deleted; say which."""
    assert env.client is not None
    meta = claim["metadata"]
    collection = f"{RESOURCE_API}/namespaces/{meta['namespace']}/resourceclaims"
    deadline = time.monotonic() + CLAIM_GONE_S
    while time.monotonic() < deadline:
        try:
            current = env.client.get(f"{collection}/{meta['name']}")
        except ApiError as err:
            if err.status == 404:
                return "deleted"
            raise
        if not (current.get("status") or {}).get("allocation"):
            return "deallocated"
        selector = f"{collection}?fieldSelector=metadata.name={meta['name']}"
        for event in env.client.watch(selector, current["metadata"]["resourceVersion"],
                                      max(0.1, deadline - time.monotonic())):
            if event["type"] == "DELETED":
                return "deleted"
            if not (event["object"].get("status") or {}).get("allocation"):
                return "deallocated"
    raise AssertionError(f"expected claim {meta['name']} deallocated within {CLAIM_GONE_S:g}s after its pod went; "
                         "it is still allocated")


def run(env: DRAEnv, story: Story, toleration_s: int | None = None) -> list[str]:
    """Tell the story against a started environment; raises AssertionError at the first step that fails.

    Returns notes worth keeping (the measured delays)."""
    env.need_controllers()
    env.start()
    reg = env.wait_dra_registered()
    story.step(f"driver {env.driver} registered (DRA {reg.get('service_version')})")
    env.wait_allocatable(1)
    published = env.timeline.find(lambda e: e.kind == "api.slices")[-1]
    story.step(f"ResourceSlices published: {', '.join(published.get('devices'))}")
    tolerations = [{"operator": "Exists", "effect": NO_EXECUTE, "tolerationSeconds": toleration_s}] \
        if toleration_s is not None else []
    pod, (claim,) = env.run_pod([PodClaim("gpu", tolerations=tolerations)], "workload")
    (pool, device), = env.allocated_devices(claim, env.driver)
    name = pod["metadata"]["name"]
    tolerated = f", tolerating NoExecute for {toleration_s}s" if toleration_s is not None else ""
    cdi_ids = env.prepared_cdi_ids(claim)
    story.step(f"pod {name} running on {pool}/{device} (claim {claim['metadata']['name']} prepared{tolerated})")

    since = env.now()
    taint = _driver_taint(env, device, since)
    if taint is not None:
        story.step(f"device {device} heated to {env.spec.thermal[0] + OVER_LIMIT_C:g} C, past its limit "
                   f"{env.spec.thermal_limit()}; the driver published taint {describe_taint(taint)}, "
                   f"timeAdded {taint.get('timeAdded')}")
    else:
        assert env.taint_rules is not None
        rule = env.taint_rules.add(f"{env.node_name}-{NAME}", {"key": "fakelet.example.com/scenario",
                                                              "effect": NO_EXECUTE},
                                   driver=env.driver, pool=pool, device=device)
        taint = rule["spec"]["taint"]
        story.step(f"the driver publishes no NoExecute taint for an overheated device here; DeviceTaintRule "
                   f"{rule['metadata']['name']} ({env.taint_rules.version}) taints {device} "
                   f"{describe_taint(taint)}, timeAdded {taint.get('timeAdded')}")
    added = time_added(taint)
    due = added + (toleration_s or 0)
    story.step(f"eviction due at timeAdded+{toleration_s or 0}s, in {max(0.0, due - time.time()):.1f}s")

    wait_s = max(0.0, due - time.time()) + env.profile.reaction_s
    killing = env.wait_pod("pod.killing", pod, since, f"pod {name} evicted", wait_s)
    late_ms = (wall_time(killing) - due) * 1000
    story.step(f"pod {name} deleted by the device-taint eviction controller, {late_ms:.0f} ms after it was due")
    uid = claim["metadata"]["uid"]
    unprepare = env.timeline.wait_for(lambda e: e.kind == "dra.unprepare" and uid in (e.get("claims") or []),
                                      env.profile.dra_call_timeout_s, f"NodeUnprepareResources for claim {uid}",
                                      killing.t_ns)
    results = unprepare.get("results") or {}
    error = (results.get(uid) or {}).get("error") if isinstance(results, dict) else ""
    if unprepare.get("outcome") != "OK" or error:
        raise AssertionError(f"expected NodeUnprepareResources for claim {uid} to succeed; saw "
                             f"{unprepare.get('outcome')} {error or ''}".strip())
    story.step(f"NodeUnprepareResources({claim['metadata']['name']}) answered OK in "
               f"{float(unprepare.get('duration_s') or 0) * 1000:.0f} ms")
    env.wait_pod("pod.deleted", pod, killing.t_ns, f"the kubelet to finish pod {name}'s deletion",
                 env.profile.reaction_s)
    story.step(f"the kubelet finished the deletion of {name} (grace period 0)")
    left = left_for_claim(env.sandbox.cdi_dir, uid, cdi_ids)
    if left:
        raise AssertionError(f"expected the driver to remove claim {uid}'s CDI devices on unprepare; still defined: "
                             + ", ".join(f"{c} in {f}" for c, f in sorted(left.items())))
    story.step(f"the claim's own CDI devices are gone (of {', '.join(cdi_ids) or 'none'}: those named after it)")
    story.step(f"claim {claim['metadata']['name']} {claim_released(env, claim)} by the resource-claim controller")
    return [f"eviction {late_ms:.0f} ms after it was due (timeAdded {taint.get('timeAdded')}"
            f"{f' + {toleration_s}s' if toleration_s else ''})"]


def tell(env: DRAEnv, say: Callable[[str], None], toleration_s: int | None = None) -> tuple[str, str, list[str]]:
    """(verdict, detail, steps): the story's outcome; a step that did not happen is a fail with its reason."""
    story = Story(say)
    try:
        notes = run(env, story, toleration_s)
    except (AssertionError, WaitTimeout) as err:
        story.step(f"FAILED: {str(err).splitlines()[0]}")
        return "fail", str(err), story.steps
    return "pass", "; ".join(notes), story.steps
