"""The `fakelet` command's entry point: stop signals are taken before anything heavy is imported.

Importing the commands takes seconds on a loaded machine. A SIGTERM in that window killed
fakelet by the signal (exit -15, no word of it), and a Ctrl-C printed an import traceback;
raising there also broke imports half-way (a KeyboardInterrupt inside a class body surfaces
as a RuntimeError). So a stop during the imports is only noted: once they are done, `fakelet
run` writes the INTERRUPTED report it promises at any moment (nothing ran), `matrix` and
`fidelity` their INTERRUPTED tables, and any other command says it was interrupted before
anything started (exit 130, one line).
The commands themselves are in commands.py.
"""

from __future__ import annotations

import os
import signal
import sys
from types import FrameType

EXIT_OK = 0
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a Ctrl-C


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _stop(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    noted: list[int] = []  # stop signals that came during the imports
    for sig in STOP_SIGNALS:
        signal.signal(sig, lambda signum, frame: noted.append(signum))
    # grpc reads it once, at import: its core's INFO lines (a GOAWAY as a relay closes) stay off the output.
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    try:
        from harness.spec.bundled import clash_message

        clash = clash_message()
        if clash is not None:
            print(f"fakelet: error: {clash}", file=sys.stderr)
            return EXIT_USAGE
        given = sys.argv[1:] if argv is None else argv
        if given == ["--version"]:
            from harness.run.version import version_line

            print(version_line())  # without the commands' imports (grpc and the harness): a CI log's first line
            return EXIT_OK
        from harness.run import commands

        for sig in STOP_SIGNALS:
            signal.signal(sig, _stop)  # commands.main installs its own once it runs
        if noted and given[:1] not in (["run"], ["matrix"], ["fidelity"]):
            raise KeyboardInterrupt  # these alone owe a report or table (of nothing run) for a stop this early
        code = commands.main(argv, stopped=bool(noted))
        # Written here, not at the interpreter's exit: a pipe's reader that left (`fakelet checks | head`)
        # is then a broken pipe this function can tell apart, not an "Exception ignored" and exit 120.
        sys.stdout.flush()
        return code
    except KeyboardInterrupt:  # commands.main handles one that comes once it is inside its own try
        print("fakelet: interrupted before anything started", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # what is still buffered goes nowhere
        return EXIT_OK


def entry() -> None:
    """The `fakelet` command and `python -m harness.run.cli`: main(), then the process's exit.

    Once main() has returned, the run has ended and said so (its report written, its code chosen); what is left
    is the interpreter's teardown, which runs with the default signal handlers: a Ctrl-C or SIGTERM there (a CI
    job's timeout landing late) killed fakelet by the signal, exit -2 after a CONFORMANT report. Blocked from
    then on, a late stop signal changes nothing. Only here, never in main(): a caller in the same process
    (tests, an embedding tool) keeps its own signal mask, which its later children would inherit.
    """
    code = main()
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    sys.exit(code)


if __name__ == "__main__":
    entry()
