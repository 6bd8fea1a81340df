#!/usr/bin/env bash
# Run action.yml's steps in order, as GitHub would, from an empty temporary directory and a fresh venv,
# on this machine (there is no GitHub here), and check what a pipeline relies on:
#
#   bash tools/ci_action_steps.sh dist/fakelet-0.1.0-py3-none-any.whl
#
# Job 1, a runner user with sudo (stand-ins for sudo and id; the sudo one replaces PATH with a
# secure_path, as the real one does): a run that is NOT CONFORMANT. The report must be uploaded all
# the same, the job summary must list the failure before the passes, the outputs must say exit 1,
# and the action must exit 1, fakelet's code.
# Job 2, as root, with a bad flag: fakelet exits 2 before any report exists; the action must still
# run its upload and summary steps, say why on the summary, and exit 2. It also restores job 1's cache.
#
# tools/ci_action_steps.py is the step runner (the uses: steps' local stand-ins are described there).
# Exit 0 when every check holds; about a minute, most of it pip installing fakelet twice.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PYTHON="${PYTHON:-python3}"   # the step runner's own interpreter: it needs PyYAML to read action.yml

if [ $# -ne 1 ] || [ ! -f "$1" ]; then
  echo "usage: bash tools/ci_action_steps.sh PATH_TO_WHEEL   (build one: pip wheel --no-deps . -w dist)" >&2
  exit 2
fi
WHEEL="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
"$PYTHON" -c 'import yaml' 2>/dev/null || { echo "ci_action_steps: $PYTHON has no PyYAML (pip install pyyaml)" >&2; exit 2; }

WORK="$(mktemp -d "${TMPDIR:-/tmp}/fakelet-action.XXXXXX")"
cleanup() { if [ -z "${KEEP:-}" ]; then rm -rf "$WORK"; else echo "kept $WORK"; fi; }
trap cleanup EXIT
echo "ci_action_steps: $WHEEL, in $WORK"

failures=0
check() {  # check DESCRIPTION COMMAND...: one line each, and the script fails at the end if any did
  local what="$1"; shift
  if "$@"; then echo "ok: $what"; else echo "FAILED: $what"; failures=$((failures + 1)); fi
}
output() { "$PYTHON" -c 'import json, sys; print(json.load(open(sys.argv[1]))["outputs"][sys.argv[2]])' "$1" "$2"; }
outcome() {  # outcome RESULT STEP_NAME: that step's outcome in the job
  "$PYTHON" -c 'import json, sys; print(next(s["outcome"] for s in json.load(open(sys.argv[1]))["steps"]
                                              if s["name"] == sys.argv[2]))' "$1" "$2"
}
step_output() {  # step_output RESULT STEP_ID NAME: one output of one step ('' if it has none)
  "$PYTHON" -c 'import json, sys; print(json.load(open(sys.argv[1]))["step_outputs"].get(sys.argv[2], {})
                                        .get("outputs", {}).get(sys.argv[3], ""))' "$1" "$2" "$3"
}
line_of() { grep -n -m1 -F -- "$2" "$1" | cut -d: -f1; }
before() {  # before FILE FIRST SECOND: FIRST's first line comes before SECOND's
  local a b; a="$(line_of "$1" "$2")"; b="$(line_of "$1" "$3")"
  [ -n "$a" ] && [ -n "$b" ] && [ "$a" -lt "$b" ]
}

# -- the runner user's sudo and id ----------------------------------------------------------------------------
SHIMS="$WORK/shims"
mkdir -p "$SHIMS"
cat > "$SHIMS/sudo" <<EOF
#!/usr/bin/env bash
# sudo as on a GitHub runner: passwordless; PATH becomes secure_path; --preserve-env keeps the rest.
echo "sudo \$*" >> "$WORK/sudo.log"
keep=0
while [ \$# -gt 0 ]; do
  case "\$1" in --preserve-env|-E) keep=1; shift ;; --preserve-env=*) shift ;; --) shift; break ;; -*) shift ;; *) break ;; esac
done
secure=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
if [ \$keep -eq 0 ]; then exec env -i "PATH=\$secure" HOME=/root "\$@"; fi
PATH="\$secure" exec "\$@"
EOF
cat > "$SHIMS/id" <<'EOF'
#!/usr/bin/env bash
# The runner user's ids (GitHub's runner is uid 1001); anything else is the real id's.
case "${1:-}" in -u|-g) echo 1001 ;; *) exec /usr/bin/id "$@" ;; esac
EOF
chmod +x "$SHIMS/sudo" "$SHIMS/id"

# -- job 1: NOT CONFORMANT, as the runner user ----------------------------------------------------------------
# DP-REG-04 fails within seconds on this mutant (its endpoint climbs out of the directory); DP-REG-01 and
# DP-REG-03 pass, so that the summary has passes to fold below the failure.
echo; echo "==== job 1: a NOT CONFORMANT run, as a runner user with sudo"
set +e
"$PYTHON" "$ROOT/tools/ci_action_steps.py" "$WORK/job1" --shims "$SHIMS" \
  --input "fakelet-package=$WHEEL" --input subject=reference-dp \
  --input "flags=--defect endpoint-traversal --check DP-REG-01 --check DP-REG-03 --check DP-REG-04" \
  --input upload-name=report-not-conformant
code1=$?
set -e
R1="$WORK/job1/result.json"
UP1="$WORK/job1/uploaded/report-not-conformant"
S1="$WORK/job1/step-summary.md"
echo
check "job 1: the action exits 1, fakelet's code for NOT CONFORMANT (got $code1)" test "$code1" -eq 1
check "job 1: outputs exit-code 1 and status NOT CONFORMANT" \
  test "$(output "$R1" exit-code)/$(output "$R1" status)" = "1/NOT CONFORMANT"
check "job 1: the report was uploaded although the run failed" \
  test -f "$UP1/report.json" -a -f "$UP1/junit.xml" -a -f "$UP1/summary.md" -a -f "$UP1/report.html"
check "job 1: the uploaded report says NOT CONFORMANT" grep -q '"status": "NOT CONFORMANT"' "$UP1/report.json"
check "job 1: fakelet ran through sudo --preserve-env env PATH=... with the venv's absolute path" \
  grep -q '^sudo --preserve-env env PATH=.* /.*/fakelet-venv/bin/fakelet run ' "$WORK/sudo.log"
check "job 1: the summary starts with the status and its exit code" \
  grep -q '^## fakelet run: NOT CONFORMANT (exit 1)' "$S1"
check "job 1: the summary names the cause" grep -q 'MUST check failed: DP-REG-04' "$S1"
check "job 1: the failure, with its repro command, comes before the folded passes" \
  before "$S1" "- **DP-REG-04**" "<details>"
check "job 1: the failure's repro command is on the summary" \
  grep -q 'reproduce: `fakelet run --subject reference-dp --defect endpoint-traversal' "$S1"
check "job 1: the passes are inside the fold" before "$S1" "<summary>2 passed</summary>" "- DP-REG-01"
check "job 1: the build cache was saved" test "$(outcome "$R1" "Save fakelet's build cache")" = success
check "job 1: the last step ran and failed as fakelet did" test "$(outcome "$R1" "Exit as fakelet did")" = failure

# -- job 2: bad input, as root --------------------------------------------------------------------------------
sudo_calls="$(wc -l < "$WORK/sudo.log")"
echo; echo "==== job 2: a bad flag (exit 2 before any report), as root"
set +e
"$PYTHON" "$ROOT/tools/ci_action_steps.py" "$WORK/job2" \
  --input "fakelet-package=$WHEEL" --input subject=reference-dp --input "flags=--seed -1" \
  --input upload-name=report-bad-input
code2=$?
set -e
R2="$WORK/job2/result.json"
S2="$WORK/job2/step-summary.md"
echo
check "job 2: the action exits 2, fakelet's code for bad input (got $code2)" test "$code2" -eq 2
check "job 2: outputs exit-code 2 and status ERROR" test "$(output "$R2" exit-code)/$(output "$R2" status)" = "2/ERROR"
check "job 2: job 1's build cache was restored (another key of the same fakelet and Go)" \
  test -n "$(step_output "$R2" restore cache-matched-key)"
check "job 2: the upload step ran, with nothing to upload" \
  test "$(outcome "$R2" "Upload the report")" = success -a -f "$WORK/job2/uploaded/report-bad-input.empty"
check "job 2: the summary says fakelet stopped before a report" \
  grep -q 'fakelet stopped before it wrote a report' "$S2"
check "job 2: no sudo as root" test "$(wc -l < "$WORK/sudo.log")" -eq "$sudo_calls"

echo
echo "---- job 1's summary, as the job page shows it:"
cat "$S1"
echo "----"
if [ "$failures" -ne 0 ]; then
  echo "ci_action_steps: $failures check(s) failed"
  exit 1
fi
echo "ci_action_steps: every check held"
