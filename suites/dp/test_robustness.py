"""DP-ROB: how the plugin behaves when it is told to stop."""

from __future__ import annotations

import os
import signal

from harness.kubelet.devicemanager import go_join
from harness.spec.checks import MUST, SHOULD, check, expect
from harness.world.env import DPEnv


@check("DP-ROB-01", SHOULD, "on SIGTERM it exits within 10 s and removes its socket")
def test_sigterm(dp_env: DPEnv) -> None:
    env = dp_env.start()
    reg = env.wait_registered()
    env.subject.signal(signal.SIGTERM)
    code = env.subject.wait_exit(env.profile.sigterm_exit_s)
    expect(code is not None, f"an exit within {env.profile.sigterm_exit_s:g}s of SIGTERM", "the plugin still running")
    path = go_join(env.sandbox.plugin_dir, reg.get("endpoint"))
    expect(not os.path.exists(path), f"its socket {path} removed", "the socket file still there")


# Long enough for a plugin to act on kubelet.sock's deletion (inotify is immediate), short
# enough not to be an outage: a window in which the kubelet's files must stay as it left them.
KUBELET_DOWN_S = 1.0


@check("DP-ROB-02", MUST, "it leaves the kubelet's files alone: a restarted kubelet reads its checkpoint back")
def test_kubelet_files_untouched(dp_env: DPEnv) -> None:
    env = dp_env.start()
    env.wait_registered()
    t = env.now()
    env.node.stop_kubelet(remove_socket=True)
    env.outage(KUBELET_DOWN_S)
    env.start_kubelet()
    env.wait_registered(t)
    # manager.go Start() goes on without a checkpoint it cannot read: the allocations of running
    # pods are forgotten, and their devices can be handed out a second time.
    unreadable = env.timeline.events(since_ns=t, kind="kubelet.checkpoint_unreadable")
    expect(not unreadable, "the device-manager checkpoint read back after the kubelet was down",
           f"the kubelet could not read it ({unreadable[0].get('error') if unreadable else ''}); "
           "nothing but the kubelet writes that file, so the plugin (or something it started) did")
