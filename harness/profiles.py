"""Timing profiles: the kubelet's real timers, or the same scaled for speed.

`upstream` uses the values the v1.36 kubelet and its e2e tests use; `fast`
scales them so a full run takes seconds. Checks read every bound from here.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

# Upstream values, named where they are defined upstream.
DIAL_TIMEOUT_S = 10.0  # kubelet devicemanager plugin/v1beta1 client.go dial(): 10*time.Second
PRESTART_TIMEOUT_S = 30.0  # deviceplugin v1beta1 constants.go KubeletPreStartContainerRPCTimeoutInSecs
ENDPOINT_STOP_GRACE_S = 300.0  # kubelet devicemanager endpoint.go endpointStopGracePeriod = 5 * time.Minute
REREGISTER_BOUND_S = 30.0  # test/e2e_node device_plugin_test.go waits up to 30s for re-registration
SIGTERM_EXIT_S = 10.0  # checks.md DP-ROB-01


@dataclass(frozen=True)
class Profile:
    name: str
    dial_timeout_s: float
    prestart_timeout_s: float
    endpoint_grace_s: float
    # T in checks.md: how long a plugin may take to react (register, re-register, re-serve).
    reaction_s: float
    sigterm_exit_s: float
    # Observation window for checks that assert something does not happen.
    quiet_window_s: float
    # How long the kubelet stays down in DP-RST-04 (must exceed reaction_s).
    long_outage_s: float

    def describe(self) -> dict[str, float | str]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


UPSTREAM = Profile(
    name="upstream",
    dial_timeout_s=DIAL_TIMEOUT_S,
    prestart_timeout_s=PRESTART_TIMEOUT_S,
    endpoint_grace_s=ENDPOINT_STOP_GRACE_S,
    reaction_s=REREGISTER_BOUND_S,
    sigterm_exit_s=SIGTERM_EXIT_S,
    quiet_window_s=5.0,
    long_outage_s=REREGISTER_BOUND_S + 5.0,
)

FAST = Profile(
    name="fast",
    dial_timeout_s=2.0,
    prestart_timeout_s=2.0,
    endpoint_grace_s=2.0,
    reaction_s=4.0,
    sigterm_exit_s=5.0,
    quiet_window_s=1.0,
    long_outage_s=4.5,
)

PROFILES = {p.name: p for p in (UPSTREAM, FAST)}


def get(name: str) -> Profile:
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown profile {name!r}; choose one of: {', '.join(PROFILES)}") from None
