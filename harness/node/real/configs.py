"""containerd's and the kubelet's configuration for a LocalNode.

Each setting that departs from a default says why; the ones this kind of
machine needs were measured here (cgroup v1, not a full cgroup of its own, see
../shared/design.md "Observed on a real kubelet").
"""

from __future__ import annotations

import json
from pathlib import Path

NODE_STATUS_S = 1  # how often the kubelet posts node status; upstream's default is 10 s (see status_note)
# How long a state must last to count as one an operator saw (the DP-NODE checks, scenario states): more
# than one status period, since a state that a single status report carried lasts about one period on the
# API server, give or take the status loop's jitter (the real kubelet posts even a list its plugin
# withdrew a moment before). Half a period more asks for a state that a second report carried too.
STATE_HOLD_S = 1.5 * NODE_STATUS_S
STATUS_NOTE = (f"the real kubelet posts node status every {NODE_STATUS_S}s here (nodeStatusUpdateFrequency; "
               "upstream's default is 10s), so capacity changes reach the API server within that")


def containerd_toml(socket: Path, image: str) -> str:
    """Debian's containerd 1.6's config (version 2): CRI on `socket`, state under the namespace's private dirs."""
    return f"""version = 2
# /var/lib/containerd and /run/containerd are private tmpfs mounts of the node's namespace.
root = "/var/lib/containerd"
state = "/run/containerd"

[grpc]
  # Outside the private dirs, so that the harness (and ctr) reach it from the host.
  address = "{socket}"

[plugins."io.containerd.grpc.v1.cri"]
  # Built and imported locally (image.py): no registry is reachable.
  sandbox_image = "{image}"
  # Not in a full cgroup of our own here: containerd may only raise oom_score_adj.
  restrict_oom_score_adj = true
  disable_apparmor = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    # overlayfs is not always allowed inside a namespace; "native" copies, and the image is 2 MB.
    snapshotter = "native"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
"""


def containerd2_toml(socket: Path, image: str, cdi_dir: str, shim: str) -> str:
    """containerd 2's config (version 3, containerd 2.0 on): containerd 1.6's settings under their new plugin
    IDs, the runc shim by path (cached as containerd-shim-runc-v2-<hash>, not on PATH), and CDI specs read
    from `cdi_dir` only: the node's, where the drivers write theirs, never the host's /etc/cdi."""
    return f"""version = 3
# /var/lib/containerd and /run/containerd are private tmpfs mounts of the node's namespace.
root = "/var/lib/containerd"
state = "/run/containerd"

[grpc]
  # Outside the private dirs, so that the harness (and ctr) reach it from the host.
  address = "{socket}"

[plugins.'io.containerd.cri.v1.images']
  # overlayfs is not always allowed inside a namespace; "native" copies, and the image is 2 MB.
  snapshotter = "native"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    # Built and imported locally (image.py): no registry is reachable.
    sandbox = "{image}"

[plugins.'io.containerd.cri.v1.runtime']
  # Not in a full cgroup of our own here: containerd may only raise oom_score_adj.
  restrict_oom_score_adj = true
  disable_apparmor = true
  # CDI is always on in containerd 2 (plugins/cri/runtime/plugin.go drops 1.x's enable_cdi): only the dirs.
  cdi_spec_dirs = ["{cdi_dir}"]
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      runtime_path = "{shim}"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        SystemdCgroup = false
"""


def kubelet_config(runtime_socket: Path, cgroup_root: str, port: int,
                   feature_gates: dict[str, bool] | None = None) -> str:
    """A KubeletConfiguration (kubelet.config.k8s.io/v1beta1), as JSON (YAML's subset)."""
    config = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        # cgroup v1 here: 1.35+ refuses to start on it unless told not to.
        "failCgroupV1": False,
        # No systemd in the sandbox: the cgroupfs driver.
        "cgroupDriver": "cgroupfs",
        # Pods' cgroups (kubepods/...) go under a root of this node's own, which LocalNode makes
        # first and removes when it closes. (Without QoS cgroups the kubelet passes no parent and
        # containerd puts containers under /k8s.io, shared with any other CRI client.)
        "cgroupsPerQOS": True,
        "cgroupRoot": cgroup_root,
        "failSwapOn": False,
        "containerRuntimeEndpoint": f"unix://{runtime_socket}",
        # Only the harness talks to this kubelet: its API on loopback, on a port of its own (0 means
        # the default 10250, which a second node would find taken); no read-only or healthz port.
        "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
        "authorization": {"mode": "AlwaysAllow"},
        "address": "127.0.0.1", "port": port, "readOnlyPort": 0, "healthzPort": 0,
        "nodeStatusUpdateFrequency": f"{NODE_STATUS_S}s",
        "nodeStatusReportFrequency": f"{NODE_STATUS_S}s",
        # The host's disk and memory are not this node's: never evict for them, never GC the image.
        "evictionHard": {},
        "imageGCHighThresholdPercent": 100,
        "localStorageCapacityIsolation": False,
        "resolvConf": "",
        "registerNode": True,
        "featureGates": feature_gates or {},
    }
    return json.dumps(config, indent=2) + "\n"
