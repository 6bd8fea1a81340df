"""P4: what many runs leave behind, a share of them killed at random moments.

    python benchmarks/p4_leaks.py [--runs 100] [--killed 20] [--seed N]

Every run is a short `fakelet run` of the reference device plugin. The killed ones get
SIGINT, SIGTERM or SIGKILL (in turn) at a random moment, sent to the `fakelet` process
alone, as a CI runner or a user would. A last, normal run follows (it reaps what the
SIGKILLed runs left, as every start does). Then the leftovers are counted against a
snapshot taken before the first run: processes, unix sockets, mounts, temp dirs, cgroups
and containers. Exit 1 when anything is left.

All runs share one private TMPDIR, so that only what they made is counted even while other
work runs on the machine (the CI runs this next to other tests).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHECKS = ("DP-REG-01", "DP-ALC-01", "DP-RST-01")  # plugin up, a pod admitted, a kubelet restart
RUN_TIMEOUT_S = 180.0  # one run; a hung run is a result, not a hung benchmark
STOP_BOUND_S = 30.0  # SIGINT/SIGTERM: docs/isolation.md promises "within seconds"; generous for a loaded machine
KILL_AFTER_S = (0.3, 5.0)  # when to strike: from start-up to well into the checks
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGKILL)
INTERRUPTED = 130


@dataclass
class Outcome:
    signal: str | None
    delay_s: float | None
    code: int | None
    status: str | None
    took_s: float
    problems: list[str] = field(default_factory=list)


def _cmdline(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _environ(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _ours() -> set[int]:
    """This process and its ancestors: never leftovers."""
    pids, pid = set(), os.getpid()
    while pid > 1:
        pids.add(pid)
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            pid = int(stat[stat.rfind(")") + 2:].split()[1])
        except (OSError, ValueError):
            break
    return pids


def _marked(marker: str, skip: set[int]) -> dict[str, str]:
    """Processes of runs under the marker dir: pid -> command line."""
    found = {}
    for pid in os.listdir("/proc"):
        if pid.isdigit() and int(pid) not in skip:
            cmd = _cmdline(pid)
            if cmd and (marker in cmd or marker in _environ(pid)):
                found[pid] = cmd
    return found


def _start_ticks(pid: str) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


class Owners(threading.Thread):
    """Samples the processes of our runs, as cgroup owner tags (`<pid>-<start ticks>`, harness/launch/cgroups.py).

    Cgroups are machine-wide and hold no file of ours: one is ours when a process of our runs made it.
    """

    PERIOD_S = 0.05  # the owners (a check run's pytest workers) live for seconds

    def __init__(self, tmp: Path) -> None:
        super().__init__(daemon=True, name="p4-owners")
        self.marker, self.tags, self.done = str(tmp), set(), threading.Event()

    def run(self) -> None:
        skip = _ours()
        while not self.done.wait(self.PERIOD_S):
            for pid in _marked(self.marker, skip):
                ticks = _start_ticks(pid)
                if ticks is not None:
                    self.tags.add(f"{pid}-{ticks}")


def snapshot(tmp: Path, owners: set[str] | None = None) -> dict[str, set[str]]:
    """What exists now that runs under `tmp` could have made (cgroups: those `owners` made)."""
    marker = str(tmp)
    procs = {f"{pid} {cmd[:160]}" for pid, cmd in _marked(marker, _ours()).items()}
    sockets = set()
    try:
        for line in Path("/proc/net/unix").read_text().splitlines()[1:]:
            parts = line.split()
            if len(parts) >= 8 and parts[7].startswith(marker):
                sockets.add(parts[7])
    except OSError:
        pass
    sockets |= {str(p) for p in tmp.rglob("*.sock")} if tmp.exists() else set()
    mounts = {line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()
              if marker in line.split()[4]}
    temp = {p.name for p in tmp.iterdir() if p.name != "outs"} if tmp.exists() else set()
    cgroups = {str(p) for p in _cgroup_run_dirs() if owners is None or p.name in owners}
    return {"processes": procs, "sockets": sockets, "mounts": mounts, "temp dirs": temp, "cgroups": cgroups,
            "containers": _containers()}


def _cgroup_run_dirs() -> list[Path]:
    """fakelet's run dirs in every cgroup hierarchy it uses (a v1 memory one may sit deep down)."""
    from harness.launch import cgroups  # the layout is fakelet's: <base>/fakelet/<owner tag>

    v2, v1 = cgroups.find_hierarchies()
    bases = {h.base for h in [*([v2] if v2 else []), *v1.values()]}
    return [run for base in bases for run in (base / cgroups.ROOT_NAME).glob("*") if run.is_dir()]


NO_DOCKER = "not checked: no Docker daemon answers"


def _containers() -> set[str]:
    """fakelet's containers; {NO_DOCKER} when there is no engine to ask (fakelet then makes none)."""
    docker = shutil.which("docker")
    if docker is None:
        return {NO_DOCKER}
    try:
        proc = subprocess.run([docker, "ps", "-a", "-q", "--filter", "label=fakelet"], capture_output=True,
                              text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return {NO_DOCKER}
    return set(proc.stdout.split()) if proc.returncode == 0 else {NO_DOCKER}


def leftovers(before: dict[str, set[str]], after: dict[str, set[str]]) -> dict[str, list[str]]:
    return {k: sorted(after[k] - before.get(k, set())) for k in after}


def one_run(tmp: Path, n: int, sig: signal.Signals | None, delay_s: float | None) -> Outcome:
    out = tmp / "outs" / f"run-{n}"
    cmd = [sys.executable, "-m", "harness.run.cli", "run", "--subject", "reference-dp", "--jobs", "2",
           "--out", str(out), *(a for c in CHECKS for a in ("--check", c))]
    env = {**os.environ, "TMPDIR": str(tmp)}
    began = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    problems = []
    if sig is not None and delay_s is not None:
        try:
            proc.wait(delay_s)  # a deliberate random moment, not a synchronization
        except subprocess.TimeoutExpired:
            proc.send_signal(sig)
    try:
        _, err = proc.communicate(timeout=STOP_BOUND_S if sig in (signal.SIGINT, signal.SIGTERM) else RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        problems.append(f"did not stop within its bound: {err.decode(errors='replace')[-300:]}")
    took = time.monotonic() - began
    status = _status(out)
    finished_first = sig is not None and proc.returncode in (0, 1)
    if sig in (signal.SIGINT, signal.SIGTERM) and not finished_first:
        if proc.returncode != INTERRUPTED:
            problems.append(f"exit {proc.returncode} after {sig.name}, expected {INTERRUPTED}")
        if status not in (None, "INTERRUPTED"):
            problems.append(f"report says {status} after {sig.name}")
    if sig is None and proc.returncode != 0:
        problems.append(f"a normal run exited {proc.returncode}: {err.decode(errors='replace')[-300:]}")
    return Outcome(sig.name if sig else None, delay_s, proc.returncode, status, took, problems)


def _status(out: Path) -> str | None:
    try:
        return json.loads((out / "report.json").read_text())["summary"]["status"]
    except (OSError, ValueError, KeyError):
        return None


def schedule(runs: int, killed: int, rng: random.Random) -> list[tuple[signal.Signals | None, float | None]]:
    """Which runs are killed, by what and when: killed ones spread over the runs, signals in turn."""
    strike = set(rng.sample(range(runs), min(killed, runs)))
    plan, k = [], 0
    for n in range(runs):
        if n in strike:
            plan.append((SIGNALS[k % len(SIGNALS)], round(rng.uniform(*KILL_AFTER_S), 2)))
            k += 1
        else:
            plan.append((None, None))
    return plan


def measure(runs: int, killed: int, seed: int, log: bool = True) -> tuple[dict[str, list[str]], list[Outcome]]:
    """Run the plan and the final normal run; the leftovers, and every run's outcome."""
    tmp = Path(tempfile.mkdtemp(prefix="fakelet-p4-"))
    owners = Owners(tmp)
    owners.start()
    try:
        before = snapshot(tmp, set())
        outcomes = []
        for n, (sig, delay) in enumerate([*schedule(runs, killed, random.Random(seed)), (None, None)]):
            outcome = one_run(tmp, n, sig, delay)
            outcomes.append(outcome)
            if log:
                what = f"{outcome.signal} at {outcome.delay_s}s" if outcome.signal else "normal"
                print(f"run {n + 1:3d}: {what:20s} exit {outcome.code} {outcome.status or '-':14s} "
                      f"{outcome.took_s:5.1f}s {'; '.join(outcome.problems)}", flush=True)
        shutil.rmtree(tmp / "outs", ignore_errors=True)  # the reports are the runs' output, not leftovers
        owners.done.set()
        owners.join()
        return leftovers(before, snapshot(tmp, owners.tags)), outcomes
    finally:
        owners.done.set()
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--killed", type=int, default=20)
    parser.add_argument("--seed", type=int, default=int(time.time()) % 100_000)
    args = parser.parse_args(argv)
    if not 0 <= args.killed <= args.runs or args.runs < 1:
        parser.error("need 1 <= runs and 0 <= killed <= runs")
    print(f"p4: {args.runs} runs, {args.killed} killed, seed {args.seed}, checks {' '.join(CHECKS)}")
    left, outcomes = measure(args.runs, args.killed, args.seed)
    bad_runs = [o for o in outcomes if o.problems]
    print(f"runs with problems: {len(bad_runs)}")
    for category, items in left.items():
        print(f"leftover {category}: {len(items)}" + "".join(f"\n  {i}" for i in items[:20]))
    if NO_DOCKER in _containers():
        print(f"containers: {NO_DOCKER}")
    return 1 if bad_runs or any(left.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
