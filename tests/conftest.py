"""Fixtures shared by the harness's own tests."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture
def tmp() -> Iterator[Path]:
    """A private, short TMPDIR for a fakelet subprocess (unix socket paths must stay under 108 bytes)."""
    d = Path(tempfile.mkdtemp(prefix="fk-", dir="/tmp"))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="session")
def shared_kubeconfig() -> Iterator[Path]:
    """One local kube-apiserver + etcd for this test process; users isolate by node name and namespace.

    A start that fails although every binary is there fails the test: only a
    missing component (named in the reason) makes it skip.
    """
    from harness.controlplane import ControlPlaneUnavailable
    from harness.controlplane.local import ControlPlaneStartError, LocalControlPlane

    plane = LocalControlPlane()
    try:
        plane.start()
    except ControlPlaneStartError:
        raise
    except ControlPlaneUnavailable as err:
        pytest.skip(str(err))
    try:
        yield plane.kubeconfig
    finally:
        plane.stop()


@pytest.fixture(scope="module")
def control_plane() -> Iterator[Any]:
    """A local control plane (etcd, kube-apiserver, kube-controller-manager) of the test module's own."""
    from harness.controlplane import ControlPlaneUnavailable, open_control_plane

    try:
        cp = open_control_plane("local").start()
    except ControlPlaneUnavailable as err:
        pytest.skip(f"no API server: {str(err).splitlines()[0]}")
    try:
        yield cp
    finally:
        cp.stop()
