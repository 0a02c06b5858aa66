"""`make report`: runs in results/ → one self-contained HTML page, with the figures (SVG,
PDF; PNG with --png), tables (Markdown, LaTeX, CSV) and HdrHistogram logs beside it.

    python -m hvbench_analysis.report --results results --out report \\
        [--runs 'run-a,rtds-*'] [--ref sched=credit] [--deadline-ms 50] [--xlim-ms 100] \\
        [--include-failed] [--png]

For each run the page says the scheduler settings read back, the clock and the counts, and
its quality flags (unaccounted records, forced readiness checks, faults …), also beside each
configuration's percentiles. Runs that cannot be read are listed with the reason and left out
of every figure and table; so are runs that failed or were interrupted, unless
--include-failed (then they are in, flagged). A campaign's folder (results/<campaign>, holding
campaign.json) also gets a section on the campaign: its runs by status, the runs that are not
done and why, and the sustainable rates of a rate search; where `make model` saved a model
beside the runs, the model's held-out errors, its predictions and the advice it gave.
"""

from __future__ import annotations

import argparse
import atexit
import gc
import sys
import time
from pathlib import Path

from hvbench_analysis import compare, drawing, figures, sched_trace
from hvbench_analysis.load import Runs, load_runs, run_dirs, run_rows
from hvbench_analysis.report.campaigns import campaign_section
from hvbench_analysis.report.energy import energy_section
from hvbench_analysis.report.explain import (
    bound_section,
    explain_section,
    noise_floor_section,
    stage_section,
)
from hvbench_analysis.report.interference import interference_section
from hvbench_analysis.report.latency import (
    density_section,
    ecdf_section,
    intended_section,
    max_section,
    percentile_section,
    repetition_sections,
)
from hvbench_analysis.report.model import model_section
from hvbench_analysis.report.overview import intro_section, left_out_section, runs_section
from hvbench_analysis.report.page import OutDirs, Page
from hvbench_analysis.report.simulated import simulated_section
from hvbench_analysis.tags import TAGS

# The interpreter's last collection, as the process ends, would walk every object the report
# made (0.2 s of a report of 10 runs); frozen first, they are left to the exit
atexit.register(gc.freeze)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="hvbench report", description=__doc__.split("\n")[0])
    p.add_argument("--results", default="results", help="the folder holding run directories")
    p.add_argument("--runs", default="", help="comma-separated run names or globs (default all)")
    p.add_argument("--out", default="report")
    p.add_argument("--ref", default="", help="reference configuration, e.g. sched=credit")
    p.add_argument("--deadline-ms", type=float, help="report the %% of records over it")
    p.add_argument("--xlim-ms", type=float, help="x-axis limit of the ECDFs")
    p.add_argument("--hdr-interval-s", type=float, default=10.0)
    p.add_argument(
        "--png",
        action="store_true",
        help="write each figure as PNG too (beside SVG and PDF), and show the PNGs in the page",
    )
    p.add_argument("--seed", type=int, default=0, help="of the bootstrap")
    p.add_argument(
        "--include-failed",
        action="store_true",
        help="include runs that failed or were interrupted in the statistics (flagged)",
    )
    return p.parse_args(argv)


def build(args: argparse.Namespace) -> tuple[Runs, Path]:
    """The report of the runs args picks: index.html and its figures, tables and logs."""
    started = time.perf_counter()
    results, out = Path(args.results), Path(args.out)
    names = [n.strip() for n in args.runs.split(",") if n.strip()]
    drawing.begin(figures.warm_up)  # the workers load while the runs are read
    runs = read_runs(results, names, args.include_failed)
    dirs = OutDirs(out / "figures", out / "tables", out / "hdr")
    if args.ref:  # refused before anything is drawn or written
        compare.reference_runs(run_rows(runs.measured, TAGS), compare.parse_selector(args.ref))
    page = Page("hvbench latency report")
    # The sections shown last hold the figures, some of a second or more. They are built
    # first, so that the workers draw while the report computes the tables shown before them
    # (Page.part keeps their place), and the last figures handed on are the short ones.
    tables_first = page.part()
    formats = ("png", "svg", "pdf") if args.png else ("svg", "pdf")
    # the trace parsed once for the explanations and the simulator's demands
    with sched_trace.parsed_once(), figures.written_as(*formats):
        figure_sections(page, runs, args, dirs)
        table_sections(tables_first, runs, names, args, dirs)
    page.p(
        f"HdrHistogram interval logs per run: hdr/<run>.hlog. Built in "
        f"{time.perf_counter() - started:.1f} s.",
        "note",
    )
    out.mkdir(parents=True, exist_ok=True)
    (out / "index.html").write_text(page.render())
    return runs, out


def table_sections(
    page: Page, runs: Runs, names: list[str], args: argparse.Namespace, dirs: OutDirs
) -> None:
    """The sections shown first, mostly tables: what was read, the latency tables, the
    neighbours, the energy, the bounds."""
    results, measured = Path(args.results), runs.measured
    intro_section(page, runs, results)
    left_out_section(page, runs, dirs.tables)
    campaign_section(page, results, dirs.tables, runs, picked=bool(names))
    percentile_section(page, measured, flags_by_run(runs), args, dirs)
    max_section(page, measured, args, dirs)
    interference_section(page, runs, args, dirs)
    energy_section(page, runs, args, dirs)
    bound_section(page, runs, dirs)
    intended_section(page, measured, dirs)


def figure_sections(page: Page, runs: Runs, args: argparse.Namespace, dirs: OutDirs) -> None:
    """The sections shown last, mostly figures: the stage legs, the explanations, the
    simulator, the model, the repetitions, the ECDFs and densities, and each run's latency over
    time (the shortest figures, so the last)."""
    measured = runs.measured
    stage_section(page, measured, args, dirs)
    explain_section(page, runs, args, dirs)
    simulated_section(page, runs, args, dirs)
    noise_floor_section(page, runs, dirs)
    model_section(page, Path(args.results), dirs)
    repetition_sections(page, measured, args, dirs)
    ecdf_section(page, measured, args, dirs)
    density_section(page, measured, dirs)
    runs_section(page, runs, args, dirs)


def read_runs(results: Path, names: list[str], include_failed: bool = False) -> Runs:
    """The runs to report (warm-up records kept, marked); SystemExit when there are none."""
    if not results.is_dir():
        raise SystemExit(f"report: no results folder {results}")
    runs = load_runs(run_dirs(results, names), include_warmup=True, include_failed=include_failed)
    if runs.runs.empty and runs.left_out:
        states = "; ".join(f"{r.run_id}: {r.state}, {r.reason}" for r in runs.left_out)
        raise SystemExit(
            f"report: no completed runs with measured samples in {results} ({states}); "
            "--include-failed (make report INCLUDE_FAILED=1) reports failed and interrupted ones"
        )
    if runs.runs.empty:
        reasons = "; ".join(f"{n}: {r}" for n, r in runs.skipped) or "no run directories"
        raise SystemExit(f"report: no readable runs in {results} ({reasons})")
    return runs


def flags_by_run(runs: Runs) -> dict[str, str]:
    """Each run's quality flags (comma-separated), by run id."""
    return dict(zip(runs.runs["run_id"], runs.runs["flags"], strict=True))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        runs, out = build(args)
    except ValueError as e:  # e.g. a reference that matches no run
        print(f"report: {e}", file=sys.stderr)
        return 1
    except (OSError, drawing.WriteFailed) as e:  # a full disk, a folder it may not write to
        print(f"report: stopped, {args.out}/index.html not written: {e}", file=sys.stderr)
        return 1
    finally:
        drawing.finish()
    for name, reason in runs.skipped:
        print(f"report: skipped {name}: {reason}", file=sys.stderr)
    for run in runs.left_out:
        print(f"report: left out {run.run_id} ({run.state}): {run.reason}", file=sys.stderr)
    for row in runs.runs[runs.runs["problems"] != ""].itertuples():
        print(f"report: {row.run_id}: {row.problems}", file=sys.stderr)
    print(f"report: {len(runs.runs)} run(s) → {out / 'index.html'}")
    return 0
