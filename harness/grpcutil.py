"""gRPC plumbing shared by the fake kubelet, the probes and the reference plugin."""

from __future__ import annotations

import grpc

# Reconnect quickly: a plugin that appears a moment after we dial should be
# seen at once, not after grpc's default 1 s initial backoff.
CHANNEL_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 50),
    ("grpc.min_reconnect_backoff_ms", 50),
    ("grpc.max_reconnect_backoff_ms", 250),
    ("grpc.enable_retries", 0),
]


def unix_target(path: str) -> str:
    return f"unix://{path}"


def insecure_unix_channel(path: str) -> grpc.Channel:
    return grpc.insecure_channel(unix_target(path), options=CHANNEL_OPTIONS)


def wait_ready(channel: grpc.Channel, timeout_s: float) -> bool:
    """Block until the channel connects (the kubelet's WithBlock dial) or time out."""
    try:
        grpc.channel_ready_future(channel).result(timeout=timeout_s)
        return True
    except grpc.FutureTimeoutError:
        return False


def status_of(err: BaseException) -> str:
    if isinstance(err, grpc.RpcError) and hasattr(err, "code"):
        return f"{err.code().name}: {err.details()}"
    return f"{type(err).__name__}: {err}"
