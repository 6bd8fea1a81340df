"""tools/build-image.sh's Python half: what only fakelet's own code knows.

    python tools/build_image.py digest WHEEL          the wheel's content digest (sha256, hex)
    python tools/build_image.py kube-binaries WHEEL   build (or find) the default release's kube binaries
                                                      for the modules in WHEEL: "name path" lines
    python tools/build_image.py engine                start a private Docker engine, print its DOCKER_HOST,
                                                      stop it when stdin closes (or on SIGTERM/SIGINT)
    python - verify < tools/build_image.py            inside the image's root: fakelet's cache there holds
                                                      every kube binary and the NVML library (builds the
                                                      latter with the image's gcc): nothing is built on a run

The binaries are keyed by gobuild's hash of their wrapper module's files (harness/launch/gobuild.py):
building them from the wheel's own copy of those modules, not the checkout's, makes the names the ones
the image's fakelet looks for even when --wheel is another commit's.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import os
import signal
import subprocess
import sys
import tempfile
import threading
import zipfile
from pathlib import Path
from typing import NoReturn

# A plain `python tools/build_image.py` imports the checkout's harness; `python - verify` inside the
# image's root (stdin, no file) imports the image's own installed one.
_HERE = globals().get("__file__")
if _HERE and Path(_HERE).is_file():
    sys.path.insert(0, str(Path(_HERE).resolve().parents[1]))

BUNDLED_GO = "harness/_bundled/fixtures/go/"  # where a wheel carries the Go wrapper modules (setup.py)


class OneLineParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message}\n")  # one line: the shell script shows it as it is


def kube_binaries() -> list[tuple[str, str, str]]:
    """(wrapper module, binary name, Go package) of every kube binary a run of the default release may build:
    the local control plane's three, and the real node's kubelet and containerd 2 (daemon, runc shim, ctr)."""
    from harness.controlplane.local import (
        KUBE_APISERVER_PACKAGE,
        KUBE_CONTROLLER_MANAGER_PACKAGE,
        KUBE_MODULE,
        KUBE_SCHEDULER_PACKAGE,
    )
    from harness.kubelet.versions import DEFAULT_KUBELET_VERSION
    from harness.node.real.localnode import KUBELET_PACKAGE
    from harness.node.real.releases import REAL_KUBELET_MODULES
    from harness.node.real.runtime import COMMANDS, CONTAINERD_MODULE

    return [(KUBE_MODULE, "kube-apiserver", KUBE_APISERVER_PACKAGE),
            (KUBE_MODULE, "kube-controller-manager", KUBE_CONTROLLER_MANAGER_PACKAGE),
            (KUBE_MODULE, "kube-scheduler", KUBE_SCHEDULER_PACKAGE),
            (REAL_KUBELET_MODULES[DEFAULT_KUBELET_VERSION], "kubelet", KUBELET_PACKAGE),
            *((CONTAINERD_MODULE, name, package) for name, package in COMMANDS.items())]


def wheel_digest(wheel: Path) -> str:
    """sha256 over the wheel's member names and contents, not its zip metadata: two wheels built from the
    same tree (whose file times differ) have one digest, so an image built from either is the same."""
    h = hashlib.sha256()
    with zipfile.ZipFile(wheel) as zf:
        for name in sorted(zf.namelist()):
            h.update(name.encode() + b"\0")
            h.update(hashlib.sha256(zf.read(name)).digest())
    return h.hexdigest()


def prebuild() -> None:
    """`fakelet prebuild` of the default release, where this fakelet has the command: its plan and cost
    estimates reach the terminal. The builds below then find the binaries cached (same modules, same names)
    and build only what it could not; its failure is theirs to report."""
    if importlib.util.find_spec("harness.run.prebuild") is None:
        return
    from harness.kubelet.versions import DEFAULT_KUBELET_VERSION

    root = str(Path(__file__).resolve().parents[1])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p))
    # stdout too goes to stderr: this command's stdout is its "name path" lines only.
    subprocess.run([sys.executable, "-m", "harness.run.cli", "prebuild", "--kubelet-version", DEFAULT_KUBELET_VERSION],
                   env=env, stdout=sys.stderr, check=False)


def build_kube_binaries(wheel: Path) -> list[tuple[str, Path]]:
    from harness.launch import gobuild

    prebuild()
    with zipfile.ZipFile(wheel) as zf, tempfile.TemporaryDirectory(prefix="fakelet-image-go-") as work:
        found = []
        for module, name, package in kube_binaries():
            prefix = f"{BUNDLED_GO}{module}/"
            members = [m for m in zf.namelist() if m.startswith(prefix) and not m.endswith("/")]
            if not members:
                raise SystemExit(f"build_image: {wheel.name} carries no Go module {module} (under {prefix})")
            module_dir = Path(work) / module
            if not module_dir.is_dir():
                for member in members:
                    target = module_dir / member[len(prefix):]
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(zf.read(member))
            # gobuild's own progress lines say when one is built rather than found in the cache.
            found.append((name, gobuild.build(module_dir, package, name, why="for the fakelet image")))
        return found


def verify() -> int:
    """Inside the image's root: every binary a default run may build is in the cache, by the name the
    image's fakelet computes; the NVML library is built here, by the image's own gcc, so no run builds it."""
    from fake_devices.nvml import build as nvml
    from harness.launch import gobuild
    from harness.spec import bundled

    missing = [name for module, name, package in kube_binaries()
               if gobuild.cached(bundled.go_module(module), package, name) is None]
    if missing:
        print(f"build_image: the image's fakelet would build {', '.join(missing)}: not in "
              f"{gobuild.cache_dir()} under the names it computes", file=sys.stderr)
        return 1
    print(f"build_image: in the image: {', '.join(n for _, n, _ in kube_binaries())} cached; NVML library "
          f"{nvml.library()}", file=sys.stderr)
    return 0


def engine() -> int:
    """A private engine for as long as stdin stays open: the shell script holds the other end."""
    from harness.launch.containers.engine import EngineUnavailable, PrivateEngine

    private = PrivateEngine()
    stop = threading.Event()
    # SIGTERM or Ctrl-C: stop the engine the same way as at EOF (the finally below).
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        private.start()
    except EngineUnavailable as err:
        print(f"build_image: no private Docker engine: {err}", file=sys.stderr)
        return 1
    try:
        print(private.host, flush=True)
        reader = threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True)
        reader.start()
        stop.wait()
    finally:
        private.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="build_image", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("digest", "kube-binaries"):
        sub.add_parser(name).add_argument("wheel", type=Path)
    sub.add_parser("engine")
    sub.add_parser("verify")
    args = parser.parse_args(argv)
    if args.command == "digest":
        print(wheel_digest(args.wheel))
    elif args.command == "kube-binaries":
        for name, path in build_kube_binaries(args.wheel):
            print(name, path)
    elif args.command == "engine":
        return engine()
    else:
        return verify()
    return 0


if __name__ == "__main__":
    sys.exit(main())
