"""The control plane layer against a real etcd + kube-apiserver (the `local` backend).

One control plane serves the module; each test isolates itself with its own
namespace and node name. Without etcd or kube-apiserver the module skips with
the reason; a control plane that is there but fails to start fails the tests.
"""

from __future__ import annotations

import base64
import json
import socket
import subprocess
import threading
import time
import uuid
from pathlib import Path

import pytest
import yaml

from harness.controlplane import (
    RESOURCE_API,
    AllocationError,
    Allocator,
    ApiError,
    ControlPlaneStartError,
    ControlPlaneUnavailable,
    KubeClient,
    KubeconfigError,
    LocalControlPlane,
    load_kubeconfig,
    open_control_plane,
    server_config,
)
from harness.controlplane import local as local_mod
from harness.controlplane.allocator import CLAIM_FINALIZER
from harness.controlplane.client import NO_CREDENTIALS
from harness.controlplane.scheduler import pod_body
from harness.instruments.timeline import Timeline

DRIVER = "gpu.fakelet.example.com"


@pytest.fixture(scope="module")
def cp():
    plane = LocalControlPlane()
    try:
        plane.start()
    except ControlPlaneStartError:
        raise  # everything was there and it still did not come up: our bug, not a skip
    except ControlPlaneUnavailable as err:
        pytest.skip(str(err))
    try:
        yield plane
    finally:
        plane.stop()


@pytest.fixture
def world(cp):
    """A fresh namespace and node name, an Allocator with a timeline, and a device class for DRIVER."""
    name = f"fakelet-{uuid.uuid4().hex[:8]}"
    timeline = Timeline()
    alloc = Allocator(cp.client(), timeline)
    alloc.ensure_namespace(name)
    alloc.ensure_node(name)
    alloc.ensure_device_class(name, DRIVER)
    return alloc, name, timeline


def _slice(name: str, node: str, pool: str, devices: list[dict], generation: int = 1, count: int = 1) -> dict:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": name},
            "spec": {"driver": DRIVER, "nodeName": node,
                     "pool": {"name": pool, "generation": generation, "resourceSliceCount": count},
                     "devices": devices}}


def _publish(client: KubeClient, *slices: dict) -> None:
    for s in slices:
        client.create(f"{RESOURCE_API}/resourceslices", s)


def _wait_gone(client, collection: str, name: str, timeout_s: float = 30.0) -> None:
    """Until the object is deleted (a watch, bounded), or fail."""
    items, version = client.list_with_version(f"{collection}?fieldSelector=metadata.name={name}")
    if not items:
        return
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for event in client.watch(f"{collection}?fieldSelector=metadata.name={name}", version,
                                  deadline - time.monotonic()):
            if event["type"] == "DELETED":
                return
    raise AssertionError(f"{collection}/{name} still there after {timeout_s:g}s")


def _pod(alloc, namespace) -> dict:
    """A real (unscheduled) Pod: the resource-claim controller drops reservations of pods that do not exist."""
    name = f"pod-{uuid.uuid4().hex[:6]}"
    pod = alloc.client.create(f"/api/v1/namespaces/{namespace}/pods", pod_body(namespace, name, {}))
    return {"name": name, "uid": pod["metadata"]["uid"]}


# -- API round trips ------------------------------------------------------------------------


def test_serves_resource_v1_and_describes_itself(cp):
    client = cp.client()
    names = {r["name"] for r in client.get(RESOURCE_API)["resources"]}
    assert {"deviceclasses", "resourceclaims", "resourceclaims/status", "resourceslices"} <= names
    info = cp.describe()
    assert info["backend"] == "local" and info["version"].startswith("v1.")
    assert cp.kubeconfig.is_file() and oct(cp.kubeconfig.stat().st_mode & 0o777) == "0o600"
    assert oct(cp.workdir.stat().st_mode & 0o777) == "0o700"


def test_crud_round_trip(cp, world):
    _, ns, _ = world
    client = cp.client()
    coll = f"/api/v1/namespaces/{ns}/configmaps"
    created = client.create(coll, {"apiVersion": "v1", "kind": "ConfigMap",
                                   "metadata": {"name": "cm", "labels": {"app": "x"}}, "data": {"a": "1"}})
    assert created["metadata"]["uid"]
    with pytest.raises(ApiError) as dup:
        client.create(coll, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm"}})
    assert dup.value.status == 409 and dup.value.reason == "AlreadyExists"
    got = client.get(f"{coll}/cm")
    got["data"]["b"] = "2"
    replaced = client.replace(f"{coll}/cm", got)
    assert replaced["data"] == {"a": "1", "b": "2"}
    patched = client.patch(f"{coll}/cm", {"data": {"a": None, "c": "3"}})
    assert patched["data"] == {"b": "2", "c": "3"}
    assert [i["metadata"]["name"] for i in client.list(coll, label_selector="app=x")] == ["cm"]
    assert client.list(coll, label_selector="app=y") == []
    assert [i["metadata"]["name"] for i in client.list(coll, field_selector="metadata.name=cm")] == ["cm"]
    client.delete(f"{coll}/cm")
    with pytest.raises(ApiError) as gone:
        client.get(f"{coll}/cm")
    assert gone.value.status == 404 and gone.value.reason == "NotFound" and "cm" in str(gone.value)
    client.delete(f"{coll}/cm")  # missing_ok
    with pytest.raises(ApiError):
        client.delete(f"{coll}/cm", missing_ok=False)


def test_client_is_thread_safe(cp, world):
    _, ns, _ = world
    client = cp.client()
    coll = f"/api/v1/namespaces/{ns}/configmaps"
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        try:
            for j in range(5):
                client.create(coll, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"t{i}-{j}"}})
                assert client.get(f"{coll}/t{i}-{j}")["metadata"]["name"] == f"t{i}-{j}"
        except BaseException as err:
            errors.append(err)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors
    assert len(client.list(coll)) >= 30


def test_watch_yields_events_and_ends_at_its_deadline(cp, world):
    _, ns, _ = world
    client = cp.client()
    coll = f"/api/v1/namespaces/{ns}/configmaps"
    _, rv = client.list_with_version(coll)
    client.create(coll, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "w1"}})
    start = time.monotonic()
    events = []
    for event in client.watch(coll, rv, timeout_s=1.5):
        events.append(event)
    elapsed = time.monotonic() - start
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events if e["type"] != "BOOKMARK"] == \
        [("ADDED", "w1")]
    assert 1.0 <= elapsed < 4.0


# -- the allocator --------------------------------------------------------------------------


def test_allocation_written_and_read_back(cp, world):
    alloc, name, timeline = world
    client = cp.client()
    _publish(client, _slice(f"{name}-a", name, name, [
        {"name": "gpu-0", "attributes": {"model": {"string": "fake"}}, "capacity": {"memory": {"value": "16Gi"}}},
        {"name": "gpu-1"},
    ]))
    assert [s["metadata"]["name"] for s in alloc.slices(DRIVER, name)] == [f"{name}-a"]
    assert alloc.slices("other.example.com", name) == []
    claim = alloc.create_claim(name, "c1", name, count=2)
    assert claim["spec"]["devices"]["requests"] == [{"name": "req-0", "exactly": {
        "deviceClassName": name, "allocationMode": "ExactCount", "count": 2}}]
    pod = _pod(alloc, name)
    alloc.allocate(claim, name, DRIVER, pod)
    back = client.get(f"{RESOURCE_API}/namespaces/{name}/resourceclaims/c1")
    status = back["status"]
    assert status["allocation"]["devices"]["results"] == [
        {"request": "req-0", "driver": DRIVER, "pool": name, "device": "gpu-0"},
        {"request": "req-0", "driver": DRIVER, "pool": name, "device": "gpu-1"},
    ]
    assert status["allocation"]["nodeSelector"] == {"nodeSelectorTerms": [{"matchFields": [
        {"key": "metadata.name", "operator": "In", "values": [name]}]}]}
    assert status["reservedFor"] == [{"resource": "pods", "name": pod["name"], "uid": pod["uid"]}]
    [event] = timeline.events(kind="api.allocate")
    assert event.get("claim") == f"{name}/c1" and event.get("devices") == [f"{name}/gpu-0", f"{name}/gpu-1"]
    # Both devices are taken now: the next claim has none.
    with pytest.raises(AllocationError, match="allocated to another claim"):
        alloc.allocate(alloc.create_claim(name, "c2", name), name, DRIVER, _pod(alloc, name))
    assert CLAIM_FINALIZER in back["metadata"]["finalizers"]
    # Deleting the claim and its pod frees its devices: the resource-claim controller drops the
    # reservation, deallocates and removes the scheduler's finalizer; then the claim is gone.
    # (The pod first: the controller looks at reservations when the claim changes.)
    client.delete(f"/api/v1/namespaces/{name}/pods/{pod['name']}")
    alloc.delete_claim(name, "c1")
    alloc.delete_claim(name, "c1")
    _wait_gone(client, f"{RESOURCE_API}/namespaces/{name}/resourceclaims", "c1")
    c2 = client.get(f"{RESOURCE_API}/namespaces/{name}/resourceclaims/c2")
    again = alloc.allocate(c2, name, DRIVER, _pod(alloc, name))
    assert again["status"]["allocation"]["devices"]["results"][0]["device"] == "gpu-0"


def test_incomplete_pool_refused(cp, world):
    alloc, name, timeline = world
    _publish(cp.client(), _slice(f"{name}-a", name, name, [{"name": "gpu-0"}], count=2))
    with pytest.raises(AllocationError) as err:
        alloc.allocate(alloc.create_claim(name, "c", name), name, DRIVER, _pod(alloc, name))
    assert f"no complete pool of driver {DRIVER} on node {name}" in str(err.value)
    assert "resourceSliceCount=2, found 1" in str(err.value) and "\n" not in str(err.value)
    assert timeline.events(kind="api.allocate") == []


def test_a_pool_listing_a_device_twice_is_invalid_and_nothing_is_allocated(cp, world):
    """As kube-scheduler does with reference-dra's bad-slice mutant: the pool is invalid, no claim is allocated."""
    alloc, name, timeline = world
    _publish(cp.client(), _slice(f"{name}-a", name, name, [{"name": "gpu-0"}, {"name": "gpu-1"}], count=2),
             _slice(f"{name}-b", name, name, [{"name": "gpu-0"}], count=2))
    with pytest.raises(AllocationError) as err:
        alloc.allocate(alloc.create_claim(name, "c", name), name, DRIVER, _pod(alloc, name))
    assert str(err.value) == f"1 invalid resource pools were encountered: pool {name}: device gpu-0 is listed twice"
    assert timeline.events(kind="api.allocate") == []


def test_only_the_newest_generation_counts(cp, world):
    alloc, name, _ = world
    _publish(cp.client(),
             _slice(f"{name}-old", name, name, [{"name": "old-0"}], generation=1),
             _slice(f"{name}-new", name, name, [{"name": "new-0"}], generation=2))
    claim = alloc.allocate(alloc.create_claim(name, "c", name), name, DRIVER, _pod(alloc, name))
    assert [r["device"] for r in claim["status"]["allocation"]["devices"]["results"]] == ["new-0"]


def test_no_slices_is_a_clear_error(cp, world):
    alloc, name, _ = world
    with pytest.raises(AllocationError, match=f"no ResourceSlice of driver {DRIVER} on node {name}"):
        alloc.allocate(alloc.create_claim(name, "c", name), name, DRIVER, _pod(alloc, name))


def test_tainted_device_skipped(cp, world):
    alloc, name, _ = world
    _publish(cp.client(), _slice(f"{name}-a", name, name, [
        {"name": "gpu-0", "taints": [{"key": "fakelet.example.com/unhealthy", "value": "ecc", "effect": "NoExecute"}]},
        {"name": "gpu-1", "taints": [{"key": "fakelet.example.com/hot", "effect": "NoSchedule"}]},
        {"name": "gpu-2", "taints": [{"key": "fakelet.example.com/note", "effect": "None"}]},
    ]))
    claim = alloc.allocate(alloc.create_claim(name, "c1", name), name, DRIVER, _pod(alloc, name))
    assert [r["device"] for r in claim["status"]["allocation"]["devices"]["results"]] == ["gpu-2"]
    with pytest.raises(AllocationError) as err:
        alloc.allocate(alloc.create_claim(name, "c2", name), name, DRIVER, _pod(alloc, name))
    assert "taint fakelet.example.com/unhealthy=ecc:NoExecute" in str(err.value)
    # A request that tolerates the taint gets the device.
    tolerant = cp.client().create(f"{RESOURCE_API}/namespaces/{name}/resourceclaims", {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "c3"},
        "spec": {"devices": {"requests": [{"name": "req-0", "exactly": {
            "deviceClassName": name, "allocationMode": "ExactCount", "count": 1,
            "tolerations": [{"key": "fakelet.example.com/hot", "operator": "Exists"}]}}]}}})
    claim = alloc.allocate(tolerant, name, DRIVER, _pod(alloc, name))
    assert [r["device"] for r in claim["status"]["allocation"]["devices"]["results"]] == ["gpu-1"]


def test_device_taint_rule_skipped(cp, world):
    alloc, name, _ = world
    client = cp.client()
    _publish(client, _slice(f"{name}-a", name, name, [{"name": "gpu-0"}, {"name": "gpu-1"}]))
    client.create("/apis/resource.k8s.io/v1beta2/devicetaintrules", {
        "apiVersion": "resource.k8s.io/v1beta2", "kind": "DeviceTaintRule", "metadata": {"name": name},
        "spec": {"deviceSelector": {"driver": DRIVER, "pool": name, "device": "gpu-0"},
                 "taint": {"key": "fakelet.example.com/drain", "effect": "NoSchedule"}}})
    try:
        claim = alloc.allocate(alloc.create_claim(name, "c", name), name, DRIVER, _pod(alloc, name))
        assert [r["device"] for r in claim["status"]["allocation"]["devices"]["results"]] == ["gpu-1"]
    finally:
        client.delete(f"/apis/resource.k8s.io/v1beta2/devicetaintrules/{name}")


# -- the kubeconfig backend and kubeconfig files ---------------------------------------------


def test_kubeconfig_backend_on_the_local_one(cp):
    plane = open_control_plane(f"kubeconfig:{cp.kubeconfig}")
    assert plane.name == "kubeconfig"
    plane.start()
    try:
        info = plane.describe()
        assert info["backend"] == "kubeconfig" and info["server"] == cp.server
        assert info["version"]
        assert any(n["metadata"]["name"] == "default" for n in plane.client().list("/api/v1/namespaces"))
    finally:
        plane.stop()


EXEC_V1 = "client.authentication.k8s.io/v1"


def _exec_kubeconfig(cp, tmp_path: Path, script: str, command: str = "./credential.sh") -> Path:
    """The local control plane's cluster, with a user whose exec plugin is `script` (written beside the file)."""
    local = yaml.safe_load(cp.kubeconfig.read_text())
    plugin = tmp_path / "credential.sh"
    plugin.write_text(script)
    plugin.chmod(0o755)
    return _write(tmp_path / "kc.yaml", {
        "apiVersion": "v1", "kind": "Config", "current-context": "exec",
        "clusters": local["clusters"],
        "users": [{"name": "exec", "user": {"exec": {"apiVersion": EXEC_V1, "command": command,
                                                     "interactiveMode": "Never"}}}],
        "contexts": [{"name": "exec", "context": {"cluster": local["clusters"][0]["name"], "user": "exec"}}]})


def test_kubeconfig_with_an_exec_plugin(cp, tmp_path, monkeypatch):
    """A v1 exec plugin (a relative command, resolved beside the kubeconfig) supplies the token."""
    from lightkube.resources.core_v1 import Namespace

    from harness.config.runconfig import check_control_plane

    token = yaml.safe_load(cp.kubeconfig.read_text())["users"][0]["user"]["token"]
    calls, info = tmp_path / "calls", tmp_path / "exec-info.json"
    credential = json.dumps({"apiVersion": EXEC_V1, "kind": "ExecCredential", "status": {"token": token}})
    path = _exec_kubeconfig(cp, tmp_path, "#!/bin/sh\n"
                            f"echo run >> {calls}\n"
                            f"printf '%s' \"$KUBERNETES_EXEC_INFO\" > {info}\n"
                            f"echo '{credential}'\n")
    monkeypatch.chdir("/")
    assert check_control_plane(f"kubeconfig:{path}") == f"kubeconfig:{path.resolve()}"
    plane = open_control_plane(f"kubeconfig:{path}").start()
    try:
        client = plane.client()
        assert any(n["metadata"]["name"] == "default" for n in client.list("/api/v1/namespaces"))
        assert "default" in {n.metadata.name for n in client.typed.list(Namespace)}
    finally:
        plane.stop()
    # Once for the facade's connection pool (the token is kept), once for the typed client's.
    assert calls.read_text().split() == ["run", "run"]
    assert json.loads(info.read_text()) == {"apiVersion": EXEC_V1, "kind": "ExecCredential",
                                            "spec": {"interactive": False}}


def test_failing_exec_plugin_is_a_clear_error(cp, tmp_path):
    path = _exec_kubeconfig(cp, tmp_path, "#!/bin/sh\necho 'session expired:' >&2\necho 'run login' >&2\nexit 1\n")
    with pytest.raises(KubeconfigError) as err:
        open_control_plane(f"kubeconfig:{path}").start()
    text = str(err.value)
    assert str(path) in text and "exec plugin" in text and "returned 1" in text
    assert "session expired: run login" in text and "\n" not in text
    client = KubeClient.from_kubeconfig(path)
    with pytest.raises(ApiError) as api:
        client.get("/api/v1/namespaces")
    assert api.value.status == 0 and api.value.reason == NO_CREDENTIALS and "GET /api/v1/namespaces" in str(api.value)
    client.close()


def test_a_hung_exec_plugin_is_bounded(cp, tmp_path, monkeypatch):
    from harness.controlplane import kubeconfig

    monkeypatch.setattr(kubeconfig, "EXEC_TIMEOUT_S", 1)
    path = _exec_kubeconfig(cp, tmp_path, "#!/bin/sh\nexec sleep 600\n")
    began = time.monotonic()
    with pytest.raises(KubeconfigError, match="exec plugin"):
        open_control_plane(f"kubeconfig:{path}").start()
    assert time.monotonic() - began < 30


def test_exec_plugin_without_a_token_is_a_clear_error(cp, tmp_path):
    path = _exec_kubeconfig(cp, tmp_path, "#!/bin/sh\necho not json\n")
    with pytest.raises(KubeconfigError, match="its output is not JSON"):
        open_control_plane(f"kubeconfig:{path}").start()


def test_typed_client_reads_dra_types(cp, world):
    from lightkube.resources.resource_v1 import ResourceSlice

    _, name, _ = world
    _publish(cp.client(), _slice(f"{name}-a", name, name, [{"name": "gpu-0"}]))
    got = cp.client().typed.get(ResourceSlice, f"{name}-a")
    assert got.spec.driver == DRIVER and [d.name for d in got.spec.devices] == ["gpu-0"]


def _write(path: Path, doc: object) -> Path:
    path.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc))
    return path


def _kubeconfig(server: str = "https://127.0.0.1:1", user: dict | None = None, **cluster: object) -> dict:
    return {"apiVersion": "v1", "kind": "Config", "current-context": "c",
            "clusters": [{"name": "k", "cluster": {"server": server, **cluster}}],
            "users": [{"name": "u", "user": user if user is not None else {"token": "t"}}],
            "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}]}


@pytest.mark.parametrize(("doc", "says"), [
    (None, "cannot read"),
    ("{ not: [yaml", "not YAML"),
    ("- a\n- b\n", "not a kubeconfig"),
    ({**_kubeconfig(), "current-context": ""}, "no current-context"),
    ({**_kubeconfig(), "current-context": "other"}, "context 'other' not found (have: c)"),
    (_kubeconfig(server="127.0.0.1:6443"), "has no http(s) server URL"),
    (_kubeconfig(**{"certificate-authority-data": "!!notbase64"}), "certificate-authority-data is not valid base64"),
    (_kubeconfig(**{"certificate-authority": "missing-ca.crt"}), "missing-ca.crt"),
    (_kubeconfig(user={"exec": {"command": "aws"}}), "exec plugin has no apiVersion"),
    (_kubeconfig(user={"exec": {"apiVersion": "client.authentication.k8s.io/v1alpha1", "command": "sh"}}),
     "apiVersion 'client.authentication.k8s.io/v1alpha1' is not supported"),
    (_kubeconfig(user={"exec": {"apiVersion": "client.authentication.k8s.io/v1"}}), "exec plugin has no command"),
    (_kubeconfig(user={"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": "no-such-plugin-x",
                                "installHint": "install it\nfrom the vendor"}}),
     "'no-such-plugin-x' is not an executable found from"),
    (_kubeconfig(user={"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": "sh",
                                "interactiveMode": "Always"}}), "without a terminal"),
    (_kubeconfig(user={"auth-provider": {"name": "oidc"}}), "auth-provider plugin"),
    (_kubeconfig(**{"tls-server-name": "api.example"}), "tls-server-name"),
    (_kubeconfig(**{"certificate-authority-data": base64.b64encode(b"not a certificate").decode()}),
     "certificate authority or client certificate cannot be used"),
    (_kubeconfig(**{"certificate-authority-data": base64.b64encode(b"x").decode(), "insecure-skip-tls-verify": True}),
     "both a certificate authority and insecure-skip-tls-verify"),
    (_kubeconfig(user={"tokenFile": "missing-token"}), "missing-token"),
    (_kubeconfig(user={"client-certificate-data": "QQ=="}), "certificate without a key"),
])
def test_bad_kubeconfig_is_a_clear_error(tmp_path, doc, says):
    path = tmp_path / "kc.yaml"
    if doc is not None:
        _write(path, doc)
    with pytest.raises(KubeconfigError) as err:
        open_control_plane(f"kubeconfig:{path}").start()
    assert str(path) in str(err.value) and says in str(err.value)
    assert isinstance(err.value, ControlPlaneUnavailable) and "\n" not in str(err.value)


def test_unreachable_kubeconfig_is_a_clear_bounded_error(tmp_path):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    path = _write(tmp_path / "kc.yaml", _kubeconfig(server=f"https://127.0.0.1:{port}"))
    start = time.monotonic()
    with pytest.raises(ControlPlaneUnavailable) as err:
        open_control_plane(f"kubeconfig:{path}").start()
    assert time.monotonic() - start < 6
    assert str(path) in str(err.value) and "/version failed" in str(err.value) and "Unreachable" in str(err.value)


def _self_signed(tmp_path: Path) -> tuple[bytes, bytes]:
    key, crt = tmp_path / "k.pem", tmp_path / "c.pem"
    proc = subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
                           "-nodes", "-keyout", str(key), "-out", str(crt), "-subj", "/CN=fakelet", "-days", "1"],
                          capture_output=True, text=True, timeout=30)
    if proc.returncode != 0:
        pytest.skip(f"openssl cannot make a test certificate: {proc.stderr.strip()[:200]}")
    return crt.read_bytes(), key.read_bytes()


def test_kubeconfig_material_forms(tmp_path, monkeypatch):
    """Token file, CA file and client certificate/key data all resolve (paths relative to the file, not the cwd)."""
    cert, key = _self_signed(tmp_path)
    (tmp_path / "tok").write_text("s3cret\n")
    (tmp_path / "ca.crt").write_bytes(cert)
    doc = _kubeconfig(user={"tokenFile": "tok", "client-certificate-data": base64.b64encode(cert).decode(),
                            "client-key-data": base64.b64encode(key).decode()},
                      **{"certificate-authority": "ca.crt"})
    path = _write(tmp_path / "kc.yaml", doc)
    monkeypatch.chdir("/")
    config = load_kubeconfig(path)
    assert config.cluster.certificate_auth == str(tmp_path / "ca.crt")
    assert config.user.token_file == str(tmp_path / "tok")
    assert config.user.client_cert_data == base64.b64encode(cert).decode()
    client = KubeClient(config)
    assert client.server == "https://127.0.0.1:1"
    client.close()


def test_context_without_a_user_is_anonymous(tmp_path):
    doc = _kubeconfig()
    doc["contexts"][0]["context"].pop("user")
    client = KubeClient.from_kubeconfig(_write(tmp_path / "kc.yaml", doc))
    assert client.config.user is not None and client.config.user.token is None
    client.close()


# -- unit: the client against bad URLs -------------------------------------------------------


def test_client_against_a_closed_port_fails_fast_and_clearly():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = KubeClient(server_config(f"https://127.0.0.1:{port}", insecure=True), timeout_s=2)
    start = time.monotonic()
    with pytest.raises(ApiError) as err:
        client.get("/version")
    assert time.monotonic() - start < 2
    assert err.value.status == 0 and err.value.reason == "Unreachable"
    assert f"127.0.0.1:{port}" in str(err.value) and "GET /version" in str(err.value)


def test_client_against_a_silent_server_is_bounded():
    """A server that accepts and never answers: the call ends at the client's timeout."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]
        client = KubeClient(server_config(f"https://127.0.0.1:{port}", insecure=True), timeout_s=0.5)
        start = time.monotonic()
        with pytest.raises(ApiError) as err:
            client.get("/version")
        assert 0.4 <= time.monotonic() - start < 2
        assert "no answer within 0.5s" in str(err.value)


def test_client_rejects_a_non_http_server():
    with pytest.raises(ValueError, match="not an http"):
        KubeClient(server_config("ftp://x"))


@pytest.mark.parametrize(("spec", "says"), [
    ("none", "no API server"),
    ("kubeconfig:", "names no file"),
    ("cluster-in-the-sky", "unknown control plane"),
])
def test_open_control_plane_refuses(spec, says):
    with pytest.raises(ControlPlaneUnavailable, match=says):
        open_control_plane(spec)


# -- lifecycle -------------------------------------------------------------------------------


def _processes_mentioning(text: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if text.encode() in cmdline:
                pids.append(int(entry.name))
    return pids


def test_stop_leaks_nothing(cp, tmp_path):
    plane = LocalControlPlane(workdir=tmp_path).start()
    workdir, pids = plane.workdir, plane.pids()
    # etcd, kube-apiserver, kube-controller-manager
    assert workdir is not None and workdir.parent == tmp_path and len(pids) == 3
    assert len(_processes_mentioning(str(workdir))) == 3
    plane.stop()
    plane.stop()  # idempotent
    assert not workdir.exists()
    assert _processes_mentioning(str(workdir)) == []
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists()


def test_start_failure_aborts_at_once_with_the_log(cp, tmp_path, monkeypatch):
    monkeypatch.setitem(local_mod.FEATURE_GATES, "NoSuchFeatureGateInFakelet", True)
    plane = LocalControlPlane(workdir=tmp_path)
    start = time.monotonic()
    with pytest.raises(ControlPlaneStartError) as err:
        plane.start()
    assert time.monotonic() - start < 20
    first, *log = str(err.value).splitlines()
    assert first.startswith("kube-apiserver exited with code")
    assert any("NoSuchFeatureGateInFakelet" in line for line in log)
    assert list(tmp_path.iterdir()) == []


def test_a_selector_in_the_path_holds_for_get_list_and_watch(cp, world):
    # httpx replaces a URL's query by its params: the facade must merge them, or a watch
    # on "...?fieldSelector=..." silently sees every object (every node's slices, every pod).
    alloc, name, _ = world
    client = cp.client()
    mine = _pod(alloc, name)
    selector = f"/api/v1/namespaces/{name}/pods?fieldSelector=metadata.name={mine['name']}"
    items, version = client.list_with_version(selector)
    assert [p["metadata"]["name"] for p in items] == [mine["name"]]
    other = _pod(alloc, name)
    client.patch(f"/api/v1/namespaces/{name}/pods/{mine['name']}", {"metadata": {"labels": {"seen": "yes"}}})
    names = []
    for event in client.watch(f"/api/v1/namespaces/{name}/pods?fieldSelector=metadata.name={mine['name']}",
                              version, 2.0):
        names.append(event["object"]["metadata"]["name"])
        if event["type"] == "MODIFIED":
            break
    assert other["name"] not in names and names == [mine["name"]]


def test_a_pool_named_alike_on_two_nodes_is_each_nodes_own(cp, world):
    """Each check is a node of its own on the shared API server. A driver that names its pool the same on every
    node (pydra) must not find its device taken by a claim the other node's check holds."""
    alloc, name, _ = world
    other = f"{name}-b"
    alloc.ensure_node(other)
    pool = "pool-named-after-the-driver"
    _publish(cp.client(), _slice(f"{name}-a", name, pool, [{"name": "0"}]),
             _slice(f"{other}-a", other, pool, [{"name": "0"}]))
    on_a = alloc.allocate(alloc.create_claim(name, "on-a", name), name, DRIVER, _pod(alloc, name))
    on_b = alloc.allocate(alloc.create_claim(name, "on-b", name), other, DRIVER, _pod(alloc, name))
    for claim in (on_a, on_b):
        assert [(r["pool"], r["device"]) for r in claim["status"]["allocation"]["devices"]["results"]] == \
            [(pool, "0")]
    # On one node the device is still taken once.
    with pytest.raises(AllocationError, match="allocated to another claim"):
        alloc.allocate(alloc.create_claim(name, "again-a", name), name, DRIVER, _pod(alloc, name))
