"""What a container got from the kubelet and its runtime, in one shape for both kubelets.

On the real kubelet it is read from the container's OCI spec (localnode.py);
on the fake one it is what the fake kubelet would hand the runtime: every
Allocate response of the container merged, as upstream's devicemanager
(`DeviceRunContainerOptions`) merges them. Device nodes are compared by
major:minor, as runc gives them to the container.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from typing import Any


@dataclass
class ContainerView:
    devices: dict[str, tuple[int, int]] = field(default_factory=dict)  # container path -> (major, minor)
    mounts: dict[str, str] = field(default_factory=dict)  # container path -> host path
    env: dict[str, str] = field(default_factory=dict)


def device_number(host_path: str) -> tuple[int, int]:
    """major:minor of a device node, (-1, -1) when the path is no device node (runc would refuse it)."""
    try:
        st = os.stat(host_path)
    except OSError:
        return -1, -1
    if not (stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)):
        return -1, -1
    return os.major(st.st_rdev), os.minor(st.st_rdev)


def view_of_responses(responses: list[dict[str, Any]]) -> ContainerView:
    view = ContainerView()
    for r in responses:
        for d in r.get("devices") or []:
            view.devices[d.get("container_path", "")] = device_number(d.get("host_path", ""))
        for m in r.get("mounts") or []:
            view.mounts[m.get("container_path", "")] = m.get("host_path", "")
        view.env.update(r.get("envs") or {})
    return view


def runtime_refusals(responses: list[dict[str, Any]]) -> list[str]:
    """What containerd and runc refuse of the merged Allocate responses, as the real node shows them
    (the container stays in CreateContainerError): a device whose host path is no device node (runc
    libcontainer/devices DeviceFromPath: "not a device node"). Measured on the real node, containerd
    1.6 with runc 1.1 accepts a relative mount destination (runc resolves it under the rootfs), so
    that is no refusal, whatever the OCI spec says; DP-ALC-03 judges such a response on the wire."""
    out = []
    for r in responses:
        for d in r.get("devices") or []:
            if device_number(d.get("host_path", "")) == (-1, -1):
                out.append(f"device host path {d.get('host_path')!r} is not a device node")
    return out
