"""A run's private directory: every socket and file of one check lives here.

Created 0700 under the temp dir with a recognisable prefix (so a reaper can
find leftovers of a crashed run) and a short path (unix socket paths are
limited to 107 bytes: SOCKET_PATH_MAX). `close()` removes it, whatever happened.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from harness.launch.owners import owned_dir, remove_owned

SANDBOX_PREFIX = "fakelet-"
PLUGIN_DIR_NAME = "device-plugins"  # the last element of upstream DevicePluginPath
REGISTRY_DIR_NAME = "plugins_registry"  # kubelet config.DefaultKubeletPluginsRegistrationDirName
PLUGINS_DIR_NAME = "plugins"  # kubelet config.DefaultKubeletPluginsDirName
CDI_DIR_NAME = "cdi"  # stands in for /var/run/cdi, where drivers write CDI specs
# kubelet.go setupDataDirs: utilfs.MkdirAll(getPluginsRegistrationDir(), 0750) and the same for
# getPluginsDir(); pluginwatcher's own MkdirAll(0755) then finds it already there.
KUBELET_PLUGIN_DIRS_MODE = 0o750
CDI_DIR_MODE = 0o755  # container-device-interface v1.1.0 pkg/cdi spec.go write(): os.MkdirAll(dir, 0o755)
UNIX_PATH_MAX = 108  # linux/un.h: sizeof(sockaddr_un.sun_path), the terminating NUL included
SOCKET_PATH_MAX = UNIX_PATH_MAX - 1  # the longest path a socket can be bound or dialed at
SANDBOX_NAME_CHARS = 8  # owners.owned_dir's secrets.token_hex(4) after the prefix


SOCKET_NAME_ROOM = 32  # room left for a plugin's own socket file name


def longest_path(base: str | None = None) -> Path:
    """A sandbox's path under `base` (default the temp dir), as long as any can be: what `fakelet scenario
    check` measures socket paths against before a run has made its sandbox."""
    return Path(base or tempfile.gettempdir()) / f"{SANDBOX_PREFIX}{'f' * SANDBOX_NAME_CHARS}"


def check_base(base: str | None = None) -> None:
    """Fail early, and say why, when sandboxes under `base` could not hold a unix socket."""
    base = base or tempfile.gettempdir()
    longest = len(os.path.join(longest_path(base), "kubelet", PLUGIN_DIR_NAME, "")) + SOCKET_NAME_ROOM
    if longest > SOCKET_PATH_MAX:
        raise ValueError(f"temp dir {base!r} is too long for unix socket paths ({longest} > {SOCKET_PATH_MAX} "
                         "bytes); set TMPDIR to a shorter directory such as /tmp")


class Sandbox:
    def __init__(self, root: Path | None = None) -> None:
        check_base(str(root) if root else None)
        self.path = owned_dir(SANDBOX_PREFIX, root)  # a run killed outright leaves it behind; the next run reaps it
        try:  # an interrupt halfway must not leave a half-made sandbox for the reaper: it is for SIGKILL only
            self._populate()
        except BaseException:
            self.close()
            raise

    def _populate(self) -> None:
        for sub in ("kubelet", "dev", "logs", "run"):
            (self.path / sub).mkdir()
        self.plugin_dir.mkdir(mode=0o750)
        for d in (self.registry_dir, self.plugins_dir):
            d.mkdir(mode=KUBELET_PLUGIN_DIRS_MODE)
            os.chmod(d, KUBELET_PLUGIN_DIRS_MODE)  # mkdir's mode is filtered by the umask
        self.cdi_dir.mkdir(mode=CDI_DIR_MODE)
        os.chmod(self.cdi_dir, CDI_DIR_MODE)

    @property
    def plugin_dir(self) -> Path:
        # Mirrors /var/lib/kubelet/device-plugins so it can be bind-mounted there.
        return self.path / "kubelet" / PLUGIN_DIR_NAME

    @property
    def kubelet_root(self) -> Path:
        return self.path / "kubelet"

    @property
    def kubelet_socket(self) -> Path:
        return self.plugin_dir / "kubelet.sock"

    @property
    def registry_dir(self) -> Path:
        """Where drivers put their registration sockets (mirrors /var/lib/kubelet/plugins_registry)."""
        return self.path / "kubelet" / REGISTRY_DIR_NAME

    @property
    def plugins_dir(self) -> Path:
        """Where drivers put their service sockets, under plugins/<driver>/ (/var/lib/kubelet/plugins)."""
        return self.path / "kubelet" / PLUGINS_DIR_NAME

    @property
    def cdi_dir(self) -> Path:
        return self.path / CDI_DIR_NAME

    @property
    def dev_dir(self) -> Path:
        return self.path / "dev"

    @property
    def logs_dir(self) -> Path:
        return self.path / "logs"

    @property
    def state_dir(self) -> Path:
        return self.path / "run"

    def check_socket_path(self, name: str) -> Path:
        path = self.plugin_dir / name
        if len(str(path)) > SOCKET_PATH_MAX:
            raise ValueError(f"socket path {path} is longer than {SOCKET_PATH_MAX} bytes")
        return path

    def close(self) -> None:
        remove_owned(self.path)

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
