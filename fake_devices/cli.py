"""`fakelet devices`: poke the fake hardware of a running session.

    fakelet devices [--socket PATH] fail|recover|unplug|plug|state DEV
    fakelet devices [--socket PATH] heat|cool DEV DEGREES_C
    fakelet devices [--socket PATH] ecc DEV [COUNT]
    fakelet devices [--socket PATH] xid DEV N          (the nvml skin: an NVIDIA XID error event)
    fakelet devices [--socket PATH] flap DEV [--period S] [--cycles N]
    fakelet devices [--socket PATH] list

The session's control socket comes from --socket, else $FAKELET_CONTROL_SOCKET.
Ranges (checked here, and again by the session): DEGREES_C -273.15..1000, COUNT
1..1000000, N (xid) 1..1000, --period up to 3600 s, --cycles up to 10000.
Exit code: 0 done, 2 on bad input, an unreachable session, or a refusal.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, NoReturn

from fake_devices.backend import MAX_ECC_BURST, MAX_XID, TEMPERATURE_RANGE_C
from fake_devices.control import CONTROL_OPS, ControlClient
from fake_devices.scripts import MAX_FLAP_CYCLES, MAX_PERIOD_S
from harness.instruments.userinput import UserInputError, check_number, oneline, quote

EXIT_OK, EXIT_USAGE = 0, 2
SOCKET_ENV = "FAKELET_CONTROL_SOCKET"
NEEDS_VALUE = ("heat", "cool")


class UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    # argparse exits the process on bad input; main() returns an exit code instead.
    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="fakelet devices", description="Change the fake hardware of a running fakelet session.")
    parser.add_argument("--socket", help=f"the session's control socket (default: ${SOCKET_ENV})")
    parser.add_argument("op", choices=CONTROL_OPS, help="what to do")
    parser.add_argument("device", nargs="?", help="device id, e.g. gpu-0 (all ops but list)")
    parser.add_argument("value", nargs="?",
                        help="degrees C for heat/cool; error count for ecc (default 1); the XID for xid")
    parser.add_argument("--period", type=float, default=1.0, metavar="S", help="flap: seconds per cycle (default 1)")
    parser.add_argument("--cycles", type=int, default=3, metavar="N", help="flap: fail/recover cycles (default 3)")
    parser.add_argument("--json", action="store_true", help="print the raw JSON response")
    return parser


def request_for(args: argparse.Namespace) -> dict[str, Any]:
    """The control request for parsed arguments, or UsageError saying what is missing or wrong."""
    op = args.op
    if op == "list":
        if args.device is not None:
            raise UsageError("list takes no device")
        return {"op": op}
    if not args.device:
        raise UsageError(f"{op} needs a device id")
    request: dict[str, Any] = {"op": op, "device": args.device}
    if op in NEEDS_VALUE:
        if args.value is None:
            raise UsageError(f"{op} needs a temperature in degrees C, e.g. {op} {args.device} 95")
        request["value"] = _number(args.value, f"{op} temperature", *TEMPERATURE_RANGE_C)
    elif op == "xid":
        if args.value is None:
            raise UsageError(f"xid needs an XID number, e.g. xid {args.device} 79")
        request["value"] = _whole(args.value, "xid", 1, MAX_XID)
    elif op == "ecc":
        if args.value is not None:
            request["value"] = _whole(args.value, "ecc count", 1, MAX_ECC_BURST)
    elif args.value is not None:
        raise UsageError(f"{op} takes no value (got {quote(args.value)})")
    if op == "flap":
        request.update(period_s=_checked("--period", args.period, 0, MAX_PERIOD_S, low_open=True),
                       cycles=_checked("--cycles", args.cycles, 1, MAX_FLAP_CYCLES, integer=True))
    return request


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        request = request_for(args)
    except UsageError as e:
        print(f"{parser.prog}: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except SystemExit as e:  # --help
        return int(e.code or 0) if isinstance(e.code, int | None) else EXIT_USAGE
    op = request["op"]
    response = session_call(parser.prog, args.socket, request, as_json=args.json)
    if response is None:
        return EXIT_USAGE
    if not args.json:
        for line in render(op, response):
            print(line)
    return EXIT_OK


def session_call(prog: str, socket_arg: str | None, request: dict[str, Any], timeout_s: float = 5.0,
                 as_json: bool = False) -> dict[str, Any] | None:
    """One request to a live session's control socket; None (the error printed) when it failed or refused."""
    socket_path = socket_arg or os.environ.get(SOCKET_ENV)
    if not socket_path:
        print(f"{prog}: error: no session: pass --socket or set {SOCKET_ENV}", file=sys.stderr)
        return None
    fields = dict(request)
    op = fields.pop("op")
    try:
        response = ControlClient(socket_path, timeout_s).call(op, **fields)
    except (OSError, ValueError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e) or type(e).__name__
        print(f"{prog}: error: cannot reach the session at {oneline(socket_path)}: {reason} "
              "(is the session still running?)", file=sys.stderr)
        return None
    if as_json:
        print(json.dumps(response, indent=1, sort_keys=True))
    if not response.get("ok"):
        print(f"{prog}: error: {response.get('error', 'refused')}", file=sys.stderr)
        return None
    return response


def render(op: str, response: dict[str, Any]) -> list[str]:
    if op == "list":
        return [summary(d) for d in response.get("devices", [])] or ["no devices"]
    lines = [summary(response.get("state", {}))]
    if op == "flap":
        lines.append(f"flapping: {response.get('steps')} steps over {response.get('duration_s', 0):g}s")
    return lines


def summary(state: dict[str, Any]) -> str:
    present = "present" if state.get("present") else "unplugged"
    return (f"{state.get('id')}: {state.get('health')}, {state.get('temperature_c')} C, {present}, "
            f"ecc_errors={state.get('ecc_errors')}, numa={state.get('numa')}, node={state.get('node')}")


def _checked(what: str, value: float, low: float, high: float, **kw: bool) -> float:
    try:
        return check_number(what, value, low, high, **kw)
    except UserInputError as err:
        raise UsageError(str(err)) from None


def _number(text: str, what: str, low: float, high: float) -> float:
    try:
        value = float(text)
    except ValueError:
        raise UsageError(f"{what} must be a number, got {quote(text)}") from None
    return _checked(what, value, low, high)


def _whole(text: str, what: str, low: int, high: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise UsageError(f"{what} must be a whole number from {low} to {high}, got {quote(text)}") from None
    return int(_checked(what, value, low, high, integer=True))


if __name__ == "__main__":
    raise SystemExit(main())
