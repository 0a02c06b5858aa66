"""Tables (Markdown and CSV): percentiles per run and per configuration, the paper's maximum-
latency layouts (Tables 4, 5 and 6), and latency from the intended send next to the actual.

Every maximum is the largest raw sample of the runs concerned.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from hvbench_analysis.load import CONFIG, config_label
from hvbench_analysis.stats import summarize

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


def scheduler_name(sched: str, target: str, several_targets: bool) -> str:
    name = SCHEDULER_NAMES.get(sched, sched)
    return f"{name} ({target})" if several_targets else name


def by_config(measured: pd.DataFrame) -> list[tuple[dict, pd.DataFrame]]:
    """(configuration tags, its samples) for each configuration, repetitions pooled."""
    groups = measured.groupby(list(CONFIG), dropna=False, sort=True, observed=True)
    return [(dict(zip(CONFIG, key, strict=True)), group) for key, group in groups]


def percentile_table(
    measured: pd.DataFrame, per: str = "config", deadline_ms: float | None = None
) -> pd.DataFrame:
    """count, min, p50 … p99.99, max, mean, SD (ms) and % over the deadline, per configuration
    (repetitions pooled) or per run."""
    rows = []
    if per == "run":
        for run_id, group in measured.groupby("run_id", observed=True, sort=True):
            first = group.iloc[0]
            rows.append(
                {"run_id": run_id, "configuration": config_label(first), "rep": first["rep"]}
                | summarize(group["latency_ns"].to_numpy(), deadline_ms)
            )
    else:
        for tags, group in by_config(measured):
            rows.append(
                {"configuration": config_label(tags), "runs": group["run_id"].nunique()}
                | summarize(group["latency_ns"].to_numpy(), deadline_ms)
            )
    return pd.DataFrame(rows)


def _max_rows(measured: pd.DataFrame, which) -> list[dict]:
    several_targets = measured["target"].nunique() > 1
    rows = []
    for tags, group in by_config(measured):
        if which(tags):
            rows.append(
                {
                    "Scheduler": scheduler_name(tags["sched"], tags["target"], several_targets),
                    **{k: tags[k] for k in ("budget", "period", "cap", "extratime")},
                    "Max (ms)": float(group["latency_ns"].max()) / 1e6,
                }
            )
    return rows


def _has(value) -> bool:
    return value is not None and not pd.isna(value)


def max_table_budget_period(measured: pd.DataFrame) -> pd.DataFrame:
    """Table 4: Scheduler | Budget (µs) | Period (µs) | Max (ms), for runs with a budget."""
    rows = _max_rows(measured, lambda t: _has(t["budget"]) and _has(t["period"]))
    table = pd.DataFrame(rows, columns=["Scheduler", "budget", "period", "extratime", "Max (ms)"])
    table = table.sort_values(["Scheduler", "period", "budget"], ignore_index=True)
    table["Budget (µs)"] = table["budget"].astype("Int64")
    table["Period (µs)"] = table["period"].astype("Int64")
    if table["extratime"].map(_has).any():
        table["Extratime"] = table["extratime"].map(lambda v: "on" if v else "off")
        return table[["Scheduler", "Budget (µs)", "Period (µs)", "Extratime", "Max (ms)"]]
    return table[["Scheduler", "Budget (µs)", "Period (µs)", "Max (ms)"]]


def max_table_cap(measured: pd.DataFrame) -> pd.DataFrame:
    """Table 5: Scheduler | Cap (%) | Max (ms), for runs with a cap."""
    rows = _max_rows(measured, lambda t: _has(t["cap"]))
    table = pd.DataFrame(rows, columns=["Scheduler", "cap", "Max (ms)"])
    table = table.sort_values(["Scheduler", "cap"], ignore_index=True)
    table["Cap (%)"] = table["cap"].astype("Int64")
    return table[["Scheduler", "Cap (%)", "Max (ms)"]]


def max_table_scheduler(measured: pd.DataFrame) -> pd.DataFrame:
    """Table 6: Scheduler | Max (ms), for runs at the scheduler's defaults (no budget, no cap)."""
    rows = _max_rows(measured, lambda t: not _has(t["budget"]) and not _has(t["cap"]))
    table = pd.DataFrame(rows, columns=["Scheduler", "Max (ms)"])
    table = table.groupby("Scheduler", as_index=False, sort=True)["Max (ms)"].max()
    return table[["Scheduler", "Max (ms)"]]


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
    if value is None or (not isinstance(value, str) and pd.isna(value)):
        return ""
    if isinstance(value, float | np.floating):
        return f"{value:,.{digits}f}"
    if isinstance(value, int | np.integer):
        return str(value)
    return str(value).replace("|", "\\|")


def write(table: pd.DataFrame, directory: Path, name: str, digits: int = 2) -> str:
    """name.md and name.csv (CSV at full precision); returns the Markdown."""
    directory.mkdir(parents=True, exist_ok=True)
    table.to_csv(directory / f"{name}.csv", index=False)
    markdown = to_markdown(table, digits)
    (directory / f"{name}.md").write_text(markdown)
    return markdown
