"""fakelet's engine, one room per concern (harness/README.md has the rooms and their order).

The modules that sat directly in `harness/` before the rooms existed are still
importable by their old names for one release (a user's conftest may import
`harness.env.DPEnv`, `harness.subjects.load_subject` or `harness.profiles.get`):
each old name is an alias of its new module and warns with DeprecationWarning.
Only the standard library is imported here: the namespace helper runs
`harness.launch.nsexec` in isolated mode, and this file runs first.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType

# Old name -> new name; an old package's submodules follow it (harness.realnode.view -> harness.node.real.view).
MOVED: dict[str, str] = {
    "harness.cdispecs": "harness.world.cdispecs",
    "harness.cgroups": "harness.launch.cgroups",
    "harness.checks": "harness.spec.checks",
    "harness.cli": "harness.run.commands",
    "harness.devicemap": "harness.world.devicemap",
    "harness.draenv": "harness.world.draenv",
    "harness.draprobe": "harness.world.draprobe",
    "harness.env": "harness.world.env",
    "harness.faults": "harness.instruments.faults",
    "harness.fidelity": "harness.run.fidelity",
    "harness.filewatch": "harness.instruments.filewatch",
    "harness.gobuild": "harness.launch.gobuild",
    "harness.grpcutil": "harness.instruments.grpcutil",
    "harness.interceptors": "harness.instruments.interceptors",
    "harness.launchers": "harness.launch.process",  # and namespace.py (ALSO)
    "harness.listing": "harness.world.listing",
    "harness.nsexec": "harness.launch.nsexec",
    "harness.nsinit": "harness.launch.nsinit",
    "harness.probe": "harness.world.probe",
    "harness.profiles": "harness.spec.profiles",
    "harness.pytest_plugin": "harness.run.pytest_plugin",
    "harness.reaper": "harness.launch.reaper",
    "harness.runconfig": "harness.config.runconfig",
    "harness.sandbox": "harness.launch.sandbox",
    "harness.session": "harness.run.session",
    "harness.sessioncli": "harness.run.sessioncli",
    "harness.sessionops": "harness.run.sessionops",
    "harness.subjects": "harness.spec.subjects",
    "harness.timeline": "harness.instruments.timeline",
    "harness.kubelet.validation": "harness.spec.names",
    "harness.containers": "harness.launch.containers",
    "harness.kind": "harness.node.kind",
    "harness.realnode": "harness.node.real",
}
# Old modules whose names were split between new ones: the alias re-exports these too.
ALSO = {
    "harness.launchers": ("harness.launch.namespace",),  # NamespaceLauncher, paths_in
    "harness.reaper": ("harness.launch.owners",),  # claim, owner_tag, tag_alive, PREFIX, OWNER_FILE
}


def new_name(old: str) -> str | None:
    """The module an old import path now names, or None when `old` did not move."""
    if old in MOVED:
        return MOVED[old]
    head, _, tail = old.rpartition(".")
    parent = new_name(head) if head else None
    return f"{parent}.{tail}" if parent is not None else None


class _Alias(importlib.abc.Loader):
    def __init__(self, target: str, also: tuple[str, ...] = ()) -> None:
        self.target, self.also = target, also

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return ModuleType(spec.name)

    def exec_module(self, module: ModuleType) -> None:
        warnings.warn(f"{module.__name__} moved to {self.target}; the old name goes in the next release",
                      DeprecationWarning, stacklevel=2)
        real = importlib.import_module(self.target)
        # A thin re-export: the same objects, so isinstance and identity hold across both names.
        for source in (*(importlib.import_module(name) for name in self.also), real):
            module.__dict__.update({k: v for k, v in vars(source).items() if not k.startswith("__")})
        module.__getattr__ = lambda name: getattr(real, name)  # type: ignore[method-assign]
        if hasattr(real, "__path__"):
            module.__path__ = []  # a package: its old submodule names resolve through this finder too


class _MovedFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: object = None,
                  target: object = None) -> importlib.machinery.ModuleSpec | None:
        new = new_name(fullname) if fullname.startswith("harness.") else None
        if new is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _Alias(new, ALSO.get(fullname, ())))


if not any(isinstance(f, _MovedFinder) for f in sys.meta_path):
    sys.meta_path.insert(0, _MovedFinder())
