"""`fakelet explore` on either kubelet: what the real node needs, the rules it cannot carry out, and a finding
replayed on the other kubelet.

On `--node real` every example is a real kubelet (harness/node/real) joined to fakelet's local API server, the
plugin reached through the relay, as `fakelet scenario run --node real` runs a scenario: the rules are the same
scenario steps, carried out by the same engine. `--replay-on real` replays each finding of the fake node on a
real kubelet too, so that a finding is known to be the plugin's and not the fake kubelet's (`--replay-on fake`,
from the real node, asks the opposite: does the fake kubelet show what the real one did).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.config.runconfig import RunConfig
from harness.explore.rules import Rule
from reports.model import SubjectReport

FAKE, REAL = "fake", "real"
NODES = (FAKE, REAL)
# The steps the scenario engine carries out on the fake kubelet only (it refuses them, inconclusive, on the real
# node), and why: harness/scenarios/kubelet_steps.py _drop_health_stream. Every other step the rules take runs on
# both (a held or rejected call through the relay's fault plan, kubelet.sock deleted through the relay: wire_steps.py).
FAKE_ONLY_STEPS: dict[tuple[str, str], str] = {
    ("kubelet", "drop-health-stream"): "only the fake kubelet's NodeWatchResources streams are in fakelet's reach",
}
# The explorer rules that take such a step (rules.py), left out on the real node.
FAKE_ONLY_RULES: dict[str, tuple[str, str]] = {"health-stream-drop": ("kubelet", "drop-health-stream")}
NOTES_KEPT = 80  # lines of the other kubelet's replay timeline kept in the check's notes: its end says what failed


def check_flags(node: str, replay_on: str | None) -> None:
    """--node and --replay-on as given; a ValueError (one line) when either is wrong."""
    if node not in NODES:
        raise ValueError(f"--node {node!r}: one of {', '.join(NODES)}")
    if replay_on is None:
        return
    if replay_on not in NODES:
        raise ValueError(f"--replay-on {replay_on!r}: one of {', '.join(NODES)}")
    if replay_on == node:
        raise ValueError(f"--replay-on {replay_on}: the findings of --node {node} are replayed on the {node} "
                         "kubelet already; name the other one")


def check_machine(run: RunConfig, replay_on: str | None) -> None:
    """What `fakelet scenario run --node real` needs (harness/node/real/localnode.py unavailable), before anything
    starts: a ValueError (one line) naming the flag when this machine cannot run a real kubelet. The kubelet of
    the run's release and containerd 2 are built here when not cached yet (minutes, once per machine), so that
    the budget is the exploration's, as `fakelet run` prebuilds them."""
    flag = "--node" if run.node == REAL else "--replay-on" if replay_on == REAL else None
    if flag is None:
        return
    # grpc and the builders: only when a real node is asked for
    from harness.controlplane import ControlPlaneUnavailable
    from harness.node.real import runtime
    from harness.node.real.localnode import find_kubelet, unavailable

    why = unavailable()
    if not why:
        try:
            find_kubelet(run.kubelet_version.name)
        except ControlPlaneUnavailable as err:
            why = str(err).splitlines()[0]
    if why:
        raise ValueError(f"{flag} real: the real kubelet cannot run here: {why}")
    runtime.find()  # containerd 2, or Debian's with the reason (the report's node.runtime event says which)


def check_rules(rules: Sequence[Rule], node: str) -> None:
    """Rules that all take a step the real node refuses leave nothing to explore: a ValueError (one line)."""
    if node == REAL and rules and all(r.name in FAKE_ONLY_RULES for r in rules):
        raise ValueError(f"--rules: none of them runs on the real kubelet: {_refusals([r.name for r in rules])}")


def runnable(rules: list[Rule], node: str, say: Callable[[str], None]) -> list[Rule]:
    """The rules `node` can carry out; those it cannot are left out with a line saying so."""
    if node != REAL:
        return rules
    left = [r for r in rules if r.name not in FAKE_ONLY_RULES]
    if len(left) < len(rules):
        say(f"explore: not run on the real kubelet: {_refusals([r.name for r in rules if r not in left])}")
    return left


def _refusals(names: list[str]) -> str:
    return "; ".join(f"{n} ({FAKE_ONLY_RULES[n][0]}: {FAKE_ONLY_RULES[n][1]}: {FAKE_ONLY_STEPS[FAKE_ONLY_RULES[n]]})"
                     for n in names)


def refused_step(steps: Sequence[dict[str, Any]], node: str) -> str:
    """The first step of a sequence `node` refuses, said in one line, or ""."""
    if node != REAL:
        return ""
    for n, mapping in enumerate(steps):
        (action, arg), *_rest = mapping.items()
        why = FAKE_ONLY_STEPS.get((action, arg)) if isinstance(arg, str) else None
        if why:
            return f"steps[{n}] {action}: {arg}: {why}"
    return ""


def scenario_nodes(steps: Sequence[dict[str, Any]]) -> list[str]:
    """The `nodes:` of a finding's repro file: both kubelets, unless a step runs on the fake one only."""
    return [FAKE] if refused_step(steps, REAL) else list(NODES)


@dataclass
class NodeReplay:
    """A finding's repro file replayed on the other kubelet."""

    node: str
    outcome: str  # harness/scenarios/schema.py OUTCOMES, or "" when it could not be replayed there
    detail: str
    lines: list[str]
    duration_s: float = 0.0
    artifacts: str = ""  # its timeline and the plugin's log, under the report directory ("" when none was kept)

    def note(self) -> str:
        """What the report says of it: "reproduced on the real kubelet", "not reproduced on the real kubelet"."""
        where = f"on the {self.node} kubelet"
        if not self.outcome:
            return f"not replayed {where}: {self.detail}"
        first = self.detail.splitlines()[0] if self.detail else ""
        return f"{self.outcome} {where}" + (f": {first}" if first and self.outcome != "not reproduced" else "")


def replay(run: RunConfig, path: Path, node: str, out: Path, say: Callable[[str], None]) -> NodeReplay:
    """The repro file on a fresh node of the other kubelet, as `fakelet scenario run --file F --node NODE` runs it:
    its own API server (the real kubelet joins one; a DRA driver publishes to one), stopped after; its timeline and
    the plugin's log kept in out/artifacts/<repro>-replay-<node>/, beside the first replays'."""
    from harness.scenarios import runner
    from harness.scenarios.schema import load

    scenario = load(path)
    refused = refused_step([{s.action: s.arg} for s in scenario.steps], node)
    if refused:
        return NodeReplay(node, "", refused, [])
    say(f"replaying {path.name} on the {node} kubelet")
    other = dataclasses.replace(run, node=node)
    began = time.monotonic()
    plane, why = runner._control_plane(other, node)
    try:
        scratch = SubjectReport(subject=run.spec.name, profile=run.profile.name, seed=run.seed)
        kept = out / "artifacts" / f"{path.stem}-replay-{node}"
        outcome = runner._one_run(other, scenario, lambda line: None, plane, why, node, kept, scratch, None)
    finally:
        if plane is not None:
            plane.stop()
    done = NodeReplay(node, outcome.outcome, outcome.detail, outcome.steps, round(time.monotonic() - began, 3),
                      str(kept.relative_to(out)) if kept.is_dir() else "")
    say(f"replay on the {node} kubelet: {done.note()}")
    return done


def replay_findings(run: RunConfig, node: str, found: Sequence[tuple[Path, str]], out: Path, report: SubjectReport,
                    say: Callable[[str], None]) -> bool:
    """Each finding (its repro file under `out`, its check's ID) replayed on `node`, recorded in the report beside
    its first replays. True when interrupted (the report says so)."""
    for path, check_id in found:
        try:
            done = replay(run, path, node, out, say)
        except KeyboardInterrupt:
            report.interrupted = True
            return True
        record(report, done, str(path.relative_to(out)), check_id)
    return False


def record(report: SubjectReport, done: NodeReplay, name: str, check_id: str) -> None:
    """The replay's outcome as a fact (`replay_on_<node>`: in the finding's entry, and by repro file) and in the
    finding check's notes, with the replay's timeline. The verdict stays the first replays': this one says whose
    the finding is."""
    report.duration_s = round(report.duration_s + done.duration_s, 3)
    key, note = f"replay_on_{done.node}", done.note()
    facts = report.facts.setdefault("explore", {})
    facts.setdefault(key, {})[name] = note
    for entry in facts.get("findings", []):
        if entry.get("repro") == name:
            entry[key] = note
    for check in report.checks:
        if check.id == check_id:
            kept = f" (its timeline and the plugin's log: {done.artifacts})" if done.artifacts else ""
            check.notes = [*check.notes, f"replay of {name} on the {done.node} kubelet: {note}{kept}"]
            if done.lines:
                last = done.lines[-NOTES_KEPT:]
                cut = f" (its last {len(last)} lines)" if len(last) < len(done.lines) else ""
                check.notes += [f"timeline of the replay on the {done.node} kubelet{cut}:", *last]
