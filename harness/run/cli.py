"""The `fakelet` command's entry point: stop signals are taken before anything heavy is imported.

Importing the commands (grpc, pytest, lightkube, the Docker client) takes seconds on a
loaded machine. A SIGTERM in that window killed fakelet by the signal (exit -15, no word
of it), and a Ctrl-C printed an import traceback. Nothing has started yet then, so there
is nothing to stop or report: it is an interrupted run (exit 130) with one line.
The commands themselves are in commands.py.
"""

from __future__ import annotations

import signal
import sys
from types import FrameType

EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a Ctrl-C


def _stop(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _stop)  # commands.main installs its own once it runs
    try:
        from harness.run import commands

        return commands.main(argv)
    except KeyboardInterrupt:  # commands.main handles one that comes once it is inside its own try
        print("fakelet: interrupted before anything started", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
