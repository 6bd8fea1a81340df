"""The run's shared API server started beside its check run (harness/run/sharedplane.py)."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from harness.config.runconfig import UNAVAILABLE
from harness.controlplane import ControlPlaneUnavailable
from harness.run import provenance, sharedplane


class FakePlane:
    def __init__(self, kubeconfig: Path) -> None:
        self.kubeconfig = kubeconfig
        self.stopped_on: str | None = None

    def start(self) -> FakePlane:
        return self

    def describe(self) -> dict[str, str]:
        return {"backend": "local", "version": "v1.36.3"}

    def pids(self) -> list[int]:
        return []

    def stop(self) -> None:
        self.stopped_on = threading.current_thread().name


@pytest.fixture
def no_binaries(monkeypatch: pytest.MonkeyPatch) -> None:
    from harness.controlplane import local

    for name in ("find_etcd", "find_kube_apiserver", "find_kube_binary"):
        monkeypatch.setattr(local, name, lambda *a, **k: (Path("/bin/true"), None))


def test_a_published_plane_is_found_with_its_description(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(provenance.PLANE_ENV, raising=False)
    path = tmp_path / sharedplane.PUBLISHED_FILE
    sharedplane.publish(path, "kubeconfig:/x/kubeconfig", {"version": "v1.36.3"})
    assert sharedplane.await_plane(sharedplane.PENDING + str(path), 1.0) == "kubeconfig:/x/kubeconfig"
    assert json.loads(os.environ[provenance.PLANE_ENV]) == {"version": "v1.36.3"}


def test_a_waiting_check_wakes_when_the_plane_is_published(tmp_path: Path) -> None:
    path = tmp_path / sharedplane.PUBLISHED_FILE
    found: list[str] = []
    waiter = threading.Thread(target=lambda: found.append(sharedplane.await_plane(sharedplane.PENDING + str(path),
                                                                                  30.0)))
    waiter.start()
    sharedplane.publish(path, f"{UNAVAILABLE}etcd not found", {})
    waiter.join(30.0)
    assert found == [f"{UNAVAILABLE}etcd not found"]


def test_a_plane_never_published_is_unavailable_after_the_bound(tmp_path: Path) -> None:
    spec = sharedplane.await_plane(sharedplane.PENDING + str(tmp_path / sharedplane.PUBLISHED_FILE), 0.05)
    assert spec.startswith(UNAVAILABLE) and "not up within 0.05s" in spec


def test_a_plane_that_cannot_start_is_published_as_unavailable_with_its_reason(
        monkeypatch: pytest.MonkeyPatch, no_binaries: None, capsys: pytest.CaptureFixture[str]) -> None:
    import harness.controlplane

    def unavailable(*args: Any, **kwargs: Any) -> None:
        raise ControlPlaneUnavailable("etcd not found on PATH")

    monkeypatch.setattr(harness.controlplane, "open_control_plane", unavailable)
    plane = sharedplane.BackgroundPlane(scheduler=False).start()
    try:
        assert sharedplane.await_plane(plane.spec, 30.0) == f"{UNAVAILABLE}etcd not found on PATH"
    finally:
        plane.stop()
    assert not plane.directory.exists()
    assert "no local API server (etcd not found on PATH)" in capsys.readouterr().err


def test_the_plane_is_started_and_stopped_by_its_own_thread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            no_binaries: None) -> None:
    import harness.controlplane

    fake = FakePlane(tmp_path / "kubeconfig")
    monkeypatch.setattr(harness.controlplane, "open_control_plane", lambda *a, **k: fake)
    monkeypatch.delenv(provenance.PLANE_ENV, raising=False)
    plane = sharedplane.BackgroundPlane(scheduler=False).start()
    try:
        assert sharedplane.await_plane(plane.spec, 30.0) == f"kubeconfig:{fake.kubeconfig}"
        assert fake.stopped_on is None
    finally:
        plane.stop()
    # local.py's servers die with the thread that started them (PR_SET_PDEATHSIG): that thread stops them.
    assert fake.stopped_on == "shared-control-plane"
    assert not plane.directory.exists()
