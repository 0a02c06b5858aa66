"""The progress line's latency so far: each percentile within one bucket (2 %) above the
nearest-rank value of the same latencies, the greatest exact."""

import math

import numpy as np
from hvbench_load.live import WIDTH, LiveLatency


def nearest_rank(values: np.ndarray, q: float) -> float:
    ordered = np.sort(values)
    return float(ordered[max(1, math.ceil(q / 100 * len(ordered))) - 1])


def test_percentiles_lie_within_a_bucket_above_the_true_ones():
    latencies = np.random.default_rng(3).lognormal(np.log(4e6), 0.8, 20_000).astype(np.int64)
    live = LiveLatency()
    for ns in latencies:
        live.add(int(ns))
    for q in (50, 99, 99.9):
        true = nearest_rank(latencies, q)
        assert true <= live.percentile_ns(q) <= true * WIDTH, q
    assert live.max_ns == latencies.max()
    assert live.percentile_ns(100) == latencies.max()


def test_the_text_is_empty_before_the_first_result_and_in_ms_after():
    live = LiveLatency()
    assert live.text() == "" and live.percentile_ns(50) is None
    for ns in (1_000_000, 2_000_000, 0, -5):  # clocks apart: counted in the first bucket
        live.add(ns)
    assert live.count == 4
    assert live.text().startswith(" latency p50 ") and live.text().endswith(" max 2.00 ms")
