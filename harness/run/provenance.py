"""Gathering a report's provenance: what produced its verdicts (reports/provenance.py holds the rest).

Only what the run already knows, or what can be read without starting anything: fakelet's own
checkout (`git` in it), files to hash, the API server's version as the control plane recorded it, and
Debian's package database for the runtime pieces installed from it (etcd, runc, and containerd where the
real node falls back to Debian's), the build cache for containerd 2.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
from pathlib import Path
from typing import Any

from harness.config.runconfig import RunConfig, fakelet_version
from harness.controlplane import ControlPlane, ControlPlaneUnavailable
from harness.node.real import runtime as node_runtime
from harness.run import subject_code
from harness.spec import bundled
from harness.spec.checks import all_packages, catalog
from reports.model import FAIL, PASS, SubjectReport
from reports.provenance import (
    FORMAT,
    catalog_digest,
    host_path,
    mark_near_bound,
    redact_paths,
    sha256_bytes,
    sha256_file,
)

# The shared control plane's description, handed by `fakelet run` to its check processes.
PLANE_ENV = "FAKELET_PLANE_PROVENANCE"
GIT_TIMEOUT_S = 10.0
DPKG_STATUS = Path("/var/lib/dpkg/status")
# The Debian packages a run's pieces come from when tools/system-deps.sh installed them.
PACKAGES = {"etcd": "etcd-server", "containerd": "containerd", "runc": "runc"}


def announce_plane(plane: ControlPlane | None) -> None:
    """Tell the check processes what the shared control plane runs (they only get its kubeconfig)."""
    if plane is None:
        os.environ.pop(PLANE_ENV, None)
        return
    with contextlib.suppress(Exception):  # a description is a nicety; never fail the run over it
        os.environ[PLANE_ENV] = json.dumps(plane.describe())


def host_facts() -> dict[str, Any]:
    return {"kernel": platform.release(), "machine": platform.machine(), "cgroup": cgroup_version(),
            "cpus": os.cpu_count() or 0, "load_start": load()}


def load() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def cgroup_version() -> str:
    return "v2" if Path("/sys/fs/cgroup/cgroup.controllers").exists() else "v1"


def checkout() -> dict[str, Any]:
    """fakelet's commit and whether its tree had changes: recorded in an install, read from git in a checkout."""
    return dict(bundled.build_info())


def catalog_facts() -> dict[str, Any]:
    entries = [(cid, level, title) for package in all_packages() for cid, (level, title) in catalog(package).items()]
    return {"sha256": catalog_digest(entries), "checks": len(entries)}


def _file_digest(path: str | None) -> str | None:
    if not path or not os.path.isfile(path):
        return None
    try:
        return sha256_file(path)
    except OSError:
        return None


def subject_facts(run: RunConfig) -> dict[str, Any]:
    """The subject and the code it ran: its command's files hashed (harness/run/subject_code.py), its binary, its
    image's ID and digests, its subject file; every path named against an anchor, never this host's own."""
    spec = run.spec
    where = subject_code.anchors(run)
    command = run.plugin_cmd or " ".join(spec.command)
    out: dict[str, Any] = {"name": spec.name, "kind": spec.kind, "defect": run.defect,
                           "command": redact_paths(command, where), "launcher": spec.launcher}
    # Never a build of its own: a subject that could not be built has its checks say so, once.
    binary = run.built_binary()
    if binary:
        out["binary"] = host_path(binary, where)
        out["binary_sha256"] = _file_digest(binary)
    image = run.image.ref if run.image is not None else (spec.image if spec.launcher == "container" else None)
    if image:
        out["image"] = image
        out.update(image_facts(image))
    if run.subject_file:
        out["subject_file"] = host_path(run.subject_file, where)
        out["subject_file_sha256"] = _file_digest(run.subject_file)
    out.update(subject_code.pin(run, binary))
    return out


def image_facts(ref: str) -> dict[str, Any]:
    """`image_id` (the engine's ID of the image, the digest of its config: what `docker image inspect` calls Id)
    and `image_digests` (its registry digests, RepoDigests, when it came from a registry); the ID None when no
    engine answers (none is started)."""
    try:
        from harness.launch.containers.engine import client, unavailable

        if unavailable() is not None:
            return {"image_id": None}
        found = client().images.get(ref)
        digests = sorted(str(d) for d in found.attrs.get("RepoDigests") or [])
        return {"image_id": str(found.id), "image_digests": digests}
    except Exception:  # any engine trouble leaves the ID unknown, never the report unwritten
        return {"image_id": None}


def kubelet_facts(run: RunConfig, report: SubjectReport) -> dict[str, Any]:
    if run.node != "real":
        return {"node": "fake", "model": run.kubelet_version.name}
    out: dict[str, Any] = {"node": "real", "release": run.kubelet_version.name}
    # Only when a check ran on it: the binary is then built and cached, and asking is a lookup, not a build.
    if any(c.verdict in (PASS, FAIL) for c in report.checks):
        with contextlib.suppress(ControlPlaneUnavailable, OSError):
            from harness.node.real.localnode import find_kubelet

            path, version = find_kubelet(run.kubelet_version.name)
            out.update(version=version, binary=host_path(path, subject_code.anchors(run)),
                       binary_sha256=_file_digest(str(path)))
    return out


def component_facts(run: RunConfig) -> dict[str, str]:
    out: dict[str, str] = {}
    plane: dict[str, Any] = {}
    with contextlib.suppress(ValueError):
        plane = json.loads(os.environ.get(PLANE_ENV) or "{}")
    if plane and (run.spec.is_dra or run.node == "real"):
        out["kube-apiserver"] = str(plane.get("version", "?"))
        manager = str(plane.get("kube-controller-manager", ""))
        # Built from the same wrapper module as the API server: the same release.
        out["kube-controller-manager"] = manager if manager.startswith("not running") else out["kube-apiserver"]
        scheduler = str(plane.get("kube-scheduler", ""))
        if scheduler and not scheduler.startswith("not running"):
            out["kube-scheduler"] = out["kube-apiserver"]  # the same wrapper module, the same release
        if plane.get("etcd"):
            out["etcd"] = package_version(PACKAGES["etcd"]) or str(plane["etcd"])
    if run.node == "real":
        for name in ("containerd", "runc"):
            out[name] = package_version(PACKAGES[name]) or "version unknown (not from a Debian package)"
        built = node_runtime.in_use()
        if built is not None:
            out["containerd"] = f"{built.version} (built from {node_runtime.CONTAINERD} v{built.version})"
    return out


def package_version(package: str) -> str | None:
    """A Debian package's installed version, read from dpkg's database (no process started)."""
    try:
        text = DPKG_STATUS.read_text(errors="replace")
    except OSError:
        return None
    for stanza in text.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in stanza.splitlines() if ": " in line and not line[0].isspace())
        if fields.get("Package") == package and "installed" in fields.get("Status", ""):
            return f"{fields.get('Version', '?')} (Debian {package})"
    return None


def hardware_facts(run: RunConfig) -> dict[str, Any]:
    backend = run.spec.backend or {}
    inventory = backend.get("inventory") or run.spec.inventory
    if not inventory:
        return {}
    skin = backend.get("skin", "")
    named = host_path(inventory, subject_code.anchors(run))
    try:
        data = Path(inventory).read_bytes()
    except OSError:
        return {"inventory": named, "skin": skin}
    # One digest of what the plugin saw: the inventory's bytes and the layout it was laid out in.
    return {"inventory": named, "inventory_name": Path(inventory).stem, "skin": skin,
            "inventory_sha256": sha256_bytes(data), "sha256": sha256_bytes(data + b"\0skin=" + skin.encode())}


def start() -> dict[str, Any]:
    """What is known when the check run starts: the load average then."""
    return {"host": host_facts()}


def finish(run: RunConfig, report: SubjectReport, started: dict[str, Any]) -> None:
    """Fill `report.provenance` at the end of its check run, and mark verdicts decided near a bound under load."""
    host = dict(started.get("host") or host_facts())
    host["load_end"] = load()
    report.provenance = {
        "format": FORMAT,
        "fakelet": {"version": fakelet_version(), **checkout()},
        "catalog": catalog_facts(),
        "subject": subject_facts(run),
        "kubelet": kubelet_facts(run, report),
        "components": component_facts(run),
        "hardware": hardware_facts(run),
        "host": host,
    }
    mark_near_bound(report, run.profile.reaction_s)
