"""What produced a report's verdicts (its `provenance`): the pieces that need no harness.

The harness gathers the facts (harness/run/provenance.py); this module holds what the report
writers, `fakelet bundle`, `verify` and `compare` share: digests, the few lines a reader sees
first, and the mark of a verdict decided near its bound while the machine was overloaded.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
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

