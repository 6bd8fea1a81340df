"""The one image LocalNode's pods run: Debian's static busybox, built and imported locally.

No registry is reachable here, so the pod sandbox ("pause") image and the
workload image are the same small image, written as a `docker save` archive
that `ctr images import` reads. Its entrypoint waits for SIGTERM and exits 0
at once, so pod deletion does not wait out a grace period; busybox also gives
the container a shell for `ctr tasks exec` when a check wants to look inside.
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import struct
import tarfile
from pathlib import Path

IMAGE_REF = "fakelet.local/node:1"
BUSYBOX_HINT = "Debian package busybox-static"
APPLETS = ("sh", "sleep", "cat", "ls", "env", "kill")
# PID 1 ignores SIGTERM unless it traps it; `wait` returns as soon as the trap fires.
ENTRYPOINT = ["/bin/sh", "-c", "trap 'exit 0' TERM INT; sleep 2147483647 & wait"]
PT_INTERP = 3  # ELF program header type of a dynamic executable's interpreter


class ImageError(RuntimeError):
    """The image cannot be built here (no static busybox)."""


def is_static_elf(path: Path) -> bool:
    """Whether `path` is a 64-bit ELF executable without a dynamic loader (runs in an empty root)."""
    with open(path, "rb") as f:
        head = f.read(64)
        if head[:5] != b"\x7fELF\x02":
            return False
        phoff, = struct.unpack_from("<Q", head, 0x20)
        phentsize, phnum = struct.unpack_from("<HH", head, 0x36)
        f.seek(phoff)
        table = f.read(phentsize * phnum)
    return all(struct.unpack_from("<I", table, i * phentsize)[0] != PT_INTERP for i in range(phnum))


def find_busybox() -> Path:
    for candidate in (shutil.which("busybox"), "/bin/busybox", "/usr/bin/busybox"):
        if candidate and Path(candidate).is_file() and is_static_elf(Path(candidate)):
            return Path(candidate)
    raise ImageError(f"no statically linked busybox found ({BUSYBOX_HINT})")


def _add(tf: tarfile.TarFile, name: str, data: bytes | None = None, *, mode: int = 0o644,
         link: str | None = None, directory: bool = False) -> None:
    info = tarfile.TarInfo(name)
    info.mtime, info.uid, info.gid = 0, 0, 0  # reproducible: the same busybox gives the same digest
    if directory:
        info.type, info.mode = tarfile.DIRTYPE, 0o755
        tf.addfile(info)
    elif link is not None:
        info.type, info.linkname, info.mode = tarfile.SYMTYPE, link, 0o777
        tf.addfile(info)
    else:
        assert data is not None
        info.size, info.mode = len(data), mode
        tf.addfile(info, io.BytesIO(data))


def _layer(busybox: Path) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tf:
        for d in ("bin", "dev", "proc", "sys", "etc", "tmp", "run"):
            _add(tf, d, directory=True)
        _add(tf, "bin/busybox", busybox.read_bytes(), mode=0o755)
        for applet in APPLETS:
            _add(tf, f"bin/{applet}", link="busybox")
    return buf.getvalue()


def write_archive(path: Path, ref: str = IMAGE_REF) -> str:
    """Write the image as a `docker save` archive at `path`; return its reference."""
    layer = _layer(find_busybox())
    layer_id = hashlib.sha256(layer).hexdigest()
    config = json.dumps({
        "architecture": "amd64", "os": "linux",
        "config": {"Entrypoint": ENTRYPOINT, "Env": ["PATH=/bin"]},
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{layer_id}"]},
    }, sort_keys=True).encode()
    config_id = hashlib.sha256(config).hexdigest()
    manifest = [{"Config": f"{config_id}.json", "RepoTags": [ref], "Layers": [f"{layer_id}/layer.tar"]}]
    with tarfile.open(path, mode="w") as tf:
        _add(tf, f"{layer_id}/layer.tar", layer)
        _add(tf, f"{config_id}.json", config)
        _add(tf, "manifest.json", json.dumps(manifest).encode())
    return ref
