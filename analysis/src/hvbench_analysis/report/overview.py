"""The sections that say what was read: the runs, those left out, each run's facts."""

from __future__ import annotations

import argparse
import html
import json
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd

from hvbench_analysis import (
    drawing,
    figures,
    hdr,
    tables,
)
from hvbench_analysis.labels import config_label
from hvbench_analysis.load import LeftOut, Runs
from hvbench_analysis.report.page import OutDirs, Page, safe_name


def intro_section(page: Page, runs: Runs, results: Path) -> None:
    """What the page covers, how latency is measured, and the runs with problems."""
    page.p(
        f"{len(runs.runs)} run(s) from {results}, generated "
        f"{datetime.now(UTC).isoformat(timespec='seconds')}. Latency is end-to-end: the "
        "consumer's receipt stamp minus the producer's send stamp (TSC, same machine). Warm-up "
        "records are excluded from every statistic; percentiles are nearest-rank and maxima are "
        "raw samples."
    )
    flagged = runs.runs[runs.runs["problems"] != ""]
    if len(flagged):
        page.raw(
            '<p class="flag">Runs with problems: '
            + html.escape("; ".join(f"{r.run_id}: {r.problems}" for r in flagged.itertuples()))
            + "</p>"
        )
    if runs.skipped:
        page.raw(
            '<p class="flag">Skipped (not readable): '
            + html.escape("; ".join(f"{n}: {r}" for n, r in runs.skipped))
            + "</p>"
        )
    included = runs.runs[runs.runs["state"] != "completed"]
    if len(included):
        page.raw(
            '<p class="flag">Included although they did not complete (--include-failed), and '
            f"flagged: {html.escape(', '.join(included['run_id']))}</p>"
        )


def left_out_section(page: Page, runs: Runs, tables_dir: Path) -> None:
    """Every run left out, and why: failed or interrupted, no measured sample, unreadable.
    Their files stay in their run directories; --include-failed puts the failed and
    interrupted ones in the statistics."""
    unreadable = [(name, "", "unreadable", None, why) for name, why in runs.skipped]
    if not runs.left_out and not unreadable:
        return
    page.h(2, "Runs left out of the statistics")
    left_out = pd.DataFrame([*runs.left_out, *unreadable], columns=LeftOut._fields)
    page.table(left_out, "runs_left_out")
    tables.write(left_out, tables_dir, "runs_left_out")
    page.p(
        "A run that did not complete is left out unless --include-failed (make report "
        "INCLUDE_FAILED=1), which puts what it measured until it stopped in the statistics, "
        "flagged; a run whose received records all fell in its warm-up (or that received "
        "none) has no measured sample; an unreadable run's files are missing or malformed.",
        "note",
    )


RUN_FACTS = [
    *("run_id", "target", "sched", "period", "budget", "cap", "rate", "rep", "sent"),
    *("received", "missing", "duplicated", "accounted", "flags", "clock", "tsc_hz"),
    "clocksource",
]


def runs_section(page: Page, runs: Runs, args: argparse.Namespace, dirs: OutDirs) -> None:
    """The runs' facts as a table, then each run: its counts, clock, readback and figure."""
    page.h(2, "Runs")
    page.table(runs.runs[RUN_FACTS], "runs", digits=0)
    tables.write(
        runs.runs.drop(columns=["sched_readback", "sched_readback_at_end"]), dirs.tables, "runs"
    )
    # each run's samples, only the columns drawn (a copy of every column per run took seconds)
    drawn = runs.samples[["run_id", "time_s", "latency_ns", "warmup"]]
    by_run = dict(tuple(drawn.groupby("run_id", observed=True, sort=False)))
    for row in runs.runs.itertuples():
        run_facts(page, row)
        run_over_time(page, row, by_run.get(row.run_id, drawn.iloc[:0]), args, dirs)


def run_facts(page: Page, row) -> None:
    """One run's heading, its counts (flagged when not accounted), clock and readback."""
    page.h(3, f"{row.run_id}: {config_label(row._asdict())}")
    counts = (
        f"sent {row.sent}, received {row.received}, missing {row.missing}, "
        f"duplicated {row.duplicated}"
    )
    if row.problems:
        page.raw(f'<p class="flag">{html.escape(row.problems)} ({html.escape(counts)})</p>')
    else:
        page.p(f"Every record accounted for: {counts}.")
    if row.flags:
        page.raw(f'<p class="flag">Flags: {html.escape(row.flags)}</p>')
    if row.faults:
        page.p(f"Faults: {row.faults}.")
    page.p(
        f"Clock: {row.clock}, {row.tsc_hz or 0:,.0f} Hz ({row.tsc_source}); kernel "
        f"clocksource {row.clocksource}; warm-up excluded {row.warmup_excluded_s} s.",
        "note",
    )
    page.raw(
        "<details><summary>Scheduler settings read back</summary><pre>"
        + html.escape(
            json.dumps(
                {"at start": row.sched_readback, "at end": row.sched_readback_at_end}, indent=1
            )
        )
        + "</pre></details>"
    )


def run_over_time(
    page: Page, row, samples: pd.DataFrame, args: argparse.Namespace, dirs: OutDirs
) -> None:
    """One run's latency over time (figure) and its HdrHistogram interval log, both written
    by the worker processes (encoding a million samples' intervals took 0.7 s)."""
    name = safe_name(f"over_time_{row.run_id}")
    t, latency = samples["time_s"].to_numpy(), samples["latency_ns"].to_numpy()
    title = f"{row.run_id}: latency over time"
    warmup = samples["warmup"].to_numpy()
    drawn = figures.save(
        dirs.figures, name, figures.over_time, t, latency, warmup, title, paper=False
    )
    page.figure(drawn, f"Latency over time, {row.run_id}", name)
    started_at = pd.Timestamp(row.started_at).timestamp() if row.started_at else 0.0
    log = dirs.hdr / f"{safe_name(row.run_id)}.hlog"
    interval = args.hdr_interval_s
    written = drawing.start(hdr.write_log, log, t, latency, started_at, interval, name=log.name,
                            path=log)  # fmt: skip
    page.written(written)
