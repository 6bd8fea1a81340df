"""Timing profiles: the bounds a plugin is held to, and fakelet's own timers.

A verdict never depends on the profile. Every bound a plugin is held to (how
long it may take to register, re-register, answer, exit, refresh health) is
the kubelet's real one in every profile; waits are event-driven, so a prompt
plugin is done in milliseconds either way. `fast` shrinks only the fake
kubelet's internal timers that no check holds a plugin to (retry pauses,
grace periods, back-offs), and sets a `budget_s`: a reaction slower than the
budget but within the bound passes with a "slow" note and its measured time.
`upstream` has no budget below the bound.

`with_reaction_bound` makes a profile that holds plugins to a shorter bound:
fakelet's own kill matrix uses it for mutants whose defect is "never reacts",
so that catching them does not cost the full kubelet bound. Verdicts under it
may differ from a real kubelet's, and the report says so. It leaves `startup_s`
alone: how soon a process that was just started calls Register says how loaded
the machine is, not how the plugin reacts, so under a shortened bound the
start-up has the kubelet's T and the short bound runs from the first Register
(a mutant that never registers still fails fast: its Register arrives, and the
rest is a reaction). Under the kubelet's own bounds T counts from the start.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

# Upstream values, named where they are defined upstream.
DIAL_TIMEOUT_S = 10.0  # kubelet devicemanager plugin/v1beta1 client.go dial(): 10*time.Second
PRESTART_TIMEOUT_S = 30.0  # deviceplugin v1beta1 constants.go KubeletPreStartContainerRPCTimeoutInSecs
ENDPOINT_STOP_GRACE_S = 300.0  # kubelet devicemanager endpoint.go endpointStopGracePeriod = 5 * time.Minute
REREGISTER_BOUND_S = 30.0  # test/e2e_node device_plugin_test.go waits up to 30s for re-registration
SIGTERM_EXIT_S = 10.0  # checks.md DP-ROB-01
# Windows for checks that assert something does NOT happen (a registration storm, a closed
# stream): fixed, since a shorter window would pass a plugin that misbehaves a little later.
QUIET_WINDOW_S = 5.0
# DP-REG-07: how long after a rejected Register a plugin may take to try again. The kubelet sets no bound on it; a
# plugin that exits instead is started again by its DaemonSet after the kubelet's crash-loop backoff, which grows
# from 10 s to 300 s (kubelet.go initialCrashLoopBackOff, MaxCrashLoopBackOff), to 60 s at most under KEP-4603's
# ReduceDefaultCrashLoopBackOffDecay (kubelet.go reducedMaxCrashLoopBackOff). A retry within that comes no later
# than a crashing plugin's return. Fixed, not a profile's: a vendor's 30 s retry passes under every profile.
REGISTER_RETRY_S = 60.0
# DP-RST-04: the kubelet stays away this much longer than T.
OUTAGE_MARGIN_S = 5.0
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
    # Under a shortened reaction_s: T again, for a process just started, from its start to its first Register.
    startup_s: float
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
    # Reactions slower than this (but within reaction_s) pass with a "slow" note; None: no budget.
    budget_s: float | None = None
    # Set when reaction_s is shorter than the kubelet's bound (the kill matrix): verdicts may differ.
    shortened: bool = False

    def describe(self) -> dict[str, float | str | bool | None]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def slow(self, seconds: float) -> bool:
        """Whether a reaction that took `seconds` exceeded this profile's budget."""
        return self.budget_s is not None and seconds > self.budget_s

    def with_reaction_bound(self, seconds: float) -> Profile:
        if not 0 < seconds <= self.reaction_s:
            raise ValueError(f"--reaction-bound {seconds:g}: must be positive and at most the kubelet's "
                             f"{self.reaction_s:g}s")
        # Every bound the plugin is held to shrinks with it; the dial stays inside one reaction.
        return replace(self, reaction_s=seconds, long_outage_s=seconds + OUTAGE_MARGIN_S,
                       dial_timeout_s=min(self.dial_timeout_s, seconds / 2),
                       prestart_timeout_s=min(self.prestart_timeout_s, seconds),
                       sigterm_exit_s=min(self.sigterm_exit_s, seconds),
                       dra_call_timeout_s=min(self.dra_call_timeout_s, seconds),
                       dra_health_timeout_s=min(self.dra_health_timeout_s, seconds),
                       shortened=seconds < self.reaction_s,
                       budget_s=None if self.budget_s is None else min(self.budget_s, seconds))


UPSTREAM = Profile(
    name="upstream",
    dial_timeout_s=DIAL_TIMEOUT_S,
    prestart_timeout_s=PRESTART_TIMEOUT_S,
    endpoint_grace_s=ENDPOINT_STOP_GRACE_S,
    reaction_s=REREGISTER_BOUND_S,
    startup_s=REREGISTER_BOUND_S,
    sigterm_exit_s=SIGTERM_EXIT_S,
    quiet_window_s=QUIET_WINDOW_S,
    long_outage_s=REREGISTER_BOUND_S + OUTAGE_MARGIN_S,
    dra_call_timeout_s=DRA_CALL_TIMEOUT_S,
    dra_health_timeout_s=DRA_HEALTH_TIMEOUT_S,
    dra_health_retry_s=DRA_HEALTH_RETRY_S,
    dra_wipe_delay_s=DRA_WIPE_DELAY_S,
    pod_sync_backoff_s=POD_SYNC_BACKOFF_S,
)

# Same bounds as UPSTREAM; only the fake kubelet's internal timers shrink.
FAST = replace(
    UPSTREAM,
    name="fast",
    endpoint_grace_s=2.0,
    dra_health_retry_s=0.5,
    dra_wipe_delay_s=2.0,
    pod_sync_backoff_s=1.0,
    budget_s=4.0,
)

PROFILES = {p.name: p for p in (UPSTREAM, FAST)}


def get(name: str) -> Profile:
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown profile {name!r}; choose one of: {', '.join(PROFILES)}") from None
