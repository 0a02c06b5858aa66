"""HdrHistogram interval logs (the format of HdrHistogram's HistogramLogWriter), one per run, for
standard tools such as HistogramLogProcessor and HdrHistogram plotters.

Values are latencies in ns (3 significant digits, up to one hour); the interval max column is
in ms (unit ratio 1e6, the tools' default). Intervals follow the scheduled send time. The log is
an interchange format: exact maxima and percentiles come from the raw samples, not from it.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import numpy as np
from hdrh.histogram import HdrHistogram

LOWEST_NS, HIGHEST_NS, DIGITS = 1, 3_600_000_000_000, 3
# 3 significant digits: 2048 sub-buckets, so a value keeps its top 11 bits
SUB_BUCKET_BITS = 11


def quantize(values_ns: np.ndarray) -> np.ndarray:
    """Each value rounded down to the lowest value of its histogram bucket, so that recording
    every distinct quantized value once with its count equals recording every sample."""
    v = np.asarray(values_ns, dtype=np.int64)
    shift = np.maximum(
        np.floor(np.log2(np.maximum(v, 1))).astype(np.int64) - SUB_BUCKET_BITS + 1, 0
    )
    return (v >> shift) << shift


def histogram(values_ns: np.ndarray) -> HdrHistogram:
    """The histogram of the values, as recording each one with record_value would make it,
    its counts added as one array (recording a million values one by one takes seconds)."""
    h = HdrHistogram(LOWEST_NS, HIGHEST_NS, DIGITS)
    values, counts = np.unique(
        quantize(np.clip(values_ns, LOWEST_NS, HIGHEST_NS)), return_counts=True
    )
    if len(values):
        np.ctypeslib.as_array(h.counts)[counts_index(h, values)] += counts.astype(np.uint64)
        h.total_count += int(counts.sum())
        h.min_value = min(h.min_value, int(values[0]))
        h.max_value = max(h.max_value, int(values[-1]))
    return h


def counts_index(h: HdrHistogram, values: np.ndarray) -> np.ndarray:
    """The index in h's counts of each value: the library's _counts_index_for, over an array."""
    v = np.asarray(values, np.int64)
    # the bit length of v | mask (64 - clz), exact: every value is below 2**53
    bits = np.frexp((v | h.sub_bucket_mask).astype(np.float64))[1].astype(np.int64)
    bucket = bits - h.unit_magnitude - (h.sub_bucket_half_count_magnitude + 1)
    sub_bucket = v >> (bucket + h.unit_magnitude)
    return (
        ((bucket + 1) << h.sub_bucket_half_count_magnitude) + sub_bucket - h.sub_bucket_half_count
    )


def write_log(
    path: Path,
    time_s: np.ndarray,
    latency_ns: np.ndarray,
    start_epoch_s: float,
    interval_s: float = 10.0,
) -> int:
    """An interval log of one run (log format 1.2, times relative to the run's start, which is
    the base time); returns the number of intervals written. The header is written here: the
    library's start-time writer does not work."""
    t = np.asarray(time_s, float)
    v = np.asarray(latency_ns, np.int64)
    path.parent.mkdir(parents=True, exist_ok=True)
    started = datetime.fromtimestamp(start_epoch_s, UTC).isoformat()
    lines = [
        "#hvbench end-to-end latency in ns; intervals by scheduled send time",
        "#[Histogram log format version 1.2]",
        f"#[StartTime: {start_epoch_s:.3f} (seconds since epoch), {started}]",
        f"#[BaseTime: {start_epoch_s:.3f} (seconds since epoch)]",
        '"StartTimestamp","Interval_Length","Interval_Max","Interval_Compressed_Histogram"',
    ]
    written = 0
    if len(t):
        first = np.floor(t.min() / interval_s) * interval_s
        index = ((t - first) // interval_s).astype(int)
        order = np.argsort(index, kind="stable")  # each interval's samples, in one pass
        for chunk in np.split(order, np.flatnonzero(np.diff(index[order])) + 1):
            i = index[chunk[0]]
            h = histogram(v[chunk])
            begin = first + i * interval_s
            top_ms = h.get_max_value() / 1e6
            lines.append(f"{begin:.3f},{interval_s:.3f},{top_ms:.3f},{h.encode().decode()}")
            written += 1
    path.write_text("\n".join(lines) + "\n")
    return written
