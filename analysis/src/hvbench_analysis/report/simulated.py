"""Measured beside the scheduler model: each configuration whose workload has a traced
reference run (TRACE=1, SCHED=none; on Xen RTDS with nothing held back: unreserved) is
simulated under its setting as read back
(hvbench_analysis.prediction) and set beside what was measured, with a flag where the measured
tail is beyond the simulated one's interval: not explained by the scheduler model."""

from __future__ import annotations

import argparse
import itertools

import numpy as np
import pandas as pd

from hvbench_analysis import bounds, figures, sched_trace, tables
from hvbench_analysis.labels import config_label
from hvbench_analysis.load import Runs, by_run
from hvbench_analysis.prediction import Reference, all_references, unreserved, workload
from hvbench_analysis.report.page import OutDirs, Page, safe_name, table_with_note
from hvbench_analysis.stats import percentile
from hvbench_analysis.tables import by_config

# The simulated statistics' interval: the reference in this many consecutive blocks, each
# simulated alone (consecutive records are kept together: their demands are correlated).
BLOCKS = 5
TAIL = {"p99": 99, "max": 100}
# The statistics whose errors are summed up, as the performance model's validation has them.
ERRORS = ("mean", "sd", "p50", "p99", "max")
NOT_EXPLAINED = "not explained by the scheduler model"
BELOW = "below the model"


def reservations(tags: dict, sched_metas: list) -> list[dict]:
    """The setting's reservations: read back (the first run's that could be), else requested."""
    target, sched = str(tags["target"]), str(tags["sched"])
    for sched_meta in sched_metas:
        found = bounds.read_back(target, sched, sched_meta)
        if found:
            return found
    requested = bounds.requested_setting(tags)
    if requested["budget_us"] is not None and requested["period_us"] is None:
        requested["period_us"] = bounds.DEFAULT_PERIOD_US
    return [requested]


def interval(refs: list[Reference], tags: dict, found: list[dict], p: float):
    """(low, high) of a statistic over every reference of the workload, whole and in blocks."""
    values = []
    for reference in refs:
        table = reference.table
        edges = np.linspace(0, len(table), BLOCKS + 1).astype(int)
        blocks = [table.iloc[lo:hi] for lo, hi in itertools.pairwise(edges) if hi > lo]
        for block in [table, *blocks]:
            late = reference.predicted(block, tags, found)
            values.append(float(percentile(late, p)) / 1e6)
    return min(values), max(values)


def flag(measured: dict, ranges: dict) -> str:
    if any(measured[s] > ranges[s][1] for s in TAIL):
        return NOT_EXPLAINED
    return BELOW if all(measured[s] < ranges[s][0] for s in TAIL) else ""


def row_of(tags, group, refs: list[Reference], found) -> tuple[dict, np.ndarray]:
    """One configuration's table row, and its simulated latencies (from the first
    reference; the range from all of them)."""
    reference = refs[0]
    simulated = reference.predicted(reference.table, tags, found)
    ms = group["latency_ns"].to_numpy() / 1e6
    measured = {s: float(percentile(ms, p)) for s, p in {"p50": 50, **TAIL}.items()}
    ranges = {s: interval(refs, tags, found, p) for s, p in TAIL.items()}
    row = {"Configuration": config_label(tags), "Reference": reference.run_id,
           "Measured p50 (ms)": measured["p50"],
           "Simulated p50 (ms)": float(percentile(simulated, 50)) / 1e6}  # fmt: skip
    for s in TAIL:
        row[f"Measured {s} (ms)"] = measured[s]
        row[f"Simulated {s} (ms)"] = float(percentile(simulated, TAIL[s])) / 1e6
        row[f"Simulated {s} range (ms)"] = f"{ranges[s][0]:.2f}–{ranges[s][1]:.2f}"
    row["Flag"] = flag(measured, ranges)
    return row, simulated


def statistic(ms: np.ndarray, name: str) -> float:
    if name == "mean":
        return float(np.mean(ms))
    if name == "sd":
        return float(np.std(ms, ddof=1)) if len(ms) > 1 else float("nan")
    return float(percentile(ms, {"p50": 50, "p99": 99, "max": 100}[name]))


def errors(tags, group: pd.DataFrame, simulated: np.ndarray) -> dict:
    """The absolute error (%) of each simulated statistic against the mean of the
    configuration's runs' own, as the model's held-out validation measures its errors."""
    row = {"Configuration": config_label(tags), "Runs": group["run_id"].nunique()}
    for name in ERRORS:
        per_run = [statistic(run.latency_ns / 1e6, name) for run in by_run(group)]
        measured, predicted = float(np.mean(per_run)), statistic(simulated / 1e6, name)
        error = 100 * abs(predicted - measured) / measured if measured else float("nan")
        row[f"{name} error (%)"] = error
    return row


def error_summary(rows: list[dict]) -> pd.DataFrame:
    """Per statistic, over the configurations with an error (none where the simulation has no
    such statistic, e.g. no SD of a queue that never ends)."""
    table = pd.DataFrame(rows)
    summary = []
    for name in ERRORS:
        found = table[f"{name} error (%)"].dropna()
        summary.append({"Statistic": name, "Configurations": len(table),
                        "Median abs. error (%)": found.median() if len(found) else np.nan,
                        "Mean abs. error (%)": found.mean() if len(found) else np.nan})  # fmt: skip
    return pd.DataFrame(summary)


def simulated_section(page: Page, runs: Runs, args: argparse.Namespace, dirs: OutDirs) -> None:
    """The table and one ECDF overlay per configuration; nothing without a reference."""
    found_refs = all_references(runs.runs)
    if not found_refs:
        return
    readbacks = bounds.readbacks_by_run(runs.runs)
    rows, skipped, drawn, errs = [], [], [], []
    for tags, group in by_config(runs.measured):
        refs = found_refs.get(workload(tags))
        if not refs or unreserved(tags):  # a reference itself: nothing to simulate
            continue
        metas = [readbacks.get(run_id) for run_id in group["run_id"].unique()]
        try:
            row, simulated = row_of(tags, group, refs, reservations(tags, metas))
        except ValueError as e:  # prediction.NotModelled, or a setting it cannot take
            skipped.append(f"{config_label(tags)}: {e}")
            continue
        rows.append(row)
        drawn.append((tags, group, simulated))
        if not set(group["run_id"].unique()) & set(refs[0].queued_from):  # held out
            errs.append(errors(tags, group, simulated))
    if not rows and not skipped:
        return
    page.h(2, "Measured beside the scheduler model")
    if rows:
        table_with_note(page, pd.DataFrame(rows), "simulated_vs_measured", dirs, NOTE)
        tables.write(pd.DataFrame(errs), dirs.tables, "simulated_errors")
        table_with_note(page, error_summary(errs), "simulated_validation", dirs, ERRORS_NOTE)
    for text in skipped:
        page.p(f"Not simulated: {text}.", "note")
    for text in [*queued_shares(found_refs), *lost_switches(found_refs)]:
        page.p(text, "note")
    for tags, group, simulated in drawn:
        overlay(page, tags, group, simulated, args, dirs)


def queued_shares(found_refs: dict[tuple, list[Reference]]) -> list[str]:
    """A line for each reference whose records behind another need less than their demand."""
    return [
        f"Replayed from {ref.run_id}, a record that arrives while the job still works on an "
        f"earlier one needs {ref.queued_share:.0%} of its demand, as in the traced runs with a "
        f'reservation ({", ".join(ref.queued_from)}; docs/simulate.md, "Records behind another"); '
        "their configurations are not in the errors, which are the held-out runs'."
        for refs in found_refs.values()
        for ref in refs
        if ref.queued_share is not None
    ]


def lost_switches(found_refs: dict[tuple, list[Reference]]) -> list[str]:
    """A line for each reference whose trace lacks switches to the job's threads that it
    could not date."""
    warnings = (
        sched_trace.undated_warning(ref.table.attrs, ref.run_id)
        for refs in found_refs.values()
        for ref in refs
    )
    return [text for text in warnings if text]


NOTE = (
    "Simulated: the reference run (traced, no reservation, the same workload) replayed through "
    "the configuration's setting as read back (docs/simulate.md): each record's measured "
    "latency plus what the setting's server adds over none (a CPU quota on the whole JVM: "
    "its budget less the share of a CPU the JVM's other work took in the reference). Range: "
    "the statistic simulated on each traced reference of the workload (the one with the most "
    f"records gives the value), whole and in {BLOCKS} consecutive blocks alone. Flag: "
    f"{NOT_EXPLAINED!r} where the measured p99 or maximum is above its simulated range (the "
    f"setting alone does not explain that tail); {BELOW!r} where both are below it."
)


ERRORS_NOTE = (
    "Each configuration's simulated statistic against the mean of its runs' own: the absolute "
    "error in %, as the performance model's held-out validation measures its errors (the runs "
    "are held out: only the reference is simulated). Each configuration: "
    "tables/simulated_errors."
)


def overlay(page: Page, tags, group, simulated, args, dirs: OutDirs) -> None:
    label = config_label(tags)
    name = safe_name(f"simulated_{label}")
    curves = [("measured", group["latency_ns"].to_numpy()), ("simulated", simulated)]
    title = f"{label}: measured and simulated"
    drawn = figures.save(dirs.figures, name, figures.ecdf, curves, title, args.xlim_ms)
    page.figure(drawn, f"ECDF, measured beside simulated: {label}", name)
