"""The device manager's checkpoint: the encoding from per-resource parts is json.dumps's, byte for byte."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.kubelet import checkpoint
from harness.kubelet.checkpoint import CheckpointData, PodDeviceEntry

CASES = [
    CheckpointData(),
    CheckpointData(registered={"example.com/gpu": []}),
    CheckpointData([PodDeviceEntry("uid-1", "main", "example.com/gpu", ("gpu-1", "gpu-0"))],
                   {"example.com/gpu": ["gpu-0", "gpu-1"], "a.example/b": ["x"], "é.example/\"q\"": ["ü", "\n"]}),
]


@pytest.mark.parametrize("data", CASES)
def test_encode_is_json_dumps_sorted(data: CheckpointData) -> None:
    parts = {r: checkpoint.device_ids_json(ids) for r, ids in data.registered.items()}
    want = json.dumps(checkpoint._payload(data), sort_keys=True).encode()
    assert checkpoint.encode(data.entries, parts) == want


@pytest.mark.parametrize("data", CASES)
def test_written_checkpoint_reads_back_verified(tmp_path: Path, data: CheckpointData) -> None:
    path = tmp_path / checkpoint.CHECKPOINT_NAME
    checkpoint.write(path, data)
    assert checkpoint.read(path) == data
