"""`fakelet bundle`, `fakelet verify` and `fakelet compare`: what a vendor hands over, and a diff of two runs.

The work is in reports/bundle.py and reports/compare.py (they read reports, never the harness);
this front door only parses flags and says the outcome. Bad input (a missing or corrupt report
directory or bundle, a key ssh-keygen cannot use) is one `fakelet: error:` line and exit 2; a bundle
that does not match its manifest or signature is one line naming the file, and exit 1.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from harness.config.runconfig import RunConfig
from reports import bundle, compare
from reports.model import SubjectReport
from reports.provenance import mark_near_bound
from reports.writers import write_all

COMMANDS = ("bundle", "verify", "compare")
MAX_REPEAT = 100  # more runs than this is a soak, not a measurement of the noise
EXIT_OK, EXIT_MISMATCH = 0, 1


def add_parsers(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    b = sub.add_parser("bundle", help="pack a report directory with its provenance, a SHA-256 manifest and a "
                                      "badge into a .tar.gz, optionally signed with an OpenSSH key")
    b.add_argument("report_dir", metavar="REPORT_DIR", help="a report directory fakelet wrote (fakelet run --out)")
    b.add_argument("-o", "--output", metavar="OUT.tar.gz",
                   help="the bundle to write (default: REPORT_DIR's name + .tar.gz, in the current directory)")
    b.add_argument("--sign", metavar="KEY", help="sign the manifest with this OpenSSH private key "
                                                 "(ssh-keygen -Y sign -n fakelet); no passphrase prompt")
    v = sub.add_parser("verify", help="check a bundle's files against its manifest and signature; print its "
                                      "verdict, subject and provenance")
    v.add_argument("bundle", metavar="BUNDLE", help="a .tar.gz from fakelet bundle")
    v.add_argument("--allowed-signers", metavar="FILE",
                   help="an OpenSSH allowed_signers file: the bundle must be signed by a key in it")
    c = sub.add_parser("compare", help="what changed between two runs: verdicts, reaction times beyond the "
                                       "noise, new findings; exit 1 on a regression (pass -> fail)")
    c.add_argument("old", metavar="OLD", help="a report directory or a bundle")
    c.add_argument("new", metavar="NEW", help="a report directory or a bundle")
    c.add_argument("--format", default="text", choices=["text", "markdown"],
                   help="text (default) or markdown (a pull-request comment)")


def main(args: argparse.Namespace) -> int:
    try:
        if args.command == "bundle":
            return cmd_bundle(args)
        if args.command == "verify":
            return cmd_verify(args)
        return cmd_compare(args)
    except bundle.Mismatch as err:
        print(f"fakelet: {args.command}: MISMATCH: {err}", file=sys.stderr)
        return EXIT_MISMATCH


def cmd_bundle(args: argparse.Namespace) -> int:
    source = Path(args.report_dir)
    if args.output is not None and not args.output.strip():
        raise bundle.BundleError("-o is empty; name the bundle to write")
    out = Path(args.output) if args.output else Path.cwd() / f"{source.resolve().name or 'fakelet-report'}.tar.gz"
    if out.is_dir():
        raise bundle.BundleError(f"-o {out}: is a directory; name a file such as {out / 'bundle.tar.gz'}")
    if out.resolve().is_relative_to(source.resolve()):
        raise bundle.BundleError(f"-o {out}: inside the report directory it bundles; write it elsewhere")
    written, reports, count = bundle.make(source, out, Path(args.sign) if args.sign else None)
    status = bundle.badge_status(reports)
    print(f"bundle: {written} ({count} files{', manifest signed' if args.sign else ', unsigned'}): {status}")
    return EXIT_OK


def cmd_verify(args: argparse.Namespace) -> int:
    allowed = Path(args.allowed_signers) if args.allowed_signers else None
    for line in bundle.verify(Path(args.bundle), allowed):
        print(line)
    return EXIT_OK


def load_side(value: str) -> list[SubjectReport]:
    """A report directory, or a bundle whose manifest is checked first (its signature is verify's job)."""
    path = Path(value)
    if path.is_file():
        files = bundle.read(path)
        bundle.check_manifest(files)
        return bundle.reports_of(files, value)
    return bundle.load_dir(path)


def cmd_compare(args: argparse.Namespace) -> int:
    old, new = load_side(args.old), load_side(args.new)
    diffs = compare.diff(old, new)
    write = compare.markdown if args.format == "markdown" else compare.text
    sys.stdout.write(write(diffs, args.old, args.new))
    return EXIT_MISMATCH if compare.regressions(diffs) else EXIT_OK


def add_repeat_flag(run: argparse.ArgumentParser) -> None:
    run.add_argument("--repeat", type=int, default=1, metavar="N",
                     help="run each subject's checks N times: a check fails if any run failed it, its reaction "
                          "times are their median, and every run's time is kept for fakelet compare's noise "
                          f"(at most {MAX_REPEAT})")


def check_repeat(args: argparse.Namespace) -> None:
    if not 1 <= args.repeat <= MAX_REPEAT:
        raise bundle.BundleError(f"--repeat {args.repeat}: must be between 1 and {MAX_REPEAT}")


def run_repeated(run_one: Callable[[argparse.Namespace, RunConfig, Path], SubjectReport], args: argparse.Namespace,
                 run: RunConfig, out: Path) -> SubjectReport:
    """`run_one` N times (--repeat), each run's reports and artifacts under out/runs/K, merged into one at out."""
    if getattr(args, "repeat", 1) <= 1:
        return run_one(args, run, out)
    reports = []
    for k in range(1, args.repeat + 1):
        print(f"{run.spec.name}: run {k} of {args.repeat}", flush=True)
        reports.append(run_one(args, run, out / "runs" / str(k)))
    merged = compare.merge_repeats(reports)
    mark_near_bound(merged, run.profile.reaction_s)
    write_all(merged, out)
    return merged
