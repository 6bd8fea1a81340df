"""Wire compatibility of fakelet's hand-written device plugin .proto with upstream.

tests/go/wirecompat is built from upstream k8s.io/kubelet's generated v1beta1
code. Upstream decoding never fails on a field under a wrong number or type, it
just yields a missing or wrong value, so both directions compare values:

(a) fakelet's fake kubelet drives the upstream-typed plugin (`wirecompat plugin`),
    and the plugin's JSON call log says what it decoded from our requests;
(b) the upstream-typed kubelet (`wirecompat kubelet`) drives fakelet's reference
    plugin and reports what it decoded from our responses.
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import grpc
import pytest
import yaml

from harness.instruments.timeline import Timeline
from harness.launch.gobuild import GoUnavailable, build
from harness.launch.process import ProcessLauncher
from harness.launch.sandbox import Sandbox
from harness.node.fake import FakeNode
from harness.spec.profiles import FAST
from harness.wire import dp

REPO = Path(__file__).resolve().parents[1]
MODULE_DIR = REPO / "tests" / "go" / "wirecompat"
INVENTORY = REPO / "fixtures" / "inventories" / "basic.yaml"

WAIT_S = 15.0  # bound for every single wait; passing runs take a fraction of it
EXIT_S = 5.0  # SIGTERM -> exit
KUBELET_TIMEOUT = "20s"  # wirecompat kubelet's own deadline for the whole exchange

WIRE_RESOURCE = "example.com/wire"
WIRE_ENDPOINT = "wirecompat.sock"
REF_RESOURCE = "fakelet.example.com/gpu"
REF_ENDPOINT = "fakelet-dp.sock"
BOTH_OPTIONS = {"pre_start_required": True, "get_preferred_allocation_available": True}

OUT, EXIT = "wirecompat.out", "wirecompat.exit"

# A module download that failed below HTTP: DNS, refused, unreachable, timeouts,
# an unusable HTTP proxy. An HTTP 404/410 (bad pin) or a compile error is not this.
_NETWORK_FAILURE = re.compile(
    r'(?:Get|reading) "?https?://\S+?"?: .*?(?:dial tcp|proxyconnect|no such host|connection refused|'
    r"connection reset|network is unreachable|no route to host|i/o timeout|TLS handshake timeout|"
    r"Client\.Timeout exceeded|server misbehaving|temporary failure in name resolution)",
    re.IGNORECASE,
)
_PROXY_OFF = re.compile(r"module lookup disabled by GOPROXY=off")


def proxy_unreachable(build_error: str) -> str | None:
    """The one-line skip reason if `go build` failed only for want of the module proxy."""
    for line in build_error.splitlines():
        if _NETWORK_FAILURE.search(line) or _PROXY_OFF.search(line):
            detail = line.strip()
            if len(detail) > 200:
                detail = detail[:197] + "..."
            return f"Go module proxy unreachable, cannot build tests/go/wirecompat: {detail}"
    return None


def build_or_skip(build_fn):
    """Build the wirecompat binary; skip if Go or the module proxy is missing, else let errors fail."""
    try:
        return build_fn(MODULE_DIR)
    except GoUnavailable as err:  # before RuntimeError: it is a subclass
        pytest.skip(str(err))
    except RuntimeError as err:
        reason = proxy_unreachable(str(err))
        if reason is None:
            raise
        pytest.skip(reason)


@pytest.fixture(scope="module")
def wirecompat_bin():
    return build_or_skip(build)


# ---------------------------------------------------------------------------
# process helper


class GoProcess:
    """A wirecompat process whose stdout lines land on the timeline as they are written.

    Each line becomes a `wirecompat.out` event (the parsed JSON object, or
    {"raw": text}); EOF becomes a `wirecompat.exit` event with the return code.
    Leaving the `with` block stops the process (SIGTERM, then SIGKILL).
    """

    def __init__(self, name, argv, timeline, log_dir):
        self.name, self.timeline = name, timeline
        self.stderr_path = Path(log_dir) / f"{name}.stderr"
        with open(self.stderr_path, "wb") as stderr:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=stderr,
                                         start_new_session=True)
        self._reader = threading.Thread(target=self._read, daemon=True, name=f"read-{name}")
        self._reader.start()

    def _read(self):
        assert self.proc.stdout is not None
        with self.proc.stdout:
            for raw in self.proc.stdout:
                text = raw.decode(errors="replace").strip()
                if not text:
                    continue
                try:
                    data = json.loads(text)
                except ValueError:
                    data = {"raw": text}
                if not isinstance(data, dict):
                    data = {"raw": text}
                self.timeline.record(OUT, self.name, **data)
        self.timeline.record(EXIT, self.name, returncode=self.proc.wait())

    def out(self, predicate, awaiting, since_ns=0):
        """Wait for a stdout object of this process; give up at once if it exits first."""
        return self.timeline.wait_for(
            lambda e: e.kind == OUT and e.source == self.name and predicate(e.data),
            WAIT_S, f"{self.name}: {awaiting}", since_ns,
            abort=lambda e: e.source == self.name and (e.kind == EXIT or e.get("event") == "register_error"),
        )

    def calls(self, method):
        return [e.data for e in self.timeline.events(kind=OUT)
                if e.source == self.name and e.get("event") == "call" and e.get("method") == method]

    def wait_exit(self, timeout_s=WAIT_S):
        return self.timeline.wait_for(lambda e: e.kind == EXIT and e.source == self.name, timeout_s,
                                      f"{self.name} to exit").get("returncode")

    def terminate(self):
        """SIGTERM and wait; the return code, or None if it had to be killed."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            return self.proc.wait(timeout=EXIT_S)
        except subprocess.TimeoutExpired:
            self.kill()
            return None

    def kill(self):
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=EXIT_S)

    def stderr_tail(self, lines=20):
        try:
            return "\n".join(self.stderr_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if self.proc.poll() is None:
            self.terminate()
        self.kill()  # whatever it left in its session
        self._reader.join(EXIT_S)
        if exc_type is not None:
            print(f"--- {self.name} stderr (tail) ---\n{self.stderr_tail()}")


# ---------------------------------------------------------------------------
# (a) fakelet's kubelet vs the upstream-typed plugin


def expected_wire_allocation(ids):
    """What main.go's Allocate returns for one container, as fakelet's to_dict renders it."""
    joined = ",".join(ids)
    return {
        "envs": {"WIRECOMPAT_DEVICES": joined},
        "mounts": [{"container_path": "/wc", "host_path": "/tmp/wc", "read_only": True}],
        "devices": [{"container_path": "/dev/wc0", "host_path": "/dev/null", "permissions": "rw"}],
        "annotations": {"wirecompat/ids": joined},
        "cdi_devices": [{"name": f"example.com/wire={i}"} for i in ids],
    }


def test_fake_kubelet_drives_upstream_plugin(wirecompat_bin):
    timeline = Timeline()
    with Sandbox() as sb:
        node = FakeNode(sb.plugin_dir, sb.state_dir, timeline, FAST)
        try:
            node.start_kubelet()
            argv = [str(wirecompat_bin), "plugin", "--plugin-dir", str(sb.plugin_dir),
                    "--resource", WIRE_RESOURCE, "--endpoint", WIRE_ENDPOINT, "--timeout", "20s"]
            with GoProcess("wirecompat-plugin", argv, timeline, sb.logs_dir) as plugin:
                _exercise_upstream_plugin(node, plugin, timeline)
                assert plugin.terminate() == 0, "wirecompat plugin must exit 0 on SIGTERM"
        finally:
            node.close()


def _exercise_upstream_plugin(node, plugin, timeline):
    # Registration: what fakelet decoded from upstream's RegisterRequest.
    register = timeline.wait_for(
        lambda e: e.kind == "kubelet.register" and e.get("resource") == WIRE_RESOURCE, WAIT_S,
        f"Register of {WIRE_RESOURCE}", abort=lambda e: e.kind == EXIT)
    assert register.get("accepted") is True, register.data
    assert register.get("version") == "v1beta1"
    assert register.get("endpoint") == WIRE_ENDPOINT
    assert register.get("options") == BOTH_OPTIONS
    assert register.get("served_options") == BOTH_OPTIONS  # GetDevicePluginOptions response
    assert register.get("probe") == {"ok": True}
    plugin.out(lambda d: d.get("event") == "registered", "the Register call to return OK")

    # ListAndWatch: devices, health and NUMA topology as upstream encoded them.
    endpoint_id = register.get("endpoint_id")
    listed = timeline.wait_for(
        lambda e: e.kind == "grpc.stream_msg" and e.get("method") == "ListAndWatch"
        and e.get("endpoint_id") == endpoint_id, WAIT_S, "the first ListAndWatch message")
    devices = {d["ID"]: (d["health"], [int(n["ID"]) for n in d["topology"]["nodes"]])
               for d in listed.get("message")["devices"]}
    assert devices == {"wc-0": ("Healthy", [0]), "wc-1": ("Healthy", [1])}, listed.get("message")
    timeline.wait_for(lambda e: e.kind == "kubelet.devices" and e.get("resource") == WIRE_RESOURCE
                      and e.get("why") == "list", WAIT_S, "the device list to reach node status")
    assert node.capacity(WIRE_RESOURCE) == 2
    assert node.allocatable(WIRE_RESOURCE) == 2
    assert node.devices(WIRE_RESOURCE) == {"wc-0": "Healthy", "wc-1": "Healthy"}

    # Admission: GetPreferredAllocation + Allocate, both directions checked.
    (alloc,) = node.admit_pod("pod-wire", {WIRE_RESOURCE: 2})
    assert alloc.resource == WIRE_RESOURCE and not alloc.reused
    assert sorted(alloc.device_ids) == ["wc-0", "wc-1"]
    assert alloc.response == expected_wire_allocation(alloc.device_ids)

    preferred = plugin.out(lambda d: d.get("method") == "GetPreferredAllocation", "a GetPreferredAllocation call")
    assert preferred.get("request") == {"container_requests": [{
        "available_deviceIDs": ["wc-0", "wc-1"], "must_include_deviceIDs": [], "allocation_size": 2}]}
    allocate = plugin.out(lambda d: d.get("method") == "Allocate", "an Allocate call")
    assert allocate.get("request") == {"container_requests": [{"devices_ids": alloc.device_ids}]}

    # Container start: PreStartContainer with the admitted devices.
    node.start_pod("pod-wire")
    timeline.wait_for(lambda e: e.kind == "kubelet.prestarted" and e.get("pod") == "pod-wire", WAIT_S,
                      "the kubelet to record PreStartContainer")
    prestart = plugin.out(lambda d: d.get("method") == "PreStartContainer", "a PreStartContainer call")
    assert prestart.get("request") == {"devices_ids": alloc.device_ids}

    # Error statuses cross the wire intact: upstream answers an unknown ID with InvalidArgument.
    endpoint = node.manager.endpoint(WIRE_RESOURCE)
    assert endpoint is not None
    request = dp.AllocateRequest(container_requests=[dp.ContainerAllocateRequest(devices_ids=["wc-9"])])
    with pytest.raises(grpc.RpcError) as err:
        endpoint.stub.Allocate(request, timeout=WAIT_S)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details() == 'unknown device id "wc-9"'

    # Empty requests decoded as empty, and nothing was called more than expected.
    assert all(c.get("request") == {} for c in plugin.calls("GetDevicePluginOptions") + plugin.calls("ListAndWatch"))
    assert len(plugin.calls("ListAndWatch")) == 1
    assert len(plugin.calls("GetPreferredAllocation")) == 1
    assert len(plugin.calls("PreStartContainer")) == 1


# ---------------------------------------------------------------------------
# (b) the upstream-typed kubelet vs fakelet's reference plugin


def test_upstream_kubelet_drives_reference_plugin(wirecompat_bin):
    timeline = Timeline()
    with Sandbox() as sb:
        inventory = sb.path / "inventory.yaml"
        shutil.copyfile(INVENTORY, inventory)
        inv_devices = yaml.safe_load(inventory.read_text())["devices"]
        for d in inv_devices:
            (sb.dev_dir / d["dev"]).touch()

        kubelet_argv = [str(wirecompat_bin), "kubelet", "--plugin-dir", str(sb.plugin_dir),
                        "--timeout", KUBELET_TIMEOUT]
        plugin_argv = [sys.executable, "-m", "harness.reference.device_plugin", "--plugin-dir", str(sb.plugin_dir),
                       "--inventory", str(inventory), "--dev-dir", str(sb.dev_dir),
                       "--cdi-dir", str(sb.cdi_dir)]  # so that Allocate names CDI devices too
        reference = ProcessLauncher("reference-dp", plugin_argv, dict(os.environ, GRPC_VERBOSITY="ERROR"),
                                    sb.logs_dir / "reference-dp.log", timeline)
        with GoProcess("wirecompat-kubelet", kubelet_argv, timeline, sb.logs_dir) as kubelet:
            try:
                reference.start()
                returncode = kubelet.wait_exit(WAIT_S + 15)  # beyond the kubelet's own 20 s deadline
                assert returncode == 0, (f"wirecompat kubelet exited {returncode}:\n{kubelet.stderr_tail()}\n"
                                         f"--- reference-dp log ---\n{reference.log_tail()}")
            finally:
                reference.stop()
            lines = [e.data for e in timeline.events(kind=OUT) if e.source == kubelet.name]
        assert len(lines) == 1 and "raw" not in lines[0], lines
        _check_kubelet_report(lines[0], sb.dev_dir, [d["id"] for d in inv_devices])
        assert not (sb.plugin_dir / "kubelet.sock").exists(), "wirecompat kubelet left kubelet.sock behind"


def _check_kubelet_report(report, dev_dir, inventory_ids):
    assert inventory_ids == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]  # the fixture the expectations below assume
    assert report["register"] == {"version": "v1beta1", "endpoint": REF_ENDPOINT, "resource_name": REF_RESOURCE,
                                  "options": BOTH_OPTIONS}
    assert report["options"] == BOTH_OPTIONS
    assert report["devices"] == [
        {"id": "gpu-0", "health": "Healthy", "numa": [0]},
        {"id": "gpu-1", "health": "Healthy", "numa": [0]},
        {"id": "gpu-2", "health": "Healthy", "numa": [1]},
        {"id": "gpu-3", "health": "Healthy", "numa": [1]},
    ]
    # must_include (the first listed device) first, then the NUMA-local one, size 2.
    preferred = report["preferred"]
    assert preferred is not None and len(preferred) == 2 and preferred[0] == "gpu-0", preferred
    assert preferred == ["gpu-0", "gpu-1"]
    # wirecompat allocates the first listed device for one container.
    assert report["allocate"] == {
        "envs": {"FAKELET_DEVICES": "gpu-0"},
        "mounts": [{"container_path": "/run/fakelet", "host_path": str(dev_dir), "read_only": True}],
        "devices": [{"container_path": "/dev/fakelet/gpu-0", "host_path": str(dev_dir / "fakegpu0"),
                     "permissions": "rw"}],
        "annotations": {"fakelet.example.com/devices": "gpu-0"},
        "cdi_devices": ["fakelet.example.com/gpu=gpu-0"],
    }
    assert report["prestart"] is True


# ---------------------------------------------------------------------------
# the build fixture's skip/fail decision (runs without Go)

_COMPILE_ERROR = "go build . in /x/wirecompat failed:\n./main.go:12:2: undefined: v1beta1.Foo\n"
_REFUSED = ('go build . in /x/wirecompat failed:\nmain.go:37:2: google.golang.org/grpc@v1.79.3: Get '
            '"https://127.0.0.1:1/google.golang.org/grpc/@v/v1.79.3.zip": dial tcp 127.0.0.1:1: connect: '
            "connection refused\n")
_NO_HOST = ('go: downloading k8s.io/kubelet v0.37.2\nmain.go:44:2: k8s.io/kubelet@v0.37.2: Get '
            '"https://proxy.golang.org/k8s.io/kubelet/@v/v0.37.2.zip": dial tcp: lookup proxy.golang.org on '
            "10.0.0.53:53: no such host\n")
_NOT_FOUND = ('go: k8s.io/kubelet@v0.99.0: reading https://proxy.golang.org/k8s.io/kubelet/@v/v0.99.0.info: '
              "404 Not Found\n")


@pytest.mark.parametrize(("error", "skips"), [
    (GoUnavailable("go toolchain not found on PATH"), "go toolchain not found on PATH"),
    (RuntimeError(_REFUSED), "Go module proxy unreachable"),
    (RuntimeError(_NO_HOST), "Go module proxy unreachable"),
    (RuntimeError("main.go:37:2: module lookup disabled by GOPROXY=off\n"), "Go module proxy unreachable"),
    (RuntimeError(_COMPILE_ERROR), None),
    (RuntimeError(_NOT_FOUND), None),
])
def test_build_failure_skips_only_for_missing_go_or_proxy(error, skips):
    def failing_build(module_dir):
        assert module_dir == MODULE_DIR
        raise error

    if skips is None:
        with pytest.raises(RuntimeError) as raised:
            build_or_skip(failing_build)
        assert raised.value is error
        return
    with pytest.raises(pytest.skip.Exception) as skipped:
        build_or_skip(failing_build)
    reason = skipped.value.msg
    assert skips in reason and "\n" not in reason, reason
