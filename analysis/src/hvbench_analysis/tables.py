"""Tables (Markdown, LaTeX and CSV): percentiles per run and per configuration, the paper's maximum-
latency layouts (Tables 4, 5 and 6), and latency from the intended send next to the actual.

Every maximum is the largest raw sample of the runs concerned. When a configuration has
repetitions, the maximum-latency tables also give the mean over runs of each run's maximum and
p99, with 95 % bootstrap intervals over runs (compare.bootstrap_mean_ci).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from hvbench_analysis.compare import bootstrap_mean_ci
from hvbench_analysis.labels import config_label, rate_label
from hvbench_analysis.load import by_run, once_per_table, rows_where, run_rows, union_flags
from hvbench_analysis.stats import percentile, summarize
from hvbench_analysis.tags import CONFIG

SCHEDULER_NAMES = {
    "rtds": "RTDS",
    "credit": "Credit",
    "credit2": "Credit2",
    "deadline": "SCHED_DEADLINE",
    "cfs": "CFS",
    "cfs-quota": "CFS quota",
    "fifo": "SCHED_FIFO",
    "none": "default",
}
# Columns of a row of the maximum-latency tables before they are laid out.
MAX_ROW_COLUMNS = ["Scheduler", "rate", "Rate (/s)", "setup", "Max (ms)", "run_max", "run_p99"]


def scheduler_name(sched: str, target: str, several_targets: bool) -> str:
    name = SCHEDULER_NAMES.get(sched, sched)
    return f"{name} ({target})" if several_targets else name


@once_per_table
def by_config(measured: pd.DataFrame) -> list[tuple[dict, pd.DataFrame]]:
    """(configuration tags, its samples) for each configuration, repetitions pooled, in the
    order of the tags. The configurations are found among the runs (a row each), not among
    the samples (a million rows, each with every tag), then each one's samples picked by run."""
    codes, _ = pd.factorize(measured["run_id"])
    runs = run_rows(measured, CONFIG).assign(code=np.unique(codes))
    groups = runs.groupby(list(CONFIG), dropna=False, sort=True, observed=True)
    if groups.ngroups == 1:  # one configuration: its samples are the table itself, not a copy
        return [(dict(zip(CONFIG, key, strict=True)), measured) for key, _ in groups]
    return [
        (dict(zip(CONFIG, key, strict=True)), rows_where(measured, np.isin(codes, group["code"])))
        for key, group in groups
    ]


def percentile_table(
    measured: pd.DataFrame,
    per: str = "config",
    deadline_ms: float | None = None,
    flags: dict[str, str] | None = None,
) -> pd.DataFrame:
    """count, min, p50 … p99.99, max, mean, SD (ms) and % over the deadline, per configuration
    (repetitions pooled) or per run. With `flags` (run id → its quality flags), a flags column:
    the run's, or those of any run of the configuration."""
    rows = []
    if per == "run":
        for run_id, tags, latency_ns in by_run(measured):
            row = {"run_id": run_id, "configuration": config_label(tags), "rep": tags["rep"]}
            rows.append(row | flags_cell(flags, [run_id]) | summarize(latency_ns, deadline_ms))
    else:
        for tags, group in by_config(measured):
            run_ids = group["run_id"].unique()
            row = {"configuration": config_label(tags), "runs": len(run_ids)}
            rows.append(row | flags_cell(flags, run_ids) | summarize_group(group, deadline_ms))
    return pd.DataFrame(rows)


def flags_cell(flags: dict[str, str] | None, run_ids) -> dict:
    """{"flags": the runs' flags together}, or nothing when flags are not asked for."""
    if flags is None:
        return {}
    return {"flags": union_flags(flags.get(run_id, "") for run_id in run_ids)}


def summarize_group(group: pd.DataFrame, deadline_ms: float | None) -> dict:
    return summarize(group["latency_ns"].to_numpy(), deadline_ms)


def _max_rows(measured: pd.DataFrame, which) -> list[dict]:
    several_targets = measured["target"].nunique() > 1
    rows = []
    for tags, group in by_config(measured):
        if which(tags):
            run_max, run_p99 = per_run_max_p99(group)
            rows.append(
                {
                    "Scheduler": scheduler_name(tags["sched"], tags["target"], several_targets),
                    **{k: tags[k] for k in ("budget", "period", "cap", "extratime", "rate")},
                    "Rate (/s)": rate_text(tags["rate"]),
                    "setup": tags.get("setup") or "",
                    "Max (ms)": float(group["latency_ns"].max()) / 1e6,
                    "run_max": run_max,
                    "run_p99": run_p99,
                }
            )
    return rows


def per_run_max_p99(group: pd.DataFrame) -> tuple[list[float], list[float]]:
    """Each run's maximum and nearest-rank p99 (ms), in run id order."""
    maxima, p99s = [], []
    for run in by_run(group):
        ms = run.latency_ns / 1e6
        maxima.append(float(ms.max()))
        p99s.append(float(percentile(ms, 99)))
    return maxima, p99s


def rate_text(rate) -> str:
    return "" if not _has(rate) else f"{rate:g}"


def _has(value) -> bool:
    return value is not None and not pd.isna(value)


def _with_rate_and_runs(table: pd.DataFrame, columns: list[str], seed: int) -> pd.DataFrame:
    """The table's columns, with "Rate (/s)" before the maximum when some configuration runs at
    another rate than the default, "Setup" when configurations differ in how they measured
    (labels.setup_labels), and the repetition columns when some has ≥ 2 runs."""
    columns = list(columns)
    if table["rate"].map(rate_label).astype(bool).any():
        columns.insert(columns.index("Max (ms)"), "Rate (/s)")
    if table["setup"].astype(bool).any():
        table = table.rename(columns={"setup": "Setup"})
        columns.insert(columns.index("Max (ms)"), "Setup")
    if not (table["run_max"].map(len) >= 2).any():
        return table[columns]
    rng = np.random.default_rng(seed)
    table = table.assign(
        **{
            "Runs": table["run_max"].map(len),
            "Mean max (ms) [95 % CI]": [mean_with_ci(v, rng) for v in table["run_max"]],
            "Mean p99 (ms) [95 % CI]": [mean_with_ci(v, rng) for v in table["run_p99"]],
        }
    )
    return table[[*columns, "Runs", "Mean max (ms) [95 % CI]", "Mean p99 (ms) [95 % CI]"]]


def mean_with_ci(values: list[float], rng: np.random.Generator) -> str:
    """The mean over runs as text with its interval (compare.bootstrap_mean_ci), e.g.
    13.25 [12.50, 14.00]; the mean alone for one run."""
    mean = float(np.mean(values))
    if len(values) < 2:
        return f"{mean:.2f}"
    low, high = bootstrap_mean_ci(np.asarray(values), rng)
    return f"{mean:.2f} [{low:.2f}, {high:.2f}]"


def max_table_budget_period(measured: pd.DataFrame, seed: int = 0) -> pd.DataFrame:
    """Table 4: Scheduler | Budget (µs) | Period (µs) | Max (ms), for runs with a budget; with
    repetitions, also the mean over runs of each run's maximum and p99, with 95 % intervals."""
    rows = _max_rows(measured, lambda t: _has(t["budget"]) and _has(t["period"]))
    table = pd.DataFrame(rows, columns=[*MAX_ROW_COLUMNS, "budget", "period", "extratime"])
    table = table.sort_values(["Scheduler", "period", "budget", "rate"], ignore_index=True)
    table["Budget (µs)"] = table["budget"].astype("Int64")
    table["Period (µs)"] = table["period"].astype("Int64")
    columns = ["Scheduler", "Budget (µs)", "Period (µs)", "Max (ms)"]
    if table["extratime"].map(_has).any():
        table["Extratime"] = table["extratime"].map(lambda v: "on" if v else "off")
        columns.insert(3, "Extratime")
    return _with_rate_and_runs(table, columns, seed)


def max_table_cap(measured: pd.DataFrame, seed: int = 0) -> pd.DataFrame:
    """Table 5: Scheduler | Cap (%) | Max (ms), for runs with a cap; repetitions as Table 4."""
    rows = _max_rows(measured, lambda t: _has(t["cap"]))
    table = pd.DataFrame(rows, columns=[*MAX_ROW_COLUMNS, "cap"])
    table = table.sort_values(["Scheduler", "cap", "rate"], ignore_index=True)
    table["Cap (%)"] = table["cap"].astype("Int64")
    return _with_rate_and_runs(table, ["Scheduler", "Cap (%)", "Max (ms)"], seed)


def max_table_scheduler(measured: pd.DataFrame, seed: int = 0) -> pd.DataFrame:
    """Table 6: Scheduler | Max (ms), for runs at the scheduler's defaults (no budget, no cap).
    Configurations that differ in other scheduler settings share their scheduler's row, and its
    repetition columns are over all their runs; those that measured differently do not."""
    rows = _max_rows(measured, lambda t: not _has(t["budget"]) and not _has(t["cap"]))
    table = pd.DataFrame(rows, columns=MAX_ROW_COLUMNS)
    merged = []
    groups = table.groupby(["Scheduler", "Rate (/s)", "setup"], sort=False)
    for (scheduler, rate, setup), group in groups:
        merged.append(
            {
                "Scheduler": scheduler,
                "rate": group["rate"].iloc[0],
                "Rate (/s)": rate,
                "setup": setup,
                "Max (ms)": group["Max (ms)"].max(),
                "run_max": [v for values in group["run_max"] for v in values],
                "run_p99": [v for values in group["run_p99"] for v in values],
            }
        )
    table = pd.DataFrame(merged, columns=MAX_ROW_COLUMNS)
    table = table.sort_values(["Scheduler", "rate"], ignore_index=True)
    return _with_rate_and_runs(table, ["Scheduler", "Max (ms)"], seed)


NOISE_TAGS = ("noise", "noise_cpus", "job_cpus")
PLACES = {"job": " on the job's CPUs", "apart": " on other CPUs", "": ""}


def without_noise(tags: dict) -> dict:
    """A configuration's tags with the neighbours and placement left out: what the rows of
    one interference comparison share."""
    return {k: v for k, v in tags.items() if k not in NOISE_TAGS}


def neighbours_text(tags: dict) -> str:
    """The neighbours and where they ran, e.g. "1:cpu on other CPUs (job on CPU 1)"."""
    where = tags.get("noise_cpus") or ""
    text = (tags.get("noise") or "none") + PLACES.get(where, f" on CPU {where}")
    return text + (f" (job on CPU {tags['job_cpus']})" if tags.get("job_cpus") else "")


def interference_table(
    measured: pd.DataFrame,
    deadline_ms: float | None,
    seed: int = 0,
    noise_work: dict[str, float | None] | None = None,
    copy_work: dict[str, float | None] | None = None,
) -> pd.DataFrame:
    """The second reference study's layout, per configuration and neighbours: Mean, Min, Max,
    SD (ms) and the % of records over the deadline, repetitions pooled; with repetitions, the
    mean over runs of each run's mean and maximum with 95 % bootstrap intervals. With
    `noise_work` (run id → its loads' bogo-ops per second) and `copy_work` (run id → the
    records per second its workload copies received), their means over the runs; the copies'
    column only where some run had copies."""
    rng = np.random.default_rng(seed)
    rows = []
    for tags, group in by_config(measured):
        stats = summarize_group(group, deadline_ms)
        run_means = [float(run.latency_ns.mean()) / 1e6 for run in by_run(group)]
        run_max, _ = per_run_max_p99(group)
        row = {
            "Configuration": config_label(without_noise(tags)),
            "Neighbours": neighbours_text(tags),
            "Runs": len(run_means),
            "Mean (ms)": stats["mean_ms"],
            "Min (ms)": stats["min_ms"],
            "Max (ms)": stats["max_ms"],
            "SD (ms)": stats["sd_ms"],
        }
        if deadline_ms is not None:
            row[f"% > {deadline_ms:g} ms"] = stats["over_deadline_pct"]
        if len(run_means) > 1:
            row["Mean over runs (ms) [95 % CI]"] = mean_with_ci(run_means, rng)
            row["Mean max (ms) [95 % CI]"] = mean_with_ci(run_max, rng)
        run_ids = group["run_id"].unique()
        row["Load work (bogo-ops/s)"] = mean_over_runs(noise_work, run_ids)
        row["Copies (records/s)"] = mean_over_runs(copy_work, run_ids)
        rows.append(row)
    table = pd.DataFrame(rows)
    if table.empty or table["Copies (records/s)"].isna().all():
        table = table.drop(columns="Copies (records/s)", errors="ignore")
    return table.sort_values(["Configuration"], kind="stable", ignore_index=True)


def mean_over_runs(per_run: dict[str, float | None] | None, run_ids) -> float | None:
    values = [(per_run or {}).get(run_id) for run_id in run_ids]
    values = [v for v in values if v is not None and not pd.isna(v)]
    return float(np.mean(values)) if values else None


def intended_vs_actual(measured: pd.DataFrame) -> pd.DataFrame:
    """Coordinated-omission view: latency from the scheduled send next to the actual send.
    A producer that falls behind its schedule shows up only in the first."""
    rows = []
    for tags, group in by_config(measured):
        actual = summarize(group["latency_ns"].to_numpy())
        intended = summarize(group["latency_from_intended_ns"].to_numpy())
        row = {"configuration": config_label(tags), "count": actual["count"]}
        for stat in ("p50_ms", "p99_ms", "p99.9_ms", "max_ms"):
            row[f"{stat} actual"] = actual[stat]
            row[f"{stat} intended"] = intended[stat]
        rows.append(row)
    return pd.DataFrame(rows)


def to_markdown(table: pd.DataFrame, digits: int = 2) -> str:
    """A GitHub-style Markdown table; floats with fixed decimals, missing values empty."""
    if table.empty:
        return "_no runs of this kind_\n"
    header = "| " + " | ".join(map(str, table.columns)) + " |"
    rule = "|" + "|".join("---:" if _numeric(table[c]) else "---" for c in table.columns) + "|"
    lines = [header, rule]
    for _, row in table.iterrows():
        lines.append("| " + " | ".join(cell(v, digits) for v in row) + " |")
    return "\n".join(lines) + "\n"


def _numeric(column: pd.Series) -> bool:
    return pd.api.types.is_numeric_dtype(column)


def cell(value, digits: int) -> str:
    """A Markdown cell: text_cell with "|" escaped."""
    text = text_cell(value, digits)
    return text.replace("|", "\\|") if isinstance(value, str) else text


def text_cell(value, digits: int) -> str:
    """A value as a table shows it: floats with fixed decimals, missing values empty."""
    if value is None or (not isinstance(value, str) and pd.isna(value)):
        return ""
    if isinstance(value, float | np.floating):
        return f"{value:,.{digits}f}"
    if isinstance(value, int | np.integer):
        return str(value)
    return str(value)


# LaTeX's special characters, and the symbols of our column names that pdfLaTeX's text mode
# lacks, as LaTeX writes them.
LATEX = {
    **{c: f"\\{c}" for c in "&%$#_{}"},
    "\\": r"\textbackslash{}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
    "µ": r"\textmu{}",
    "−": "$-$",
    "Δ": r"$\Delta$",
    "≤": r"$\leq$",
    "≥": r"$\geq$",
    "×": r"$\times$",
    "→": r"$\rightarrow$",
}


def latex_escape(text: str) -> str:
    return "".join(LATEX.get(c, c) for c in str(text))


def to_latex(table: pd.DataFrame, digits: int = 2) -> str:
    """A booktabs tabular (\\toprule, \\midrule, \\bottomrule): numbers right-aligned, text
    left, floats with fixed decimals, missing values empty. Needs \\usepackage{booktabs}."""
    if table.columns.empty:
        return "% no runs of this kind\n"
    align = "".join("r" if _numeric(table[c]) else "l" for c in table.columns)
    lines = [f"\\begin{{tabular}}{{{align}}}", r"\toprule", latex_row(table.columns, digits)]
    lines.append(r"\midrule")
    lines.extend(latex_row(row, digits) for _, row in table.iterrows())
    lines += [r"\bottomrule", r"\end{tabular}"]
    return "\n".join(lines) + "\n"


def latex_row(values, digits: int) -> str:
    return " & ".join(latex_escape(text_cell(v, digits)) for v in values) + r" \\"


def write(table: pd.DataFrame, directory: Path, name: str, digits: int = 2) -> str:
    """name.md, name.tex (LaTeX, booktabs) and name.csv (CSV at full precision); returns the
    Markdown."""
    directory.mkdir(parents=True, exist_ok=True)
    table.to_csv(directory / f"{name}.csv", index=False)
    (directory / f"{name}.tex").write_text(to_latex(table, digits))
    markdown = to_markdown(table, digits)
    (directory / f"{name}.md").write_text(markdown)
    return markdown


def energy_table(measured: pd.DataFrame, runs: pd.DataFrame, seed: int = 0) -> pd.DataFrame:
    """Latency beside energy, per configuration: each run's p99 and maximum and its measured
    window's energy (meta.json `energy`), as the mean over the configuration's runs (with 95 %
    intervals from two runs on); "n/a" where a run's host had no energy source."""
    run_facts = runs.set_index("run_id")
    rng = np.random.default_rng(seed)
    rows = []
    for tags, group in by_config(measured):
        maxima, p99s = per_run_max_p99(group)
        ids = [run.run_id for run in by_run(group)]
        energy = run_facts.loc[ids]
        per_record = [v for v in energy["mj_per_record"] if _has(v)]
        watts = [v for v in energy["mean_w"] if _has(v)]
        sources = sorted(set(energy["energy"]))
        rows.append(
            {
                "Configuration": config_label(tags),
                "Runs": len(ids),
                "p99 (ms)": mean_with_ci(p99s, rng),
                "Max (ms)": mean_with_ci(maxima, rng),
                "Energy / record (mJ)": mean_with_ci(per_record, rng) if per_record else "n/a",
                "Mean power (W)": mean_with_ci(watts, rng) if watts else "n/a",
                "Energy source": "; ".join(sources),
                "p99_ms": float(np.mean(p99s)),
                "mj_per_record": float(np.mean(per_record)) if per_record else None,
            }
        )
    return pd.DataFrame(rows)


def pareto_front(points: list[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point beats on both axes (lower is better on each),
    by the first axis."""
    order = sorted(range(len(points)), key=lambda i: points[i])
    front, best = [], float("inf")
    for i in order:
        if points[i][1] < best:
            front.append(i)
            best = points[i][1]
    return front
