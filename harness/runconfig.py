"""What one conformance run is about: subject, defect, profile, seed, checks, output.

Shared by the pytest plugin and the CLI so both validate input the same way.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

from harness import gobuild
from harness.env import SubjectUnavailable
from harness.kubelet.versions import KubeletVersion
from harness.kubelet.versions import get as get_kubelet_version
from harness.profiles import Profile
from harness.profiles import get as get_profile
from harness.sandbox import check_base
from harness.subjects import ProfileError, SubjectSpec, from_command, load_subject, repo_root

DEFAULT_SUBJECT = "reference-dp"
CONTROL_PLANES = ("local", "kubeconfig:<path>", "none")
UNAVAILABLE = "unavailable:"  # a control plane the CLI failed to start; the rest is the reason
# Set by `fakelet run` for its check processes: the one API server it started for "local".
SHARED_CONTROL_PLANE_ENV = "FAKELET_SHARED_CONTROL_PLANE"


def check_control_plane(spec: str) -> str:
    if spec in ("local", "none") or spec.startswith(UNAVAILABLE):
        return spec
    if spec.startswith("kubeconfig:"):
        path = Path(spec.removeprefix("kubeconfig:"))
        if not path.is_file():
            raise ProfileError(f"--control-plane {spec}: no such kubeconfig file {path}")
        return f"kubeconfig:{path.resolve()}"
    raise ProfileError(f"--control-plane {spec!r}: choose one of {', '.join(CONTROL_PLANES)}")


def fakelet_version() -> str:
    try:
        return metadata.version("fakelet")
    except metadata.PackageNotFoundError:
        return "0+source"


@dataclass
class RunConfig:
    spec: SubjectSpec
    profile: Profile
    defect: str | None = None
    seed: int = 0
    checks: list[str] = field(default_factory=list)
    out: Path | None = None
    binary: str | None = None
    kubelet_version: KubeletVersion = field(default_factory=lambda: get_kubelet_version("default"))
    control_plane: str = "local"
    _binary_error: str | None = None

    @classmethod
    def build(cls, subject: str | None, defect: str | None, profile: str, seed: int,
              checks: list[str] | None = None, out: str | None = None, plugin_cmd: str | None = None,
              resource: str | None = None, mount_namespace: bool = False, binary: str | None = None,
              kind: str = "device-plugin", kubelet_version: str = "default",
              control_plane: str = "local") -> RunConfig:
        if plugin_cmd and subject:
            raise ProfileError("give either --subject or --plugin-cmd, not both")
        if plugin_cmd:
            if not resource:
                what = "--driver (the DRA driver name)" if kind == "dra" else \
                    "--resource (the resource name the plugin registers)"
                raise ProfileError(f"--plugin-cmd needs {what}")
            spec = from_command(plugin_cmd, resource, mount_namespace, kind)
        else:
            spec = load_subject(subject or DEFAULT_SUBJECT)
        if defect is not None and defect not in spec.defects:
            known = ", ".join(spec.defects) or "none"
            raise ProfileError(f"subject {spec.name} has no defect {defect!r}; known defects: {known}")
        check_base()
        if binary is not None and not Path(binary).is_file():
            raise ProfileError(f"--binary {binary}: no such file")
        return cls(spec=spec, profile=get_profile(profile), defect=defect, seed=seed, checks=list(checks or []),
                   out=Path(out) if out else None, binary=binary, kubelet_version=get_kubelet_version(kubelet_version),
                   control_plane=check_control_plane(control_plane))

    def resolve_binary(self) -> str | None:
        """Build the subject's binary from its Go wrapper module, once; raise SubjectUnavailable if we cannot."""
        if self.binary or not self.spec.build:
            return self.binary
        if self._binary_error:
            raise SubjectUnavailable(self._binary_error)
        b = self.spec.build
        try:
            self.binary = str(gobuild.build(repo_root() / b["module"], b["package"], b.get("binary"), b.get("get")))
        except (gobuild.GoUnavailable, FileNotFoundError, RuntimeError) as err:
            # One line: the build's last words say what was missing (e.g. the proxy's refusal).
            last = [line.strip() for line in str(err).splitlines() if line.strip()][-2:]
            self._binary_error = f"subject {self.spec.name}: cannot build {b['package']}: {' '.join(last)[:400]}"
            raise SubjectUnavailable(self._binary_error) from err
        return self.binary

    def repro(self, check_id: str) -> str:
        parts = ["fakelet", "run"]
        if self.spec.source == "--plugin-cmd":
            parts += ["--plugin-cmd", " ".join(self.spec.command)]
            parts += ["--kind", "dra", "--driver", self.spec.resource] if self.spec.is_dra else \
                ["--resource", self.spec.resource]
            if self.spec.launcher == "mount-namespace":
                parts.append("--mount-namespace")
        else:
            parts += ["--subject", self.spec.name]
        if self.spec.is_dra:
            parts += ["--kubelet-version", self.kubelet_version.name]
            if self.control_plane != "local":
                parts += ["--control-plane", self.control_plane]
        if self.defect:
            parts += ["--defect", self.defect]
        parts += ["--profile", self.profile.name, "--seed", str(self.seed), "--check", check_id]
        return shlex.join(parts)
