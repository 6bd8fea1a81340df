"""The kubelet's client to one device plugin (harness/kubelet/endpoint.py) when threads race on its channel.

Issue 39 defect 3: under a Register flood, one thread closed an endpoint's channel while its ListAndWatch
thread started the stream, and grpc-python crashed the process (SIGSEGV in `unary_stream`).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading

import grpc
import test_devicemanager as dm
from test_devicemanager import HEALTHY, RES, WAIT_S, Plugin, register_and_list

from harness.instruments.grpcutil import unix_target
from harness.wire import dp, dp_grpc

sandbox, timeline, make_node, make_plugin = dm.sandbox, dm.timeline, dm.make_node, dm.make_plugin  # fixtures

FLOOD = 200  # Register calls, from FLOOD_THREADS threads at once
FLOOD_THREADS = 4

# Run apart, so that a crash is this test's failure and not its pytest process's death.
_CLOSED_CHILD = """
import threading
import grpc
from harness.instruments.timeline import Timeline
from harness.kubelet.endpoint import Endpoint

ep = Endpoint("example.com/foo", "/nonexistent/fakelet-plugin.sock", Timeline(), hang_bound_s=1.0)
ep.close()  # as another thread does when it stops the endpoint
ended = []
ep.run(lambda e, r: None, lambda e, reason: ended.append(reason))
ep.join(5.0)
try:
    ep.allocate(["d0"])
except grpc.RpcError as err:
    print(ended, err.code().name)
"""


def test_calls_on_an_endpoint_another_thread_closed_fail_cancelled_and_never_crash() -> None:
    proc = subprocess.run([sys.executable, "-c", _CLOSED_CHILD], capture_output=True, text=True, timeout=60)
    died = f" (died of {signal.Signals(-proc.returncode).name})" if proc.returncode < 0 else ""
    assert proc.returncode == 0, f"exit {proc.returncode}{died}: {proc.stderr[-2000:]}"
    assert proc.stdout.strip() == "['stopped by kubelet'] CANCELLED"


class _BriefPlugin(Plugin):
    """Ends each ListAndWatch after its first list: every stream end disconnects the resource's current
    endpoint (up to 1.36, kubernetes#121994), whose stream a flood is starting at that moment."""

    def ListAndWatch(self, request, context):  # noqa: N802
        self._log("ListAndWatch", request, context)
        yield dp.ListAndWatchResponse(devices=[dp.Device(ID=i, health=h) for i, h in self.devices or []])


def test_a_register_flood_leaves_the_kubelet_serving_the_last_registration(timeline, make_node, make_plugin,
                                                                            sandbox) -> None:
    node = make_node()
    brief = _BriefPlugin(sandbox.plugin_dir, "brief.sock", [("b0", HEALTHY)]).serve()
    request = dp.RegisterRequest(version="v1beta1", endpoint="brief.sock", resource_name=RES)
    calls = iter(range(FLOOD))
    lock = threading.Lock()

    def flood() -> None:
        with grpc.insecure_channel(unix_target(str(node.kubelet_socket))) as channel:
            stub = dp_grpc.RegistrationStub(channel)
            while True:
                with lock:
                    if next(calls, None) is None:
                        return
                try:
                    stub.Register(request, timeout=WAIT_S)
                except grpc.RpcError:
                    pass  # refused while the kubelet was busy: a verdict on the plugin, not a kubelet failure

    try:
        threads = [threading.Thread(target=flood) for _ in range(FLOOD_THREADS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        brief.stop()
    accepted = {e.get("endpoint_id") for e in timeline.find(lambda e: e.kind == "kubelet.register"
                                                            and e.get("accepted"))}
    assert accepted, "no Register of the flood was accepted"

    # Every endpoint's stream ends through the kubelet's own path (a watcher that died of an error never does).
    for endpoint_id in sorted(accepted):
        timeline.wait_for(lambda e, i=endpoint_id: e.kind == "kubelet.stream_end" and e.get("endpoint_id") == i,
                          WAIT_S, f"the stream end of endpoint {endpoint_id}")
    plugin = make_plugin()
    register_and_list(node, timeline, plugin)
    assert node.allocatable(RES) == 3
