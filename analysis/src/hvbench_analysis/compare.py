"""Repetitions and comparisons: confidence intervals over runs, differences against a reference.

The unit of replication is the run: samples within a run are not independent (a stall delays
many records in a row), runs of one configuration are. So a configuration with repetitions is
described per statistic by the mean over its runs of that run's statistic, with a 95 % bootstrap
interval over the runs. With few runs the plain percentile bootstrap is too narrow; this uses
Hesterberg's expanded percentile interval (the tail probability widened by √(n/(n−1)) and
Student's t), which keeps close to nominal coverage from five runs up.

Against a reference configuration: the difference of those means, with a bootstrap interval
that resamples the runs of both sides, and the two-sample Kolmogorov–Smirnov test on the pooled
samples of each side (its p-value treats samples as independent, so it overstates significance;
the KS distance D is the effect size worth reading).
"""

from __future__ import annotations

import functools

import numpy as np
import pandas as pd

from hvbench_analysis.load import by_run
from hvbench_analysis.stats import counted_quantiles, percentile, summarize, tail_levels
from hvbench_analysis.tags import CONFIG

# Statistics compared across configurations (per run, then over runs).
COMPARED = ("p50_ms", "p90_ms", "p99_ms", "p99.9_ms", "max_ms", "mean_ms")
RESAMPLES = 10_000
FEW_RUNS = 6  # at most 462 distinct resamples of 10,000: counting them is faster
LEVEL = 0.95


def per_run(measured: pd.DataFrame, deadline_ms: float | None = None) -> pd.DataFrame:
    """One row per run: its configuration tags and summary statistics."""
    rows = []
    for run_id, tags, latency_ns in by_run(measured):
        row = {tag: tags[tag] for tag in (*CONFIG, "rep")}
        row["run_id"] = run_id
        row.update(summarize(latency_ns, deadline_ms))
        rows.append(row)
    return pd.DataFrame(rows)


def scipy_stats():
    """scipy.stats, imported when first needed: it takes half a second, and only a report
    with a reference uses it (the KS test)."""
    from scipy import stats

    return stats


@functools.cache  # a report asks it for the same few n hundreds of times
def expanded_alpha(n: int, level: float = LEVEL) -> float:
    """Tail probability to use on each side of a bootstrap distribution of a mean of n values:
    Φ(−√(n/(n−1)) · t), t Student's quantile. From scipy.special, the functions scipy.stats's
    t.ppf and norm.cdf call (the same values), in a fifth of the import time."""
    from scipy import special

    t = special.stdtrit(n - 1, 1 - (1 - level) / 2)
    return float(special.ndtr(-np.sqrt(n / (n - 1)) * t))


def bootstrap_mean_ci(
    values: np.ndarray, rng: np.random.Generator, level: float = LEVEL
) -> tuple[float, float]:
    """95 % interval for the mean of per-run values (n ≥ 2), expanded percentile bootstrap."""
    low, high = bootstrap_mean_cis(np.asarray(values, dtype=float)[:, None], rng, level)
    return float(low[0]), float(high[0])


def bootstrap_mean_cis(
    values: np.ndarray, rng: np.random.Generator, level: float = LEVEL
) -> tuple[np.ndarray, np.ndarray]:
    """Intervals as bootstrap_mean_ci for many statistics at once: `values` holds one row per
    run and one column per statistic. The same resamples of runs serve every column, so the
    intervals of neighbouring statistics (e.g. quantiles) are consistent with each other."""
    values = np.asarray(values, dtype=float)
    n, columns = values.shape
    if n < 2:
        return np.full(columns, np.nan), np.full(columns, np.nan)
    picks = rng.integers(0, n, size=(RESAMPLES, n))
    # how often each resample holds each run: the means are then one matrix product
    slots = picks + n * np.arange(RESAMPLES)[:, None]
    counts = np.bincount(slots.ravel(), minlength=RESAMPLES * n).reshape(RESAMPLES, n)
    means = counts @ values / n
    alpha = expanded_alpha(n, level)
    if n > FEW_RUNS:
        low, high = np.quantile(means, [alpha, 1 - alpha], axis=0)
        return low, high
    # few runs draw few distinct resamples (of two runs, three): the quantiles of each column
    # come from each distinct one's mean and how often it was drawn, not from sorting 10,000
    drawn = counts @ (n + 1) ** np.arange(n)  # which resample each is: its counts as digits
    _, first, times = np.unique(drawn, return_index=True, return_counts=True)
    low, high = counted_quantiles(means[first], times, [alpha, 1 - alpha])
    return low, high


def bootstrap_difference_ci(
    values: np.ndarray, reference: np.ndarray, rng: np.random.Generator, level: float = LEVEL
) -> tuple[float, float]:
    """Interval for mean(values) − mean(reference), resampling the runs of each side."""
    a, b = np.asarray(values, float), np.asarray(reference, float)
    if len(a) < 2 or len(b) < 2:
        return float("nan"), float("nan")
    diffs = a[rng.integers(0, len(a), size=(RESAMPLES, len(a)))].mean(axis=1) - b[
        rng.integers(0, len(b), size=(RESAMPLES, len(b)))
    ].mean(axis=1)
    alpha = expanded_alpha(min(len(a), len(b)), level)
    low, high = np.quantile(diffs, [alpha, 1 - alpha])
    return float(low), float(high)


def ecdf_band(
    runs_values: list[np.ndarray], rng: np.random.Generator, level: float = LEVEL
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(F, mean, low, high): at each probability level F, the mean over runs of each run's
    nearest-rank quantile x_r(F), with its bootstrap interval over runs (as bootstrap_mean_ci).
    The levels are dense in the tail and stop at F = 1, each run's maximum. Every run needs at
    least one sample."""
    levels = tail_levels(min(len(v) for v in runs_values))
    quantiles = np.array([percentile(np.asarray(v), levels * 100) for v in runs_values], float)
    low, high = bootstrap_mean_cis(quantiles, rng, level)
    return levels, quantiles.mean(axis=0), low, high


def ks_test(a_ns: np.ndarray, b_ns: np.ndarray) -> tuple[float, float]:
    """(D, p) of the two-sample Kolmogorov–Smirnov test."""
    sps = scipy_stats()
    result = sps.ks_2samp(a_ns, b_ns, method="asymp")
    return float(result.statistic), float(result.pvalue)


def repetitions(runs: pd.DataFrame, seed: int = 0) -> pd.DataFrame:
    """Per configuration with ≥ 2 runs: mean over runs of each statistic, with its interval."""
    rng = np.random.default_rng(seed)
    rows = []
    for key, group in runs.groupby(list(CONFIG), dropna=False, sort=True):
        if len(group) < 2:
            continue
        row = dict(zip(CONFIG, key, strict=True))
        row["runs"] = len(group)
        for stat in COMPARED:
            values = group[stat].to_numpy(float)
            low, high = bootstrap_mean_ci(values, rng)
            row[stat] = float(values.mean())
            row[f"{stat}_ci_low"], row[f"{stat}_ci_high"] = low, high
        rows.append(row)
    return pd.DataFrame(rows)


def against_reference(
    measured: pd.DataFrame, runs: pd.DataFrame, reference: dict, seed: int = 0
) -> pd.DataFrame:
    """Each other configuration against the reference: differences with intervals, KS test."""
    rng = np.random.default_rng(seed)
    is_ref = reference_runs(runs, reference)
    ref_runs = runs[is_ref]
    ref_samples = measured[measured["run_id"].isin(ref_runs["run_id"])]["latency_ns"].to_numpy()
    rows = []
    for key, group in runs[~is_ref].groupby(list(CONFIG), dropna=False, sort=True):
        row = dict(zip(CONFIG, key, strict=True))
        row["runs"], row["reference_runs"] = len(group), len(ref_runs)
        samples = measured[measured["run_id"].isin(group["run_id"])]["latency_ns"].to_numpy()
        row["ks_d"], row["ks_p"] = ks_test(samples, ref_samples)
        for stat in COMPARED:
            a, b = group[stat].to_numpy(float), ref_runs[stat].to_numpy(float)
            row[f"{stat}_diff"] = float(a.mean() - b.mean())
            low, high = bootstrap_difference_ci(a, b, rng)
            row[f"{stat}_diff_ci_low"], row[f"{stat}_diff_ci_high"] = low, high
        rows.append(row)
    return pd.DataFrame(rows)


def reference_runs(runs: pd.DataFrame, reference: dict) -> pd.Series:
    """The runs the reference selects; ValueError when it selects none (or names an unknown
    tag)."""
    is_ref = matches(runs, reference)
    if not is_ref.any():
        raise ValueError(f"no run matches the reference {reference}")
    return is_ref


def matches(runs: pd.DataFrame, selector: dict) -> pd.Series:
    """Runs whose tags equal every value in the selector (values compared as text)."""
    hit = pd.Series(True, index=runs.index)
    for tag, value in selector.items():
        if tag not in runs.columns:
            raise ValueError(f"unknown tag {tag!r}; tags: {', '.join(runs.columns)}")
        column = runs[tag].map(_as_text)
        hit &= column == _as_text(value)
    return hit


def _as_text(value) -> str:
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return ""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def parse_selector(text: str) -> dict:
    """`sched=rtds,budget=77500` → {"sched": "rtds", "budget": "77500"}; a bare word is a run
    id."""
    if "=" not in text:
        return {"run_id": text} if text else {}
    out = {}
    for part in text.split(","):
        tag, _, value = part.partition("=")
        out[tag.strip()] = value.strip()
    return out
