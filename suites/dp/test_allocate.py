"""DP-ALC: Allocate, GetPreferredAllocation and PreStartContainer."""

from __future__ import annotations

import os
import re
from concurrent.futures import ThreadPoolExecutor

import grpc

from harness.instruments.timeline import Event
from harness.node.interface import AdmissionError
from harness.spec.checks import MUST, SHOULD, check, expect, not_applicable
from harness.wire import dp
from harness.world.env import DPEnv

CONCURRENT_ALLOCATES = 16  # checks.md DP-ALC-06
# core/v1 validation: env names are C identifiers extended with '-' and '.' (IsEnvVarName).
ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
# CDI fully-qualified device name: vendor.com/class=name (tags.cncf.io/container-device-interface parser).
CDI_NAME = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9.\-]*/[a-zA-Z0-9][a-zA-Z0-9_.\-]*=[a-zA-Z0-9][a-zA-Z0-9_.:\-]*$")


def ready(env: DPEnv, need: int = 1) -> tuple[Event, list[str]]:
    """Registered, with a settled list of at least `need` healthy devices (else not exercised)."""
    env.start()
    reg, listing = env.registered_and_listed()
    return reg, env.need_devices(listing, need)


@check("DP-ALC-01", MUST, "Allocate returns one ContainerAllocateResponse per container request")
def test_one_response_per_container(dp_env: DPEnv) -> None:
    env = dp_env
    reg, ids = ready(env)
    t = env.now()
    try:
        env.node.admit_pod("pod-alc-01", {env.spec.resource: 1})
    except AdmissionError as err:
        raise AssertionError(f"expected the pod to be admitted; saw: {err}") from None
    calls = env.timeline.find(lambda e: e.kind == "grpc.call" and e.get("method") == "Allocate"
                              and e.source == "kubelet", t)
    expect(bool(calls), "the kubelet's Allocate call for the admitted pod", "no Allocate call on the wire")
    call = calls[-1]
    got = len(call.get("response", {}).get("container_responses", []))
    expect(got == 1, "1 container response to the kubelet's 1 container request", f"{got} at {env.at(call)}")
    with env.probe(reg) as probe:
        # A one-device plugin gets the same device in both requests: the answer is still one per request.
        resp = probe.allocate([[ids[0]], [ids[1 % len(ids)]]])
    expect(len(resp.container_responses) == 2, "2 container responses to 2 container requests",
           f"{len(resp.container_responses)}")


@check("DP-ALC-02", MUST, "Allocate with an unknown device ID returns a gRPC error")
def test_unknown_id_is_error(dp_env: DPEnv) -> None:
    env = dp_env
    reg, _ids = ready(env)
    with env.probe(reg) as probe:
        try:
            resp = probe.allocate([["fakelet-no-such-device"]])
        except grpc.RpcError as err:
            expect(err.code() != grpc.StatusCode.DEADLINE_EXCEEDED, "a prompt error",  # type: ignore[attr-defined]
                   "no answer before the deadline")
            return
    raise AssertionError(f"expected a gRPC error for device 'fakelet-no-such-device'; saw success: "
                         f"{len(resp.container_responses)} container response(s)")


def response_problems(resp: dp.ContainerAllocateResponse, host_root_ok: bool) -> list[str]:
    problems = [f"env name {k!r} is invalid" for k in resp.envs if not ENV_NAME.match(k)]
    for m in resp.mounts:
        if not m.container_path.startswith("/"):
            problems.append(f"mount container_path {m.container_path!r} is not absolute")
        if not m.host_path.startswith("/"):
            problems.append(f"mount host_path {m.host_path!r} is not absolute")
    for d in resp.devices:
        if not d.container_path.startswith("/"):
            problems.append(f"device container_path {d.container_path!r} is not absolute")
        if not d.permissions or set(d.permissions) - set("rwm"):
            problems.append(f"device permissions {d.permissions!r} are not drawn from 'rwm'")
        if host_root_ok and not os.path.exists(d.host_path):
            problems.append(f"device host_path {d.host_path!r} does not exist")
    problems += [f"CDI device {c.name!r} is not fully qualified (vendor.com/class=name)"
                 for c in resp.cdi_devices if not CDI_NAME.match(c.name)]
    return problems


@check("DP-ALC-03", SHOULD, "Allocate responses are well formed")
def test_response_well_formed(dp_env: DPEnv) -> None:
    env = dp_env
    reg, ids = ready(env)
    with env.probe(reg) as probe:
        resp = probe.allocate([[ids[0]]])
    expect(len(resp.container_responses) == 1, "one container response", f"{len(resp.container_responses)}")
    # Host paths are only meaningful from here when the plugin sees our file system where it names it:
    # its own (process), or a container with the sandbox bound at the same path.
    problems = response_problems(resp.container_responses[0], env.spec.launcher in ("process", "container"))
    expect(not problems, "a well-formed response", "; ".join(problems))


@check("DP-ALC-04", MUST, "GetPreferredAllocation returns a subset of the right size with every must-include ID")
def test_preferred_allocation(dp_env: DPEnv) -> None:
    env = dp_env
    env.start()
    reg = env.wait_registered()
    if not reg.get("served_options", {}).get("get_preferred_allocation_available"):
        not_applicable("the plugin does not offer GetPreferredAllocation")
    ids = env.need_devices(env.settled(reg), 1)
    must, size = [ids[-1]], min(2, len(ids))
    with env.probe(reg) as probe:
        resp = probe.preferred(ids, must, size)
    expect(len(resp.container_responses) == 1, "one container response", f"{len(resp.container_responses)}")
    got = list(resp.container_responses[0].deviceIDs)
    problems = []
    if not set(got) <= set(ids):
        problems.append(f"IDs {sorted(set(got) - set(ids))} are not available")
    if not set(must) <= set(got):
        problems.append(f"must-include {must} missing")
    if len(got) != size:
        problems.append(f"{len(got)} devices instead of {size}")
    expect(not problems, f"{size} of {ids} including {must}", f"{got}: {'; '.join(problems)}")


@check("DP-ALC-05", MUST, "PreStartContainer, when required, answers within the kubelet's deadline")
def test_prestart(dp_env: DPEnv) -> None:
    env = dp_env
    env.start()
    reg = env.wait_registered()
    if not reg.get("served_options", {}).get("pre_start_required"):
        not_applicable("the plugin does not require PreStartContainer")
    env.need_devices(env.settled(reg), 1)
    try:
        env.node.admit_pod("pod-alc-05", {env.spec.resource: 1})
    except AdmissionError as err:
        raise AssertionError(f"expected the pod to be admitted; saw: {err}") from None
    try:
        env.node.start_pod("pod-alc-05")
    except AdmissionError as err:
        raise AssertionError(f"expected PreStartContainer to answer within {env.profile.prestart_timeout_s:g}s; "
                             f"saw: {err}") from None


@check("DP-ALC-06", SHOULD, "16 concurrent Allocate calls are all answered correctly")
def test_concurrent_allocate(dp_env: DPEnv) -> None:
    env = dp_env
    reg, ids = ready(env)
    with env.probe(reg) as probe:
        baseline = {i: probe.allocate([[i]]) for i in ids}
        wanted = [ids[n % len(ids)] for n in range(CONCURRENT_ALLOCATES)]
        with ThreadPoolExecutor(CONCURRENT_ALLOCATES) as pool:
            results = list(pool.map(lambda i: (i, _try_allocate(probe, i)), wanted))
    wrong = [f"{i}: {r}" for i, r in results if isinstance(r, str)]
    wrong += [f"{i}: answered with another device's response" for i, r in results
              if not isinstance(r, str) and r != baseline[i]]
    expect(not wrong, f"{CONCURRENT_ALLOCATES} answers, each equal to the sequential answer for its device",
           "; ".join(wrong[:5]) + (f" (+{len(wrong) - 5} more)" if len(wrong) > 5 else ""))


def _try_allocate(probe, device_id: str) -> dp.AllocateResponse | str:
    try:
        return probe.allocate([[device_id]])
    except grpc.RpcError as err:
        return f"error {err.code().name}"  # type: ignore[attr-defined]
