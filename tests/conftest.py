"""Fixtures shared by the harness's own tests."""

from __future__ import annotations

import functools
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

# CI (.ci/run sets CI=true, and tox.ini passes it on) draws the same examples on every run, so that a red
# build is the code's doing and replays from the log (print_blob); a developer's run keeps exploring new ones.
# No deadline and no too_slow health check: on a loaded machine one example, or drawing it, can take seconds
# without being slow code. Registered here rather than left to hypothesis's own CI detection, so that it does
# not depend on the hypothesis release; loaded before any test module is imported, so that each test's own
# @settings(...) inherits it.
settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True, database=None,
                          suppress_health_check=[HealthCheck.too_slow])
if os.environ.get("CI"):
    settings.load_profile("ci")


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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The kill matrix in the default run: what changed plus a fixed sample (tests/matrix_sample.py)."""
    import matrix_sample

    if matrix_sample.full():
        return
    keep, drop = [], []
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        behaviour = params.get("defect") or params.get("behaviour")
        if getattr(item.module, "__name__", "") != "test_kill_matrix" or behaviour is None:
            keep.append(item)  # every other test, and each reference subject's clean run
            continue
        subject = params["subject"]
        case = item.module.SPECS[subject].defects[behaviour]
        if matrix_sample.in_sample(subject, behaviour) or \
                matrix_sample.touched(behaviour, [*case.kills, *(case.checks or [])], _check_modules()):
            keep.append(item)
        else:
            drop.append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


@functools.cache
def _check_modules() -> dict[str, str]:
    """Check ID -> the suites module that defines it (importing every suite fills the catalog's map)."""
    from harness.spec.checks import CHECK_MODULES, SUITES, catalog

    for package in SUITES.values():
        catalog(package)
    return CHECK_MODULES
