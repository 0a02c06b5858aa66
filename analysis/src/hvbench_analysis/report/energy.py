"""The energy section: latency beside the energy each configuration cost (meta.json `energy`),
and the latency-against-energy view with its Pareto front."""

from __future__ import annotations

import argparse

from hvbench_analysis import figures, tables
from hvbench_analysis.load import Runs
from hvbench_analysis.report.page import OutDirs, Page, table_with_note


def energy_section(page: Page, runs: Runs, args: argparse.Namespace, dirs: OutDirs) -> None:
    """Only when some run recorded its energy, or set a power policy."""
    table = runs.runs
    recorded = table["energy"] != "not recorded"
    if not recorded.any() and not table["power"].astype(bool).any():
        return
    page.h(2, "Energy: latency against power")
    found = tables.energy_table(runs.measured, table, args.seed)
    shown = found.drop(columns=["p99_ms", "mj_per_record"])
    table_with_note(
        page,
        shown,
        "energy",
        dirs,
        "Per configuration, the mean over its runs (95 % bootstrap intervals from two runs on) "
        "of each run's p99 and maximum latency and of the energy of its measured window (the "
        "warm-up over to the last send), per record measured and as mean power: the host's "
        "packages and their DRAM (RAPL), or the BMC's whole-machine reading (IPMI DCMI). The "
        "power policy a run set is in brackets in its label. n/a: the run's host offered no "
        "energy source; the source column says why.",
    )
    known = found.dropna(subset=["mj_per_record"])
    if known.empty:
        return
    points = list(zip(known["Configuration"], known["mj_per_record"], known["p99_ms"], strict=True))
    front = tables.pareto_front([(x, y) for _, x, y in points])
    name = "latency_vs_energy"
    drawn = figures.save(dirs.figures, name, figures.latency_vs_energy, points, front)
    page.figure(
        drawn, "p99 latency against energy per record, per configuration", "latency_vs_energy"
    )
