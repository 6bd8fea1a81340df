"""Inside a fresh private mount namespace: bind directories into place, then exec.

    unshare --mount --propagation private -- python -m harness.nsexec \\
        --scratch DIR --bind SRC:DST [--bind ...] -- PROGRAM ARGS...

When DST's parents do not exist on the host, it shadows the deepest existing
ancestor with a tmpfs that re-exposes the ancestor's original entries, so the
path can be made without writing anything to the host file system.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path


def mount(*args: str) -> None:
    proc = subprocess.run(["mount", *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"nsexec: mount {' '.join(args)} failed: {proc.stderr.strip()}")


def existing_ancestor(path: Path) -> Path:
    while not path.exists():
        path = path.parent
    return path


def shadow(ancestor: Path, scratch: Path) -> None:
    """Replace `ancestor` with a writable tmpfs that still shows its original contents."""
    original = scratch / ("orig" + str(ancestor).replace("/", "_"))
    original.mkdir(parents=True, exist_ok=True)
    mount("--bind", str(ancestor), str(original))
    mount("-t", "tmpfs", "-o", "mode=0755", "fakelet-shadow", str(ancestor))
    for entry in os.scandir(original):
        target = ancestor / entry.name
        if entry.is_symlink():
            os.symlink(os.readlink(entry.path), target)
            continue
        if entry.is_dir():
            target.mkdir()
        else:
            target.touch()
        mount("--bind", entry.path, str(target))


def bind(src: str, dst: str, scratch: Path) -> None:
    target = Path(dst)
    if not target.exists():
        shadow(existing_ancestor(target.parent), scratch)
        target.mkdir(parents=True, exist_ok=True)
    mount("--bind", src, dst)


def main() -> None:
    parser = argparse.ArgumentParser(prog="nsexec")
    parser.add_argument("--scratch", required=True, type=Path)
    parser.add_argument("--bind", action="append", default=[], metavar="SRC:DST")
    parser.add_argument("argv", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    if not argv:
        raise SystemExit("nsexec: no program given")
    for spec in args.bind:
        src, _, dst = spec.partition(":")
        bind(src, dst, args.scratch)
    try:
        os.execvp(argv[0], argv)
    except OSError as err:
        raise SystemExit(f"nsexec: cannot exec {argv[0]}: {err}") from err


if __name__ == "__main__":
    sys.exit(main())
