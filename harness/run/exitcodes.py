"""What each `fakelet` command's exit code means: docs/reference/cli.md shows the table beside each command's flags.

Keyed by the command as typed (`run`, `scenario run`); each table was read off the function that returns the
code (named in its comment), and uses that module's own constants. Every command also has COMMON's codes:
commands.main turns bad input and fakelet's own failures into 2, and cli.main and commands.main a stop
signal into 130. tests/test_exitcodes.py fails on a command of the parser without a table here.
"""

from __future__ import annotations

from harness.run import certify, doctor, prebuild, scenariocli, subjectcli
from harness.run.cli import EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE
from reports.fields import STATUSES
from reports.model import CONFORMANT, EXIT_CODES, HARNESS_ERROR, INCOMPLETE, INTERRUPTED, NOT_CONFORMANT

COMMON: dict[int, str] = {
    EXIT_USAGE: "bad input (a flag, file or argument; one line names it, before anything starts), or fakelet's "
                "own failure (`fakelet: harness error: ...`)",
    EXIT_INTERRUPTED: "interrupted (Ctrl-C, SIGTERM): what had started is stopped and cleaned up first",
}


def _statuses(words: dict[str, str]) -> dict[int, str]:
    """The codes of a command that ends in reports: their run status's (reports/model.py EXIT_CODES), `words`
    saying what each status means for it."""
    out = {EXIT_CODES[status]: f"{status}: {when}" for status, when in words.items()}
    out[EXIT_CODES[HARNESS_ERROR]] += "; or bad input, or fakelet failed outside a check"
    return out


COMMANDS: dict[str, dict[int, str]] = {
    # commands.cmd_run: EXIT_CODES[run_status(reports)]; EXIT_OK for a shard with no pairs.
    "run": {**_statuses(STATUSES),
            EXIT_OK: f"{CONFORMANT}: {STATUSES[CONFORMANT]}; also a `--shard K/N` that no (subject, check) pair falls "
                     "to"},
    # commands.cmd_merge: EXIT_CODES[run_status(merged)]; MergeError is a ValueError (2).
    "merge": {**_statuses(STATUSES),
              EXIT_CODES[HARNESS_ERROR]: f"{HARNESS_ERROR}: {STATUSES[HARNESS_ERROR]}; or the directories are not "
                                         "shards of one run (each once, one catalog), or bad input"},
    # commands.cmd_matrix: EXIT_CODES[run_status(every cell's report)], EXIT_OK when no cell ran.
    "matrix": {**_statuses(STATUSES),
               EXIT_OK: f"{CONFORMANT} over every cell's report (with `--merge`, the merged shards' cells); also a "
                        "shard no cell falls to"},
    # commands.cmd_fidelity: EXIT_OK without gaps, else EXIT_CODES[NOT_CONFORMANT]; a machine without a real
    # kubelet is a UsageError.
    "fidelity": {EXIT_OK: "every verdict the two kubelets gave differently is explained (fidelity.md)",
                 EXIT_CODES[NOT_CONFORMANT]: "at least one unexplained difference between the fake and the real "
                                             "kubelet's verdicts (fidelity.md lists it)",
                 EXIT_USAGE: "bad input, or this machine cannot run a real kubelet (the line says why)"},
    # commands.cmd_up: EXIT_OK once `--for` has passed; Ctrl-C ends session.wait with a KeyboardInterrupt.
    "up": {EXIT_OK: "the session ran for `--for SECONDS` and stopped",
           EXIT_INTERRUPTED: "stopped by Ctrl-C or SIGTERM (the usual end without `--for`), the session cleaned up",
           EXIT_USAGE: "bad input, or the session could not start (`fakelet: harness error: ...`)"},
    # fake_devices/cli.py main and harness/run/sessioncli.py main: EXIT_OK, or EXIT_USAGE (session_call None).
    **{name: {EXIT_OK: "the session did what was asked (`--help` exits 0 too)",
              EXIT_USAGE: "bad input; no session (neither `--socket` nor `$FAKELET_CONTROL_SOCKET`); the session "
                          "could not be reached; or it refused the request (the line gives its reason)"}
       for name in ("devices", "taint", "pods")},
    # commands.cmd_scenario: EXIT_OK; scenariocli.shown's ProfileError is 2.
    "scenario list": {EXIT_OK: "the list is printed"},
    "scenario show": {EXIT_OK: "the scenario is printed",
                      EXIT_USAGE: "no such file or bundled scenario, or the file has problems (`fakelet scenario "
                                  "check` lists them all)"},
    # scenariocli.cmd_vocabulary: 0, or a ProfileError (2).
    "scenario vocabulary": {EXIT_OK: "the reference is printed",
                            EXIT_USAGE: "no step or condition of that name, or a NAME with `--format markdown`"},
    # scenariocli.cmd_check: EXIT_BROKEN when any file has a problem, else EXIT_KEPT.
    "scenario check": {scenariocli.EXIT_KEPT: "every file is a valid scenario",
                       scenariocli.EXIT_BROKEN: "a file has problems (each printed as `file:line: field: problem`), "
                                                "or is missing or names no bundled scenario"},
    # subjectcli.cmd_check: EXIT_INVALID when any file has a problem, else EXIT_VALID.
    "subject check": {subjectcli.EXIT_VALID: "every file is a valid subject file",
                      subjectcli.EXIT_INVALID: "a file has problems (each printed as `file:line: field: problem`), "
                                               "or is missing or names no bundled subject"},
    # commands.cmd_scenario_run: EXIT_CODES[report.status()], the scenario's one check at level MUST
    # (harness/scenarios/runner.py VERDICT_OF); with --case, scenariocli.run_cases's EXIT_* codes.
    "scenario run": {
        EXIT_CODES[CONFORMANT]: "not reproduced: the correct behaviour held (with `--case`: every case kept its "
                                "promise)",
        EXIT_CODES[NOT_CONFORMANT]: "reproduced: the bug's behaviour was seen (with `--case`: a case broke its "
                                    "promise)",
        EXIT_CODES[HARNESS_ERROR]: "bad input (a scenario file's every problem is listed), or fakelet's own failure",
        EXIT_CODES[INCOMPLETE]: "inconclusive: a step could not run or a precondition never held (with `--case`: "
                                "none broken, but a case could not run here or ended inconclusive)",
        EXIT_CODES[INTERRUPTED]: "interrupted: stopped by Ctrl-C or SIGTERM",
    },
    # commands.cmd_subjects, cmd_checks: EXIT_OK (a reader that leaves the pipe early too).
    "subjects": {EXIT_OK: "the list is printed (also when its reader stops early, as `| head` does)"},
    "checks": {EXIT_OK: "the list is printed (also when its reader stops early, as `| head` does)"},
    # certify.cmd_bundle: EXIT_OK; BundleError is a ValueError (2).
    "bundle": {EXIT_OK: "the bundle is written, whatever the verdict in it",
               EXIT_USAGE: "bad input: no report in REPORT_DIR, an `-o` that cannot be written (a directory, inside "
                           "REPORT_DIR), a key ssh-keygen cannot sign with"},
    # certify.cmd_verify and certify.main: EXIT_OK, EXIT_MISMATCH on bundle.Mismatch.
    "verify": {EXIT_OK: "the bundle verifies: every file matches its manifest (and the signature, when one is "
                        "asked for or present); whatever the verdict in it, which the output prints",
               certify.EXIT_MISMATCH: "MISMATCH: a file changed, missing or added since bundling, or the signature "
                                      "is missing, does not sign the manifest or is by a key `--allowed-signers` "
                                      "does not allow",
               EXIT_USAGE: "the bundle cannot be read (not a fakelet bundle, corrupt), or bad input"},
    # certify.cmd_compare: EXIT_MISMATCH when compare.regressions, else EXIT_OK; a bundle side's manifest is checked.
    "compare": {EXIT_OK: "no regression (other changes, improvements and timing moves are printed)",
                certify.EXIT_MISMATCH: "a regression: a check that passed in OLD fails in NEW; or a bundle given "
                                       "does not match its manifest",
                EXIT_USAGE: "bad input: a side that is not a report directory or a readable bundle"},
    # commands.cmd_explore: EXIT_CODES[report.status()], each invariant a MUST check (harness/explore/explorer.py).
    "explore": _statuses({**STATUSES, CONFORMANT: "no confirmed finding: every invariant held in every example, "
                                                  "or broke only where no replay showed it again (reported "
                                                  "unconfirmed, with its evidence)",
                          NOT_CONFORMANT: "a confirmed finding: an invariant broke, and its shrunk sequence replayed "
                                          "the break",
                          INCOMPLETE: "no invariant was judged (never a finding, confirmed or not)"}),
    # doctor.main: EXIT_OK when the main job can run, else EXIT_CANNOT.
    "doctor": {doctor.EXIT_OK: "the main job (the reference subjects on the fake kubelet) can run here",
               doctor.EXIT_CANNOT: "it cannot; the lines say what is missing and how to get it"},
    # prebuild.main: EXIT_OK, EXIT_FAILED, EXIT_INTERRUPTED.
    "prebuild": {prebuild.EXIT_OK: "everything asked for is cached or on PATH (with `--dry-run`: the plan is "
                                   "printed)",
                 prebuild.EXIT_FAILED: "a build failed (its lines say which and why)",
                 prebuild.EXIT_INTERRUPTED: "interrupted: the half-built binary is removed, the finished ones stay"},
}


def of(command: str) -> dict[int, str]:
    """A command's exit codes, COMMON's included, by code."""
    return dict(sorted({**COMMON, **COMMANDS[command]}.items()))
