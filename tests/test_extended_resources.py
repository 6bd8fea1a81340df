"""Extended resources backed by DRA (KEP-5004): fakelet's model of kube-scheduler's special claim
(harness/controlplane/extended.py, against upstream's own test cases and the local API server), the kubelet's
container mapping, and the reference DRA driver's mutants. DRA-EXT-01 end to end (the reference passes, each
mutant fails it) is the kill matrix's: tests/test_kill_matrix.py.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from conftest import SLICE_DRIVER, publish_slices

from harness.controlplane import extended
from harness.controlplane.base import RESOURCE_API
from harness.controlplane.scheduler import PAUSE_IMAGE
from harness.reference import dra_extended

EXT = "example.com/gpu"


def container(name: str, requests: dict[str, str], sidecar: bool = False) -> dict[str, Any]:
    c: dict[str, Any] = {"name": name, "image": PAUSE_IMAGE, "resources": {"requests": requests, "limits": requests}}
    if sidecar:
        c["restartPolicy"] = "Always"
    return c


def brief(requests: list[dict[str, Any]]) -> list[tuple[str, str, int]]:
    return [(r["name"], r["exactly"]["deviceClassName"], r["exactly"]["count"]) for r in requests]


# -- the scheduler's requests and mappings: extendeddynamicresources_test.go's cases ---------------------------------


def test_one_request_per_container_and_resource() -> None:
    # "two resources match" and "two containers match"
    one = {"containers": [container("a", {EXT: "1", EXT + "1": "2"})]}
    requests, mappings = extended.requests_and_mappings(one, {EXT: "class", EXT + "1": "class1"})
    assert brief(requests) == [("container-0-request-0", "class", 1), ("container-0-request-1", "class1", 2)]
    assert mappings == [{"containerName": "a", "resourceName": EXT, "requestName": "container-0-request-0"},
                        {"containerName": "a", "resourceName": EXT + "1", "requestName": "container-0-request-1"}]
    two = {"containers": [container("a", {EXT: "1"}), container("b", {EXT + "1": "2"})]}
    requests, _ = extended.requests_and_mappings(two, {EXT: "class", EXT + "1": "class1"})
    assert brief(requests) == [("container-0-request-0", "class", 1), ("container-1-request-0", "class1", 2)]
    requests, _ = extended.requests_and_mappings(one, {EXT: "class"})  # "one resource match, one not"
    assert brief(requests) == [("container-0-request-0", "class", 1)]


def test_init_containers_take_the_largest_request_or_reuse() -> None:
    # "one init container, one regular container"
    spec = {"initContainers": [container("i0", {EXT + "init": "2"})], "containers": [container("a", {EXT: "1"})]}
    requests, _ = extended.requests_and_mappings(spec, {EXT: "class", EXT + "init": "classInit"})
    assert brief(requests) == [("container-0-request-0", "classInit", 2), ("container-1-request-0", "class", 1)]
    # "two init containers, one regular container": the larger init request serves both
    spec = {"initContainers": [container("i0", {EXT + "init": "1"}), container("i1", {EXT + "init": "2"})],
            "containers": [container("a", {EXT: "1"})]}
    requests, mappings = extended.requests_and_mappings(spec, {EXT: "class", EXT + "init": "classInit"})
    assert brief(requests) == [("container-1-request-0", "classInit", 2), ("container-2-request-0", "class", 1)]
    assert {m["containerName"]: m["requestName"] for m in mappings if m["resourceName"] == EXT + "init"} == \
        {"i0": "container-1-request-0", "i1": "container-1-request-0"}
    # "three init containers, one sidecar, one regular container": the sidecar's request is reused
    spec = {"initContainers": [container("i0", {EXT + "init": "1"}), container("s", {EXT + "init": "1"}, True),
                               container("i2", {EXT + "init": "2"})],
            "containers": [container("a", {EXT: "1"})]}
    requests, _ = extended.requests_and_mappings(spec, {EXT: "class", EXT + "init": "classInit"})
    assert brief(requests) == [("container-1-request-0", "classInit", 1), ("container-2-request-0", "classInit", 2),
                               ("container-3-request-0", "class", 1)]


def test_resource_names_and_classes() -> None:
    assert extended.is_extended_resource_name(EXT)
    assert not extended.is_extended_resource_name("cpu")
    assert not extended.is_extended_resource_name("example.kubernetes.io/gpu")
    assert not extended.is_extended_resource_name("Example.com/gpu")
    assert extended.is_dra_name(extended.implicit_name("gpu-class"))
    def named(name: str, day: int) -> dict[str, Any]:
        return {"metadata": {"name": name, "creationTimestamp": f"2026-01-0{day}T00:00:00Z"},
                "spec": {"extendedResourceName": EXT}}
    old, new, tie = named("b", 1), named("c", 2), named("a", 2)
    assert extended.resolve([old, new], EXT) is new  # the newer class wins the name
    assert extended.resolve([old, new, tie], EXT) is tie  # then the lower name
    assert extended.resolve([old], extended.implicit_name("b")) is old
    assert extended.resolve([old], "example.com/other") is None


@pytest.mark.parametrize(("allocatable", "mapped", "who"), [
    ({}, True, extended.DRA),
    ({EXT: "0"}, True, extended.DRA),  # nothing allocatable: DRA, when a class maps it
    ({EXT: "2"}, True, extended.DEVICE_PLUGIN),  # a device plugin advertises it: never DRA on this node
    ({EXT: "2"}, False, extended.DEVICE_PLUGIN),
    ({}, False, None),  # neither: the pod does not fit
])
def test_who_serves_a_resource_on_a_node(allocatable: dict[str, str], mapped: bool, who: str | None) -> None:
    assert extended.backing(allocatable, EXT, mapped) == who


def test_each_container_gets_the_devices_of_its_requests() -> None:
    status = {"requestMappings": [{"containerName": "a", "resourceName": EXT, "requestName": "container-0-request-0"},
                                  {"containerName": "b", "resourceName": EXT, "requestName": "container-1-request-0"}]}
    prepared = [{"requests": ["container-0-request-0"], "cdi_ids": ["x/gpu=0"]},
                {"requests": ["container-1-request-0"], "cdi_ids": ["x/gpu=1"]}]
    assert extended.container_cdi_ids(status, "a", prepared) == ["x/gpu=0"]
    assert extended.container_cdi_ids(status, "b", prepared) == ["x/gpu=1"]
    unnamed = [{**d, "requests": []} for d in prepared]  # a device naming no request goes to every container
    assert extended.container_cdi_ids(status, "b", unnamed) == ["x/gpu=0", "x/gpu=1"]
    assert extended.container_cdi_ids(status, "c", prepared) == []


# -- the reference driver's mutants ------------------------------------------------------------------------------


def special_claim() -> dict[str, Any]:
    pod = {"metadata": {"name": "p", "namespace": "ns", "uid": "u"}}
    claim = extended.claim_body(pod, [{"name": "container-0-request-0"}, {"name": "container-1-request-0"}])
    claim["metadata"]["name"] = "p-extended-resources-abcde"
    return claim


def test_the_mutants() -> None:
    claim = special_claim()
    result = {"request": "container-1-request-0", "device": "gpu-1"}
    assert dra_extended.refusal(claim, None) is None
    assert "owned by pod p" in str(dra_extended.refusal(claim, "refuses-generated-claims"))
    from_template = {**claim, "metadata": {**claim["metadata"],
                                           "annotations": {extended.POD_CLAIM_ANNOTATION: "gpu"}}}
    assert dra_extended.refusal(from_template, "refuses-generated-claims") is None
    assert dra_extended.refusal({"metadata": {"name": "direct"}}, "refuses-generated-claims") is None
    assert dra_extended.request_name(claim, result, None) == "container-1-request-0"
    assert dra_extended.request_name(claim, result, "one-request-name") == "container-0-request-0"
    assert dra_extended.request_name(claim, {"request": "r/sub"}, None) == "r"


# -- against the local API server ---------------------------------------------------------------------------------


def ext_pod(alloc: Any, node: str, asks: list[str]) -> dict[str, Any]:
    body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"p-{uuid.uuid4().hex[:6]}", "namespace": node},
            "spec": {"schedulerName": "fakelet", "automountServiceAccountToken": False,
                     "containers": [container(f"c{i}", {r: "1"}) for i, r in enumerate(asks)]}}
    return dict(alloc.client.create(f"/api/v1/namespaces/{node}/pods", body))


def test_the_scheduler_claim_on_the_api_server(slice_api: Any) -> None:
    alloc, node = slice_api
    client = alloc.client
    name = f"{node}.fakelet.example.com/gpu"
    cls = client.get(f"{RESOURCE_API}/deviceclasses/{node}")
    cls["spec"]["extendedResourceName"] = name
    assert client.replace(f"{RESOURCE_API}/deviceclasses/{node}", cls)["spec"]["extendedResourceName"] == name
    publish_slices(alloc, node, [{"devices": [{"name": "gpu-0"}, {"name": "gpu-1"}]}])
    pod = ext_pod(alloc, node, [name, extended.implicit_name(node)])
    claim, mappings = extended.place(client, pod, client.get(f"/api/v1/nodes/{node}"))
    meta = claim["metadata"]
    assert meta["name"].startswith(pod["metadata"]["name"] + "-extended-resources-")
    assert meta["annotations"] == {extended.ANNOTATION: "true"}
    assert meta["ownerReferences"][0]["uid"] == pod["metadata"]["uid"]
    assert brief(claim["spec"]["devices"]["requests"]) == [("container-0-request-0", node, 1),
                                                           ("container-1-request-0", node, 1)]
    allocated = alloc.allocate(claim, node, SLICE_DRIVER, {"name": pod["metadata"]["name"],
                                                           "uid": pod["metadata"]["uid"]})
    results = allocated["status"]["allocation"]["devices"]["results"]
    assert sorted((r["request"], r["device"]) for r in results) == [("container-0-request-0", "gpu-0"),
                                                                  ("container-1-request-0", "gpu-1")]
    status = extended.record_status(client, pod, allocated, mappings)["status"]["extendedResourceClaimStatus"]
    assert status == {"requestMappings": mappings, "resourceClaimName": meta["name"]}
    # A node whose allocatable has the resource serves it by its device plugin: no claim.
    current = client.get(f"/api/v1/nodes/{node}")
    current["status"] = {"capacity": {name: "2"}, "allocatable": {name: "2"}}
    served = client.replace_status(f"/api/v1/nodes/{node}", current)
    with pytest.raises(extended.NotServedByDRA, match="a device plugin"):
        extended.place(client, ext_pod(alloc, node, [name]), served)
    with pytest.raises(ValueError, match="no DeviceClass maps it"):
        extended.place(client, ext_pod(alloc, node, ["example.com/unmapped"]), served)
