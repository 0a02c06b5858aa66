"""`make report`: runs in results/ → one self-contained HTML page, with the figures (PNG, SVG),
tables (Markdown, CSV) and HdrHistogram logs beside it.

    python -m hvbench_analysis.report --results results --out report \\
        [--runs 'run-a,rtds-*'] [--ref sched=credit] [--deadline-ms 50] [--xlim-ms 100] \\
        [--include-failed]

For each run the page says the scheduler settings read back, the clock and the counts, and
its quality flags (unaccounted records, forced readiness checks, faults …), also beside each
configuration's percentiles. Runs that cannot be read are listed with the reason and left out
of every figure and table; so are runs that failed or were interrupted, unless
--include-failed (then they are in, flagged). A campaign's folder (results/<campaign>, holding
campaign.json) also gets a section on the campaign: its runs by status, the runs that are not
done and why, and the sustainable rates of a rate search.
"""

from __future__ import annotations

import argparse
import base64
import html
import json
import re
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pandas as pd

from hvbench_analysis import (
    bounds,
    campaign,
    compare,
    figures,
    hdr,
    results,
    sched_trace,
    stages,
    tables,
)
from hvbench_analysis.load import Runs, config_label, load_runs, run_dirs
from hvbench_analysis.stats import percentile

CSS = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222 }
h1 { font-size: 1.6em } h2 { border-bottom: 1px solid #ccc; margin-top: 2em }
table { border-collapse: collapse; margin: 0.5em 0 1.5em } th, td { padding: 2px 8px }
th { background: #f0f0f0; text-align: left } td { border-top: 1px solid #e4e4e4 }
td.num { text-align: right; font-variant-numeric: tabular-nums }
img { max-width: 100%; display: block; margin: 0.5em 0 }
.flag { color: #b00; font-weight: bold } .note { color: #555 } pre { background: #f7f7f7;
padding: 0.5em; overflow-x: auto; font-size: 12px }
"""
# Marks on <body> how many figures decoded to a bitmap, for checks by a headless browser.
LOAD_CHECK = (
    "<script>addEventListener('load', () => { document.body.dataset.figuresRendered = "
    "[...document.images].filter(i => i.complete && i.naturalWidth > 0).length })</script>"
)


def safe_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", str(text)).strip("_") or "run"


class Page:
    """The HTML page, built section by section; figures are embedded as PNG data."""

    def __init__(self, title: str) -> None:
        self.title = title
        self.parts: list[str] = []

    def h(self, level: int, text: str) -> None:
        self.parts.append(f"<h{level}>{html.escape(text)}</h{level}>")

    def p(self, text: str, cls: str = "") -> None:
        attr = f' class="{cls}"' if cls else ""
        self.parts.append(f"<p{attr}>{html.escape(text)}</p>")

    def figure(self, png: bytes, alt: str, name: str) -> None:
        data = base64.b64encode(png).decode()
        self.parts.append(
            f'<figure><img class="figure" alt="{html.escape(alt)}" '
            f'src="data:image/png;base64,{data}"><figcaption class="note">'
            f"{html.escape(alt)} (figures/{html.escape(name)}.png, .svg)</figcaption></figure>"
        )

    def table(self, table: pd.DataFrame, name: str | None = None, digits: int = 2) -> None:
        if table.empty:
            self.p("No runs of this kind.", "note")
            return
        rows = ["<table><tr>" + "".join(f"<th>{html.escape(str(c))}</th>" for c in table.columns)]
        for _, row in table.iterrows():
            cells = []
            for value in row:
                text = tables.cell(value, digits)
                numeric = isinstance(value, int | float | np.integer | np.floating)
                cells.append(
                    f'<td class="num">{text}</td>' if numeric else f"<td>{html.escape(text)}</td>"
                )
            rows.append("<tr>" + "".join(cells) + "</tr>")
        rows.append("</table>")
        if name:
            rows.append(f'<p class="note">tables/{html.escape(name)}.md, .tex, .csv</p>')
        self.parts.append("\n".join(rows))

    def raw(self, markup: str) -> None:
        self.parts.append(markup)

    def render(self) -> str:
        body = "\n".join(self.parts)
        return (
            f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
            f"<title>{html.escape(self.title)}</title><style>{CSS}</style></head>\n"
            f"<body>\n<h1>{html.escape(self.title)}</h1>\n{body}\n{LOAD_CHECK}\n</body></html>\n"
        )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="hvbench report", description=__doc__.split("\n")[0])
    p.add_argument("--results", default="results", help="the folder holding run directories")
    p.add_argument("--runs", default="", help="comma-separated run names or globs (default all)")
    p.add_argument("--out", default="report")
    p.add_argument("--ref", default="", help="reference configuration, e.g. sched=credit")
    p.add_argument("--deadline-ms", type=float, help="report the %% of records over it")
    p.add_argument("--xlim-ms", type=float, help="x-axis limit of the ECDFs")
    p.add_argument("--hdr-interval-s", type=float, default=10.0)
    p.add_argument("--seed", type=int, default=0, help="of the bootstrap")
    p.add_argument(
        "--include-failed",
        action="store_true",
        help="include runs that failed or were interrupted in the statistics (flagged)",
    )
    return p.parse_args(argv)


def curves(groups: list[tuple[dict, pd.DataFrame]]) -> list[tuple[str, np.ndarray]]:
    return [(config_label(tags), group["latency_ns"].to_numpy()) for tags, group in groups]


class OutDirs(NamedTuple):
    """Where the report writes its figures, tables and HdrHistogram logs."""

    figures: Path
    tables: Path
    hdr: Path


def build(args: argparse.Namespace) -> tuple[Runs, Path]:
    """The report of the runs args picks: index.html and its figures, tables and logs."""
    started = time.perf_counter()
    results, out = Path(args.results), Path(args.out)
    names = [n.strip() for n in args.runs.split(",") if n.strip()]
    runs = read_runs(results, names, args.include_failed)
    dirs = OutDirs(out / "figures", out / "tables", out / "hdr")
    measured = runs.measured
    page = Page("hvbench latency report")
    intro_section(page, runs, results)
    left_out_section(page, runs, dirs.tables)
    campaign_section(page, results, dirs.tables, runs, picked=bool(names))
    percentile_section(page, measured, flags_by_run(runs), args, dirs)
    max_section(page, measured, args, dirs)
    bound_section(page, runs, dirs)
    intended_section(page, measured, dirs)
    stage_section(page, measured, args, dirs)
    explain_section(page, runs, args, dirs)
    noise_section(page, runs, dirs)
    repetition_sections(page, measured, args, dirs)
    ecdf_section(page, measured, args, dirs)
    density_section(page, measured, dirs)
    runs_section(page, runs, args, dirs)
    page.p(
        f"HdrHistogram interval logs per run: hdr/<run>.hlog. Built in "
        f"{time.perf_counter() - started:.1f} s.",
        "note",
    )
    out.mkdir(parents=True, exist_ok=True)
    (out / "index.html").write_text(page.render())
    return runs, out


def read_runs(results: Path, names: list[str], include_failed: bool = False) -> Runs:
    """The runs to report (warm-up records kept, marked); SystemExit when there are none."""
    if not results.is_dir():
        raise SystemExit(f"report: no results folder {results}")
    runs = load_runs(run_dirs(results, names), include_warmup=True, include_failed=include_failed)
    if runs.runs.empty and runs.left_out:
        states = "; ".join(f"{r.run_id}: {r.state}" for r in runs.left_out)
        raise SystemExit(
            f"report: no completed runs in {results} ({states}); --include-failed "
            "(make report INCLUDE_FAILED=1) reports them"
        )
    if runs.runs.empty:
        reasons = "; ".join(f"{n}: {r}" for n, r in runs.skipped) or "no run directories"
        raise SystemExit(f"report: no readable runs in {results} ({reasons})")
    return runs


def flags_by_run(runs: Runs) -> dict[str, str]:
    """Each run's quality flags (comma-separated), by run id."""
    return dict(zip(runs.runs["run_id"], runs.runs["flags"], strict=True))


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
    """Runs that failed or were interrupted: what they were and why they stopped. Their
    samples are in their run directories; --include-failed puts them in the statistics."""
    if not runs.left_out:
        return
    page.h(2, "Runs left out of the statistics")
    left_out = pd.DataFrame(runs.left_out)
    page.table(left_out, "runs_left_out")
    tables.write(left_out, tables_dir, "runs_left_out")
    page.p(
        "These runs did not complete: what they measured until they stopped is in their run "
        "directories, and --include-failed (make report INCLUDE_FAILED=1) puts it in the "
        "statistics, flagged.",
        "note",
    )


def percentile_section(
    page: Page,
    measured: pd.DataFrame,
    flags: dict[str, str],
    args: argparse.Namespace,
    dirs: OutDirs,
) -> None:
    page.h(2, "Latency percentiles per configuration (repetitions pooled)")
    by_config = tables.percentile_table(measured, "config", args.deadline_ms, flags)
    page.table(by_config, "percentiles_by_config")
    tables.write(by_config, dirs.tables, "percentiles_by_config")
    page.p("flags: those of any run of the configuration (the runs' table says which).", "note")
    if args.deadline_ms is not None:
        page.p(f"over_deadline_pct: share of records later than {args.deadline_ms:g} ms.", "note")
    by_run = tables.percentile_table(measured, "run", args.deadline_ms, flags)
    tables.write(by_run, dirs.tables, "percentiles_by_run")


def max_section(
    page: Page, measured: pd.DataFrame, args: argparse.Namespace, dirs: OutDirs
) -> None:
    """The paper's maximum-latency tables (4, 5, 6), with intervals over repetitions."""
    page.h(2, "Maximum latency")
    for name, caption, table in (
        (
            "max_budget_period",
            "Budget and period (the paper's Table 4)",
            tables.max_table_budget_period(measured, args.seed),
        ),
        ("max_cap", "Cap (the paper's Table 5)", tables.max_table_cap(measured, args.seed)),
        (
            "max_scheduler",
            "Scheduler defaults (the paper's Table 6)",
            tables.max_table_scheduler(measured, args.seed),
        ),
    ):
        page.h(3, caption)
        page.table(table, name)
        tables.write(table, dirs.tables, name)
    if any(group["run_id"].nunique() > 1 for _, group in tables.by_config(measured)):
        page.p(
            "Max: the largest sample of all runs of the configuration. Mean max and mean p99: "
            "the mean over runs of each run's maximum and p99, with a 95 % bootstrap interval "
            "over runs (a configuration with one run has none).",
            "note",
        )


WORST_SHOWN = 3  # slow records drawn against the trace, per traced run


def table_with_note(page: Page, table: pd.DataFrame, name: str, dirs: OutDirs, note: str) -> None:
    """A table on the page and in tables/ (Markdown, LaTeX, CSV), with its note below."""
    page.table(table, name)
    tables.write(table, dirs.tables, name)
    page.p(note, "note")


def explain_section(page: Page, runs: Runs, args: argparse.Namespace, dirs: OutDirs) -> None:
    """Runs made with TRACE=1: how much of each slow record's latency a job thread spent
    runnable but not running, and the worst records against the trace."""
    found = []
    for path in runs.runs["path"]:
        meta = results.read_meta(Path(path))
        explained = sched_trace.run_explanation(path, meta, args.deadline_ms)
        if explained is not None:
            found.append(explained)
    if not found:
        return
    page.h(2, "Tails explained by the scheduler trace")
    slow = pd.concat([f["records"].assign(run_id=f["summary"]["run_id"]) for f in found])
    tables.write(slow, dirs.tables, "tail_explained_records")
    table_with_note(
        page,
        pd.DataFrame([f["summary"] for f in found]),
        "tail_explained",
        dirs,
        "Explained: the share of a slow record's latency (records at or over DEADLINE_MS, else "
        "the run's p99.9) during which one of the job's traced threads was runnable but not "
        "running: it wanted the CPU and did not get it (preempted, or its budget used up). "
        "Each record: tables/tail_explained_records. docs/tracing.md says how the trace is "
        "recorded and put on the run's clock.",
    )
    for f in found:
        worst_records(page, f, dirs)


def noise_section(page: Page, runs: Runs, dirs: OutDirs) -> None:
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
        png = figures.save(figures.trace_timeline(record, explained["spans"], title),
                           dirs.figures, name)  # fmt: skip
        page.figure(png, f"Trace of a slow record, {run_id}", name)


def stage_section(
    page: Page, measured: pd.DataFrame, args: argparse.Namespace, dirs: OutDirs
) -> None:
    """Where the time went: input leg, job, output leg per configuration, and per band."""
    page.h(2, "Where the time went: stage legs")
    rows, bands = [], []
    for tags, group in tables.by_config(measured):
        found = stages.breakdown(group, args.deadline_ms)
        if found is not None:
            rows.append({"configuration": config_label(tags), **found})
            bands.append((config_label(tags), stages.by_band(group)))
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
    png = figures.save(
        figures.stage_bands(bands, "Mean stage times by latency band"), dirs.figures, "stage_bands"
    )
    page.figure(png, "Stage legs by latency band, per configuration", "stage_bands")


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


def intended_section(page: Page, measured: pd.DataFrame, dirs: OutDirs) -> None:
    page.h(2, "Latency from the intended send next to the actual send")
    page.p(
        "Producers send open-loop on a schedule; latency from the intended time includes any "
        "delay of the producer itself (coordinated omission shows as a gap between the two).",
        "note",
    )
    co = tables.intended_vs_actual(measured)
    page.table(co, "intended_vs_actual")
    tables.write(co, dirs.tables, "intended_vs_actual")


def repetition_sections(
    page: Page, measured: pd.DataFrame, args: argparse.Namespace, dirs: OutDirs
) -> None:
    """Means over repetitions with intervals, and the comparison with REF when it is given."""
    per_run = compare.per_run(measured, args.deadline_ms)
    reps = compare.repetitions(per_run, seed=args.seed)
    page.h(2, "Repetitions: mean over runs with 95 % bootstrap intervals")
    if reps.empty:
        page.p("No configuration has more than one run.", "note")
    else:
        shown = reps_table(reps)
        page.table(shown, "repetitions")
        tables.write(shown, dirs.tables, "repetitions")
    if not args.ref:
        return
    reference = compare.parse_selector(args.ref)
    page.h(2, f"Against the reference {args.ref}")
    against = compare.against_reference(measured, per_run, reference, seed=args.seed)
    shown = against_table(against)
    page.table(shown, "against_reference", digits=3)
    tables.write(shown, dirs.tables, "against_reference", digits=3)
    page.p(
        "Differences are means over runs (configuration − reference) with 95 % bootstrap "
        "intervals over runs (both sides need repetitions); KS: two-sample Kolmogorov–"
        "Smirnov on the pooled samples (D, and a p-value that assumes independent samples).",
        "note",
    )


def ecdf_section(
    page: Page, measured: pd.DataFrame, args: argparse.Namespace, dirs: OutDirs
) -> None:
    """ECDFs and exceedance curves (the tail first): all configurations and each scheduler's
    family; ECDFs of each configuration's repetitions, and the bands over repetitions."""
    configs = tables.by_config(measured)
    page.h(2, "ECDF")
    png = figures.save(
        figures.ecdf(curves(configs), "All configurations", args.xlim_ms),
        dirs.figures,
        "ecdf_all",
    )
    page.figure(png, "ECDF of end-to-end latency, all configurations", "ecdf_all")
    exceedance_figure(page, configs, "All configurations", "exceedance_all", dirs.figures)
    families: dict[tuple, list[tuple[dict, pd.DataFrame]]] = {}
    for tags, group in configs:
        families.setdefault((tags["target"], tags["sched"]), []).append((tags, group))
    for (target, sched), members in families.items():
        if len(members) > 1 and len(families) > 1:
            name = safe_name(f"ecdf_{target}_{sched}")
            png = figures.save(
                figures.ecdf(curves(members), f"{target} / {sched}", args.xlim_ms),
                dirs.figures,
                name,
            )
            page.figure(png, f"ECDF, {target} / {sched}", name)
            name = safe_name(f"exceedance_{target}_{sched}")
            exceedance_figure(page, members, f"{target} / {sched}", name, dirs.figures)
    for tags, group in configs:
        if group["run_id"].nunique() > 1:
            repetition_ecdf(page, tags, group, args, dirs)
    band_figures(page, configs, families, dirs.figures, args.seed)


def exceedance_figure(
    page: Page, groups: list[tuple[dict, pd.DataFrame]], title: str, name: str, figures_dir: Path
) -> None:
    """The fraction of records slower than x, log-log: the tail first, ending at the maximum."""
    png = figures.save(figures.exceedance(curves(groups), title), figures_dir, name)
    page.figure(png, f"Fraction of records slower than x (1 − F), log-log: {title}", name)


def repetition_ecdf(
    page: Page, tags: dict, group: pd.DataFrame, args: argparse.Namespace, dirs: OutDirs
) -> None:
    per_rep = [
        (f"rep {g['rep'].iloc[0]} ({run_id})", g["latency_ns"].to_numpy())
        for run_id, g in group.groupby("run_id", observed=True)
    ]
    name = safe_name(f"ecdf_reps_{config_label(tags)}")
    png = figures.save(
        figures.ecdf(per_rep, f"Repetitions of {config_label(tags)}", args.xlim_ms),
        dirs.figures,
        name,
    )
    page.figure(png, f"ECDF per repetition, {config_label(tags)}", name)


def density_section(page: Page, measured: pd.DataFrame, dirs: OutDirs) -> None:
    page.h(2, "Density per configuration")
    png = figures.save(
        figures.density(curves(tables.by_config(measured)), "Latency density"),
        dirs.figures,
        "density",
    )
    page.figure(png, "Density of log latency per configuration", "density")


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
    for row in runs.runs.itertuples():
        run_facts(page, row)
        run_over_time(page, row, runs.samples[runs.samples["run_id"] == row.run_id], args, dirs)


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
    """One run's latency over time (figure) and its HdrHistogram interval log."""
    name = safe_name(f"over_time_{row.run_id}")
    png = figures.save(
        figures.over_time(
            samples["time_s"].to_numpy(),
            samples["latency_ns"].to_numpy(),
            samples["warmup"].to_numpy(),
            f"{row.run_id}: latency over time",
        ),
        dirs.figures,
        name,
    )
    page.figure(png, f"Latency over time, {row.run_id}", name)
    started_at = pd.Timestamp(row.started_at).timestamp() if row.started_at else 0.0
    hdr.write_log(
        dirs.hdr / f"{safe_name(row.run_id)}.hlog",
        samples["time_s"].to_numpy(),
        samples["latency_ns"].to_numpy(),
        started_at,
        args.hdr_interval_s,
    )


def campaign_section(page: Page, results: Path, tables_dir: Path, runs: Runs, picked: bool) -> None:
    """The campaign the results folder holds, if any: what it is, its runs by status, the runs
    that are not done and why, and the sustainable rates of a rate search. An unreadable
    campaign.json is flagged; the runs are reported without it."""
    try:
        doc = campaign.read_campaign(results)
    except campaign.CampaignFileError as e:
        page.h(2, "Campaign")
        page.raw(f'<p class="flag">{html.escape(str(e))}; the runs are reported without it.</p>')
        return
    if doc is None:
        return
    page.h(2, "Campaign")
    page.p(campaign.summary(doc))
    # A run listed as done without a run directory here is missing from every table below.
    known = set(runs.runs["run_id"]) | {name for name, _ in runs.skipped}
    known |= {run.run_id for run in runs.left_out}
    absent = [run_id for run_id in campaign.done_run_ids(doc) if run_id not in known]
    if absent and not picked:
        page.raw(
            f'<p class="flag">Done in {campaign.CAMPAIGN_FILE} but without a run directory '
            f"here: {html.escape(', '.join(absent))}</p>"
        )
    not_done = campaign.runs_not_done(doc)
    page.h(3, "Runs not done")
    if not_done.empty:
        page.p("Every run of the campaign is done.", "note")
    else:
        page.table(not_done, "campaign_runs_not_done")
    tables.write(not_done, tables_dir, "campaign_runs_not_done")
    if doc.get("search") is not None:
        rates = campaign.sustainable_rates(doc)
        page.h(3, "Sustainable rate")
        page.table(rates, "campaign_sustainable_rate")
        page.p(
            "The highest input rate (records/s over the six producers) at which every run of the "
            "trial finished, accounted for every record and kept its p99 within the SLO.",
            "note",
        )
        tables.write(rates, tables_dir, "campaign_sustainable_rate")


def run_curves(groups: list[tuple[dict, pd.DataFrame]]) -> list[tuple[str, list[np.ndarray]]]:
    """(label, [latencies of each run]) per configuration."""
    return [
        (
            config_label(tags),
            [run["latency_ns"].to_numpy() for _, run in group.groupby("run_id", observed=True)],
        )
        for tags, group in groups
    ]


def band_figures(
    page: Page,
    configs: list[tuple[dict, pd.DataFrame]],
    families: dict[tuple, list[tuple[dict, pd.DataFrame]]],
    figures_dir: Path,
    seed: int,
) -> None:
    """ECDFs with intervals across repetitions, all configurations and per target/sched family,
    when some configuration has ≥ 2 runs."""

    def repeated(groups: list[tuple[dict, pd.DataFrame]]) -> bool:
        return any(group["run_id"].nunique() > 1 for _, group in groups)

    if not repeated(configs):
        return
    page.h(2, "ECDF with intervals across repetitions")
    page.p(
        "Line: all runs of a configuration pooled. Band: at each fraction F, the 95 % bootstrap "
        "interval over runs of the mean of each run's F-quantile (nearest rank), from the same "
        "expanded percentile bootstrap as the tables; it shows how far run-to-run variation "
        "alone moves the curve. Configurations with one run have no band.",
        "note",
    )
    png = figures.save(
        figures.ecdf_bands(run_curves(configs), "All configurations", seed),
        figures_dir,
        "ecdf_bands_all",
    )
    caption = "ECDF with 95 % intervals over runs of the mean quantile (shaded)"
    page.figure(png, f"{caption}, all configurations", "ecdf_bands_all")
    for (target, sched), members in families.items():
        if len(members) > 1 and len(families) > 1 and repeated(members):
            name = safe_name(f"ecdf_bands_{target}_{sched}")
            png = figures.save(
                figures.ecdf_bands(run_curves(members), f"{target} / {sched}", seed),
                figures_dir,
                name,
            )
            page.figure(png, f"{caption}, {target} / {sched}", name)


def reps_table(reps: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for _, r in reps.iterrows():
        row = {"configuration": config_label(r), "runs": int(r["runs"])}
        for stat in compare.COMPARED:
            row[stat] = f"{r[stat]:.2f} [{r[stat + '_ci_low']:.2f}, {r[stat + '_ci_high']:.2f}]"
        rows.append(row)
    return pd.DataFrame(rows)


def against_table(against: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for _, r in against.iterrows():
        row = {
            "configuration": config_label(r),
            "runs": int(r["runs"]),
            "reference runs": int(r["reference_runs"]),
            "KS D": r["ks_d"],
            "KS p": r["ks_p"],
        }
        for stat in compare.COMPARED:
            low, high = r[f"{stat}_diff_ci_low"], r[f"{stat}_diff_ci_high"]
            ci = "" if np.isnan(low) else f" [{low:+.2f}, {high:+.2f}]"
            row[f"Δ {stat}"] = f"{r[f'{stat}_diff']:+.2f}{ci}"
        rows.append(row)
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        runs, out = build(args)
    except ValueError as e:  # e.g. a reference that matches no run
        print(f"report: {e}", file=sys.stderr)
        return 1
    for name, reason in runs.skipped:
        print(f"report: skipped {name}: {reason}", file=sys.stderr)
    for run in runs.left_out:
        print(f"report: left out {run.run_id} ({run.state}): {run.reason}", file=sys.stderr)
    for row in runs.runs[runs.runs["problems"] != ""].itertuples():
        print(f"report: {row.run_id}: {row.problems}", file=sys.stderr)
    print(f"report: {len(runs.runs)} run(s) → {out / 'index.html'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
