"""The kubelet's PodResources API v1 as fakelet serves it (harness/kubelet/podresources.py).

Pure Python: List, Get and GetAllocatableResources answer from the provider,
terminated pods are left out as upstream v1.36's active-pod filter does, an
unknown pod is upstream's UNKNOWN "pod X in namespace Y not found", every call
lands on the timeline, and read_pod_resources returns what was served.

Against upstream: `wirecompat podresources` reads our server with upstream's
generated client (k8s.io/kubelet pkg/apis/podresources/v1) and prints what it
decoded; every value must equal what we served, including the fields the
provider does not model (CPU IDs, memory, share_id), put on the wire through
`translate`. The schema's descriptors are compared in test_wire_descriptors.py.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import asdict, dataclass, field

import grpc
import pytest
from test_wirecompat import build_or_skip  # the same build fixture and skip rules

import harness.wire as wire
from harness.instruments.grpcutil import insecure_unix_channel
from harness.instruments.timeline import Timeline
from harness.kubelet.podresources import (
    ClaimResourceEntry,
    ContainerEntry,
    DeviceEntry,
    DynamicEntry,
    PodEntry,
    PodResourcesServer,
    read_pod_resources,
    socket_path,
)
from harness.kubelet.ratelimit import DEFAULT_BURST_TOKENS, LIMIT_EXCEEDED, TokenBucket
from harness.launch.gobuild import build

pr = wire.podresources
CALL_TIMEOUT_S = 30

GPU, NIC = "example.com/gpu", "example.com/nic"
DRIVER = "gpu.dra.example.com"

DP_POD = PodEntry("dp-pod", "team-a", [
    ContainerEntry("sidecar"),  # a restartable init container: listed, holding nothing
    ContainerEntry("main", devices=[
        DeviceEntry(GPU, ["gpu-0", "gpu-1"], [0]),
        DeviceEntry(GPU, ["gpu-2"], [0, 1]),
        DeviceEntry(NIC, ["nic-0"]),  # a plugin that reports no topology
    ]),
])
DRA_POD = PodEntry("dra-pod", "team-b", [
    ContainerEntry("app", dynamic_resources=[
        DynamicEntry("claim-gpu", "team-b", [
            ClaimResourceEntry(["vendor.example.com/gpu=gpu-0", "vendor.example.com/gpu=common-ü"],
                               DRIVER, "node-a", "gpu-0"),
            ClaimResourceEntry([], DRIVER, "node-a", "gpu-1"),
        ]),
    ]),
    ContainerEntry("idle"),
])
DONE_POD = PodEntry("done-pod", "team-a", [ContainerEntry("main", devices=[DeviceEntry(GPU, ["gpu-3"], [1])])],
                    terminated=True)
ALLOCATABLE = [DeviceEntry(GPU, ["gpu-0", "gpu-1"], [0]), DeviceEntry(GPU, ["gpu-2", "gpu-3"], [1]),
               DeviceEntry(NIC, ["nic-0", "nic-1"])]


@dataclass
class StaticProvider:
    pods_: list[PodEntry] = field(default_factory=lambda: [DP_POD, DRA_POD, DONE_POD])
    allocatable_: list[DeviceEntry] = field(default_factory=lambda: list(ALLOCATABLE))

    def pods(self):
        return self.pods_

    def allocatable(self):
        return self.allocatable_


@pytest.fixture
def served(tmp):
    timeline = Timeline()
    with PodResourcesServer(socket_path(tmp), StaticProvider(), timeline) as server:
        yield server, timeline


def _get(server, name, namespace):
    channel = insecure_unix_channel(str(server.socket))
    try:
        stub = wire.podresources_grpc.PodResourcesListerStub(channel)
        return stub.Get(pr.GetPodResourcesRequest(pod_name=name, pod_namespace=namespace), timeout=CALL_TIMEOUT_S)
    finally:
        channel.close()


def _read_dict(pod: PodEntry):
    """read_pod_resources' shape of a served PodEntry: the entry's fields plus the unmodeled wire fields."""
    d = asdict(pod)
    del d["terminated"]
    for c in d["containers"]:
        c.update(cpu_ids=[], memory=[])
        for dyn in c["dynamic_resources"]:
            for r in dyn["claim_resources"]:
                r["share_id"] = None
    return dict(d, cpu_ids=[], memory=[])


# ---------------------------------------------------------------------------
# schema


def test_socket_path_is_the_kubelets(tmp):
    assert socket_path(tmp) == tmp / "pod-resources" / "kubelet.sock"


def test_rpc_paths_are_upstreams():
    service = pr.DESCRIPTOR.services_by_name["PodResourcesLister"]
    assert [f"/{service.full_name}/{m.name}" for m in service.methods] == [
        "/v1.PodResourcesLister/List", "/v1.PodResourcesLister/GetAllocatableResources",
        "/v1.PodResourcesLister/Get"]


def _full_names(module):
    names = [s.full_name for s in module.DESCRIPTOR.services_by_name.values()]
    names += [e.full_name for e in module.DESCRIPTOR.enum_types_by_name.values()]
    todo = list(module.DESCRIPTOR.message_types_by_name.values())
    while todo:
        m = todo.pop()
        names.append(m.full_name)
        names += [e.full_name for e in m.enum_types]
        todo += m.nested_types
    return names


def test_no_full_name_collides_across_wire_schemas():
    """podresources/v1 and drahealth/v1 share upstream's bare package "v1"."""
    owner = {}
    for attr in wire.__all__:
        module = getattr(wire, attr)
        if not hasattr(module, "DESCRIPTOR"):
            continue  # a _grpc module
        for name in _full_names(module):
            assert owner.setdefault(name, attr) == attr, f"{name} in both {owner[name]} and {attr}"
    assert {owner["v1.NodeWatchResourcesRequest"], owner["v1.ListPodResourcesRequest"]} == {
        "drahealth_v1", "podresources"}


# ---------------------------------------------------------------------------
# the server, from Python


def test_read_pod_resources_lists_active_pods_and_allocatable(served):
    server, _ = served
    assert read_pod_resources(server.socket, CALL_TIMEOUT_S) == {
        "pods": [_read_dict(DP_POD), _read_dict(DRA_POD)],  # DONE_POD is terminated
        "allocatable": {"devices": [asdict(d) for d in ALLOCATABLE], "cpu_ids": [], "memory": []},
    }


def test_get_answers_a_running_pod(served):
    server, _ = served
    response = _get(server, "dp-pod", "team-a")
    devices = response.pod_resources.containers[1].devices
    assert [(d.resource_name, list(d.device_ids), [n.ID for n in d.topology.nodes]) for d in devices] == [
        (GPU, ["gpu-0", "gpu-1"], [0]), (GPU, ["gpu-2"], [0, 1]), (NIC, ["nic-0"], [])]
    assert not devices[2].HasField("topology")  # no topology reported: none served, not an empty one
    assert [c.name for c in response.pod_resources.containers] == ["sidecar", "main"]


@pytest.mark.parametrize(("name", "namespace"), [("ghost", "team-a"), ("dp-pod", "team-b"), ("done-pod", "team-a")])
def test_get_unknown_or_terminated_pod_is_upstreams_error(served, name, namespace):
    server, timeline = served
    with pytest.raises(grpc.RpcError) as err:
        _get(server, name, namespace)
    # server_v1.go Get returns a plain fmt.Errorf, which grpc-go sends as UNKNOWN.
    assert err.value.code() == grpc.StatusCode.UNKNOWN
    assert err.value.details() == f"pod {name} in namespace {namespace} not found"
    (call,) = timeline.events(kind="podresources.call")
    assert call.data == {"method": "Get", "pod": f"{namespace}/{name}",
                         "outcome": f"UNKNOWN: pod {name} in namespace {namespace} not found"}


def test_every_call_is_on_the_timeline(served):
    server, timeline = served
    read_pod_resources(server.socket, CALL_TIMEOUT_S)
    _get(server, "dra-pod", "team-b")
    assert [e.data for e in timeline.events(kind="podresources.call")] == [
        {"method": "List", "outcome": "OK", "pods": ["team-a/dp-pod", "team-b/dra-pod"]},
        {"method": "GetAllocatableResources", "outcome": "OK", "devices": {GPU: 4, NIC: 2}},
        {"method": "Get", "outcome": "OK", "pod": "team-b/dra-pod", "containers": ["app", "idle"],
         "claims": ["team-b/claim-gpu"], "devices": {}},
    ]


def test_a_failing_provider_is_recorded_and_reaches_the_client(tmp):
    class Broken(StaticProvider):
        def pods(self):
            raise RuntimeError("pod manager gone")

    timeline = Timeline()
    with PodResourcesServer(socket_path(tmp), Broken(), timeline) as server, pytest.raises(grpc.RpcError) as err:
        read_pod_resources(server.socket, CALL_TIMEOUT_S)
    assert err.value.code() == grpc.StatusCode.UNKNOWN
    (call,) = timeline.events(kind="podresources.call")
    assert call.get("method") == "List" and "pod manager gone" in call.get("outcome")


def test_lifecycle(tmp):
    sock = socket_path(tmp)
    sock.parent.mkdir()
    sock.write_text("stale")  # left by an earlier kubelet: replaced, as CreateListener does
    timeline = Timeline()
    server = PodResourcesServer(sock, StaticProvider(pods_=[]), timeline)
    assert server.start() is server
    assert read_pod_resources(sock, CALL_TIMEOUT_S)["pods"] == []
    server.stop()
    server.stop()
    assert [e.kind for e in timeline.events()] == ["podresources.start", "podresources.call",
                                                   "podresources.call", "podresources.stop"]


# ---------------------------------------------------------------------------
# upstream's generated client against our server


SHARE_ID = "share-7"
BIG_NUMA = 2**35  # above int32: NUMANode.ID must be int64 on both sides
MAX_SIZE = 2**64 - 1  # ContainerMemory.size is uint64


def _wire_extras(method, response):
    """Put the fields the provider does not model on the wire, so that upstream decodes them too."""
    if method == "List":
        dp_pod, dra_pod = response.pod_resources
        dp_pod.cpu_ids.extend([2, 3])
        dp_pod.memory.add(memory_type="hugepages-1Gi", size=2**33).topology.nodes.add(ID=BIG_NUMA)
        dp_pod.containers[1].cpu_ids.append(3)
        dp_pod.containers[1].memory.add(memory_type="memory", size=1 << 30)  # no topology
        dra_pod.containers[0].dynamic_resources[0].claim_resources[0].share_id = SHARE_ID
    elif method == "GetAllocatableResources":
        response.cpu_ids.extend([0, 1, 2, 3])
        response.memory.add(memory_type="memory", size=MAX_SIZE).topology.nodes.add(ID=0)
    return response


# What upstream's protojson (proto names, unpopulated fields included) prints for what we served:
# 64-bit integers as strings, an unset message as null, an unset optional left out.


def _pj_topology(nodes):
    return {"nodes": [{"ID": str(n)} for n in nodes]} if nodes else None


def _pj_device(d: DeviceEntry):
    return {"resource_name": d.resource_name, "device_ids": d.device_ids, "topology": _pj_topology(d.numa_nodes)}


def _pj_pod(p: PodEntry):
    return {"name": p.name, "namespace": p.namespace, "cpu_ids": [], "memory": [], "containers": [{
        "name": c.name, "cpu_ids": [], "memory": [],
        "devices": [_pj_device(d) for d in c.devices],
        "dynamic_resources": [{
            "claim_name": dyn.claim_name, "claim_namespace": dyn.claim_namespace,
            "claim_resources": [{"cdi_devices": [{"name": n} for n in r.cdi_devices], "driver_name": r.driver_name,
                                 "pool_name": r.pool_name, "device_name": r.device_name}
                                for r in dyn.claim_resources],
        } for dyn in c.dynamic_resources],
    } for c in p.containers]}


@pytest.fixture(scope="module")
def wirecompat_bin():
    return build_or_skip(build)


def test_upstream_client_reads_our_server(wirecompat_bin, tmp):
    timeline = Timeline()
    with PodResourcesServer(socket_path(tmp), StaticProvider(), timeline, translate=_wire_extras) as server:
        gets = ["--get", "team-b/dra-pod", "--get", "team-a/done-pod", "--get", "nowhere/ghost"]
        proc = subprocess.run([str(wirecompat_bin), "podresources", *gets, str(server.socket)],
                              capture_output=True, text=True, timeout=CALL_TIMEOUT_S)
    assert proc.returncode == 0, f"wirecompat podresources exited {proc.returncode}:\n{proc.stderr}"
    report = json.loads(proc.stdout)

    dp_pod, dra_pod = _pj_pod(DP_POD), _pj_pod(DRA_POD)
    dp_pod["cpu_ids"] = ["2", "3"]
    dp_pod["memory"] = [{"memory_type": "hugepages-1Gi", "size": str(2**33),
                         "topology": {"nodes": [{"ID": str(BIG_NUMA)}]}}]
    dp_pod["containers"][1].update(cpu_ids=["3"], memory=[{"memory_type": "memory", "size": str(1 << 30),
                                                           "topology": None}])
    listed_dra = json.loads(json.dumps(dra_pod))
    listed_dra["containers"][0]["dynamic_resources"][0]["claim_resources"][0]["share_id"] = SHARE_ID
    assert report["list"] == {"pod_resources": [dp_pod, listed_dra]}

    assert report["allocatable"] == {
        "devices": [_pj_device(d) for d in ALLOCATABLE], "cpu_ids": ["0", "1", "2", "3"],
        "memory": [{"memory_type": "memory", "size": str(MAX_SIZE), "topology": {"nodes": [{"ID": "0"}]}}]}

    assert report["get"] == [
        {"pod_namespace": "team-b", "pod_name": "dra-pod", "response": {"pod_resources": dra_pod}, "error": None},
        {"pod_namespace": "team-a", "pod_name": "done-pod", "response": None,
         "error": {"code": "Unknown", "message": "pod done-pod in namespace team-a not found"}},
        {"pod_namespace": "nowhere", "pod_name": "ghost", "response": None,
         "error": {"code": "Unknown", "message": "pod ghost in namespace nowhere not found"}},
    ]
    assert [(e.get("method"), e.get("pod")) for e in timeline.events(kind="podresources.call")] == [
        ("List", None), ("GetAllocatableResources", None), ("Get", "team-b/dra-pod"),
        ("Get", "team-a/done-pod"), ("Get", "nowhere/ghost")]


def test_a_burst_past_the_kubelets_rate_limit_is_rejected_and_fakelets_own_reads_keep_under_it(served):
    """Upstream serves PodResources behind one token bucket (DefaultQPS 100, DefaultBurstTokens 10): the
    eleventh call of a burst is ResourceExhausted "rejected by rate limit", before any handler. A scenario
    condition judged on every timeline event bursts so; fakelet's own readers pace themselves and are never
    rejected (the real-kubelet flake of test_condition_controls: a rejected read judged a negative control)."""
    server, timeline = served
    for _ in range(DEFAULT_BURST_TOKENS * 2):  # 40 paced calls: about 0.3 s once the first 10 are spent
        read_pod_resources(server.socket, CALL_TIMEOUT_S)
    assert all(e.get("outcome") == "OK" for e in timeline.events(kind="podresources.call"))
    channel = insecure_unix_channel(str(server.socket))
    try:
        stub = wire.podresources_grpc.PodResourcesListerStub(channel)
        codes = []
        for _ in range(DEFAULT_BURST_TOKENS * 3):
            try:
                stub.List(pr.ListPodResourcesRequest(), timeout=CALL_TIMEOUT_S)
                codes.append(grpc.StatusCode.OK)
            except grpc.RpcError as err:
                assert err.details() == LIMIT_EXCEEDED
                codes.append(err.code())
    finally:
        channel.close()
    assert grpc.StatusCode.RESOURCE_EXHAUSTED in codes  # 30 unpaced calls outrun a 100/s refill
    rejected = [e for e in timeline.events(kind="podresources.call") if "RESOURCE_EXHAUSTED" in e.get("outcome")]
    assert len(rejected) == codes.count(grpc.StatusCode.RESOURCE_EXHAUSTED)


def test_the_bucket_refills_at_its_rate_and_never_past_its_burst() -> None:
    bucket = TokenBucket(qps=10.0, burst=2)
    assert bucket.allow() and bucket.allow() and not bucket.allow()
    owed = bucket.reserve()
    assert 0 < owed <= 0.1  # the next token, 1/qps away at most
