"""Subject profiles: how to launch a known plugin and what it should expose.

Profiles are data in fixtures/subjects/<name>.yaml. A profile names its
launcher, its command template, the resource it registers, the device files
the harness creates for it and the device IDs it should list, and, for the
reference plugins, the defects and the checks each must fail.
"""

from __future__ import annotations

import os
import shlex
import shutil
import socket
import string
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

LAUNCHERS = ("process", "mount-namespace")
KINDS = ("device-plugin", "dra")
OBSERVABLES = ("health", "temperature", "hotplug")


class ProfileError(ValueError):
    """A subject profile or subject flag is wrong; the message says where."""


def repo_root() -> Path:
    return Path(__file__).resolve().parent.parent


def fixtures_dir() -> Path:
    """Where fixtures/ lives: $FAKELET_FIXTURES, the source tree, or the installed data files."""
    candidates = [os.environ.get("FAKELET_FIXTURES"), repo_root() / "fixtures",
                  Path(sys.prefix) / "share" / "fakelet" / "fixtures"]
    for candidate in candidates:
        if candidate and (Path(candidate) / "subjects").is_dir():
            return Path(candidate)
    raise ProfileError("fixtures/ not found: set FAKELET_FIXTURES to the fakelet fixtures directory")


@dataclass
class Defect:
    name: str
    description: str
    kills: list[str]


@dataclass
class SubjectSpec:
    name: str
    kind: str
    command: list[str]
    resource: str
    launcher: str = "process"
    description: str = ""
    env: dict[str, str] = field(default_factory=dict)
    socket: str | None = None
    inventory: str | None = None
    dev_files: list[str] = field(default_factory=list)
    expected_ids: list[str] | None = None
    expected_count: int | None = None
    opaque_ids: bool = False  # the plugin names devices its own way (hashes): compare counts, not IDs
    defect_args: list[str] = field(default_factory=list)
    defects: dict[str, Defect] = field(default_factory=dict)
    build: dict[str, str] | None = None
    private_dirs: list[str] = field(default_factory=list)
    # The fake device backend wired to this subject: inventory, skin, and which
    # of its changes the plugin can see (health, temperature, hotplug).
    backend: dict[str, str] | None = None
    observes: list[str] = field(default_factory=list)
    thermal: tuple[float, float] = (85.0, 5.0)  # threshold and hysteresis, degrees C
    source: str = "<flags>"
    reference: bool = False
    driver: str | None = None  # a DRA subject's driver name (its `resource` is the same)
    needs_api: bool = False  # a DRA driver that cannot start without an API server
    # Python distributions the subject imports: {"distribution": "name==x", "import": "module"}
    requires_python: dict[str, str] | None = None
    notes: str = ""

    @property
    def is_dra(self) -> bool:
        return self.kind == "dra"

    def expected_devices(self, inventory: list[dict[str, Any]] | None) -> tuple[list[str] | None, int | None]:
        if self.expected_ids is not None:
            return sorted(self.expected_ids), len(self.expected_ids)
        if inventory is not None and self.opaque_ids:
            return None, len(inventory)
        if inventory is not None:
            ids = sorted(d["id"] for d in inventory)
            return ids, len(ids)
        return None, self.expected_count


def _require(doc: dict[str, Any], key: str, kind: type, where: str) -> Any:
    if key not in doc:
        raise ProfileError(f"{where}: missing required key '{key}'")
    value = doc[key]
    if not isinstance(value, kind):
        raise ProfileError(f"{where}: '{key}' must be a {kind.__name__}, got {type(value).__name__}")
    return value


def parse_profile(doc: Any, where: str) -> SubjectSpec:
    if not isinstance(doc, dict):
        raise ProfileError(f"{where}: a subject profile must be a mapping")
    kind = _require(doc, "kind", str, where)
    if kind not in KINDS:
        raise ProfileError(f"{where}: kind {kind!r} is not one of {', '.join(KINDS)}")
    launcher = doc.get("launcher", "process")
    if launcher not in LAUNCHERS:
        raise ProfileError(f"{where}: launcher {launcher!r} is not one of {', '.join(LAUNCHERS)}")
    command = _require(doc, "command", list, where)
    if not command or not all(isinstance(a, str) for a in command):
        raise ProfileError(f"{where}: 'command' must be a non-empty list of strings")
    devices = doc.get("devices") or {}
    backend = doc.get("backend")
    if backend is not None and (not isinstance(backend, dict) or "inventory" not in backend):
        raise ProfileError(f"{where}: 'backend' must be a mapping with an 'inventory'")
    backend = backend or {}
    observes = [str(o) for o in backend.get("observes") or doc.get("observes") or []]
    unknown = sorted(set(observes) - set(OBSERVABLES))
    if unknown:
        raise ProfileError(f"{where}: backend.observes has unknown {unknown}; known: {list(OBSERVABLES)}")
    thermal = backend.get("thermal") or {}
    private_dirs = [str(d) for d in doc.get("private_dirs") or []]
    if private_dirs and launcher != "mount-namespace":
        raise ProfileError(f"{where}: private_dirs needs launcher: mount-namespace")
    if any(not d.startswith("/") for d in private_dirs):
        raise ProfileError(f"{where}: private_dirs must be absolute paths")
    defects = {}
    for name, d in (doc.get("defects") or {}).items():
        if not isinstance(d, dict) or not isinstance(d.get("kills"), list):
            raise ProfileError(f"{where}: defect {name!r} needs a 'kills' list of check IDs")
        defects[name] = Defect(name, str(d.get("description", "")), [str(k) for k in d["kills"]])
    if kind == "dra":
        driver = _require(doc, "driver", str, where)
        resource = driver
    else:
        driver, resource = None, _require(doc, "resource", str, where)
    return SubjectSpec(
        name=_require(doc, "name", str, where), kind=kind, command=command, driver=driver,
        resource=resource, launcher=launcher,
        description=str(doc.get("description", "")),
        env={str(k): str(v) for k, v in (doc.get("env") or {}).items()},
        socket=doc.get("socket"), inventory=doc.get("inventory"),
        dev_files=list(devices.get("files") or []), expected_ids=devices.get("expected_ids"),
        expected_count=devices.get("expected_count"), opaque_ids=devices.get("ids") == "opaque",
        defect_args=list(doc.get("defect_args") or []),
        defects=defects, build=doc.get("build"), private_dirs=private_dirs, source=where,
        backend={k: str(v) for k, v in backend.items() if k in ("inventory", "skin")} or None,
        observes=observes,
        thermal=(float(thermal.get("threshold_c", 85.0)), float(thermal.get("hysteresis_c", 5.0))),
        reference=bool(doc.get("reference", False)),
        needs_api=bool(doc.get("needs_api", False)), requires_python=_python_requirement(doc, where),
        notes=str(doc.get("notes", "")),
    )


def _python_requirement(doc: dict[str, Any], where: str) -> dict[str, str] | None:
    python = (doc.get("requires") or {}).get("python")
    if python is None:
        return None
    if not isinstance(python, dict) or not {"distribution", "import"} <= set(python):
        raise ProfileError(f"{where}: requires.python must be a mapping with 'distribution' and 'import'")
    return {"distribution": str(python["distribution"]), "import": str(python["import"])}


def profile_paths() -> dict[str, Path]:
    return {p.stem: p for p in sorted((fixtures_dir() / "subjects").glob("*.yaml"))}


def load_subject(name: str) -> SubjectSpec:
    paths = profile_paths()
    if name not in paths:
        raise ProfileError(f"unknown subject {name!r}; known subjects: {', '.join(paths) or 'none'}")
    path = paths[name]
    try:
        doc = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise ProfileError(f"{path}: not valid YAML: {err}") from err
    return parse_profile(doc, str(path))


def all_subjects() -> list[SubjectSpec]:
    return [load_subject(name) for name in profile_paths()]


def from_command(cmd: str, resource: str, mount_namespace: bool, kind: str = "device-plugin") -> SubjectSpec:
    """A subject given on the command line (`fakelet run --plugin-cmd ...`).

    For `kind` dra, `resource` is the driver name.
    """
    try:
        argv = shlex.split(cmd)
    except ValueError as err:
        raise ProfileError(f"--plugin-cmd: cannot parse {cmd!r}: {err}") from err
    if not argv:
        raise ProfileError("--plugin-cmd is empty")
    if shutil.which(argv[0]) is None:
        raise ProfileError(f"--plugin-cmd: {argv[0]!r} is not an executable file or a command on PATH")
    return SubjectSpec(name="plugin-cmd", kind=kind, command=argv, resource=resource,
                       driver=resource if kind == "dra" else None,
                       launcher="mount-namespace" if mount_namespace else "process", source="--plugin-cmd")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def render(template: str, values: dict[str, str], where: str) -> str:
    """Fill {placeholders}; an unknown one is a profile error that names it."""
    for _, field_name, _, _ in string.Formatter().parse(template):
        if field_name is not None and field_name not in values:
            raise ProfileError(f"{where}: unknown placeholder {{{field_name}}} in {template!r}; "
                               f"known: {', '.join('{' + k + '}' for k in sorted(values))}")
    return template.format_map(values)
