"""fakelet's hand-written .proto schemas against upstream-generated Go code.

tests/go/wirecompat imports upstream k8s.io/kubelet's generated packages.
`wirecompat descriptors` prints their schema facts, which must equal the ones
of our generated Python modules: same packages, message full names (nested map
entries included), field names, numbers, labels, types and type names, enums,
services, methods and streaming flags. `wirecompat dracall` then makes one live
NodePrepareResources/NodeUnprepareResources exchange per DRA version against a
Python server built on our stubs, and both sides compare decoded values.
"""

import json
import subprocess
import tempfile
import threading
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from google.protobuf import descriptor_pb2
from test_wirecompat import build_or_skip  # the same build fixture and skip rules

import harness.wire as wire
from harness.launch.gobuild import build

CALL_TIMEOUT_S = 30

# Our generated modules per upstream "api/version" key, as wirecompat names them.
OURS = {
    "deviceplugin/v1beta1": wire.dp,
    "pluginregistration/v1": wire.reg,
    "dra/v1beta1": wire.dra_v1beta1,
    "dra/v1": wire.dra_v1,
    "podresources/v1": wire.podresources,
}
HEALTH_PREFIX = "dra-health/"

CLAIM = {"namespace": "wc-ns", "uid": "wc-uid-1", "name": "wc-claim"}  # what dracall sends
DEVICE = {"request_names": ["req-0"], "pool_name": "pool-a", "device_name": "dev-0",
          "cdi_device_ids": ["example.com/dra=dev-0", "example.com/dra=common"]}
SHARE_ID = "share-7"  # v1 only
UNPREPARE_ERROR = "wc: unprepare refused"  # non-empty, to see field 1 decoded


@pytest.fixture(scope="module")
def wirecompat_bin():
    return build_or_skip(build)


def _run(binary, *args):
    proc = subprocess.run([str(binary), *args], capture_output=True, text=True, timeout=CALL_TIMEOUT_S)
    assert proc.returncode == 0, f"wirecompat {args[0]} exited {proc.returncode}:\n{proc.stderr}"
    return json.loads(proc.stdout)


# ---------------------------------------------------------------------------
# descriptors


def describe(module):
    """The same structure as wirecompat's describeFile, from a generated module's DESCRIPTOR."""
    fd = descriptor_pb2.FileDescriptorProto()
    module.DESCRIPTOR.CopyToProto(fd)
    prefix = f"{fd.package}." if fd.package else ""
    out = {"package": fd.package, "messages": [], "enums": [], "services": []}

    def enum(pfx, e):
        return {"name": pfx + e.name, "values": [{"name": v.name, "number": v.number} for v in e.value]}

    def message(pfx, m):
        name = pfx + m.name
        out["messages"].append({
            "name": name,
            "map_entry": m.options.map_entry,
            "fields": [{
                "name": f.name,
                "number": f.number,
                "label": descriptor_pb2.FieldDescriptorProto.Label.Name(f.label),
                "type": descriptor_pb2.FieldDescriptorProto.Type.Name(f.type),
                "type_name": f.type_name,
                "proto3_optional": f.proto3_optional,
            } for f in m.field],
        })
        for nested in m.nested_type:
            message(name + ".", nested)
        out["enums"].extend(enum(name + ".", e) for e in m.enum_type)

    for m in fd.message_type:
        message(prefix, m)
    out["enums"].extend(enum(prefix, e) for e in fd.enum_type)
    for s in fd.service:
        out["services"].append({"name": prefix + s.name, "methods": [{
            "name": m.name,
            "input_type": m.input_type,
            "output_type": m.output_type,
            "client_streaming": m.client_streaming,
            "server_streaming": m.server_streaming,
        } for m in s.method]})
    return out


@pytest.fixture(scope="module")
def upstream(wirecompat_bin):
    return _run(wirecompat_bin, "descriptors")


def _ours(key):
    if key.startswith(HEALTH_PREFIX):
        version = key[len(HEALTH_PREFIX):]
        module = getattr(wire, f"drahealth_{version}", None)
        assert module is not None, f"no harness.wire.drahealth_{version} for upstream {key}"
        return module
    return OURS[key]


@pytest.mark.parametrize("key", [*OURS, "dra-health/v1alpha1", "dra-health/v1"])
def test_schema_matches_upstream(upstream, key):
    assert key in upstream, sorted(upstream)
    assert describe(_ours(key)) == upstream[key]


def test_every_upstream_health_version_has_ours(upstream):
    health = sorted(k for k in upstream if k.startswith(HEALTH_PREFIX))
    assert health, "wirecompat reports no dra-health version"
    for key in health:
        assert describe(_ours(key)) == upstream[key], key


def test_dra_rpc_paths():
    """Upstream's full method names: the package keeps DRA's Device apart from the device plugin's."""
    for version, module in (("v1", wire.dra_v1), ("v1beta1", wire.dra_v1beta1)):
        service = module.DESCRIPTOR.services_by_name["DRAPlugin"]
        assert [f"/{service.full_name}/{m.name}" for m in service.methods] == [
            f"/k8s.io.kubelet.pkg.apis.dra.{version}.DRAPlugin/NodePrepareResources",
            f"/k8s.io.kubelet.pkg.apis.dra.{version}.DRAPlugin/NodeUnprepareResources",
        ]
    assert wire.dp.Device.DESCRIPTOR.full_name == "v1beta1.Device"
    assert wire.dra_v1beta1.Device.DESCRIPTOR.full_name == "k8s.io.kubelet.pkg.apis.dra.v1beta1.Device"


def test_health_rpc_paths():
    """The service names a plugin advertises in GetInfo are the health services' full names."""
    for version, module in (("v1alpha1", wire.drahealth_v1alpha1), ("v1", wire.drahealth_v1)):
        service = module.DESCRIPTOR.services_by_name["DRAResourceHealth"]
        assert service.full_name == f"{version}.DRAResourceHealth"
        assert [(f"/{service.full_name}/{m.name}", m.server_streaming) for m in service.methods] == [
            (f"/{version}.DRAResourceHealth/NodeWatchResources", True)]


# ---------------------------------------------------------------------------
# one live call per DRA version


class RecordingDRAPlugin:
    """A DRAPlugin servicer on our stubs that records the claims it decoded."""

    def __init__(self, pb2, with_share_id):
        self.pb2, self.with_share_id = pb2, with_share_id
        self.calls = []
        self._lock = threading.Lock()

    def _record(self, method, request):
        with self._lock:
            self.calls.append((method, [{"namespace": c.namespace, "uid": c.uid, "name": c.name}
                                        for c in request.claims]))

    def NodePrepareResources(self, request, context):  # noqa: N802 (gRPC method name)
        self._record("NodePrepareResources", request)
        device = self.pb2.Device(**DEVICE)
        if self.with_share_id:
            device.share_id = SHARE_ID
        return self.pb2.NodePrepareResourcesResponse(
            claims={c.uid: self.pb2.NodePrepareResourceResponse(devices=[device]) for c in request.claims})

    def NodeUnprepareResources(self, request, context):  # noqa: N802 (gRPC method name)
        self._record("NodeUnprepareResources", request)
        return self.pb2.NodeUnprepareResourcesResponse(
            claims={c.uid: self.pb2.NodeUnprepareResourceResponse(error=UNPREPARE_ERROR) for c in request.claims})


@pytest.mark.parametrize("version", ["v1beta1", "v1"])
def test_upstream_kubelet_calls_our_dra_stubs(wirecompat_bin, version):
    pb2, pb2_grpc = getattr(wire, f"dra_{version}"), getattr(wire, f"dra_{version}_grpc")
    plugin = RecordingDRAPlugin(pb2, with_share_id=version == "v1")
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pb2_grpc.add_DRAPluginServicer_to_server(plugin, server)
    with tempfile.TemporaryDirectory(prefix="fakelet-dra-") as tmp:  # short: unix socket paths are limited
        sock = Path(tmp) / "dra.sock"
        server.add_insecure_port(f"unix://{sock}")
        server.start()
        try:
            report = _run(wirecompat_bin, "dracall", "--socket", str(sock), "--version", version)
        finally:
            server.stop(None)

    # What our server decoded from upstream's requests.
    assert plugin.calls == [("NodePrepareResources", [CLAIM]), ("NodeUnprepareResources", [CLAIM])]

    # What upstream decoded from our responses.
    device = dict(DEVICE, share_id=SHARE_ID) if version == "v1" else DEVICE
    assert report == {
        "version": version,
        "prepare": {"claims": {CLAIM["uid"]: {"devices": [device], "error": ""}}},
        "unprepare": {"claims": {CLAIM["uid"]: {"error": UNPREPARE_ERROR}}},
    }
