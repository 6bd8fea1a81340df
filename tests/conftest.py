"""Fixtures shared by the harness's own tests."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def tmp() -> Iterator[Path]:
    """A private, short TMPDIR for a fakelet subprocess (unix socket paths must stay under 108 bytes)."""
    d = Path(tempfile.mkdtemp(prefix="fk-", dir="/tmp"))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)
