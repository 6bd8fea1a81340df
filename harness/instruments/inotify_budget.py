"""The machine's inotify instances: a limit per user that a busy machine runs out of.

Every real kubelet watches its directories with several inotify instances (about 15 for a
check's node, measured: kubelet, containerd, the API server's and the controllers' watchers,
the relays), every plugin that follows kubelet.sock with one, and the kernel allows a user
`fs.inotify.max_user_instances` of them (128 unless raised: Debian's and GitHub's runners keep it). A fidelity run
with four jobs beside another test worker reaches it; then `inotify_init` fails with EMFILE
("Too many open files") in whichever process asks next: a plugin that exits 1, a kubelet
that exits, a harness error. None of that is the plugin's doing, so a check that failed
while the machine was out of instances is an error that names the limit, never a failure.
"""

from __future__ import annotations

import os
from pathlib import Path

LIMIT_FILE = Path("/proc/sys/fs/inotify/max_user_instances")
KERNEL_DEFAULT = 128  # fs/notify/inotify/inotify_user.c inotify_user_setup(): UCOUNT_INOTIFY_INSTANCES
RECOMMENDED = 1024  # kind's known-issues page advises 512 for one cluster; fakelet runs several nodes at once
# Room a check's environment needs to start: a real node's (measured 7 to 17) with margin, and a plugin's own.
NEEDED_REAL_NODE = 24
NEEDED_FAKE_NODE = 6
# Within this many of the limit counts as out: instances come and go while /proc is read.
MARGIN = 4
INOTIFY_LINK = "anon_inode:inotify"


def limit() -> int | None:
    try:
        return int(LIMIT_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def in_use(uid: int | None = None) -> int:
    """The inotify instances open in processes of `uid` (this process's real uid): an instance a
    forked child shares is counted once per process holding it, so this errs high, never low."""
    uid = os.getuid() if uid is None else uid
    count = 0
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if proc.stat().st_uid != uid:
                continue
        except OSError:
            continue  # gone meanwhile
        count += held_by(int(proc.name))
    return count


def held_by(pid: int) -> int:
    """The inotify instances process `pid` holds open (0 when it is gone or not ours to read)."""
    fd_dir = Path(f"/proc/{pid}/fd")
    try:
        fds = os.listdir(fd_dir)
    except OSError:
        return 0
    count = 0
    for fd in fds:
        try:
            if os.readlink(fd_dir / fd) == INOTIFY_LINK:
                count += 1
        except OSError:
            continue
    return count


def fix_command(at_least: int = RECOMMENDED) -> str:
    return f"sysctl -w fs.inotify.max_user_instances={at_least}"


def shortage(needed: int = MARGIN) -> str | None:
    """One line if fewer than `needed` inotify instances are left to this user, else None."""
    most = limit()
    if most is None:
        return None
    used = in_use()
    if most - used >= needed:
        return None
    return (f"the machine is out of inotify instances: about {used} of fs.inotify.max_user_instances={most} "
            f"in use by uid {os.getuid()}, and a check's node needs {needed} more; processes that watch "
            f"files (kubelet, containerd, plugins) fail with 'Too many open files'. Run fewer jobs at once, "
            f"or raise the limit: {fix_command(max(RECOMMENDED, most * 2))}")


def out_of_instances() -> str | None:
    """Why a failure just seen is the machine's doing: the instances are (all but) used up now."""
    return shortage(MARGIN)
