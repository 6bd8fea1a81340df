"""CDI spec files for the reference DRA driver: one JSON file per prepared claim.

The Container Device Interface spec (github.com/cncf-tags/container-device-interface,
SPEC.md) names a device `<vendor>/<class>=<name>`; the runtime finds its edits
in a spec file whose `kind` is `<vendor>/<class>`. Upstream's kubeletplugin
helper (draplugin.go, PrepareResourceClaims) advises a device name that is
never reused, because runtimes may cache specs: the claim UID makes it unique.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any

# specs-go version.go: "The HostPath field was added in v0.5.0"; declare the minimum we need.
CDI_VERSION = "0.5.0"
# SPEC.md: a device name is letters, digits and '_', '-', '.', ':', starting with a letter or digit.
DEVICE_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]*$")


def qualified_id(vendor: str, cls: str, name: str) -> str:
    """A fully qualified CDI device ID, as the kubelet passes it to the runtime."""
    return f"{vendor}/{cls}={name}"


def device_name(claim_uid: str, device: str, nonce: str = "") -> str:
    name = f"{claim_uid}-{device}" if not nonce else f"{claim_uid}-{nonce}-{device}"
    if not DEVICE_NAME_RE.match(name):
        raise ValueError(f"CDI device name {name!r} is not valid")
    return name


def spec_path(cdi_dir: Path, vendor: str, cls: str, claim_uid: str) -> Path:
    # cdi pkg/cdi spec.go GenerateTransientSpecName: <vendor>-<class>_<transient id>
    return cdi_dir / f"{vendor}-{cls}_{claim_uid}.json"


def build_spec(vendor: str, cls: str, claim_uid: str, devices: list[dict[str, Any]]) -> dict[str, Any]:
    """devices: [{"name": CDI device name, "node": container path, "host": host path, "env": {...}}]."""
    return {
        "cdiVersion": CDI_VERSION,
        "kind": f"{vendor}/{cls}",
        "devices": [
            {
                "name": d["name"],
                "containerEdits": {
                    "env": [f"{k}={v}" for k, v in sorted(d.get("env", {}).items())],
                    "deviceNodes": [{"path": d["node"], "hostPath": d["host"], "permissions": "rw"}],
                },
            }
            for d in devices
        ],
        "containerEdits": {"env": [f"FAKELET_CLAIM_UID={claim_uid}"]},
    }


def write_spec(path: Path, spec: dict[str, Any]) -> None:
    """Atomically: a runtime that re-reads the directory never sees half a spec."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(spec, f, indent=2, sort_keys=True)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # the runtime may read it as another user
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def remove_spec(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass
