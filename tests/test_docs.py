"""The documentation: a short README whose commands match CI, reference pages generated from the code and
current, runnable commands that exit as their page says, and a site that builds without a warning.

`tox -e docs` runs the whole of it (every runnable command, the strict build); these tests hold the tools
themselves to what they promise, on small fixtures, and the committed pages to the code.
"""

from __future__ import annotations

import configparser
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import mkdocs_config

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

import doc_commands  # noqa: E402
from docgen import figures_page  # noqa: E402

HAS_MKDOCS = importlib.util.find_spec("mkdocs") is not None and importlib.util.find_spec("material") is not None
NEEDS_MKDOCS = pytest.mark.skipif(not HAS_MKDOCS, reason="mkdocs and mkdocs-material are not installed "
                                                          "(pip install -e .[docs], or tox -e docs)")
TIMEOUT_S = 120


def _tox_envs() -> tuple[list[str], set[str]]:
    ini = configparser.ConfigParser(interpolation=None)
    ini.read(ROOT / "tox.ini")
    listed = [e.strip() for e in ini["tox"]["env_list"].split(",")]
    return listed, {"py", *(s.removeprefix("testenv:") for s in ini.sections() if s.startswith("testenv:"))}


# -- the README ------------------------------------------------------------------------------------------

def test_readme_is_short():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 150


def test_quick_start_is_two_commands_and_the_second_is_what_ci_runs():
    text = (ROOT / "README.md").read_text()
    block = re.search(r"## Quick start\n.*?```sh\n(.*?)```", text, re.S)
    assert block, "the README's quick start has a sh block"
    commands = block.group(1).strip().splitlines()
    assert len(commands) == 2
    assert commands[0].endswith("tox -e conformance")
    assert commands[1].split("&&")[-1].strip() == "tox p -p 2"  # every env of env_list, two at a time
    assert commands[1] in (ROOT / ".ci" / "run").read_text(), ".ci/run runs the README's test command"


def test_every_tox_env_the_docs_name_exists():
    _, envs = _tox_envs()
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    named = {(p.name, m) for p in pages for m in re.findall(r"tox -e ([a-z][a-z-]*)", p.read_text())}
    unknown = sorted(f"{page}: tox -e {env}" for page, env in named if env not in envs)
    assert not unknown, unknown


def test_docs_env_runs_in_ci():
    listed, _ = _tox_envs()
    assert "docs" in listed


def test_readme_links_into_docs_resolve():
    text = (ROOT / "README.md").read_text()
    targets = re.findall(r"\]\((docs/[^)#]+)(?:#[^)]*)?\)", text)
    assert targets
    missing = [t for t in targets if not (ROOT / t).is_file()]
    assert not missing, missing


# -- generated reference pages ---------------------------------------------------------------------------

def test_reference_pages_are_current():
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "gen_docs.py"), "--check"], cwd=ROOT,
                          capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]


def test_a_changed_page_is_stale(tmp_path):
    import gen_docs

    (tmp_path / "a.md").write_text("old\n")
    (tmp_path / "b.md").write_text("same\n")
    diffs = gen_docs.stale({"a.md": "new\n", "b.md": "same\n", "c.md": "missing\n"}, tmp_path)
    assert len(diffs) == 2
    assert "-old" in diffs[0] and "+new" in diffs[0]


def test_an_edited_figure_makes_the_benchmarks_page_stale(tmp_path):
    committed = (ROOT / "docs" / "reference" / "benchmarks.md").read_text()
    assert figures_page.render() == committed
    data = yaml.safe_load(figures_page.FIGURES.read_text())
    data["benchmarks"][0]["figures"][0]["value"] = "1.00 s"
    edited = tmp_path / "figures.yaml"
    edited.write_text(yaml.safe_dump(data))
    assert figures_page.render(edited) != committed


def test_a_figure_without_where_and_when_is_refused(tmp_path):
    data = yaml.safe_load(figures_page.FIGURES.read_text())
    del data["benchmarks"][0]["measured"]["date"]
    path = tmp_path / "figures.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(figures_page.FiguresError, match=r"measured\.date"):
        figures_page.load(path)


def _anchors(page: str) -> set[str]:
    """The anchors mkdocs gives a page: its headings as the toc extension slugifies them, `{ #id }` attributes
    and `<a id=...>` tags."""
    from markdown.extensions.toc import slugify

    found = set(re.findall(r'<a id="([^"]+)"', page)) | set(re.findall(r"\{\s*#([\w-]+)\s*\}", page))
    found |= {slugify(h, "-") for h in re.findall(r"^#+ (.+?)\s*$", page, re.M) if "{" not in h}
    return found


def test_every_check_fakelet_checks_lists_has_an_anchor_in_the_catalog_page(capsys):
    from docgen import checks_page

    from harness.run.commands import cmd_checks

    cmd_checks()
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert len(listed) > 60
    anchors = _anchors(checks_page.render())
    missing = [cid for cid in listed if cid.lower() not in anchors]
    assert not missing, f"checks without an anchor in docs/reference/checks.md: {missing}"


# -- runnable commands -----------------------------------------------------------------------------------

PAGE = """# A page

<!-- runnable: exit 0 -->
```console
$ python -c "print('hello')"
hello
```

Not runnable:

```sh
python -c "import sys; sys.exit(9)"
```

<!-- runnable: exit 3 -->
```console
$ python -c "import sys; sys.exit(3)"
```
"""


def test_runnable_commands_are_extracted_with_their_exit_codes(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(PAGE)
    commands = doc_commands.extract(page)
    assert [(c.line, c.exit_code) for c in commands] == [(5, 0), (17, 3)]
    assert all(doc_commands.run(c)[0] for c in commands)


def test_a_command_that_exits_otherwise_fails_with_its_output(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("<!-- runnable: exit 0 -->\n```console\n"
                    "$ python -c \"import sys; print('why'); sys.exit(4)\"\n```\n")
    (command,) = doc_commands.extract(page)
    ok, line = doc_commands.run(command)
    assert not ok
    assert "exit 4, the page says 0" in line and "why" in line


@pytest.mark.parametrize("text, problem", [
    ("<!-- runnable: exit 0 -->\n\n```console\n$ true\n```\n", "just before a code fence"),
    ("<!-- runnable: exit 0 -->\n```console\nno command\n```\n", "has no `$ ` command"),
    ("<!-- runnable: exit 0 -->\n```console\n$ true\n", "never closes"),
])
def test_a_mark_that_marks_nothing_is_an_error(tmp_path, text, problem):
    page = tmp_path / "page.md"
    page.write_text(text)
    with pytest.raises(doc_commands.PageError, match=re.escape(problem)):
        doc_commands.extract(page)


def test_a_runnable_command_is_one_command(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("<!-- runnable: exit 0 -->\n```console\n$ fakelet checks | head\n```\n")
    (command,) = doc_commands.extract(page)
    with pytest.raises(doc_commands.PageError, match="needs a shell"):
        doc_commands.argv_of(command)


def test_each_user_guide_has_runnable_commands():
    # The ways in; a guide added later need not mark one, but every mark on any page must parse.
    for name in ("certify-a-plugin.md", "ci-pipeline.md", "reproduce-a-bug.md", "kep5970-on-your-driver.md"):
        guide = ROOT / "docs" / "guides" / name
        commands = doc_commands.extract(guide)
        assert commands, f"{guide.name} marks no command runnable"
    for page in doc_commands.pages([]):
        for c in doc_commands.page_of(page).commands:
            doc_commands.argv_of(c)


def test_a_pages_commands_run_in_order_in_a_directory_of_their_own_with_its_files(tmp_path):
    seen = tmp_path / "cwd"
    page = tmp_path / "page.md"
    page.write_text(
        "<!-- file: in/hello.txt -->\n```text\nhi\n```\n\n"
        "<!-- runnable: exit 0 -->\n```console\n"
        f"$ python -c \"import os, pathlib; pathlib.Path('out').write_text(pathlib.Path('in/hello.txt').read_text()); "
        f"pathlib.Path({str(seen)!r}).write_text(os.getcwd())\"   # the first writes\n"
        "$ python -c \"import pathlib, sys; sys.exit(pathlib.Path('out').read_text() != 'hi\\n')\"\n```\n")
    results = doc_commands.run_page(doc_commands.page_of(page))
    assert [ok for ok, _ in results] == [True, True], results
    where = Path(seen.read_text())
    assert where != ROOT and not where.exists(), "the page's directory is removed"


@pytest.mark.parametrize("name", ["../escape.txt", "/etc/escape.txt"])
def test_a_file_mark_stays_in_the_pages_directory(tmp_path, name):
    page = tmp_path / "page.md"
    page.write_text(f"<!-- file: {name} -->\n```text\nx\n```\n")
    with pytest.raises(doc_commands.PageError, match="relative path inside the page's directory"):
        doc_commands.page_of(page)


# -- the site --------------------------------------------------------------------------------------------

@NEEDS_MKDOCS
def test_site_builds_strict(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT_S, check=False,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]


@NEEDS_MKDOCS
def test_a_link_to_a_missing_anchor_fails_the_build(tmp_path):
    config = mkdocs_config(ROOT / "mkdocs.yml")
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# Home\n\n[there](other.md#nowhere)\n")
    (docs / "other.md").write_text("# Other\n\n## Somewhere\n")
    config.update(docs_dir=str(docs), site_dir=str(tmp_path / "site"), nav=["index.md", "other.md"])
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(config))
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(tmp_path / "mkdocs.yml")],
                          capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    assert proc.returncode != 0
    assert "does not contain an anchor '#nowhere'" in proc.stderr
