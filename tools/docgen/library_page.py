"""docs/reference/scenario-library.md: the bundled scenarios and the verdicts each promises, read off
fixtures/scenarios/ by the scenario loader (harness/scenarios/library.py). CI holds every promise
(tests/test_scenarios.py, tox -e subjects, tox -e real-kubelet), so this table is what CI checks.
"""

from __future__ import annotations

from docgen.markdown import cell, code, header, table


def _upstream(url: str) -> str:
    if not url:
        return ""
    short = url.removeprefix("https://github.com/").replace("/issues/", "#").replace("/pull/", "#")
    return f"[{cell(short)}]({url})"


def render() -> str:
    from harness.scenarios.library import all_scenarios

    out = header("Scenario library", "fixtures/scenarios/ (harness/scenarios/library.py)",
                 "Every bundled scenario: the reported bug it reproduces, its upstream report, and the verdicts "
                 "the library promises for it (`cases:`). `fakelet scenario show NAME` prints one in full; "
                 "`fakelet scenario run NAME --case all` runs its cases and checks each promise.")
    rows = []
    for s in sorted(all_scenarios(), key=lambda s: s.name):
        cases = "<br>".join(cell(c.describe()) for c in s.cases)
        rows.append([code(s.name), s.kind, cell(s.title), _upstream(s.upstream), cases])
    out += table(["scenario", "kind", "bug", "report", "promised verdicts"], rows)
    return "\n".join(out).rstrip() + "\n"
