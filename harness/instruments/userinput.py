"""Careless input, handled the same way by every front door and every room that reads it.

Three rules, each one function:

- `quote`: user text inside an error message is escaped like repr(), so a carriage return or a
  newline in a key or a path can never split the one-line error in two;
- `read_user_file`: a file the user named is read only if it is a regular file (after following
  symlinks) of bounded size, and is opened so that a FIFO or a device can never block the read;
- `check_number`: a numeric flag is finite and within its documented range, or a one-line error
  names the flag.

This room is the lowest that both fake_devices/ and harness/ import, which is why it lives here.
"""

from __future__ import annotations

import errno
import math
import os
import stat
from pathlib import Path

MAX_USER_FILE_BYTES = 1024 * 1024  # subject, inventory, scenario and targets files are a few dozen lines
MAX_SEED = 2**63 - 1  # a seed is a signed 64-bit integer everywhere it is written down (reports, scenarios)


class UserInputError(ValueError):
    """Bad user input; the message is one line, `where: problem`, naming what was wrong and where."""

    def __init__(self, where: str, problem: str) -> None:
        super().__init__(f"{where}: {problem}" if where else problem)
        self.where, self.problem = where, problem


def quote(value: object) -> str:
    """`value` as one quoted line: control characters escaped, as repr() does for a str."""
    text = value if isinstance(value, str) else str(value)
    return repr(text)


def oneline(value: object) -> str:
    """`value` as it is when it prints on one line (a plain path), else quoted like `quote`."""
    text = value if isinstance(value, str) else str(value)
    return text if text.isprintable() else repr(text)


def escape_controls(text: str) -> str:
    """`text` with every character that would not print on one line escaped as repr() escapes it."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _where(path: Path | str, what: str) -> str:
    return f"{what} {oneline(path)}" if what else oneline(path)


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "a special file"


def _missing(path: Path) -> str:
    """Why `path` cannot be stat()ed: a dangling symlink says where it points."""
    try:
        target = os.readlink(path)
    except OSError:
        return "No such file or directory"
    return f"a dangling symlink (to {quote(target)})"


def check_user_file(path: Path | str, what: str) -> Path:
    """`path` names a regular file (symlinks followed); else a UserInputError '`what` PATH: why'."""
    path = Path(path)
    where = _where(path, what)
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise UserInputError(where, f"cannot read: {_missing(path)}") from None
    except OSError as err:
        raise UserInputError(where, f"cannot read: {err.strerror or err}") from None
    if not stat.S_ISREG(mode):
        raise UserInputError(where, f"cannot read: {_kind(mode)}, not a regular file")
    return path


def read_user_file(path: Path | str, what: str = "", max_bytes: int = MAX_USER_FILE_BYTES, about: str = "") -> bytes:
    """The bytes of a user-named regular file of at most `max_bytes`; a one-line UserInputError otherwise.

    O_NONBLOCK makes the open itself return at once on a FIFO (no writer needed), and fstat on
    the open descriptor then refuses it: a file swapped for a FIFO after the stat cannot block.
    """
    path = check_user_file(path, what)
    where = _where(path, what)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as err:
        reason = _missing(path) if err.errno == errno.ENOENT else err.strerror or str(err)
        raise UserInputError(where, f"cannot read: {reason}") from None
    with os.fdopen(fd, "rb") as f:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise UserInputError(where, f"cannot read: {_kind(mode)}, not a regular file")
        try:
            raw = f.read(max_bytes + 1)
        except OSError as err:
            raise UserInputError(where, f"cannot read: {err.strerror or err}") from None
    if len(raw) > max_bytes:
        raise UserInputError(where, f"larger than {_size(max_bytes)}; {about or 'refused unread'}")
    return raw


def read_user_text(path: Path | str, what: str = "", max_bytes: int = MAX_USER_FILE_BYTES, about: str = "") -> str:
    """`read_user_file`, decoded as UTF-8."""
    raw = read_user_file(path, what, max_bytes, about)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise UserInputError(_where(path, what), f"not UTF-8 text (byte {err.start})") from None


def _size(n: int) -> str:
    return f"{n // (1024 * 1024)} MiB" if n % (1024 * 1024) == 0 else f"{n} bytes"


def check_number(flag: str, value: float | int, low: float, high: float, *, integer: bool = False,
                 low_open: bool = False) -> float | int:
    """`value` if finite and within [low, high] ((low, high] with `low_open`); else one line naming `flag`."""
    wanted = f"{flag} must be {_range(low, high, integer, low_open)}"
    if isinstance(value, bool) or not isinstance(value, int | float) or (integer and not isinstance(value, int)):
        raise UserInputError("", f"{wanted}, got {quote(value)}")
    if not math.isfinite(value) or value > high or value < low or (low_open and value == low):
        raise UserInputError("", f"{wanted}, got {value if integer else format(value, 'g')}")
    return value


def _range(low: float, high: float, integer: bool, low_open: bool) -> str:
    noun = "integer" if integer else "number"
    if (low == 0 and low_open) or (integer and low == 1):
        return f"a positive {noun} (at most {_num(high)})"
    if low == 0:
        return f"a non-negative {noun} (at most {_num(high)})"
    return f"a{'n' if integer else ''} {noun} {'above' if low_open else 'from'} {_num(low)} to {_num(high)}"


def _num(x: float) -> str:
    return str(x) if isinstance(x, int) else format(x, "g")


def subject_name(value: str) -> str:
    """argparse type of --subject: an empty name once ran the default subject as if none was given."""
    if not value.strip():
        import argparse  # only a command line gets here

        raise argparse.ArgumentTypeError("empty; name a subject (fakelet subjects lists them)")
    return value
