"""Drive a running backend from outside: JSON lines over a unix socket.

One request per line, one response line each:

    {"op": "heat", "device": "gpu-0", "value": 95.0}
    -> {"ok": true, "state": {...the device's fields...}}
    {"op": "list"}            -> {"ok": true, "devices": [{...}, ...]}
    {"op": "flap", "device": "gpu-0", "period_s": 0.5, "cycles": 3}
    -> {"ok": true, "state": {...}, "steps": 6, "duration_s": 1.25}   (runs in the background)
    anything wrong            -> {"ok": false, "error": "..."}

A bad request is answered, never fatal: the server is the test's hardware and
must outlive a typo.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fake_devices.backend import OPS, DeviceBackend
from fake_devices.scripts import MAX_FLAP_CYCLES, MAX_PERIOD_S, flap, run_script
from harness.instruments.userinput import UserInputError, check_number

CONTROL_OPS = (*OPS, "state", "list", "flap")
MAX_LINE = 64 * 1024  # a request is a few dozen bytes; anything huge is not one
JOIN_TIMEOUT_S = 5.0
# sun_path is 108 bytes on Linux, including the terminating NUL.
MAX_SOCKET_PATH = 107


class ControlServer:
    def __init__(self, backend: DeviceBackend | None, socket_path: Path | str,
                 handlers: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] | None = None) -> None:
        """`handlers` answers ops beyond the devices' (a live session's taints and pods), by op name."""
        self.backend = backend
        self.handlers = dict(handlers or {})
        self.socket_path = Path(socket_path)
        self._stop = threading.Event()  # also ends running flap scripts
        self._sock: socket.socket | None = None
        self._threads: list[threading.Thread] = []
        self._conns: set[socket.socket] = set()
        self._accepter: threading.Thread | None = None
        self._lock = threading.Lock()

    def start(self) -> ControlServer:
        path = str(self.socket_path)
        if len(os.fsencode(path)) > MAX_SOCKET_PATH:
            raise ValueError(f"control socket path too long for a unix socket ({len(path)} > "
                             f"{MAX_SOCKET_PATH} bytes): {path}")
        self._clear_stale()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(path)
            sock.listen(16)
        except OSError:
            sock.close()
            raise
        self._sock = sock
        self._accepter = self._spawn(self._accept_loop, "fakelet-control-accept")
        return self

    def stop(self) -> None:
        """Stop accepting, end connections and flap scripts, join every thread, remove the socket."""
        self._stop.set()
        if self._sock is not None:
            # shutdown() wakes the blocked accept(); close() alone does not on Linux.
            try:
                self._sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self._sock.close()
        if self._accepter is not None:
            # Joined first: once it is gone no new connection can slip past the shutdowns below.
            self._accepter.join(JOIN_TIMEOUT_S)
        with self._lock:
            conns, threads = list(self._conns), list(self._threads)
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for t in threads:
            if t is not threading.current_thread():
                t.join(JOIN_TIMEOUT_S)
        if self._sock is not None:
            self._sock = None
            try:
                self.socket_path.unlink()
            except FileNotFoundError:
                pass

    def __enter__(self) -> ControlServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- serving -------------------------------------------------------------

    def _clear_stale(self) -> None:
        """A socket file left by a dead server is removed; a live one is an error."""
        if not os.path.lexists(self.socket_path):
            return
        if not stat.S_ISSOCK(os.lstat(self.socket_path).st_mode):
            raise FileExistsError(f"{self.socket_path} exists and is not a socket")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(str(self.socket_path))
        except OSError:
            self.socket_path.unlink()
            return
        finally:
            probe.close()
        raise FileExistsError(f"{self.socket_path}: another control server is already listening")

    def _spawn(self, target: Any, name: str, *args: Any) -> threading.Thread:
        t = threading.Thread(target=target, args=args, name=name, daemon=True)
        with self._lock:
            self._threads = [x for x in self._threads if x.is_alive()]
            self._threads.append(t)
        t.start()
        return t

    def _accept_loop(self) -> None:
        assert self._sock is not None
        sock = self._sock
        while not self._stop.is_set():
            try:
                conn, _ = sock.accept()
            except OSError:
                return  # the listening socket was shut down
            if self._stop.is_set():
                conn.close()
                return
            with self._lock:
                self._conns.add(conn)
            self._spawn(self._serve, "fakelet-control-conn", conn)

    def _serve(self, conn: socket.socket) -> None:
        try:
            with conn, conn.makefile("rb") as reader:
                while not self._stop.is_set():
                    line = reader.readline(MAX_LINE + 1)
                    if not line:
                        return
                    if len(line) > MAX_LINE and not line.endswith(b"\n"):
                        conn.sendall(_encode({"ok": False, "error": f"request longer than {MAX_LINE} bytes"}))
                        return
                    if not line.strip():
                        continue
                    conn.sendall(_encode(self.handle_line(line)))
        except OSError:
            pass  # the client went away, or stop() shut the connection
        finally:
            with self._lock:
                self._conns.discard(conn)

    def handle_line(self, line: bytes) -> dict[str, Any]:
        try:
            request = json.loads(line)
        except (ValueError, UnicodeDecodeError) as e:
            return {"ok": False, "error": f"not a JSON request: {e}"}
        if not isinstance(request, dict):
            return {"ok": False, "error": "a request must be a JSON object with an 'op'"}
        try:
            return self.handle(request)
        except KeyError as e:
            return {"ok": False, "error": str(e.args[0]) if e.args else "unknown key"}
        except (ValueError, TypeError) as e:
            return {"ok": False, "error": str(e)}
        except Exception as e:  # an unexpected bug answers too: the server stays up
            return {"ok": False, "error": f"internal error: {type(e).__name__}: {e}"}

    def handle(self, request: dict[str, Any]) -> dict[str, Any]:
        op = request.get("op")
        if isinstance(op, str) and op in self.handlers:
            return self.handlers[op](request)
        if op not in CONTROL_OPS or self.backend is None:
            known = [*(CONTROL_OPS if self.backend is not None else ()), *self.handlers]
            return {"ok": False, "error": f"unknown op {op!r}; known: {', '.join(known)}"}
        if op == "list":
            return {"ok": True, "devices": [d.to_dict() for d in self.backend.devices()]}
        device = request.get("device")
        if not isinstance(device, str) or not device:
            return {"ok": False, "error": f"{op} needs a 'device' (one of: {', '.join(self.backend.ids())})"}
        if op == "state":
            return {"ok": True, "state": self.backend.state(device)}
        if op == "flap":
            return self._flap(device, request)
        value = request.get("value")
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            return {"ok": False, "error": f"'value' must be a number, got {value!r}"}
        return {"ok": True, "state": self.backend.apply(op, device, value)}

    def _flap(self, device: str, request: dict[str, Any]) -> dict[str, Any]:
        period, cycles = request.get("period_s", 1.0), request.get("cycles", 3)
        try:
            check_number("'period_s'", period, 0, MAX_PERIOD_S, low_open=True)
            check_number("'cycles'", cycles, 1, MAX_FLAP_CYCLES, integer=True)
        except UserInputError as err:
            return {"ok": False, "error": str(err)}
        state = self.backend.state(device)  # unknown device: answered now, not lost in a thread
        steps = flap(device, float(period), cycles)
        self._spawn(run_script, "fakelet-control-flap", self.backend, steps, self._stop)
        return {"ok": True, "state": state, "steps": len(steps), "duration_s": steps[-1].at_s}


class ControlClient:
    def __init__(self, socket_path: Path | str, timeout_s: float = 5.0) -> None:
        self.socket_path = Path(socket_path)
        self.timeout_s = timeout_s

    def call(self, op: str, device: str | None = None, **kw: Any) -> dict[str, Any]:
        """One request, one response. Connection problems raise OSError; refusals come back as ok=false."""
        request: dict[str, Any] = {"op": op, **kw}
        if device is not None:
            request["device"] = device
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(self.timeout_s)
            sock.connect(str(self.socket_path))
            sock.sendall(_encode(request))
            with sock.makefile("rb") as reader:
                line = reader.readline(MAX_LINE + 1)
        if not line:
            raise ConnectionError(f"{self.socket_path}: the control server closed the connection without answering")
        response = json.loads(line)
        if not isinstance(response, dict):
            raise ConnectionError(f"{self.socket_path}: not a control server response: {line[:200]!r}")
        return response


def _encode(message: dict[str, Any]) -> bytes:
    return (json.dumps(message, default=str) + "\n").encode()
