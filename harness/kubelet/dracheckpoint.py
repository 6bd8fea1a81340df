"""The DRA manager's claim checkpoint, in upstream's file format.

Upstream: pkg/kubelet/cm/dra/state (checkpoint.go, state.go) through the
kubelet's checkpointmanager. The file `dra_manager_state` holds
{"Data": "<JSON of CheckpointData>", "Checksum": crc32-IEEE(Data)}; Data is
{"kind", "apiVersion", "ClaimInfoStateList": [ClaimInfoState...]} with Go's
field names (no json tags upstream). Written like Go's json.Marshal (compact,
map keys sorted) so that a checksum we write is the one upstream would compute.
"""

from __future__ import annotations

import json
import os
import zlib
from dataclasses import dataclass, field
from pathlib import Path

CHECKPOINT_NAME = "dra_manager_state"  # kubelet cm/dra manager.go draManagerStateFileName
CHECKPOINT_KIND = "DRACheckpoint"  # kubelet cm/dra/state checkpoint.go CheckpointKind
CHECKPOINT_API_VERSION = "checkpoint.dra.kubelet.k8s.io/v1"  # state checkpoint.go CheckpointAPIVersion
CHECKPOINT_FILE_MODE = 0o644  # kubelet util/store filestore.go writeFile: os.WriteFile(..., 0644)


class CorruptCheckpointError(ValueError):
    """checkpointmanager/errors CorruptCheckpointError: the checksum does not match."""


@dataclass
class Device:
    """state.go Device: one prepared device as NodePrepareResources reported it."""

    pool: str
    device: str
    requests: list[str] = field(default_factory=list)
    cdi_ids: list[str] = field(default_factory=list)
    share_id: str | None = None

    def to_go(self) -> dict:
        return {"PoolName": self.pool, "DeviceName": self.device, "ShareID": self.share_id,
                "RequestNames": self.requests or None, "CDIDeviceIDs": self.cdi_ids or None}

    @classmethod
    def from_go(cls, d: dict) -> Device:
        return cls(d.get("PoolName", ""), d.get("DeviceName", ""), list(d.get("RequestNames") or []),
                   list(d.get("CDIDeviceIDs") or []), d.get("ShareID"))


@dataclass
class ClaimInfoState:
    """state.go ClaimInfoState: one claim the node knows, the pods using it and its devices by driver."""

    uid: str
    name: str
    namespace: str
    pod_uids: set[str] = field(default_factory=set)
    drivers: dict[str, list[Device]] = field(default_factory=dict)  # DriverState: driver -> Devices

    def to_go(self) -> dict:
        return {
            "ClaimUID": self.uid,
            "ClaimName": self.name,
            "Namespace": self.namespace,
            # sets.Set[string] is a map[string]sets.Empty: a JSON object of empty objects.
            "PodUIDs": {uid: {} for uid in sorted(self.pod_uids)},
            "DriverState": {d: {"Devices": [dev.to_go() for dev in devs] or None}
                            for d, devs in sorted(self.drivers.items())},
        }

    @classmethod
    def from_go(cls, d: dict) -> ClaimInfoState:
        return cls(d.get("ClaimUID", ""), d.get("ClaimName", ""), d.get("Namespace", ""),
                   set(d.get("PodUIDs") or {}),
                   {name: [Device.from_go(x) for x in (st or {}).get("Devices") or []]
                    for name, st in (d.get("DriverState") or {}).items()})


def _go_json(value: object) -> str:
    # Go's json.Marshal: compact, map keys sorted, and <, >, & escaped as \u003c, \u003e, \u0026.
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def encode(claims: list[ClaimInfoState] | None) -> bytes:
    """None is the nil list GetOrCreate stores first (JSON null); syncToCheckpoint's list is never nil."""
    data = _go_json({"kind": CHECKPOINT_KIND, "apiVersion": CHECKPOINT_API_VERSION,
                     "ClaimInfoStateList": None if claims is None else [c.to_go() for c in claims]})
    return _go_json({"Data": data, "Checksum": zlib.crc32(data.encode())}).encode()


def decode(blob: bytes, path: Path | str = "checkpoint") -> list[ClaimInfoState]:
    doc = json.loads(blob)
    data = doc["Data"]
    expected = zlib.crc32(data.encode())
    if expected != doc["Checksum"]:
        raise CorruptCheckpointError(f"{path}: checkpoint is corrupted (checksum {doc['Checksum']}, "
                                     f"expected {expected})")
    return [ClaimInfoState.from_go(c) for c in json.loads(data).get("ClaimInfoStateList") or []]


def write(path: Path, claims: list[ClaimInfoState] | None) -> None:
    """Atomically replace the checkpoint (filestore.go writes a temp file and renames it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        f.write(encode(claims))
        f.flush()
        os.fsync(f.fileno())
    os.chmod(tmp, CHECKPOINT_FILE_MODE)
    os.replace(tmp, path)


def read(path: Path) -> list[ClaimInfoState]:
    """checkpointer.go GetOrCreate: a missing file is created empty; a corrupt one is an error."""
    try:
        blob = path.read_bytes()
    except FileNotFoundError:
        write(path, None)
        return []
    return decode(blob, path)
