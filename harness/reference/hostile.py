"""The reference plugins' hostile behaviours: what each does beyond its gRPC handlers.

A hostile behaviour attacks the kubelet (and so fakelet) rather than merely getting the API
wrong. The handlers in device_plugin.py switch them on; what they need that is not about the
device-plugin API lives here, so that the plugin's own code stays readable.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import logging
import os
import signal
import socket
import sys
import tempfile
import threading
from pathlib import Path

import grpc

from harness.instruments.grpcutil import KUBELET_MAX_RECV_BYTES, insecure_unix_channel
from harness.kubelet.checkpoint import CHECKPOINT_NAME
from harness.wire import dp, dp_grpc

log = logging.getLogger("reference-dp")

DP_CHECKPOINT_NAME = CHECKPOINT_NAME
# A message just over what the kubelet's grpc-go receives (its 4 MiB default).
OVER_KUBELET_LIMIT_BYTES = KUBELET_MAX_RECV_BYTES + 1024 * 1024
GIANT_ID_BYTES = 70 * 1000 * 1000  # giant-message: above fakelet's own 64 MiB receive limit too
HUGE_LIST_DEVICES = 100_000  # huge-list: short IDs keep it legal (about 2.5 MB)
OVERSIZED_LIST_DEVICES = 50_000  # oversized-list: with 100-byte IDs, about 5.5 MB
FLOOD_PERIOD_S = 0.001  # list-flood: the same list again after this long
REGISTER_FLOOD = 100  # register-flood: concurrent Register calls
REGISTER_FLOOD_TIMEOUT_S = 15.0
LOG_FLOOD_BYTES = 200 * 1000 * 1000  # log-flood
SETSID_CHILDREN = 100  # setsid-children
OWN_MOUNTS = 18  # own-mounts
GARBAGE = os.urandom(4096)


def wait_until_ended(context: grpc.ServicerContext, stopping: threading.Event) -> None:
    """Hold a stream open without sending, until the kubelet hangs up or the plugin stops."""
    ended = threading.Event()
    context.add_callback(ended.set)
    while not (ended.is_set() or stopping.is_set()):
        ended.wait(0.5)  # both events must be watched: recheck each half second


def phantom_devices(defect: str | None) -> list[dp.Device]:
    """Devices the hardware does not have, in the numbers and sizes each hostile list needs."""
    if defect == "huge-list":
        return _phantoms(HUGE_LIST_DEVICES, "p")
    if defect == "oversized-list":
        return _phantoms(OVERSIZED_LIST_DEVICES, "p" * 92)
    if defect == "giant-message":
        return [dp.Device(ID="g" * GIANT_ID_BYTES, health="Healthy")]
    return []


_PHANTOMS: dict[tuple[int, str], list[dp.Device]] = {}


def _phantoms(count: int, prefix: str) -> list[dp.Device]:
    # Built once: a 100,000-device list costs the plugin a second to build, every time it is sent.
    key = (count, prefix)
    if key not in _PHANTOMS:
        _PHANTOMS[key] = [dp.Device(ID=f"{prefix}{n:07d}", health="Healthy") for n in range(count)]
    return _PHANTOMS[key]


def register_flood(kubelet_socket: str, request: dp.RegisterRequest) -> None:
    """Open REGISTER_FLOOD Register calls at once, and do not wait for their answers."""
    def one() -> None:
        channel = insecure_unix_channel(kubelet_socket)
        try:
            dp_grpc.RegistrationStub(channel).Register(request, timeout=REGISTER_FLOOD_TIMEOUT_S)
        except grpc.RpcError:
            pass
        finally:
            channel.close()
    for _ in range(REGISTER_FLOOD):
        threading.Thread(target=one, daemon=True).start()


def kill(pid: int) -> None:
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGKILL)


def corrupt(path: Path) -> None:
    """Overwrite a file of the kubelet's with garbage, if it is there."""
    try:
        path.write_bytes(GARBAGE)
        log.error("corrupted %s", path)
    except OSError as err:
        log.warning("could not corrupt %s: %s", path, err)


def garbage_server(path: Path) -> socket.socket:
    """A listening socket whose every connection gets random bytes, then a hang-up."""
    path.unlink(missing_ok=True)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    sock.listen(64)

    def serve() -> None:
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            with contextlib.suppress(OSError), conn:
                conn.sendall(GARBAGE)
    threading.Thread(target=serve, daemon=True).start()
    return sock


# -- at start-up, before any thread exists (fork is only safe then) ------------------


def at_start(defect: str | None) -> None:
    if defect == "log-flood":
        threading.Thread(target=_log_flood, daemon=True).start()
    elif defect == "setsid-children":
        _setsid_children()
    elif defect == "own-mounts":
        _own_mounts()


def _log_flood() -> None:
    chunk = b"log-flood " * 100_000 + b"\n"  # 1 MB
    with contextlib.suppress(OSError):
        for _ in range(LOG_FLOOD_BYTES // len(chunk)):
            os.write(sys.stderr.fileno(), chunk)


def _setsid_children() -> None:
    for _ in range(SETSID_CHILDREN):
        if os.fork() == 0:
            os.setsid()  # out of the plugin's session and process group: a kill of those misses it
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT, signal.SIGHUP})
            while True:
                signal.pause()


def _own_mounts() -> None:
    """Mount tmpfs file systems, but only in a mount namespace of its own (fakelet's containment)."""
    tmp = Path(tempfile.gettempdir())
    if not _own_mount_namespace():
        log.warning("own-mounts: not in a mount namespace of my own; not mounting anything")
        return
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    for n in range(OWN_MOUNTS):
        target = tmp / f"own-mount-{n}"
        target.mkdir(exist_ok=True)
        if libc.mount(b"tmpfs", str(target).encode(), b"tmpfs", 0, b"size=1m") != 0:
            log.warning("own-mounts: mount %s: %s", target, os.strerror(ctypes.get_errno()))
            return


def _own_mount_namespace() -> bool:
    """Whether fakelet's launcher says this process has a mount namespace of its own."""
    return "mount" in os.environ.get("FAKELET_CONTAINMENT", "").split(",")
