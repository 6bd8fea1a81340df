"""Certify (issue 26): provenance in reports, `fakelet bundle` / `verify`, and `fakelet compare`.

Most cases build their reports from the model (no run); two real runs of the reference plugin, one
of them a mutant, prove provenance, a verified bundle and a compare that names the regression.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from reports import compare
from reports.bundle import MANIFEST, SIGNATURE, TOP
from reports.model import FAIL, NOT_EXERCISED, PASS, CheckResult, SubjectReport
from reports.provenance import NEAR_BOUND_NOTE, catalog_digest, mark_near_bound
from reports.writers import write_all

RUN_TIMEOUT_S = 300
PROVENANCE = {"format": 1, "fakelet": {"version": "0.1.0", "commit": "0" * 40, "dirty": False},
              "catalog": {"sha256": "ab" * 32, "checks": 2},
              "subject": {"name": "reference-dp", "command": "x", "binary_sha256": "cd" * 32},
              "kubelet": {"node": "fake", "model": "1.36"}, "components": {},
              "host": {"kernel": "6.1", "cgroup": "v2", "cpus": 2, "load_start": [0.5, 0, 0], "load_end": [0.7, 0, 0]}}


def fakelet(cwd: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, TMPDIR=str(cwd))
    return subprocess.run([sys.executable, "-m", "harness.run.cli", *args], capture_output=True, text=True,
                          env=env, timeout=timeout, cwd=cwd)


def check(cid: str, verdict: str, measured: dict[str, float] | None = None,
          samples: dict[str, list[float]] | None = None, detail: str = "") -> CheckResult:
    return CheckResult(id=cid, level="MUST", title=f"title of {cid}", verdict=verdict, duration_s=1.0,
                       detail=detail, measured=measured or {}, samples=samples or {})


def report(*checks: CheckResult, findings: list[str] | None = None, defect: str | None = None) -> SubjectReport:
    return SubjectReport(subject="reference-dp", profile="fast", seed=0, defect=defect, checks=list(checks),
                         findings=findings or [], provenance=json.loads(json.dumps(PROVENANCE)))


@pytest.fixture
def work(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path


def report_dir(where: Path, r: SubjectReport) -> Path:
    out = where / "report"
    write_all(r, out)
    (out / "artifacts").mkdir()
    (out / "artifacts" / "DP-NODE-01.log").write_text("a log line\n")
    return out


def need_ssh_keygen() -> str:
    found = shutil.which("ssh-keygen")
    if found is None:
        pytest.skip("ssh-keygen not found (Debian package openssh-client): bundles are signed with it")
    return found


def keypair(where: Path, name: str) -> tuple[Path, Path]:
    """A fresh ed25519 key without a passphrase, and an allowed_signers file naming it."""
    keygen = need_ssh_keygen()
    key = where / name
    subprocess.run([keygen, "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", str(key)], check=True,
                   stdin=subprocess.DEVNULL)
    allowed = where / f"{name}.allowed"
    allowed.write_text(f"{name}@vendor.example {key.with_suffix('.pub').read_text().strip()}\n")
    return key, allowed


# -- provenance ------------------------------------------------------------------------------------------


def test_catalog_digest_is_stable_and_sensitive() -> None:
    rows = [("DP-A-01", "MUST", "one"), ("DP-A-02", "SHOULD", "two")]
    assert catalog_digest(rows) == catalog_digest(list(reversed(rows)))
    assert catalog_digest(rows) != catalog_digest([("DP-A-01", "MUST", "one"), ("DP-A-02", "MUST", "two")])


def test_a_reaction_near_its_bound_under_load_is_marked() -> None:
    r = report(check("DP-NODE-01", PASS, {"registration": 4.7}), check("DP-RST-01", PASS, {"re-registration": 1.0}),
               check("DP-RST-02", PASS))
    r.provenance["host"].update(cpus=2, load_start=[5.0, 4, 4], load_end=[1.0, 1, 1])
    assert mark_near_bound(r, 5.0) == ["DP-NODE-01"]
    assert any(n.startswith(NEAR_BOUND_NOTE) for n in r.checks[0].notes)
    assert r.provenance["near_bound"]["judged"] == ["DP-NODE-01", "DP-RST-01"]


def test_nothing_is_marked_on_a_quiet_machine() -> None:
    r = report(check("DP-NODE-01", PASS, {"registration": 4.9}))
    assert mark_near_bound(r, 5.0) == [] and r.checks[0].notes == []


def test_summary_and_html_show_the_provenance(work: Path) -> None:
    out = report_dir(work, report(check("DP-NODE-01", PASS)))
    summary = (out / "summary.md").read_text()
    assert "produced by: fakelet 0.1.0 (commit 000000000000)" in summary
    assert "check catalog sha256 abababababab" in summary
    assert "catalog sha256 abababababab" in (out / "report.html").read_text()
    assert json.loads((out / "report.json").read_text())["provenance"]["catalog"]["sha256"] == "ab" * 32


# -- bundle and verify -------------------------------------------------------------------------------------


def test_bundle_round_trip_signed(work: Path) -> None:
    key, allowed = keypair(work, "vendor")
    out = report_dir(work, report(check("DP-NODE-01", PASS)))
    made = fakelet(work, "bundle", str(out), "-o", "b.tar.gz", "--sign", str(key))
    assert made.returncode == 0, made.stderr
    assert "manifest signed" in made.stdout and "CONFORMANT" in made.stdout
    with tarfile.open(work / "b.tar.gz") as tar:
        names = set(tar.getnames())
        badge = tar.extractfile(f"{TOP}/badge.svg").read().decode()  # type: ignore[union-attr]
    assert {f"{TOP}/{n}" for n in (MANIFEST, SIGNATURE, "provenance.json", "reports/report.json",
                                   "reports/artifacts/DP-NODE-01.log")} <= names
    assert "CONFORMANT" in badge and "abababababab" in badge and badge.startswith("<svg")
    got = fakelet(work, "verify", "b.tar.gz", "--allowed-signers", str(allowed))
    assert got.returncode == 0, got.stderr
    lines = got.stdout.splitlines()
    assert len(lines) == 5, got.stdout
    assert lines[0] == "verdict: CONFORMANT"
    assert lines[1].startswith("subject: reference-dp")
    assert lines[2].startswith("produced by: fakelet 0.1.0")
    assert "good signature by vendor@vendor.example" in lines[4]
    # Unsigned bundles verify too (their manifest), and say they are unsigned.
    assert fakelet(work, "bundle", str(out), "-o", "u.tar.gz").returncode == 0
    plain = fakelet(work, "verify", "u.tar.gz")
    assert plain.returncode == 0 and plain.stdout.splitlines()[4].endswith("unsigned")


def rewrite(bundle: Path, change: dict[str, bytes]) -> None:
    """The bundle with some files' contents replaced (as someone editing it after the fact would)."""
    with tarfile.open(bundle) as tar:
        files = {m.name: tar.extractfile(m).read() for m in tar if m.isfile()}  # type: ignore[union-attr]
    files.update({f"{TOP}/{k}": v for k, v in change.items()})
    with tarfile.open(bundle, "w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def test_a_tampered_file_is_named(work: Path) -> None:
    out = report_dir(work, report(check("DP-NODE-01", FAIL, detail="expected x")))
    assert fakelet(work, "bundle", str(out), "-o", "b.tar.gz").returncode == 0
    forged = json.loads((out / "report.json").read_text())
    forged["checks"][0]["verdict"] = PASS
    rewrite(work / "b.tar.gz", {"reports/report.json": json.dumps(forged).encode()})
    got = fakelet(work, "verify", "b.tar.gz")
    assert got.returncode == 1
    assert got.stderr.strip().splitlines() == [
        "fakelet: verify: MISMATCH: reports/report.json: its SHA-256 differs from the manifest's (changed after "
        "bundling)"]


def test_a_signed_manifest_rewritten_fails_the_signature(work: Path) -> None:
    key, allowed = keypair(work, "vendor")
    out = report_dir(work, report(check("DP-NODE-01", PASS)))
    assert fakelet(work, "bundle", str(out), "-o", "b.tar.gz", "--sign", str(key)).returncode == 0
    with tarfile.open(work / "b.tar.gz") as tar:
        manifest = tar.extractfile(f"{TOP}/{MANIFEST}").read()  # type: ignore[union-attr]
    # A forger who rehashes a changed file into the manifest still cannot re-sign it.
    extra = hashlib.sha256(b"").hexdigest().encode() + b"  reports/extra\n"
    rewrite(work / "b.tar.gz", {MANIFEST: manifest + extra, "reports/extra": b""})
    got = fakelet(work, "verify", "b.tar.gz", "--allowed-signers", str(allowed))
    assert got.returncode == 1 and "MANIFEST.sig" in got.stderr, got.stderr


def test_a_wrong_key_is_refused(work: Path) -> None:
    key, _ = keypair(work, "vendor")
    _, other = keypair(work, "someone-else")
    out = report_dir(work, report(check("DP-NODE-01", PASS)))
    assert fakelet(work, "bundle", str(out), "-o", "b.tar.gz", "--sign", str(key)).returncode == 0
    got = fakelet(work, "verify", "b.tar.gz", "--allowed-signers", str(other))
    assert got.returncode == 1
    assert got.stderr.strip() == f"fakelet: verify: MISMATCH: {SIGNATURE}: made by a key that {other} does not allow"


def test_an_unsigned_bundle_with_allowed_signers_fails(work: Path) -> None:
    _, allowed = keypair(work, "vendor")
    out = report_dir(work, report(check("DP-NODE-01", PASS)))
    assert fakelet(work, "bundle", str(out), "-o", "b.tar.gz").returncode == 0
    got = fakelet(work, "verify", "b.tar.gz", "--allowed-signers", str(allowed))
    assert got.returncode == 1 and "the bundle is unsigned" in got.stderr and len(got.stderr.splitlines()) == 1


@pytest.mark.parametrize(("make", "args", "message"), [
    (None, ["verify", "nope.tar.gz"], "nope.tar.gz: no such bundle"),
    ("garbage", ["verify", "bad.tar.gz"], "bad.tar.gz: not a fakelet bundle"),
    ("truncated", ["verify", "bad.tar.gz"], "bad.tar.gz: not a fakelet bundle"),
    (None, ["bundle", "no-such-dir"], "no-such-dir: no such report directory"),
    ("emptydir", ["bundle", "empty"], "empty: holds no report.json"),
    ("corrupt", ["bundle", "report"], "report.json: not a fakelet report.json"),
    ("report", ["bundle", "report", "--sign", "no-key"], "--sign no-key: no such key file"),
    ("report", ["bundle", "report", "-o", "report/inside.tar.gz"], "inside the report directory"),
    (None, ["compare", "a", "b"], "a: no such report directory"),
    ("report", ["verify", "report"], "report: not a file"),
])
def test_bad_input_is_one_line_and_leaves_nothing(work: Path, make: str | None, args: list[str],
                                                  message: str) -> None:
    if make == "garbage":
        (work / "bad.tar.gz").write_bytes(b"not a tar at all")
    elif make == "truncated":
        out = report_dir(work, report(check("DP-NODE-01", PASS)))
        assert fakelet(work, "bundle", str(out), "-o", "whole.tar.gz").returncode == 0
        (work / "bad.tar.gz").write_bytes((work / "whole.tar.gz").read_bytes()[:200])
    elif make == "emptydir":
        (work / "empty").mkdir()
    elif make == "corrupt":
        (work / "report").mkdir()
        (work / "report" / "report.json").write_text("{not json")
    elif make == "report":
        report_dir(work, report(check("DP-NODE-01", PASS)))
    before = sorted(p.name for p in work.iterdir())
    got = fakelet(work, *args)
    assert got.returncode == 2, got.stderr
    assert len(got.stderr.strip().splitlines()) == 1 and got.stderr.startswith("fakelet: error: ")
    assert message in got.stderr, got.stderr
    assert sorted(p.name for p in work.iterdir()) == before  # no half-written bundle, no temp directory


# -- compare ------------------------------------------------------------------------------------------------


def test_compare_says_each_kind_of_change() -> None:
    old = report(check("A-01", PASS), check("A-02", FAIL), check("A-03", NOT_EXERCISED), check("A-04", PASS),
                 findings=["kubelet.over_limit [pid 12]"])
    new = report(check("A-01", FAIL, detail="expected it to re-register\nmore"), check("A-02", PASS),
                 check("A-03", FAIL, detail="now fails"), check("A-04", PASS),
                 findings=["kubelet.over_limit [pid 99]", "process.orphan: left pid 7"])
    diffs = compare.diff([old], [new])
    assert compare.regressions(diffs) == ["A-01"]
    d = diffs[0]
    assert [c.check for c in d.of("improvement")] == ["A-02"]
    assert d.of("coverage")[0].text == "not exercised -> fail (now exercised): now fails"
    assert d.findings == ["process.orphan: left pid 7"]  # the same finding in another pid is not new
    text = compare.text(diffs, "old", "new")
    assert "REGRESSED: 1 check went from pass to fail: A-01" in text
    assert "pass -> fail: expected it to re-register" in text
    md = compare.markdown(diffs, "old", "new")
    assert md.startswith("### fakelet compare: :x: REGRESSED") and "| A-01 | pass -> fail" in md


def test_timing_without_repeats_uses_the_conservative_threshold() -> None:
    old = report(check("A-01", PASS, {"registration": 1.0}), check("A-02", PASS, {"registration": 1.0}))
    new = report(check("A-01", PASS, {"registration": 1.4}), check("A-02", PASS, {"registration": 2.5}))
    changes = compare.diff([old], [new])[0].of("timing")
    assert [c.check for c in changes] == ["A-02"]
    assert "noise unknown" in changes[0].text and "slower by 1.5s" in changes[0].text


def test_timing_with_repeats_uses_their_spread() -> None:
    def side(samples: list[float]) -> SubjectReport:
        return report(check("A-01", PASS, {"registration": samples[0]}, {"registration": samples}))

    quiet = compare.diff([side([1.0, 1.05, 1.1])], [side([1.3, 1.35, 1.4])])[0].of("timing")
    assert len(quiet) == 1 and "noise 0.1s" in quiet[0].text  # beyond a narrow spread, though under 0.5 s
    noisy = compare.diff([side([0.5, 1.0, 2.0])], [side([1.5, 2.0, 2.5])])[0].of("timing")
    assert noisy == []  # a 1 s move inside a 1.5 s spread is noise


def test_compare_cli_exit_codes_and_markdown(work: Path) -> None:
    old = report_dir(work / "o", report(check("A-01", PASS)))
    new = report_dir(work / "n", report(check("A-01", FAIL, detail="broke"), defect="no-reregister"))
    same = fakelet(work, "compare", str(old), str(old))
    assert same.returncode == 0 and "no regression" in same.stdout
    got = fakelet(work, "compare", str(old), str(new), "--format", "markdown")
    assert got.returncode == 1 and "| A-01 | pass -> fail: broke |" in got.stdout


# -- real runs ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def runs() -> Iterator[dict[str, Path]]:
    """The reference plugin, and its no-reregister mutant, on two checks under a short bound."""
    where = Path(tempfile.mkdtemp(prefix="fk-", dir="/tmp"))  # short: unix socket paths stay under 108 bytes
    try:
        def one(name: str, extra: list[str]) -> Path:
            got = fakelet(where, "run", "--subject", "reference-dp", *extra, "--check", "DP-NODE-01", "--check",
                          "DP-RST-01", "--reaction-bound", "5", "--out", str(where / name), timeout=RUN_TIMEOUT_S)
            assert got.returncode == (1 if extra else 0), got.stdout[-2000:] + got.stderr[-2000:]
            return where / name

        # Side by side: each run mostly waits out its bounds.
        with ThreadPoolExecutor(2) as pool:
            ref = pool.submit(one, "ref", [])
            mutant = pool.submit(one, "mutant", ["--defect", "no-reregister"])
            out = {"ref": ref.result(), "mutant": mutant.result()}
        yield out
    finally:
        shutil.rmtree(where, ignore_errors=True)


def test_real_runs_carry_provenance(runs: dict[str, Path]) -> None:
    prov = json.loads((runs["ref"] / "report.json").read_text())["provenance"]
    assert prov["fakelet"]["version"] and len(prov["catalog"]["sha256"]) == 64
    assert prov["subject"]["name"] == "reference-dp" and prov["kubelet"] == {"node": "fake", "model": "1.36"}
    assert prov["hardware"]["skin"] == "neutral" and len(prov["hardware"]["sha256"]) == 64
    assert prov["host"]["cpus"] == os.cpu_count() and len(prov["host"]["load_end"]) == 3
    assert "DP-NODE-01" in prov["near_bound"]["judged"]
    assert "produced by: fakelet" in (runs["ref"] / "summary.md").read_text()


def test_compare_of_a_reference_and_a_mutant_run_names_the_regression(runs: dict[str, Path], tmp_path: Path) -> None:
    got = fakelet(tmp_path, "compare", str(runs["ref"]), str(runs["mutant"]))
    assert got.returncode == 1, got.stdout + got.stderr
    assert "REGRESSED: 1 check went from pass to fail: DP-RST-01" in got.stdout
    assert fakelet(tmp_path, "bundle", str(runs["ref"]), "-o", "ref.tar.gz").returncode == 0
    # A bundle on one side and a directory on the other: the same answer.
    again = fakelet(tmp_path, "compare", "ref.tar.gz", str(runs["mutant"]), "--format", "markdown")
    assert again.returncode == 1 and "| DP-RST-01 | pass -> fail" in again.stdout
    verified = fakelet(tmp_path, "verify", "ref.tar.gz")
    assert verified.returncode == 0 and verified.stdout.startswith("verdict: CONFORMANT")


def test_repeats_merge_into_one_report_with_samples() -> None:
    runs = [report(check("A-01", PASS, {"registration": t}), check("A-02", v)) for t, v in
            ((1.0, PASS), (3.0, FAIL), (2.0, PASS))]
    merged = compare.merge_repeats(runs)
    a1, a2 = merged.checks
    assert a1.measured == {"registration": 2.0} and a1.samples == {"registration": [1.0, 3.0, 2.0]}
    assert a2.verdict == FAIL and "verdicts across 3 runs: fail x1, pass x2" in a2.notes


def test_run_repeat_keeps_every_runs_time(tmp: Path) -> None:
    got = fakelet(tmp, "run", "--subject", "reference-dp", "--check", "DP-NODE-01", "--repeat", "2",
                  "--reaction-bound", "5", "--out", str(tmp / "rep"), timeout=RUN_TIMEOUT_S)
    assert got.returncode == 0, got.stdout[-2000:] + got.stderr[-2000:]
    [node] = json.loads((tmp / "rep" / "report.json").read_text())["checks"]
    assert len(node["samples"]["registration"]) == 2
    assert (tmp / "rep" / "runs" / "2" / "report.json").is_file()
    bad = fakelet(tmp, "run", "--subject", "reference-dp", "--repeat", "0")
    assert bad.returncode == 2 and "--repeat 0: must be between 1 and 100" in bad.stderr


# -- compare: evidence, repro, load (issue 37) -----------------------------------------------------------------


def test_a_regression_carries_its_bounded_evidence_and_repro() -> None:
    seen = "\n".join(f"  {n / 10:.1f}s event {n}" for n in range(60))
    detail = f"expected re-registration within 5s; saw instead (times since the check started):\n{seen}"
    new = report(check("A-01", FAIL, detail=detail))
    new.checks[0].repro = "fakelet run --subject reference-dp --check A-01"
    diffs = compare.diff([report(check("A-01", PASS))], [new])
    md = compare.markdown(diffs, "old", "new")
    assert "<details><summary><code>A-01</code>" in md and "```text" in md
    assert "  3.8s event 38" in md and "  3.9s event 39" not in md  # 40 lines: the first, then 39 events
    assert "... 21 more lines" in md
    assert "```sh\nfakelet run --subject reference-dp --check A-01\n```" in md
    text = compare.text(diffs, "old", "new")
    assert "  3.8s event 38" in text and "... 21 more lines" in text
    assert "repro: fakelet run --subject reference-dp --check A-01" in text
    assert text.count("load 0.50 -> 0.70 on 2 CPUs") == 2 and md.count("load 0.50 -> 0.70 on 2 CPUs") == 2


def test_evidence_is_bounded_in_bytes_and_fenced_past_its_backticks() -> None:
    assert len(compare.bounded("x" * 10_000).encode()) < compare.EVIDENCE_BYTES + 100
    assert compare.fence("a ```` b", "text")[0] == "`````text"
    diffs = compare.diff([report(*(check(f"A-{n:02}", PASS) for n in range(12)))],
                         [report(*(check(f"A-{n:02}", FAIL, detail="broke") for n in range(12)))])
    md = compare.markdown(diffs, "old", "new")
    assert md.count("<details>") == compare.MAX_EVIDENCE
    assert "Evidence of 2 more failing check(s) left to NEW's report: A-10, A-11" in md


def test_a_slower_time_under_a_much_higher_load_says_both_loads() -> None:
    old = report(check("A-01", PASS, {"registration": 1.0}))
    new = report(check("A-01", PASS, {"registration": 2.5}))
    old.provenance["host"].update(load_start=[3.0, 0, 0], load_end=[3.0, 0, 0])
    new.provenance["host"].update(load_start=[25.0, 0, 0], load_end=[24.0, 0, 0])
    [slower] = compare.diff([old], [new])[0].of("timing")
    assert "noise unknown" in slower.text
    assert "OLD load 3.00 -> 3.00 on 2 CPUs, NEW load 25.00 -> 24.00 on 2 CPUs: the loads differ greatly" in slower.text
    quiet = report(check("A-01", PASS, {"registration": 2.5}))
    [same_load] = compare.diff([report(check("A-01", PASS, {"registration": 1.0}))], [quiet])[0].of("timing")
    assert "OLD load 0.50" in same_load.text and "differ greatly" not in same_load.text


# -- provenance pins the code (issue 37) ------------------------------------------------------------------------


@pytest.mark.parametrize(("kind", "args", "want"), [
    ("python", ["-u", "-X", "dev", "my_plugin.py", "--flag"], ("script", "my_plugin.py")),
    ("python", ["-m", "pkg.mod", "x.py"], ("module", "pkg.mod")),
    ("python", ["-c", "print(1)"], ("inline", "-c")),
    ("shell", ["-e", "-o", "pipefail", "run.sh"], ("script", "run.sh")),
    ("node", ["--require", "x.js", "server.js"], ("script", "server.js")),
    ("python", ["-"], None),
])
def test_the_script_an_interpreter_runs_is_found(kind: str, args: list[str], want: tuple[str, str] | None) -> None:
    from harness.run.subject_code import script_of

    assert script_of(kind, args) == want


def test_host_paths_are_anchored_never_raw(tmp_path: Path) -> None:
    from reports.provenance import host_path, redact_paths

    where = [("<subject-dir>", str(tmp_path / "vendor")), ("<cwd>", str(tmp_path))]
    assert host_path(tmp_path / "vendor" / "my_plugin.py", where) == "<subject-dir>/my_plugin.py"
    assert host_path(tmp_path / "other" / "x.py", where) == "<cwd>/other/x.py"
    assert host_path(os.path.expanduser("~/p/x.py"), []) == "~/p/x.py"
    assert host_path("/usr/bin/bash", []) == "/usr/bin/bash"
    assert host_path("/srv/ci-runner-7/work/plugin", []) == "<host>/.../plugin"
    assert redact_paths(f"bash {tmp_path}/vendor/run.sh --x", where) == "bash <subject-dir>/run.sh --x"


def test_a_python_plugins_script_and_distributions_are_pinned(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from harness.config.runconfig import RunConfig
    from harness.run.provenance import subject_facts

    vendor = tmp_path / "vendor"
    vendor.mkdir()
    (vendor / "my_plugin.py").write_text("print('a plugin')\n")
    subject = vendor / "plugin.yaml"
    subject.write_text('name: my-plugin\nkind: device-plugin\nlauncher: process\n'
                       'command: ["{python}", "my_plugin.py", "--plugin-dir", "{plugin_dir}"]\n'
                       'resource: example.com/gpu\n')
    monkeypatch.chdir(vendor)  # the plugin runs in fakelet's working directory: its script is found there
    facts = subject_facts(RunConfig.build(subject_file=str(subject)))
    program, script = facts["code"]
    assert program["role"] == "program" and len(program["sha256"]) == 64
    assert script == {"role": "script", "path": "<subject-dir>/my_plugin.py",
                      "sha256": hashlib.sha256(b"print('a plugin')\n").hexdigest()}
    assert facts["subject_file"] == "<subject-dir>/plugin.yaml"
    assert any(d.startswith("pytest==") for d in facts["python_distributions"])
    assert str(tmp_path) not in json.dumps(facts)


def test_a_module_run_with_dash_m_is_pinned_by_its_source_file() -> None:
    from harness.config.runconfig import RunConfig
    from harness.run.provenance import subject_facts

    facts = subject_facts(RunConfig.build(subject="reference-dp"))
    [module] = [c for c in facts["code"] if c["role"] == "module"]
    assert module["path"].endswith("harness/reference/device_plugin.py") and len(module["sha256"]) == 64
    assert not module["path"].startswith("/")


def test_a_huge_file_is_recorded_by_size_and_mtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from harness.run import subject_code

    big = tmp_path / "plugin.bin"
    big.write_bytes(b"x" * 2048)
    monkeypatch.setattr(subject_code, "HASH_LIMIT_BYTES", 1024)
    record = subject_code.file_record("program", str(big), [("<cwd>", str(tmp_path))])
    assert record["size"] == 2048 and "sha256" not in record and "not hashed" in record["note"]
    assert record["path"] == "<cwd>/plugin.bin"
    assert "directory" in subject_code.file_record("script", str(tmp_path), [])["note"]


def test_an_images_id_and_registry_digests_are_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    from harness.launch.containers import engine
    from harness.run.provenance import image_facts

    image = SimpleNamespace(id="sha256:" + "1" * 64, attrs={"RepoDigests": ["reg.example/p@sha256:" + "2" * 64]})
    monkeypatch.setattr(engine, "unavailable", lambda: None)
    monkeypatch.setattr(engine, "client", lambda: SimpleNamespace(images=SimpleNamespace(get=lambda ref: image)))
    assert image_facts("reg.example/p:1") == {"image_id": image.id, "image_digests": image.attrs["RepoDigests"]}
    monkeypatch.setattr(engine, "unavailable", lambda: "no engine")
    assert image_facts("reg.example/p:1") == {"image_id": None}


def test_a_shell_script_and_its_interpreter_on_path_are_pinned(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from harness.config.runconfig import RunConfig
    from harness.run.subject_code import pin

    (tmp_path / "run.sh").write_text("exec true\n")
    monkeypatch.chdir(tmp_path)
    run = RunConfig.build(plugin_cmd="bash run.sh --plugin-dir {plugin_dir}", resource="example.com/x")
    program, script = pin(run, None)["code"]
    bash = shutil.which("bash")
    assert bash is not None and program["sha256"] == hashlib.sha256(Path(bash).read_bytes()).hexdigest()
    assert script == {"role": "script", "path": "<cwd>/run.sh",
                      "sha256": hashlib.sha256(b"exec true\n").hexdigest()}
    assert "python_distributions" not in pin(run, None)
