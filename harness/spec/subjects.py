"""Subject profiles: how to launch a plugin and what it should expose.

Profiles are data: the bundled ones in fixtures/subjects/<name>.yaml, a
user's own through `fakelet run --subject-file PATH`, both read by the same
loader and checked against the same schema (`SCHEMA`). A profile names its
launcher, its command template, the resource it registers (or, for a DRA
driver, its driver name), the device files the harness creates for it, the
device IDs it should list, the fake device backend it gets, and, for the
reference plugins, the defects and the checks each must fail.

Subject files are untrusted input: `load_yaml` refuses files over 1 MiB,
more than 100 aliases or alias expansions beyond 10,000 nodes (billion
laughs), and nesting deeper than 50, and every schema error names the file,
the line and the field (`my.yaml:7: devices: must be a mapping, got str`).
Relative inventory paths resolve against the file's directory, then fixtures/.

Commands and env values are templates (`{plugin_dir}`, ...). `PLACEHOLDERS`
lists what each kind of subject has; `template_fields` finds the ones a
template uses, so that an unknown one is an error before anything starts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import os
import re
import shlex
import socket
import string
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import date, datetime
from pathlib import Path
from typing import Any

import yaml

from fake_devices.materialize import SKINS
from harness.instruments.userinput import (
    MAX_USER_FILE_BYTES,
    UserInputError,
    check_user_file,
    escape_controls,
    oneline,
    read_user_text,
)
from harness.spec import bundled
from harness.spec.bundled import FIXTURES_ENV
from harness.spec.composition import SEPARATOR, composition_error, is_composed, parts
from harness.spec.names import is_dns1123_subdomain, is_extended_resource_name

LAUNCHERS = ("process", "mount-namespace", "container")
# Launchers in which the plugin sees the sandbox at the kubelet's host paths (/var/lib/kubelet/...),
# so that placeholders such as {plugin_dir} render as those paths.
HOST_VIEW_LAUNCHERS = ("mount-namespace", "container")
KINDS = ("device-plugin", "dra")
OBSERVABLES = ("health", "temperature", "hotplug")
DEVICE_IDS = ("opaque", "inventory")
DEFAULT_INVENTORY = "inventories/basic.yaml"  # relative to fixtures/: the hardware a --plugin-cmd gets
DEFAULT_SKIN = "neutral"
DEFAULT_THERMAL = (85.0, 5.0)  # threshold and hysteresis, degrees C
OVER_LIMIT_C = 10.0  # how far past the plugin's limit (and below it, less hysteresis) checks take a device
THERMAL_DEFAULT_ORIGIN = "fakelet's default (the subject declares no backend.thermal)"

# Placeholders every subject's templates may use; DRA drivers get the DRAEnv ones too
# (harness/world/draenv.py `_more_placeholders`; tests/test_subject_file.py keeps the two in step).
# {cdi_dir}: where the node's runtime reads CDI specs, for a device plugin too (its Allocate may name CDI devices).
DP_PLACEHOLDERS = ("python", "plugin_dir", "kubelet_socket", "dev_dir", "sandbox", "resource", "free_port",
                   "defect", "bin", "inventory", "sysfs_root", "levelzero_socket", "cdi_dir")
DRA_PLACEHOLDERS = (*DP_PLACEHOLDERS, "registry_dir", "plugins_dir", "kubeconfig", "node_name",
                    "state_dir", "driver", "health_refresh_s")
PLACEHOLDERS = {"device-plugin": DP_PLACEHOLDERS, "dra": DRA_PLACEHOLDERS}
# A DRA driver's rolling update (`rolling_update:`) has one more: each instance's own pod UID, as a DaemonSet gives it
# through the downward API (metadata.uid) and upstream's kubeletplugin.RollingUpdate(uid) takes it.
POD_UID_PLACEHOLDER = "pod_uid"
# A DRA driver beside a device plugin for the same hardware (`device_plugin_beside:`, DRA-EXT-02) has these: the
# devices the device plugin serves, which the driver must leave alone, comma-separated, by the fake backend's device
# IDs or by UUID (suites/dra/test_beside.py).
BESIDE_PLACEHOLDERS = ("dp_devices", "dp_uuids")
# The only placeholders that may render empty, and what that means (put on the timeline when it happens).
EMPTY_OK = {"defect": "no --defect given", "kubeconfig": "no API server: the driver runs without one"}

# Limits for subject and inventory YAML: a subject file is a few dozen lines, so
# anything near these is a mistake or an attack (billion laughs, deep nesting).
MAX_YAML_BYTES = MAX_USER_FILE_BYTES
MAX_ALIASES = 100
MAX_ALIAS_NODES = 10_000
MAX_DEPTH = 50

ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# docker/distribution reference grammar, loosely: lower-case path components, an optional tag and digest.
IMAGE_REF = re.compile(r"[a-z0-9]([a-z0-9._/:-]*[a-z0-9])?"  # [registry[:port]/]path
                       r"(:[A-Za-z0-9_][A-Za-z0-9._-]{0,127})?(@[a-z0-9]+:[a-f0-9]{32,})?")  # :tag @digest
SUBJECT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")  # it names log files and report directories


class ProfileError(ValueError):
    """A subject profile or subject flag is wrong; the message says where, on one line."""

    def __str__(self) -> str:
        # User text (a key, a path) may hold a carriage return or a newline; the error stays one line.
        return escape_controls(super().__str__())


def fixtures_dir() -> Path:
    """Where fixtures/ is read from: $FAKELET_FIXTURES, else fakelet's own (harness/spec/bundled.py)."""
    override = os.environ.get(FIXTURES_ENV)
    # An override that points nowhere would silently run the bundled fixtures instead of the user's.
    if override is not None and not (Path(override) / "subjects").is_dir():
        raise ProfileError(f"{FIXTURES_ENV}={oneline(override)}: not a fakelet fixtures directory (no subjects/ "
                           "in it); unset it or point it at one")
    try:
        return bundled.fixtures_dir()
    except bundled.FilesMissing as err:
        raise ProfileError(str(err)) from None


@dataclass
class Defect:
    name: str
    description: str
    kills: list[str]
    # The hostile corpus: run only these checks, within this wall time, and expect a subject
    # finding containing each of `findings`.
    checks: list[str] | None = None
    wall_s: float | None = None
    findings: list[str] = field(default_factory=list)


@dataclass
class SubjectSpec:
    name: str
    kind: str
    command: list[str]
    resource: str
    launcher: str = "process"
    description: str = ""
    env: dict[str, str] = field(default_factory=dict)
    # Variables copied from fakelet's own environment into the plugin's (names only:
    # values never land in a subject file, a run config or a report).
    pass_env: list[str] = field(default_factory=list)
    socket: str | None = None
    inventory: str | None = None  # absolute path once loaded
    dev_files: list[str] = field(default_factory=list)
    expected_ids: list[str] | None = None
    expected_count: int | None = None
    opaque_ids: bool = False  # the plugin names devices its own way (hashes): compare counts, not IDs
    # Whether the plugin is expected to list the inventory's devices. False for a --plugin-cmd
    # that got the default backend unasked: fakelet cannot know whether it even reads it.
    inventory_expected: bool = True
    device_map: dict[str, str] | None = None  # plugin device ID -> inventory device ID (devices.map)
    defect_args: list[str] = field(default_factory=list)
    defects: dict[str, Defect] = field(default_factory=dict)
    build: dict[str, Any] | None = None
    private_dirs: list[str] = field(default_factory=list)
    # launcher container: the image, whose entrypoint gets `command` as its arguments
    image: str | None = None
    privileged: bool = False
    # launcher container: path in the container -> host path template, e.g. the fake hardware's
    # {sysfs_root}/sys/class/drm over /sys/class/drm (what a DaemonSet's hostPath gives the real one)
    mounts: dict[str, str] = field(default_factory=dict)
    # The fake device backend wired to this subject: inventory (an absolute path once
    # loaded), skin, and which of its changes the plugin can see (health, temperature, hotplug).
    backend: dict[str, str] | None = None
    observes: list[str] = field(default_factory=list)
    # Where `observes` was declared (file:line: field, --observes); "" when nothing was: only then may a check
    # infer what the plugin watches from what it reads.
    observes_from: str = ""
    thermal: tuple[float, float] = DEFAULT_THERMAL
    thermal_from: str = ""  # where the plugin's limit came from (file:line: field, a flag); "" for fakelet's default
    # How often the plugin polls its health source (backend.poll_s), when the subject says: coverage
    # waits for its first read that long (twice, capped at T) instead of the whole of T.
    poll_s: float | None = None
    source: str = "<flags>"
    reference: bool = False
    driver: str | None = None  # a DRA subject's driver name (its `resource` is the same)
    needs_api: bool = False  # a DRA driver that cannot start without an API server
    # Python distributions the subject imports: {"distribution": "name==x", "import": "module"}
    requires_python: dict[str, str] | None = None
    # A DRA driver's instance of a rolling update: {"args": [...], "env": {...}}, templates with {pod_uid};
    # None: it runs as one instance only (its sockets are not named per pod).
    rolling_update: dict[str, Any] | None = None
    # How the driver is told the devices a device plugin beside it serves: {"args": [...], "env": {...}}, templates
    # with {dp_devices} or {dp_uuids}; None: it cannot be told (DRA-EXT-02 does not apply).
    device_plugin_beside: dict[str, Any] | None = None
    notes: str = ""
    field_lines: dict[str, int] = field(default_factory=dict)  # "command[0]" -> its line, for messages

    @property
    def is_dra(self) -> bool:
        return self.kind == "dra"

    @property
    def host_view(self) -> bool:
        """Whether the plugin sees the sandbox at the kubelet's host paths (a mount namespace, a container)."""
        return self.launcher in HOST_VIEW_LAUNCHERS

    def expected_devices(self, inventory: list[dict[str, Any]] | None) -> tuple[list[str] | None, int | None]:
        if self.expected_ids is not None:
            return sorted(self.expected_ids), len(self.expected_ids)
        if inventory is None:
            return None, self.expected_count
        ids = sorted(d["id"] for d in inventory)
        if not self.inventory_expected:
            # The IDs to compare with if the plugin turns out to list them; no count to hold it to otherwise.
            return (None if self.opaque_ids else ids), self.expected_count
        if self.opaque_ids:
            return None, len(inventory)
        return ids, len(ids)

    def mutants(self) -> list[str]:
        """The defects a composed defect may join: a reference subject's (whose plugin reads `a+b`) that must
        fail checks and bound no wall time of their own (not benign, not hostile)."""
        if not self.reference:
            return []
        return [n for n, d in self.defects.items() if d.kills and d.wall_s is None]

    def defect_error(self, defect: str) -> str | None:
        """Why this subject cannot run as `defect` (one of its defects, or mutants joined by '+'), in one line;
        None when it can."""
        if defect in self.defects:
            return None
        if not is_composed(defect):
            return f"subject {self.name} has no defect {defect!r}; known defects: {', '.join(self.defects) or 'none'}"
        if not self.reference:
            return (f"subject {self.name}: {defect!r} composes defects with {SEPARATOR!r}, which only a reference "
                    "subject's plugin reads")
        error = composition_error(defect, self.defects, self.mutants())
        return f"subject {self.name}: {error}; its mutants: {', '.join(self.mutants())}" if error else None

    def defect_kills(self, defect: str) -> list[str]:
        """The checks `defect` must fail: a composed one, at least those of each of its parts."""
        return sorted({k for part in parts(defect) if part in self.defects for k in self.defects[part].kills})

    def where(self, field_path: str) -> str:
        """`file:line: field` for a message about one field (just the source when its line is unknown)."""
        line = self.field_lines.get(field_path)
        return f"{self.source}:{line}: {field_path}" if line else f"{self.source}: {field_path}"

    def thermal_limit(self) -> str:
        """The overtemperature limit a check holds the plugin to, and where it came from (for details and facts)."""
        threshold, hysteresis = self.thermal
        return (f"{threshold:g} C (hysteresis {hysteresis:g} C), from "
                f"{self.thermal_from or THERMAL_DEFAULT_ORIGIN}")

    def to_dict(self) -> dict[str, Any]:
        """Every field, JSON-ready (a run config carries the whole spec to the check processes)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["defects"] = {n: dataclasses.asdict(d) for n, d in self.defects.items()}
        out["thermal"] = list(self.thermal)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SubjectSpec:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ProfileError(f"run config: unknown subject field(s) {unknown}")
        values = dict(data)
        values["defects"] = {n: Defect(**d) for n, d in (data.get("defects") or {}).items()}
        values["thermal"] = tuple(data.get("thermal") or DEFAULT_THERMAL)
        return cls(**values)


# -- safe YAML -----------------------------------------------------------------


class YamlLimitError(ValueError):
    """A YAML document over one of the loader's limits; `line` is where it went over."""

    def __init__(self, message: str, line: int | None) -> None:
        super().__init__(message)
        self.line = line


def _line(node_or_mark: Any) -> int | None:
    mark = getattr(node_or_mark, "start_mark", node_or_mark)
    return mark.line + 1 if mark is not None else None


class _LimitedLoader(yaml.SafeLoader):
    """SafeLoader that expands aliases into copies, counting them, and bounds nesting.

    Copying at compose time makes every alias cost what it expands to, so the
    count bounds the work and memory of everything after (construction, the
    schema walk) instead of only the file's size.
    """

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._aliases = 0
        self._alias_nodes = 0
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            mark = self.peek_event().start_mark
            self._aliases += 1
            if self._aliases > MAX_ALIASES:
                raise YamlLimitError(f"more than {MAX_ALIASES} aliases", _line(mark))
            return self._copy(super().compose_node(parent, index), self._depth, mark)
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise YamlLimitError(f"nested deeper than {MAX_DEPTH} levels", _line(self.peek_event().start_mark))
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def _copy(self, node: Any, depth: int, mark: Any) -> Any:
        self._alias_nodes += 1
        if self._alias_nodes > MAX_ALIAS_NODES:
            raise YamlLimitError(f"aliases expand to more than {MAX_ALIAS_NODES} nodes", _line(mark))
        if depth > MAX_DEPTH:
            raise YamlLimitError(f"aliases nest deeper than {MAX_DEPTH} levels", _line(mark))
        if isinstance(node, yaml.ScalarNode):
            return yaml.ScalarNode(node.tag, node.value, node.start_mark, node.end_mark, node.style)
        if isinstance(node, yaml.SequenceNode):
            return yaml.SequenceNode(node.tag, [self._copy(c, depth + 1, mark) for c in node.value],
                                     node.start_mark, node.end_mark, node.flow_style)
        pairs = [(self._copy(k, depth + 1, mark), self._copy(v, depth + 1, mark)) for k, v in node.value]
        return yaml.MappingNode(node.tag, pairs, node.start_mark, node.end_mark, node.flow_style)


@dataclass
class YamlDoc:
    data: Any
    lines: dict[str, int]  # field path ("devices.ids", "command[0]") -> line
    duplicates: list[tuple[str, int]]  # keys given twice in one mapping, with the second one's line


def _index_lines(node: Any, path: str, lines: dict[str, int], dups: list[tuple[str, int]]) -> None:
    if isinstance(node, yaml.SequenceNode):
        for n, child in enumerate(node.value):
            sub = f"{path}[{n}]"
            lines[sub] = _line(child) or 0
            _index_lines(child, sub, lines, dups)
    elif isinstance(node, yaml.MappingNode):
        seen: set[str] = set()
        for key, value in node.value:
            if not isinstance(key, yaml.ScalarNode) or key.value == "<<":
                continue  # not a field name; the schema reports odd keys from the data
            sub = f"{path}.{key.value}" if path else str(key.value)
            if sub in seen:
                dups.append((sub, _line(key) or 0))  # messages keep pointing at the first one
            else:
                seen.add(sub)
                lines[sub] = _line(key) or 0
            _index_lines(value, sub, lines, dups)


def read_limited(path: Path) -> str:
    """The text of a small YAML file; a ProfileError naming the file when it is unreadable, special or too big."""
    try:
        return read_user_text(path, max_bytes=MAX_YAML_BYTES,
                              about="subject and inventory files are small YAML documents")
    except UserInputError as err:
        raise ProfileError(str(err)) from None


def parse_yaml(text: str, where: str) -> YamlDoc:
    """One YAML document with the loader's limits, plus the line of every field."""
    loader = _LimitedLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return YamlDoc(None, {}, [])
        lines: dict[str, int] = {}
        dups: list[tuple[str, int]] = []
        _index_lines(node, "", lines, dups)
        return YamlDoc(loader.construct_document(node), lines, dups)
    except YamlLimitError as err:
        raise ProfileError(f"{where}:{err.line}: refused: {err}") from None
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        line = f":{mark.line + 1}" if mark is not None else ""
        raise ProfileError(f"{where}{line}: not valid YAML: {err.problem or err.context}") from None
    except (yaml.YAMLError, ValueError, RecursionError) as err:
        # ValueError: e.g. an integer literal longer than Python converts.
        raise ProfileError(f"{where}: not valid YAML: {err}") from None
    finally:
        loader.dispose()


def load_yaml(path: Path) -> YamlDoc:
    return parse_yaml(read_limited(path), str(path))


# -- the subject file schema ----------------------------------------------------------


@dataclass(frozen=True)
class Field:
    """What one field of a subject file may hold."""

    types: tuple[type, ...]
    required: bool = False
    choices: tuple[str, ...] = ()
    items: Field | None = None  # every element of a list
    keys: dict[str, Field] | None = None  # a mapping with exactly these (optional) keys
    values: Field | None = None  # a mapping with free string keys and these values
    key_check: Callable[[str], str | None] | None = None  # a rule for those free keys
    check: Callable[[Any], str | None] | None = None  # a further rule; returns the problem


def _env_name(value: str) -> str | None:
    return None if ENV_NAME.fullmatch(value) else "must be an environment variable name ([A-Za-z_][A-Za-z0-9_]*)"


def _absolute(value: str) -> str | None:
    return None if value.startswith("/") else "must be an absolute path"


def _non_negative(value: int) -> str | None:
    return "must not be negative" if value < 0 else None


def _positive(value: float) -> str | None:
    return "must be greater than 0" if value <= 0 else None


def _subject_name(value: str) -> str | None:
    return None if SUBJECT_NAME.fullmatch(value) else "must be letters, digits, '.', '_' or '-' (it names files)"


def _image_ref(value: str) -> str | None:
    return None if IMAGE_REF.fullmatch(value) else \
        "must be an image reference (NAME[:TAG][@DIGEST], e.g. registry.example.com/vendor/plugin:1.2)"


def _resource_name(value: str) -> str | None:
    return None if is_extended_resource_name(value) else \
        "must be an extended resource name (DOMAIN/NAME, e.g. vendor.example.com/gpu, not kubernetes.io/...)"


def _driver_name(value: str) -> str | None:
    return None if is_dns1123_subdomain(value) else "must be a DNS-1123 subdomain (e.g. gpu.vendor.com)"


STR = Field((str,))
NUMBER = Field((int, float))
STRINGS = Field((list,), items=STR)
OBSERVES = Field((list,), items=Field((str,), choices=OBSERVABLES))

# What each field means, its default and an example: subject_fields.py FIELDS (a new field needs an entry there).
SCHEMA: dict[str, Field] = {
    "name": Field((str,), required=True, check=_subject_name),
    "kind": Field((str,), required=True, choices=KINDS),
    "reference": Field((bool,)),
    "description": STR,
    "launcher": Field((str,), choices=LAUNCHERS),
    "driver": Field((str,), check=_driver_name),
    "resource": Field((str,), check=_resource_name),
    "needs_api": Field((bool,)),
    "command": Field((list,), items=STR),
    "image": Field((str,), check=_image_ref),
    "privileged": Field((bool,)),
    "mounts": Field((dict,), values=STR, key_check=_absolute),
    "env": Field((dict,), values=STR, key_check=_env_name),
    "pass_env": Field((list,), items=Field((str,), check=_env_name)),
    "socket": Field((str, type(None))),
    "inventory": Field((str, type(None))),
    "devices": Field((dict,), keys={
        "files": STRINGS,
        "expected_ids": STRINGS,
        "expected_count": Field((int,), check=_non_negative),
        "ids": Field((str,), choices=DEVICE_IDS),
        "map": Field((dict,), values=STR),
    }),
    "defect_args": STRINGS,
    "defects": Field((dict,), values=Field((dict,), keys={
        "description": STR,
        "kills": Field((list,), required=True, items=STR),
        "checks": STRINGS,
        "wall_s": Field((int, float), check=_non_negative),
        "findings": STRINGS,
    })),
    "build": Field((dict,), keys={
        "module": Field((str,), required=True), "package": Field((str,), required=True),
        "binary": STR, "get": STR, "cgo": Field((bool,)),
    }),
    "private_dirs": Field((list,), items=Field((str,), check=_absolute)),
    "backend": Field((dict,), keys={
        "inventory": Field((str,), required=True),
        "skin": Field((str,), choices=SKINS),
        "observes": OBSERVES,
        "thermal": Field((dict,), keys={"threshold_c": NUMBER, "hysteresis_c": NUMBER}),
        "poll_s": Field((int, float), check=_positive),
    }),
    "observes": OBSERVES,  # older spelling of backend.observes, for subjects without a backend
    # How the driver runs as one of two instances of a DaemonSet rolling update with surge: these args and env
    # added to its command and env, {pod_uid} the instance's own pod UID (suites/dra/test_upgrade.py).
    "rolling_update": Field((dict,), keys={"args": STRINGS,
                                           "env": Field((dict,), values=STR, key_check=_env_name)}),
    # How the driver is told which devices a device plugin for the same hardware serves beside it: these args and
    # env added to its command and env, {dp_devices} or {dp_uuids} those devices (suites/dra/test_beside.py).
    "device_plugin_beside": Field((dict,), keys={"args": STRINGS,
                                                 "env": Field((dict,), values=STR, key_check=_env_name)}),
    "requires": Field((dict,), keys={
        "python": Field((dict,), keys={"distribution": Field((str,), required=True),
                                       "import": Field((str,), required=True)}),
    }),
    "notes": STR,
}

TYPE_NAMES = {dict: "a mapping", list: "a list", str: "a string", int: "an integer", float: "a number",
              bool: "true or false", type(None): "null"}


def _got(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, datetime | date):
        return "a date (quote it)"
    return {dict: "mapping", list: "list"}.get(type(value), type(value).__name__)


def _type_ok(value: Any, types: tuple[type, ...]) -> bool:
    if isinstance(value, bool):
        return bool in types  # YAML true/false is never an integer or a number
    if isinstance(value, int) and float in types:
        return True
    return isinstance(value, types)


def _expected(types: tuple[type, ...]) -> str:
    if types == (int, float):
        return "a number"
    return " or ".join(TYPE_NAMES[t] for t in types)


class _Errors(list[tuple[str, str]]):
    def add(self, path: str, message: str) -> None:
        self.append((path, message))


def _check_value(value: Any, spec: Field, path: str, errors: _Errors) -> None:
    if not _type_ok(value, spec.types):
        errors.add(path, f"must be {_expected(spec.types)}, got {_got(value)}")
        return
    if spec.choices and value not in spec.choices:
        errors.add(path, f"{value!r} is not one of {', '.join(spec.choices)}")
        return
    if isinstance(value, list) and spec.items is not None:
        for n, item in enumerate(value):
            _check_value(item, spec.items, f"{path}[{n}]", errors)
    if isinstance(value, dict) and spec.keys is not None:
        _check_mapping(value, spec.keys, path, errors)
    if isinstance(value, dict) and spec.values is not None:
        for key, item in value.items():
            if not isinstance(key, str):
                errors.add(path, f"keys must be strings, got {_got(key)} {key!r}")
                continue
            problem = spec.key_check(key) if spec.key_check is not None else None
            if problem:
                errors.add(f"{path}.{key}", f"key {problem}")
                continue
            _check_value(item, spec.values, f"{path}.{key}", errors)
    if spec.check is not None:
        problem = spec.check(value)
        if problem:
            errors.add(path, problem)


def _check_mapping(doc: dict[Any, Any], schema: dict[str, Field], path: str, errors: _Errors) -> None:
    prefix = f"{path}." if path else ""
    for key, value in doc.items():
        if key not in schema:
            close = difflib.get_close_matches(str(key), list(schema), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f"; known: {', '.join(schema)}"
            errors.add(f"{prefix}{key}", f"unknown field{hint}")
            continue
        _check_value(value, schema[key], f"{prefix}{key}", errors)
    for key, spec in schema.items():
        if spec.required and key not in doc:
            errors.add(path, f"missing required key '{key}'")


def _check_rules(doc: dict[str, Any], errors: _Errors) -> None:
    """Rules that span fields."""
    kind = doc.get("kind")
    if kind == "dra" and "driver" not in doc:
        errors.add("", "missing required key 'driver' (a DRA subject names its driver)")
    if kind == "dra" and "resource" in doc:
        errors.add("resource", "a DRA subject names its driver, not a resource")
    if kind == "device-plugin" and "resource" not in doc:
        errors.add("", "missing required key 'resource'")
    if kind == "device-plugin" and "driver" in doc:
        errors.add("driver", "is for kind dra; a device plugin names its resource")
    launcher = doc.get("launcher", "process")
    if doc.get("private_dirs") and launcher not in HOST_VIEW_LAUNCHERS:
        errors.add("private_dirs", "needs launcher: mount-namespace or container")
    if launcher == "container" and "image" not in doc:
        errors.add("", "missing required key 'image' (launcher: container runs an image)")
    for key in ("image", "privileged", "mounts"):
        if key in doc and launcher != "container":
            errors.add(key, "needs launcher: container")
    if launcher != "container":
        if "command" not in doc:
            errors.add("", "missing required key 'command'")
        elif not doc["command"]:
            errors.add("command", "must not be empty")
    backend = doc.get("backend")
    if isinstance(backend, dict) and "observes" in backend and "observes" in doc:
        errors.add("observes", "given twice: keep backend.observes only")
    if doc.get("observes") and not isinstance(backend, dict):
        errors.add("observes", "needs a backend (the fake hardware whose changes the plugin observes)")
    rolling = doc.get("rolling_update")
    if rolling is not None and kind != "dra":
        errors.add("rolling_update", "is for kind dra (a DRA driver's two instances during a DaemonSet update)")
    elif isinstance(rolling, dict) and "{" + POD_UID_PLACEHOLDER + "}" not in " ".join(
            [*rolling.get("args", []), *rolling.get("env", {}).values()]):
        errors.add("rolling_update", "must give each instance its pod UID: use {pod_uid} in args or env")
    defects = doc.get("defects")
    for name in defects if isinstance(defects, dict) else {}:
        if isinstance(name, str) and SEPARATOR in name:
            errors.add(f"defects.{name}", f"a defect's name has no {SEPARATOR!r}, which joins defects (a{SEPARATOR}b)")
    beside = doc.get("device_plugin_beside")
    if beside is not None and kind != "dra":
        errors.add("device_plugin_beside", "is for kind dra (a DRA driver told the devices a device plugin serves)")
    elif isinstance(beside, dict) and not any("{" + p + "}" in " ".join(
            [*beside.get("args", []), *beside.get("env", {}).values()]) for p in BESIDE_PLACEHOLDERS):
        errors.add("device_plugin_beside", "must tell the driver the device plugin's devices: use {dp_devices} or "
                                           "{dp_uuids} in args or env")


def subject_problems(doc: YamlDoc, where: str) -> list[str]:
    """Every schema and cross-field problem of a subject document, each as `file:line: field: message`."""
    if not isinstance(doc.data, dict):
        return [f"{where}: a subject file must be a mapping of fields, got {_got(doc.data)}"]
    errors = _Errors()
    for key, line in doc.duplicates:
        errors.add(key, f"given twice (again at line {line})")
    _check_mapping(doc.data, SCHEMA, "", errors)
    if not errors:
        _check_rules(doc.data, errors)
    else:
        # The rules read fields as the schema shapes them; over a malformed one they may trip, and then the
        # schema's problems are the ones to fix first.
        rules = _Errors()
        with contextlib.suppress(TypeError, AttributeError, KeyError):
            _check_rules(doc.data, rules)
            errors += [rule for rule in rules if rule not in errors]
    return [f"{locate(where, doc.lines, path)}: {message}" for path, message in errors]


def check_subject_doc(doc: YamlDoc, where: str) -> None:
    """Raise a ProfileError for the first problem, as `file:line: field: message`."""
    problems = subject_problems(doc, where)
    if problems:
        n = len(problems) - 1
        more = f" (and {n} more problem{'s' if n > 1 else ''})" if n else ""
        raise ProfileError(f"{problems[0]}{more}")


def locate(where: str, lines: dict[str, int], path: str) -> str:
    """`file:line: path` for a field; a missing field gets its parent's line (none at the top)."""
    probe = path
    while probe and probe not in lines:
        probe = probe.rsplit(".", 1)[0] if "." in probe else ""
    line = lines.get(probe)
    return f"{where}{f':{line}' if line else ''}{f': {oneline(path)}' if path else ''}"


# -- from a document to a SubjectSpec --------------------------------------------------


def inventory_candidates(value: str, base_dir: Path | None) -> list[Path]:
    """Where an inventory named `value` may be: the subject file's directory, fixtures/, a bare name."""
    if Path(value).is_absolute():
        return [Path(value)]
    found = [base_dir / value] if base_dir is not None else [Path.cwd() / value]
    fixtures = fixtures_dir()
    found.append(fixtures / value)
    if "/" not in value:
        found.append(fixtures / "inventories" / (value if value.endswith((".yaml", ".yml")) else f"{value}.yaml"))
    return found


def resolve_inventory(value: str, base_dir: Path | None, where: str) -> str:
    """The absolute path of an inventory file, or a ProfileError saying where it was looked for."""
    candidates = inventory_candidates(value, base_dir)
    for path in candidates:
        if path.is_file():
            return str(path.resolve())
    for path in candidates:
        if os.path.lexists(path):  # there, but a directory, a FIFO or a dangling symlink: say which
            try:
                check_user_file(path, where)
            except UserInputError as err:
                raise ProfileError(str(err)) from None
    names = sorted(p.stem for p in (fixtures_dir() / "inventories").glob("*.yaml"))
    raise ProfileError(f"{where}: no inventory {value!r} (looked for {', '.join(str(p) for p in candidates)}); "
                       f"bundled: {', '.join(names) or 'none'}")


def module_candidates(value: str, base_dir: Path | None) -> list[Path]:
    """Where a Go wrapper module named `value` may be: as given when absolute, else beside the subject
    file, then among fakelet's own (`go/kubernetes` is fixtures/go/kubernetes, in a checkout or a wheel)."""
    if Path(value).is_absolute():
        return [Path(value)]
    found = [(base_dir if base_dir is not None else Path.cwd()) / value]
    with contextlib.suppress(bundled.FilesMissing):
        found.append(bundled.bundled_fixtures() / value)
    return found


def resolve_build(build: dict[str, Any] | None, base_dir: Path | None, where: str) -> dict[str, Any] | None:
    """The subject's `build` with its module as an absolute directory, or a ProfileError naming where it looked."""
    if not build:
        return None
    candidates = module_candidates(build["module"], base_dir)
    for path in candidates:
        if (path / "go.mod").is_file():
            return {**build, "module": str(path.resolve())}
    raise ProfileError(f"{where}: no Go module {build['module']!r} (no go.mod in "
                       f"{', '.join(str(p) for p in candidates)})")


def _devices(doc: dict[str, Any]) -> dict[str, Any]:
    devices = doc.get("devices") or {}
    return {"dev_files": list(devices.get("files") or []), "expected_ids": devices.get("expected_ids"),
            "expected_count": devices.get("expected_count"), "opaque_ids": devices.get("ids") == "opaque",
            "device_map": dict(devices["map"]) if devices.get("map") else None}


def _backend(doc: dict[str, Any], base_dir: Path | None, where: str, lines: dict[str, int]) -> dict[str, Any]:
    backend = doc.get("backend")
    if backend is None:
        return {"backend": None, "observes": list(doc.get("observes") or []),
                "observes_from": locate(where, lines, "observes") if "observes" in doc else ""}
    inventory = resolve_inventory(backend["inventory"], base_dir,
                                  locate(where, lines, "backend.inventory"))
    thermal = backend.get("thermal") or {}
    origin = f"{locate(where, lines, 'backend.thermal')} (the subject file)" if "thermal" in backend else ""
    return {"backend": {"inventory": inventory, "skin": backend.get("skin", DEFAULT_SKIN)}, "thermal_from": origin,
            "observes": list(backend.get("observes") or []),
            "observes_from": locate(where, lines, "backend.observes") if "observes" in backend else "",
            "poll_s": float(backend["poll_s"]) if "poll_s" in backend else None,
            "thermal": (float(thermal.get("threshold_c", DEFAULT_THERMAL[0])),
                        float(thermal.get("hysteresis_c", DEFAULT_THERMAL[1])))}


def parse_profile(doc: Any, where: str, lines: dict[str, int] | None = None,
                  base_dir: Path | None = None) -> SubjectSpec:
    """A SubjectSpec from a subject file's data; `lines` (field -> line) makes messages point at lines."""
    lines = lines or {}
    check_subject_doc(YamlDoc(doc, lines, []), where)
    return _spec(doc, where, lines, base_dir)


def _spec(doc: dict[str, Any], where: str, lines: dict[str, int], base_dir: Path | None) -> SubjectSpec:
    """The spec of a document that passed the schema."""
    inventory = doc.get("inventory")
    if inventory is not None:
        inventory = resolve_inventory(inventory, base_dir, locate(where, lines, "inventory"))
    python = (doc.get("requires") or {}).get("python")
    driver = doc.get("driver")
    return SubjectSpec(
        name=doc["name"], kind=doc["kind"], command=list(doc.get("command") or []), driver=driver,
        image=doc.get("image"), privileged=doc.get("privileged", False), mounts=dict(doc.get("mounts") or {}),
        resource=driver or doc["resource"], launcher=doc.get("launcher", "process"),
        description=doc.get("description", ""), env=dict(doc.get("env") or {}),
        pass_env=list(doc.get("pass_env") or []), socket=doc.get("socket"), inventory=inventory,
        defect_args=list(doc.get("defect_args") or []),
        defects={n: _defect(n, d) for n, d in (doc.get("defects") or {}).items()},
        build=resolve_build(doc.get("build"), base_dir, locate(where, lines, "build.module")),
        private_dirs=list(doc.get("private_dirs") or []),
        source=where, reference=doc.get("reference", False), needs_api=doc.get("needs_api", False),
        requires_python=dict(python) if python else None, notes=doc.get("notes", ""), field_lines=dict(lines),
        rolling_update=_rolling_update(doc.get("rolling_update")),
        device_plugin_beside=_rolling_update(doc.get("device_plugin_beside")),
        **_devices(doc), **_backend(doc, base_dir, where, lines),
    )


def _rolling_update(doc: dict[str, Any] | None) -> dict[str, Any] | None:
    """An {"args", "env"} entry (rolling_update:, device_plugin_beside:), both keys present."""
    if doc is None:
        return None
    return {"args": list(doc.get("args") or []), "env": dict(doc.get("env") or {})}


def _defect(name: str, doc: dict) -> Defect:
    checks = doc.get("checks")
    return Defect(name, doc.get("description", ""), list(doc["kills"]),
                  checks=list(checks) if checks is not None else None, wall_s=doc.get("wall_s"),
                  findings=list(doc.get("findings") or []))


def load_subject_file(path: Path | str) -> SubjectSpec:
    """A subject file of the user's own (`--subject-file`), or a bundled one: same loader, same schema."""
    path = Path(path)
    doc = load_yaml(path)
    check_subject_doc(doc, str(path))
    return _spec(doc.data, str(path), doc.lines, path.resolve().parent)


def check_subject_file(path: Path) -> tuple[SubjectSpec | None, list[str]]:
    """Every problem `load_subject_file` could raise one at a time: YAML, schema, cross-field rules, then (on a
    document that passed those) the inventory and Go module it names. The spec too, when there is none."""
    try:
        doc = load_yaml(path)
    except ProfileError as err:
        return None, [str(err)]
    problems = subject_problems(doc, str(path))
    if problems:
        return None, problems
    try:
        return _spec(doc.data, str(path), doc.lines, path.resolve().parent), []
    except ProfileError as err:
        return None, [str(err)]


def profile_paths() -> dict[str, Path]:
    return {p.stem: p for p in sorted((fixtures_dir() / "subjects").glob("*.yaml"))}


def load_subject(name: str) -> SubjectSpec:
    paths = profile_paths()
    if name not in paths:
        raise ProfileError(f"unknown subject {name!r}; known subjects: {', '.join(paths) or 'none'}")
    return load_subject_file(paths[name])


def all_subjects() -> list[SubjectSpec]:
    return [load_subject(name) for name in profile_paths()]


def default_backend() -> dict[str, str]:
    return {"inventory": resolve_inventory(DEFAULT_INVENTORY, fixtures_dir(), "default backend"),
            "skin": DEFAULT_SKIN}


def from_command(cmd: str, resource: str, mount_namespace: bool, kind: str = "device-plugin") -> SubjectSpec:
    """A subject given on the command line (`fakelet run --plugin-cmd ...`).

    For `kind` dra, `resource` is the driver name. The plugin gets the default
    fake hardware, so that `{sysfs_root}` and `{dev_dir}` always mean something;
    it is not expected to list that hardware, nor to observe any of its changes,
    unless the run's flags say so (fakelet cannot know what an unknown plugin reads).
    """
    try:
        argv = shlex.split(cmd)
    except ValueError as err:
        raise ProfileError(f"--plugin-cmd: cannot parse {cmd!r}: {err}") from err
    if not argv:
        raise ProfileError("--plugin-cmd is empty")
    return SubjectSpec(name="plugin-cmd", kind=kind, command=argv, resource=resource,
                       driver=resource if kind == "dra" else None,
                       launcher="mount-namespace" if mount_namespace else "process", source="--plugin-cmd",
                       backend=default_backend(), inventory_expected=False)


def from_image(image: str, args: list[str], resource: str, kind: str = "device-plugin",
               privileged: bool = False) -> SubjectSpec:
    """A subject given as an image (`fakelet run --image IMAGE [--image-arg ...]`): as --plugin-cmd, in a container."""
    return SubjectSpec(name="image", kind=kind, command=list(args), resource=resource,
                       driver=resource if kind == "dra" else None, launcher="container", source="--image",
                       image=image, privileged=privileged, backend=default_backend(), inventory_expected=False)


def in_container(spec: SubjectSpec, image: str, args: list[str] | None, privileged: bool) -> SubjectSpec:
    """A known subject run from `image` instead of its command: its profile, its image.

    The image's entrypoint is the plugin, so the subject's command, less a leading `{bin}`, is
    what the entrypoint gets, unless `args` (--image-arg) say otherwise.
    """
    if args is None:
        if not spec.command or spec.command[0] != "{bin}":
            first = spec.command[0] if spec.command else ""
            raise ProfileError(f"{spec.where('command[0]')}: the command starts with {first!r}, not {{bin}}: "
                               "give the image's arguments with --image-arg")
        args = spec.command[1:]
    return dataclasses.replace(spec, launcher="container", image=image, command=list(args), privileged=privileged,
                               build=None)


# -- templates -------------------------------------------------------------------


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def template_fields(template: str, where: str) -> list[str]:
    """The placeholder names a template uses; a ProfileError for what str.format would choke on."""
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as err:
        raise ProfileError(f"{where}: {err} in {template!r} (write {{{{ and }}}} for literal braces)") from None
    names = []
    for _, name, spec, conversion in parsed:
        if name is None:
            continue
        if spec or conversion:
            raise ProfileError(f"{where}: placeholder {{{name}}} in {template!r} takes no conversion or format "
                               f"spec (write {{{{ and }}}} for literal braces)")
        names.append(name)
    return names


def render(template: str, values: dict[str, str], where: str) -> str:
    """Fill {placeholders}; an unknown one is a profile error that names it."""
    for name in template_fields(template, where):
        if name not in values:
            raise ProfileError(f"{where}: unknown placeholder {{{name}}} in {template!r}; "
                               f"known: {', '.join('{' + k + '}' for k in sorted(values))}")
    return template.format_map(values)


def empty_placeholders(used: list[str], values: dict[str, str], where: str) -> list[str]:
    """The placeholders `used` templates render empty; a ProfileError for one that must never be empty."""
    empty = sorted({n for t in used for n in template_fields(t, where) if values.get(n) == ""})
    for name in empty:
        if name not in EMPTY_OK:
            raise ProfileError(f"{where}: {{{name}}} would render as an empty string; "
                               f"the run's flags must give it a value")
    return empty


def passed_env(spec: SubjectSpec) -> dict[str, str]:
    """The pass_env variables' values from this process's environment."""
    missing = [n for n in spec.pass_env if n not in os.environ]
    if missing:
        raise ProfileError(f"{spec.source}: pass_env {', '.join(missing)}: not set in fakelet's environment")
    return {n: os.environ[n] for n in spec.pass_env}
