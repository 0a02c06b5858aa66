"""The latency sections: percentiles, maxima, ECDFs, exceedance, densities, repetitions."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from hvbench_analysis import (
    compare,
    figures,
    tables,
)
from hvbench_analysis.labels import config_label
from hvbench_analysis.load import by_run
from hvbench_analysis.report.page import OutDirs, Page, curves, run_curves, safe_name


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
    drawn = figures.save(
        dirs.figures, "ecdf_all", figures.ecdf, curves(configs), "All configurations", args.xlim_ms
    )
    page.figure(drawn, "ECDF of end-to-end latency, all configurations", "ecdf_all")
    exceedance_figure(page, configs, "All configurations", "exceedance_all", dirs.figures)
    families: dict[tuple, list[tuple[dict, pd.DataFrame]]] = {}
    for tags, group in configs:
        families.setdefault((tags["target"], tags["sched"]), []).append((tags, group))
    for (target, sched), members in families.items():
        if len(members) > 1 and len(families) > 1:
            name = safe_name(f"ecdf_{target}_{sched}")
            title = f"{target} / {sched}"
            drawn = figures.save(
                dirs.figures, name, figures.ecdf, curves(members), title, args.xlim_ms
            )
            page.figure(drawn, f"ECDF, {target} / {sched}", name)
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
    drawn = figures.save(figures_dir, name, figures.exceedance, curves(groups), title)
    page.figure(drawn, f"Fraction of records slower than x (1 − F), log-log: {title}", name)


def repetition_ecdf(
    page: Page, tags: dict, group: pd.DataFrame, args: argparse.Namespace, dirs: OutDirs
) -> None:
    per_rep = [(f"rep {run.tags['rep']} ({run.run_id})", run.latency_ns) for run in by_run(group)]
    name = safe_name(f"ecdf_reps_{config_label(tags)}")
    title = f"Repetitions of {config_label(tags)}"
    drawn = figures.save(dirs.figures, name, figures.ecdf, per_rep, title, args.xlim_ms)
    page.figure(drawn, f"ECDF per repetition, {config_label(tags)}", name)


def density_section(page: Page, measured: pd.DataFrame, dirs: OutDirs) -> None:
    page.h(2, "Density per configuration")
    configs = curves(tables.by_config(measured))
    drawn = figures.save(dirs.figures, "density", figures.density, configs, "Latency density")
    page.figure(drawn, "Density of log latency per configuration", "density")


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
    title = "All configurations"
    drawn = figures.save(
        figures_dir, "ecdf_bands_all", figures.ecdf_bands, run_curves(configs), title, seed
    )
    caption = "ECDF with 95 % intervals over runs of the mean quantile (shaded)"
    page.figure(drawn, f"{caption}, all configurations", "ecdf_bands_all")
    for (target, sched), members in families.items():
        if len(members) > 1 and len(families) > 1 and repeated(members):
            name = safe_name(f"ecdf_bands_{target}_{sched}")
            title = f"{target} / {sched}"
            drawn = figures.save(
                figures_dir, name, figures.ecdf_bands, run_curves(members), title, seed
            )
            page.figure(drawn, f"{caption}, {target} / {sched}", name)


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
