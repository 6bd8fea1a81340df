"""`fakelet up`: one live session for an engineer, driven by hand.

The fake kubelet, the subject and the fake device backend run until Ctrl-C
(or --for SECONDS); the backend's control socket takes `fakelet devices ...`
from another terminal, and every event is printed as it happens.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TextIO

from fake_devices.control import ControlServer
from harness.config.runconfig import RunConfig
from harness.controlplane import ControlPlane, ControlPlaneUnavailable, open_control_plane
from harness.instruments.timeline import Event, describe
from harness.run.sessionops import ClusterOps, unavailable
from harness.world.draenv import DRAEnv
from harness.world.env import DPEnv

SHOWN = ("kubelet.", "device.", "fault.", "process.", "pod.running", "pod.killing", "pod.deleted", "dra.prepare",
         "dra.unprepare", "node.registered")  # event kinds worth a line on the console
DRA_SHOWN = ("dra.registered", "dra.rejected", "dra.deregistered", "dra.health_stream", "dra.health_unknown")


def show(event: Event, origin_ns: int) -> str | None:
    if event.kind == "dra.health":
        return f"+{(event.t_ns - origin_ns) / 1e9:.3f}s NodeWatchResources " + ", ".join(
            f"{d.get('device')}={d.get('health')}" for d in event.get("devices") or [])
    if event.kind == "api.slices":
        taints = event.get("taints") or {}
        return f"+{(event.t_ns - origin_ns) / 1e9:.3f}s ResourceSlices: " + ", ".join(
            d + (f" [{' '.join(taints[d])}]" if d in taints else "") for d in event.get("devices"))
    listed = event.kind == "grpc.stream_msg" and event.source == "kubelet"
    if event.kind.startswith(SHOWN) or event.kind in DRA_SHOWN or listed:
        if event.kind == "grpc.stream_msg":
            devices = event.get("message", {}).get("devices", [])
            return f"+{(event.t_ns - origin_ns) / 1e9:.3f}s ListAndWatch " + ", ".join(
                f"{d.get('ID')}={d.get('health')}" for d in devices)
        return describe(event, origin_ns)
    return None


class Session:
    def __init__(self, run: RunConfig, out: TextIO) -> None:
        self.run, self.out = run, out
        self.stop = threading.Event()
        self.env: DPEnv | None = None
        self.control: ControlServer | None = None
        self.plane: ControlPlane | None = None

    def _make_env(self) -> DPEnv:
        env = self._new_env()
        env.artifacts_root = self.run.out  # a session's timeline and logs go straight into --out
        return env

    def _new_env(self) -> DPEnv:
        run = self.run
        if not run.spec.is_dra:
            return DPEnv(run.spec, run.profile, run.defect, run.seed, run.resolve_binary(), artifacts=run.out)
        why = ""
        try:
            self.plane = open_control_plane(run.control_plane).start()
        except ControlPlaneUnavailable as err:
            why = str(err)
            print(f"no API server ({why}): the driver runs without one", file=self.out, flush=True)
        return DRAEnv(run.spec, run.profile, run.defect, run.seed, run.resolve_binary(), artifacts=run.out,
                      kubelet_version=run.kubelet_version, control_plane=self.plane, control_plane_error=why)

    def start(self) -> Session:
        try:
            self.env = self._make_env()
        except BaseException:
            self.close()
            raise
        try:
            handlers = ClusterOps(self.env).handlers() if isinstance(self.env, DRAEnv) and self.env.client else {}
            if self.env.devices is not None or handlers:
                self.control = ControlServer(self.env.devices, self.env.sandbox.path / "control.sock",
                                             handlers or unavailable(self.env)).start()
            threading.Thread(target=self._follow, daemon=True, name="follow").start()
            self.env.start()
        except BaseException:
            self.close()
            raise
        return self

    @property
    def control_socket(self) -> Path | None:
        return self.control.socket_path if self.control is not None else None

    def _follow(self) -> None:
        assert self.env is not None
        tl, seen = self.env.timeline, 0
        while not self.stop.is_set():
            events = tl.after(seen, 0.5)
            seen += len(events)
            for e in events:
                line = show(e, tl.origin_ns)
                if line:
                    print(line, file=self.out, flush=True)

    def wait(self, seconds: float | None) -> None:
        """Run until stopped (Ctrl-C arrives as KeyboardInterrupt) or for `seconds`."""
        self.stop.wait(seconds)

    def close(self) -> None:
        self.stop.set()
        if self.control is not None:
            self.control.stop()
        if self.env is not None:
            self.env.close()
        if self.plane is not None:
            self.plane.stop()
            self.plane = None
