"""Reading a CDI spec directory: which qualified device names its spec files define."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import yaml

SPEC_SUFFIXES = (".json", ".yaml", ".yml")  # tags.cncf.io/container-device-interface: spec files by extension


def specs(cdi_dir: Path) -> Iterator[tuple[Path, dict]]:
    """Each CDI spec file in the dir, in name order, with its parsed content."""
    for path in sorted(Path(cdi_dir).glob("*")):
        if path.suffix not in SPEC_SUFFIXES or not path.is_file():
            continue
        try:
            text = path.read_text()
            spec = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
        except (OSError, ValueError, yaml.YAMLError):
            continue  # a half-written or foreign file defines nothing we can name
        if isinstance(spec, dict):
            yield path, spec


def defined_devices(cdi_dir: Path) -> dict[str, str]:
    """Qualified CDI device name ("vendor/class=name") -> the spec file that defines it."""
    out: dict[str, str] = {}
    for path, spec in specs(cdi_dir):
        for device in spec.get("devices") or []:
            if isinstance(device, dict) and device.get("name"):
                out[f"{spec.get('kind')}={device['name']}"] = path.name
    return out


def left_for_claim(cdi_dir: Path, uid: str, cdi_ids: list[str],
                   defined: dict[str, str] | None = None) -> dict[str, str]:
    """The claim's own CDI devices still defined after it was unprepared: device -> spec file.

    A claim's own devices are the ones its prepare returned whose name or spec file carries the
    claim's UID. Others may legitimately stay: a device shared by every claim (the example
    driver's `gpu=common`) or a driver's static per-device spec is not the claim's to remove.
    """
    defined = defined_devices(cdi_dir) if defined is None else defined  # one read of the specs serves many claims
    return {c: f for c, f in defined.items() if c in cdi_ids and (uid in c or uid in f)}


def edits_of(cdi_dir: Path, qualified: str) -> list[dict]:
    """The containerEdits a runtime applies for one qualified CDI device ("vendor/class=name"): the device's own,
    then its spec file's (which every device of that file gets); [] when no spec here defines it."""
    kind, _, name = qualified.partition("=")
    for _path, spec in specs(cdi_dir):
        if spec.get("kind") != kind:
            continue
        for device in spec.get("devices") or []:
            if isinstance(device, dict) and device.get("name") == name:
                return [e for e in (device.get("containerEdits"), spec.get("containerEdits")) if isinstance(e, dict)]
    return []
