"""A real node's cgroup root: made before its kubelet starts, removed when it closes.

The kubelet (cgroupfs driver, cgroupsPerQOS) puts every pod under its
`cgroupRoot`, which must exist in every hierarchy beforehand. LocalNode gives
each node a root of its own, named with its owner's tag (harness/launch/owners.py),
so that the next run can remove what a SIGKILLed one left (`reap_cgroups`).
"""

from __future__ import annotations

import contextlib
import re
import time
from pathlib import Path

from harness.launch.owners import tag_alive

CGROUP_FS = "/sys/fs/cgroup"
CGROUP_PREFIX = "fakelet-node-"
CGROUP_REMOVE_TIMEOUT_S = 10.0
CGROUP_RETRY_S = 0.05


def _hierarchies() -> list[Path]:
    return [h for h in Path(CGROUP_FS).iterdir() if h.is_dir() and not h.is_symlink()]


def make_cgroups(root: str) -> None:
    """The kubelet wants its cgroupRoot to exist in every hierarchy before it starts."""
    for hierarchy in _hierarchies():
        (hierarchy / root.lstrip("/")).mkdir(exist_ok=True)


def _remove_tree(top: Path) -> bool:
    """rmdir `top` and everything under it, deepest first; whether it is gone."""
    for path in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
        with contextlib.suppress(OSError):
            path.rmdir()
    with contextlib.suppress(OSError):
        top.rmdir()
    return not top.exists()


def remove_cgroups(root: str, timeout_s: float = CGROUP_REMOVE_TIMEOUT_S) -> list[str]:
    """Remove the node's cgroup root in every hierarchy; return what could not be removed.

    Its processes are gone with the namespace, but the kernel releases a dead task's
    cgroups a moment later (rmdir says EBUSY until then): retry, within a bound."""
    deadline = time.monotonic() + timeout_s
    left = [h / root.lstrip("/") for h in _hierarchies()]
    while True:
        left = [top for top in left if top.is_dir() and not _remove_tree(top)]
        if not left or time.monotonic() > deadline:
            return [str(t) for t in left]
        time.sleep(CGROUP_RETRY_S)  # bounded by the deadline: cgroup v1 gives no "released" event


def reap_cgroups() -> list[str]:
    """Remove the cgroup roots of nodes whose harness died without closing them."""
    gone = []
    for name in sorted({p.name for h in _hierarchies() for p in h.glob(CGROUP_PREFIX + "*")}):
        match = re.fullmatch(re.escape(CGROUP_PREFIX) + r"(\d+-\d+)-[0-9a-f]+", name)
        if match and tag_alive(match.group(1)) is False and not remove_cgroups("/" + name, timeout_s=0):
            gone.append(name)
    return gone
