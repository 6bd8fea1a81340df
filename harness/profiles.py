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
DRA_CALL_TIMEOUT_S = 45.0  # kubelet cm/dra/plugin dra_plugin.go defaultClientCallTimeout = 45 * time.Second
DRA_HEALTH_TIMEOUT_S = 30.0  # kubelet cm/dra healthinfo.go DefaultHealthTimeout = 30 * time.Second
# kubelet cm/dra/plugin dra_plugin_manager.go add(): wait.UntilWithContext(streamCtx, ..., 5*time.Second)
DRA_HEALTH_RETRY_S = 5.0
DRA_WIPE_DELAY_S = 30.0  # kubelet cm/dra manager.go defaultWipingDelay = 30 * time.Second
# kubelet.go backOffPeriod = time.Second * 10: a pod whose sync failed (e.g. PrepareResources)
# is synced again after this, jittered by pod_workers.go workerBackOffPeriodJitterFactor = 0.5.
POD_SYNC_BACKOFF_S = 10.0


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
    # DRA: per-call deadline of NodePrepare/NodeUnprepareResources.
    dra_call_timeout_s: float
    # DRA: a device's health turns Unknown this long after its last update.
    dra_health_timeout_s: float
    # DRA: pause before the kubelet re-opens an ended NodeWatchResources stream.
    dra_health_retry_s: float
    # DRA: how long a driver may have no connected plugin before its ResourceSlices are wiped.
    dra_wipe_delay_s: float
    # DRA: how soon the kubelet retries a pod whose PrepareResources failed.
    pod_sync_backoff_s: float

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
    dra_call_timeout_s=DRA_CALL_TIMEOUT_S,
    dra_health_timeout_s=DRA_HEALTH_TIMEOUT_S,
    dra_health_retry_s=DRA_HEALTH_RETRY_S,
    dra_wipe_delay_s=DRA_WIPE_DELAY_S,
    pod_sync_backoff_s=POD_SYNC_BACKOFF_S,
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
    dra_call_timeout_s=5.0,
    dra_health_timeout_s=3.0,
    dra_health_retry_s=0.5,
    dra_wipe_delay_s=2.0,
    pod_sync_backoff_s=1.0,
)

PROFILES = {p.name: p for p in (UPSTREAM, FAST)}


def get(name: str) -> Profile:
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown profile {name!r}; choose one of: {', '.join(PROFILES)}") from None
