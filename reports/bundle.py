"""A report a vendor can hand over: `fakelet bundle` and `fakelet verify`.

A bundle is a gzip'd tar with one top directory, `fakelet-bundle/`, holding the report directory under
`reports/`, `provenance.json`, `badge.svg`, and `MANIFEST` (one `SHA-256  PATH` line for every other file),
and `MANIFEST.sig` when signed: an OpenSSH signature of the MANIFEST in the `fakelet` namespace
(`ssh-keygen -Y sign`), so trusting the manifest is trusting every file. Nothing here needs the network.
The tar is reproducible: sorted, owner root, times zero.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reports.badge import badge_svg
from reports.model import CONFORMANT, NOT_CONFORMANT, SubjectReport, run_status
from reports.provenance import lines as provenance_lines
from reports.provenance import sha256_bytes

TOP = "fakelet-bundle"
MANIFEST, SIGNATURE = "MANIFEST", "MANIFEST.sig"
NAMESPACE = "fakelet"  # ssh-keygen -Y's namespace: a signature made for anything else does not verify here
MAX_BUNDLE_BYTES = 2 << 30  # unpacked; a report with its artifacts is a few MiB
SSH_TIMEOUT_S = 30.0


class BundleError(ValueError):
    """Bad input: a missing or unreadable report directory, bundle, key or signers file (exit 2)."""


class Mismatch(Exception):
    """The bundle does not hold what its manifest or signature says (exit 1), naming the file."""


def load_report_json(data: bytes, where: str) -> list[SubjectReport]:
    """The subject reports of one report.json: a single subject's, or a multi-subject run's index."""
    try:
        doc = json.loads(data)
        runs = doc["runs"] if isinstance(doc, dict) and "runs" in doc else [doc]
        return [SubjectReport.from_dict(r) for r in runs]
    except (ValueError, TypeError, KeyError, AttributeError) as err:
        raise BundleError(f"{where}: not a fakelet report.json ({type(err).__name__}: {str(err)[:120]})") from None


def load_dir(path: Path) -> list[SubjectReport]:
    if not path.is_dir():
        raise BundleError(f"{path}: no such report directory" if not path.exists() else f"{path}: not a directory")
    report = path / "report.json"
    if not report.is_file():
        raise BundleError(f"{path}: holds no report.json (is it a fakelet report directory?)")
    return load_report_json(report.read_bytes(), str(report))


def badge_status(reports: list[SubjectReport]) -> str:
    """CONFORMANT, NOT CONFORMANT, or INCOMPLETE: a run that errored or was interrupted did not complete."""
    status = run_status(reports)
    return status if status in (CONFORMANT, NOT_CONFORMANT) else "INCOMPLETE"


def catalog_sha(reports: list[SubjectReport]) -> str:
    digests = {r.provenance.get("catalog", {}).get("sha256", "") for r in reports} - {""}
    return sorted(digests)[0] if len(digests) == 1 else ("several" if digests else "")


def provenance_doc(reports: list[SubjectReport]) -> dict[str, Any]:
    return {"status": run_status(reports), "badge": badge_status(reports),
            "subjects": [{"subject": r.subject, "defect": r.defect, "status": r.status_line(),
                          "provenance": r.provenance} for r in reports]}


def _files(root: Path) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    for path in sorted(root.rglob("*")):
        if path.is_symlink() or not path.is_file():
            continue  # a report holds regular files; a link could point anywhere on the machine
        out[f"reports/{path.relative_to(root).as_posix()}"] = path.read_bytes()
    return out


def manifest_text(files: dict[str, bytes]) -> str:
    return "".join(f"{sha256_bytes(data)}  {name}\n" for name, data in sorted(files.items()))


def ssh_keygen() -> str:
    found = shutil.which("ssh-keygen")
    if found is None:
        raise BundleError("ssh-keygen not found (Debian package openssh-client): it signs and verifies bundles")
    return found


def sign(manifest: bytes, key: Path) -> bytes:
    if not key.is_file():
        raise BundleError(f"--sign {key}: no such key file" if not key.exists() else f"--sign {key}: not a file")
    with tempfile.TemporaryDirectory(prefix="fakelet-sign-") as tmp:
        target = Path(tmp) / MANIFEST
        target.write_bytes(manifest)
        # stdin closed: a key with a passphrase fails here instead of waiting on a prompt.
        proc = subprocess.run([ssh_keygen(), "-Y", "sign", "-f", str(key), "-n", NAMESPACE, str(target)],
                              stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=SSH_TIMEOUT_S)
        sig = Path(tmp) / SIGNATURE
        if proc.returncode != 0 or not sig.is_file():
            why = (proc.stderr.strip().splitlines() or ["no signature written"])[-1]
            raise BundleError(f"--sign {key}: ssh-keygen could not sign with it: {why}")
        return sig.read_bytes()


def make(report_dir: Path, out: Path, key: Path | None = None) -> tuple[Path, list[SubjectReport], int]:
    """Write the bundle of `report_dir` to `out` (whole, or not at all); return it, its reports and file count."""
    reports = load_dir(report_dir)
    files = _files(report_dir)
    files["provenance.json"] = (json.dumps(provenance_doc(reports), indent=2) + "\n").encode()
    files["badge.svg"] = badge_svg(badge_status(reports), catalog_sha(reports)).encode()
    manifest = manifest_text(files).encode()
    files[MANIFEST] = manifest
    if key is not None:
        files[SIGNATURE] = sign(manifest, key)
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", dir=out.parent)
    try:
        with os.fdopen(fd, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz, \
                tarfile.open(fileobj=gz, mode="w") as tar:
            for name, data in sorted(files.items()):
                info = tarfile.TarInfo(f"{TOP}/{name}")
                info.size, info.mode, info.mtime = len(data), 0o644, 0
                tar.addfile(info, io.BytesIO(data))
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return out, reports, len(files)


def read(bundle: Path) -> dict[str, bytes]:
    """Every file of a bundle by its path under the top directory; BundleError when it is not one."""
    if not bundle.exists():
        raise BundleError(f"{bundle}: no such bundle")
    if not bundle.is_file():
        raise BundleError(f"{bundle}: not a file")
    files: dict[str, bytes] = {}
    total = 0
    try:
        with tarfile.open(bundle, mode="r:gz") as tar:
            for member in tar:
                name = member.name
                if not name.startswith(f"{TOP}/") or ".." in name.split("/"):
                    raise Mismatch(f"{name}: outside the bundle's {TOP}/ directory")
                if member.isdir():
                    continue
                if not member.isfile():
                    raise Mismatch(f"{name}: not a regular file (a bundle holds only files)")
                total += member.size
                if total > MAX_BUNDLE_BYTES:
                    raise BundleError(f"{bundle}: unpacks to more than {MAX_BUNDLE_BYTES >> 30} GiB")
                data = tar.extractfile(member)
                files[name.removeprefix(f"{TOP}/")] = data.read() if data is not None else b""
    except (tarfile.TarError, OSError, EOFError, gzip.BadGzipFile) as err:
        raise BundleError(f"{bundle}: not a fakelet bundle (a .tar.gz): {err}") from None
    if MANIFEST not in files:
        raise BundleError(f"{bundle}: holds no {MANIFEST} (not a fakelet bundle)")
    return files


def check_manifest(files: dict[str, bytes]) -> int:
    """Every file against the manifest: Mismatch naming the first file that differs, is missing or is extra."""
    listed: dict[str, str] = {}
    for n, line in enumerate(files[MANIFEST].decode(errors="replace").splitlines(), 1):
        digest, sep, name = line.partition("  ")
        if not sep or len(digest) != 64:
            raise Mismatch(f"{MANIFEST}:{n}: not a 'SHA-256  PATH' line")
        listed[name] = digest
    for name, digest in sorted(listed.items()):
        if name not in files:
            raise Mismatch(f"{name}: in the manifest, missing from the bundle")
        if sha256_bytes(files[name]) != digest:
            raise Mismatch(f"{name}: its SHA-256 differs from the manifest's (changed after bundling)")
    extra = sorted(set(files) - set(listed) - {MANIFEST, SIGNATURE})
    if extra:
        raise Mismatch(f"{extra[0]}: in the bundle, not in its manifest")
    return len(listed)


@dataclass
class Signature:
    state: str  # "unsigned", "good", "unchecked"
    principal: str = ""
    detail: list[str] = field(default_factory=list)


def check_signature(files: dict[str, bytes], allowed: Path | None) -> Signature:
    sig = files.get(SIGNATURE)
    if allowed is not None and not allowed.is_file():
        raise BundleError(f"--allowed-signers {allowed}: no such file" if not allowed.exists()
                          else f"--allowed-signers {allowed}: not a file")
    if sig is None:
        if allowed is not None:
            raise Mismatch(f"{SIGNATURE}: missing: the bundle is unsigned, and --allowed-signers asks for a signature")
        return Signature("unsigned")
    keygen = ssh_keygen()
    with tempfile.TemporaryDirectory(prefix="fakelet-verify-") as tmp:
        sig_path = Path(tmp) / SIGNATURE
        sig_path.write_bytes(sig)

        def run(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([keygen, "-Y", *args], input=files[MANIFEST].decode(errors="surrogateescape"),
                                  capture_output=True, text=True, timeout=SSH_TIMEOUT_S)

        if allowed is None:
            # The signature matches the manifest; whose key made it is the reader's to decide.
            proc = run("check-novalidate", "-n", NAMESPACE, "-s", str(sig_path))
            if proc.returncode != 0:
                raise Mismatch(f"{SIGNATURE}: does not sign this {MANIFEST}: {_last(proc)}")
            return Signature("unchecked")
        found = subprocess.run([keygen, "-Y", "find-principals", "-s", str(sig_path), "-f", str(allowed)],
                               capture_output=True, text=True, timeout=SSH_TIMEOUT_S)
        principals = found.stdout.split() if found.returncode == 0 else []
        if not principals:
            raise Mismatch(f"{SIGNATURE}: made by a key that {allowed} does not allow")
        proc = run("verify", "-f", str(allowed), "-I", principals[0], "-n", NAMESPACE, "-s", str(sig_path))
        if proc.returncode != 0:
            raise Mismatch(f"{SIGNATURE}: does not verify against {MANIFEST} with {allowed}: {_last(proc)}")
        return Signature("good", principals[0])


def _last(proc: subprocess.CompletedProcess[str]) -> str:
    return ((proc.stderr or proc.stdout).strip().splitlines() or [f"exit {proc.returncode}"])[-1]


def reports_of(files: dict[str, bytes], where: str) -> list[SubjectReport]:
    data = files.get("reports/report.json")
    if data is None:
        raise Mismatch("reports/report.json: missing from the bundle")
    return load_report_json(data, f"{where}: reports/report.json")


def _shared_lines(reports: list[SubjectReport]) -> dict[str, str]:
    """Provenance lines by label; for several subjects, each label's distinct values joined with "; " (one run
    has one fakelet and one host, and a kubelet per subject kind)."""
    values: dict[str, list[str]] = {}
    for report in reports:
        for line in provenance_lines(report.provenance):
            label, _, value = line.partition(": ")
            if value not in values.setdefault(label, []):
                values[label].append(value)
    if len(reports) > 1:
        values.pop("subject", None)  # each subject's own line: the verdict line names them all
    return {label: f"{label}: {'; '.join(v)}" for label, v in values.items()}


def verify(bundle: Path, allowed: Path | None) -> list[str]:
    """The five lines `fakelet verify` prints; Mismatch or BundleError when the bundle does not verify."""
    files = read(bundle)
    count = check_manifest(files)
    signature = check_signature(files, allowed)
    reports = reports_of(files, str(bundle))
    by = _shared_lines(reports)
    status = reports[0].status_line() if len(reports) == 1 else run_status(reports)
    subjects = by.get("subject") or "subject: " + ", ".join(
        f"{r.subject}{f' [defect {r.defect}]' if r.defect else ''} {r.status_line()}" for r in reports)
    if len(reports) == 1 and reports[0].defect:
        subjects += f" [defect {reports[0].defect}]"
    made = by.get("produced by") or "produced by: fakelet " + reports[0].fakelet_version + " (no provenance recorded)"
    where = "; ".join(by[k].split(": ", 1)[1] for k in ("kubelet", "host") if k in by) or "not recorded"
    sig = {"unsigned": "unsigned",
           "unchecked": "signed, signer not checked (give --allowed-signers)",
           "good": f"good signature by {signature.principal} ({allowed})"}[signature.state]
    return [f"verdict: {status}", subjects, made, f"ran on: {where}",
            f"bundle: {count} files match the manifest; {sig}"]
