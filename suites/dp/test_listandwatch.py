"""DP-LAW: the ListAndWatch stream the kubelet builds capacity from.

Every check here judges the list the kubelet holds once it settles, never one
message: an empty first list, repeats and reordering are the plugin's right.
"""

from __future__ import annotations

from collections import Counter

from harness.instruments.timeline import Event
from harness.spec.checks import MUST, SHOULD, check, expect, not_applicable, not_exercised
from harness.world.env import DPEnv

HEALTH_VALUES = ("Healthy", "Unhealthy")  # deviceplugin v1beta1 constants.go Healthy / Unhealthy
SHOWN = 12  # device IDs quoted in a verdict


def ids_of(msg: Event) -> list[str]:
    return [d.get("ID", "") for d in msg.get("message", {}).get("devices", [])]


@check("DP-LAW-01", MUST, "a ListAndWatch response comes within T and the settled list has the mapped devices")
def test_first_list(dp_env: DPEnv) -> None:
    env = dp_env.start()
    _reg, listing = env.registered_and_listed()
    ids = listing.ids  # duplicates are DP-LAW-02's business
    inventory = set(env.expected_ids or [])
    explicit = env.spec.expected_ids is not None
    if env.expected_ids is not None and (explicit or inventory & set(ids)):
        expect(ids == env.expected_ids, f"devices {env.expected_ids}", listing.describe())
        return
    if env.expected_count is None:
        not_exercised("nothing to compare the list with: the subject maps no inventory and expects no device count")
    if env.expected_ids is not None:
        env.note("the plugin names devices its own way (no inventory ID listed): compared by count")
    expect(len(ids) == env.expected_count, f"{env.expected_count} devices, one per inventory device",
           f"{len(ids)}: {listing.describe()}")


def _shown(items: list[str]) -> str:
    """A list for a verdict: a 100,000-device list is cut, not copied whole."""
    more = f" and {len(items) - SHOWN} more" if len(items) > SHOWN else ""
    return f"{items[:SHOWN]}{more}"


def _validate(msg: Event) -> list[str]:
    devices = msg.get("message", {}).get("devices", [])
    ids = [d.get("ID", "") for d in devices]
    problems = [f"empty device ID in {_shown(ids)}"] if "" in ids else []
    dups = sorted(i for i, n in Counter(ids).items() if n > 1)
    if dups:
        problems.append(f"duplicate IDs {_shown(dups)}")
    bad = sorted({d.get("health", "") for d in devices} - set(HEALTH_VALUES))
    if bad:
        problems.append(f"health values {bad} (only {list(HEALTH_VALUES)} are meaningful)")
    return problems


def _stream(env: DPEnv, endpoint: int, since_ns: int) -> list[Event]:
    return env.timeline.find(lambda e: e.kind == "grpc.stream_msg" and e.source == "kubelet"
                             and e.get("endpoint_id") == endpoint, since_ns)


@check("DP-LAW-02", MUST,
       "device IDs are unique and non-empty, health is Healthy/Unhealthy, every response is a full list")
def test_list_well_formed(dp_env: DPEnv) -> None:
    env = dp_env.start()
    reg, listing = env.registered_and_listed()
    endpoint = reg.get("endpoint_id")
    for msg in _stream(env, endpoint, 0):
        problems = _validate(msg)
        expect(not problems, "a well-formed device list in every response", f"{'; '.join(problems)} at {env.at(msg)}")
    ids = env.need_devices(listing, 1, healthy=False)
    if not env.drives("health"):
        env.note("the full-list property was not exercised: fakelet cannot make this plugin send another list")
        return
    # Fail one device in the backend: every response after it must still list every device.
    assert env.devices is not None
    device = env.any_inventory_device(reg, listing)
    t = env.now()
    env.devices.fail(device)
    nxt = env.timeline.wait_for(
        lambda e: e.kind == "grpc.stream_msg" and e.source == "kubelet" and e.get("endpoint_id") == endpoint,
        env.profile.reaction_s, f"a ListAndWatch response after {device} turned unhealthy", t,
        relevant=("grpc.stream_msg", "kubelet.stream_end"))
    env.timed(nxt, t, "the next list after a device failed")
    problems = _validate(nxt)
    expect(not problems, "a well-formed device list", f"{'; '.join(problems)} at {env.at(nxt)}")
    expect(sorted(set(ids_of(nxt))) == ids, f"a full list of {_shown(ids)}", f"{_shown(ids_of(nxt))} at {env.at(nxt)}")


@check("DP-LAW-03", SHOULD, "topology NUMA IDs match the inventory's NUMA nodes")
def test_numa(dp_env: DPEnv) -> None:
    env = dp_env
    if env.inventory is None or not any("numa" in d for d in env.inventory):
        not_exercised("the subject maps no inventory with NUMA nodes")
    env.start()
    reg, listing = env.registered_and_listed()
    env.need_devices(listing, 1, healthy=False)
    assert listing.event is not None
    got = {d.get("ID"): sorted(int(n.get("ID", 0)) for n in d.get("topology", {}).get("nodes", []))
           for d in listing.event.get("message", {}).get("devices", [])}
    if not any(got.values()):
        not_applicable("the plugin reports no NUMA topology (TopologyInfo is optional)")
    mapping = env.device_map(reg, listing)
    numa = {d["id"]: d["numa"] for d in env.inventory if "numa" in d}  # type: ignore[union-attr]
    want = {p: [numa[i]] for p, i in mapping.pairs.items() if i in numa and p in got}
    if not want:
        not_exercised(f"no listed device maps to an inventory device with a NUMA node ({mapping.describe()})")
    wrong = {p: got[p] for p in want if got[p] != want[p]}
    expect(not wrong, f"NUMA nodes {want}", f"{wrong} in {listing.describe()}")


@check("DP-LAW-04", MUST, "the ListAndWatch stream stays open while the plugin runs")
def test_stream_stays_open(dp_env: DPEnv) -> None:
    env = dp_env.start()
    reg, listing = env.registered_and_listed()
    assert listing.event is not None
    first = _stream(env, reg.get("endpoint_id"), 0)[0]
    ended = env.timeline.wait_quiet(
        lambda e: e.kind == "kubelet.stream_end" and e.get("endpoint_id") == reg.get("endpoint_id"),
        env.profile.quiet_window_s, first.t_ns)
    expect(ended is None, f"the stream open for {env.profile.quiet_window_s:g}s after the first response",
           f"it ended ({ended.get('reason') if ended else ''}) at {env.at(ended) if ended else ''}")

