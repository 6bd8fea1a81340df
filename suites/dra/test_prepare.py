"""DRA-PRP: NodePrepareResources and NodeUnprepareResources, as the kubelet calls them.

The harness plays the scheduler first: the claim is allocated from the
driver's own ResourceSlices and reserved for a pod through the API server,
so a driver that reads its claims sees exactly what a cluster would give it.
"""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import grpc

from harness.spec.checks import MUST, check, expect
from harness.world.cdispecs import defined_devices
from harness.world.draenv import DRAEnv
from suites.dra.common import device_set, prepared, published

# CDI qualified device name "vendor/class=name" (tags.cncf.io/container-device-interface parser.go:
# vendor is a domain-like name, class and name allow letters, digits, '_', '-', '.' and name ':').
CDI_QUALIFIED = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.-]*[A-Za-z0-9])?/[A-Za-z0-9]([A-Za-z0-9_.-]*[A-Za-z0-9])?"
                           r"=[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?$")
REQUEST = "req-0"  # the one request the harness's claims make (harness/controlplane/allocator.py)


@check("DRA-PRP-01", MUST,
       "prepare returns the allocated devices, by pool and name, with qualified CDI IDs its CDI specs define")
def test_prepare_result(dra_env: DRAEnv) -> None:
    env = dra_env
    _, claim, result = prepared(env)
    want = env.allocated_devices(claim, env.driver)
    expect(device_set(result) == want, f"devices {want} (the allocation)", str(device_set(result)))
    for device in result["devices"]:
        expect(device["cdi_ids"], f"CDI IDs for {device['device']}", "none")
        bad = [c for c in device["cdi_ids"] if not CDI_QUALIFIED.match(c)]
        expect(not bad, "fully qualified CDI IDs 'vendor/class=name'", str(bad))
        expect(REQUEST in device["requests"], f"request name {REQUEST!r} for {device['device']}",
               str(device["requests"]))
    # What prepare returns goes to the runtime as is: containerd 2 and CRI-O fail the container ("CDI device
    # injection failed: unresolvable CDI devices") when no spec in the node's CDI dirs defines an ID. The spec must
    # be there when prepare answers: the kubelet hands the IDs on at once, and upstream's kubeletplugin helper
    # writes before it answers.
    defined = defined_devices(Path(env.sandbox.cdi_dir))
    undefined = sorted({c for d in result["devices"] for c in d["cdi_ids"] if CDI_QUALIFIED.match(c)} - set(defined))
    expect(not undefined, "every CDI ID defined by a spec file in the node's CDI dir (the device's kind and name)",
           f"unresolvable: {undefined}; the specs there define {sorted(defined) or 'nothing'}")


@check("DRA-PRP-02", MUST, "prepare is idempotent: a second identical call returns the same result")
def test_prepare_idempotent(dra_env: DRAEnv) -> None:
    env = dra_env
    _, claim, first = prepared(env)
    uid = claim["metadata"]["uid"]
    again = env.conn().node_prepare([env.claim_ref(claim)], timeout_s=env.profile.dra_call_timeout_s)
    expect(uid in again and not again[uid]["error"], "the second prepare to succeed", repr(again.get(uid)))
    expect(again[uid]["devices"] == first["devices"], f"the same devices {first['devices']}",
           str(again[uid]["devices"]))


@check("DRA-PRP-03", MUST, "unprepare is idempotent, and unpreparing an unknown claim succeeds")
def test_unprepare_idempotent(dra_env: DRAEnv) -> None:
    env = dra_env
    _, claim, _ = prepared(env)
    ref = env.claim_ref(claim)
    conn, deadline = env.conn(), env.profile.dra_call_timeout_s
    for attempt in ("first", "second"):
        result = conn.node_unprepare([ref], timeout_s=deadline)
        expect(ref[1] in result and not result[ref[1]]["error"], f"the {attempt} unprepare to succeed",
               repr(result.get(ref[1])))
    unknown = (ref[0], str(uuid.uuid4()), "never-prepared")
    result = conn.node_unprepare([unknown], timeout_s=deadline)
    expect(unknown[1] in result and not result[unknown[1]]["error"], "unprepare of an unknown claim to succeed",
           repr(result.get(unknown[1])))


@check("DRA-PRP-04", MUST, "a batch is answered claim by claim: exactly the requested UIDs, one bad claim fails alone")
def test_batch(dra_env: DRAEnv) -> None:
    env = dra_env
    published(env)
    # Two good claims where the driver has two devices; a one-device driver still gets a mixed batch.
    offered = env.timeline.find(lambda e: e.kind == "api.slices")[-1].get("devices")
    pod = env.new_pod()
    good = [env.allocated_claim(pod, 1, name=f"claim{n}") for n in range(min(2, len(offered)))]
    bad = (env.node_name, str(uuid.uuid4()), "no-such-claim")
    refs = [env.claim_ref(c) for c in good] + [bad]
    result = env.conn().node_prepare(refs, timeout_s=env.profile.dra_call_timeout_s)
    expect(sorted(result) == sorted(r[1] for r in refs), f"results for exactly {sorted(r[1] for r in refs)}",
           str(sorted(result)))
    for claim in good:
        uid = claim["metadata"]["uid"]
        expect(not result[uid]["error"], f"claim {claim['metadata']['name']} prepared", repr(result[uid]["error"]))
        expect(device_set(result[uid]) == env.allocated_devices(claim, env.driver),
               f"its allocated devices {env.allocated_devices(claim, env.driver)}", str(device_set(result[uid])))
    expect(result[bad[1]]["error"], "an error for the claim that does not exist", "success")


@check("DRA-PRP-05", MUST, "prepare and unprepare answer within the kubelet's 45 s deadline")
def test_within_deadline(dra_env: DRAEnv) -> None:
    env = dra_env
    published(env)
    pod = env.new_pod()
    claim = env.allocated_claim(pod)
    ref, deadline = env.claim_ref(claim), env.profile.dra_call_timeout_s
    for call in ("node_prepare", "node_unprepare"):
        try:
            getattr(env.conn(), call)([ref], timeout_s=deadline)
        except grpc.RpcError as err:
            expect(err.code() != grpc.StatusCode.DEADLINE_EXCEEDED,
                   f"{call} to answer within {deadline:g}s", "DEADLINE_EXCEEDED")
            raise


def cdi_files(env: DRAEnv) -> set[str]:
    return {str(p.relative_to(env.sandbox.cdi_dir)) for p in Path(env.sandbox.cdi_dir).rglob("*") if p.is_file()}


@check("DRA-PRP-06", MUST, "after a plugin restart, earlier claims unprepare cleanly and prepare the same")
def test_survives_restart(dra_env: DRAEnv) -> None:
    env = dra_env
    published(env)
    pod, deadline = env.new_pod(), env.profile.dra_call_timeout_s
    claim = env.allocated_claim(pod)
    ref = env.claim_ref(claim)
    before = cdi_files(env)
    first = env.conn().node_prepare([ref], timeout_s=deadline)[ref[1]]
    expect(not first["error"], "the claim prepared", repr(first["error"]))
    written = cdi_files(env) - before
    t = env.now()
    env.subject.restart()
    env.wait_dra_registered(t)
    # Unprepare first: a driver that forgot the claim cannot clean up what it made for it.
    result = env.conn().node_unprepare([ref], timeout_s=deadline)[ref[1]]
    expect(not result["error"], "unprepare after the restart to succeed", repr(result["error"]))
    left = sorted(written & cdi_files(env))
    expect(not left, "the CDI specs of a claim prepared before the restart removed by its unprepare",
           f"still there: {left}")
    again = env.conn().node_prepare([ref], timeout_s=deadline)[ref[1]]
    expect(not again["error"], "the claim to prepare again after the restart", repr(again["error"]))
    expect(again["devices"] == first["devices"], f"the same devices {first['devices']}", str(again["devices"]))
