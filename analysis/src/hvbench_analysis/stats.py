"""Latency statistics from raw samples: exact percentiles and maxima, no histogram buckets.

Percentiles are nearest-rank: pXX is the smallest sample with at least XX % of the samples at or
below it, so every reported value is a latency that really occurred (numpy's "inverted_cdf").
"""

from __future__ import annotations

import numpy as np

PERCENTILES = (50.0, 90.0, 99.0, 99.9, 99.99)
# Order and names of the percentile table's columns (all latencies in ms).
SUMMARY_COLUMNS = (
    "count",
    "min_ms",
    "p50_ms",
    "p90_ms",
    "p99_ms",
    "p99.9_ms",
    "p99.99_ms",
    "max_ms",
    "mean_ms",
    "sd_ms",
)


def nearest_rank(p, n):
    """The 0-based index of the nearest-rank p-th percentile among n sorted values (k-th
    smallest, k = ⌈p/100 · n⌉, at least 1); p or n may be arrays."""
    # the small tolerance keeps 99.9 % of 1000 at rank 999 despite 0.999 · 1000 = 999.0000000001
    return np.clip(np.ceil(np.asarray(p, float) / 100 * n - 1e-9).astype(int), 1, n) - 1


def percentile(values: np.ndarray, p: float | list[float]) -> np.ndarray | float:
    """Nearest-rank percentile(s) of raw samples: the k-th smallest, k = ⌈p/100 · n⌉."""
    values = np.asarray(values)
    n = len(values)
    ranks = nearest_rank(np.atleast_1d(np.asarray(p, dtype=float)), n)
    picked = np.partition(values, np.unique(ranks))[ranks]
    return picked if np.ndim(p) else picked[0]


def sorted_percentile(ordered: np.ndarray, p: float) -> float:
    """percentile() of samples already sorted: the same value, found without a pass over them
    (sections that need several percentiles of a million samples sort them once)."""
    return ordered[nearest_rank(p, len(ordered))]


def counted_quantiles(values: np.ndarray, times: np.ndarray, q: list[float]) -> np.ndarray:
    """np.quantile(np.repeat(values, times, axis=0), q, axis=0) with numpy's default (linear,
    Hyndman and Fan's 7th) method, the same numbers to the bit, without the repeated array:
    `values` holds each distinct row once and `times` how often it came. A bootstrap of a few
    runs draws few distinct resamples (of two runs, three among 10,000); sorting those rather
    than all 10,000 means took most of a campaign report's bootstrap time."""
    values = np.asarray(values, dtype=float)
    times = np.asarray(times, dtype=np.int64)
    total = int(times.sum())
    order = np.argsort(values, axis=0, kind="stable")
    ordered = np.take_along_axis(values, order, axis=0)
    reached = np.cumsum(times[order], axis=0)  # how many repeated values are ≤ each row
    columns = np.arange(values.shape[1])

    def ranked(rank: float) -> np.ndarray:  # each column's rank-th smallest, from 0; -1: last
        return ordered[(reached <= int(rank) % total).sum(axis=0), columns]

    found = []
    for level in np.asarray(q, dtype=float):
        virtual = (total - 1) * level  # as numpy: between ranks below and below + 1
        below = float(np.floor(virtual))
        above = below + 1
        if virtual >= total - 1:  # as numpy: the last value on both sides; before 0, the first
            below = above = -1.0
        elif virtual < 0:
            below = above = 0.0
        a, b, gamma = ranked(below), ranked(above), virtual - below
        diff = b - a
        found.append(b - diff * (1 - gamma) if gamma >= 0.5 else a + diff * gamma)
    return np.array(found)


def summarize(values_ns: np.ndarray, deadline_ms: float | None = None) -> dict[str, float]:
    """count, min, p50 … p99.99, max, mean, SD in ms; with a deadline, the % of samples over it."""
    values = np.asarray(values_ns, dtype=np.float64)
    out: dict[str, float] = {"count": len(values)}
    if len(values) == 0:
        out.update({c: float("nan") for c in SUMMARY_COLUMNS[1:]})
    else:
        ms = values / 1e6
        out["min_ms"] = float(ms.min())
        for p, v in zip(PERCENTILES, percentile(ms, list(PERCENTILES)), strict=True):
            out[f"p{p:g}_ms"] = float(v)
        out["max_ms"] = float(ms.max())
        out["mean_ms"] = float(ms.mean())
        out["sd_ms"] = float(ms.std(ddof=1)) if len(ms) > 1 else 0.0
    if deadline_ms is not None:
        out["over_deadline_pct"] = over_deadline_pct(values, deadline_ms)
    return out


def over_deadline_pct(values_ns: np.ndarray, deadline_ms: float) -> float:
    """Share of samples later than the deadline, in % (the "% failure" of a deadline study)."""
    values = np.asarray(values_ns)
    if len(values) == 0:
        return float("nan")
    return float(100.0 * np.count_nonzero(values > deadline_ms * 1e6) / len(values))


def ecdf_points(values: np.ndarray, body: int = 2_000, tail: int = 1_000) -> tuple:
    """(x, F) of the ECDF, thinned for plotting: all points for small samples; otherwise
    evenly in F for the body plus evenly in log(1 − F) for the tail, always with the minimum and
    the exact maximum. A plot of a million samples stays small and keeps the tail visible."""
    x = np.sort(np.asarray(values, dtype=np.float64))
    n = len(x)
    if n == 0:
        return x, x
    f = np.arange(1, n + 1) / n
    if n <= body + tail:
        return x, f
    rank_body = np.linspace(0, n - 1, body)
    rank_tail = n - np.logspace(np.log10(n * 0.01), 0, tail)  # top 1 % down to the last one
    ranks = np.unique(np.concatenate([rank_body, rank_tail, [0, n - 1]]).round().astype(int))
    return x[ranks], f[ranks]


def exceedance_points(values: np.ndarray, body: int = 2_000, tail: int = 1_000) -> tuple:
    """(x, S) of the exceedance curve, thinned as ecdf_points: S is the fraction of samples at
    x or above, 1 − F + 1/n, so that it ends at the maximum with 1/n (a log axis has no 0)."""
    x, f = ecdf_points(values, body, tail)
    n = len(np.asarray(values))
    if n == 0:
        return x, f
    ranks = np.rint(f * n)  # f = rank / n; the rank gives S exactly
    return x, (n + 1 - ranks) / n


def tail_levels(n: int, body: int = 200, tail: int = 200) -> np.ndarray:
    """Probability levels F at which to compare quantiles of samples of at least n values,
    like ecdf_points: evenly in F for the body, evenly in log(1 − F) over the top 1 % down to
    1 − 1/n, and F = 1 (the maximum)."""
    in_body = np.linspace(min(1 / n, 0.99), 0.99, body)
    in_tail = 1 - np.logspace(-2, np.log10(1 / n), tail) if n > 100 else []
    return np.unique(np.concatenate([in_body, in_tail, [1.0]]))
