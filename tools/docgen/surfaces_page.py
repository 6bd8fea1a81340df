"""docs/reference/surfaces.md: the fake hardware's skins, controls and vendor surfaces, read off fake_devices/.

Skins and their parts come from fake_devices/materialize.py; what each control changes in the model from
DeviceBackend's own calls (`_change(op, device, field=value)`) and its ranges from the modules' limits;
the NVML entry points from the EXPORT lines of fake_devices/nvml/libnvml.c; the Level-Zero methods from
harness/wire/levelzero/api.proto; the bundled inventories from fixtures/inventories/.
"""

from __future__ import annotations

import ast
import inspect
import re
from collections import Counter
from pathlib import Path

from docgen.markdown import cell, code, header, table

ROOT = Path(__file__).resolve().parents[2]
EXPORT = re.compile(r"^EXPORT\s+[^(]*?\b(nvml\w+)\s*\(", re.M)
RPC = re.compile(r"^\s*rpc\s+(\w+)\s*\((\w+)\)\s*returns\s*\((\w+)\)", re.M)


def _comment_above(source: str, name: str) -> str:
    lines = source.splitlines()
    for n, line in enumerate(lines):
        if line.startswith(f"{name} ="):
            above = []
            for prev in reversed(lines[:n]):
                if not prev.startswith("#"):
                    break
                above.insert(0, prev.lstrip("#").strip())
            return " ".join(above)
    return ""


def _changes() -> dict[str, str]:
    """op -> the model fields its backend call sets, e.g. fail -> 'health=UNHEALTHY'."""
    from fake_devices.backend import DeviceBackend

    out = {}
    tree = ast.parse(inspect.cleandoc("\n" + inspect.getsource(DeviceBackend)))
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "_change" \
                and node.args and isinstance(node.args[0], ast.Constant):
            sets = ", ".join(f"{k.arg} = {k.value.id}" if isinstance(k.value, ast.Name) and k.value.id.isupper()
                             else f"{k.arg} = {k.value.value}" if isinstance(k.value, ast.Constant)
                             else f"{k.arg} = VALUE" for k in node.keywords)
            out[str(node.args[0].value)] = sets
    return out


def render() -> str:
    from fake_devices import backend, control, levelzero, materialize, model, scripts
    from fake_devices.model import Inventory

    out = header("Fake hardware: skins, controls and vendor surfaces",
                 "fake_devices/ (materialize.py, backend.py, control.py, nvml/libnvml.c, levelzero.py), "
                 "harness/wire/levelzero/api.proto and fixtures/inventories/",
                 "One model of the devices (an inventory), laid out as files (a skin) and served through the "
                 "vendors' own surfaces. Every control changes the model once; each surface shows the change.")
    out += ["## Skins", "", _comment_above(inspect.getsource(materialize), "SKINS"), ""]
    out += table(["skin", "parts"], [[code(s), ", ".join(code(p) for p in s.split("+"))] for s in materialize.SKINS])
    out += ["## Device model", "", f"Device classes: {', '.join(code(c) for c in model.CLASSES)}. Health is "
            f"{' or '.join(code(h) for h in model.HEALTH_VALUES)}.", ""]
    out += ["## Controls", "",
            "The same operations from Python (`DeviceBackend`), over a session's control socket, from "
            "`fakelet devices OP DEV [VALUE]`, and as a scenario's `device:` step.", ""]
    changes = _changes()
    ranges = {"heat": f"{backend.TEMPERATURE_RANGE_C[0]:g} to {backend.TEMPERATURE_RANGE_C[1]:g} °C",
              "cool": f"{backend.TEMPERATURE_RANGE_C[0]:g} to {backend.TEMPERATURE_RANGE_C[1]:g} °C",
              "ecc": f"1 to {backend.MAX_ECC_BURST:,} errors (default 1)",
              "xid": f"1 to {backend.MAX_XID:,} (the nvml skin)",
              "flap": f"--period up to {scripts.MAX_PERIOD_S:g} s, --cycles up to {scripts.MAX_FLAP_CYCLES:,}"}
    reads_only = "changes nothing: reads the model"
    rows = [[code(op), code(changes[op]) if op in changes else
             "fail and recover in turn (fake_devices/scripts.py)" if op == "flap" else
             reads_only if op not in backend.OPS else "", cell(ranges.get(op, ""))]
            for op in control.CONTROL_OPS]
    out += table(["op", "model change", "value"], rows)
    libnvml = (ROOT / "fake_devices" / "nvml" / "libnvml.c").read_text()
    exports = sorted(set(EXPORT.findall(libnvml)))
    out += ["## NVML (`nvml` skin)", "",
            f"fakelet's own `libnvidia-ml.so.1` (fake_devices/nvml/libnvml.c) exports {len(exports)} entry points. "
            "Any other is the consumer's `NVML_ERROR_FUNCTION_NOT_FOUND`.", ""]
    out += [", ".join(code(e) for e in exports), ""]
    proto = (ROOT / "harness" / "wire" / "levelzero" / "api.proto").read_text()
    out += ["## Level-Zero sidecar (`drm` skin)", "",
            f"Served on {code(levelzero.DEFAULT_SOCKET)} (`{{levelzero_socket}}` in a template). A plugin that calls "
            + ", ".join(f"{code(m)} is held to the {c} checks" for c, m in sorted(levelzero.CAPABILITY_METHODS.items()))
            + ".", ""]
    out += table(["method", "request", "answer"], [[code(m), code(a), code(b)] for m, a, b in RPC.findall(proto)])
    out += ["## Bundled inventories", "", "A `--inventory NAME` or a subject's `backend.inventory`.", ""]
    rows = []
    for path in sorted((ROOT / "fixtures" / "inventories").glob("*.yaml")):
        inventory = Inventory.load(path)
        by_class = Counter(d.cls for d in inventory.devices)
        numa = sorted({d.numa for d in inventory.devices})
        rows.append([code(path.stem), str(len(inventory.devices)),
                     ", ".join(f"{n} {c}" for c, n in sorted(by_class.items())), ", ".join(map(str, numa))])
    out += table(["inventory", "devices", "by class", "NUMA nodes"], rows)
    return "\n".join(out).rstrip() + "\n"
