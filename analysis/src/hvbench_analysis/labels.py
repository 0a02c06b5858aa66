"""Labels for configurations, as tables and figures print them (from the runs' tags)."""

from __future__ import annotations

import pandas as pd

from hvbench_analysis.tags import (
    CONFIG,
    DEFAULT_RATE_PER_S,
    MEASUREMENT,
    MEASUREMENT_TEXT,
    SETTINGS,
)


def setup_labels(runs: pd.DataFrame) -> pd.Series:
    """Per run, the measurement settings in which its configuration differs from others with
    the same SETTINGS, as its label shows them (e.g. "warm-up 2 s, 120 records"); "" where all
    agree, so that the usual labels stay short."""
    labels = pd.Series("", index=runs.index, dtype=object)
    if runs.empty:
        return labels
    same_settings = runs[list(SETTINGS)].astype(str).agg("|".join, axis=1)
    for _, group in runs.groupby(same_settings):
        varying = [tag for tag in MEASUREMENT if group[tag].astype(str).nunique() > 1]
        for index, row in group.iterrows():
            texts = (measurement_text(tag, row[tag]) for tag in varying)
            labels[index] = ", ".join(text for text in texts if text)
    return labels


def measurement_text(tag: str, value) -> str:
    """How a measurement setting reads in a label, e.g. "warm-up 2 s", "120 records"; checks
    that were not forced read as nothing."""
    if tag == "forced":
        return "forced checks" if value else ""
    known, unknown = MEASUREMENT_TEXT[tag]
    if value is None or pd.isna(value):
        return unknown
    whole = isinstance(value, float) and value.is_integer()
    return known.format(int(value) if whole else value)  # 120 records, not 120.0


def number_repetitions(runs: pd.DataFrame) -> None:
    """Runs without a rep tag are numbered 1, 2, … within their configuration, by start time."""
    if runs.empty:
        return
    missing = runs["rep"].isna()
    if not missing.any():
        return
    order = runs[missing].sort_values(["started_at", "run_id"], na_position="last")
    keys = order[list(CONFIG)].astype(str).agg("|".join, axis=1)
    runs.loc[order.index, "rep"] = keys.groupby(keys).cumcount() + 1


def config_label(row) -> str:
    """A short name for a configuration: sched and the settings it has, the rate unless it is
    the default, and the measurement settings that tell it apart from configurations with the
    same settings, e.g. xen/rtds P100000 B77500 @120/s warm-up 2 s."""
    parts = [f"{row['target']}/{row['sched']}"]
    for tag, short in (
        ("period", "P"),
        ("budget", "B"),
        ("cap", "cap"),
        ("weight", "w"),
        ("priority", "prio"),
        ("tslice", "ts"),
        ("ratelimit", "rl"),
    ):
        value = row.get(tag)
        if value is not None and not pd.isna(value):
            parts.append(f"{short}{int(value)}")
    if row.get("extratime") is not None and not pd.isna(row.get("extratime")):
        parts.append(f"e{int(row['extratime'])}")
    if rate := rate_label(row.get("rate")):
        parts.append(f"@{rate}/s")
    parts += noise_label(row)
    if scale := row.get("scale"):
        parts.append(f"on {scale}")
    if network := row.get("network"):
        parts.append(f"({network})")
    if load := row.get("load"):
        parts.append(f"({load})")
    if power := row.get("power"):
        parts.append(f"[{power}]")
    setup = row.get("setup")
    if isinstance(setup, str) and setup:
        parts.append(setup)
    return " ".join(parts)


def noise_label(row) -> list[str]:
    """e.g. ["job on CPU 1", "noise 1:cpu on the job's CPUs"]; [] without either."""
    parts = []
    if job_cpus := row.get("job_cpus"):
        parts.append(f"job on CPU {job_cpus}")
    if noise := row.get("noise"):
        where = row.get("noise_cpus")
        places = {"job": " on the job's CPUs", "apart": " apart", "": ""}
        parts.append(f"noise {noise}" + places.get(where, f" on CPU {where}"))
    return parts


def rate_label(rate) -> str:
    """The rate as text (120, 857.143) if it is known and not the default 60/s, else ""."""
    if rate is None or pd.isna(rate) or rate == DEFAULT_RATE_PER_S:
        return ""
    return f"{rate:g}"
