"""Run a pytest selection beside CPU hogs, as on a shared CI runner, and say what load it ran at.

    python tools/stress.py [--hogs N] [--max-s S] -- tests/test_kill_matrix.py -k huge-list

Each hog is a process that spins until `--max-s` has passed, whatever happens to this tool
(it dies with it, by PR_SET_PDEATHSIG, and at its own deadline); the hogs are killed as soon as
pytest ends. CI=true is set, as .ci/run has it, so hypothesis runs derandomized. The exit code
is pytest's; a usage error exits 2.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import NoReturn

PR_SET_PDEATHSIG = 1  # linux/prctl.h
SAMPLE_S = 5.0  # how often the load average is read while pytest runs
HOG = "import time\ndeadline = time.monotonic() + {max_s}\nwhile time.monotonic() < deadline:\n    pass\n"


class OneLineParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message}\n")  # one line: no usage block above it


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = OneLineParser(prog="stress", description=__doc__.splitlines()[0])
    parser.add_argument("--hogs", type=int, default=2 * (os.cpu_count() or 1),
                        help="CPU hogs beside pytest (default: two per core)")
    parser.add_argument("--max-s", type=float, default=3600.0, help="a hog's longest life, in seconds")
    parser.add_argument("pytest_args", nargs="*", help="after --: what pytest runs")
    args = parser.parse_args(argv)
    if args.hogs < 0:
        parser.error(f"--hogs {args.hogs}: must be 0 or more")
    if args.max_s <= 0:
        parser.error(f"--max-s {args.max_s:g}: must be positive")
    if not args.pytest_args:
        parser.error("nothing to run: give a pytest selection after --")
    return args


def _die_with_parent() -> None:
    """In the child: SIGKILL when this tool dies, however it dies."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


@contextlib.contextmanager
def hogs(count: int, max_s: float) -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    try:
        for _ in range(count):
            started.append(subprocess.Popen([sys.executable, "-c", HOG.format(max_s=max_s)],
                                            preexec_fn=_die_with_parent, stdin=subprocess.DEVNULL))
        yield started
    finally:
        for hog in started:
            hog.kill()
        for hog in started:
            hog.wait()


class LoadSampler:
    """The 1-minute load average, read every SAMPLE_S until stopped."""

    def __init__(self) -> None:
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="load-sampler", daemon=True)

    def _run(self) -> None:
        while True:
            self.samples.append(os.getloadavg()[0])
            if self._stop.wait(SAMPLE_S):
                return

    def __enter__(self) -> LoadSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.samples.append(os.getloadavg()[0])

    def describe(self) -> str:
        s = self.samples
        return f"load average (1 min) min {min(s):.1f}, mean {sum(s) / len(s):.1f}, max {max(s):.1f} ({len(s)} samples)"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    env = {**os.environ, "CI": os.environ.get("CI", "true")}
    began = time.monotonic()
    with hogs(args.hogs, args.max_s), LoadSampler() as load:
        code = subprocess.call([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args.pytest_args],
                               env=env)
    print(f"stress: pytest exited {code} after {time.monotonic() - began:.0f}s beside {args.hogs} CPU hog(s) "
          f"on {os.cpu_count()} core(s); {load.describe()}", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
