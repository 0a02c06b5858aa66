"""The interference section: latency by neighbours (NOISE), in the second reference study's
table layout, with ECDF and density overlays of each configuration under its neighbours."""

from __future__ import annotations

import argparse

import pandas as pd

from hvbench_analysis import figures, tables
from hvbench_analysis.labels import config_label
from hvbench_analysis.load import Runs
from hvbench_analysis.report.page import OutDirs, Page, safe_name, table_with_note


def interference_section(page: Page, runs: Runs, args: argparse.Namespace, dirs: OutDirs) -> None:
    """Only when some run had neighbours or held the job to some CPUs."""
    measured = runs.measured
    if not runs.runs[list(tables.NOISE_TAGS)].astype(str).ne("").any().any():  # a row a run
        return
    page.h(2, "Interference: latency by neighbours")
    work = dict(zip(runs.runs["run_id"], runs.runs["noise_work"], strict=True))
    copies = dict(zip(runs.runs["run_id"], runs.runs["copy_work"], strict=True))
    table = tables.interference_table(measured, args.deadline_ms, args.seed, work, copies)
    deadline = (
        f" % > {args.deadline_ms:g} ms: share of records later than the deadline (DEADLINE_MS)."
        if args.deadline_ms is not None
        else " make report DEADLINE_MS=… adds the share of records over a deadline."
    )
    table_with_note(
        page,
        table,
        "interference",
        dirs,
        "Mean, Min, Max and SD over every measured record of the configuration's runs "
        "(pooled); with repetitions, the mean over runs of each run's mean and maximum with "
        f"95 % bootstrap intervals.{deadline} Neighbours: COUNT:STATE as the runs asked for "
        "them (NOISE), and where their loads ran (NOISE_CPUS). Load work: what the loads did, "
        "stress-ng's bogo-ops per second summed over them, mean over the runs (comparable "
        "between runs of the same loads on one machine). Copies: the records per second the "
        "copies of the workload (NOISE=N:workload) received, summed, mean over the runs. Each "
        "run's meta.json `noise` has the rest, the copies' own latency too.",
    )
    for base, members in by_base(measured):
        if len(members) < 2:
            continue
        title = f"{config_label(base)}: by neighbours"
        labelled = [
            (tables.neighbours_text(tags), g["latency_ns"].to_numpy()) for tags, g in members
        ]
        name = safe_name(f"ecdf_noise_{config_label(base)}")
        drawn = figures.save(dirs.figures, name, figures.ecdf, labelled, title, args.xlim_ms)
        page.figure(drawn, f"ECDF by neighbours, {config_label(base)}", name)
        name = safe_name(f"density_noise_{config_label(base)}")
        drawn = figures.save(dirs.figures, name, figures.density, labelled, title)
        page.figure(drawn, f"Density of log latency by neighbours, {config_label(base)}", name)


def by_base(measured: pd.DataFrame) -> list[tuple[dict, list[tuple[dict, pd.DataFrame]]]]:
    """Configurations grouped by all but their neighbours and placement."""
    bases: dict[str, tuple[dict, list]] = {}
    for tags, group in tables.by_config(measured):
        base = tables.without_noise(tags)
        bases.setdefault(config_label(base), (base, []))[1].append((tags, group))
    return list(bases.values())
