"""DP-LAW: the ListAndWatch stream the kubelet builds capacity from."""

from __future__ import annotations

from harness.checks import MUST, SHOULD, check, expect, not_applicable
from harness.env import DPEnv
from harness.timeline import Event

HEALTH_VALUES = ("Healthy", "Unhealthy")  # deviceplugin v1beta1 constants.go Healthy / Unhealthy


def ids_of(msg: Event) -> list[str]:
    return [d.get("ID", "") for d in msg.get("message", {}).get("devices", [])]


@check("DP-LAW-01", MUST, "the first ListAndWatch response comes within T and lists the mapped devices")
def test_first_list(dp_env: DPEnv) -> None:
    env = dp_env.start()
    _reg, first = env.registered_and_listed()
    ids = sorted(set(ids_of(first)))  # duplicates are DP-LAW-02's business
    if env.expected_ids is not None:
        expect(ids == env.expected_ids, f"devices {env.expected_ids}", f"{ids} at {env.at(first)}")
    elif env.expected_count is not None:
        expect(len(ids) == env.expected_count, f"{env.expected_count} devices", f"{len(ids)}: {ids}")
    else:
        expect(ids, "at least one device", "an empty list")


def _validate(msg: Event) -> list[str]:
    devices = msg.get("message", {}).get("devices", [])
    ids = [d.get("ID", "") for d in devices]
    problems = [f"empty device ID in {ids}" for i in ids if not i]
    dups = sorted({i for i in ids if ids.count(i) > 1})
    if dups:
        problems.append(f"duplicate IDs {dups}")
    bad = sorted({d.get("health", "") for d in devices} - set(HEALTH_VALUES))
    if bad:
        problems.append(f"health values {bad} (only {list(HEALTH_VALUES)} are meaningful)")
    return problems


@check("DP-LAW-02", MUST,
       "device IDs are unique and non-empty, health is Healthy/Unhealthy, every response is a full list")
def test_list_well_formed(dp_env: DPEnv) -> None:
    env = dp_env.start()
    reg, first = env.registered_and_listed()
    problems = _validate(first)
    expect(not problems, "a well-formed device list", f"{'; '.join(problems)} at {env.at(first)}")
    if env.devices is None or "health" not in env.spec.observes:
        return  # no way to make this plugin send a second list
    # Fail one device in the backend: the next response must still list every device.
    t = env.now()
    env.devices.fail(sorted(set(ids_of(first)))[0])
    endpoint = reg.get("endpoint_id")
    nxt = env.timeline.wait_for(
        lambda e: e.kind == "grpc.stream_msg" and e.get("endpoint_id") == endpoint, env.profile.reaction_s,
        "a ListAndWatch response after a device turned unhealthy", t,
        relevant=("grpc.stream_msg", "kubelet.stream_end"))
    problems = _validate(nxt)
    expect(not problems, "a well-formed device list", f"{'; '.join(problems)} at {env.at(nxt)}")
    expect(sorted(set(ids_of(nxt))) == sorted(set(ids_of(first))),
           f"a full list of {sorted(set(ids_of(first)))}", f"{ids_of(nxt)} at {env.at(nxt)}")


@check("DP-LAW-03", SHOULD, "topology NUMA IDs match the inventory's NUMA nodes")
def test_numa(dp_env: DPEnv) -> None:
    env = dp_env
    if env.inventory is None or not any("numa" in d for d in env.inventory):
        not_applicable("the subject profile maps no inventory with NUMA nodes")
    env.start()
    _reg, first = env.registered_and_listed()
    want = {d["id"]: [d["numa"]] for d in env.inventory if "numa" in d}  # type: ignore[union-attr]
    got = {d.get("ID"): [int(n.get("ID", 0)) for n in d.get("topology", {}).get("nodes", [])]
           for d in first.get("message", {}).get("devices", [])}
    wrong = {i: got[i] for i in got if i in want and got[i] != want[i]}
    expect(not wrong, f"NUMA nodes {want}", f"{wrong} at {env.at(first)}")


@check("DP-LAW-04", MUST, "the ListAndWatch stream stays open while the plugin runs")
def test_stream_stays_open(dp_env: DPEnv) -> None:
    env = dp_env.start()
    reg, first = env.registered_and_listed()
    ended = env.timeline.wait_quiet(
        lambda e: e.kind == "kubelet.stream_end" and e.get("endpoint_id") == reg.get("endpoint_id"),
        env.profile.quiet_window_s, first.t_ns)
    expect(ended is None, f"the stream open for {env.profile.quiet_window_s:g}s after the first response",
           f"it ended ({ended.get('reason') if ended else ''}) at {env.at(ended) if ended else ''}")
