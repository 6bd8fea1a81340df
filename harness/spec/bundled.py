"""Where fakelet's own files are: the one module that knows.

fakelet reads files of its own at run time: the bundled subjects, inventories and scenarios,
the fidelity sample and the checks' duration seeds (fixtures/), and the Go wrapper modules that
pin the upstream Kubernetes binaries, kind, the upstream subjects and the Go reference subjects
(fixtures/go/). An installed fakelet carries them as package data, under harness/_bundled/
(setup.py's build_py copies fixtures/ there, mirroring the checkout); a checkout, an editable
install included, reads the repository's fixtures/ as it always did. Nothing else computes a
path from the repository root, so an installed wheel runs from any directory.

The NVML library's C source is package data of fake_devices.nvml beside its builder, and the
wire schemas of harness.wire beside their stubs: each is found next to the module that uses it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

BUNDLE_DIR = Path(__file__).resolve().parents[1] / "_bundled"  # harness/_bundled, in a wheel only
CHECKOUT_DIR = Path(__file__).resolve().parents[2]  # the repository, when fakelet runs from one
BUILD_INFO = "build.json"  # written by setup.py beside the bundled fixtures: version and commit
FIXTURES_ENV = "FAKELET_FIXTURES"
GIT_TIMEOUT_S = 10.0


class FilesMissing(RuntimeError):
    """fakelet's own files are not where an install or a checkout puts them: a broken install."""


def installed() -> bool:
    """True when fakelet runs from an installed distribution (wheel or sdist), not from a checkout."""
    return BUNDLE_DIR.is_dir()


def checkout() -> Path | None:
    """The repository fakelet runs from, if it runs from one (an editable install included)."""
    if installed():
        return None
    return CHECKOUT_DIR if (CHECKOUT_DIR / "pyproject.toml").is_file() and (CHECKOUT_DIR / "fixtures").is_dir() \
        else None


def files_root() -> Path:
    """The directory that holds fakelet's own fixtures/ (the bundle in a wheel, the checkout otherwise)."""
    root = BUNDLE_DIR if installed() else checkout()
    if root is None or not (root / "fixtures" / "subjects").is_dir():
        raise FilesMissing(f"fakelet's own files are missing (looked in {BUNDLE_DIR} and {CHECKOUT_DIR / 'fixtures'}):"
                           " reinstall fakelet (pip install --force-reinstall fakelet)")
    return root


def bundled_fixtures() -> Path:
    """fakelet's own fixtures/, whatever $FAKELET_FIXTURES says (the Go modules are always these)."""
    return files_root() / "fixtures"


def fixtures_dir() -> Path:
    """Where fixtures/ is read from: $FAKELET_FIXTURES when set, else fakelet's own."""
    override = os.environ.get(FIXTURES_ENV)
    if override is not None:
        return Path(override)
    return bundled_fixtures()


def go_module(name: str) -> Path:
    """A Go wrapper module of fakelet's own, by its directory name ("kubernetes", "kind", "nvmlplugin")."""
    return bundled_fixtures() / "go" / name


def go_modules() -> list[Path]:
    """Every Go wrapper module fakelet carries (what `fakelet prebuild --all` may build from)."""
    root = bundled_fixtures() / "go"
    return sorted(p for p in root.iterdir() if (p / "go.mod").is_file()) if root.is_dir() else []


@cache
def build_info() -> dict[str, Any]:
    """fakelet's commit: recorded at build time in an install, read from git in a checkout.

    {"commit": sha, "dirty": bool} where known, {} where not (an sdist built outside git).
    """
    if installed():
        try:
            data = json.loads((BUNDLE_DIR / BUILD_INFO).read_text())
        except (OSError, ValueError):
            return {}
        return {k: data[k] for k in ("commit", "dirty") if k in data}
    root = checkout()
    return git_commit(root) if root is not None else {}


def git_commit(root: Path) -> dict[str, Any]:
    """HEAD of the git checkout at `root` and whether its tracked files have changes; {} without git."""
    git = shutil.which("git")
    if git is None or not (root / ".git").exists():
        return {}
    try:
        head = subprocess.run([git, "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=GIT_TIMEOUT_S, check=True).stdout.strip()
        dirty = subprocess.run([git, "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=GIT_TIMEOUT_S, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return {}
    return {"commit": head, "dirty": bool(dirty)}


DISTRIBUTION = "fakelet"
IMPORT_PACKAGES = ("harness", "suites", "reports", "fake_devices")  # the wheel's top level (pyproject.toml)


def clashes(site: Path | None = None) -> list[str]:
    """Other distributions installed beside fakelet that write one of its import packages, as
    "'harness' from harness 0.1.0": pip lets the second one overwrite the first's files silently.

    The design card fixes fakelet's top level, and PyPI has distributions named `harness` and
    `reports`: installed into one environment, one breaks the other. Only the site directory
    fakelet is installed in is read, and only each distribution's RECORD, so the check costs tens of
    milliseconds at every start.
    """
    if site is None:
        if not installed():
            return []  # a checkout's own packages come first on sys.path
        site = BUNDLE_DIR.parents[1]
    from importlib import metadata

    found = []
    for dist in metadata.distributions(path=[str(site)]):
        name = dist.metadata["Name"] or ""
        if name.lower() == DISTRIBUTION:
            continue
        for package in sorted(_top_level(dist) & set(IMPORT_PACKAGES)):
            found.append(f"{package!r} from {name} {dist.version}")
    return sorted(found)


def _top_level(dist: Any) -> set[str]:
    # RECORD, not top_level.txt: that one is advisory (PyPI's `harness` 0.1.0 lists "validate" there and
    # installs harness/); a distribution without a RECORD (installed by hand) has only top_level.txt.
    record = dist.read_text("RECORD")
    if record is None:
        return set((dist.read_text("top_level.txt") or "").split())
    return {line.split("/", 1)[0] for line in record.splitlines() if "/" in line.split(",", 1)[0]}


def clash_message(site: Path | None = None) -> str | None:
    """One line naming the clash and the fix, or None."""
    found = clashes(site)
    if not found:
        return None
    return (f"fakelet's import packages are also installed by other distributions in {site or BUNDLE_DIR.parents[1]}: "
            f"{', '.join(found)}; one overwrote the other's files. Install fakelet in an environment of its own "
            "(pipx install fakelet, or a venv)")
