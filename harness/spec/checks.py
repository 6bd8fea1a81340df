"""What a conformance check is: an ID, a level, a title, and ways to fail clearly.

Suites mark each check with `@check(...)`; the pytest plugin turns outcomes
into verdicts. `expect` states what was expected and what was seen, so every
failing verdict explains itself.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
from typing import Any

# pytest is imported where a check is marked or skipped, not here: the CLI reads SUITES for every command
# (its --help, a typo's error) and pytest costs about half a second to import (tests/test_cli_startup.py).

MUST = "MUST"
SHOULD = "SHOULD"
# Skip reasons carry the verdict kind as a prefix; the pytest plugin maps them
# (reports/model.py has what each kind means).
NOT_APPLICABLE = "not applicable: "
NOT_EXERCISED = "not exercised: "
INSTALL_MARK = " [install: "  # a skip reason's tail: the one command that installs what was missing


# Every check defined so far, by ID: filled as suite modules are imported.
CATALOG: dict[str, tuple[str, str]] = {}
CHECK_MODULES: dict[str, str] = {}  # check ID -> the module that defines it
# Checks that judge only what any kubelet shows (Node status, pods, the runtime), not the wire. Every
# device-plugin check runs on the real kubelet (`fakelet run --node real`, `fakelet fidelity`), the others
# through the relay that records the wire there (harness/node/relay).
REAL_KUBELET: set[str] = set()
# Checks that write cluster-wide objects selecting devices by driver, pool and name (DeviceTaintRules). The
# checks of a run share one local API server, each a node of its own; a driver that names its pool the same on
# every node (kubernetes-pydra) would have such a rule taint, and kube-controller-manager evict, the devices of
# every check running beside it. So each of these gets a local API server of its own (about 4 s to start).
CLUSTER_OBJECTS: set[str] = set()
# Checks that need partitioned GPUs (the DRA-PRT area, KEP-4815): their fake backend starts with
# harness/world/draenv.py PARTITIONED_INVENTORY when the subject's inventory has no partitions, and every other
# check keeps the subject's own.
PARTITIONED: set[str] = set()
# Checks that need a shareable device (the DRA-CAP area, KEP-5075): the same, with draenv.py SHARED_INVENTORY
# when the subject's inventory has no device with `sharing`.
SHARED: set[str] = set()
# Checks that need a fabric-attached device (the DRA-BND area, KEP-5007): the same, with draenv.py FABRIC_INVENTORY
# when the subject's inventory has no device with `fabric`.
FABRIC: set[str] = set()


# Of those, the ones that run on a kind cluster (`fakelet run --cluster kind`): they need nothing of this
# machine's sandbox (the fake hardware, the plugin's socket), which a pod on a kind node does not share.
KIND_REASON = ("on a kind cluster: this check reads the kubelet's side of the gRPC wire, injects a fault into the "
               "kubelet, drives this machine's fake hardware or probes the plugin's socket here, none of which a "
               "pod on a kind node shares")

SUITES = {"device-plugin": "suites.dp", "dra": "suites.dra"}  # each subject kind's conformance checks
# Suites chosen by name (`fakelet run --suite NAME`) instead of by the subject's kind, with the kind they are for.
NAMED_SUITES = {"kep5970": ("dra", "suites.kep5970")}


def suite_package(kind: str, suite: str | None = None) -> str:
    """The pytest package a run's checks come from: a named suite, else the subject kind's own."""
    return NAMED_SUITES[suite][1] if suite else SUITES[kind]


def all_packages() -> list[str]:
    """Every suite package, for the catalog digest and `fakelet checks`."""
    return [*SUITES.values(), *(package for _, package in NAMED_SUITES.values())]


def check(check_id: str, level: str, title: str, *, real_kubelet: bool = False, kind: bool = False,
          cluster_objects: bool = False, partitioned: bool = False, shared: bool = False,
          fabric: bool = False) -> Any:
    """`cluster_objects`: the check writes objects that select devices across nodes (DeviceTaintRules), so on a
    local API server it gets one of its own instead of the run's shared one (see CLUSTER_OBJECTS).
    `partitioned`: the check needs partitioned GPUs in the fake hardware (see PARTITIONED); `shared`, a shareable
    device (see SHARED); `fabric`, a fabric-attached device (see FABRIC)."""
    if level not in (MUST, SHOULD):
        raise ValueError(f"{check_id}: level must be MUST or SHOULD")
    if check_id in CATALOG:
        raise ValueError(f"{check_id}: defined twice")
    CATALOG[check_id] = (level, title)
    CHECK_MODULES[check_id] = sys._getframe(1).f_globals.get("__name__", "")
    if real_kubelet:
        REAL_KUBELET.add(check_id)
    if cluster_objects:
        CLUSTER_OBJECTS.add(check_id)
    if partitioned:
        PARTITIONED.add(check_id)
    if shared:
        SHARED.add(check_id)
    if fabric:
        FABRIC.add(check_id)
    import pytest

    return pytest.mark.fakelet_check(id=check_id, level=level, title=title, real_kubelet=real_kubelet, kind=kind,
                                     cluster_objects=cluster_objects, partitioned=partitioned, shared=shared,
                                     fabric=fabric)


def catalog(suite_package: str) -> dict[str, tuple[str, str]]:
    """The checks a suite package defines, by ID (imports its modules)."""
    package = importlib.import_module(suite_package)
    prefix = package.__name__ + "."
    for info in pkgutil.iter_modules(package.__path__, prefix):
        if info.name.rsplit(".", 1)[-1].startswith("test_"):
            importlib.import_module(info.name)
    return {k: v for k, v in sorted(CATALOG.items()) if CHECK_MODULES[k].startswith(prefix)}


def check_ids_of(nodeids: list[str], suite_package: str) -> list[str]:
    """The check IDs of pytest node IDs collected from `suite_package` (`test_x.py::test_y`, relative to
    wherever pytest's rootdir was), for a process that collected nothing itself (xdist's controller):
    each check is one test function of a suite module, and these modules are imported (`catalog`)."""
    by_test: dict[tuple[str, str], str] = {}
    for check_id, module_name in CHECK_MODULES.items():
        module = sys.modules.get(module_name)
        if module is None or not module_name.startswith(suite_package + "."):
            continue
        for name, obj in vars(module).items():
            if any(m.name == "fakelet_check" and m.kwargs.get("id") == check_id
                   for m in getattr(obj, "pytestmark", [])):
                by_test[("/" + module_name.replace(".", "/") + ".py", name)] = check_id
    found = set()
    for nodeid in nodeids:
        path, _, rest = nodeid.partition("::")
        function = rest.rsplit("::", 1)[-1].split("[", 1)[0]
        path = "/" + path.lstrip("./")
        found |= {cid for (file, name), cid in by_test.items()
                  if name == function and (file.endswith(path) or path.endswith(file))}
    return sorted(found)


def expect(condition: object, expected: str, seen: str) -> None:
    if not condition:
        raise AssertionError(f"expected {expected}; saw {seen}")


def not_applicable(reason: str) -> None:
    """Skip a check for an optional API feature the plugin does not advertise (n/a)."""
    import pytest

    pytest.skip(NOT_APPLICABLE + reason)


def not_exercised(reason: str) -> None:
    """End a check that found nothing to test: never a pass, and the reason says why."""
    import pytest

    pytest.skip(NOT_EXERCISED + reason)


def with_install(reason: str, install: str) -> str:
    return reason + (f"{INSTALL_MARK}{install}]" if install else "")


def unavailable(reason: str, install: str = "") -> None:
    """Skip a check this machine cannot run (a component is missing); `install` is the fix, if known."""
    import pytest

    pytest.skip(with_install(reason, install))


def split_install(reason: str) -> tuple[str, str]:
    """A skip reason without its install tail, and the install command ('' if none)."""
    head, mark, tail = reason.partition(INSTALL_MARK)
    return (head, tail.removesuffix("]")) if mark else (reason, "")
