"""What a container got from the kubelet and its runtime, in one shape for both kubelets.

On the real kubelet it is read from the container's OCI spec (localnode.py);
on the fake one it is what the fake kubelet would hand the runtime: every
Allocate response of the container merged, as upstream's devicemanager
(`DeviceRunContainerOptions`) merges them. Device nodes are compared by
major:minor, as runc gives them to the container. The CDI devices an Allocate
names are the runtime's to apply: a real node's containerd 2 puts their edits
in the spec (`cdi_applied`); the fake kubelet hands them on, and refuses what
containerd 2 refuses of them (a device no spec in the node's CDI dir defines).
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

CDI_SPEC_SUFFIXES = (".json", ".yaml", ".yml")  # tags.cncf.io/container-device-interface: spec files by extension


@dataclass
class ContainerView:
    devices: dict[str, tuple[int, int]] = field(default_factory=dict)  # container path -> (major, minor)
    mounts: dict[str, str] = field(default_factory=dict)  # container path -> host path
    env: dict[str, str] = field(default_factory=dict)
    # The runtime applied the CDI devices the kubelet named: their edits are in devices, mounts and env (containerd
    # 2). False: the fake kubelet's view, or a runtime that ignores CDI devices (Debian's containerd 1.6).
    cdi_applied: bool = False


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


def defined_cdi_devices(cdi_dir: Path) -> set[str]:
    """The qualified CDI device names ("vendor/class=name") the spec files in `cdi_dir` define."""
    out: set[str] = set()
    for path in sorted(Path(cdi_dir).glob("*")):
        if path.suffix not in CDI_SPEC_SUFFIXES or not path.is_file():
            continue
        try:
            text = path.read_text()
            spec = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
        except (OSError, ValueError, yaml.YAMLError):
            continue  # a runtime skips a spec it cannot read, and so defines nothing from it
        if isinstance(spec, dict):
            out |= {f"{spec.get('kind')}={d['name']}" for d in spec.get("devices") or []
                    if isinstance(d, dict) and d.get("name")}
    return out


def runtime_refusals(responses: list[dict[str, Any]], cdi_dir: Path | None = None) -> list[str]:
    """What containerd and runc refuse of the merged Allocate responses, as the real node shows them
    (the container stays in CreateContainerError): a device whose host path is no device node (runc
    libcontainer/devices DeviceFromPath: "not a device node"). Measured on the real node, containerd
    1.6 with runc 1.1 accepts a relative mount destination (runc resolves it under the rootfs), so
    that is no refusal, whatever the OCI spec says; DP-ALC-03 judges such a response on the wire. With
    `cdi_dir` (a runtime that applies CDI devices), a named CDI device no spec there defines (containerd 2
    pkg/cdi/oci_opt.go "CDI device injection failed", wrapping container-device-interface's "unresolvable CDI
    devices")."""
    out = []
    for r in responses:
        for d in r.get("devices") or []:
            if device_number(d.get("host_path", "")) == (-1, -1):
                out.append(f"device host path {d.get('host_path')!r} is not a device node")
    named = [c.get("name", "") for r in responses for c in r.get("cdi_devices") or []]
    if cdi_dir is not None and named:
        defined = defined_cdi_devices(cdi_dir)
        undefined = [n for n in named if n not in defined]
        if undefined:
            out.append(f"CDI device injection failed: unresolvable CDI devices {', '.join(undefined)}")
    return out
