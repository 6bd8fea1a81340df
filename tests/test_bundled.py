"""fakelet's own files, found through harness/spec/bundled.py in a checkout and in an install."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.node.real.releases import REAL_KUBELET_MODULES
from harness.spec import bundled
from harness.spec.subjects import ProfileError, all_subjects, load_subject_file

REPO = Path(__file__).resolve().parents[1]


def test_a_checkout_reads_its_own_fixtures_and_go_modules() -> None:
    assert not bundled.installed()
    assert bundled.checkout() == REPO
    assert bundled.files_root() == REPO
    for name in REAL_KUBELET_MODULES.values():
        assert (bundled.go_module(name) / "go.mod").is_file(), name
    assert {p.name for p in bundled.go_modules()} >= {"kubernetes", "kind", "nvmlplugin"}


def test_every_bundled_subject_build_names_a_module_that_exists() -> None:
    built = [spec for spec in all_subjects() if spec.build]
    assert built, "no bundled subject builds from a Go module"
    for spec in built:
        module = Path(spec.build["module"])
        assert module.is_absolute() and (module / "go.mod").is_file(), spec.name
        assert module.parent == REPO / "fixtures" / "go", spec.name


def _subject(tmp_path: Path, module: str) -> Path:
    path = tmp_path / "mine.yaml"
    path.write_text(f"name: mine\nkind: device-plugin\nresource: example.com/foo\ncommand: ['{{bin}}']\n"
                    f"build: {{module: {module}, package: .}}\n")
    return path


def test_a_build_module_resolves_beside_the_subject_file_first(tmp_path: Path) -> None:
    (tmp_path / "gomod").mkdir()
    (tmp_path / "gomod" / "go.mod").write_text("module example.com/mine\n")
    spec = load_subject_file(_subject(tmp_path, "gomod"))
    assert spec.build is not None and spec.build["module"] == str(tmp_path / "gomod")
    spec = load_subject_file(_subject(tmp_path, "go/kubernetes"))  # not beside it: fakelet's own
    assert spec.build is not None and spec.build["module"] == str(REPO / "fixtures" / "go" / "kubernetes")


def test_a_missing_build_module_is_one_line_naming_where_it_looked(tmp_path: Path) -> None:
    with pytest.raises(ProfileError) as err:
        load_subject_file(_subject(tmp_path, "nowhere"))
    text = str(err.value)
    assert "mine.yaml:5: build.module" in text and "no Go module 'nowhere'" in text, text
    assert str(tmp_path / "nowhere") in text and "\n" not in text


def _dist(site: Path, name: str, top_level: str | None, record: str | None) -> None:
    info = site / f"{name}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    if top_level is not None:
        (info / "top_level.txt").write_text(top_level)
    if record is not None:
        (info / "RECORD").write_text(record)


def test_another_distribution_that_installs_one_of_fakelets_import_packages_is_named(tmp_path: Path) -> None:
    _dist(tmp_path, "fakelet", None, "harness/__init__.py,,\nsuites/__init__.py,,\n")
    _dist(tmp_path, "requests", "requests\n", "requests/__init__.py,,\n../../../bin/x,,\n")
    assert bundled.clashes(tmp_path) == []
    _dist(tmp_path, "harness", "validate\n", "harness/__init__.py,sha256=x,1\n")  # PyPI's: top_level lies
    _dist(tmp_path, "reports", "reports\n", "reports/__init__.py,sha256=x,1\nreports-1.0.dist-info/METADATA,,\n")
    _dist(tmp_path, "old", "suites\n", None)  # installed by hand: no RECORD, its top_level.txt is all there is
    assert bundled.clashes(tmp_path) == ["'harness' from harness 1.0", "'reports' from reports 1.0",
                                       "'suites' from old 1.0"]
    message = bundled.clash_message(tmp_path)
    assert message is not None and "pipx install fakelet" in message and "\n" not in message
