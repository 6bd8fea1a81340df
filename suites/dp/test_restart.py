"""DP-RST: kubelet restarts that delete sockets, outages, and plugin restarts."""

from __future__ import annotations

import random

from harness.instruments.timeline import WaitTimeout, describe
from harness.spec.checks import MUST, SHOULD, check, expect
from harness.world.env import REGISTRATION_KINDS, DPEnv

RESTARTS = 5  # checks.md DP-RST-02
# What a restart-storm detail quotes: the registrations, and what may have stopped the plugin (a stream that
# ended on a failed send, its own exit).
CAUSE_KINDS = (*REGISTRATION_KINDS, "kubelet.stream_end", "process.main_exit", "process.orphan_exit")


def instance(env: DPEnv) -> int:
    """The running kubelet's instance number (either kubelet counts its starts)."""
    number = env.node.instance
    assert number is not None
    return number


@check("DP-RST-01", MUST, "after a kubelet restart it re-registers within T with the same resource and devices")
def test_reregisters_after_restart(dp_env: DPEnv) -> None:
    env = dp_env.start()
    reg1, list1 = env.registered_and_listed()
    env.need_devices(list1, 1, healthy=False)
    t = env.now()
    env.node.restart_kubelet()
    reg2, list2 = env.registered_and_listed(t, instance=instance(env))
    env.measure("re-registration after restart", reg2, t)
    expect(reg2.get("resource") == reg1.get("resource"), f"resource {reg1.get('resource')}",
           f"{reg2.get('resource')} at {env.at(reg2)}")
    expect(list2.ids == list1.ids, f"devices {list1.ids}", list2.describe())


@check("DP-RST-02", MUST, "five back-to-back kubelet restarts, one during registration: it re-registers every time")
def test_restart_storm(dp_env: DPEnv) -> None:
    env = dp_env.start()
    env.wait_registered()
    during = random.Random(env.seed).randrange(RESTARTS)
    for n in range(RESTARTS):
        t = env.now()
        if n != during:
            env.node.restart_kubelet()
            reregistered(env, t, f"restart {n + 1}")
            continue
        # Hold the next Register in flight, then restart under it.
        env.node.restart_kubelet(arm=lambda m: m.faults.hold("Register"))
        env.timeline.wait_for(lambda e: e.kind == "fault.fired" and e.get("method") == "Register",
                              env.profile.reaction_s, f"restart {n + 1}: a Register to hold", t)
        t2 = env.now()
        env.node.restart_kubelet()
        reregistered(env, t2, f"restart {n + 1} (during registration)", cycle_ns=t)


def reregistered(env: DPEnv, since_ns: int, which: str, cycle_ns: int | None = None) -> None:
    """A registration with the kubelet instance now running, named by the restart that asked for it.

    A miss is told from the start of its restart cycle (`cycle_ns`), stream ends included, and with the
    plugin's own last words when it stopped: the cause (a stream send that failed while the kubelet was
    away, and the plugin stopping itself over it) comes before the re-registration that never followed."""
    try:
        env.wait_registered(since_ns, instance=instance(env))
    except WaitTimeout as err:
        start = since_ns if cycle_ns is None else cycle_ns
        seen = env.timeline.find(lambda e: e.kind in CAUSE_KINDS and (e.source == "kubelet" or env.is_mine(e)),
                                 start)
        causes = [e for e in seen if e.kind != "kubelet.start" and e.kind != "kubelet.stop"]
        cut = causes and causes[0] not in seen[-WaitTimeout.SHOWN:]
        first = f"\nwhat came first: {describe(causes[0], env.timeline.origin_ns)}" if cut else ""
        said = env.exit_report() or f"the plugin is still running; its last output:\n{_tail(env)}"
        raise AssertionError(f"{WaitTimeout(f'{which}: {err.awaiting}', err.timeout_s, seen, env.timeline.origin_ns)}"
                             f"{first}\n{said}") from None


def _tail(env: DPEnv, lines: int = 8) -> str:
    tail = env.subject.log_tail(lines).strip()
    return "\n".join("    " + line[:300] for line in tail.splitlines()) if tail else "    (no output)"


@check("DP-RST-03", MUST, "when the kubelet deletes its socket, the plugin recreates it")
def test_recreates_socket(dp_env: DPEnv) -> None:
    env = dp_env.start()
    reg = env.wait_registered()
    endpoint = str(reg.get("endpoint")).rsplit("/", 1)[-1]
    t = env.now()
    env.node.restart_kubelet()
    env.wait_file(endpoint, created=True, since_ns=t)
    with env.probe(reg) as probe:
        probe.options(timeout_s=env.profile.reaction_s, wait_for_ready=True)


@check("DP-RST-04", SHOULD, "after the kubelet is gone for longer than T, the plugin registers when it returns")
def test_long_outage(dp_env: DPEnv) -> None:
    env = dp_env.start()
    env.wait_registered()
    env.node.stop_kubelet(remove_socket=True)
    env.outage(env.profile.long_outage_s)
    t = env.now()
    env.start_kubelet()
    env.wait_registered(t)


@check("DP-RST-05", MUST, "killed and restarted, the plugin registers again with consistent devices")
def test_plugin_restart(dp_env: DPEnv) -> None:
    env = dp_env.start()
    _reg1, list1 = env.registered_and_listed()
    env.need_devices(list1, 1, healthy=False)
    t = env.now()
    env.subject.restart(crash=True)
    _reg2, list2 = env.registered_and_listed(t)
    expect(list2.ids == list1.ids, f"devices {list1.ids}", list2.describe())
