"""DP-NODE: the plugin judged by what any kubelet shows of it, so the same check runs on both kubelets.

These checks read only what a cluster operator sees: the Node's capacity and
allocatable, and what a pod's container got from the runtime. They never look
at the gRPC wire, so they run unchanged on the fake kubelet and on a real one
(`fakelet run --node real`), and `fakelet fidelity` compares the two verdicts.
Each one also measures the reaction it waited for (registration,
re-registration after a restart, health), for the fidelity table.
"""

from __future__ import annotations

import stat
import time
from collections.abc import Callable
from pathlib import Path

from harness.instruments.timeline import Event, WaitTimeout
from harness.node.interface import AdmissionError
from harness.node.real.configs import STATE_HOLD_S
from harness.node.real.view import device_number
from harness.spec.checks import MUST, check, expect, not_exercised
from harness.world.cdispecs import edits_of
from harness.world.env import DPEnv
from harness.world.probe import ProbeClient

Test = Callable[[int | None, int | None], bool]
HOLD_S = STATE_HOLD_S  # a state must outlast one real node-status period to count (wait_held)


def device_count(env: DPEnv) -> int | None:
    """The devices the plugin should advertise, when the subject says (or its inventory implies) how many."""
    return env.expected_count


def all_advertised(n: int | None) -> Test:
    if n is None:
        return lambda cap, alloc: bool(alloc) and cap == alloc
    return lambda cap, alloc: cap == n and alloc == n


def describe(n: int | None) -> str:
    return f"capacity and allocatable {n}" if n is not None else "allocatable above 0, equal to capacity"


def wait_held(env: DPEnv, test: Test, since_ns: int, awaiting: str) -> Event:
    """The first time the Node's capacity and allocatable pass `test` and keep passing for HOLD_S.

    Held, not glimpsed: the real kubelet reports node status once a period, so a state that lasts
    less than that (devices listed, then the stream closed 0.1 s later) never reaches the API server;
    the fake kubelet, which sees every change, is held to the same."""
    deadline = time.monotonic() + env.profile.reaction_s
    resource = env.spec.resource
    while True:
        try:
            reached = env.node.wait_resource(resource, test, since_ns, max(deadline - time.monotonic(), 0.001),
                                             awaiting)
        except WaitTimeout as err:  # it names what was left of the bound after a broken hold; say the bound
            raise WaitTimeout(err.awaiting, env.profile.reaction_s, err.seen, env.timeline.origin_ns) from None
        # The hold runs from the moment the state was reached, not from when it was seen.
        left = HOLD_S - (env.now() - reached.t_ns) / 1e9
        try:
            broken = env.node.wait_resource(resource, lambda cap, alloc: not test(cap, alloc), reached.t_ns,
                                            max(left, 0.001), "")
        except WaitTimeout:
            return reached
        since_ns = broken.t_ns
        if time.monotonic() >= deadline:
            raise AssertionError(f"expected {awaiting}, held for {HOLD_S:g}s; it held only until "
                                 f"{env.at(broken)} ({broken.get('capacity', '')} {broken.get('allocatable', '')})"
                                 .rstrip())


def wait_advertised(env: DPEnv, since_ns: int, after: str) -> Event:
    n = device_count(env)
    return wait_held(env, all_advertised(n), since_ns, f"{env.spec.resource} with {describe(n)} on the Node {after}")


def started(env: DPEnv) -> Event:
    """Kubelet first, then the plugin; the Node advertising every device, timed from the plugin's start."""
    env.start_kubelet()
    t = env.now()
    env.start_subject()
    env.wait_started(t)  # under a shortened bound the start-up has its own (env.py), and T runs from Register
    event = wait_advertised(env, t, "after the plugin started")
    env.measure("registration", event, t)
    return event


@check("DP-NODE-01", MUST, "the Node advertises the plugin's devices: capacity and allocatable reach its device "
       "count within T", real_kubelet=True, kind=True)
def test_node_advertises_devices(dp_env: DPEnv) -> None:
    started(dp_env)


@check("DP-NODE-02", MUST, "after a kubelet restart (its sockets deleted by the kubelet), the Node advertises every "
       "device again within T", real_kubelet=True, kind=True)
def test_node_advertises_after_restart(dp_env: DPEnv) -> None:
    env = dp_env
    started(env)
    t = env.now()
    env.node.restart_kubelet()
    event = wait_advertised(env, t, "from the restarted kubelet")
    env.measure("re-registration after restart", event, t)


@check("DP-NODE-03", MUST, "a device that fails leaves allocatable within T, and comes back once it recovers",
       real_kubelet=True)
def test_node_follows_health(dp_env: DPEnv) -> None:
    env = dp_env
    if env.devices is None:
        not_exercised("fakelet drives no fake hardware for this subject (give it --inventory or a backend)")
    started(env)
    # Whether the plugin reads a health source is known for sure only later: a plugin that polls
    # (Intel's asks its sidecar every 5 s) may not have asked yet when the Node first shows its
    # devices. So the failure is injected either way, and coverage is decided by what happened.
    held = env.drives("health")
    n = device_count(env)
    if n is None:
        not_exercised("the subject gives no device count, so one device fewer cannot be told on the Node")
    target = env.hardware()[0].id
    resource = env.spec.resource
    t = env.now()
    env.devices.fail(target)
    try:
        down = wait_held(env, lambda cap, alloc: alloc == n - 1, t,
                         f"allocatable {n - 1} of {resource} on the Node after {target} failed")
    except AssertionError:
        if not held:
            # Still no health source read, T after the failure: not exercised, not a failure.
            env.require_drive("health", since_ns=t)
        raise
    env.measure("health: failure to allocatable", down, t)
    t = env.now()
    env.devices.recover(target)
    up = wait_held(env, lambda cap, alloc: alloc == n, t,
                   f"allocatable {n} of {resource} on the Node after {target} recovered")
    env.measure("health: recovery to allocatable", up, t)


def plugin_socket(env: DPEnv) -> Path:
    """The plugin's own socket in the device-plugins dir (the subject's, or the only other socket there)."""
    if env.spec.socket:
        return env.sandbox.plugin_dir / env.spec.socket
    sockets = [p for p in env.sandbox.plugin_dir.iterdir()
               if p.name != "kubelet.sock" and stat.S_ISSOCK(p.lstat().st_mode)]
    if len(sockets) != 1:
        not_exercised(f"cannot tell the plugin's socket among {sorted(p.name for p in sockets)}")
    return sockets[0]


@check("DP-NODE-04", MUST, "a pod asking for one device runs, and its container gets the device nodes, mounts and "
       "env that Allocate gives for that device", real_kubelet=True)
def test_pod_gets_its_device(dp_env: DPEnv) -> None:
    env = dp_env
    started(env)
    resource = env.spec.resource
    try:
        allocations = env.node.admit_pod("pod", {resource: 1})
        env.node.start_pod("pod")
        got = env.node.container_view("pod")
    except AdmissionError as err:
        raise AssertionError(f"expected a running container with one {resource} device; saw: {err}") from None
    ids = [i for a in allocations if a.resource == resource for i in a.device_ids] or \
        env.node.pod_devices("pod").get(resource, [])
    expect(len(ids) == 1, f"one {resource} device for the pod", f"{ids}")
    # What the plugin answers for that device, asked directly (a conformant plugin answers alike each time).
    with ProbeClient(str(plugin_socket(env)), env.timeline) as probe:
        wanted = probe.allocate([ids]).container_responses[0]
    for d in wanted.devices:
        number = device_number(d.host_path)
        expect(got.devices.get(d.container_path) == number,
               f"device {d.container_path} ({d.host_path}, {number[0]}:{number[1]}) in the container",
               f"{got.devices.get(d.container_path, 'no such device')}")
    for m in wanted.mounts:
        expect(got.mounts.get(m.container_path) == m.host_path,
               f"mount {m.host_path} at {m.container_path}", f"{got.mounts.get(m.container_path, 'no such mount')}")
    for key, value in wanted.envs.items():
        expect(got.env.get(key) == value, f"env {key}={value}", f"{key}={got.env.get(key)}")
    # A CDI device no spec defines refused the container above, on the fake kubelet as on containerd 2. Where the
    # runtime applied them (the real node's containerd 2), each device's env edits are in the container too.
    names = [c.name for c in wanted.cdi_devices]
    if got.cdi_applied and names:
        judged = []
        for name in names:
            for edits in edits_of(env.sandbox.cdi_dir, name):
                for item in edits.get("env") or []:
                    key, _, value = str(item).partition("=")
                    expect(got.env.get(key) == value, f"env {key}={value} from CDI device {name}",
                           f"{key}={got.env.get(key)}")
                    judged.append(key)
        env.note(f"CDI devices {', '.join(names)} applied by the runtime: {', '.join(judged) or 'no env edits'} "
                 "in the container")
    env.node.delete_pod("pod")
