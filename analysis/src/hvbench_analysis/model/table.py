"""Each run as one row of the model's table: the settings it asked for, what they imply (the
CPU share, the bound), and its latency statistics; the inputs a model is fitted over."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from hvbench_analysis import bounds, results, stats
from hvbench_analysis.load import Runs
from hvbench_analysis.tags import asked

STATISTICS = ("mean", "sd", "p50", "p99", "p99.9", "max")
# Each statistic as the reservation simulator gives it for a run's setting (model/simulated.py)
SIM = "sim_"
SIM_COLUMNS = tuple(f"{SIM}{name}" for name in STATISTICS)
PERCENTILE_OF = {"p50": 50.0, "p99": 99.0, "p99.9": 99.9}
Z = 1.6449  # a two-sided 90 % interval; its upper end is a one-sided 95 % bound
# The settings as the runs asked for them, and what a run is measured with.
SETTINGS = ("target", "sched", "noise", "rate", "budget", "period", "extratime", "cap", "weight")
MEASUREMENT = ("records", "warmup_s")
CATEGORICAL = ("target", "sched", "noise")
# Numeric inputs: the rate, the share of a CPU reserved, the bound and the scheduler
# parameters that are not already in the share. Where a parameter is unset, the scheduler's
# default stands in (period 100 ms, weight 256, extratime 0).
NUMERIC = ("rate", "share", "capacity_ms", "period", "extratime", "weight")
DEFAULTS = {"period": bounds.DEFAULT_PERIOD_US, "weight": 256, "extratime": 0}
TRANSFORM = {"rate": np.log, "capacity_ms": np.log, "weight": np.log}


class ModelError(ValueError):
    """Runs a model cannot be fitted to, or a question it cannot answer, with the reason."""


# ---------------------------------------------------------------------------------------------
# the runs as the model's inputs


def run_statistics(latency_ms: np.ndarray) -> dict[str, float]:
    """A run's statistics (ms) over its measured records."""
    ms = np.asarray(latency_ms, dtype=float)
    found = dict(
        zip(PERCENTILE_OF, stats.percentile(ms, list(PERCENTILE_OF.values())), strict=True)
    )
    return {
        "mean": float(ms.mean()),
        "sd": float(ms.std(ddof=1)),
        **{name: float(value) for name, value in found.items()},
        "max": float(ms.max()),
    }


def cpu_share(setting: dict) -> float:
    """The share of a CPU a setting reserves: B / P, or a cap in % / 100; 1 without one."""
    budget, period, cap = setting.get("budget"), setting.get("period"), setting.get("cap")
    if bounds.known(budget) and budget > 0:
        return budget / (period if bounds.known(period) else bounds.DEFAULT_PERIOD_US)
    if bounds.known(cap) and cap > 0:
        return cap / 100
    return 1.0


def bound_of(setting: dict, sched_readback=None) -> float:
    """The reservation's bound in ms (0 without one): read back where the run kept it."""
    found = bounds.run_reservation(setting, sched_readback)
    return found.bound_ms or 0.0


def run_table(runs: Runs) -> pd.DataFrame:
    """One row per completed run: run_id, settings, measurement, share, bound_ms, config and
    the statistics. Runs with fewer than 100 measured records are refused (a p99.9 needs
    them)."""
    if runs.runs.empty:
        raise ModelError("no completed runs to fit a model to")
    latency = runs.measured.dropna(subset=["latency_ns"]).groupby("run_id", observed=True)
    rows = []
    for tags in runs.runs.to_dict("records"):
        run_id = tags["run_id"]
        ms = (
            latency.get_group(run_id)["latency_ns"].to_numpy() / 1e6
            if run_id in latency.groups
            else np.array([])
        )
        lost = lost_latency_ms(Path(tags["path"])) if tags.get("missing") else np.array([])
        if len(ms) < 100:
            raise ModelError(f"run {run_id} has {len(ms)} measured records; the model needs 100")
        ms = np.concatenate([ms, lost])
        row = {"run_id": run_id, **{k: tags[k] for k in (*SETTINGS, *MEASUREMENT)}}
        row["censored"] = len(lost)
        row["share"] = cpu_share(row)
        row["bound_ms"] = bound_of(tags, tags.get("sched_readback"))
        rows.append({**row, **run_statistics(ms)})
    table = pd.DataFrame(rows)
    table["config"] = config_keys(table)
    return table


def lost_latency_ms(directory: Path) -> np.ndarray:
    """The measured records a run sent and never received (an overloaded run whose drain
    ended first), each at a lower bound of its latency: the run waited for them until DRAIN
    seconds after the last send (and past the last record it received). Left out, they would
    make an overloaded run look fast."""
    samples = results.read_samples(directory)
    drain_s = asked(results.read_meta(directory)["requested"], "drain") or 0.0
    end = max(samples["sent_ns"].max() + drain_s * 1e9, samples["received_ns"].max())
    lost = samples[(samples["copies"] == 0) & ~samples["warmup"] & samples["sent_ns"].notna()]
    return (end - lost["sent_ns"]).to_numpy(float) / 1e6


def config_keys(table: pd.DataFrame) -> pd.Series:
    """A configuration: the settings, as text (repetitions share it)."""

    def text(row) -> str:
        return ", ".join(f"{k}={row[k]}" for k in SETTINGS if bounds.known(row[k]) and row[k] != "")

    return table.apply(text, axis=1)


def numeric_inputs(frame: pd.DataFrame) -> pd.DataFrame:
    """The numeric inputs with the defaults in the gaps."""
    out = pd.DataFrame(index=frame.index)
    for name in NUMERIC:
        if name == "capacity_ms":  # the CPU reserved per record: below its cost, a queue grows
            out[name] = out["share"] * 1000 / out["rate"]
            continue
        column = pd.to_numeric(frame[name], errors="coerce").astype(float)
        out[name] = column.fillna(DEFAULTS.get(name, np.nan))
    return out


def categorical_inputs(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[list(CATEGORICAL)].fillna("").astype(str)


# ---------------------------------------------------------------------------------------------
# the inputs the model uses


@dataclass
class Inputs:
    """The inputs that vary in the training runs (the model's dimensions), the ranges and
    levels it saw, and those that did not vary: the model speaks only of those values."""

    numeric: list[str]
    levels: dict[str, list[str]]
    ranges: dict[str, tuple[float, float]]
    fixed: dict[str, object]
    center: np.ndarray = field(repr=False)
    scale: np.ndarray = field(repr=False)

    @classmethod
    def of(cls, table: pd.DataFrame) -> Inputs:
        numbers, words = numeric_inputs(table), categorical_inputs(table)
        numeric = [n for n in NUMERIC if numbers[n].nunique() > 1]
        levels = {c: sorted(words[c].unique()) for c in CATEGORICAL if words[c].nunique() > 1}
        fixed = {n: float(numbers[n].iloc[0]) for n in NUMERIC if n not in numeric}
        fixed |= {c: words[c].iloc[0] for c in CATEGORICAL if c not in levels}
        if not numeric and not levels:
            raise ModelError("the runs differ in no setting: there is nothing to model")
        ranges = {n: (float(numbers[n].min()), float(numbers[n].max())) for n in numeric}
        raw = cls(numeric, levels, ranges, fixed, np.zeros(0), np.ones(0)).raw_matrix(table)
        center, scale = raw.mean(axis=0), raw.std(axis=0)
        return cls(numeric, levels, ranges, fixed, center, np.where(scale > 0, scale, 1.0))

    @property
    def names(self) -> list[str]:
        return [*self.numeric, *(f"{c}={v}" for c, vs in self.levels.items() for v in vs)]

    def raw_matrix(self, frame: pd.DataFrame) -> np.ndarray:
        numbers, words = numeric_inputs(frame), categorical_inputs(frame)
        columns = [TRANSFORM.get(n, lambda x: x)(numbers[n].to_numpy()) for n in self.numeric]
        for c, values in self.levels.items():
            columns += [(words[c] == v).to_numpy(dtype=float) for v in values]
        return np.column_stack(columns)

    def matrix(self, frame: pd.DataFrame) -> np.ndarray:
        return (self.raw_matrix(frame) - self.center) / self.scale

    def outside(self, frame: pd.DataFrame) -> list[str]:
        """Why rows lie outside what the model saw (empty: inside)."""
        numbers, words = numeric_inputs(frame), categorical_inputs(frame)
        problems = []
        for name, (lo, hi) in self.ranges.items():
            bad = numbers[name][(numbers[name] < lo - 1e-9) | (numbers[name] > hi + 1e-9)]
            if not bad.empty:
                problems.append(f"{name} {bad.iloc[0]:g} is outside the runs' {lo:g}–{hi:g}")
        for name, value in self.fixed.items():
            seen = numbers[name] if name in NUMERIC else words[name]
            if (seen != value).any():
                problems.append(f"{name} was {value!r} in every run, not {seen.iloc[0]!r}")
        for name, values in self.levels.items():
            unseen = sorted(set(words[name]) - set(values))
            if unseen:
                problems.append(f"{name} {unseen[0]!r} is not among the runs' {values}")
        return problems
