"""DP-ROB: how the plugin behaves when it is told to stop."""

from __future__ import annotations

import os
import signal

from harness.checks import SHOULD, check, expect
from harness.env import DPEnv
from harness.kubelet.devicemanager import go_join


@check("DP-ROB-01", SHOULD, "on SIGTERM it exits within 10 s and removes its socket")
def test_sigterm(dp_env: DPEnv) -> None:
    env = dp_env.start()
    reg = env.wait_registered()
    env.subject.signal(signal.SIGTERM)
    code = env.subject.wait_exit(env.profile.sigterm_exit_s)
    expect(code is not None, f"an exit within {env.profile.sigterm_exit_s:g}s of SIGTERM", "the plugin still running")
    path = go_join(env.sandbox.plugin_dir, reg.get("endpoint"))
    expect(not os.path.exists(path), f"its socket {path} removed", "the socket file still there")
