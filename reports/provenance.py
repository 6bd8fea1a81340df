"""What produced a report's verdicts (its `provenance`): the pieces that need no harness.

The harness gathers the facts (harness/run/provenance.py); this module holds what the report
writers, `fakelet bundle`, `verify` and `compare` share: digests, the few lines a reader sees
first, and the mark of a verdict decided near its bound while the machine was overloaded.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from reports.model import SubjectReport

FORMAT = 1
# A measured reaction this close to its bound (as a fraction of it) decides nothing firmly: a busier or
# quieter machine could have put it on the other side.
NEAR_BOUND_FRACTION = 0.9
NEAR_BOUND_NOTE = "decided near a bound under load"
HASH_CHUNK = 1 << 20


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path | str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def catalog_digest(entries: Iterable[tuple[str, str, str]]) -> str:
    """SHA-256 of the check catalog: (ID, level, title) sorted by ID, one JSON array. A changed title or
    level changes it; the order checks were defined in does not."""
    rows = sorted({(cid, level, title) for cid, level, title in entries})
    return sha256_bytes(json.dumps(rows, separators=(",", ":"), ensure_ascii=False).encode())


def overloaded(host: dict[str, Any]) -> bool:
    """Whether the 1-minute load average, at the start or at the end, was above the CPU count."""
    cpus = host.get("cpus") or 0
    loads = [load[0] for load in (host.get("load_start"), host.get("load_end")) if load]
    return bool(cpus) and any(load > cpus for load in loads)


def mark_near_bound(report: SubjectReport, bound_s: float | None) -> list[str]:
    """Mark the checks whose measured reaction ended within 10% of the bound while the machine was overloaded;
    return their IDs.

    Only reaction times a check measured (`measured`) can be judged: a wait that timed out records none, and
    most checks wait on several things without naming one decisive. The provenance says which were judged."""
    host = report.provenance.get("host", {})
    judged = sorted(c.id for c in report.checks if c.measured)
    marked: list[str] = []
    if bound_s and overloaded(host):
        for c in report.checks:
            close = {what: t for what, t in c.measured.items() if t >= NEAR_BOUND_FRACTION * bound_s}
            if not close:
                continue
            marked.append(c.id)
            took = ", ".join(f"{what} {t:g}s" for what, t in close.items())
            note = (f"{NEAR_BOUND_NOTE}: {took} of a {bound_s:g}s bound, load average "
                    f"{_loads(host)} on {host.get('cpus')} CPUs")
            if note not in c.notes:
                c.notes.append(note)
    report.provenance["near_bound"] = {
        "rule": f"a measured reaction at or above {NEAR_BOUND_FRACTION:.0%} of its bound ({bound_s or 0:g}s) while "
                "the 1-minute load average exceeded the CPU count, at the start or the end",
        "judged": judged, "marked": marked}
    return marked


def _loads(host: dict[str, Any]) -> str:
    start, end = host.get("load_start") or [0.0], host.get("load_end") or [0.0]
    return f"{start[0]:.2f} -> {end[0]:.2f}"


def peak_load(host: dict[str, Any]) -> float | None:
    """The higher 1-minute load average of the run's start and end; None when neither was recorded."""
    loads = [load[0] for load in (host.get("load_start"), host.get("load_end")) if load]
    return max(loads) if loads else None


def load_text(host: dict[str, Any]) -> str:
    """'load 2.73 -> 3.10 on 2 CPUs' (the 1-minute averages at the start and the end), or 'load unknown'."""
    if peak_load(host) is None:
        return "load unknown"
    return f"load {_loads(host)}" + (f" on {host['cpus']} CPUs" if host.get("cpus") else "")


# -- host paths ---------------------------------------------------------------------------------------------

# Where a file lives on the host is recorded against a named anchor (the subject file's directory, the working
# directory, ...) so that a report handed over names no user, workspace or CI runner. FHS system directories name
# the same thing on every host of a distribution and are kept as they are.
SYSTEM_DIRS = ("/usr/", "/bin/", "/sbin/", "/lib/", "/lib64/", "/opt/", "/etc/")
OTHER_HOST_PATH = "<host>"


def host_path(path: str | Path, anchors: Sequence[tuple[str, str | Path | None]]) -> str:
    """`path` as '<anchor>/relative' under the first (label, directory) anchor holding it, else '~/...' under
    the home directory, else as it is under a system directory, else '<host>/.../NAME': never a raw
    absolute path of this host."""
    text = str(path)
    if not os.path.isabs(text):
        return text
    norm = os.path.normpath(text)
    for label, directory in anchors:
        if not directory:
            continue
        base = os.path.normpath(str(directory))
        if norm == base:
            return label
        if norm.startswith(base.rstrip("/") + "/"):
            return f"{label}/{norm[len(base.rstrip('/')) + 1:]}"
    home = os.path.expanduser("~")
    if home not in ("", "/") and norm.startswith(home.rstrip("/") + "/"):
        return f"~/{norm[len(home.rstrip('/')) + 1:]}"
    if norm.startswith(SYSTEM_DIRS):
        return norm
    return f"{OTHER_HOST_PATH}/.../{os.path.basename(norm)}"


def redact_paths(text: str, anchors: Sequence[tuple[str, str | Path | None]]) -> str:
    """`text` (a command line) with each anchor's directory, then the home directory, named by its label."""
    home = os.path.expanduser("~")
    pairs = [(str(d).rstrip("/"), label) for label, d in anchors if d and str(d).rstrip("/")]
    if home not in ("", "/"):
        pairs.append((home.rstrip("/"), "~"))
    for directory, label in sorted(pairs, key=lambda p: -len(p[0])):  # the deepest first: cwd inside home
        text = text.replace(directory + "/", label + "/")
    return text


def short(digest: str | None) -> str:
    return (digest or "")[:12] or "n/a"


def lines(prov: dict[str, Any]) -> list[str]:
    """The provenance in a few lines, for the top of summary.md and the HTML, and for `fakelet verify`."""
    if not prov:
        return []
    f, subject, kubelet = prov.get("fakelet", {}), prov.get("subject", {}), prov.get("kubelet", {})
    commit = f.get("commit")
    made = f"fakelet {f.get('version', '?')}" + (
        f" (commit {commit[:12]}{', dirty tree' if f.get('dirty') else ''})" if commit else "")
    made += f", check catalog sha256 {short(prov.get('catalog', {}).get('sha256'))}"
    what = [subject.get("name", "?")]
    for key, label in (("binary_sha256", "binary sha256"), ("image_id", "image"),
                       ("subject_file_sha256", "subject file sha256")):
        if subject.get(key):
            what.append(f"{label} {short(subject[key].removeprefix('sha256:'))}")
    for code in subject.get("code") or []:
        if code.get("role") in ("script", "module") and code.get("sha256"):
            what.append(f"{code['role']} {code.get('path', '?')} sha256 {short(code['sha256'])}")
    if subject.get("python_distributions"):
        what.append(f"{len(subject['python_distributions'])} Python distributions")
    if kubelet.get("node") == "real":
        kube = f"real kubelet {kubelet.get('version') or kubelet.get('release', '?')}"
        if kubelet.get("binary_sha256"):
            kube += f" (sha256 {short(kubelet['binary_sha256'])})"
    else:
        kube = f"fake kubelet modelling {kubelet.get('model', '?')}"
    parts = [f"{k} {v}" for k, v in prov.get("components", {}).items()]
    hw = prov.get("hardware", {})
    if hw:
        kube += f"; inventory {hw.get('inventory_name', '?')} skin {hw.get('skin', '?')} " \
                f"(sha256 {short(hw.get('sha256'))})"
    host = prov.get("host", {})
    where = (f"kernel {host.get('kernel', '?')}, cgroup {host.get('cgroup', '?')}, {host.get('cpus', '?')} CPUs, "
             f"load {_loads(host)}")
    marked = prov.get("near_bound", {}).get("marked") or []
    if marked:
        where += f"; {NEAR_BOUND_NOTE}: {', '.join(marked)}"
    out = [f"produced by: {made}", f"subject: {', '.join(what)}", f"kubelet: {kube}"]
    if parts:
        out.append(f"components: {'; '.join(parts)}")
    out.append(f"host: {where}")
    return out

