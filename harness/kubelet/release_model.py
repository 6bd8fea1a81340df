"""What the fake kubelet's model of a release is, said for people.

The fake kubelet is one program. It stands in for a release (`--kubelet-version 1.33`, a scenario case's
`kubelet_version: "1.33"`) only through the fields of versions.KubeletVersion: the DRA and health services it
negotiates, and a few named behaviours read in that release's sources. Everything else it does is the same
whatever the release. So "not reproduced on the fake 1.33" is a verdict on this model of 1.33, not evidence
about a real 1.33 kubelet: the narration and report of a scenario run, and of a `fakelet run` of checks, list
these behaviours wherever a run asks the fake for a release (harness/run/commands.py), and
docs/reference/scenario-file.md tabulates them.

One entry per field of KubeletVersion (tests/test_scenario_reference.py fails when a field has none), each
with the subjects it concerns: a device plugin meets only the device manager's behaviours.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from harness.kubelet.versions import PICK_KUBELET_ORDER, KubeletVersion

DP, DRA = "device-plugin", "dra"
SOURCE = "harness/kubelet/versions.py"


@dataclass(frozen=True)
class Behaviour:
    """One named behaviour of the fake kubelet that follows the release it stands in for."""

    title: str  # what it is, as a table's row names it
    kinds: tuple[str, ...]  # the subjects that meet it
    says: Callable[[KubeletVersion], str]  # what this release's model does


def _listed(services: tuple[str, ...], none: str = "none") -> str:
    return ", ".join(services) if services else none


def _health_opened(v: KubeletVersion) -> str:
    if not (v.health_versions or v.gated_health_versions):
        return "never (no health stream in this release)"
    if v.health_needs_advertising:
        return "only for a driver that advertises a health service"
    return "for every driver, advertised or not (retried while it answers Unimplemented)"


BEHAVIOURS: dict[str, Behaviour] = {
    "dra_services": Behaviour("DRA services accepted", (DRA,), lambda v: _listed(v.dra_services)),
    "dra_pick": Behaviour("DRA service chosen by", (DRA,),
                          lambda v: f"the {'kubelet' if v.dra_pick == PICK_KUBELET_ORDER else 'driver'}'s order"),
    "dra_fallback": Behaviour("a driver advertising no known service", (DRA,),
                              lambda v: f"taken as {v.dra_fallback}" if v.dra_fallback else "refused"),
    "health_versions": Behaviour("DRAResourceHealth called (default feature gates)", (DRA,),
                                 lambda v: _listed(v.health_versions)),
    "gated_health_versions": Behaviour("DRAResourceHealth with ResourceHealthStatus on", (DRA,),
                                       lambda v: _listed(v.gated_health_versions)),
    "health_needs_advertising": Behaviour("health stream opened", (DRA,), _health_opened),
    "health_stop_on_unimplemented": Behaviour(
        "a health stream answered Unimplemented", (DRA,),
        lambda v: "(no health stream)" if not (v.health_versions or v.gated_health_versions) else
        "not opened again" if v.health_stop_on_unimplemented else "opened again (retried)"),
    "replace_on_reregister": Behaviour(
        "a driver's second registration", (DRA,),
        lambda v: "replaces the first" if v.replace_on_reregister else
        "kept beside it, per endpoint (the same endpoint twice is refused)"),
    "health_message": Behaviour("the driver's health message in a pod's allocatedResourcesStatus", (DRA,),
                                lambda v: "shown" if v.health_message else "not shown"),
    "dp_endpoints_per_socket": Behaviour(
        "device-plugin clients", (DP,),
        lambda v: "kept per socket: a stream that ends drops its own socket's client (kubernetes#121994 fixed)"
        if v.dp_endpoints_per_socket else "one per resource: any stream that ends drops the current client "
        "(kubernetes#121994)"),
    "prepare_resets_devices": Behaviour(
        "a claim prepared again", (DRA,),
        lambda v: "replaces the driver's devices in the checkpoint (kubernetes#140471 fixed)"
        if v.prepare_resets_devices else "appends its devices to the checkpoint again (kubernetes#140471)"),
}


def behaviour_fields() -> list[str]:
    """KubeletVersion's fields that make up a release's model (all but its name)."""
    return [f.name for f in dataclasses.fields(KubeletVersion) if f.name != "name"]


def behaviours(version: KubeletVersion, kind: str | None = None) -> list[str]:
    """`title: what this release's model does`, for each behaviour a `kind` of subject meets (every one: None)."""
    return [f"{b.title}: {b.says(version)}" for b in BEHAVIOURS.values() if kind is None or kind in b.kinds]


def model_note(version: KubeletVersion, kind: str) -> str:
    """One paragraph: the fake kubelet stands in for `version` only through its named behaviours, listed."""
    name = version.name
    listed = behaviours(version, kind)
    only = (f"only through {'this named behaviour' if len(listed) == 1 else 'these named behaviours'} "
            f"({SOURCE}): {'; '.join(listed)}") if listed else "through no behaviour this subject meets"
    return (f"the fake kubelet models {name} {only}. Everything else it does is the same whatever the release, so "
            f"an outcome here is evidence about this model of {name}, not about a real {name} kubelet (--node real "
            "runs one)")
