"""`fakelet compare OLD NEW`: what changed between two runs (two builds of a driver), check by check.

- Verdicts: pass -> fail is a regression (the exit code says 1); fail -> pass an improvement; a check
  that became (or stopped being) exercised, applicable or runnable is said as such, never counted.
- Reaction times (`measured`): a move counts only beyond the noise. When both sides hold several
  samples of a time (a check run more than once: `samples`), the noise is the larger of the two sides'
  spreads (max - min), and a move is the difference of the medians beyond it. Otherwise the noise is
  unknown, and a move must exceed both UNKNOWN_NOISE_REL of the old time and UNKNOWN_NOISE_ABS_S: a
  shared CI runner's scheduling alone moves a reaction by tenths of a second, and a registration that
  takes 0.3 s one run and 0.6 s the next is no news. Such a move is said as "noise unknown", with both
  runs' load; where the loads differ greatly (LOAD_RATIO) it says the move may be the machine's.
- Evidence: a check that fails (or errors) on NEW carries NEW's whole detail, bounded (EVIDENCE_LINES,
  EVIDENCE_BYTES, and at most MAX_EVIDENCE checks a comparison), and its repro command.
- Findings: those on NEW that OLD did not have (pids and paths aside).
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass, field
from typing import Any

from reports.model import ERROR, FAIL, NOT_APPLICABLE, NOT_EXERCISED, PASS, SKIP, CheckResult, SubjectReport
from reports.provenance import load_text, peak_load

UNKNOWN_NOISE_REL = 0.5  # 50% of the old time ...
UNKNOWN_NOISE_ABS_S = 0.5  # ... and half a second, both, when the runs give no spread of their own
# Two runs' loads differ greatly when the higher peak is at least LOAD_RATIO times the lower and apart from it by
# half the CPU count (at least LOAD_GAP_MIN): load 3 against 25 on 2 CPUs does, 0.5 against 1.2 does not.
LOAD_RATIO = 2.0
LOAD_GAP_MIN = 1.0
# A failure's evidence as a reader gets it: enough for a timeline's "saw instead" list, short of a log dump.
EVIDENCE_LINES = 40
EVIDENCE_BYTES = 4096
# Checks whose evidence a comparison carries: ten bounded details stay well inside a GitHub comment's limit of
# 65536 characters; the rest are named, their evidence left to NEW's report.
MAX_EVIDENCE = 10
WORDS = {PASS: "pass", FAIL: "fail", NOT_EXERCISED: "not exercised", NOT_APPLICABLE: "n/a", SKIP: "skip",
         ERROR: "error", None: "not run"}


@dataclass
class Change:
    check: str
    kind: str  # regression, improvement, coverage, other, timing
    text: str
    evidence: str = ""  # NEW's whole detail, when the check fails or errors there
    repro: str = ""  # NEW's command that reruns the check, when it has one


@dataclass
class SubjectDiff:
    old: SubjectReport | None
    new: SubjectReport | None
    changes: list[Change] = field(default_factory=list)
    findings: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        old, new = (self._label(self.old), self._label(self.new))
        return old if old == new or not new else (new if not old else f"{old} -> {new}")

    @staticmethod
    def _label(r: SubjectReport | None) -> str:
        return "" if r is None else r.subject + (f" [defect {r.defect}]" if r.defect else "")

    def of(self, kind: str) -> list[Change]:
        return [c for c in self.changes if c.kind == kind]


def verdict_change(check: str, old: CheckResult | None, new: CheckResult | None) -> Change | None:
    before, after = (old.verdict if old else None), (new.verdict if new else None)
    if before == after:
        return None
    said = f"{WORDS[before]} -> {WORDS[after]}"
    failed = new is not None and after in (FAIL, ERROR)
    why = (new.detail.splitlines() or [""])[0][:160] if failed and new else ""
    proof = {"evidence": new.detail.strip("\n"), "repro": new.repro} if failed and new else {}
    if before == PASS and after == FAIL:
        return Change(check, "regression", f"{said}: {why}" if why else said, **proof)
    if before == FAIL and after == PASS:
        return Change(check, "improvement", said)
    if NOT_EXERCISED in (before, after) or NOT_APPLICABLE in (before, after) or None in (before, after):
        what = "now exercised" if before == NOT_EXERCISED else ("no longer exercised" if after == NOT_EXERCISED
                                                                 else "coverage changed")
        if None in (before, after):
            what = "only in NEW" if before is None else "only in OLD"
        return Change(check, "coverage", f"{said} ({what})" + (f": {why}" if why else ""), **proof)
    return Change(check, "other", f"{said}" + (f": {why}" if why else ""), **proof)


def bounded(detail: str) -> str:
    """`detail` cut to EVIDENCE_LINES lines and EVIDENCE_BYTES bytes (UTF-8), saying how many lines were left
    off."""
    lines = detail.splitlines()
    kept: list[str] = []
    size = 0
    for line in lines[:EVIDENCE_LINES]:
        room = EVIDENCE_BYTES - size
        if room <= 0:
            break
        piece = line.encode()[:room].decode(errors="ignore")
        kept.append(piece)
        size += len(piece.encode()) + 1
        if len(piece) < len(line):
            kept[-1] += " ..."
            break
    left = len(lines) - len(kept)
    return "\n".join(kept) + (f"\n... {left} more line{'s' * (left > 1)} (the whole detail is in NEW's report.json)"
                              if left else "")


def host(r: SubjectReport | None) -> dict[str, Any]:
    return dict(r.provenance.get("host") or {}) if r is not None else {}


def loads_differ(old: dict[str, Any], new: dict[str, Any]) -> bool:
    """Whether two runs' peak loads differ greatly (LOAD_RATIO): a reaction time's move may then be the machine's."""
    a, b = peak_load(old), peak_load(new)
    if a is None or b is None:
        return False
    lo, hi = sorted((a, b))
    cpus = max(old.get("cpus") or 0, new.get("cpus") or 0)
    return hi >= LOAD_RATIO * lo and hi - lo >= max(LOAD_GAP_MIN, cpus / 2)


def loads_said(old: dict[str, Any], new: dict[str, Any]) -> str:
    said = f"OLD {load_text(old)}, NEW {load_text(new)}"
    if loads_differ(old, new):
        said += ": the loads differ greatly, the move may be the machine's rather than the plugin's"
    return said


def _samples(c: CheckResult, what: str) -> list[float]:
    return list(c.samples.get(what) or [c.measured[what]])


def timing_changes(check: str, old: CheckResult, new: CheckResult, old_host: dict[str, Any] | None = None,
                   new_host: dict[str, Any] | None = None) -> list[Change]:
    """Reaction times moved beyond the noise, each with both runs' load (a busy runner slows every reaction)."""
    out = []
    for what in sorted(set(old.measured) & set(new.measured)):
        a, b = _samples(old, what), _samples(new, what)
        t0, t1 = statistics.median(a), statistics.median(b)
        moved = t1 - t0
        if len(a) > 1 and len(b) > 1:
            noise = max(max(a) - min(a), max(b) - min(b))
            beyond = abs(moved) > noise
            basis = f"noise {noise:.3g}s, the larger spread of {len(a)} and {len(b)} runs"
        else:
            beyond = abs(moved) > max(UNKNOWN_NOISE_ABS_S, UNKNOWN_NOISE_REL * t0)
            basis = (f"noise unknown (one run a side): threshold max({UNKNOWN_NOISE_ABS_S:g}s, "
                     f"{UNKNOWN_NOISE_REL:.0%} of OLD)")
        if beyond:
            word = "slower" if moved > 0 else "faster"
            out.append(Change(check, "timing", f"{what}: {t0:.3g}s -> {t1:.3g}s ({word} by {abs(moved):.3g}s; "
                                               f"{basis}; {loads_said(old_host or {}, new_host or {})})"))
    return out


def finding_kind(finding: str) -> str:
    return re.sub(r"\[.*\]|\d+", "#", finding)


def diff_subject(old: SubjectReport | None, new: SubjectReport | None) -> SubjectDiff:
    d = SubjectDiff(old, new)
    before = {c.id: c for c in old.checks} if old else {}
    after = {c.id: c for c in new.checks} if new else {}
    for check in sorted(set(before) | set(after)):
        change = verdict_change(check, before.get(check), after.get(check))
        if change is not None:
            d.changes.append(change)
        if check in before and check in after:
            d.changes.extend(timing_changes(check, before[check], after[check], host(old), host(new)))
    known = {finding_kind(f) for f in (old.findings if old else [])}
    d.findings = [f for f in (new.findings if new else []) if finding_kind(f) not in known]
    return d


def diff(old: list[SubjectReport], new: list[SubjectReport]) -> list[SubjectDiff]:
    """Subjects paired by name; one on each side pair whatever their names (two builds, two names)."""
    if len(old) == 1 and len(new) == 1:
        return [diff_subject(old[0], new[0])]
    by_old, by_new = {r.subject: r for r in old}, {r.subject: r for r in new}
    return [diff_subject(by_old.get(n), by_new.get(n)) for n in sorted(set(by_old) | set(by_new))]


def regressions(diffs: list[SubjectDiff]) -> list[str]:
    return [c.check for d in diffs for c in d.of("regression")]


SECTIONS = (("regression", "Regressions (pass -> fail)"), ("improvement", "Improvements (fail -> pass)"),
            ("coverage", "Coverage changes"), ("other", "Other verdict changes"),
            ("timing", "Reaction times moved beyond the noise"))


def _status(r: SubjectReport | None) -> str:
    return "not in this run" if r is None else r.status_line()


def _status_and_load(r: SubjectReport | None, bold: str = "") -> str:
    """The run's status, and the load it ran under: a reader weighs a slower reaction against it."""
    said = f"{bold}{_status(r)}{bold}"
    return said if r is None else f"{said} ({load_text(host(r))})"


def headline(diffs: list[SubjectDiff]) -> str:
    bad = regressions(diffs)
    if bad:
        return f"REGRESSED: {len(bad)} check{'s' * (len(bad) > 1)} went from pass to fail: {', '.join(bad)}"
    return "no regression"


def with_evidence(diffs: list[SubjectDiff]) -> list[tuple[SubjectDiff, Change]]:
    """The changes whose evidence is shown, regressions first, at most MAX_EVIDENCE."""
    order = {kind: n for n, (kind, _) in enumerate(SECTIONS)}
    found = [(d, c) for d in diffs for c in d.changes if c.evidence or c.repro]
    return sorted(found, key=lambda dc: order[dc[1].kind])[:MAX_EVIDENCE]


def _evidence_left(diffs: list[SubjectDiff]) -> list[str]:
    shown = {id(c) for _, c in with_evidence(diffs)}
    return [c.check for d in diffs for c in d.changes if (c.evidence or c.repro) and id(c) not in shown]


def text(diffs: list[SubjectDiff], old_name: str, new_name: str) -> str:
    lines = [f"compare: OLD {old_name}  NEW {new_name}", headline(diffs)]
    shown = {id(c) for _, c in with_evidence(diffs)}
    for d in diffs:
        lines += ["", f"{d.name}:", f"  OLD: {_status_and_load(d.old)}",
                  f"  NEW: {_status_and_load(d.new)}"]
        for kind, title in SECTIONS:
            changes = d.of(kind)
            if changes:
                lines.append(f"  {title}:")
                for c in changes:
                    lines.append(f"    {c.check:10} {c.text}")
                    if id(c) in shown:
                        lines += _text_evidence(c)
        if d.findings:
            lines.append("  New findings:")
            lines += [f"    {f}" for f in d.findings]
        if not d.changes and not d.findings:
            lines.append("  no change in verdicts, reaction times beyond the noise, or findings")
    left = _evidence_left(diffs)
    if left:
        lines += ["", f"evidence of {len(left)} more failing check(s) left to NEW's report: {', '.join(left)}"]
    return "\n".join(lines) + "\n"


def _text_evidence(c: Change) -> list[str]:
    out = []
    if c.evidence:
        out.append(f"{'':15}evidence (NEW):")
        out += [f"{'':17}{line}" for line in bounded(c.evidence).splitlines()]
    if c.repro:
        out.append(f"{'':15}repro: {c.repro}")
    return out


def _cell(value: str) -> str:
    return value.replace("|", "\\|").replace("\n", " ")


def fence(body: str, info: str = "") -> list[str]:
    """`body` as a fenced code block whose fence no backtick run inside it can close."""
    longest = max((len(run) for run in re.findall(r"`+", body)), default=0)
    mark = "`" * max(3, longest + 1)
    return [mark + info, *body.splitlines(), mark]


def _html(value: str) -> str:
    return value.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _markdown_evidence(d: SubjectDiff, c: Change) -> list[str]:
    """One check's evidence, collapsed under its first line: a comment with ten failures stays readable."""
    first = (c.evidence.splitlines() or [c.text])[0][:160]
    lines = [f"<details><summary><code>{_html(c.check)}</code> ({_html(d.name)}): {_html(first)}</summary>", ""]
    if c.evidence:
        lines += [*fence(bounded(c.evidence), "text"), ""]
    if c.repro:
        lines += ["Repro:", "", *fence(c.repro, "sh"), ""]
    return [*lines, "</details>", ""]


def markdown(diffs: list[SubjectDiff], old_name: str, new_name: str) -> str:
    """For a pull-request comment: the verdict first, one table per kind of change, then the evidence of each
    failing check (bounded) with its repro command."""
    bad = regressions(diffs)
    icon = ":x:" if bad else ":white_check_mark:"
    lines = [f"### fakelet compare: {icon} {headline(diffs)}", "",
             f"OLD `{_cell(old_name)}` vs NEW `{_cell(new_name)}`", ""]
    for d in diffs:
        lines += [f"#### {_cell(d.name)}", "", f"- OLD: {_cell(_status_and_load(d.old, '**'))}",
                  f"- NEW: {_cell(_status_and_load(d.new, '**'))}", ""]
        for kind, title in SECTIONS:
            changes = d.of(kind)
            if changes:
                lines += [f"**{title}**", "", "| check | change |", "| --- | --- |"]
                lines += [f"| {c.check} | {_cell(c.text)} |" for c in changes]
                lines.append("")
        if d.findings:
            lines += ["**New findings**", ""] + [f"- {_cell(f)}" for f in d.findings] + [""]
        if not d.changes and not d.findings:
            lines += ["No change in verdicts, reaction times beyond the noise, or findings.", ""]
    shown = with_evidence(diffs)
    if shown:
        lines += ["**Evidence (NEW)**", ""]
        for d, c in shown:
            lines += _markdown_evidence(d, c)
    left = _evidence_left(diffs)
    if left:
        lines += [f"Evidence of {len(left)} more failing check(s) left to NEW's report: {', '.join(left)}", ""]
    return "\n".join(lines)


# Which verdict a check repeated N times gets when its runs disagree: any failure is a failure (a flaky
# plugin fails), then fakelet's own error, then the verdicts that cover less.
REPEAT_ORDER = (FAIL, ERROR, NOT_EXERCISED, SKIP, NOT_APPLICABLE, PASS)


def merge_repeats(runs: list[SubjectReport]) -> SubjectReport:
    """One report of a subject run N times (`fakelet run --repeat N`): each check's verdict as REPEAT_ORDER
    says (with a note when the runs disagreed), its measured times the median of the runs, and every run's
    time kept in `samples`, which is the spread `compare` holds a move against."""
    first, last = runs[0], runs[-1]
    merged = SubjectReport.from_dict(first.to_dict())
    merged.duration_s = round(sum(r.duration_s for r in runs), 3)
    merged.missing = sorted({m for r in runs for m in r.missing})
    merged.interrupted = any(r.interrupted for r in runs)
    seen = {finding_kind(f) for f in merged.findings}
    for r in runs[1:]:
        merged.findings += [f for f in r.findings if finding_kind(f) not in seen]
        seen |= {finding_kind(f) for f in r.findings}
    by_id: dict[str, list[CheckResult]] = {}
    for r in runs:
        for c in r.checks:
            by_id.setdefault(c.id, []).append(c)
    checks = []
    for results in (by_id[k] for k in sorted(by_id)):
        verdict = next(v for v in REPEAT_ORDER if any(c.verdict == v for c in results))
        chosen = next(c for c in results if c.verdict == verdict)
        c = CheckResult(**{**chosen.__dict__, "notes": list(chosen.notes), "measured": {}, "samples": {}})
        c.duration_s = round(sum(x.duration_s for x in results), 3)
        tally = {v: sum(1 for x in results if x.verdict == v) for v in REPEAT_ORDER}
        if len([n for n in tally.values() if n]) > 1:
            c.notes.append(f"verdicts across {len(results)} runs: "
                           + ", ".join(f"{WORDS[v]} x{n}" for v, n in tally.items() if n))
        for what in sorted({k for x in results for k in x.measured}):
            samples = [x.measured[what] for x in results if what in x.measured]
            c.samples[what] = samples
            c.measured[what] = round(statistics.median(samples), 3)
        for x in results:
            c.notes += [n for n in x.notes if n not in c.notes]
        checks.append(c)
    merged.checks = checks
    merged.facts["repeated"] = f"{len(runs)} runs; verdicts merged, reaction times their median (samples kept)"
    if first.provenance and last.provenance:
        host = dict(first.provenance.get("host", {}))
        host["load_end"] = last.provenance.get("host", {}).get("load_end", [])
        merged.provenance["host"] = host
    return merged
