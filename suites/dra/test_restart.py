"""DRA-RST: kubelet restarts, plugin restarts, and a wiped registration directory."""

from __future__ import annotations

import os
from typing import Any

from harness.controlplane.scheduler import PodClaim
from harness.spec.checks import MUST, SHOULD, check, expect
from harness.world.draenv import DRAEnv
from suites.dra.common import is_socket, registered


def scheduled_while_down(env: DRAEnv) -> dict[str, Any] | None:
    """On a real kubelet that is stopped: a pod with a claim, allocated from the driver's slices and bound to
    the node, for the kubelet to run (and prepare) once it starts. None elsewhere.

    A real kubelet prepares claims only for a pod it runs, and its start deletes the node's ResourceSlices
    (dra_plugin_manager.go NewDRAPluginManager) until the driver publishes them again, which the kubeletplugin
    helper does only after its sync delay (30 s): a claim allocated before the start is prepared through the
    new connection whatever the slices do, which is what these checks judge."""
    if not env.real or env.client is None:
        return None
    env.wait_allocatable(1)
    pod, _ = env.run_pod([PodClaim("gpu")], "across-restart", wait=False)
    return pod


RECONCILER_LOOP_S = 1.0  # kubelet pluginmanager plugin_manager.go loopSleepDuration


def settled_registration(env: DRAEnv, since_ns: int) -> None:
    """On a real kubelet: the driver registered and left so for two passes of the plugin manager's reconciler.

    A driver that came back by replacing its sockets can be registered, dropped and registered again by the
    reconciler (its retry of the old socket reaching the new one). A pod whose prepare falls in that window finds
    no driver, and kuberuntime_manager.go SyncPod returns without an error after "Failed to prepare dynamic
    resources", so the pod worker syncs the pod again only at its resync, 60 to 90 s later
    (--sync-frequency, pod_workers.go workerResyncIntervalJitterFactor): the kubelet's own churn, not the
    driver's, and a pod run inside it judged the kubelet's timing. Bounded by T from `since_ns`."""
    deadline_ns = since_ns + int(env.profile.reaction_s * 1e9)
    reg = env.wait_dra_registered(since_ns)
    while True:
        dropped = env.timeline.wait_quiet(
            lambda e: e.kind == "dra.deregistered" and e.get("driver") == env.driver, 2 * RECONCILER_LOOP_S,
            reg.t_ns + 1)
        left_s = (deadline_ns - env.now()) / 1e9
        if dropped is None or left_s <= 0:
            return  # a driver that keeps dropping past T meets the pod's own wait, which judges it
        reg = env.wait_dra_registered(dropped.t_ns, timeout_s=left_s)


def serves_prepare(env: DRAEnv, pod: dict[str, Any] | None = None, since_ns: int = 0) -> None:
    """The kubelet's new connection answers a prepare: a real claim when there is an API server.

    On a real kubelet a pod's claim is prepared by the kubelet running it (through the relay): `pod`, scheduled
    while it was down, or a pod run now."""
    if env.client is None:
        env.conn().node_prepare([], timeout_s=env.profile.dra_call_timeout_s)
        return
    if env.real:
        if pod is None:
            settled_registration(env, since_ns)
            env.wait_allocatable(1)
            env.run_pod([PodClaim("gpu")], "after-restart")
            return
        env.wait_pod("pod.running", pod, since_ns, f"pod {pod['metadata']['name']} running on the new kubelet "
                     "(its claim prepared through the driver's new registration)",
                     env.profile.reaction_s + env.profile.dra_call_timeout_s)
        return
    env.wait_allocatable(1)
    pod_ref = env.new_pod()
    claim = env.allocated_claim(pod_ref)
    # As the kubelet's pod worker does, within T: a driver that came back by replacing a socket the old
    # process left behind is registered, dropped and registered again by the plugin watcher's reconciler (its
    # retry of the old socket reached the new one, under the old timestamp), and a single sync inside that
    # window finds no driver; a real kubelet syncs the pod again.
    result = env.prepare(pod_ref, [claim], retry_s=env.profile.reaction_s)
    name = claim["metadata"]["name"]
    expect(name in result, f"claim {name} prepared through the new kubelet", str(sorted(result)))


@check("DRA-RST-01", MUST, "after a kubelet restart the plugin is registered again within T and serves prepare")
def test_kubelet_restart(dra_env: DRAEnv) -> None:
    env = dra_env
    registered(env)
    t = env.now()
    env.node.stop_kubelet()
    pod = scheduled_while_down(env)
    env.node.start_kubelet()
    reg = env.wait_dra_registered(t)
    expect(env.subject.running, "the plugin still running", "it exited")
    serves_prepare(env, pod, t)
    expect(reg.t_ns >= t, "a registration with the new kubelet", "none")


@check("DRA-RST-02", MUST, "after a plugin restart (crash: its sockets left behind) it registers again within T")
def test_plugin_restart(dra_env: DRAEnv) -> None:
    env = dra_env
    registered(env)
    t = env.now()
    env.subject.restart(crash=True)
    env.wait_dra_registered(t)
    serves_prepare(env, since_ns=t)


@check("DRA-RST-03", SHOULD, "when its registration socket is deleted, the plugin re-creates it and registers again")
def test_registration_socket_deleted(dra_env: DRAEnv) -> None:
    env = dra_env
    registered(env)
    socket = env.registration_socket()
    ok, why = is_socket(socket)
    expect(ok, f"the registration socket {socket}", why)
    # A kubelet whose root directory is wiped (a node re-provisioned under a
    # running DaemonSet, a kubelet pod with an emptyDir) loses plugins_registry.
    env.node.stop_kubelet()
    t = env.now()
    os.unlink(socket)
    env.timeline.record("fault.registration_socket_removed", "harness", socket=socket)
    pod = scheduled_while_down(env)
    env.node.start_kubelet()
    env.wait_dra_registered(t)
    serves_prepare(env, pod, t)
