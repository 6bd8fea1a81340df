"""libnvidia-ml.so.1 from our own C source, compiled with the system C compiler on first use.

Cached by the source's hash under the user's cache dir (`$FAKELET_CACHE`, else
~/.cache/fakelet), so every run after the first finds it built. No compiler is
one clear error naming the package that brings one.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import sysconfig
import tempfile
from pathlib import Path

from harness.instruments.doctor import machine_lacks
from harness.instruments.progress import Progress, home_relative

SOURCE = Path(__file__).resolve().parent / "libnvml.c"
LIBRARY = "libnvidia-ml.so.1"  # the soname NVML's consumers dlopen
COMPILE_TIMEOUT_S = 120.0
COMPILE_QUIET_S = 3.0  # about a second on an idle machine: only a loaded one hears about it
# Debian's multiarch triplets (`gcc -print-multiarch`) by machine, for a Python that does not know its own.
MULTIARCH = {"x86_64": "x86_64-linux-gnu", "aarch64": "aarch64-linux-gnu", "ppc64le": "powerpc64le-linux-gnu",
             "s390x": "s390x-linux-gnu", "riscv64": "riscv64-linux-gnu", "i686": "i386-linux-gnu",
             "armv7l": "arm-linux-gnueabihf"}


class NvmlBuildError(RuntimeError):
    """The library cannot be built here; the message says why and what to install."""


def cache_root() -> Path:
    return Path(os.environ.get("FAKELET_CACHE") or Path.home() / ".cache" / "fakelet") / "nvml"


def distribution_path() -> str:
    """Where a distribution's driver package puts the library: /usr/lib/<multiarch>/ (Debian, Ubuntu), one of
    the dynamic loader's own search dirs there, and a path NVIDIA's plugins look in by name."""
    machine = platform.machine()
    triplet = sysconfig.get_config_var("MULTIARCH") or MULTIARCH.get(machine, f"{machine}-linux-gnu")
    return f"/usr/lib/{triplet}/{LIBRARY}"


def library() -> Path:
    """The built library (built now if missing): a directory to put on LD_LIBRARY_PATH holds it."""
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]
    target = cache_root() / digest / LIBRARY
    if target.is_file():
        return target
    cc = shutil.which(os.environ.get("CC") or "cc") or shutil.which("gcc")
    if cc is None:
        raise NvmlBuildError(machine_lacks("no C compiler (cc) to build the fake NVML library: apt-get install -y gcc"))
    target.parent.mkdir(parents=True, exist_ok=True)
    # Built beside the target's dir (same file system) and renamed into place: concurrent first uses
    # never see half a file, and the target's dir only ever holds the library, so a mount namespace can
    # lay that dir over a distribution's lib dir as one read-only overlay layer (harness/launch/nsexec.py).
    fd, partial = tempfile.mkstemp(dir=target.parent.parent, prefix=f".{target.parent.name}.", suffix=".so")
    os.close(fd)
    try:
        with Progress(f"the fake NVML library ({LIBRARY})", quiet_s=COMPILE_QUIET_S,
                      detail=f" with {cc} (first use; cached afterwards in {home_relative(cache_root())})"):
            proc = subprocess.run([cc, "-shared", "-fPIC", "-O2", "-Wall", "-Wextra", "-fvisibility=hidden",
                                   f"-Wl,-soname,{LIBRARY}", "-o", partial, str(SOURCE), "-lpthread", "-ldl"],
                                  capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S)
        if proc.returncode != 0:
            raise NvmlBuildError(f"{cc} failed to build the fake NVML library: {proc.stderr.strip()[-600:]}")
        # mkstemp's 0600 survives the linker (0711): a plugin running as another user could not map it.
        os.chmod(partial, 0o755)
        os.replace(partial, target)
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
    return target
