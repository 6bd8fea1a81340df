"""setuptools' hooks for what pyproject.toml cannot say: fakelet's own files ship inside the package.

fixtures/ (subjects, inventories, scenarios, the fidelity sample, the Go wrapper modules) is copied to
harness/_bundled/fixtures in the wheel, mirroring the checkout, with build.json beside it recording the
commit the wheel was built from (harness/spec/bundled.py reads both). An sdist carries fixtures/ as it is
(MANIFEST.in) and the commit in fakelet-build.json, so a wheel built from it records the same commit.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

HERE = Path(__file__).resolve().parent
BUILD_FILE = "fakelet-build.json"  # in an sdist: the commit of the checkout it was made from
SKIP = shutil.ignore_patterns("__pycache__", "*.pyc")


def _commit() -> dict[str, object]:
    recorded = HERE / BUILD_FILE
    if recorded.is_file():
        return json.loads(recorded.read_text())
    try:
        head = subprocess.run(["git", "-C", str(HERE), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(HERE), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return {}
    return {"commit": head, "dirty": bool(dirty)}


class BuildPy(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return  # an editable install reads the checkout's fixtures/ (harness/spec/bundled.py)
        bundle = Path(self.build_lib) / "harness" / "_bundled"
        shutil.rmtree(bundle, ignore_errors=True)
        shutil.copytree(HERE / "fixtures", bundle / "fixtures", ignore=SKIP)
        (bundle / "build.json").write_text(json.dumps(_commit()) + "\n")


class Sdist(sdist):
    def make_release_tree(self, base_dir: str, files: list[str]) -> None:
        super().make_release_tree(base_dir, files)
        target = Path(base_dir) / BUILD_FILE
        target.unlink(missing_ok=True)  # a hard link to the checkout's own, if one was ever written
        target.write_text(json.dumps(_commit()) + "\n")


setup(cmdclass={"build_py": BuildPy, "sdist": Sdist})
