"""The `fakelet` command: run conformance checks, list subjects.

    fakelet run                                  # every bundled reference subject, fast profile
    fakelet run --subject NAME [--defect D] [--profile fast|upstream] [--check ID ...] [--seed N] [--out DIR]
    fakelet run --plugin-cmd "CMD ..." --resource example.com/foo [--mount-namespace]
    fakelet run --plugin-cmd "CMD ..." --kind dra --driver gpu.example.com [--kubelet-version 1.32|...|newest]
                [--control-plane local|kubeconfig:PATH|none]
    fakelet subjects

Each subject runs in its own pytest process over the `suites` package with
the fakelet plugin, so the CLI and `pytest --fakelet-*` share one code path.
Exit code: 0 when every MUST check of every subject passed, 1 when one did
not, 2 on bad input or a harness error.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from fake_devices.cli import main as devices_main
from harness.checks import catalog
from harness.controlplane import ControlPlane, ControlPlaneUnavailable, open_control_plane
from harness.kubelet.versions import DEFAULT_KUBELET_VERSION, KUBELET_VERSIONS
from harness.profiles import PROFILES
from harness.runconfig import SHARED_CONTROL_PLANE_ENV, UNAVAILABLE, RunConfig
from harness.session import Session
from harness.subjects import ProfileError, all_subjects
from reports.model import CONFORMANT, EXIT_CODES, SubjectReport, run_status
from reports.writers import write_all

EXIT_OK, EXIT_NONCONFORMANT, EXIT_USAGE = 0, 1, 2
SUITES = {"device-plugin": "suites.dp", "dra": "suites.dra"}


class UsageError(Exception):
    pass


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fakelet", description="Conformance and fault-injection harness "
                                     "for Kubernetes device plugins and DRA drivers.")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run conformance checks and write reports")
    run.add_argument("--subject", action="append", default=[], metavar="NAME",
                     help="subject profile to run (repeatable); default: every bundled reference subject")
    run.add_argument("--defect", help="run the subject as a mutant with this named defect")
    run.add_argument("--profile", default="fast", choices=sorted(PROFILES), help="timing profile (default fast)")
    run.add_argument("--check", action="append", default=[], metavar="ID", help="run only this check (repeatable)")
    run.add_argument("--seed", type=int, default=0, help="seed for fault schedules (default 0)")
    run.add_argument("--out", default="fakelet-report", help="report directory (default ./fakelet-report)")
    run.add_argument("--plugin-cmd", help="launch this device plugin command instead of a named subject")
    run.add_argument("--resource", help="the resource name the --plugin-cmd plugin registers")
    run.add_argument("--mount-namespace", action="store_true",
                     help="run --plugin-cmd in a private mount namespace over /var/lib/kubelet/device-plugins")
    run.add_argument("--binary", help="prebuilt binary for a subject whose profile builds one")
    run.add_argument("--kind", default="device-plugin", choices=sorted(SUITES),
                     help="what --plugin-cmd launches (default device-plugin)")
    run.add_argument("--driver", help="the DRA driver name of a --kind dra --plugin-cmd driver")
    run.add_argument("--kubelet-version", default="default", metavar="VERSION",
                     help=f"kubelet to imitate for DRA: {', '.join(KUBELET_VERSIONS)} or newest (default "
                          f"{DEFAULT_KUBELET_VERSION}); it decides which DRA and health versions are negotiated")
    run.add_argument("--control-plane", default="local", metavar="SPEC",
                     help="API server for DRA: local (starts kube-apiserver + etcd once for the run), "
                          "kubeconfig:PATH (an existing cluster), or none (checks that need one skip)")
    run.add_argument("-j", "--jobs", type=int, default=2,
                     help="checks run in parallel, each in its own sandbox (default 2; 1 for strictly serial)")
    run.add_argument("-v", "--verbose", action="store_true", help="show pytest's own output")
    up = sub.add_parser("up", help="run one live session (kubelet, subject, fake devices) until Ctrl-C")
    up.add_argument("--subject", default="reference-dp", help="subject profile (default reference-dp)")
    up.add_argument("--defect", help="run the subject as a mutant with this named defect")
    up.add_argument("--profile", default="fast", choices=sorted(PROFILES), help="timing profile (default fast)")
    up.add_argument("--seed", type=int, default=0)
    up.add_argument("--kubelet-version", default="default", metavar="VERSION", help="kubelet to imitate (DRA)")
    up.add_argument("--control-plane", default="local", metavar="SPEC",
                    help="API server for a DRA subject: local, kubeconfig:PATH or none")
    up.add_argument("--out", help="keep the session's timeline and subject log here")
    up.add_argument("--for", dest="duration", type=float, metavar="SECONDS", help="stop by itself after this long")
    devices = sub.add_parser("devices", add_help=False,
                             help="control a running session's fake devices (fakelet devices --help)")
    devices.add_argument("args", nargs=argparse.REMAINDER)
    sub.add_parser("subjects", help="list the known subjects and their defects")
    sub.add_parser("checks", help="list the conformance checks")
    return parser


def check_ids(args: argparse.Namespace, kinds: set[str]) -> None:
    known: dict[str, tuple[str, str]] = {}
    for kind in kinds:
        known.update(catalog(SUITES[kind]))
    unknown = sorted(set(args.check) - set(known))
    if unknown:
        raise UsageError(f"unknown check ID(s) {', '.join(unknown)}; known: {', '.join(known)}")


def configs(args: argparse.Namespace) -> list[RunConfig]:
    """Validate every flag before anything starts, so bad input fails fast and leaves nothing."""
    if args.defect and len(args.subject) > 1:
        raise UsageError("--defect applies to one --subject")
    if args.jobs < 1:
        raise UsageError("--jobs must be at least 1")
    if args.plugin_cmd and args.subject:
        raise UsageError("give either --subject or --plugin-cmd, not both")
    if args.driver and args.kind != "dra":
        raise UsageError("--driver is for --kind dra; a device plugin takes --resource")
    if args.kind == "dra" and args.resource:
        raise UsageError("a --kind dra driver takes --driver, not --resource")
    if args.plugin_cmd:
        names: list[str | None] = [None]
    elif args.subject:
        names = list(args.subject)
    else:
        names = [s.name for s in all_subjects() if s.reference]
        if args.defect:
            # `--defect D` alone: the reference subject(s) that have that defect.
            having = [s.name for s in all_subjects() if s.reference and args.defect in s.defects]
            names = having or names[:1]  # none: let RunConfig say which defects exist
    runs = [RunConfig.build(subject=name, defect=args.defect, profile=args.profile, seed=args.seed,
                            checks=args.check, out=args.out, plugin_cmd=args.plugin_cmd,
                            resource=args.resource or args.driver,
                            mount_namespace=args.mount_namespace, binary=args.binary, kind=args.kind,
                            kubelet_version=args.kubelet_version, control_plane=args.control_plane)
            for name in names]
    check_ids(args, {r.spec.kind for r in runs})
    if args.check:
        # `--check DP-...` over every reference subject runs only the subjects those checks are for.
        runs = [r for r in runs if set(args.check) & set(catalog(SUITES[r.spec.kind]))]
    return runs


def pytest_argv(args: argparse.Namespace, run: RunConfig, out: Path) -> list[str]:
    argv = [sys.executable, "-m", "pytest", "--pyargs", SUITES[run.spec.kind], "-p", "no:cacheprovider",
            "--no-header", "-q" if args.verbose else "-qq", "--tb=short" if args.verbose else "--tb=no",
            "--fakelet-profile", run.profile.name, "--fakelet-seed", str(run.seed), "--fakelet-out", str(out)]
    if args.plugin_cmd:
        argv += ["--fakelet-plugin-cmd", args.plugin_cmd, "--fakelet-kind", args.kind]
        argv += ["--fakelet-driver", args.driver] if args.kind == "dra" else ["--fakelet-resource", args.resource]
        if args.mount_namespace:
            argv.append("--fakelet-mount-namespace")
    else:
        argv += ["--fakelet-subject", run.spec.name]
    if run.defect:
        argv += ["--fakelet-defect", run.defect]
    if run.spec.is_dra:
        argv += ["--fakelet-kubelet-version", run.kubelet_version.name, "--fakelet-control-plane", run.control_plane]
    if args.binary:
        argv += ["--fakelet-binary", args.binary]
    if args.jobs > 1:
        argv += ["-p", "xdist", "-n", str(args.jobs)]
    for check_id in run.checks:
        argv += ["--fakelet-check", check_id]
    return argv


def run_one(args: argparse.Namespace, run: RunConfig, out: Path) -> SubjectReport:
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").unlink(missing_ok=True)
    stdout = None if args.verbose else subprocess.DEVNULL
    # pytest's own temp root (xdist makes one) must not outlive the run either.
    basetemp = tempfile.mkdtemp(prefix="fakelet-pytest-")
    proc = subprocess.Popen([*pytest_argv(args, run, out), "--basetemp", basetemp], stdout=stdout)
    try:
        code = proc.wait()
    except KeyboardInterrupt:
        # The child got the same SIGINT and is tearing its checks down; let it finish.
        proc.wait()
        raise
    finally:
        shutil.rmtree(basetemp, ignore_errors=True)
    if code not in (0, 1) or not (out / "report.json").exists():
        raise RuntimeError(f"the check run for {run.spec.name} ended with pytest exit code {code} and no report; "
                           f"rerun with -v to see its output")
    return SubjectReport.from_dict(json.loads((out / "report.json").read_text()))


def counts(s: dict) -> str:
    return (f"{s['pass']} pass, {s['fail']} fail, {s['not-exercised']} not exercised, {s['n/a']} n/a, "
            f"{s['skip']} skip, {s['error']} error")


def print_report(report: SubjectReport) -> None:
    s = report.summary()
    name = report.subject + (f" [defect {report.defect}]" if report.defect else "")
    if report.kind == "dra":
        name += " (" + ", ".join(f"{k} {v}" for k, v in report.api_versions.items()) + ")"
    print(f"\n{name}: {counts(s)} ({report.duration_s:.1f}s, profile {report.profile}, seed {report.seed})")
    for c in report.checks:
        first = (c.detail.splitlines() or [""])[0]
        print(f"  {c.verdict.upper():13} {c.id:10} {c.level:6} {first[:110]}")
        for note in c.notes:
            if note.startswith("slow"):
                print(f"  {'':13} {'':10} {'':6} {note[:110]}")
        if c.verdict in ("fail", "error"):
            print(f"        reproduce: {c.repro}")
    for finding in report.findings:
        print(f"  finding: {finding}")
    for hint in report.install_hints():
        print(f"  to run what was skipped, install: {hint}")
    print(f"  => {report.coverage_line()}")


def write_index(reports: list[SubjectReport], out: Path) -> None:
    status = run_status(reports)
    index = {"schema_version": reports[0].schema_version if reports else "1",
             "runs": [r.to_dict() for r in reports],
             "summary": {"subjects": len(reports), "status": status, "conformant": status == CONFORMANT}}
    (out / "report.json").write_text(json.dumps(index, indent=2) + "\n")
    lines = ["# fakelet conformance", "", f"**{status}**", "",
             "| subject | pass | fail | not exercised | n/a | skip | error | verdict |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in reports:
        s = r.summary()
        lines.append(f"| [{r.subject}]({r.subject}/summary.md) | {s['pass']} | {s['fail']} | {s['not-exercised']} | "
                     f"{s['n/a']} | {s['skip']} | {s['error']} | {r.coverage_line()} |")
    (out / "summary.md").write_text("\n".join(lines) + "\n")


def shared_control_plane(runs: list[RunConfig]) -> ControlPlane | None:
    """Start one local API server for every DRA run, instead of one per check process."""
    if not any(r.spec.is_dra and r.control_plane == "local" for r in runs):
        return None
    try:
        plane = open_control_plane("local").start()
    except ControlPlaneUnavailable as err:
        print(f"fakelet: no local API server ({err}); DRA checks that need one will skip", file=sys.stderr)
        spec = UNAVAILABLE + str(err)
        plane = None
    else:
        spec = f"kubeconfig:{plane.kubeconfig}"
    # The check processes find it through the environment, so their repro lines still say "local".
    os.environ[SHARED_CONTROL_PLANE_ENV] = spec
    return plane


def cmd_run(args: argparse.Namespace) -> int:
    runs = configs(args)
    if not runs:
        raise UsageError("no subjects to run")
    out = Path(args.out)
    reports = []
    plane = shared_control_plane(runs)
    try:
        for run in runs:
            target = out if len(runs) == 1 else out / run.spec.name
            reports.append(run_one(args, run, target))
            print_report(reports[-1])
    finally:
        os.environ.pop(SHARED_CONTROL_PLANE_ENV, None)
        if plane is not None:
            plane.stop()
    if len(runs) > 1:
        write_index(reports, out)
    else:
        write_all(reports[0], out)
    status = run_status(reports)
    if len(reports) > 1:
        print(f"\nrun: {status}")
    print(f"\nreports: {out}/")
    return EXIT_CODES[status]


def cmd_subjects() -> int:
    for spec in all_subjects():
        tag = " (reference)" if spec.reference else ""
        print(f"{spec.name}{tag}: {spec.kind}, {spec.launcher} launcher, resource {spec.resource}")
        if spec.description:
            print(f"  {spec.description}")
        for d in spec.defects.values():
            print(f"  --defect {d.name:24} fails {', '.join(d.kills)}")
    return EXIT_OK


def cmd_up(args: argparse.Namespace) -> int:
    if args.duration is not None and args.duration <= 0:
        raise UsageError("--for must be positive")
    run = RunConfig.build(subject=args.subject, defect=args.defect, profile=args.profile, seed=args.seed,
                          out=args.out, kubelet_version=args.kubelet_version, control_plane=args.control_plane)
    session = Session(run, sys.stdout)
    try:
        session.start()
        sock = session.control_socket
        print(f"session up: subject {run.spec.name}, sandbox {session.env.sandbox.path if session.env else ''}")
        if sock is not None:
            print(f"control socket: {sock}\nexport FAKELET_CONTROL_SOCKET={sock}   # then: fakelet devices fail ID",
                  flush=True)
        session.wait(args.duration)
    finally:
        session.close()
    return EXIT_OK


def cmd_checks() -> int:
    for kind, package in SUITES.items():
        for check_id, (level, title) in catalog(package).items():
            print(f"{check_id:10} {level:6} {kind:13} {title}")
    return EXIT_OK


def _term_to_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["devices"]:
        # Its own parser: options after `devices` belong to it, not to ours.
        return devices_main(argv[1:])
    args = build_parser().parse_args(argv)
    signal.signal(signal.SIGTERM, _term_to_interrupt)
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    try:
        if args.command == "subjects":
            return cmd_subjects()
        if args.command == "checks":
            return cmd_checks()
        if args.command == "up":
            return cmd_up(args)
        return cmd_run(args)
    except (UsageError, ProfileError, ValueError) as err:
        print(f"fakelet: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    except RuntimeError as err:
        print(f"fakelet: harness error: {err}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as err:
        print(f"fakelet: error: {err.strerror or err}: {err.filename or ''}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("fakelet: interrupted; subjects stopped and sandboxes removed", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
