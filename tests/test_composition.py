"""Composed defects (`--defect a+b`, harness/spec/composition.py): parsing, the one-line error naming the bad part,
and every place that takes a defect taking a composed one too: the reference plugin's and driver's flags and
`has()`, a subject's own check, a run's config. In-process, no plugin started."""

from __future__ import annotations

import argparse
from types import SimpleNamespace

import pytest

from harness.config.runconfig import RunConfig
from harness.reference import device_plugin, dra_driver
from harness.spec.composition import argument_type, composition_error, has, is_composed, parts
from harness.spec.subjects import ProfileError, load_subject, parse_yaml, subject_problems

KNOWN = {"a", "b", "c", "hostile", "benign"}
MUTANTS = {"a", "b", "c"}
DP_ARGS = ["--plugin-dir", "/nonexistent", "--inventory", "/nonexistent/inventory.yaml"]
DRA_ARGS = ["--driver-name", "gpu.example.com", "--node-name", "n", "--registry-dir", "/r", "--plugin-dir", "/p",
            "--cdi-dir", "/c", "--sysfs-root", "/s", "--state-dir", "/x"]


def test_parts_and_has() -> None:
    assert parts(None) == () and parts("") == ()
    assert parts("a") == ("a",)
    assert parts("a+b+c") == ("a", "b", "c")
    assert has("a+b", "a") and has("a+b", "b") and has("a", "a")
    assert not has("a+b", "c") and not has(None, "a") and not has("ab", "a")
    assert is_composed("a+b") and not is_composed("a") and not is_composed(None)


@pytest.mark.parametrize(("defect", "wanted"), [
    ("a", None),
    ("hostile", None),  # alone, any defect runs
    ("a+b", None),
    ("a+b+c", None),
    ("zz", "unknown defect 'zz'"),
    ("a+zz", "unknown part 'zz'"),
    ("a+", "an empty part"),
    ("a+a", "'a' is named twice"),
    ("a+hostile", "'hostile' is not a mutant"),
    ("benign+b", "'benign' is not a mutant"),
])
def test_composition_error_names_the_bad_part(defect: str, wanted: str | None) -> None:
    error = composition_error(defect, KNOWN, MUTANTS)
    if wanted is None:
        assert error is None
    else:
        assert error is not None and wanted in error and "\n" not in error


def test_argument_type() -> None:
    parse = argument_type(KNOWN, MUTANTS)
    assert parse("a+b") == "a+b"
    with pytest.raises(argparse.ArgumentTypeError, match="unknown part 'zz'"):
        parse("a+zz")


def test_reference_plugin_takes_composed_mutants(capsys: pytest.CaptureFixture[str]) -> None:
    args = device_plugin.parse_args([*DP_ARGS, "--defect", "no-reregister+all-unhealthy-on-one+no-hotplug"])
    plugin = SimpleNamespace(defect=args.defect)
    assert all(device_plugin.ReferencePlugin.has(plugin, d)  # type: ignore[arg-type]
               for d in ("no-reregister", "all-unhealthy-on-one", "no-hotplug"))
    assert not device_plugin.ReferencePlugin.has(plugin, "stuck-unhealthy")  # type: ignore[arg-type]
    assert device_plugin.parse_args([*DP_ARGS, "--defect", "silent-endpoint"]).defect == "silent-endpoint"
    for bad, part in (("no-reregister+nope", "nope"), ("no-reregister+silent-endpoint", "silent-endpoint"),
                      ("repeat-lists+no-hotplug", "repeat-lists")):
        with pytest.raises(SystemExit):
            device_plugin.parse_args([*DP_ARGS, "--defect", bad])
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert f"'{part}'" in err, err


def test_reference_driver_takes_composed_mutants(capsys: pytest.CaptureFixture[str]) -> None:
    args = dra_driver.parse_args([*DRA_ARGS, "--defect", "stale-health+wrong-cdi-id"])
    driver = SimpleNamespace(defect=args.defect)
    assert dra_driver.ReferenceDriver.has(driver, "stale-health")  # type: ignore[arg-type]
    assert dra_driver.ReferenceDriver.has(driver, "wrong-cdi-id")  # type: ignore[arg-type]
    assert not dra_driver.ReferenceDriver.has(driver, "no-health")  # type: ignore[arg-type]
    with pytest.raises(SystemExit):
        dra_driver.parse_args([*DRA_ARGS, "--defect", "stale-health+nope"])
    assert "unknown part 'nope'" in capsys.readouterr().err


def test_subject_takes_composed_mutants() -> None:
    spec = load_subject("reference-dp")
    assert spec.defect_error("no-reregister+stuck-unhealthy") is None
    assert "no-hotplug" in spec.mutants() and "silent-endpoint" not in spec.mutants()
    assert "repeat-lists" not in spec.mutants()  # benign: kills nothing
    assert spec.defect_kills("no-reregister+no-hotplug") == sorted(
        set(spec.defects["no-reregister"].kills) | set(spec.defects["no-hotplug"].kills))
    assert spec.defect_error("nope") == (f"subject reference-dp has no defect 'nope'; known defects: "
                                         f"{', '.join(spec.defects)}")
    for bad, wanted in (("no-reregister+nope", "unknown part 'nope'"),
                        ("no-reregister+silent-endpoint", "'silent-endpoint' is not a mutant"),
                        ("repeat-lists+no-hotplug", "'repeat-lists' is not a mutant")):
        error = spec.defect_error(bad)
        assert error is not None and wanted in error and "\n" not in error, error


def test_only_a_reference_subject_composes() -> None:
    spec = load_subject("reference-nvml")  # the same plugin, but not marked reference: its defects run alone
    assert not spec.reference and spec.mutants() == []
    error = spec.defect_error("stuck-unhealthy+ignore-temperature")
    assert error is not None and "only a reference subject" in error


def test_run_config_names_the_bad_part() -> None:
    with pytest.raises(ProfileError, match="unknown part 'nope'"):
        RunConfig.build(subject="reference-dp", defect="no-reregister+nope")


def test_a_defect_name_has_no_separator() -> None:
    text = ('name: x\nkind: device-plugin\nresource: a.example.com/b\ncommand: [x]\n'
            'defects:\n  "a+b": {kills: [DP-REG-01]}\n')
    problems = subject_problems(parse_yaml(text, "x.yaml"), "x.yaml")
    assert any("defects.a+b" in p and "joins defects" in p for p in problems), problems
