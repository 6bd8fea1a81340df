"""The run's shared local API server, started beside its check run instead of before it.

etcd and kube-apiserver take seconds to reach /readyz, and the check run's xdist workers take seconds to start
and import the checks: one after the other, both sat in front of every check. Here the CLI starts the check run
at once and publishes the plane when it is up: FAKELET_SHARED_CONTROL_PLANE names a file (`pending:PATH`) that
appears, by an atomic rename, holding the plane's spec (`kubeconfig:...` or `unavailable:<why>`) and its
description for the reports' provenance. A check that needs the API server waits for that file (inotify, under a
bound); one that fails to start is published as unavailable, with its reason, as before.

local.py's servers die with the thread that started them (PR_SET_PDEATHSIG), so one thread starts the plane,
keeps it and stops it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from harness.config.runconfig import SHARED_CONTROL_PLANE_ENV, UNAVAILABLE
from harness.launch.owners import PREFIX as OWNED_PREFIX
from harness.launch.owners import owned_dir, remove_owned
from harness.run import provenance

PENDING = "pending:"  # FAKELET_SHARED_CONTROL_PLANE = pending:<file the plane's spec will appear in>
PUBLISHED_FILE = "control-plane.json"
# A waiting check's bound: the API server's and the controller manager's start deadlines
# (harness/controlplane/local.py START_TIMEOUT_S, one each), and slack for the start's own steps.
WAIT_SLACK_S = 30.0


class BackgroundPlane:
    """A local control plane started, kept and stopped by a thread of its own."""

    def __init__(self, scheduler: bool) -> None:
        self.scheduler = scheduler
        self.directory = owned_dir(f"{OWNED_PREFIX}plane-")  # reaped if the CLI is killed
        self.published = self.directory / PUBLISHED_FILE
        self._plane: Any = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._own, name="shared-control-plane", daemon=True)

    @property
    def spec(self) -> str:
        return PENDING + str(self.published)

    def start(self) -> BackgroundPlane:
        from harness.controlplane import ControlPlaneUnavailable
        from harness.controlplane.local import (
            KUBE_CONTROLLER_MANAGER_PACKAGE,
            find_etcd,
            find_kube_apiserver,
            find_kube_binary,
        )

        # A first run builds the binaries (minutes, its progress on the terminal): here, before any check waits.
        with contextlib.suppress(ControlPlaneUnavailable):
            find_etcd()
            find_kube_apiserver()
            find_kube_binary("kube-controller-manager", KUBE_CONTROLLER_MANAGER_PACKAGE)
        self._thread.start()
        return self

    def _own(self) -> None:
        from harness.controlplane import ControlPlaneUnavailable, open_control_plane

        plane = None
        try:
            self._plane = open_control_plane("local", scheduler=self.scheduler)
            if not self._done.is_set():
                plane = self._plane.start()
        except ControlPlaneUnavailable as err:
            if not self._done.is_set():
                print(f"fakelet: no local API server ({err}); DRA checks that need one will skip", file=sys.stderr)
            publish(self.published, UNAVAILABLE + str(err), {})
        except Exception as err:  # the checks must hear of it, not wait out their bound
            publish(self.published, f"{UNAVAILABLE}the local API server failed to start: {err}", {})
        else:
            if plane is not None:
                publish(self.published, f"kubeconfig:{plane.kubeconfig}", describe(plane))
        self._done.wait()
        if plane is not None:
            plane.stop()

    def stop(self) -> None:
        """Stop the plane, or cut its start short: its servers are told to exit, and the start then fails."""
        self._done.set()
        if self._plane is not None and not self.published.exists():
            for pid in self._plane.pids():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
        if self._thread.is_alive():
            self._thread.join()
        remove_owned(self.directory)


def describe(plane: Any) -> dict[str, Any]:
    try:
        return dict(plane.describe())
    except Exception:  # a description is a nicety (provenance.announce_plane)
        return {}


def publish(path: Path, spec: str, described: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps({"spec": spec, "described": described}))
    os.rename(tmp, path)  # whole or not at all, and one inotify event for the waiters


def adopt(path: Path) -> str | None:
    """The published spec, its description put where provenance reads it; None while not published."""
    try:
        published = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    if published.get("described"):
        os.environ[provenance.PLANE_ENV] = json.dumps(published["described"])
    return str(published["spec"])


def await_plane(spec: str, timeout_s: float) -> str:
    """A `pending:PATH` spec resolved: what the CLI published, or unavailable once `timeout_s` has passed."""
    from inotify_simple import INotify
    from inotify_simple import flags as IN

    path = Path(spec.removeprefix(PENDING))
    deadline = time.monotonic() + timeout_s
    with INotify() as watch:
        try:
            watch.add_watch(str(path.parent), IN.MOVED_TO)
        except OSError:  # its directory gone: the run that made it is over
            return adopt(path) or f"{UNAVAILABLE}the run's shared local API server is gone ({path.parent})"
        while (found := adopt(path)) is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return f"{UNAVAILABLE}the run's shared local API server was not up within {timeout_s:g}s"
            watch.read(timeout=int(remaining * 1000) + 1)
        return found


def resolved_spec() -> str | None:
    """The shared plane's spec in this process's environment, resolved if already published (never waits)."""
    spec = os.environ.get(SHARED_CONTROL_PLANE_ENV)
    if spec is not None and spec.startswith(PENDING):
        return adopt(Path(spec.removeprefix(PENDING))) or spec
    return spec
