"""docs/reference/tox.md: the tox environments, read off tox.ini (what CI runs is its env_list)."""

from __future__ import annotations

import configparser
from pathlib import Path

from docgen.markdown import cell, code, header, table

ROOT = Path(__file__).resolve().parents[2]


def envs(path: Path = ROOT / "tox.ini") -> tuple[list[str], dict[str, dict[str, str]]]:
    ini = configparser.ConfigParser(interpolation=None)
    ini.read(path)
    listed = [e.strip() for e in ini["tox"]["env_list"].replace("\n", ",").split(",") if e.strip()]
    found = {"py": dict(ini["testenv"])}
    for section in ini.sections():
        if section.startswith("testenv:"):
            found[section.removeprefix("testenv:")] = dict(ini[section])
    return listed, found


def render() -> str:
    listed, found = envs()
    out = header("tox environments", "tox.ini",
                 "`tox p -p 2` runs every environment of `env_list`, two at a time, starting them in this order as "
                 "a slot frees; each env's output shows when it ends: that is what CI runs (`.ci/run`). `tox` alone "
                 "runs them one after the other. `tox -e NAME` runs one. `{posargs}` takes what follows `--`.")
    rows = []
    for name in [*listed, *sorted(set(found) - set(listed))]:
        env = found.get(name, {})
        commands = env.get("commands", found["py"].get("commands", "")).strip().splitlines()
        rows.append([code(name), "yes" if name in listed else "", cell(env.get("description", "")),
                     "<br>".join(code(c.strip()) for c in commands if c.strip())])
    out += table(["env", "in CI", "what", "runs"], rows)
    return "\n".join(out).rstrip() + "\n"
