"""The `fakelet` command: run conformance checks, list subjects.

    fakelet run                                  # every bundled reference subject, fast profile
    fakelet run --subject NAME [--defect D] [--profile fast|upstream] [--check ID ...] [--seed N] [--out DIR]
    fakelet run --subject-file my-plugin.yaml    # a subject profile of your own (schema: fixtures/subjects)
    fakelet run --plugin-cmd "CMD ..." --resource example.com/foo [--mount-namespace]
    fakelet run --plugin-cmd "CMD ..." --kind dra --driver gpu.example.com [--kubelet-version 1.32|...|newest]
                [--control-plane local|kubeconfig:PATH|none]
      one-off changes to any of them: [--inventory PATH_OR_NAME] [--skin neutral|drm|nvml|drm+nvml]
                [--env KEY=VALUE ...] [--pass-env NAME ...] [--private-dir PATH ...] [--device-ids opaque|inventory]
                [--observes health,temperature,hotplug]
    fakelet up [the same subject flags] [--for SECONDS]
    fakelet subjects

Every flag is validated (RunConfig.build) before anything starts. Each
subject then runs in its own pytest process over the `suites` package with
the fakelet plugin, which gets the whole validated run as one file
(`--fakelet-config`, removed after the run), so nothing is parsed twice.
Exit code: 0 when every MUST check of every subject passed, 1 when one did
not, 2 on bad input or a harness error.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from harness.config.runconfig import SHARED_CONTROL_PLANE_ENV, UNAVAILABLE, Image, Overrides, RunConfig, parse_observes
from harness.instruments.userinput import check_number, escape_controls, oneline, subject_name
from harness.kubelet.versions import DEFAULT_KUBELET_VERSION, FLOOR, KUBELET_VERSIONS
from harness.launch.containers.engine import sweep as sweep_containers
from harness.launch.owners import OWNER_FILE, owned_dir, remove_owned
from harness.launch.owners import PREFIX as OWNED_PREFIX
from harness.launch.process import die_with_parent
from harness.launch.reaper import reap
from harness.node.real import runtime as node_runtime
from harness.run import certify, explorecli, fidelity, matrix, scheduler, shards, subjectcli
from harness.run import doctor as doctorcli
from harness.run import prebuild as prebuildcli
from harness.run.no_verdict import interrupted_reports, nothing_ran
from harness.run.stopping import StopSignals
from harness.run.version import VersionAction
from harness.spec.checks import NAMED_SUITES, SUITES, catalog
from harness.spec.profiles import PROFILES
from harness.spec.subjects import DEVICE_IDS, SKINS, ProfileError, all_subjects
from reports.model import EXIT_CODES, INTERRUPTED, NOT_CONFORMANT, SubjectReport, run_status
from reports.stepsummary import append_step_summary
from reports.terminal import report_lines
from reports.writers import write_all, write_index

# What only some commands use is imported in the function that uses it: harness.controlplane (lightkube),
# harness.node.real.localnode and the sessions (grpc, the kubelets), the scenarios and provenance took seconds
# to import, and every command (its --help, a typo's error, a bad flag value) paid for them before it could say
# a word (tests/test_cli_startup.py holds them out).
if TYPE_CHECKING:
    from harness.controlplane import ControlPlane
    from harness.run.session import Session
    from harness.run.sharedplane import BackgroundPlane
    from harness.scenarios.schema import Scenario

EXIT_OK, EXIT_NONCONFORMANT, EXIT_USAGE = 0, 1, 2


class UsageError(Exception):
    def __str__(self) -> str:
        return escape_controls(super().__str__())  # one line, whatever the user typed


class _OneLineParser(argparse.ArgumentParser):
    """argparse's errors as every other usage error: one line, exit 2 (its usage block is --help's job)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {escape_controls(message)} (see {self.prog} --help)\n")


def _add_subject_flags(p: argparse.ArgumentParser, *, many: bool) -> None:
    """Which plugin to run: a bundled subject, a subject file of the user's own, or a command line."""
    if many:
        p.add_argument("--subject", action="append", default=[], metavar="NAME", type=subject_name,
                       help="subject profile to run (repeatable); default: every bundled reference subject")
    else:
        p.add_argument("--subject", metavar="NAME", type=subject_name, help="subject profile (default reference-dp)")
    p.add_argument("--subject-file", metavar="PATH",
                   help="a subject profile YAML of your own (the schema of fixtures/subjects/*.yaml)")
    p.add_argument("--defect", help="run the subject as a mutant with this named defect (a reference subject's "
                                    "mutants compose: a+b)")
    p.add_argument("--plugin-cmd", help="launch this plugin command instead of a named subject")
    p.add_argument("--resource", help="the resource name the --plugin-cmd plugin registers")
    p.add_argument("--kind", choices=sorted(SUITES), help="what --plugin-cmd launches (default device-plugin)")
    p.add_argument("--driver", help="the DRA driver name of a --kind dra --plugin-cmd driver")
    p.add_argument("--mount-namespace", action="store_true",
                   help="run --plugin-cmd in a private mount namespace over /var/lib/kubelet/device-plugins")
    p.add_argument("--binary", help="prebuilt binary for the subject's {bin}")
    p.add_argument("--image", metavar="IMAGE[:TAG]",
                   help="run the plugin from this container image, as its DaemonSet would (alone, with "
                        "--resource or --kind dra --driver; with --subject/--subject-file, that subject's image)")
    p.add_argument("--image-arg", action="append", default=None, metavar="ARG",
                   help="an argument for the --image entrypoint (repeatable; default: the subject's command "
                        "less its {bin}); a template like --env")
    p.add_argument("--privileged", action="store_true", help="run the --image container privileged")


def _add_one_off_flags(p: argparse.ArgumentParser) -> None:
    """Changes to the subject for this run only, whichever way it was chosen."""
    p.add_argument("--inventory", metavar="PATH_OR_NAME",
                   help="fake hardware for the plugin: an inventory YAML, or a bundled one by name (basic, gpus-seed7)")
    p.add_argument("--skin", choices=list(SKINS),
                   help="sysfs layout of the fake hardware (default neutral; alone it implies --inventory basic)")
    p.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                   help="set KEY in the plugin's environment; VALUE is a template (repeatable)")
    p.add_argument("--pass-env", action="append", default=[], metavar="NAME",
                   help="copy NAME from fakelet's environment into the plugin's (repeatable)")
    p.add_argument("--private-dir", action="append", default=[], metavar="PATH",
                   help="give a mount-namespace plugin a private, empty copy of this host directory (repeatable)")
    p.add_argument("--device-ids", choices=list(DEVICE_IDS),
                   help="inventory: the plugin lists the inventory's device IDs; opaque: its own names (by count)")
    p.add_argument("--observes", action="append", default=[], metavar="LIST",
                   help="fake-hardware changes the plugin reacts to: health,temperature,hotplug (default none "
                        "for --plugin-cmd)")
    p.add_argument("--thermal-threshold", type=float, metavar="C",
                   help="the plugin's own overtemperature limit in degrees C (default: the subject file's "
                        "backend.thermal, else 85); health checks heat past it")


def _add_world_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile", default="fast", choices=sorted(PROFILES), help="timing profile (default fast)")
    p.add_argument("--seed", type=int, default=0, help="seed for fault schedules (default 0)")
    p.add_argument("--kubelet-version", default="default", metavar="VERSION",
                   help=f"kubelet release the fake kubelet imitates: {', '.join(KUBELET_VERSIONS)} or newest (default "
                        f"{DEFAULT_KUBELET_VERSION}); it decides the DRA and health versions negotiated, and the "
                        "release's known behaviours (1.37: device-plugin clients per socket, re-prepare resets "
                        f"devices). --node real builds any release from {FLOOR} on that the Go module proxy "
                        "serves: a minor (its newest patch) or a patch (1.35.4)")
    p.add_argument("--control-plane", default="local", metavar="SPEC",
                   help="API server for DRA: local (kube-apiserver + etcd), kubeconfig:PATH (an existing "
                        "cluster), or none (checks that need one skip)")


MAX_REPEAT = 100  # more runs than this is a soak, not a reproduction
SCENARIO_COMMANDS = ("list", "show", "run", "check", "vocabulary", "-h", "--help")
MUTANT_BOUND_S = 6.0  # fidelity: the real kubelet reacts within its 1 s node-status period (plus the 1 s hold)
MAX_TOLERATION_S = 3600  # a story longer than an hour is a soak, not a reproduction
MAX_SESSION_S = 7 * 24 * 3600.0  # `up --for`: a week; longer is "until Ctrl-C", which is the default


def build_parser() -> argparse.ArgumentParser:
    parser = _OneLineParser(prog="fakelet", description="Conformance and fault-injection harness "
                                     "for Kubernetes device plugins and DRA drivers.")
    parser.add_argument("--version", action=VersionAction, help="print fakelet's version, commit and check "
                                                                 "catalog digest, and exit")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run conformance checks and write reports")
    _add_subject_flags(run, many=True)
    _add_one_off_flags(run)
    _add_world_flags(run)
    run.add_argument("--check", action="append", default=[], metavar="ID", help="run only this check (repeatable)")
    run.add_argument("--out", default="fakelet-report", help="report directory (default ./fakelet-report)")
    run.add_argument("-j", "--jobs", type=jobs_value, default=AUTO_JOBS, metavar="N|auto",
                     help=f"checks run in parallel, each in its own sandbox (default auto: enough that the longest "
                          f"check bounds the run, longest first; at most {max_jobs()}; 1 for strictly serial)")
    run.add_argument("-v", "--verbose", action="store_true", help="show pytest's own output")
    run.add_argument("--require", action="append", default=[], metavar="ID|AREA",
                     help="a check ID or area (DP-HLT) that must be exercised: not exercised fails the run")
    run.add_argument("--node", default="fake", choices=["fake", "real"],
                     help="whose kubelet the checks run on: fake (fakelet's own, default) or real (kubelet v1.36 "
                          "built from the Go module proxy, with containerd, in a private namespace; root only)")
    run.add_argument("--cluster", metavar="kind|kubeconfig:PATH",
                     help="kind: deploy the --image as a DaemonSet on a kind cluster (pytest-kind) and run the checks "
                          "a real cluster can judge (DP-NODE-01/02), one check at a time; kubeconfig:PATH: a live "
                          "cluster where the DRA driver is installed, for --suite kep5970 with --driver and "
                          "--device-class (fakelet deploys nothing there)")
    run.add_argument("--device-class", metavar="CLASS",
                     help="the installed driver's DeviceClass (--cluster kubeconfig:PATH --suite kep5970)")
    run.add_argument("--kind-image", metavar="IMAGE", help="the kind node image (default: kind's own, "
                                                             "kindest/node:v1.37.0 for kind v0.33.0)")
    run.add_argument("--keep-cluster", action="store_true",
                     help="reuse the kind cluster if it exists, and keep it after the run")
    run.add_argument("--reaction-bound", type=float, metavar="SECONDS",
                     help="hold the plugin to this bound instead of the kubelet's 30 s (fakelet's kill matrix "
                          "uses it for mutants that never react; verdicts may then differ from a real kubelet's)")
    certify.add_repeat_flag(run)
    run.add_argument("--shard", metavar="K/N",
                     help="run only the K-th of N deterministic shares of the (subject, check) pairs (sorted "
                          "round-robin); fakelet merge puts the N report directories back together")
    run.add_argument("--suite", choices=sorted(NAMED_SUITES),
                     help="run a named suite instead of the subject kind's own: kep5970 (the seven checks of "
                          "kubernetes/enhancements#5970, judged through the Kubernetes API)")
    mtx = sub.add_parser("matrix", help="one table per subject: its checks down, kubelet release x node across "
                                        "(each cell a check run, as fidelity runs them); shardable")
    mtx.add_argument("--subject", action="append", default=[], metavar="NAME", type=subject_name,
                     help="a subject (repeatable)")
    mtx.add_argument("--kubelet-version", default=DEFAULT_KUBELET_VERSION, metavar="A,B,...",
                     help="kubelet releases: the fake node runs its model of each minor, the real node builds each "
                          f"from the Go module proxy (default {DEFAULT_KUBELET_VERSION})")
    mtx.add_argument("--node", default="fake", metavar="fake,real", help="nodes (default fake)")
    mtx.add_argument("--check", action="append", default=[], metavar="ID", help="only these checks (repeatable)")
    mtx.add_argument("--profile", default="fast", choices=sorted(PROFILES), help="timing profile (default fast)")
    mtx.add_argument("--seed", type=int, default=0, help="seed (default 0)")
    mtx.add_argument("--shard", metavar="K/N", help="only the K-th of N shares of the (cell, check) pairs")
    mtx.add_argument("--merge", nargs="+", metavar="DIR", help="write the table of these matrix shards instead")
    mtx.add_argument("-j", "--jobs", type=int, default=2, help="checks run in parallel within a cell (default 2)")
    mtx.add_argument("-v", "--verbose", action="store_true", help="show pytest's own output")
    mtx.add_argument("--out", default="fakelet-matrix", help="output directory (default ./fakelet-matrix)")
    mrg = sub.add_parser("merge", help="one report from the report directories of fakelet run --shard K/N "
                                       "(each shard once, all from one run)")
    mrg.add_argument("shard_dirs", nargs="+", metavar="DIR", help="a shard's report directory")
    mrg.add_argument("-o", "--output", required=True, metavar="OUT", help="the merged report directory")
    fid = sub.add_parser("fidelity", help="run the checks that can run on a real kubelet on both kubelets "
                              "and write a verdict table (root, containerd)")
    fid.add_argument("--subject", action="append", default=[], metavar="NAME", type=subject_name,
                     help="a subject to compare (repeatable; default: the targets in fixtures/fidelity.yaml)")
    fid.add_argument("--defect", help="run the --subject(s) as this mutant")
    fid.add_argument("--targets", metavar="PATH",
                     help="a targets file of your own (fixtures/fidelity.yaml's form)")
    fid.add_argument("--profile", default="fast", choices=sorted(PROFILES), help="timing profile (default fast)")
    fid.add_argument("--seed", type=int, default=0, help="seed (default 0)")
    fid.add_argument("--mutant-bound", type=float, default=MUTANT_BOUND_S, metavar="SECONDS",
                     help=f"reaction bound for mutants, as the kill matrix uses (default {MUTANT_BOUND_S:g}); the "
                          "reference and benign behaviours keep the kubelet's own")
    fid.add_argument("--kubelet-version", default="default", metavar="VERSION",
                     help=f"the real kubelet's release: a minor from {FLOOR} on (its newest patch) or a patch "
                          "(1.35.4), built from the Go module proxy; the fake runs its model of that minor "
                          f"(default {DEFAULT_KUBELET_VERSION})")
    fid.add_argument("--out", default="fakelet-fidelity", help="report directory (default ./fakelet-fidelity)")
    fid.add_argument("-j", "--jobs", type=int, default=2, help="checks run in parallel (default 2)")
    fid.add_argument("-v", "--verbose", action="store_true", help="show pytest's own output")
    up = sub.add_parser("up", help="run one live session (kubelet, subject, fake devices) until Ctrl-C")
    _add_subject_flags(up, many=False)
    _add_one_off_flags(up)
    _add_world_flags(up)
    up.add_argument("--out", help="keep the session's timeline and subject log here")
    up.add_argument("--for", dest="duration", type=float, metavar="SECONDS",
                    help=f"stop by itself after this long (at most {MAX_SESSION_S:g})")
    devices = sub.add_parser("devices", add_help=False,
                             help="control a running session's fake devices (fakelet devices --help)")
    devices.add_argument("args", nargs=argparse.REMAINDER)
    for name, what in (("taint", "add or remove a DeviceTaintRule on a device of a running session"),
                       ("pods", "create or list a running session's pods (fakelet pods --help)")):
        sub.add_parser(name, add_help=False, help=what).add_argument("args", nargs=argparse.REMAINDER)
    scenario = sub.add_parser("scenario", help="reproduce a reported bug from a scenario file, narrated step by step")
    steps = scenario.add_subparsers(dest="scenario_command", required=True)
    steps.add_parser("list", help="one line per bundled scenario: name, title, upstream link")
    show = steps.add_parser("show", help="a scenario's report, steps and expected verdicts")
    show.add_argument("name", metavar="NAME|FILE", help="a bundled scenario (fakelet scenario list) or a scenario "
                                                        "file (a path with a '/', or ending .yaml or .yml)")
    words = steps.add_parser("vocabulary", help="every step and condition a scenario file can use: keys, values, "
                                                "defaults, what is counted and which kubelets show it")
    words.add_argument("name", nargs="?", metavar="STEP|CONDITION", help="only this step or condition")
    words.add_argument("--format", default="text", choices=["text", "markdown"],
                       help="text (default) or markdown (the whole reference page, for the docs)")
    lint = steps.add_parser("check", help="check scenario files completely before anything runs: every problem, "
                                          "as file:line: field: problem")
    lint.add_argument("files", nargs="+", metavar="FILE", help="a scenario file (or a bundled scenario's name)")
    play = steps.add_parser("run", help="run a scenario: reproduced, not reproduced, or inconclusive")
    play.add_argument("name", nargs="?", metavar="NAME", help="a bundled scenario (fakelet scenario list)")
    play.add_argument("--file", metavar="PATH", help="a scenario file of your own (fixtures/scenarios/*.yaml's form)")
    _add_subject_flags(play, many=False)
    _add_one_off_flags(play)
    _add_world_flags(play)
    play.add_argument("--node", choices=["fake", "real"],
                      help="fake (fakelet's kubelet, default) or real (kubelet v1.36 from the Go module proxy; root); "
                           "with --case all, only the cases on that node")
    play.add_argument("--case", metavar="NAME|N|all",
                      help="run the file's promised cases (all, a number, or a name as `scenario show` lists them) "
                           "and report each against its promise: exit 1 when one is broken, 3 when one could not "
                           "run here")
    play.add_argument("--repeat", type=int, default=1, metavar="N",
                      help=f"run it N times (races): how many of N reproduced it (at most {MAX_REPEAT})")
    play.add_argument("--reaction-bound", type=float, metavar="SECONDS",
                      help="waits and expectations without their own `within` use this bound instead of the "
                           "kubelet's 30 s (for mutants that never react; a reproduction may then differ); with "
                           "--case, only the cases promised reproduced")
    play.add_argument("--toleration-seconds", type=int, metavar="N",
                      help="taint-eviction story: the pod tolerates the NoExecute taint for N seconds")
    play.add_argument("--out", default="fakelet-report", help="report directory (default ./fakelet-report)")
    play.set_defaults(seed=None)  # the scenario file's seed unless --seed is given
    sub.add_parser("subjects", help="list the known subjects and their defects")
    subjectcli.add_parser(sub)
    sub.add_parser("checks", help="list the conformance checks")
    certify.add_parsers(sub)
    explorecli.add_parser(sub, _add_subject_flags, _add_one_off_flags, _add_world_flags)
    doctorcli.add_parser(sub)
    prebuildcli.add_parser(sub)
    return parser


def max_jobs() -> int:
    # Each job runs a kubelet, a plugin and often a fake backend, but mostly waits on a bound: the limit is
    # the scheduler's (harness/run/scheduler.py JOBS_PER_CPU).
    return scheduler.max_jobs()


AUTO_JOBS = None  # `--jobs auto`: sized per run from the checks' expected durations (scheduler.auto_jobs)


def jobs_value(text: str) -> int | None:
    if text.strip().lower() == "auto":
        return AUTO_JOBS
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: a number of checks at once, or auto") from None


def check_jobs(jobs: int | None) -> None:
    if jobs is not AUTO_JOBS and not 1 <= jobs <= max_jobs():
        raise UsageError(f"--jobs {jobs}: must be between 1 and {max_jobs()} ({scheduler.JOBS_PER_CPU} per CPU), "
                         "or auto")


def jobs_for(args: argparse.Namespace, run: RunConfig) -> int:
    """--jobs as given, or for auto: the longest check alone on one worker, the rest packed beside it.

    Never more workers than checks: each xdist worker costs about 2 s of CPU to start (scheduler.max_jobs), and
    one left without a check only delays the run (a 1-check run given --jobs 4 spent 19 s of its 33 bringing
    up workers at a load of 9).
    """
    selected = run.checks or list(catalog(run.suite_package))
    if args.jobs is not AUTO_JOBS:
        return max(1, min(int(args.jobs), len(selected)))
    key = scheduler.run_key(run.spec.name, run.defect, scheduler.timing_label(run))
    estimate = scheduler.estimates_for(key)
    return scheduler.auto_jobs((estimate(c) for c in selected), known=scheduler.timed_before(key, selected))


def check_ids(args: argparse.Namespace, packages: set[str]) -> None:
    known: dict[str, tuple[str, str]] = {}
    for package in sorted(packages):
        known.update(catalog(package))
    unknown = sorted(set(args.check) - set(known))
    if unknown:
        raise UsageError(f"unknown check ID(s) {', '.join(unknown)}; known: {', '.join(known)}")


def overrides(args: argparse.Namespace) -> Overrides:
    return Overrides(inventory=args.inventory, skin=args.skin, env=list(args.env), pass_env=list(args.pass_env),
                     private_dirs=list(args.private_dir), device_ids=args.device_ids,
                     observes=parse_observes(args.observes), thermal_threshold=args.thermal_threshold)


def subject_names(args: argparse.Namespace) -> list[str | None]:
    """The --subject names to build runs for; [None] when --plugin-cmd or --subject-file is the one subject."""
    if args.plugin_cmd is not None or args.subject_file is not None or (args.image and not args.subject):
        return [None]
    if (getattr(args, "cluster", None) or "").startswith("kubeconfig:"):
        return [None]  # the driver installed in that cluster
    if args.subject:
        return list(args.subject)
    suite = getattr(args, "suite", None)
    names: list[str | None] = [s.name for s in all_subjects()
                               if s.reference and (suite is None or s.kind == NAMED_SUITES[suite][0])]
    if args.defect:
        # `--defect D` alone: the reference subject(s) that have that defect.
        having: list[str | None] = [s.name for s in all_subjects()
                                    if s.reference and s.defect_error(args.defect) is None]
        return having or names[:1]  # none: let RunConfig say which defects exist
    return names


def build_run(args: argparse.Namespace, subject: str | None, out: str | None) -> RunConfig:
    cluster = getattr(args, "cluster", None)
    if cluster is not None and cluster.startswith("kubeconfig:"):
        given = [f for f, v in (("--subject", subject or args.subject), ("--subject-file", args.subject_file),
                                ("--plugin-cmd", args.plugin_cmd), ("--image", getattr(args, "image", None)),
                                ("--defect", args.defect)) if v]
        if given:
            raise UsageError(f"--cluster {oneline(cluster)}: the driver is the one installed there; drop {given[0]}")
        return RunConfig.for_cluster(cluster, args.driver, getattr(args, "device_class", None),
                                     getattr(args, "suite", None), args.profile, args.seed,
                                     getattr(args, "check", []), out, getattr(args, "require", []),
                                     getattr(args, "reaction_bound", None))
    if getattr(args, "device_class", None):
        raise UsageError("--device-class goes with --cluster kubeconfig:PATH (fakelet makes its own class otherwise)")
    return RunConfig.build(subject=subject, subject_file=args.subject_file, defect=args.defect,
                           profile=args.profile, seed=args.seed, checks=getattr(args, "check", []), out=out,
                           plugin_cmd=args.plugin_cmd, resource=args.resource, driver=args.driver,
                           mount_namespace=args.mount_namespace, binary=args.binary, kind=args.kind,
                           kubelet_version=args.kubelet_version, control_plane=args.control_plane,
                           overrides=overrides(args), require=getattr(args, "require", []),
                           reaction_bound=getattr(args, "reaction_bound", None), node=getattr(args, "node", "fake"),
                           image=image_flags(args), cluster=getattr(args, "cluster", None),
                           kind_image=getattr(args, "kind_image", None),
                           keep_cluster=getattr(args, "keep_cluster", False),
                           suite=getattr(args, "suite", None))


def image_flags(args: argparse.Namespace) -> Image | None:
    """--image with its --image-arg and --privileged; those two alone are errors."""
    image = getattr(args, "image", None)
    if image is None:
        for flag, value in (("--image-arg", getattr(args, "image_arg", None)),
                            ("--privileged", getattr(args, "privileged", False))):
            if value:
                raise UsageError(f"{flag} goes with --image")
        return None
    return Image(image, list(args.image_arg) if args.image_arg is not None else None, args.privileged)


def check_one_subject(args: argparse.Namespace) -> None:
    chosen = [flag for flag, value in (("--subject", args.subject), ("--subject-file", args.subject_file),
                                       ("--plugin-cmd", args.plugin_cmd)) if value or value == ""]
    if len(chosen) > 1:
        raise UsageError(f"give either {chosen[0]} or {chosen[1]}, not both")


def configs(args: argparse.Namespace) -> list[RunConfig]:
    """Validate every flag before anything starts, so bad input fails fast and leaves nothing."""
    check_one_subject(args)
    if args.defect and len(args.subject) > 1:
        raise UsageError("--defect applies to one --subject")
    if args.image and len(args.subject) > 1:
        raise UsageError("--image applies to one --subject")
    check_jobs(args.jobs)
    runs = [build_run(args, name, args.out) for name in subject_names(args)]
    check_ids(args, {r.suite_package for r in runs})
    if args.check:
        # `--check DP-...` over every reference subject runs only the subjects those checks are for, each with
        # only its own: a device plugin's check run would refuse a DRA check's ID as unknown.
        runs = [dataclasses.replace(r, checks=[c for c in r.checks if c in catalog(r.suite_package)])
                for r in runs if set(args.check) & set(catalog(r.suite_package))]
    return runs


def up_config(args: argparse.Namespace) -> RunConfig:
    check_one_subject(args)
    return build_run(args, args.subject, args.out)


def write_config(run: RunConfig, out: Path, directory: Path) -> Path:
    """The run as the one file its pytest process reads (`--fakelet-config`), its reports going to `out`."""
    return dataclasses.replace(run, out=out).save(directory / "run.json")


# A check run loads the plugins its command line names and no others (its xdist workers inherit this).
CHECK_RUN_ENV = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}


def pytest_argv(args: argparse.Namespace, run: RunConfig, config: Path) -> list[str]:
    # Only fakelet's own plugin (and xdist's): the others installed beside it (faker, hypothesis, anyio,
    # pytest-kind, ...) serve no check and cost every xdist worker about 0.7 s of CPU to load (CHECK_RUN_ENV).
    argv = [sys.executable, "-m", "pytest", "--pyargs", run.suite_package, "-p", "no:cacheprovider",
            "-p", "harness.run.pytest_plugin",
            "--no-header", "-q" if args.verbose else "-qq", "--tb=short" if args.verbose else "--tb=no",
            "--fakelet-config", str(config)]
    # One kind cluster, one node: its checks take turns (each restarts that node's kubelet).
    # A named suite tells one story in one process (harness/world/kepworld.py): no workers.
    jobs = jobs_for(args, run) if run.suite is None else 1
    if jobs > 1 and run.cluster is None:
        argv += ["-p", "xdist", "-n", str(jobs)]
    return argv


INTERRUPT_GRACE_S = 30.0  # how long an interrupted check run may take to tear its checks down


class Interrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM during a run: carries the partial report of the subject that was running."""

    def __init__(self, partial: SubjectReport | None) -> None:
        super().__init__()
        self.partial = partial


def prebuild(run: RunConfig) -> None:
    """Build what the checks will build, here: a first run's minutes of progress reach the terminal from one
    process, instead of every check process building or waiting at once. A failed build is the checks' to
    report (they skip with its reason)."""
    from harness.controlplane import ControlPlaneUnavailable
    from harness.node.real.localnode import find_kubelet
    from harness.node.real.localnode import unavailable as realnode_unavailable
    from harness.world.env import SubjectUnavailable

    with contextlib.suppress(SubjectUnavailable):
        run.resolve_binary()
    # DP and DRA checks alike run on the real kubelet (through the relays): build it once, here.
    if run.node == "real" and realnode_unavailable() is None:
        with contextlib.suppress(ControlPlaneUnavailable):
            find_kubelet(run.kubelet_version.name)
        decide_runtime()


_runtime_said: list[str] = []


def decide_runtime() -> None:
    """containerd 2 built once, here, and the decision handed to the check processes; Debian's containerd
    said in one line, once per run, with what it leaves unjudged."""
    found = node_runtime.find()
    node_runtime.announce(found)
    if found.fallback and found.fallback not in _runtime_said:
        _runtime_said.append(found.fallback)
        print(found.fallback, file=sys.stderr, flush=True)


def run_one(args: argparse.Namespace, run: RunConfig, out: Path) -> SubjectReport:
    try:
        prebuild(run)
    except KeyboardInterrupt:
        raise Interrupted(nothing_ran(run)) from None
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").unlink(missing_ok=True)
    stdout = None if args.verbose else subprocess.DEVNULL
    # pytest's own temp root (xdist makes one) and the run's config file must not outlive the run either.
    # pytest empties its basetemp when it starts, so both live one level down.
    scratch = owned_dir(f"{OWNED_PREFIX}pytest-")
    try:
        basetemp = str(scratch / "basetemp")
        config = write_config(run, out, scratch)
        # If fakelet itself is killed outright, the check run gets SIGTERM and tears down.
        # Its own process group, so that an interrupt reaches its xdist workers at once, not after their checks.
        with _stop.shielded():  # a check run started must be known here, to be stopped
            argv = [*pytest_argv(args, run, config), "--basetemp", basetemp]
            proc = subprocess.Popen(die_with_parent(argv, "TERM"), stdout=stdout, start_new_session=True,
                                    env={**os.environ, **CHECK_RUN_ENV})
        try:
            _stop.raise_if_requested()
            code = wait_check_run(proc)
        except KeyboardInterrupt:
            print(f"\nfakelet: stopping: the checks of {run.spec.name} tear down (at most {INTERRUPT_GRACE_S:.0f} s)",
                  file=sys.stderr, flush=True)
            stop_check_run(proc)
            raise Interrupted(load_report(out, interrupted=True) or nothing_ran(run)) from None
    finally:
        remove_owned(scratch)
    report = load_report(out)
    if code not in (0, 1) or report is None:
        raise RuntimeError(f"the check run for {run.spec.name} ended with pytest exit code {code} and no report; "
                           f"rerun with -v to see its output")
    return report


STOP_POLL_S = 0.2  # how soon a check run waited on outside the main thread (fidelity's sides) sees a stop


def wait_check_run(proc: subprocess.Popen[bytes]) -> int:
    """The check run's exit code. Python raises a stop signal's KeyboardInterrupt in the main thread only: a
    run waited on in another thread looks for the stop itself, and then stops as the main thread's would."""
    if threading.current_thread() is threading.main_thread():
        return proc.wait()
    while True:
        try:
            return proc.wait(STOP_POLL_S)
        except subprocess.TimeoutExpired:
            if _stop.requested:
                raise KeyboardInterrupt from None


def stop_check_run(proc: subprocess.Popen[bytes]) -> None:
    """Make the check run stop now: every process of it tears its checks down, then it is killed."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    try:
        proc.wait(INTERRUPT_GRACE_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def load_report(out: Path, interrupted: bool = False) -> SubjectReport | None:
    try:
        report = SubjectReport.from_dict(json.loads((out / "report.json").read_text()))
    except (OSError, ValueError, TypeError):
        return None
    report.interrupted = report.interrupted or interrupted
    return report


def print_report(report: SubjectReport) -> None:
    print("\n".join(report_lines(report)))


def needs_shared_plane(runs: list[RunConfig]) -> bool:
    """Whether any run needs the local API server: a DRA one, or one on the real kubelet."""
    return any((r.spec.is_dra or r.node == "real") and r.control_plane == "local" for r in runs)


def wants_scheduler(runs: list[RunConfig]) -> bool:
    """kube-scheduler only for the kep5970 suite: it allocates its claims as a cluster would."""
    return any(r.suite == "kep5970" for r in runs)


def shared_control_plane(runs: list[RunConfig]) -> ControlPlane | None:
    """Start one local API server for every DRA or real-kubelet run, instead of one per check process."""
    from harness.controlplane import ControlPlaneUnavailable, open_control_plane
    from harness.run import provenance

    if not needs_shared_plane(runs):
        return None
    try:
        plane = open_control_plane("local", scheduler=wants_scheduler(runs)).start()
    except ControlPlaneUnavailable as err:
        print(f"fakelet: no local API server ({err}); DRA checks that need one will skip", file=sys.stderr)
        spec = UNAVAILABLE + str(err)
        plane = None
    else:
        spec = f"kubeconfig:{plane.kubeconfig}"
    provenance.announce_plane(plane)  # its versions, for the reports' provenance
    # The check processes find it through the environment, so their repro lines still say "local".
    os.environ[SHARED_CONTROL_PLANE_ENV] = spec
    return plane


def shared_plane_beside(runs: list[RunConfig]) -> BackgroundPlane | ControlPlane | None:
    """The local API server every DRA or real-kubelet run shares, starting while the first check run starts
    (harness/run/sharedplane.py): its checks wait for it, not the whole run."""
    if not needs_shared_plane(runs):
        return None
    from harness.run import provenance
    from harness.run.sharedplane import BackgroundPlane

    provenance.announce_plane(None)  # the check processes read the description the plane publishes
    plane = BackgroundPlane(scheduler=wants_scheduler(runs))
    os.environ[SHARED_CONTROL_PLANE_ENV] = plane.spec
    try:
        return plane.start()
    except BaseException:  # a stop while its binaries are found: nothing of it may stay
        plane.stop()
        raise


def reap_dead_runs() -> None:
    removed: list = [*reap(), *(f"container {name}" for name in sweep_containers())]
    if removed:
        print(f"fakelet: removed {len(removed)} leftover(s) of dead runs: {', '.join(map(str, removed[:5]))}"
              f"{' ...' if len(removed) > 5 else ''}", file=sys.stderr)


REPORT_MARK = ".fakelet-report"  # marks a directory fakelet wrote, so a later run may replace it whole
MARK_TEXT = "written by fakelet; a later run or session replaces this directory whole\n"


def check_out(value: str) -> Path:
    """The report directory: never / or home, never someone else's non-empty directory."""
    if not value.strip():
        raise UsageError("--out is empty; name a directory for the report")
    out = Path(value).expanduser()
    if out.is_symlink() and not out.exists():
        raise UsageError(f"--out {oneline(value)}: a dangling symlink (to {oneline(os.readlink(out))}); "
                         "remove it or name another directory")
    resolved = out.resolve()
    if resolved == Path("/") or resolved == Path.home().resolve():
        raise UsageError(f"--out {value}: refusing to write a report into {resolved}")
    if resolved.exists() and not resolved.is_dir():
        raise UsageError(f"--out {value}: {resolved} exists and is not a directory")
    blocker = next((p for p in resolved.parents if p.exists() and not p.is_dir()), None)
    if blocker is not None:  # mkdir would say only "File exists: <blocker>"
        raise UsageError(f"--out {oneline(value)}: {blocker} is a file, not a directory, so nothing can be made "
                         "under it")
    if resolved.is_dir() and any(resolved.iterdir()) and not is_report_dir(resolved):
        raise UsageError(f"--out {value}: {resolved} is not empty and holds no fakelet report; "
                         "name a new or empty directory")
    return out


def is_report_dir(path: Path) -> bool:
    if (path / REPORT_MARK).is_file():
        return True
    try:  # a report written before the mark existed
        return "schema_version" in json.loads((path / "report.json").read_text())
    except (OSError, ValueError):
        return False


def fresh_out(out: Path) -> None:
    """Replace an earlier report whole: its artifacts never mix with this run's."""
    if out.is_dir() and is_report_dir(out):
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / REPORT_MARK).write_text(MARK_TEXT)


def staging_dir(out: Path) -> Path:
    """A claimed directory beside `out` for this run's report (the reaper removes one a killed run left)."""
    parent = out.absolute().parent
    parent.mkdir(parents=True, exist_ok=True)
    reap(parent, cgroups=False)
    stage = owned_dir(f"{OWNED_PREFIX}{out.name}-", parent)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(stage, 0o777 & ~umask)  # a report is for sharing (CI artifacts): the user's usual mode, not 0700
    (stage / REPORT_MARK).write_text(MARK_TEXT)
    return stage


def swap_in(stage: Path, out: Path) -> None:
    """Put the finished report in place of `out`; the earlier one goes only now that this one exists."""
    (stage / OWNER_FILE).unlink(missing_ok=True)
    old = None
    if out.exists() or out.is_symlink():
        old = owned_dir(f"{OWNED_PREFIX}{out.name}-old-", stage.parent)  # reaped if this process dies now
        os.rename(out, old / out.name)
    os.rename(stage, out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def cmd_run(args: argparse.Namespace) -> int:
    # A stop while the flags are checked (seconds: the check catalogs load) is only noted: the run it names is
    # needed for its report, of nothing run (run_subjects ends at once).
    with _stop.shielded():
        out, runs, record = planned_run(args)
        # The earlier report stays whole until this run's exists: the run writes beside it and swaps at the end.
        stage = staging_dir(out)
    if record is not None:
        shards.write_record(record, stage)
        if not runs:  # more shards than pairs: this one has nothing to do, and says so in its directory
            write_index([], stage)
            with _stop.shielded():
                swap_in(stage, out)
            print(f"\nreports: {out}/ (no pairs fall to this shard)")
            return EXIT_OK
    try:
        reports, interrupted = run_subjects(args, runs, stage)
        if interrupted:
            not_run = [r.spec.name for r in runs[len(reports):]]
            print(f"\nfakelet: interrupted; subjects stopped and sandboxes removed"
                  f"{'; not run: ' + ', '.join(not_run) if not_run else ''}", file=sys.stderr)
        reports = finish_reports(runs, reports, stage, out, interrupted)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    status = run_status(reports)
    append_step_summary(reports, out)  # the CI job page's summary, when $GITHUB_STEP_SUMMARY names a file
    if len(reports) > 1:
        print(f"\nrun: {status}")
    print(f"\nreports: {out}/")
    return EXIT_CODES[status]


def planned_run(args: argparse.Namespace) -> tuple[Path, list[RunConfig], dict[str, Any] | None]:
    """The report directory, the runs (this shard's), and the shard's record: every flag checked."""
    out = check_out(args.out)
    certify.check_repeat(args)
    runs = configs(args)
    if not runs:
        raise UsageError("no subjects to run")
    record = None
    if args.shard is not None:
        shard = shards.parse_shard(args.shard)
        runs, record = shards.split(runs, shard)
        print(f"shard {shard}: {len(record['mine'])} of {len(record['pairs'])} (subject, check) pairs", flush=True)
    return out, runs, record


def run_subjects(args: argparse.Namespace, runs: list[RunConfig],
                 stage: Path) -> tuple[list[SubjectReport], bool]:
    """Each subject's report, in order, and whether a stop signal cut the run short (at any moment)."""
    reports: list[SubjectReport] = []
    plane = None
    try:
        from harness.run import scenariocli  # seconds on a loaded machine: a stop meanwhile is a stop of the run
        from harness.scenarios.repro import write_repros

        _stop.raise_if_requested()  # one that came while the flags were checked: nothing is started
        reap_dead_runs()
        plane = shared_plane_beside(runs)
        for run in runs:
            target = stage if len(runs) == 1 else stage / run.spec.name
            # As a scenario run says it (cmd_scenario): the fake asked for a release models it only through the
            # release's named behaviours, so that a verdict here is not read as one of a real kubelet of it.
            model = scenariocli.fake_release_note(run.node, args.kubelet_version, run.kubelet_version, run.spec.kind)
            if model:
                print(f"{run.spec.name}: {model}", flush=True)
            reports.append(certify.run_repeated(run_one, args, run, target))
            if model:
                reports[-1].facts[FAKE_RELEASE_FACT] = model
                write_all(reports[-1], target)  # the check run wrote it without: its config has no asked release
            write_repros(reports[-1], run, target)
            print_report(reports[-1])
    except Interrupted as stop:
        if stop.partial is not None:
            reports.append(stop.partial)
            print_report(stop.partial)
    except KeyboardInterrupt:
        pass  # before or between check runs: nothing of theirs is left running
    finally:
        with _stop.shielded():
            os.environ.pop(SHARED_CONTROL_PLANE_ENV, None)
            if plane is not None:
                plane.stop()
    return reports, _stop.requested


def finish_reports(runs: list[RunConfig], reports: list[SubjectReport], stage: Path, out: Path,
                   interrupted: bool) -> list[SubjectReport]:
    """Write the run's reports into `stage` and swap it in for `out`; a stop meanwhile makes them INTERRUPTED."""
    if interrupted:
        reports = interrupted_reports(runs, reports)
    try:
        write_reports(runs, reports, stage, interrupted)
    except KeyboardInterrupt:
        interrupted, reports = True, interrupted_reports(runs, reports)
        with _stop.shielded():
            write_reports(runs, reports, stage, True)
    with _stop.shielded():
        swap_in(stage, out)
    if _stop.requested and not interrupted:
        # The stop came while the reports were being swapped in: say so in them, in place.
        reports = interrupted_reports(runs, reports)
        with _stop.shielded():
            write_reports(runs, reports, out, True)
    return reports


def write_reports(runs: list[RunConfig], reports: list[SubjectReport], directory: Path, interrupted: bool) -> None:
    if len(runs) == 1:
        write_all(reports[0], directory)
        return
    for report in reports:
        if report.interrupted:  # its check run could not finish its own report
            write_all(report, directory / report.subject)
    write_index(reports, directory, interrupted)


def cmd_subjects() -> int:
    for spec in all_subjects():
        tag = " (reference)" if spec.reference else ""
        print(f"{spec.name}{tag}: {spec.kind}, {spec.launcher} launcher, resource {spec.resource}")
        if spec.description:
            print(f"  {spec.description}")
        for d in spec.defects.values():
            # What it does, then what catches it: a defect is a bug of its own, not only a list of checks.
            print(f"  --defect {d.name:26} {d.description or '(no description in its subject file)'}")
            print(f"  {'':35} fails {', '.join(d.kills) or 'no check (it must pass every one it runs)'}")
        if spec.mutants():
            print(f"  --defect {'A+B[+C]':26} its mutants at once (not the hostile or benign behaviours)")
    return EXIT_OK


def cmd_up(args: argparse.Namespace) -> int:
    if args.duration is not None:
        check_number("--for", args.duration, 0, MAX_SESSION_S, low_open=True)
    out = check_out(args.out) if args.out is not None else None
    run = up_config(args)
    from harness.run.session import Session  # grpc and the kubelets: once the flags are known good

    reap_dead_runs()
    if out is not None:
        fresh_out(out)
    session = Session(run, sys.stdout)
    try:
        session.start()
        sock = session.control_socket
        print(f"session up: subject {run.spec.name}, sandbox {session.env.sandbox.path if session.env else ''}")
        if sock is not None:
            print(f"control socket: {sock}\nexport FAKELET_CONTROL_SOCKET={sock}   # then: fakelet devices fail ID, "
                  "fakelet pods create, fakelet taint add DEV",
                  flush=True)
        for line in surface_exports(session):
            print(line, flush=True)
        session.wait(args.duration)
    finally:
        session.close()
    return EXIT_OK


def surface_exports(session: Session) -> list[str]:
    """What a person exports to point their own vendor tools (nvidia-smi, a script on pynvml) at the fake GPUs."""
    devices = session.env.devices if session.env is not None else None
    if devices is None or devices.nvml is None:
        return []
    from fake_devices.nvml.build import NvmlBuildError, library

    try:
        lib = library()
    except NvmlBuildError as err:
        return [f"# the fake NVML library is unavailable: {err}"]
    exports = {"LD_LIBRARY_PATH": str(lib.parent), **devices.nvml.env}
    return [f"export {k}={v}" for k, v in exports.items()] + [
        "# then any NVML tool sees the fake GPUs; fakelet devices heat|fail|ecc|xid DEV changes what it sees"]


FAKE_RELEASE_FACT = "fake kubelet release"  # the report's fact: the fake's model of the release asked for


def cmd_scenario(args: argparse.Namespace) -> int:
    if args.scenario_command == "run":
        return cmd_scenario_run(args)  # its bad flags are said before the runner is imported
    from harness.run import scenariocli
    from harness.scenarios import library
    from harness.scenarios.runner import describe as describe_scenario

    if args.scenario_command == "list":
        for scenario in library.all_scenarios():
            print(scenario.summary())
        return EXIT_OK
    if args.scenario_command == "show":
        print("\n".join(describe_scenario(scenariocli.shown(args.name))))
        return EXIT_OK
    if args.scenario_command == "vocabulary":
        return scenariocli.cmd_vocabulary(args)
    return scenariocli.cmd_check(args)  # "check"


def scenario_of(args: argparse.Namespace) -> Scenario:
    """The scenario, checked as `fakelet scenario check` checks it: every problem is an error before anything
    starts (one `fakelet: error:` line each)."""
    from harness.scenarios import library
    from harness.scenarios.check import ScenarioProblems, check_file

    if (args.name is None) == (args.file is None):
        raise UsageError("give a scenario NAME (fakelet scenario list) or --file PATH, one of them")
    if args.name:
        library.find(args.name)  # an unknown name: the known ones
    scenario, problems = check_file(library.scenario_dir() / f"{args.name}.yaml" if args.name else Path(args.file))
    if problems:
        raise ScenarioProblems(problems)
    assert scenario is not None
    return scenario


def cmd_scenario_run(args: argparse.Namespace) -> int:
    if args.toleration_seconds is not None and not 0 <= args.toleration_seconds <= MAX_TOLERATION_S:
        raise UsageError(f"--toleration-seconds {args.toleration_seconds}: must be between 0 and {MAX_TOLERATION_S}")
    if not 1 <= args.repeat <= MAX_REPEAT:
        raise UsageError(f"--repeat {args.repeat}: must be between 1 and {MAX_REPEAT}")
    check_one_subject(args)
    scenario = scenario_of(args)
    out = check_out(args.out)
    from harness.run import scenariocli  # the real node's probes (grpc): once the scenario is known good

    if args.case is not None:
        scenariocli.check_case_flags(args)
        scenariocli.select_cases(scenario, args.case, args.node)  # a bad --case before the old report goes
        fresh_out(out)
        return scenariocli.run_cases(args, scenario, out, lambda one, where: scenario_once(one, scenario, where))
    report = scenario_once(args, scenario, out)
    print(f"\nreports: {out}/")
    return EXIT_CODES[report.status()]


def scenario_once(args: argparse.Namespace, scenario: Scenario, out: Path) -> SubjectReport:
    """One run of `scenario` as the flags say (--repeat times), its report written to `out` and printed."""
    from harness.run import provenance, scenariocli
    from harness.scenarios.check import DEFAULT_SUBJECT, ScenarioProblems, inventory_ids, world_problems
    from harness.scenarios.runner import run_scenario

    args.node = args.node or "fake"
    if args.seed is None:
        args.seed = scenario.seed
    if args.defect is None and scenario.defect and not (args.subject or args.subject_file or args.plugin_cmd):
        args.defect = scenario.defect  # a repro file's mutant, on the subject it names
    chosen = args.subject or (None if args.plugin_cmd is not None or args.subject_file or args.image
                              else scenario.subject or DEFAULT_SUBJECT[scenario.kind])
    run = build_run(args, chosen, str(out))
    if run.spec.kind != scenario.kind:
        raise UsageError(f"scenario {scenario.name} is for a {scenario.kind}; {run.spec.name} is a {run.spec.kind}")
    if args.node not in scenario.nodes:
        raise UsageError(f"scenario {scenario.name} runs on {', '.join(scenario.nodes)} kubelets, not --node "
                         f"{args.node}")
    if inventory_ids(run.spec) is not None:
        # The devices the steps name, in the inventory of the subject this run chose (a file of the user's own).
        problems = world_problems(scenario, run.spec)
        if problems:
            raise ScenarioProblems(problems)
    reap_dead_runs()
    # The fake kubelet asked to stand in for a release: say, before and after, that it does so only through the
    # release's named behaviours, so that an outcome here is not read as one of a real kubelet of that release.
    model = scenariocli.fake_release_note(args.node, args.kubelet_version, run.kubelet_version, scenario.kind)
    stage = staging_dir(out)  # as `fakelet run`: the earlier report stays whole until this one exists
    try:
        started = provenance.start()
        kubelet = f"fake kubelet's model of {run.kubelet_version.name}" if model else f"{args.node} kubelet"
        print(f"scenario {scenario.name}: {run.spec.name}{f' --defect {run.defect}' if run.defect else ''} on the "
              f"{kubelet} ({scenario.upstream})", flush=True)
        if model:
            print(f"  {model}", flush=True)
        report = run_scenario(dataclasses.replace(run, out=stage), scenario, lambda line: print(line, flush=True),
                              repeat=args.repeat, node=args.node, file=args.file, toleration_s=args.toleration_seconds)
        if model:
            report.facts[FAKE_RELEASE_FACT] = model
        provenance.finish(run, report, started)
        write_all(report, stage)
        with _stop.shielded():
            swap_in(stage, out)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    print_report(report)
    outcome = report.facts.get("scenario", {}).get("outcome")
    if outcome:
        runs = report.facts["scenario"]
        tally = f" ({runs['reproduced']} of {runs['runs']} runs reproduced it)" if runs["runs"] > 1 else ""
        print(f"\nverdict: {outcome.upper()}{tally}")
        if model:
            print(f"  on the fake kubelet's model of {run.kubelet_version.name} (its named behaviours only, listed "
                  f"above): not a verdict on a real {run.kubelet_version.name} kubelet")
    return report


def said_interrupted(table: Path) -> int:
    """A table command's last word on a stop signal: its table is written, marked INTERRUPTED."""
    print(f"fakelet: interrupted; subjects stopped and sandboxes removed\ntable: {table}", file=sys.stderr)
    return EXIT_CODES[INTERRUPTED]


def cmd_fidelity(args: argparse.Namespace) -> int:
    # A stop while the flags are checked (the real node's probes take seconds) is acted on in fidelity.run.
    with _stop.shielded():
        out, targets, known = fidelity_plan(args)
        reap_dead_runs()
        fresh_out(out)
    try:
        table = fidelity.run(args, targets, known, out, run_one, shared_control_plane,
                             lambda line: print(line, flush=True), _stop)
    finally:
        os.environ.pop(SHARED_CONTROL_PLANE_ENV, None)
    if table.interrupted:
        return said_interrupted(out / "fidelity.md")
    gaps = table.gaps()
    print(f"\nwall time: fake {table.wall_s['fake']:.1f}s, real {table.wall_s['real']:.1f}s; "
          f"{len(gaps)} unexplained difference(s)")
    print(f"table: {out}/fidelity.md")
    return EXIT_OK if not gaps else EXIT_CODES[NOT_CONFORMANT]


def fidelity_plan(args: argparse.Namespace) -> tuple[Path, list[fidelity.Target], list[fidelity.Known]]:
    """The table's directory, the targets and the known gaps: every flag checked before anything starts."""
    if not 1 <= args.jobs <= max_jobs():
        raise UsageError(f"--jobs {args.jobs}: must be between 1 and {max_jobs()} ({scheduler.JOBS_PER_CPU} per CPU)")
    # Named here: a bad bound would otherwise surface from the first mutant's run as --reaction-bound's error.
    check_number("--mutant-bound", args.mutant_bound, 0, PROFILES[args.profile].reaction_s, low_open=True)
    if args.defect and not args.subject:
        raise UsageError("--defect needs --subject")
    if args.subject and args.targets:
        raise UsageError("give either --subject or --targets, not both")
    fidelity.check_release(args.kubelet_version)  # before the report directory is made
    from harness.node.real.localnode import unavailable as realnode_unavailable  # grpc: past the flags' checks

    why = realnode_unavailable()
    if why:
        raise UsageError(f"fidelity needs a real kubelet, and this machine cannot run one: {why}")
    targets, known = fidelity.load_targets(Path(args.targets) if args.targets else fidelity.default_targets_file())
    if args.subject:
        targets = [fidelity.Target(s, args.defect) for s in args.subject]
    return check_out(args.out), targets, known


def cmd_merge(args: argparse.Namespace) -> int:
    """The shards of one run as one report directory: verdicts as the unsharded run's, each shard's provenance
    kept."""
    from reports.bundle import load_dir
    from reports.merge import keep_artifacts, load_shard, merge

    out = check_out(args.output)
    given = [Path(d) for d in args.shard_dirs]
    if any(out.resolve() == d.resolve() for d in given):
        raise UsageError(f"-o {args.output}: is one of the shards; write the merged report elsewhere")
    shard_dirs = [load_shard(d, load_dir) for d in given]
    merged = merge(shard_dirs)
    stage = staging_dir(out)
    try:
        keep_artifacts(shard_dirs, merged, stage)
        if len(merged) == 1:
            write_all(merged[0], stage)
        else:
            for report in merged:
                write_all(report, stage / report.subject)
            write_index(merged, stage)
        with _stop.shielded():
            swap_in(stage, out)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    for report in merged:
        print_report(report)
    status = run_status(merged)
    append_step_summary(merged, out, "merge")
    print(f"\nmerged {len(given)} shards: {status}\nreports: {out}/")
    return EXIT_CODES[status]


def cmd_matrix(args: argparse.Namespace) -> int:
    from reports.merge import MergeError

    out = check_out(args.out)
    if args.merge:
        if any(out.resolve() == Path(d).resolve() for d in args.merge):
            raise UsageError(f"--out {args.out}: is one of the shards; write the table elsewhere")
        stage = staging_dir(out)
        try:
            done = matrix.merge_dirs([Path(d) for d in args.merge], stage)
            with _stop.shielded():
                swap_in(stage, out)
        except (MergeError, OSError, ValueError) as err:
            raise UsageError(str(err)) from None
        finally:
            shutil.rmtree(stage, ignore_errors=True)
    else:
        if not 1 <= args.jobs <= max_jobs():
            raise UsageError(f"--jobs {args.jobs}: must be between 1 and {max_jobs()} "
                             f"({scheduler.JOBS_PER_CPU} per CPU)")
        with _stop.shielded():  # a stop meanwhile is acted on once the table it owes can be written (matrix.run)
            matrix.plan(args)  # every cell valid before the old table goes
            if args.shard:
                shards.parse_shard(args.shard)
            reap_dead_runs()
            fresh_out(out)
        args.repeat = 1
        try:
            done = matrix.run(args, out, run_one, shared_control_plane, lambda line: print(line, flush=True), _stop)
        finally:
            os.environ.pop(SHARED_CONTROL_PLANE_ENV, None)
        if _stop.requested:
            return said_interrupted(out / matrix.MATRIX_MD)
    print(f"\ntable: {out}/{matrix.MATRIX_MD}")
    return EXIT_CODES[run_status([r for _, r in done])] if done else EXIT_OK


def cmd_explore(args: argparse.Namespace) -> int:
    """`fakelet explore`: flags checked before anything starts, the report staged and swapped in as `run`'s."""
    options = explorecli.options_of(args)
    check_one_subject(args)
    out = check_out(args.out)
    run = build_run(args, args.subject, str(out))
    explorecli.check_rules(run, options)
    reap_dead_runs()
    stage = staging_dir(out)
    try:
        result = explorecli.run_explore(dataclasses.replace(run, out=stage), options, stage, out)
        with _stop.shielded():
            write_all(result.report, stage)
            swap_in(stage, out)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    print_report(result.report)
    explorecli.print_result(result, options.budget_s, stage, out)
    if result.interrupted:
        print("fakelet: interrupted; subjects stopped and sandboxes removed", file=sys.stderr)
    print(f"\nreports: {out}/")
    return EXIT_CODES[result.report.status()]


def cmd_checks() -> int:
    suites = [(kind, package) for kind, package in SUITES.items()]
    suites += [(f"{kind} ({name})", package) for name, (kind, package) in NAMED_SUITES.items()]
    for kind, package in suites:
        for check_id, (level, title) in catalog(package).items():
            print(f"{check_id:10} {level:6} {kind:13} {title}")
    return EXIT_OK


def _still_stopping(signum: int) -> None:
    # os.write, not print: the signal may have cut into a print to stderr (a reentrant write would raise).
    os.write(2, b"fakelet: still stopping: subjects, sandboxes and reports are being cleaned up\n")


_stop = StopSignals()  # main() installs a fresh one per call


def main(argv: list[str] | None = None, stopped: bool = False) -> int:
    """`stopped`: a stop signal came while fakelet imported its commands (cli.main); `run` then reports nothing ran."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["devices"]:
        from fake_devices.cli import main as devices_main

        # Its own parser: options after `devices` belong to it, not to ours.
        return devices_main(argv[1:])
    if argv[:1] in (["taint"], ["pods"]):
        from harness.run.sessioncli import main as session_main

        return session_main(argv[0], argv[1:])
    if argv[:1] == ["scenario"] and len(argv) > 1 and argv[1] not in SCENARIO_COMMANDS:
        argv = ["scenario", "run", *argv[1:]]  # `fakelet scenario NAME ...` is `fakelet scenario run NAME ...`
    args = build_parser().parse_args(argv)
    global _stop
    _stop = StopSignals(_still_stopping).install()
    _stop.requested = stopped
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    try:
        if args.command == "subjects":
            return cmd_subjects()
        if args.command == "subject":
            return subjectcli.main(args)
        if args.command == "checks":
            return cmd_checks()
        if args.command == "up":
            return cmd_up(args)
        if args.command == "scenario":
            return cmd_scenario(args)
        if args.command == "fidelity":
            return cmd_fidelity(args)
        if args.command == "merge":
            return cmd_merge(args)
        if args.command == "matrix":
            return cmd_matrix(args)
        if args.command == "explore":
            return cmd_explore(args)
        if args.command in certify.COMMANDS:
            return certify.main(args)
        if args.command in ("doctor", "prebuild"):
            return (doctorcli if args.command == "doctor" else prebuildcli).main(args)
        return cmd_run(args)
    except (UsageError, ProfileError, ValueError) as err:
        print(f"fakelet: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    except RuntimeError as err:
        print(f"fakelet: harness error: {err}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:
        # `fakelet checks | head`: the reader has what it wanted. Point stdout at /dev/null so that
        # the interpreter's own flush at exit does not fail a second time.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except OSError as err:
        print(f"fakelet: error: {err.strerror or err}: {err.filename or ''}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("fakelet: interrupted; subjects stopped and sandboxes removed", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
