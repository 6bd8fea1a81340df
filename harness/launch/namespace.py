"""The namespace launcher: a plugin in a private mount (and PID) namespace, with a container's view of the host."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

from harness.instruments.timeline import Timeline
from harness.launch.process import (
    CONTAINER_PRIVATE_DIRS,
    HELPER_DIR,
    LaunchError,
    ProcessLauncher,
    _helper,
    namespace_prefix,
    unshare_prefix,
)


def paths_in(values: Iterable[str]) -> list[str]:
    """Absolute paths named in arguments or env values (`/p`, `--flag=/p`, `A:/p:/q`)."""
    out = []
    for value in values:
        for part in value.partition("=")[2].split(":") + value.split(":"):
            if part.startswith("/"):
                out.append(part)
    return out


class NamespaceLauncher(ProcessLauncher):
    """Runs a plugin that hard-codes /var/lib/kubelet/device-plugins, with a container's view of the host.

    The plugin gets a private mount namespace (harness/launch/nsexec.py) in which the
    sandbox directories are bind-mounted over the host paths (`binds`: sandbox
    dir -> host path) and /tmp, /run (/var/run), /var/run/cdi and /etc/cdi, plus
    `private_dirs`, are private and empty. The plugin binary, the interpreter,
    and every path the plugin was given (`keep`, and absolute paths in its argv
    and env) stay visible where a private dir would hide them. `files` (host file ->
    path inside) puts single files where a real node has them, read-only, in a directory
    that keeps its other entries (the fake libnvidia-ml.so.1 at /usr/lib/<multiarch>/;
    nsexec --file). The host's file system is never written to, and the mounts vanish
    with the namespace.
    """

    def __init__(self, name: str, argv: Sequence[str], env: dict[str, str], log_path: Path,
                 timeline: Timeline, binds: dict[str, str], private_dirs: Sequence[str] = (),
                 keep: Sequence[str] = (), files: dict[str, str] | None = None) -> None:
        super().__init__(name, argv, env, log_path, timeline)
        self.binds = dict(binds)
        self.files = dict(files or {})
        self.private_dirs = list(dict.fromkeys([*CONTAINER_PRIVATE_DIRS, *private_dirs]))
        self.keep = list(keep)
        self._mount_prefix = namespace_prefix()  # no mount namespace is a LaunchError at once, as before

    def _namespaces(self) -> tuple[list[str], bool]:
        try:
            return unshare_prefix(mount=True, pid=True), True
        except LaunchError as err:
            self._no_pid_ns = str(err)
            return self._mount_prefix, False

    def keep_paths(self, program: str) -> list[str]:
        real = os.path.realpath(program)
        # Directories and the files themselves: nsexec puts back a directory when it can,
        # the file when the directory is itself hidden (a script directly in /tmp).
        paths = [os.path.dirname(program), program, os.path.dirname(real), real,
                 sys.prefix, sys.base_prefix, sys.exec_prefix, str(HELPER_DIR.parents[1]), *self.keep,
                 *paths_in(self.argv[1:]), *paths_in(self.env.values())]
        # A file the plugin was given comes with its directory (a kubeconfig's certificates).
        paths += [os.path.dirname(p) for p in paths if os.path.isfile(p)]
        return list(dict.fromkeys(p for p in paths if os.path.exists(p)))

    def command(self, program: str | None = None, report_fd: int | None = None) -> list[str]:
        prefix, contained = self.namespaces
        program = program or self.program()
        args = [a for src, dst in self.binds.items() for a in ("--bind", f"{src}:{dst}")]
        args += [a for src, dst in self.files.items() for a in ("--file", f"{src}:{dst}")]
        args += [a for d in self.private_dirs for a in ("--private", d)]
        args += [a for p in self.keep_paths(program) for a in ("--keep", p)]
        if contained:
            args += ["--proc", "--init", *self._helper_args(None, report_fd)]
        return [*prefix, "--", *_helper("nsexec.py"), *args, "--exec", program, "--", *self.argv]
