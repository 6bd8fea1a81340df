"""What an exploration found: each finding with its replays, and how the report says it.

A finding (machine.py Finding: the shortest failing sequence of one key) is confirmed when a
replay of its repro file on a fresh node reproduces it: up to MAX_REPLAYS, the first that
reproduces ends them. Only a confirmed finding fails its invariant's check. One that never
replays is kept, unconfirmed, with its evidence side by side: the failing example's timeline and
the plugin's log then, each replay's timeline and the plugin's log then, each bounded. It is no
verdict on the plugin (a race may be the plugin's or fakelet's; the evidence is there to say
whose): its check passes, the invariant having held in every example that replays, its detail
and notes say so, and the report's findings name it. So a correct plugin's run is never failed,
nor left INCOMPLETE, by a failure nobody could show again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.explore import repro
from harness.explore.machine import Finding, Key
from harness.scenarios.schema import REPRODUCED
from reports.model import FAIL, PASS, CheckResult

MAX_REPLAYS = 3  # replays of one finding on a fresh node, at most: the first that reproduces it ends them
TIMELINE_LINES = 80  # a timeline's last lines kept as evidence: its end says what failed
SEQUENCE_LINES = 60  # a shrunk sequence's steps shown, at most (--max-steps 50 and its judgements)


@dataclass
class Replay:
    """One replay of a finding's repro file on a fresh node."""

    outcome: str  # harness/scenarios/schema.py OUTCOMES
    detail: str
    lines: list[str]  # its timeline (the stage's narration)
    plugin_log: list[str]  # the plugin's last lines as it ended
    duration_s: float = 0.0
    artifacts: str = ""  # where its timeline.json and subject.log are kept, relative to the report directory


@dataclass
class Kept:
    """A finding as the report carries it: the shortest sequence of its key, when it was found, its repro file and
    its replays."""

    finding: Finding
    first_steps: int  # the length of its first failing sequence, before hypothesis shrank it
    found_at_s: float  # seconds from the start to that first failure
    repro: Path | None = None
    replays: list[Replay] = field(default_factory=list)
    unreplayed: str = ""  # why it was replayed no (more) times: "interrupted", "the budget was spent"

    @property
    def key(self) -> Key:
        return self.finding.key

    @property
    def confirmed(self) -> bool:
        return any(r.outcome == REPRODUCED for r in self.replays)

    def outcome(self) -> str:
        """The deciding replay's outcome (schema.py OUTCOMES): reproduced, else the last one's; "" when none ran."""
        return REPRODUCED if self.confirmed else (self.replays[-1].outcome if self.replays else "")

    def replay_said(self) -> str:
        """'reproduced on replay 2 of 3', 'not reproduced in 3 replays (not reproduced, ...)', 'not replayed
        (interrupted)'."""
        for n, replay in enumerate(self.replays, 1):
            if replay.outcome == REPRODUCED:
                return f"reproduced on replay {n} of {MAX_REPLAYS}"
        if not self.replays:
            return f"not replayed ({self.unreplayed or 'interrupted'})"
        said = f"not reproduced in {len(self.replays)} replay(s) ({', '.join(r.outcome for r in self.replays)})"
        return said + (f"; no more: {self.unreplayed}" if self.unreplayed else "")

    def fact(self, out: Path) -> dict[str, Any]:
        """Its entry in report.facts["explore"]["findings"]."""
        return {"key": key_text(self.key), "invariant": self.finding.invariant, "rules": self.finding.rule_steps(),
                "time_to_find_s": self.found_at_s, "first_steps": self.first_steps,
                "shrunk_steps": len(self.finding.steps), "replay": self.replay_said(),
                "replays": [r.outcome for r in self.replays], "replays_tried": len(self.replays),
                "repro": str(self.repro.relative_to(out)) if self.repro else "", "confirmed": self.confirmed,
                **({"replay_artifacts": [r.artifacts for r in self.replays if r.artifacts]}
                   if any(r.artifacts for r in self.replays) else {})}

    def evidence(self) -> list[str]:
        """The notes lines of this finding: its shrunk sequence, then (unconfirmed) the failing example and each
        replay, each with its timeline and the plugin's log, their last lines."""
        lines = ["shrunk sequence:", *_last(repro.timeline(self.finding), SEQUENCE_LINES)]
        if self.confirmed:
            return [*lines, *_titled("timeline of the failing example", self.finding.lines)]
        lines += _titled("the failing example: timeline", self.finding.lines)
        lines += _titled("the failing example: the plugin's log", self.finding.plugin_log)
        for n, replay in enumerate(self.replays, 1):
            lines.append(f"replay {n} of {MAX_REPLAYS}: {replay.outcome}: {_first(replay.detail)}")
            lines += _titled(f"replay {n}: timeline", replay.lines)
            lines += _titled(f"replay {n}: the plugin's log", replay.plugin_log)
        return lines


def key_text(key: Key) -> str:
    return f"{key[0]} after {key[1]}"


def judge(check: CheckResult, kept: list[Kept], examples: int, command: Callable[[Kept], str]) -> None:
    """An invariant's check from its findings (`kept`, in the order found): FAIL with the first confirmed one's
    detail and repro when any replayed; PASS, saying each unconfirmed one, when none did. Every finding's replay
    line, repro command and evidence go to the notes."""
    if not kept:
        return
    confirmed = [k for k in kept if k.confirmed]
    unconfirmed = [k for k in kept if not k.confirmed]
    notes: list[str] = []
    for n, k in enumerate([*confirmed, *unconfirmed], 1):
        state = "confirmed" if k.confirmed else "UNCONFIRMED"
        notes.append(f"finding {n} of {len(kept)} ({state}): {key_text(k.key)}, found after {k.found_at_s:.0f}s, "
                     f"{k.first_steps} → {len(k.finding.steps)} steps, {k.replay_said()}"
                     + (f"; repro: {command(k)}" if k.repro else ""))
        notes += k.evidence()
    lead = (confirmed or unconfirmed)[0]
    check.repro, check.notes = command(lead) if lead.repro else "", notes
    if confirmed:
        check.verdict = FAIL
        more = f"\n(and {len(kept) - 1} more finding(s) of this invariant: see the notes)" if len(kept) > 1 else ""
        check.detail = lead.finding.detail + more
        return
    # A failure no replay showed again is no verdict on the plugin: the invariant held in every example that
    # replays. PASS, not not-exercised (it was exercised), nor skip (the check ran: a skip makes the run INCOMPLETE).
    check.verdict = PASS
    check.detail = (f"held in every step of {examples} example(s) but {_count(unconfirmed)} that did not replay "
                    f"(UNCONFIRMED, evidence in the notes): "
                    + "; ".join(f"{key_text(k.key)}: {k.replay_said()}: {_first(k.finding.detail)}"
                                for k in unconfirmed))


def unconfirmed_line(k: Kept, command: str) -> str:
    """The report's `findings` entry of an unconfirmed finding: seen once, not shown again."""
    return (f"UNCONFIRMED explore finding {key_text(k.key)}: {k.replay_said()}: {_first(k.finding.detail)}"
            + (f"; repro: {command}" if command else ""))


def _count(kept: list[Kept]) -> str:
    return f"{len(kept)} finding{'s' * (len(kept) != 1)}"


def _first(text: str) -> str:
    return text.splitlines()[0] if text else ""


def _last(lines: list[str], n: int) -> list[str]:
    return lines if len(lines) <= n else [f"... ({len(lines) - n} lines before)", *lines[-n:]]


def _titled(title: str, lines: list[str]) -> list[str]:
    kept = _last(lines, TIMELINE_LINES)
    return [f"{title}:" if lines else f"{title}: (none)", *("  " + line for line in kept)]
