"""The kubelet's rate limit on its PodResources API, for both sides of the socket.

Upstream serves PodResources behind a token bucket (pkg/kubelet/apis/grpc/ratelimit.go, golang.org/x/time/rate):
one bucket per server, shared by every client, full at start, refilled at DefaultQPS; a call that finds it empty
is rejected before its handler runs. The fake kubelet's server applies the same bucket, so a reader that bursts
is told so on both kubelets. fakelet's own readers (scenario conditions, the real node's pod view) keep under it
with a bucket of their own per socket: a condition judged on every timeline event can burst past 10 calls.
"""

from __future__ import annotations

import threading
import time

DEFAULT_QPS = 100.0  # podresources constants.go DefaultQPS
DEFAULT_BURST_TOKENS = 10  # podresources constants.go DefaultBurstTokens
# podresources/grpc ratelimit.go ErrorLimitExceeded: codes.ResourceExhausted with this text.
LIMIT_EXCEEDED = "rejected by rate limit"


class TokenBucket:
    """x/time/rate's Limiter as upstream uses it: `allow` takes a token if one is there (the server side);
    `reserve` takes the next one and says how long to wait for it (a client pacing itself)."""

    def __init__(self, qps: float = DEFAULT_QPS, burst: int = DEFAULT_BURST_TOKENS) -> None:
        self.qps, self.burst = qps, burst
        self._tokens = float(burst)
        self._at = time.monotonic()
        self._lock = threading.Lock()

    def _refill(self, now: float) -> None:
        self._tokens = min(float(self.burst), self._tokens + (now - self._at) * self.qps)
        self._at = now

    def allow(self) -> bool:
        with self._lock:
            self._refill(time.monotonic())
            if self._tokens < 1:
                return False
            self._tokens -= 1
            return True

    def reserve(self) -> float:
        """Take the next token, owed if need be; the seconds until it is there (0 when it is there now)."""
        with self._lock:
            self._refill(time.monotonic())
            self._tokens -= 1
            return max(-self._tokens, 0.0) / self.qps


# fakelet's own readers keep a margin under the kubelet's bucket: the two clocks differ by a call's transit, and
# a client that spends its token the instant the server's comes back is rejected on a rounding error.
CLIENT_QPS = DEFAULT_QPS * 0.8
CLIENT_BURST = DEFAULT_BURST_TOKENS - 2

_client_buckets: dict[str, TokenBucket] = {}
_client_lock = threading.Lock()


def pace(socket: str, deadline: float) -> None:
    """Wait for this process's next PodResources token on `socket`, never past `deadline` (a call made then
    may be rejected, which its caller reads as an answer not had)."""
    with _client_lock:
        bucket = _client_buckets.get(socket)
        if bucket is None:
            bucket = _client_buckets[socket] = TokenBucket(CLIENT_QPS, CLIENT_BURST)
    delay = min(bucket.reserve(), max(deadline - time.monotonic(), 0.0))
    if delay > 0:
        time.sleep(delay)  # pacing to a rate, bounded by the caller's deadline: nothing to wait for but the clock
