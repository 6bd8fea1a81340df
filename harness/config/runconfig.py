"""What one conformance run is about: subject, one-off changes to it, defect, profile, seed, checks, output.

`RunConfig.build` is the one place where a run's inputs are validated, for
the CLI and for `pytest --fakelet-*` alike: the subject (a bundled `--subject`,
a `--subject-file` of the user's own, or a `--plugin-cmd`), the one-off flags
that change it (`Overrides`: --inventory, --skin, --env, --pass-env,
--private-dir, --device-ids, --observes), and every template of the subject,
rendered against the placeholders that kind of subject has, so that a typo or
an unavailable placeholder is an error before anything starts.

A built RunConfig is the one description of the run: `to_json`/`from_json`
(and `save`/`load`) carry it, spec and all, from `fakelet run` to its pytest
process (`--fakelet-config PATH`), and `repro(check_id)` prints the command
that runs it again.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import shlex
import shutil
import sys
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from fake_devices.materialize import has_drm
from fake_devices.model import Inventory
from harness.instruments.userinput import (
    MAX_SEED,
    UserInputError,
    check_number,
    check_user_file,
    oneline,
    read_user_text,
)
from harness.kubelet.versions import KubeletVersion, for_release
from harness.kubelet.versions import get as get_kubelet_version
from harness.launch import gobuild
from harness.launch.sandbox import check_base
from harness.spec.checks import NAMED_SUITES, suite_package
from harness.spec.names import is_dns1123_subdomain, is_extended_resource_name
from harness.spec.profiles import Profile
from harness.spec.profiles import get as get_profile
from harness.spec.subjects import (
    BESIDE_PLACEHOLDERS,
    DEFAULT_SKIN,
    DEVICE_IDS,
    ENV_NAME,
    IMAGE_REF,
    OBSERVABLES,
    PLACEHOLDERS,
    POD_UID_PLACEHOLDER,
    ProfileError,
    SubjectSpec,
    default_backend,
    from_command,
    from_image,
    in_container,
    load_subject,
    load_subject_file,
    load_yaml,
    resolve_inventory,
    template_fields,
)

# Imported where used, not here: harness.controlplane (lightkube, the allocator) and harness.world.env (grpc, the
# kubelets) take seconds on a loaded machine, and every fakelet command validates its flags here first.

DEFAULT_SUBJECT = "reference-dp"
DEFAULT_KIND = "device-plugin"
CONTROL_PLANES = ("local", "kubeconfig:<path>", "none")
UNAVAILABLE = "unavailable:"  # a control plane the CLI failed to start; the rest is the reason
# Set by `fakelet run` for its check processes: the one API server it started for "local".
SHARED_CONTROL_PLANE_ENV = "FAKELET_SHARED_CONTROL_PLANE"
CONFIG_FORMAT = 1  # bump when a serialized RunConfig changes incompatibly
THERMAL_RANGE_C = (20.0, 150.0)  # --thermal-threshold: what a GPU's slowdown or shutdown limit can be
MAX_CONFIG_BYTES = 16 * 1024 * 1024  # a run config carries its subject, whose file may be 1 MiB of YAML


NODES = ("fake", "real")
CLUSTERS = ("kind",)


def check_node(node: str, control_plane: str) -> str:
    if node not in NODES:
        raise ProfileError(f"--node {node!r}: choose one of {', '.join(NODES)}")
    if node == "real" and control_plane != "local":
        # A real kubelet joins the API server it is given as a Node: never someone's cluster by accident.
        raise ProfileError(f"--node real runs its kubelet against fakelet's local API server; "
                           f"drop --control-plane {control_plane}")
    return node


def check_kubelet_version(name: str, node: str) -> KubeletVersion:
    """--kubelet-version on this node: the fake kubelet takes the minors it models (versions.py), the
    real node any release from the floor on (a minor or a patch; whether the Go module proxy serves it
    is the build's to say, as a skip naming the release)."""
    if node == "real":
        try:
            return for_release(name)
        except ValueError as err:
            raise ProfileError(f"--node real --kubelet-version {name}: {err}") from None
    return get_kubelet_version(name)  # its ValueError names the models and what --node real takes


def check_cluster(cluster: str | None, kind_image: str | None, keep_cluster: bool, node: str,
                  spec: SubjectSpec) -> str | None:
    """--cluster kind and what goes with it; the plugin must come as an image (it runs as a DaemonSet)."""
    if cluster is None:
        for flag, value in (("--kind-image", kind_image), ("--keep-cluster", keep_cluster)):
            if value:
                raise ProfileError(f"{flag} goes with --cluster kind")
        return None
    if cluster not in CLUSTERS:
        raise ProfileError(f"--cluster {cluster!r}: choose kind, or kubeconfig:PATH (with --suite kep5970)")
    if node != "fake":
        raise ProfileError(f"--cluster {cluster} brings its own kubelet; drop --node {node}")
    if spec.launcher != "container":
        raise ProfileError(f"--cluster {cluster} deploys the plugin's image as a DaemonSet: give --image")
    if kind_image is not None and not IMAGE_REF.fullmatch(kind_image):
        raise ProfileError(f"--kind-image {kind_image!r}: not an image reference (e.g. kindest/node:v1.36.0)")
    from harness.node.kind import manifests

    manifests.render_args(spec, spec.command)  # a placeholder a kind node cannot fill is an error now
    return cluster


def check_suite(suite: str | None, spec: SubjectSpec, node: str) -> None:
    if suite is None:
        return
    if suite not in NAMED_SUITES:
        raise ProfileError(f"--suite {suite!r}: choose one of {', '.join(NAMED_SUITES)}")
    kind = NAMED_SUITES[suite][0]
    if spec.kind != kind:
        raise ProfileError(f"--suite {suite} is for a {kind} subject; {spec.name} is a {spec.kind}")
    if node != "real":
        # Its checks read what a kubelet does with real pods (containers, events, their environment).
        raise ProfileError(f"--suite {suite} judges real pods: run it with --node real, or against a cluster where "
                           "the driver is installed (--cluster kubeconfig:PATH --driver NAME --device-class CLASS)")


def check_control_plane(spec: str) -> str:
    if spec in ("local", "none") or spec.startswith(UNAVAILABLE):
        return spec
    if spec.startswith("kubeconfig:"):
        path = Path(spec.removeprefix("kubeconfig:"))
        if not os.path.lexists(path):  # anything else there (a FIFO, a dangling symlink): the reader says what
            raise ProfileError(f"--control-plane {oneline(spec)}: no such kubeconfig file {oneline(path)}")
        from harness.controlplane.kubeconfig import KubeconfigError, load_kubeconfig

        try:  # parsed now, so a broken kubeconfig is bad input, not a run of skipped checks
            load_kubeconfig(path)
        except (KubeconfigError, OSError, ValueError) as err:
            raise ProfileError(f"--control-plane {oneline(spec)}: {err}") from None
        return f"kubeconfig:{path.resolve()}"
    raise ProfileError(f"--control-plane {spec!r}: choose one of {', '.join(CONTROL_PLANES)}")


def fakelet_version() -> str:
    try:
        return metadata.version("fakelet")
    except metadata.PackageNotFoundError:
        return "0+source"


def parse_env(items: list[str]) -> dict[str, str]:
    """`--env KEY=VALUE` items as a mapping; a ProfileError naming the bad one."""
    env = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not ENV_NAME.fullmatch(key):
            raise ProfileError(f"--env {item!r}: expected KEY=VALUE with KEY an environment variable name")
        env[key] = value
    return env


def parse_observes(values: list[str]) -> list[str] | None:
    """`--observes health,temperature` (repeatable) as a list; None when not given at all."""
    if not values:
        return None
    return [name.strip() for value in values for name in value.split(",") if name.strip()]


def _check_env_names(names: list[str], where: str) -> None:
    for name in names:
        if not ENV_NAME.fullmatch(name):
            raise ProfileError(f"{where} {name!r}: not an environment variable name")


@dataclass
class Overrides:
    """One-off changes to the subject; they apply to --subject, --subject-file and --plugin-cmd alike."""

    inventory: str | None = None  # an inventory file, or a bundled inventory's bare name
    skin: str | None = None
    env: list[str] = field(default_factory=list)  # KEY=VALUE; values are templates
    pass_env: list[str] = field(default_factory=list)
    private_dirs: list[str] = field(default_factory=list)
    device_ids: str | None = None  # opaque | inventory
    observes: list[str] | None = None  # None: as the subject says
    thermal_threshold: float | None = None  # --thermal-threshold: the plugin's own overtemperature limit, C

    def normalized(self) -> Overrides:
        """Paths made absolute (so a repro line works from anywhere); bundled bare names stay names."""
        inventory = self.inventory
        if inventory is not None and ("/" in inventory or Path(inventory).is_file()):
            # Not resolved when it leads nowhere: the error must name the dangling link the user gave.
            path = Path(inventory)
            inventory = str(path.resolve() if path.exists() else path.absolute())
        return dataclasses.replace(self, inventory=inventory)

    def apply(self, spec: SubjectSpec) -> SubjectSpec:
        spec = dataclasses.replace(spec, env=dict(spec.env), pass_env=list(spec.pass_env),
                                   private_dirs=list(spec.private_dirs))
        self._apply_backend(spec)
        self._apply_devices(spec)
        self._apply_env(spec)
        self._apply_private_dirs(spec)
        return spec

    def _apply_backend(self, spec: SubjectSpec) -> None:
        if self.inventory is not None or self.skin is not None:
            current = spec.backend or default_backend()
            inventory = resolve_inventory(self.inventory, None, "--inventory") if self.inventory \
                else current["inventory"]
            spec.backend = {"inventory": inventory, "skin": self.skin or current.get("skin", DEFAULT_SKIN)}
            spec.inventory_expected = True  # the user gave the plugin this hardware on purpose
        if self.observes is not None:
            unknown = sorted(set(self.observes) - set(OBSERVABLES))
            if unknown:
                raise ProfileError(f"--observes {','.join(unknown)}: choose from {', '.join(OBSERVABLES)}")
            if spec.backend is None:
                raise ProfileError(f"--observes: subject {spec.name} has no fake device backend; "
                                   "give --inventory or --skin too")
            spec.observes = list(dict.fromkeys(self.observes))
            spec.observes_from = "--observes"
            spec.inventory_expected = True
        if self.thermal_threshold is not None:
            self._apply_thermal(spec)

    def _apply_thermal(self, spec: SubjectSpec) -> None:
        given = self.thermal_threshold
        assert given is not None
        if not math.isfinite(given) or not THERMAL_RANGE_C[0] <= given <= THERMAL_RANGE_C[1]:
            raise ProfileError(f"--thermal-threshold {given:g}: give the plugin's overtemperature limit in degrees C, "
                               f"{THERMAL_RANGE_C[0]:g} to {THERMAL_RANGE_C[1]:g}")
        if spec.backend is None:
            raise ProfileError(f"--thermal-threshold: subject {spec.name} has no fake device backend to heat; "
                               "give --inventory or --skin too")
        spec.thermal = (float(given), spec.thermal[1])
        spec.thermal_from = "--thermal-threshold"

    def _apply_devices(self, spec: SubjectSpec) -> None:
        if self.device_ids is None:
            return
        if self.device_ids not in DEVICE_IDS:
            raise ProfileError(f"--device-ids {self.device_ids!r}: choose one of {', '.join(DEVICE_IDS)}")
        spec.opaque_ids = self.device_ids == "opaque"
        spec.inventory_expected = True

    def _apply_env(self, spec: SubjectSpec) -> None:
        spec.env.update(parse_env(self.env))
        _check_env_names(self.pass_env, "--pass-env")
        spec.pass_env = list(dict.fromkeys([*spec.pass_env, *self.pass_env]))

    def _apply_private_dirs(self, spec: SubjectSpec) -> None:
        if not self.private_dirs:
            return
        if not spec.host_view:
            raise ProfileError(f"--private-dir needs the mount-namespace or container launcher (--mount-namespace "
                               f"or --image for --plugin-cmd, launcher: mount-namespace in a subject file); subject "
                               f"{spec.name} uses the {spec.launcher} launcher")
        for d in self.private_dirs:
            if not d.startswith("/"):
                raise ProfileError(f"--private-dir {d!r}: must be an absolute path (the host directory to shadow)")
        spec.private_dirs = list(dict.fromkeys([*spec.private_dirs, *self.private_dirs]))

    def flags(self) -> list[str]:
        """These overrides as `fakelet run` flags (for repro lines)."""
        out: list[str] = []
        if self.inventory is not None:
            out += ["--inventory", self.inventory]
        if self.skin is not None:
            out += ["--skin", self.skin]
        for item in self.env:
            out += ["--env", item]
        for name in self.pass_env:
            out += ["--pass-env", name]
        for d in self.private_dirs:
            out += ["--private-dir", d]
        if self.device_ids is not None:
            out += ["--device-ids", self.device_ids]
        if self.observes is not None:
            out += ["--observes", ",".join(self.observes)]
        if self.thermal_threshold is not None:
            out += ["--thermal-threshold", f"{self.thermal_threshold:g}"]
        return out


# -- choosing the subject -------------------------------------------------------------


def _named_resource(resource: str | None, driver: str | None, kind: str, flag: str) -> str:
    """The resource (device plugin) or driver (DRA) a subject given by --plugin-cmd or --image names."""
    if kind == "dra":
        if resource:
            raise ProfileError("a --kind dra driver takes --driver, not --resource")
        if not driver:
            raise ProfileError(f"{flag} needs --driver (the DRA driver name)")
        if not is_dns1123_subdomain(driver):
            raise ProfileError(f"--driver {driver!r}: not a DNS-1123 subdomain (e.g. gpu.vendor.com)")
        return driver
    if driver:
        raise ProfileError("--driver is for --kind dra; a device plugin takes --resource")
    if not resource:
        raise ProfileError(f"{flag} needs --resource (the resource name the plugin registers)")
    if not is_extended_resource_name(resource):
        raise ProfileError(f"--resource {resource!r}: not an extended resource name (DOMAIN/NAME such as "
                           "vendor.example.com/gpu; not kubernetes.io/...)")
    return resource


def _plugin_cmd_subject(plugin_cmd: str, resource: str | None, driver: str | None, mount_namespace: bool,
                        kind: str | None) -> SubjectSpec:
    kind = kind or DEFAULT_KIND
    if not plugin_cmd.strip():
        raise ProfileError("--plugin-cmd is empty: give the command that starts the plugin")
    return from_command(plugin_cmd, _named_resource(resource, driver, kind, "--plugin-cmd"), mount_namespace, kind)


def _image_subject(image: Image, resource: str | None, driver: str | None, kind: str | None) -> SubjectSpec:
    kind = kind or DEFAULT_KIND
    return from_image(image.ref, list(image.args or []), _named_resource(resource, driver, kind, "--image"), kind,
                      image.privileged)


def _named_subject(subject: str | None, subject_file: str | None, resource: str | None, driver: str | None,
                   mount_namespace: bool, kind: str | None) -> SubjectSpec:
    given = [flag for flag, value in (("--resource", resource), ("--driver", driver), ("--kind", kind),
                                      ("--mount-namespace", mount_namespace)) if value]
    spec = load_subject_file(subject_file) if subject_file else load_subject(subject or DEFAULT_SUBJECT)
    if given:
        which = f"--subject-file {subject_file}" if subject_file else f"subject {spec.name}"
        raise ProfileError(f"{given[0]} applies to --plugin-cmd and --image only; {which} says it in its profile")
    return spec


@dataclass(frozen=True)
class Image:
    """--image and the flags that go with it: run the subject from this image (launcher container)."""

    ref: str
    args: list[str] | None = None  # --image-arg: the entrypoint's arguments (None: the subject's own)
    privileged: bool = False

    def check(self) -> Image:
        if not IMAGE_REF.fullmatch(self.ref):
            raise ProfileError(f"--image {self.ref!r}: not an image reference (NAME[:TAG][@DIGEST], e.g. "
                               "registry.example.com/vendor/plugin:1.2)")
        return self

    def flags(self) -> list[str]:
        out = ["--image", self.ref, *(a for arg in self.args or [] for a in ("--image-arg", arg))]
        return out + (["--privileged"] if self.privileged else [])


def select_subject(subject: str | None, subject_file: str | None, plugin_cmd: str | None, resource: str | None,
                   driver: str | None, mount_namespace: bool, kind: str | None,
                   image: Image | None = None) -> SubjectSpec:
    chosen = [flag for flag, value in (("--subject", subject), ("--subject-file", subject_file),
                                       ("--plugin-cmd", plugin_cmd)) if value is not None]
    if len(chosen) > 1:
        raise ProfileError(f"give either {chosen[0]} or {chosen[1]}, not both")
    if image is not None:
        if plugin_cmd is not None:
            raise ProfileError("give either --plugin-cmd or --image, not both")
        if mount_namespace:
            raise ProfileError("--mount-namespace is for --plugin-cmd; an --image runs in a container")
        if subject is None and subject_file is None:
            return _image_subject(image.check(), resource, driver, kind)
        return in_container(_named_subject(subject, subject_file, resource, driver, False, kind), image.check().ref,
                            image.args, image.privileged)
    if plugin_cmd is not None:
        return _plugin_cmd_subject(plugin_cmd, resource, driver, mount_namespace, kind)
    return _named_subject(subject, subject_file, resource, driver, mount_namespace, kind)


# -- checking the subject before anything starts ---------------------------------------


def unavailable_placeholders(spec: SubjectSpec, binary: str | None) -> dict[str, str]:
    """Placeholders this subject's kind has but this run cannot fill, with the reason."""
    out = {}
    if spec.launcher == "container":
        out["bin"] = "in a container the image's entrypoint is the plugin: leave {bin} out of its arguments"
        out["python"] = "fakelet's Python is not in the image"
    elif not spec.build and not binary:
        out["bin"] = "the subject has no build and no --binary was given"
    if not spec.inventory and not spec.backend:
        out["inventory"] = "the subject has no inventory (give --inventory)"
    if not spec.backend:
        out["sysfs_root"] = "the subject has no fake device backend (give --inventory or --skin)"
    if not has_drm((spec.backend or {}).get("skin") or DEFAULT_SKIN):
        out["levelzero_socket"] = "the Level-Zero sidecar serves Intel GPUs: it comes with the drm and drm+nvml skins"
    return out


def templates(spec: SubjectSpec) -> list[tuple[str, str]]:
    """(field path, template) for every template of the subject."""
    out = [(f"command[{n}]", t) for n, t in enumerate(spec.command)]
    out += [(f"defect_args[{n}]", t) for n, t in enumerate(spec.defect_args)]
    out += [(f"env.{k}", v) for k, v in spec.env.items()]
    out += [(f"mounts.{k}", v) for k, v in spec.mounts.items()]
    rolling = spec.rolling_update or {}
    out += [(f"rolling_update.args[{n}]", t) for n, t in enumerate(rolling.get("args", []))]
    out += [(f"rolling_update.env.{k}", v) for k, v in rolling.get("env", {}).items()]
    beside = spec.device_plugin_beside or {}
    out += [(f"device_plugin_beside.args[{n}]", t) for n, t in enumerate(beside.get("args", []))]
    out += [(f"device_plugin_beside.env.{k}", v) for k, v in beside.get("env", {}).items()]
    return out


def _origin(spec: SubjectSpec, path: str, flag_env: dict[str, str]) -> str:
    """Where a template came from, for messages: the flag that gave it, or file:line: field."""
    if path.startswith("env.") and path[4:] in flag_env:
        return f"--env {path[4:]}"
    if spec.source == "--plugin-cmd" and path.startswith("command"):
        return "--plugin-cmd"
    return spec.where(path)


def check_templates(spec: SubjectSpec, binary: str | None, flag_env: dict[str, str]) -> None:
    known = PLACEHOLDERS[spec.kind]
    unavailable = unavailable_placeholders(spec, binary)
    for path, template in templates(spec):
        where = _origin(spec, path, flag_env)
        for name in template_fields(template, where):
            if name == POD_UID_PLACEHOLDER and path.startswith("rolling_update."):
                continue
            if name in BESIDE_PLACEHOLDERS and path.startswith("device_plugin_beside."):
                continue
            if name not in known:
                raise ProfileError(f"{where}: unknown placeholder {{{name}}} in {template!r}; a {spec.kind} "
                                   f"subject has {', '.join('{' + k + '}' for k in known)}")
            if name in unavailable:
                raise ProfileError(f"{where}: {{{name}}} in {template!r} is unavailable: {unavailable[name]}")


def check_executable(spec: SubjectSpec, binary: str | None, image: Image | None = None) -> None:
    """The command's first word runs (the image is there), where it can be known before the sandbox exists."""
    if spec.launcher == "container":
        check_image(spec, f"--image {image.ref}" if image is not None else spec.where("image"))
        return
    first = spec.command[0]
    where = _origin(spec, "command[0]", {})
    static = {"python": sys.executable, **({"bin": binary} if binary else {})}
    if not set(template_fields(first, where)) <= set(static):
        return  # it names a sandbox path: only the launch can tell
    program = first.format_map(static)
    if shutil.which(program) is None:
        raise ProfileError(f"{where}: {program!r} is not an executable file or a command on PATH")


def check_image(spec: SubjectSpec, where: str) -> None:
    """A Docker engine answers and has the image (pulled when it can be): before anything starts."""
    from harness.launch.containers import engine, images

    try:
        images.ensure_present(spec.image or "")
    except (engine.EngineUnavailable, images.ImageError) as err:
        raise ProfileError(f"{where}: {err}") from None
    except ImportError as err:
        raise ProfileError(f"{where}: the docker Python package is missing ({err})") from None


def check_pass_env(spec: SubjectSpec, flag_names: list[str]) -> None:
    """Every variable to pass is set here and now, so a plugin never starts without it."""
    for name in spec.pass_env:
        where = f"--pass-env {name}" if name in flag_names else f"{spec.where('pass_env')}: {name}"
        if name in spec.env:
            raise ProfileError(f"{where}: also set in env; pass it or set it, not both")
        if name not in os.environ:
            raise ProfileError(f"{where}: not set in fakelet's environment")


def check_inventories(spec: SubjectSpec) -> None:
    """Inventories load (within the YAML limits), and devices.map names their devices."""
    ids: set[str] = set()
    for path in (spec.inventory, (spec.backend or {}).get("inventory")):
        if path:
            try:
                ids |= {d.id for d in Inventory.from_dict(load_yaml(Path(path)).data, path).devices}
            except ValueError as err:
                raise ProfileError(str(err)) from None
    for plugin_id, inventory_id in (spec.device_map or {}).items():
        if inventory_id not in ids:
            raise ProfileError(f"{spec.where('devices.map.' + plugin_id)}: no device {inventory_id!r} in the "
                               f"inventory (known: {', '.join(sorted(ids)) or 'none'})")


REQUIRE_RE = re.compile(r"^(DP|DRA)(-[A-Z]+(-[0-9]+)?)?$")


def check_require(require: list[str]) -> list[str]:
    """--require names check IDs (DP-HLT-01) or areas (DP-HLT, DP, DRA)."""
    bad = [r for r in require if not REQUIRE_RE.match(r)]
    if bad:
        raise ProfileError(f"--require {bad[0]!r}: give a check ID (DP-HLT-01) or an area (DP-HLT, DRA-PRP, DP)")
    return list(require)


def check_seed(seed: int) -> int:
    """The range a scenario file's `seed` has too, so that every seed a run prints can be written back."""
    try:
        return int(check_number("--seed", seed, 0, MAX_SEED, integer=True))
    except UserInputError as err:
        raise ProfileError(str(err)) from None


def check_binary(binary: str | None) -> None:
    if binary is not None:
        try:
            check_user_file(binary, "--binary")
        except UserInputError as err:
            raise ProfileError(f"{err.where}: {err.problem.removeprefix('cannot read: ')}") from None


# -- serialization helpers --------------------------------------------------------------


def _profile_to_dict(profile: Profile) -> dict[str, Any]:
    """The profile by name, plus what differs from the named one (e.g. a shortened reaction bound)."""
    base = get_profile(profile.name).describe()
    return {"name": profile.name, **{k: v for k, v in profile.describe().items() if base.get(k) != v}}


def _profile_from_dict(data: dict[str, Any]) -> Profile:
    changes = {k: v for k, v in data.items() if k != "name"}
    return dataclasses.replace(get_profile(data["name"]), **changes)


@dataclass
class RunConfig:
    spec: SubjectSpec
    profile: Profile
    defect: str | None = None
    seed: int = 0
    checks: list[str] = field(default_factory=list)
    out: Path | None = None
    binary: str | None = None  # as given with --binary; a built one is kept apart (not part of the repro)
    kubelet_version: KubeletVersion = field(default_factory=lambda: get_kubelet_version("default"))
    control_plane: str = "local"
    node: str = "fake"  # whose kubelet the checks run on: fakelet's, or a real one (harness/node/real)
    subject_file: str | None = None  # absolute path, when the subject came from --subject-file
    plugin_cmd: str | None = None  # as given, when the subject came from --plugin-cmd
    image: Image | None = None  # --image (with --image-arg, --privileged): the subject runs from it
    cluster: str | None = None  # --cluster kind: the subject's image as a DaemonSet on a kind cluster
    kind_image: str | None = None  # --kind-image: the kind node image (default: kind's own)
    keep_cluster: bool = False  # --keep-cluster: reuse the cluster, and leave it for the next run
    overrides: Overrides = field(default_factory=Overrides)
    # --require: check IDs or areas (DP-HLT) whose "not exercised" fails the run.
    require: list[str] = field(default_factory=list)
    suite: str | None = None  # --suite NAME (kep5970): a named suite instead of the subject kind's own
    device_class: str | None = None  # --device-class: the installed driver's DeviceClass (--cluster kubeconfig:)
    _built_binary: str | None = None
    _binary_error: str | None = None

    @classmethod
    def build(cls, subject: str | None = None, defect: str | None = None, profile: str = "fast", seed: int = 0,
              checks: list[str] | None = None, out: str | None = None, plugin_cmd: str | None = None,
              resource: str | None = None, mount_namespace: bool = False, binary: str | None = None,
              kind: str | None = None, kubelet_version: str = "default", control_plane: str = "local", *,
              subject_file: str | None = None, driver: str | None = None,
              overrides: Overrides | None = None, require: list[str] | None = None,
              reaction_bound: float | None = None, node: str = "fake", image: Image | None = None,
              cluster: str | None = None, kind_image: str | None = None, keep_cluster: bool = False,
              suite: str | None = None) -> RunConfig:
        """Validate every input; a ProfileError (or ValueError) names the flag or file:line: field.

        `kind` None means "not given" (device-plugin for --plugin-cmd; an error with a subject).
        """
        overrides = (overrides or Overrides()).normalized()
        spec = overrides.apply(select_subject(subject, subject_file, plugin_cmd, resource, driver,
                                              mount_namespace, kind, image))
        error = spec.defect_error(defect) if defect is not None else None
        if error is not None:
            raise ProfileError(error)
        cluster = check_cluster(cluster, kind_image, keep_cluster, node, spec)
        check_suite(suite, spec, node)
        check_base()
        check_binary(binary)
        check_templates(spec, binary, parse_env(overrides.env))
        check_executable(spec, binary, image)
        check_pass_env(spec, overrides.pass_env)
        check_inventories(spec)
        seed = check_seed(seed)
        timing = get_profile(profile)
        if reaction_bound is not None:
            timing = timing.with_reaction_bound(reaction_bound)
        plane = check_control_plane(control_plane)
        node = check_node(node, control_plane)
        return cls(spec=spec, profile=timing, defect=defect, seed=seed, checks=list(checks or []),
                   out=Path(out) if out else None, binary=binary,
                   kubelet_version=check_kubelet_version(kubelet_version, node), control_plane=plane,
                   subject_file=str(Path(subject_file).resolve()) if subject_file else None,
                   plugin_cmd=plugin_cmd, image=image, overrides=overrides, require=check_require(require or []),
                   node=node,
                   cluster=cluster, kind_image=kind_image,
                   keep_cluster=keep_cluster, suite=suite)

    @classmethod
    def for_cluster(cls, cluster: str, driver: str | None, device_class: str | None, suite: str | None,
                    profile: str = "fast", seed: int = 0, checks: list[str] | None = None, out: str | None = None,
                    require: list[str] | None = None, reaction_bound: float | None = None) -> RunConfig:
        """A driver already installed in a live cluster (`--cluster kubeconfig:PATH`): fakelet launches nothing,
        it only creates claims and pods in a namespace of its own. Checked now: the kubeconfig reads, the API
        server answers, and the DeviceClass exists."""
        if suite != "kep5970":
            raise ProfileError(f"--cluster {oneline(cluster)}: a live cluster runs --suite kep5970 (fakelet deploys "
                               "nothing there)")
        if not driver or not is_dns1123_subdomain(driver):
            raise ProfileError(f"--cluster {oneline(cluster)}: give --driver NAME, the installed driver's name "
                               f"(a DNS-1123 subdomain){f'; not {driver!r}' if driver else ''}")
        if not device_class or not is_dns1123_subdomain(device_class):
            raise ProfileError(f"--cluster {oneline(cluster)}: give --device-class CLASS, a DeviceClass of the "
                               f"driver's devices{f'; not {device_class!r}' if device_class else ''}")
        try:
            spec_text = check_control_plane(cluster)  # the kubeconfig exists and parses
        except ProfileError as err:
            raise ProfileError(str(err).replace("--control-plane", "--cluster", 1)) from None
        from harness.controlplane.client import ApiError, KubeClient
        from harness.controlplane.kubeconfig import KubeconfigError

        try:
            client = KubeClient.from_kubeconfig(Path(spec_text.removeprefix("kubeconfig:")))
        except (KubeconfigError, OSError, ValueError) as err:
            raise ProfileError(f"--cluster {oneline(cluster)}: {oneline(str(err))}") from None
        try:
            client.get(f"/apis/resource.k8s.io/v1/deviceclasses/{device_class}")
        except ApiError as err:
            what = "no such DeviceClass" if err.status == 404 else oneline(str(err))
            raise ProfileError(f"--device-class {device_class}: {what} in the cluster of {oneline(cluster)}") from None
        except OSError as err:
            raise ProfileError(f"--cluster {oneline(cluster)}: {oneline(str(err))}") from None
        finally:
            client.close()
        spec = SubjectSpec(name=driver, kind="dra", command=[], resource=driver, driver=driver, launcher="installed",
                           source="--cluster", description=f"DRA driver {driver}, installed in the cluster")
        timing = get_profile(profile)
        if reaction_bound is not None:
            timing = timing.with_reaction_bound(reaction_bound)
        return cls(spec=spec, profile=timing, seed=check_seed(seed), checks=list(checks or []),
                   out=Path(out) if out else None, control_plane="none", cluster=spec_text,
                   require=check_require(require or []), suite=suite, device_class=device_class)

    @property
    def suite_package(self) -> str:
        return suite_package(self.spec.kind, self.suite)

    def resolve_binary(self) -> str | None:
        """Build the subject's binary from its Go wrapper module, once; raise SubjectUnavailable if we cannot."""
        from harness.world.env import SubjectUnavailable

        if self.binary or not self.spec.build:
            return self.binary
        if self._built_binary:
            return self._built_binary
        if self._binary_error:
            raise SubjectUnavailable(self._binary_error)
        b = self.spec.build
        try:
            self._built_binary = str(gobuild.build(Path(b["module"]), b["package"], b.get("binary"),
                                                   b.get("get"), bool(b.get("cgo")),
                                                   why=f"for subject {self.spec.name}"))
        except (gobuild.GoUnavailable, FileNotFoundError, RuntimeError) as err:
            # One line: the build's last words say what was missing (e.g. the proxy's refusal).
            last = [line.strip() for line in str(err).splitlines() if line.strip()][-2:]
            self._binary_error = f"subject {self.spec.name}: cannot build {b['package']}: {' '.join(last)[:400]}"
            raise SubjectUnavailable(self._binary_error) from err
        return self._built_binary

    def built_binary(self) -> str | None:
        """The subject's binary when it exists already (given, or built before); never starts a build."""
        if self.binary or not self.spec.build:
            return self.binary
        if self._built_binary:
            return self._built_binary
        b = self.spec.build
        found = gobuild.cached(Path(b["module"]), b["package"], b.get("binary"), b.get("get"),
                               bool(b.get("cgo")))
        return str(found) if found is not None else None

    # -- one description of the run ---------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"format": CONFIG_FORMAT}
        for f in dataclasses.fields(self):
            if f.name.startswith("_"):
                continue  # per-process state (a build's result or failure)
            value = getattr(self, f.name)
            if f.name == "spec":
                value = value.to_dict()
            elif f.name == "profile":
                value = _profile_to_dict(value)
            elif f.name == "kubelet_version":
                value = value.name
            elif f.name in ("overrides", "image") and value is not None:
                value = dataclasses.asdict(value)
            elif isinstance(value, Path):
                value = str(value)
            out[f.name] = value
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunConfig:
        if data.get("format") != CONFIG_FORMAT:
            raise ProfileError(f"run config format {data.get('format')!r}; this fakelet reads {CONFIG_FORMAT}")
        known = {f.name for f in dataclasses.fields(cls) if not f.name.startswith("_")}
        unknown = sorted(set(data) - known - {"format"})
        if unknown:
            raise ProfileError(f"run config: unknown field(s) {unknown}")
        values = {k: v for k, v in data.items() if k != "format"}
        values["spec"] = SubjectSpec.from_dict(data["spec"])
        values["profile"] = _profile_from_dict(data["profile"])
        values["kubelet_version"] = check_kubelet_version(data.get("kubelet_version", "default"),
                                                          data.get("node", "fake"))
        values["overrides"] = Overrides(**data.get("overrides", {}))
        values["image"] = Image(**data["image"]) if data.get("image") else None
        values["out"] = Path(data["out"]) if data.get("out") else None
        return cls(**values)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str) -> RunConfig:
        try:
            return cls.from_dict(json.loads(text))
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            raise ProfileError(f"run config: not a fakelet run config ({type(err).__name__}: {err})") from None

    def save(self, path: Path) -> Path:
        # 0600: it names the subject's env, which may matter to someone.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(self.to_json())
        return path

    @classmethod
    def load(cls, path: Path | str) -> RunConfig:
        try:
            text = read_user_text(path, "--fakelet-config", MAX_CONFIG_BYTES)
        except UserInputError as err:
            raise ProfileError(str(err)) from None
        return cls.from_json(text)

    # -- the command that runs it again --------------------------------------------------

    def subject_flags(self) -> list[str]:
        if self.spec.source == "--cluster":
            return ["--driver", self.spec.resource, "--device-class", self.device_class or ""]
        image = self.image.flags() if self.image is not None else []
        if self.subject_file:
            return ["--subject-file", self.subject_file, *image]
        if self.spec.source == "--image":
            kind = ["--kind", "dra", "--driver", self.spec.resource] if self.spec.is_dra else \
                ["--resource", self.spec.resource]
            return [*image, *kind]
        if self.spec.source != "--plugin-cmd":
            return ["--subject", self.spec.name, *image]
        parts = ["--plugin-cmd", self.plugin_cmd if self.plugin_cmd is not None else shlex.join(self.spec.command)]
        parts += ["--kind", "dra", "--driver", self.spec.resource] if self.spec.is_dra else \
            ["--resource", self.spec.resource]
        if self.spec.launcher == "mount-namespace":
            parts.append("--mount-namespace")
        return parts

    def repro(self, check_id: str) -> str:
        parts = ["fakelet", "run", *self.subject_flags(), *self.overrides.flags()]
        if self.binary:
            parts += ["--binary", str(Path(self.binary).resolve())]
        if self.spec.is_dra or self.kubelet_version.name != get_kubelet_version("default").name:
            parts += ["--kubelet-version", self.kubelet_version.name]
        if self.spec.is_dra:
            if self.control_plane != "local":
                parts += ["--control-plane", self.control_plane]
        if self.defect:
            parts += ["--defect", self.defect]
        if self.suite:
            parts += ["--suite", self.suite]
        if self.node != "fake":
            parts += ["--node", self.node]
        if self.cluster is not None and self.cluster.startswith("kubeconfig:"):
            parts += ["--cluster", self.cluster]
        elif self.cluster is not None:
            parts += ["--cluster", self.cluster, *(["--kind-image", self.kind_image] if self.kind_image else []),
                      *(["--keep-cluster"] if self.keep_cluster else [])]
        if self.profile.shortened:
            parts += ["--reaction-bound", f"{self.profile.reaction_s:g}"]
        parts += ["--profile", self.profile.name, "--seed", str(self.seed), "--check", check_id]
        return shlex.join(parts)
