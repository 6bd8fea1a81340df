"""The control plane's API version, and how a backend says it cannot be one (the backend itself: backend.py)."""

from __future__ import annotations

RESOURCE_API = "/apis/resource.k8s.io/v1"  # resource.k8s.io/v1: DRA's GA API version (Kubernetes 1.34)


class ControlPlaneUnavailable(RuntimeError):
    """No API server can be had here; str(err) is a one-line reason naming what is missing.

    Callers turn it into a skip (with this text) or an exit-2 error.
    """


class ControlPlaneStartError(ControlPlaneUnavailable):
    """Everything needed was there, but the control plane did not come up.

    The first line of str(err) is the reason; the lines after it are the tail
    of the failing process's log. It is a ControlPlaneUnavailable so that
    generic handlers still work, but the harness's own tests fail on it rather
    than skip: a server that crashes on our flags is our bug, not a missing tool.
    """
