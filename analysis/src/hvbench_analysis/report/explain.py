"""The sections that explain the tail: stage legs, scheduler traces, bounds, noise floor."""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from hvbench_analysis import (
    bounds,
    figures,
    results,
    sched_trace,
    stages,
    tables,
)
from hvbench_analysis.labels import config_label
from hvbench_analysis.load import Runs
from hvbench_analysis.report.page import OutDirs, Page, safe_name, table_with_note
from hvbench_analysis.stats import percentile

WORST_SHOWN = 3  # slow records drawn against the trace, per traced run


def explain_section(page: Page, runs: Runs, args: argparse.Namespace, dirs: OutDirs) -> None:
    """Runs made with TRACE=1: how much of each slow record's latency a job thread spent
    runnable but not running, and the worst records against the trace."""
    head, found = page.part(), []  # head: the heading and table, above the records' figures
    for path in runs.runs["path"]:
        meta = results.read_meta(Path(path))
        explained = sched_trace.run_explanation(path, meta, args.deadline_ms)
        if explained is not None:
            found.append(explained)
            # handed to the workers now, while the next traces are read; shown below the table
            worst_records(page, explained, dirs)
    if not found:
        return
    head.h(2, "Tails explained by the scheduler trace")
    slow = pd.concat([f["records"].assign(run_id=f["summary"]["run_id"]) for f in found])
    tables.write(slow, dirs.tables, "tail_explained_records")
    table_with_note(
        head,
        pd.DataFrame([f["summary"] for f in found]),
        "tail_explained",
        dirs,
        "Explained: the share of a slow record's latency (records at or over DEADLINE_MS, else "
        "the run's p99.9) during which one of the job's traced threads was runnable but not "
        "running: it wanted the CPU and did not get it (preempted, or its budget used up). "
        "Each record: tables/tail_explained_records. docs/tracing.md says how the trace is "
        "recorded and put on the run's clock.",
    )


def noise_floor_section(page: Page, runs: Runs, dirs: OutDirs) -> None:
    """Runs made with BASELINE=1: the timer latency of a thread under the same setting (the
    machine's noise floor) next to the pipeline's tail."""
    rows = []
    for run in runs.runs.itertuples():
        baseline = results.read_meta(Path(run.path)).get("baseline")
        if isinstance(baseline, dict):
            rows.append(noise_row(run, baseline, runs.measured))
    if not rows:
        return
    page.h(2, "Noise floor: timer latency under the same setting")
    table_with_note(
        page,
        pd.DataFrame(rows),
        "noise_floor",
        dirs,
        "BASELINE=1: before the records, cyclictest's thread woke every millisecond under the "
        "run's scheduler setting, with the pipeline up and idle; how late it woke is the least "
        "a record can be delayed by scheduling alone. Wake-ups before the setting applied are "
        "left out. Every wake-up: baseline.csv in the run's results (docs/tracing.md).",
    )


def noise_row(run, baseline: dict, measured: pd.DataFrame) -> dict:
    """One run's timer latency (ms) beside its pipeline's p99 and maximum."""
    mine = measured.loc[measured["run_id"] == run.run_id, "latency_ns"].to_numpy() / 1e6
    timer = {k: baseline.get(f"{k}_us") for k in ("p50", "p99", "p99.9", "max")}
    return {
        "run_id": run.run_id,
        "configuration": config_label(run._asdict()),
        "wake-ups": baseline.get("count"),
        **{f"timer {k} (ms)": None if v is None else v / 1000 for k, v in timer.items()},
        "pipeline p99 (ms)": float(percentile(mine, 99)) if len(mine) else None,
        "pipeline max (ms)": float(mine.max()) if len(mine) else None,
        "note": baseline.get("error") or "",
    }


def worst_records(page: Page, explained: dict, dirs: OutDirs) -> None:
    """The slowest records of one traced run, each against its threads' states."""
    run_id = explained["summary"]["run_id"]
    samples = explained["samples"].set_index(["detector", "seq"])
    worst = explained["records"].nlargest(WORST_SHOWN, "latency_ms")
    for r in worst.itertuples(index=False):
        record = samples.loc[(r.detector, r.seq)].to_dict()
        title = (
            f"{run_id}: {r.detector} #{r.seq}, {r.latency_ms:.1f} ms, "
            f"{r.explained_pct:.0f} % runnable but not running"
        )
        name = safe_name(f"trace_{run_id}_{r.detector}_{r.seq}")
        spans = figures.around(record, explained["spans"])  # not the whole trace, to the worker
        drawn = figures.save(dirs.figures, name, figures.trace_timeline, record, spans, title)
        page.figure(drawn, f"Trace of a slow record, {run_id}", name)


def stage_section(
    page: Page, measured: pd.DataFrame, args: argparse.Namespace, dirs: OutDirs
) -> None:
    """Where the time went: input leg, job, output leg per configuration, and per band."""
    page.h(2, "Where the time went: stage legs")
    rows, bands = [], []
    for tags, group in tables.by_config(measured):
        legs = stages.known_legs(group)  # once for both
        found = stages.legs_breakdown(*legs, args.deadline_ms)
        if found is not None:
            rows.append({"configuration": config_label(tags), **found})
            bands.append((config_label(tags), stages.legs_by_band(*legs)))
    if not rows:
        page.p("No run has the job's stamps with a known clock offset.", "note")
        return
    table_with_note(
        page,
        pd.DataFrame(rows),
        "stage_legs",
        dirs,
        "Input leg: producer → broker → job; job: parse, forecast and route; output leg: job → "
        "broker → consumer. The legs add up to each record's latency. Tail share: of the "
        "latency of the records at or over the tail threshold (DEADLINE_MS, else the p99.9), "
        "the part each leg took. Where the job stamps on another machine's clock, the legs "
        "carry that clock's offset bound (meta.json clock.job); runs whose offset is not "
        "known have no legs.",
    )
    title = "Mean stage times by latency band"
    drawn = figures.save(dirs.figures, "stage_bands", figures.stage_bands, bands, title)
    page.figure(drawn, "Stage legs by latency band, per configuration", "stage_bands")


def bound_section(page: Page, runs: Runs, dirs: OutDirs) -> None:
    """Each configuration's maximum beside the longest its reservation can leave the VM or
    threads without CPU (bounds.py; docs/results.md, "The analytical bound")."""
    page.h(2, "Maximum latency against the analytical bound")
    table_with_note(
        page,
        bounds.bound_table(runs.measured, bounds.readbacks_by_run(runs.runs)),
        "bound_vs_max",
        dirs,
        "Bound: a budget B per period P can leave the VM or threads without CPU for up to "
        "2·(P − B), the budget used at the start of one period and given at the very end of "
        "the next. Credit2 and Credit caps are treated as such a budget per the hypervisor's "
        "replenishment (10 ms) or accounting (30 ms) interval, so their bound is approximate; "
        "RTDS with extratime, weights alone and cap 0 cap nothing and have no bound. Setting: "
        "read back from the kernel or hypervisor (meta.json sched) where it could be read, "
        "else as requested. Max − p50: the longest extra delay a record saw. Above bound: "
        f"max − p50 > {bounds.ABOVE_FACTOR:g} × bound + {bounds.ABOVE_SLACK_MS:g} ms; the "
        "bound explains one starvation on top of typical latency, so well above it something "
        "other than the budget is at work.",
    )
