"""gRPC plumbing shared by the fake kubelet, the probes and the reference plugin."""

from __future__ import annotations

import grpc

# The kubelet sets no message size on any of its plugin channels or servers, so grpc-go's
# defaults hold: 4 MiB received per message, either side (grpc-go defaultClientMaxReceiveMessageSize,
# defaultServerMaxReceiveMessageSize). A message above it fails the kubelet's call with
# RESOURCE_EXHAUSTED.
KUBELET_MAX_RECV_BYTES = 4 * 1024 * 1024
# fakelet reads up to this much, so that a message the kubelet would refuse is a finding that
# says what it was, not an opaque transport error. Beyond it the transport error is the verdict.
FAKELET_MAX_RECV_BYTES = 64 * 1024 * 1024


def over_kubelet_limit(message: object) -> int | None:
    """The serialized size of a protobuf message when the kubelet could not receive it, else None."""
    size = message.ByteSize()  # type: ignore[attr-defined]
    return size if size > KUBELET_MAX_RECV_BYTES else None


# Reconnect quickly: a plugin that appears a moment after we dial should be
# seen at once, not after grpc's default 1 s initial backoff.
CHANNEL_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 50),
    ("grpc.min_reconnect_backoff_ms", 50),
    ("grpc.max_reconnect_backoff_ms", 250),
    ("grpc.enable_retries", 0),
    ("grpc.max_receive_message_length", FAKELET_MAX_RECV_BYTES),
]
SERVER_OPTIONS = [("grpc.max_receive_message_length", FAKELET_MAX_RECV_BYTES)]


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
