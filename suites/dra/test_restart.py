"""DRA-RST: kubelet restarts, plugin restarts, and a wiped registration directory."""

from __future__ import annotations

import os

from harness.controlplane.scheduler import PodClaim
from harness.spec.checks import MUST, SHOULD, check, expect
from harness.world.draenv import DRAEnv
from suites.dra.common import is_socket, registered


def serves_prepare(env: DRAEnv, kubelet_started_ns: int | None = None) -> None:
    """The kubelet's new connection answers a prepare: a real claim when there is an API server.

    A real kubelet prepares claims only for a pod it runs: there a real pod with a claim runs (its claim
    prepared by the kubelet, through the relay). `kubelet_started_ns`: when that kubelet started, whose
    start deleted the node's ResourceSlices (the driver's republishing them is part of serving again)."""
    if env.client is None:
        env.conn().node_prepare([], timeout_s=env.profile.dra_call_timeout_s)
        return
    if env.real:
        if kubelet_started_ns is not None:
            env.wait_republished(kubelet_started_ns)
        else:
            env.wait_allocatable(1)
        env.run_pod([PodClaim("gpu")], "after-restart")
        return
    env.wait_allocatable(1)
    pod = env.new_pod()
    claim = env.allocated_claim(pod)
    result = env.prepare(pod, [claim])
    name = claim["metadata"]["name"]
    expect(name in result, f"claim {name} prepared through the new kubelet", str(sorted(result)))


@check("DRA-RST-01", MUST, "after a kubelet restart the plugin is registered again within T and serves prepare")
def test_kubelet_restart(dra_env: DRAEnv) -> None:
    env = dra_env
    registered(env)
    t = env.now()
    env.node.restart_kubelet()
    reg = env.wait_dra_registered(t)
    expect(env.subject.running, "the plugin still running", "it exited")
    serves_prepare(env, t)
    expect(reg.t_ns >= t, "a registration with the new kubelet", "none")


@check("DRA-RST-02", MUST, "after a plugin restart (crash: its sockets left behind) it registers again within T")
def test_plugin_restart(dra_env: DRAEnv) -> None:
    env = dra_env
    registered(env)
    t = env.now()
    env.subject.restart(crash=True)
    env.wait_dra_registered(t)
    serves_prepare(env)


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
    env.node.start_kubelet()
    env.wait_dra_registered(t)
    serves_prepare(env, t)
