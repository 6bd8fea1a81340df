"""KEP5970-01..07: kubernetes/enhancements#5970's seven behaviours (DRA Driver Conformance Test Suite,
provisional for 1.37), each with the KEP's own title, judged through the Kubernetes API only.

One story serves all seven (harness/world/kepworld.py): the driver's slices, a pod with a claim,
its allocation, preparation, run and deletion, and a second claim. A check whose stage could not
happen because an earlier one failed says "not exercised" and names that stage; the earlier
stage's own check carries the failure.
"""

from __future__ import annotations

from harness.spec.checks import MUST, check, expect, not_exercised
from harness.world.kepworld import NOT_REGISTERED, PREPARE_FAILED, KepWorld, PodStory, Stage


def judge(stage: Stage | None, what: str) -> Stage:
    if stage is None:
        not_exercised(f"{what}: an earlier stage did not get that far")
    assert stage is not None
    if stage.ok is None:
        not_exercised(stage.detail)
    expect(stage.ok, what, stage.detail)
    return stage


def story_stage(story: PodStory, name: str, what: str) -> Stage:
    order = ("allocation", "prepare", "running")
    for earlier in order[:order.index(name)]:
        stage = getattr(story, earlier)
        if stage is None or not stage.ok:
            not_exercised(f"{what}: the pod's {earlier} did not succeed"
                          f"{': ' + stage.detail if stage is not None else ''}")
    return judge(getattr(story, name), what)


@check("KEP5970-01", MUST, "Driver Registration: the kubelet has the driver registered")
def test_driver_registration(kep_world: KepWorld) -> None:
    story = kep_world.first()
    if story.allocation is None or not story.allocation.ok:
        # Allocation is KEP5970-03's stage, and the scheduler's, not the kubelet's: without it the kubelet never
        # had a pod of the driver's to prepare, so registration was never put to the test.
        not_exercised("the kubelet never had a pod with the driver's claim to prepare: the pod's allocation did "
                      f"not succeed{': ' + story.allocation.detail if story.allocation else ''}")
    refused = [e for e in kep_world.events_for(story.name, PREPARE_FAILED)
               if NOT_REGISTERED.search(str(e.get("message")))]
    prepared = story.prepare is not None and story.prepare.ok
    expect(prepared or not refused, f"the kubelet to know driver {kep_world.driver} when it prepares the pod",
           f"{refused[-1].get('message') if refused else ''}")
    if not prepared:
        not_exercised(f"the kubelet neither refused the driver as unregistered nor prepared the pod: "
                      f"{story.prepare.detail if story.prepare else 'no prepare'}")


@check("KEP5970-02", MUST, "ResourceSlice Publishing: ResourceSlices of the driver hold at least one device")
def test_resourceslice_publishing(kep_world: KepWorld) -> None:
    judge(kep_world.published(), f"ResourceSlices of driver {kep_world.driver} with a device")


@check("KEP5970-03", MUST, "Device Allocation: a ResourceClaim of the device class is allocated")
def test_device_allocation(kep_world: KepWorld, request) -> None:
    request.node.user_properties.append(("fakelet_notes", [f"allocated by {kep_world.allocated_by}"]))
    published = kep_world.published()
    if not published.ok:  # KEP5970-02's failure, not this one's
        not_exercised(f"nothing to allocate from: {published.detail}")
    story_stage(kep_world.first(), "allocation", "the claim allocated from the driver's devices")


@check("KEP5970-04", MUST, "NodePrepareResources: the pod gets past resource preparation without errors")
def test_node_prepare_resources(kep_world: KepWorld) -> None:
    story_stage(kep_world.first(), "prepare", "the pod past NodePrepareResources")


@check("KEP5970-05", MUST, "Pod Runs Successfully: the pod runs, with the driver's environment in its container")
def test_pod_runs(kep_world: KepWorld, request) -> None:
    story = kep_world.first()
    story_stage(story, "running", "the pod Running")
    got = judge(kep_world.injected_env(story), "the driver's environment variables in the claim's container")
    request.node.user_properties.append(("fakelet_notes", [got.detail]))  # which variables, on which runtime


@check("KEP5970-06", MUST, "NodeUnprepareResources: pod deletion completes, with no FailedUnprepareDynamicResources")
def test_node_unprepare_resources(kep_world: KepWorld) -> None:
    judge(kep_world.unprepared(), "the pod's deletion completed with its claim unprepared")


@check("KEP5970-07", MUST, "Resource Reuse: a second pod with a new claim of the device class runs")
def test_resource_reuse(kep_world: KepWorld) -> None:
    second = kep_world.second()
    if isinstance(second, Stage):
        judge(second, "the first claim's device released")
        return
    # The second pod's every stage is this check's: its claim allocated, prepared and running is the reuse.
    judge(second.allocation, "the second claim allocated once the first's device was given back")
    judge(second.prepare, "the second pod past NodePrepareResources")
    judge(second.running, "the second pod Running")
    first = kep_world.first().allocation
    again = second.allocation.facts.get("devices") if second.allocation else None
    if first is not None and again is not None and again != first.facts.get("devices"):
        kep_world.notes.append(f"KEP5970-07: the second claim got {again}, not the first's "
                               f"{first.facts.get('devices')} (the scheduler's choice)")
