"""Every scenario condition judged true where it holds and false where it does not, on both kubelets (issue 35).

A table of controls, for each condition and each kind it applies to (device plugins, DRA drivers): a positive
control, conditions that must hold (the expect is met), and a negative one, conditions that must be judged
false, never inconclusive, where the node can know (a count the run cannot reach, an event not provoked yet).
Each kind's controls run as one scenario on the bundled reference subject, each control one expect step with
its negative under `not:` judged first: the run keeps its correct behaviour only if every control does, and
the narration must show each judged on what the node showed (`not (capacity 4 (wanted at least 5))`, never a
default 0). Where the node truly cannot know (no recorded wire, no health cache, a checkpoint out of reach),
the condition is inconclusive with its reason: those controls run on a stage made by hand, without a node.

Cost: the fake kubelet's two runs take about 20 s together (DRA 13 s, device plugin 5 s). On the real kubelet
(real_kubelet) the default env runs the two kinds on the default release, a real node each (about 30 s each);
`tox -e fidelity` (FAKELET_FIDELITY=full) adds each kind on kubelet 1.37.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml
from conftest import outcome_of, scenario_run

from harness.instruments.timeline import Timeline
from harness.kubelet import checkpoint as dp_checkpoint
from harness.kubelet import versions
from harness.scenarios.conditions import Conditions
from harness.scenarios.outcomes import Inconclusive
from harness.scenarios.schema import INCONCLUSIVE, NOT_REPRODUCED, loads
from harness.scenarios.vocabulary import CONDITIONS, DP_ONLY, DRA_ONLY

DP, DRA = "device-plugin", "dra"
SUBJECTS = {DP: "reference-dp", DRA: "reference-dra"}
RESOURCE = "fakelet.example.com/gpu"  # reference-dp's resource (fixtures/subjects/reference-dp.yaml)
DP_SOCKET = "fakelet-dp.sock"  # reference-dp's socket
DRA_SOCKET = "dra.sock"  # the endpoint reference-dra registers (kubeletplugin draplugin.go's default name)
WITHIN = "20s"  # each expect's bound: it is only spent when a control fails
FIDELITY_ENV = "FAKELET_FIDELITY"  # "full": tox -e fidelity, every real case
# The run's own reasons when this machine cannot run the node (harness/scenarios/runner.py _environment): only
# then does a case skip; any other inconclusive outcome is a wrong verdict.
NO_REAL_NODE = ("the real kubelet cannot run here", "the real kubelet needs an API server")


@dataclass(frozen=True)
class Control:
    """One condition's controls on one kind: `holds` must be met, `fails` judged false (under `not:`, judged
    first, so that a positive that would also hold vacuously is judged on the state the negative saw)."""

    condition: str
    kind: str
    holds: str = ""  # flow-style conditions that must hold
    fails: str = ""  # flow-style conditions that must be judged false
    shows: tuple[str, ...] = ()  # what the narration must say: each side judged on what the node showed
    setup: tuple[str, ...] = ()  # steps that get the node where the controls read it
    fails_first: bool = False  # the negative's own expect comes before the setup (what it reads is not there yet)

    def steps(self) -> list[str]:
        expect = ", ".join(([f"not: {{{self.fails}}}"] if self.fails and not self.fails_first else [])
                           + ([self.holds] if self.holds else []))
        out = [_expect(f"not: {{{self.fails}}}")] if self.fails_first else []
        out += [f"- {s}" for s in self.setup]
        return out + ([_expect(expect)] if expect else [])

    def judged(self) -> tuple[set[str], set[str]]:
        """The conditions this control judges true, and those it judges false."""
        return (set(yaml.safe_load(f"{{{self.holds}}}") or {}) if self.holds else set(),
                set(yaml.safe_load(f"{{{self.fails}}}") or {}) if self.fails else set())


def _expect(conditions: str) -> str:
    return f"- expect: {{{conditions}}}\n  glimpse: true\n  within: {WITHIN}"


PLUGIN_UP_DP = ("plugin: start", "wait: {registered: true, allocatable: all}")
PLUGIN_UP_DRA = ("plugin: start", "wait: {registered: true, slices: {devices: all}}")

# In order: each kind's scenario is its controls' steps, one after the other, after `kubelet: start`.
CONTROLS: tuple[Control, ...] = (
    # -- a device plugin ----------------------------------------------------------------------------------
    Control("registered", DP, holds="registered: true", fails="registered: true", fails_first=True,
            setup=PLUGIN_UP_DP,
            shows=("not (no registration with kubelet instance 1)|not (the node reports "
                   f"{RESOURCE} capacity 0)",
                   "1 accepted registration(s) with kubelet instance 1|the node reports "
                   f"{RESOURCE} capacity 4")),
    Control("capacity", DP, holds="capacity: all", fails="capacity: {at_least: 5}",
            shows=("not (capacity 4 (wanted at least 5)); capacity 4 (wanted equals 4 (all))",)),
    Control("allocatable", DP, holds=f"allocatable: {{resource: {RESOURCE}, count: 4}}",
            fails="allocatable: {at_least: 5}",
            shows=("not (allocatable 4 (wanted at least 5)); allocatable 4 (wanted equals 4)",)),
    Control("calls", DP, fails="calls: {method: Allocate, count: {at_least: 1}}",
            holds="calls: {method: ListAndWatch, count: 1}",
            shows=("not (Allocate calls 0 (wanted at least 1)); ListAndWatch calls 1 (wanted equals 1)",)),
    Control("dialed", DP, holds=f"dialed: {{socket: {DP_SOCKET}}}",
            fails=f"dialed: {{socket: {DP_SOCKET}, plugin_instance: 2}}",
            shows=(f"not (dials of {DP_SOCKET} while plugin instance 2 served 0 (wanted at least 1)); "
                   f"dials of {DP_SOCKET} 1 (wanted at least 1)",)),
    Control("held", DP, holds="held: {call: Allocate}", fails="pod: {name: p, phase: Running}",
            setup=("hold: {call: Allocate}", "pod: {create: p, devices: 1}", "wait: {held: {call: Allocate}}"),
            shows=("not (pod p: phase Pending", "; Allocate held in flight by kubelet instance 1")),
    Control("held", DP, fails="held: {call: Allocate}", setup=("release: {call: Allocate}",),
            shows=("not (Allocate released)",)),
    Control("pod", DP, holds="pod: {name: p, phase: Running}", fails="pod: {name: p, phase: Pending}",
            shows=("not (pod p: phase Running", "); pod p: phase Running")),
    Control("pod_devices", DP, holds="pod_devices: {pod: p, count: 1}",
            fails="pod_devices: {pod: p, count: {at_least: 2}}",
            shows=("not (PodResources: pod p has devices 1 (wanted at least 2)); "
                   "PodResources: pod p has devices 1 (wanted equals 1)",)),
    Control("pod_resources", DP, holds="pod_resources: {pod: p, devices: 1, present: true}",
            fails="pod_resources: {pod: p, via: Get, devices: {at_least: 2}}",
            shows=(f"not (PodResources Get: pod p {RESOURCE} devices 1 (wanted at least 2)); "
                   f"PodResources List: pod p listed, {RESOURCE} devices 1 (wanted equals 1)",)),
    Control("pod_resources", DP, holds=f"pod_resources: {{allocatable: {RESOURCE}, devices: all}}",
            fails=f"pod_resources: {{allocatable: {RESOURCE}, devices: {{at_least: 5}}}}",
            shows=(f"not (PodResources GetAllocatableResources: {RESOURCE} devices 4 (wanted at least 5)); "
                   f"PodResources GetAllocatableResources: {RESOURCE} devices 4 (wanted equals 4 (all))",)),
    Control("resources_status", DP, holds="resources_status: {pod: p, health: Healthy}",
            fails="resources_status: {pod: p, health: Unhealthy}",
            shows=("not (allocatedResourcesStatus of p: Healthy); allocatedResourcesStatus of p: Healthy",)),
    Control("calls", DP, holds="calls: {method: Allocate, count: 1}",
            fails="calls: {method: Allocate, count: {at_least: 2}}",
            shows=("not (Allocate calls 1 (wanted at least 2)); Allocate calls 1 (wanted equals 1)",)),
    Control("checkpoint", DP, holds="checkpoint: {pod: p, devices: 1}", fails="checkpoint: {pod: p, devices: 0}",
            shows=("not (device-manager checkpoint: pod p devices 1 (wanted equals 0)); "
                   "device-manager checkpoint: pod p devices 1 (wanted equals 1)",)),
    Control("pod_resources", DP, holds="pod: {name: p, phase: Deleted}, pod_resources: {pod: p, present: false}",
            fails="pod_resources: {pod: p, via: Get, present: true}", setup=("pod: {delete: p}",),
            shows=("not (PodResources Get: pod p not found); pod p: phase Deleted",
                   "; PodResources List: pod p not listed")),

    # -- a DRA driver ----------------------------------------------------------------------------------------
    Control("registered", DRA, holds="registered: true", fails="registered: true", fails_first=True,
            setup=PLUGIN_UP_DRA,
            shows=("not (driver gpu.fakelet.example.com not registered with the running kubelet)",
                   "driver gpu.fakelet.example.com registered with the running kubelet at 1 endpoint(s)")),
    Control("slices", DRA, holds="slices: {devices: all}", fails="slices: {devices: {at_least: 5}}",
            shows=("not (published devices 4 (wanted at least 5)); published devices 4 (wanted equals 4 (all))",)),
    Control("device_health", DRA, holds="device_health: {healthy: ['@0', '@1']}",
            fails="device_health: {unhealthy: ['@0']}",
            shows=("not (the kubelet holds gpu-0 Healthy (wanted Unhealthy)); device health: gpu-0 Healthy, "
                   "gpu-1 Healthy",)),
    Control("taints", DRA, holds="taints: {only: []}",
            shows=("the driver's taints on no device",)),
    Control("calls", DRA, fails="calls: {method: NodePrepareResources, count: {at_least: 1}}",
            holds="calls: {method: NodeWatchResources, count: 1}",
            shows=("not (NodePrepareResources calls 0 (wanted at least 1)); NodeWatchResources calls 1 "
                   "(wanted equals 1)",)),
    Control("dialed", DRA, holds=f"dialed: {{socket: {DRA_SOCKET}}}",
            fails=f"dialed: {{socket: {DRA_SOCKET}, plugin_instance: 2}}",
            shows=(f"not (dials of {DRA_SOCKET} while plugin instance 2 served 0 (wanted at least 1)); "
                   f"dials of {DRA_SOCKET} ",)),
    Control("held", DRA, holds="held: {call: NodePrepareResources}", fails="pod: {name: p, phase: Running}",
            setup=("hold: {call: NodePrepareResources}", "pod: {create: p, devices: 1}",
                   "wait: {held: {call: NodePrepareResources}}"),
            shows=("not (pod p: phase Pending", "; NodePrepareResources held in flight by kubelet instance 1")),
    Control("held", DRA, fails="held: {call: NodePrepareResources}", setup=("release: {call: NodePrepareResources}",),
            shows=("not (NodePrepareResources released)",)),
    Control("pod", DRA, holds="pod: {name: p, phase: Running}", fails="pod: {name: p, phase: Pending}",
            shows=("not (pod p: phase Running", "); pod p: phase Running")),
    Control("cdi", DRA, holds="cdi: {pod: p, present: true}", fails="cdi: {pod: p, present: false}",
            shows=("not (CDI devices of p's own claims still defined: 1 of 1 (", "CDI devices of p: 1 of 1 defined")),
    Control("pod_resources", DRA, holds="pod_resources: {pod: p, devices: 1, present: true}",
            fails="pod_resources: {pod: p, via: Get, devices: {at_least: 2}}",
            shows=("not (PodResources Get: pod p gpu.fakelet.example.com devices 1 (wanted at least 2)); "
                   "PodResources List: pod p listed, gpu.fakelet.example.com devices 1 (wanted equals 1)",)),
    Control("resources_status", DRA, holds="resources_status: {pod: p, health: Healthy}",
            fails="resources_status: {pod: p, health: Unhealthy}",
            shows=("not (allocatedResourcesStatus of p: Healthy); allocatedResourcesStatus of p: Healthy",)),
    Control("calls", DRA, holds="calls: {method: NodePrepareResources, count: 1}",
            fails="calls: {method: NodeUnprepareResources, count: {at_least: 1}}",
            shows=("not (NodeUnprepareResources calls 0 (wanted at least 1)); NodePrepareResources calls 1 "
                   "(wanted equals 1)",)),
    Control("checkpoint", DRA, holds="checkpoint: {claims: 1, devices: 1}", fails="checkpoint: {claims: {at_least: 2}}",
            shows=("not (DRA checkpoint: claims 1 (wanted at least 2)); DRA checkpoint: claims 1 (wanted equals 1), "
                   "devices 1 (wanted equals 1)",)),
    Control("cdi", DRA, holds="pod: {name: p, phase: Deleted}, cdi: {pod: p, present: false}",
            fails="cdi: {pod: p, present: true}", setup=("pod: {delete: p}",),
            shows=("not (CDI devices of p: 0 of 1 defined); pod p: phase Deleted",
                   "; CDI devices of p's own claims still defined: 0 of 1")),
    Control("pod_resources", DRA, holds="pod_resources: {pod: p, via: Get, present: false}",
            fails="pod_resources: {pod: p, present: true}",
            shows=("not (PodResources List: pod p not listed); PodResources Get: pod p not found",)),
    Control("calls", DRA, holds="calls: {method: NodeUnprepareResources, count: 1}",
            shows=("NodeUnprepareResources calls 1 (wanted equals 1)",)),
    # A failed device: the driver taints it NoExecute and reports it Unhealthy (harness/reference/dra_driver.py).
    # The negative is judged first, so the positive `only` (which no taint at all would meet) is judged on the
    # slices that show the taint.
    Control("taints", DRA, holds="taints: {only: ['@1'], no_execute: ['@1']}", fails="taints: {only: ['@0']}",
            setup=("device: {fail: '@1'}",),
            shows=("not (taints on gpu-1: gpu.fakelet.example.com/unhealthy:NoExecute (allowed only on gpu-0)); "
                   "the driver's taints on gpu-1",)),
    Control("device_health", DRA, holds="device_health: {unhealthy: ['@1'], healthy: ['@0']}",
            fails="device_health: {healthy: ['@1']}",
            shows=("not (the kubelet holds gpu-1 Unhealthy (wanted Healthy)); device health: gpu-0 Healthy, "
                   "gpu-1 Unhealthy",)),
)


def scenario(kind: str) -> str:
    steps = ["- kubelet: start"] + [s for c in CONTROLS if c.kind == kind for s in c.steps()]
    body = "\n".join("  " + line for step in steps for line in step.splitlines())
    return (f"title: every condition's controls, {kind}\n"
            "correct: each positive control holds and each negative one is judged false\n"
            "bug: a condition gives a wrong verdict\n"
            f"kind: {kind}\nsubject: {SUBJECTS[kind]}\nnodes: [fake, real]\nsteps:\n{body}\n")


def applies(condition: str, kind: str) -> bool:
    return (kind == DRA or condition not in DRA_ONLY) and (kind == DP or condition not in DP_ONLY)


# -- the table -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", [DP, DRA])
def test_the_table_judges_every_condition_both_ways(kind: str) -> None:
    """Each condition of the language that applies to the kind is judged true by one control and false by one
    (`not` itself by every negative), and each kind's scenario loads."""
    wanted = {c for c in CONDITIONS if c != "not" and applies(c, kind)}
    mine = [c for c in CONTROLS if c.kind == kind]
    true = {name for c in mine for name in c.judged()[0]}
    false = {name for c in mine for name in c.judged()[1]}
    assert wanted - true == set(), f"no positive control for {sorted(wanted - true)}"
    assert wanted - false == set(), f"no negative control for {sorted(wanted - false)}"
    assert {c.condition for c in mine} == wanted
    assert all(c.shows for c in mine)
    loads(scenario(kind), f"{kind}.yaml")


# -- on each kubelet -------------------------------------------------------------------------------------------

def real_cases() -> list[Any]:
    """The default real-kubelet env's two runs (each kind on the default release); tox -e fidelity adds 1.37."""
    releases: list[str | None] = [None] + (["1.37"] if os.environ.get(FIDELITY_ENV) == "full" else [])
    return [pytest.param(kind, "real", release, marks=pytest.mark.real_kubelet,
                         id=f"{kind}-real" + (f"-{release}" if release else ""))
            for release in releases for kind in (DP, DRA)]


@pytest.mark.parametrize(("kind", "node", "release"),
                         [pytest.param(DP, "fake", None, id=f"{DP}-fake"),
                          pytest.param(DRA, "fake", None, id=f"{DRA}-fake"), *real_cases()])
def test_each_control_gives_its_verdict(kind: str, node: str, release: str | None, tmp_path: Path) -> None:
    path = tmp_path / f"controls-{kind}.yaml"
    path.write_text(scenario(kind))
    args = ["--node", node, *(["--kubelet-version", release] if release else [])]
    code, output, report = scenario_run(tmp_path / "out", path, *args)
    check = (report.get("checks") or [{}])[0]
    detail = str(check.get("detail", "")).removeprefix(f"{INCONCLUSIVE}: ")
    if outcome_of(report) == INCONCLUSIVE and (detail.startswith(NO_REAL_NODE) or check.get("install")):
        pytest.skip(detail.splitlines()[0])  # this machine cannot run the node, and says why
    assert code == 0 and outcome_of(report) == NOT_REPRODUCED, output
    for control in (c for c in CONTROLS if c.kind == kind):
        for shown in control.shows:
            assert any(part in output for part in shown.split("|")), (control, shown, output)


# -- where the node cannot know: inconclusive, with the reason ----------------------------------------------------

class NotTheFakeKubelet:
    """A node that is not the fake kubelet, with nothing of its own recorded: no relay, no health cache, no
    PodResources socket in reach, no kubelet file fakelet can read."""

    running = True
    instance = 1

    def kubelet_file(self, name: str) -> Path | None:
        return None


def bare_stage(tmp_path: Path, is_dra: bool) -> Any:
    env = SimpleNamespace(timeline=Timeline(), node=NotTheFakeKubelet(), spec=SimpleNamespace(resource=RESOURCE),
                          sandbox=SimpleNamespace(plugin_dir=tmp_path), driver="gpu.fakelet.example.com",
                          is_mine=lambda e: False, slices=lambda: [])

    def kubelet_claims() -> list[Any]:
        raise AssertionError("this node's kubelet checkpoint cannot be read from here")

    env.kubelet_claims = kubelet_claims
    pods = {"p": SimpleNamespace(name="p", key="uid-p", api=None)}
    return SimpleNamespace(env=env, began_ns=0, step_began_ns=0, is_dra=is_dra, _pod=pods.__getitem__,
                           held_calls={}, device=lambda ref: ref)


@pytest.mark.parametrize(("is_dra", "condition", "reason"), [
    (False, {"calls": {"method": "Allocate", "count": 0}},
     "the kubelet's calls to the plugin cannot be seen: the real kubelet's wire was not recorded"),
    (True, {"dialed": {"socket": DRA_SOCKET, "count": 0}},
     "the sockets the kubelet dialed cannot be seen: the real kubelet's wire was not recorded"),
    (True, {"device_health": {"healthy": ["gpu-0"]}}, "device_health reads the kubelet's DRAResourceHealth cache"),
    (False, {"pod_resources": {"pod": "p", "present": True}}, "PodResources socket is out of fakelet's reach"),
    (True, {"checkpoint": {"claims": 0}}, "this node's kubelet checkpoint cannot be read from here"),
    (False, {"checkpoint": {"pod": "p", "devices": 0}}, "the device-manager checkpoint cannot be read from here"),
    (True, {"held": {"call": "NodePrepareResources"}}, "held: no NodePrepareResources was armed"),
])
def test_where_the_node_cannot_know_the_verdict_is_inconclusive_with_the_reason(
        tmp_path: Path, is_dra: bool, condition: dict[str, Any], reason: str) -> None:
    # The device manager's checkpoint there but not a file fakelet can read (a directory in its place).
    (tmp_path / dp_checkpoint.CHECKPOINT_NAME).mkdir()
    conditions = Conditions(bare_stage(tmp_path, is_dra))
    with pytest.raises(Inconclusive) as err:
        conditions.holds(condition)
    assert reason in str(err.value), str(err.value)
    # Under `not` too: a verdict the node cannot give is no verdict either way.
    with pytest.raises(Inconclusive):
        conditions.holds({"not": condition})


@pytest.mark.parametrize(("release", "verdict"), [("1.35", None), ("1.36", False)])
def test_a_dra_pods_health_status_on_a_kubelet_that_posts_none(tmp_path: Path, release: str,
                                                               verdict: bool | None) -> None:
    """The fake kubelet of a release whose ResourceHealthStatus gate is off by default (1.35) never posts a DRA
    pod's allocatedResourcesStatus: inconclusive, naming the gate, not Unhealthy-or-Healthy false; one with the
    gate on (1.36) that has not posted it yet: false."""
    from harness.node.fake import FakeNode
    from harness.spec.profiles import FAST

    node = FakeNode(tmp_path / "dp", tmp_path / "state", Timeline(), FAST, kubelet_version=versions.get(release))
    node.manager = object()  # type: ignore[assignment]  # running
    node.dra = SimpleNamespace(health_services=versions.get(release).health_versions)  # type: ignore[assignment]
    posted = {"status": {"containerStatuses": [{"name": "c"}]}}  # no allocatedResourcesStatus
    env = SimpleNamespace(timeline=node.timeline, node=node, client=SimpleNamespace(get=lambda path: posted))
    pod = SimpleNamespace(name="p", key="uid-p", api={"metadata": {"namespace": "n", "name": "p"}})
    stage = SimpleNamespace(env=env, began_ns=0, step_began_ns=0, is_dra=True, _pod=lambda name: pod)
    conditions = Conditions(stage)  # type: ignore[arg-type]
    if verdict is None:
        with pytest.raises(Inconclusive) as err:
            conditions.holds({"not": {"resources_status": {"pod": "p", "health": "Unhealthy"}}})
        assert str(err.value) == ("resources_status of p: kubelet 1.35 posts no allocatedResourcesStatus: its "
                                  "ResourceHealthStatus feature gate is off"), str(err.value)
    else:
        assert conditions.holds({"resources_status": {"pod": "p", "health": "Healthy"}}) == (
            False, "allocatedResourcesStatus of p: none")
