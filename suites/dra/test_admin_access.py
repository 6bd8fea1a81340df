"""DRA-ADM: admin access to devices (KEP-5018, DRAAdminAccess: GA in 1.36, beta and on by default in 1.34 and 1.35).

A claim whose request says `adminAccess: true` (taken by the API server only in a namespace labelled
`resource.kubernetes.io/admin-access: "true"`) gets a device for monitoring or management even while an ordinary
claim holds it: the scheduler allocates it regardless, marks the result `adminAccess: true`, and counts it as
holding nothing (harness/controlplane/admin.py has the upstream sources). The driver's part: prepare such a claim
although the device is prepared for another claim (its containers get the device too), never reset or
reconfigure the device for it, and keep each claim's preparation apart: unpreparing one claim leaves the other's
CDI devices defined, whichever of the two goes first.

fakelet labels the check's namespace, allocates an ordinary claim and, on the same device, admin-access claims
(fakelet's allocator, with upstream's rules), and calls NodePrepareResources and NodeUnprepareResources for each
claim on its own, as the kubelet does. Every driver can be asked this: admin access needs nothing published.
Where nothing of the driver's can be allocated, or the API server drops `adminAccess` (the gate off), the area is
not exercised.
"""

from __future__ import annotations

from typing import Any

from harness.controlplane import admin
from harness.controlplane.allocator import AllocationError
from harness.instruments.timeline import WaitTimeout
from harness.spec.checks import MUST, check, expect, not_exercised
from harness.world.cdispecs import edits_of
from harness.world.draenv import DRAEnv, short_id
from suites.dra.common import registered
from suites.dra.test_capacity import cdi_ids, prepare_alone

CHECKS = ("DRA-ADM-01", "DRA-ADM-02")
GATE_OFF = ("the API server dropped the request's adminAccess: DRAAdminAccess is off there (alpha and off by default "
            "in 1.32 and 1.33, beta and on from 1.34, GA from 1.36)")


def ordinary_claim(env: DRAEnv) -> tuple[dict[str, Any], dict[str, Any]]:
    """A one-device claim of the driver's, allocated and reserved for a pod of its own, and its result; not
    exercised when nothing of the driver's can be allocated."""
    env.need_api()
    registered(env)
    try:
        env.wait_allocatable(1)
    except WaitTimeout as err:
        not_exercised(f"the driver published no device to allocate: {err}")
    assert env.allocator is not None
    env.allocator.ensure_device_class(env.device_class, env.driver)
    claim = env.allocator.create_claim(env.node_name, f"user-{short_id()}", env.device_class, 1)
    try:
        claim = env.allocator.allocate(claim, env.node_name, env.driver, env.new_pod("user"))
    except AllocationError as err:
        not_exercised(f"nothing of the driver's could be allocated: {err}")
    result = next(r for r in claim["status"]["allocation"]["devices"]["results"] if r["driver"] == env.driver)
    return claim, result


def admin_claim(env: DRAEnv, pod: dict[str, str], device: str, label: str = "admin") -> dict[str, Any]:
    """An admin-access claim for exactly `device`, allocated and reserved for `pod`, in the check's namespace
    labelled to allow it (not exercised when the API server drops the field)."""
    assert env.allocator is not None
    admin.label_namespace(env.need_api(), env.node_name)
    claim = env.allocator.create_claim(env.node_name, f"{label}-{short_id()}", env.device_class, 1,
                                       admin_access=True)
    if not any(admin.requested(r.get("exactly") or {}) for r in claim["spec"]["devices"]["requests"]):
        not_exercised(GATE_OFF)
    try:
        claim = env.allocator.allocate(claim, env.node_name, env.driver, pod, only={device})
    except AllocationError as err:
        # Upstream still checks the counters a device consumes for admin access (allocator_incubating.go
        # allocateDevice): a partition whose counters the ordinary claim took does not fit. Not the driver's doing.
        not_exercised(f"an admin-access claim for {device} could not be allocated: {err}")
    results = claim["status"]["allocation"]["devices"]["results"]
    assert all(admin.granted(r) for r in results), f"fakelet's allocator gave {results}"  # harness invariant
    return claim


def device_nodes(edits: list[dict[str, Any]]) -> set[str]:
    return {str(n.get("path")) for e in edits for n in e.get("deviceNodes") or [] if isinstance(n, dict)}


def edits_by_id(env: DRAEnv, ids: list[str]) -> dict[str, list[dict[str, Any]]]:
    return {i: edits_of(env.sandbox.cdi_dir, i) for i in ids}


def undefined(env: DRAEnv, ids: list[str]) -> list[str]:
    return [i for i in ids if not edits_of(env.sandbox.cdi_dir, i)]


def unprepare_alone(env: DRAEnv, claim: dict[str, Any], what: str) -> None:
    uid = claim["metadata"]["uid"]
    gone = env.conn().node_unprepare([env.claim_ref(claim)], timeout_s=env.profile.dra_call_timeout_s)
    expect(uid in gone and not gone[uid]["error"], f"{what} unprepared", repr(gone.get(uid)))


def name_of(claim: dict[str, Any]) -> str:
    return str(claim["metadata"]["name"])


@check("DRA-ADM-01", MUST, "an admin-access claim on a device prepared for another claim is prepared, and the other "
                           "claim's preparation is left as it was")
def test_admin_claim_prepared_beside(dra_env: DRAEnv) -> None:
    env = dra_env
    claim, result = ordinary_claim(env)
    monitor = env.new_pod("monitor")
    device = result["device"]
    prepared = prepare_alone(env, claim, f"claim {name_of(claim)} on {device}")
    ids = cdi_ids(prepared)
    before = edits_by_id(env, ids)
    watcher = admin_claim(env, monitor, device)
    env.note(f"claim {name_of(claim)} holds {result['pool']}/{device}; admin-access claim {name_of(watcher)} "
             f"allocated the same device")
    granted = prepare_alone(env, watcher, f"admin-access claim {name_of(watcher)} on {device} (prepared for claim "
                                          f"{name_of(claim)}: admin access ignores ordinary claims)")
    admin_ids = cdi_ids(granted)
    expect(admin_ids, f"admin-access claim {name_of(watcher)} prepared with CDI device(s)", str(granted["devices"]))
    expect(device in {d["device"] for d in granted["devices"]}, f"the admin-access claim's Device naming {device}",
           str(sorted({d["device"] for d in granted["devices"]})))
    missing = undefined(env, admin_ids)
    expect(not missing, f"a CDI spec in the CDI directory defining each of {admin_ids}", f"none for {missing}")
    nodes = device_nodes([e for edits in before.values() for e in edits])
    if nodes:
        given = device_nodes([e for i in admin_ids for e in edits_of(env.sandbox.cdi_dir, i)])
        expect(nodes & given, f"the admin-access claim's CDI edits giving its container the device (a device node of "
                              f"{sorted(nodes)}, as claim {name_of(claim)}'s do)", str(sorted(given)) or "none")
    else:
        env.note(f"claim {name_of(claim)}'s CDI edits name no device node: what the admin-access claim's container "
                 f"gets of the device is not judged")
    after = edits_by_id(env, ids)
    lost = [i for i in ids if not after[i]]
    expect(not lost, f"claim {name_of(claim)}'s CDI device(s) {ids} still defined once the admin-access claim on "
                     f"{device} was prepared (its containers still use them)", f"{lost} gone from the CDI directory")
    changed = [i for i in ids if after[i] != before[i]]
    expect(not changed, f"claim {name_of(claim)}'s CDI edits as they were (the device is not reconfigured for an "
                        f"admin-access claim)", f"{changed} changed: {[after[i] for i in changed]}")


@check("DRA-ADM-02", MUST, "unpreparing an admin-access claim leaves the other claim on its device prepared, and "
                           "unpreparing the other claim leaves the admin-access claim's CDI devices defined")
def test_admin_claims_unprepared_apart(dra_env: DRAEnv) -> None:
    env = dra_env
    claim, result = ordinary_claim(env)
    monitor = env.new_pod("monitor")
    device = result["device"]
    # Two admin-access claims, all three prepared before anything is unprepared: the first goes before the
    # ordinary claim, the second after it.
    first, second = admin_claim(env, monitor, device, "admin-a"), admin_claim(env, monitor, device, "admin-b")
    ids = cdi_ids(prepare_alone(env, claim, f"claim {name_of(claim)} on {device}"))
    first_ids = cdi_ids(prepare_alone(env, first, f"admin-access claim {name_of(first)} on {device} (prepared for "
                                                  f"claim {name_of(claim)}: admin access ignores ordinary claims)"))
    second_ids = cdi_ids(prepare_alone(env, second, f"admin-access claim {name_of(second)} on {device}"))
    env.note(f"on {result['pool']}/{device}: claim {name_of(claim)} {ids}, admin-access claims {name_of(first)} "
             f"{first_ids} and {name_of(second)} {second_ids}")
    unprepare_alone(env, first, f"admin-access claim {name_of(first)}")
    lost = undefined(env, ids)
    expect(not lost, f"claim {name_of(claim)}'s CDI device(s) {ids} still defined after admin-access claim "
                     f"{name_of(first)} on {device} was unprepared (its containers still use them)",
           f"{lost} gone from the CDI directory")
    unprepare_alone(env, claim, f"claim {name_of(claim)}")
    lost = undefined(env, second_ids)
    expect(not lost, f"admin-access claim {name_of(second)}'s CDI device(s) {second_ids} still defined after claim "
                     f"{name_of(claim)} on {device} was unprepared (until it is unprepared itself)",
           f"{lost} gone from the CDI directory")
    unprepare_alone(env, second, f"admin-access claim {name_of(second)}")
