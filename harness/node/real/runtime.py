"""The real node's container runtime: containerd 2, built from the Go module proxy, or Debian's containerd.

Debian's containerd 1.6 ignores the CDI devices the kubelet passes it (containerd applies them from 1.7 on,
always from 2.0), so no driver's environment reaches a container there and KEP5970-05 cannot be judged.
The real node therefore runs containerd 2 (the daemon, its runc shim and ctr), built from the wrapper
module fixtures/go/containerd like the kubelet and cached beside it, with Debian's runc. Where it cannot
be built (no Go, no proxy), the node runs Debian's containerd and says, in one line, what is then not judged.

$FAKELET_NODE_RUNTIME=debian asks for Debian's containerd; `fakelet run` sets it for its check processes
once it has decided (`announce`), so that a failed build is tried once per run, not once per check.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from harness.launch import gobuild
from harness.spec import bundled

CONTAINERD_MODULE = "containerd"  # fixtures/go/containerd: github.com/containerd/containerd/v2 v2.4.2
CONTAINERD = "github.com/containerd/containerd/v2"
# The binaries containerd 2 needs here, by the names containerd and the kubelet know them.
COMMANDS = {"containerd": f"{CONTAINERD}/cmd/containerd",
            "containerd-shim-runc-v2": f"{CONTAINERD}/cmd/containerd-shim-runc-v2",
            "ctr": f"{CONTAINERD}/cmd/ctr"}
WHY = "for the real node (containerd 2 applies CDI devices)"
RUNTIME_ENV = "FAKELET_NODE_RUNTIME"
DEBIAN = "debian"  # $FAKELET_NODE_RUNTIME's value (with ": reason" when a run decided it)
BUILT = "containerd2"
VERSION_TIMEOUT_S = 10.0  # `containerd --version`: instant
# What needs a runtime that applies CDI devices, and is not judged on Debian's containerd.
CDI_CHECKS = ("KEP5970-05 (the driver's environment in its container) is not exercised, and DP-NODE-04 does not "
              "judge the edits of a device plugin's CDI devices")


class RuntimeUnavailable(RuntimeError):
    """containerd 2 cannot be built here: its one-line reason."""


@dataclass(frozen=True)
class NodeRuntime:
    """The containerd a real node runs: its binaries, and whether it applies CDI devices."""

    containerd: str
    ctr: str
    shim: str | None  # the runc shim's path for CRI's runtime_path; None: containerd finds it on PATH
    version: str  # "2.4.2", "1.6.20~ds1"
    cdi: bool
    reason: str | None = None  # why the node runs Debian's containerd

    @property
    def fallback(self) -> str | None:
        """The one line a run prints when its node runs Debian's containerd; None for containerd 2."""
        return None if self.cdi else fallback_line(self.version, self.reason or "")

    @property
    def label(self) -> str:
        return (f"containerd {self.version} (built from the Go module proxy)" if self.cdi
                else f"Debian's containerd {self.version}")


def module() -> Path:
    return bundled.go_module(CONTAINERD_MODULE)


def pinned_version() -> str:
    """containerd's version as fixtures/go/containerd pins it, without the v ("2.4.2")."""
    found = gobuild.required_version(module() / "go.mod", COMMANDS["containerd"])
    return (found or "2").lstrip("v")


def from_binaries(paths: dict[str, Path]) -> NodeRuntime:
    return NodeRuntime(containerd=str(paths["containerd"]), ctr=str(paths["ctr"]),
                       shim=str(paths["containerd-shim-runc-v2"]), version=pinned_version(), cdi=True)


def cached() -> NodeRuntime | None:
    """containerd 2 when its three binaries are in the cache; never builds (doctor and provenance ask)."""
    found = {name: gobuild.cached(module(), package, name) for name, package in COMMANDS.items()}
    if any(p is None for p in found.values()):
        return None
    return from_binaries({name: p for name, p in found.items() if p is not None})


def build() -> NodeRuntime:
    """containerd 2, built on first use (minutes, once per machine: gobuild.COLD_BUILD_S); RuntimeUnavailable."""
    paths: dict[str, Path] = {}
    for name, package in COMMANDS.items():
        try:
            paths[name] = gobuild.build(module(), package, name, why=WHY)
        except gobuild.GoUnavailable as err:
            raise RuntimeUnavailable(str(err).splitlines()[0]) from None
        except (RuntimeError, FileNotFoundError, subprocess.TimeoutExpired) as err:
            last = [line.strip() for line in str(err).splitlines() if line.strip()][-1:] or ["?"]
            raise RuntimeUnavailable(f"building {name} from {CONTAINERD} v{pinned_version()} failed: {last[0]}") \
                from None
    return from_binaries(paths)


def debian_version() -> str:
    """Debian's containerd's own version ("1.6.20~ds1"), or "1.6" when it does not say."""
    binary = shutil.which("containerd")
    if binary is None:
        return "1.6"
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=VERSION_TIMEOUT_S).stdout
    except (OSError, subprocess.SubprocessError):
        return "1.6"
    # "containerd github.com/containerd/containerd 1.6.20~ds1 1.6.20~ds1-1+deb12u3"
    match = re.search(r"\s(v?\d+\.\d+\S*)", out)
    return match.group(1).lstrip("v") if match else "1.6"


def fallback_line(version: str, reason: str) -> str:
    """The one line a run prints when its real node runs Debian's containerd."""
    return (f"fakelet: the real node runs Debian's containerd {version}, which applies no CDI devices "
            f"({reason}): {CDI_CHECKS}")


def debian(reason: str) -> NodeRuntime:
    return NodeRuntime(containerd="containerd", ctr="ctr", shim=None, version=debian_version(), cdi=False,
                       reason=reason)


def find() -> NodeRuntime:
    """The runtime the real node runs: containerd 2 (built on first use), else Debian's with its fallback line."""
    asked = os.environ.get(RUNTIME_ENV, "")
    if asked.startswith(DEBIAN):
        reason = asked.partition(":")[2].strip() or f"${RUNTIME_ENV}={DEBIAN}"
        return debian(reason)
    try:
        return build()
    except RuntimeUnavailable as err:
        fallback = debian(f"containerd 2 could not be built: {err}")
        announce(fallback)  # this process's next node, and its children, do not try the build again
        return fallback


def in_use() -> NodeRuntime | None:
    """containerd 2 when a run's node runs it (as decided, and cached); None: Debian's. Never builds."""
    if os.environ.get(RUNTIME_ENV, "").startswith(DEBIAN):
        return None
    return cached()


def announce(runtime: NodeRuntime) -> None:
    """Tell a run's check processes what was decided, so that none of them tries a failed build again."""
    os.environ[RUNTIME_ENV] = BUILT if runtime.cdi else f"{DEBIAN}: {runtime.reason}"
