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
    h = HdrHistogram(LOWEST_NS, HIGHEST_NS, DIGITS)
    values, counts = np.unique(
        quantize(np.clip(values_ns, LOWEST_NS, HIGHEST_NS)), return_counts=True
    )
    for value, count in zip(values.tolist(), counts.tolist(), strict=True):
        h.record_value(value, count)
    return h


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
        for i in np.unique(index):
            h = histogram(v[index == i])
            begin = first + i * interval_s
            top_ms = h.get_max_value() / 1e6
            lines.append(f"{begin:.3f},{interval_s:.3f},{top_ms:.3f},{h.encode().decode()}")
            written += 1
    path.write_text("\n".join(lines) + "\n")
    return written
