"""The reference DRA driver's record of prepared claims, kept across restarts.

Upstream's kubeletplugin helper (draplugin.go, UnprepareResourceClaims) says a
driver "cannot assume that the matching PrepareResourceClaims call was handled
by the same process": after a restart it must still unprepare, and
re-preparing must give the same answer. So every change is written before the
call that made it returns: JSON, via a temp file, fsync and rename.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

log = logging.getLogger("reference-dra")

CHECKPOINT_FILE = "dra-reference-checkpoint.json"
VERSION = 1


def _checksum(claims: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(claims, sort_keys=True).encode()).hexdigest()


class Checkpoint:
    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / CHECKPOINT_FILE

    def load(self) -> dict[str, dict[str, Any]]:
        """uid -> prepared claim record; empty when there is none or it cannot be trusted."""
        try:
            doc = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as err:
            log.error("checkpoint %s unreadable, starting without it: %s", self.path, err)
            return {}
        claims = doc.get("claims") if isinstance(doc, dict) else None
        if (not isinstance(claims, dict) or doc.get("version") != VERSION
                or doc.get("checksum") != _checksum(claims)):
            log.error("checkpoint %s is not a valid version %d checkpoint; starting without it", self.path, VERSION)
            return {}
        return claims

    def save(self, claims: dict[str, dict[str, Any]]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        doc = {"version": VERSION, "claims": claims, "checksum": _checksum(claims)}
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(doc, f, indent=1, sort_keys=True)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            raise
        # The rename itself must survive a crash too.
        dir_fd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
