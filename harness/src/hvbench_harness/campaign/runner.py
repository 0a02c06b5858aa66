"""The campaign's runs, one after another: each is `python -m hvbench_harness.run` in a child
process, as `make run` starts it, its output in results/<campaign>/logs/<run-id>.log."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from hvbench_analysis import results as results_contract
from hvbench_analysis.sections import Counts, Latency, Status, present

from hvbench_harness.campaign.file import Campaign, Point, duration, run_argv
from hvbench_harness.campaign.index import Index, now
from hvbench_harness.campaign.replay import Recorded

PROGRESS_S = 30.0  # a running run's progress line, this often
PROGRESS = re.compile(r"received \d+/\d+ dead-letters \d+.*")  # as watch.Progress writes it


class Interrupted(Exception):
    pass


@dataclass
class Runner:
    """Runs a campaign's runs one after another (the harness, in a child process each)."""

    campaign: Campaign
    index: Index
    folder: Path
    harness_argv: list[str]  # --inventory, --data, ... as make run passes them
    work: Path
    child: subprocess.Popen | None = None
    stop_signal: int | None = None
    child_stopped: bool = False  # the running child has had its SIGTERM
    # the harness a run starts: `make run`'s own
    harness: tuple[str, ...] = (sys.executable, "-m", "hvbench_harness.run")
    recorded: Recorded | None = None  # REPLAY=: each run copied from there, none run

    def on_signal(self, signum, _frame) -> None:
        # The child runs in its own session (no terminal Ctrl-C reaches it twice): it gets one
        # SIGTERM, which the harness treats as Ctrl-C (tear down, exit 130).
        self.stop_signal = signum
        self.stop_child()

    def stop_child(self) -> None:
        if self.child is not None and not self.child_stopped and self.child.poll() is None:
            self.child_stopped = True
            self.child.send_signal(signal.SIGTERM)

    def run_one(self, point: Point, rep: int, position: str) -> dict:
        entry = self.index.entry(point, rep)
        if entry["status"] == "done":
            return entry
        if self.stop_signal is not None:
            raise Interrupted
        rid = entry["run_id"]
        if adopt(entry, self.folder / rid):  # finished, but the campaign stopped before noting it
            self.index.save()
            log(f"{position} {rid}: finished before the campaign stopped; taken as done")
            return entry
        stale = self.work / rid
        if stale.exists():  # the partial files of an interrupted attempt
            shutil.rmtree(stale)
        kept = set_aside(self.folder / rid, self.folder / "attempts")
        if kept:
            log(f"{position} {rid}: the last attempt's partial results kept in {kept}")
        if entry["status"] != "pending":
            log(f"{position} {rid}: again (last time {entry['status']}: {entry['reason']})")
        entry.update(status="running", reason=None, started_at=now(), ended_at=None)
        self.index.save()
        log(f"{position} {rid}: {point.shown()}")
        if self.recorded is not None:
            log_file = self.folder / "logs" / f"{rid}.log"
            outcome = self.recorded.replay(point, rep, self.folder / rid, log_file)
        else:
            outcome = self.launch(self.child_argv(point, rep, rid), rid)
        self.conclude(entry, outcome)
        log(f"{position} {rid}: {summary(entry)}")
        if entry["status"] == "interrupted":
            raise Interrupted
        return entry

    def child_argv(self, point: Point, rep: int, rid: str) -> list[str]:
        return [
            *self.harness,
            *("--target", self.campaign.target),
            *run_argv(point),
            *self.harness_argv,
            *("--results", str(self.folder)),
            *("--work", str(self.work)),
            *("--run-id", rid),
            *("--rep", str(rep)),
            *("--campaign", self.campaign.name),
        ]

    def launch(self, argv: list[str], rid: str) -> tuple[int, float]:
        """Run one child harness, its output to logs/<rid>.log; (exit code, seconds)."""
        logs = self.folder / "logs"
        logs.mkdir(exist_ok=True)
        started = time.monotonic()
        with open(logs / f"{rid}.log", "wb") as out:
            self.child_stopped = False
            self.child = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
            if self.stop_signal is not None:  # it came while the child was being started
                self.stop_child()
            code = watch_child(self.child, logs / f"{rid}.log")
            self.child = None
        return code, time.monotonic() - started

    def conclude(self, entry: dict, outcome: tuple[int, float]) -> None:
        code, seconds = outcome
        rid = entry["run_id"]
        entry.update(exit_code=code, ended_at=now(), duration_s=round(seconds, 1))
        if code in (0, 2) and adopt(entry, self.folder / rid):
            pass
        elif self.stop_signal is not None or code == 130:
            entry.update(status="interrupted", reason="interrupted")
        elif (ended := ended_reason(self.folder / rid)) is not None:
            entry.update(status="failed", reason=ended)
        else:
            log_file = self.folder / "logs" / f"{rid}.log"
            entry.update(status="failed", reason=failure_reason(log_file, code))
        self.index.save()

    def eta(self, remaining: list[Point]) -> str:
        overhead = self.index.overhead_s(self.campaign.target)
        left = sum(p.expected_send_s() + overhead for p in remaining)
        at = datetime.now() + timedelta(seconds=left)
        return f"{len(remaining)} run(s) left, ETA {at:%H:%M} (about {duration(left)})"

    def run_grid(self) -> None:
        plan = self.campaign.planned()
        for i, (point, rep) in enumerate(plan):
            position = f"[{i + 1}/{len(plan)}]"
            before = self.index.entry(point, rep)["status"]
            self.run_one(point, rep, position)
            remaining = [p for p, r in plan[i + 1 :] if self.index.entry(p, r)["status"] != "done"]
            if before != "done" and remaining:
                log(f"  {self.eta(remaining)}")


def adopt(entry: dict, results: Path) -> bool:
    """Take a run's figures from its results if it completed (meta.json written, status
    completed); True if so. A failed or interrupted run's results say so: not adopted."""
    try:
        meta = results_contract.read_meta(results)
    except results_contract.ResultsError:
        return False
    status = Status.of(meta, "status")
    if status is None or status.state != "completed":
        return False
    counts, latency = Counts.of(meta, "counts"), Latency.of(meta, "latency")
    accounted = bool(counts and counts.accounted)
    entry.update(
        status="done",
        accounted=accounted,
        p99_ms=present(latency.p99_ms) if latency else None,
        reason=None if accounted else "records unaccounted for",
    )
    return True


def set_aside(results: Path, attempts: Path) -> Path | None:
    """Move a failed or interrupted attempt's results out of the run's place (into
    attempts/<run-id>.<n>), so that the run can be done again under its name and the partial
    results are kept. None if there was nothing."""
    if not results.exists():
        return None
    attempts.mkdir(exist_ok=True)
    n = 1 + sum(1 for _ in attempts.glob(f"{results.name}.*"))
    target = attempts / f"{results.name}.{n}"
    results.rename(target)
    return target


def ended_reason(results: Path) -> str | None:
    """The reason a run that wrote its results gives for having failed, if it did."""
    try:
        status = Status.of(results_contract.read_meta(results), "status")
    except results_contract.ResultsError:
        return None
    return status.reason if status is not None and status.state != "completed" else None


def failure_reason(log_file: Path, code: int) -> str:
    """The harness's own message (its `make run: ...` line), else the end of its output."""
    lines = log_file.read_text(errors="replace").splitlines()
    for i, line in enumerate(lines):
        if line.startswith("make run: "):
            return "\n".join([line[len("make run: ") :], *lines[i + 1 : i + 6]])
    return f"exit {code}: " + " / ".join(line for line in lines[-5:] if line.strip())


def watch_child(child: subprocess.Popen, log_file: Path) -> int:
    """The child's exit code; while it runs, its latest progress line every PROGRESS_S."""
    shown = time.monotonic()
    while (code := child.poll()) is None:
        time.sleep(0.5)
        if time.monotonic() - shown >= PROGRESS_S:
            shown = time.monotonic()
            if line := last_progress(log_file):
                log(f"  {line}")
    return code


def last_progress(log_file: Path, tail_bytes: int = 8192) -> str | None:
    """The last progress line (received, dead letters, latency so far, time left) in a run's
    log, without its time stamp; None before the first."""
    with contextlib.suppress(OSError), open(log_file, "rb") as f:
        f.seek(max(0, f.seek(0, os.SEEK_END) - tail_bytes))
        lines = f.read().decode(errors="replace").replace("\r", "\n").splitlines()
        for line in reversed(lines):
            if found := PROGRESS.search(line):
                return found[0]
    return None


def summary(entry: dict) -> str:
    took = f"{entry['duration_s']:.0f} s"
    if entry["status"] == "done":
        p99 = entry["p99_ms"]
        figure = f"p99 {p99:.2f} ms" if p99 is not None else "no latency"
        accounted = "every record accounted for" if entry["accounted"] else "RECORDS UNACCOUNTED"
        return f"done in {took}: {figure}, {accounted}"
    return f"{entry['status']} after {took}: {entry['reason'].splitlines()[0]}"


def log(message: str) -> None:
    print(f"[{datetime.now():%H:%M:%S}] {message}", flush=True)
