"""`fakelet taint` and `fakelet pods`: a live session's cluster controls, from another terminal.

    fakelet taint add DEVICE [--effect NoExecute|NoSchedule|None] [--key KEY]
    fakelet taint remove DEVICE
    fakelet pods create [--count N] [--toleration-seconds N]
    fakelet pods list

Like `fakelet devices`, they talk to the session `fakelet up` started, through
$FAKELET_CONTROL_SOCKET (or --socket).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, NoReturn

from fake_devices.cli import SOCKET_ENV, session_call
from harness.instruments.userinput import UserInputError, check_number
from harness.run.sessionops import MAX_PODS, MAX_TOLERATION_S

EXIT_OK, EXIT_USAGE = 0, 2
CALL_TIMEOUT_S = 120.0  # creating pods waits for each to run (its claims prepared)


class UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def build_parser(command: str) -> argparse.ArgumentParser:
    parser = _Parser(prog=f"fakelet {command}", description=__doc__.splitlines()[0])
    parser.add_argument("--socket", help=f"the session's control socket (default: ${SOCKET_ENV})")
    parser.add_argument("--json", action="store_true", help="print the raw JSON response")
    if command == "taint":
        parser.add_argument("action", choices=("add", "remove"))
        parser.add_argument("device", help="a device the driver publishes, e.g. gpu-0")
        parser.add_argument("--effect", default="NoExecute", choices=("NoExecute", "NoSchedule", "None"))
        parser.add_argument("--key", help="the taint's key (default fakelet.example.com/manual)")
    else:
        parser.add_argument("action", choices=("create", "list"))
        parser.add_argument("--count", type=int, default=1, help="pods to create, one device claim each")
        parser.add_argument("--toleration-seconds", type=int, metavar="N",
                            help="the pods tolerate a NoExecute taint for N seconds")
    return parser


def request_for(command: str, args: argparse.Namespace) -> dict[str, Any]:
    if command == "taint":
        request: dict[str, Any] = {"op": f"taint_{args.action}", "device": args.device}
        if args.action == "add":
            request["effect"] = args.effect
            if args.key:
                request["key"] = args.key
        return request
    if args.action == "list":
        return {"op": "pods_list"}
    try:
        check_number("--count", args.count, 1, MAX_PODS, integer=True)
        if args.toleration_seconds is not None:
            check_number("--toleration-seconds", args.toleration_seconds, 0, MAX_TOLERATION_S, integer=True)
    except UserInputError as err:
        raise UsageError(str(err)) from None
    request = {"op": "pods_create", "count": args.count}
    if args.toleration_seconds is not None:
        request["toleration_seconds"] = args.toleration_seconds
    return request


def render(response: dict[str, Any]) -> list[str]:
    if "rule" in response:
        return [f"DeviceTaintRule {response['rule']} (timeAdded {response.get('timeAdded')})"]
    if "removed" in response:
        return [f"removed {', '.join(response['removed'])}"]
    lines = []
    for p in response.get("pods") or []:
        if "devices" in p:
            lines.append(f"{p['pod']}: running on {', '.join(p['devices'])}")
        else:
            state = "deleting" if p["deleting"] else p["phase"] or "Pending"
            lines.append(f"{p['pod']}: {state}{' on ' + p['node'] if p['node'] else ' (unscheduled)'}"
                         f"{', kubelet: ' + p['kubelet'] if p['kubelet'] else ''}")
    return lines or ["no pods"]


def main(command: str, argv: list[str]) -> int:
    parser = build_parser(command)
    try:
        args = parser.parse_args(argv)
        request = request_for(command, args)
    except UsageError as err:
        print(f"{parser.prog}: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    except SystemExit as e:  # --help
        return int(e.code or 0) if isinstance(e.code, int | None) else EXIT_USAGE
    response = session_call(parser.prog, args.socket, request, CALL_TIMEOUT_S, as_json=args.json)
    if response is None:
        return EXIT_USAGE
    if not args.json:
        for line in render(response):
            print(line)
    return EXIT_OK
