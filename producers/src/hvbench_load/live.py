"""The latency so far, for the progress a run prints while it sends: p50, p99 and the greatest,
warm-up included. Counted at each receipt into buckets 2 % wide (one log and one add per
result, so that the receive loop is not slowed); a percentile is its bucket's upper edge,
within 2 % above the true value. The run's statistics come from its samples, never from here.
"""

from __future__ import annotations

import math
from collections import Counter

WIDTH = 1.02  # each bucket's upper edge over its lower one
LOG_WIDTH = math.log(WIDTH)


class LiveLatency:
    def __init__(self) -> None:
        self.buckets: Counter[int] = Counter()
        self.count = 0
        self.max_ns = 0

    def add(self, latency_ns: int) -> None:
        """One result's latency; one that is not positive (clocks apart) counts in the first."""
        self.buckets[int(math.log(latency_ns) / LOG_WIDTH) if latency_ns > 1 else 0] += 1
        self.count += 1
        self.max_ns = max(self.max_ns, latency_ns)

    def percentile_ns(self, q: float) -> float | None:
        """The upper edge of the bucket that holds the q-th percentile (nearest rank)."""
        if not self.count:
            return None
        rank, seen = max(1, math.ceil(q / 100 * self.count)), 0
        for bucket in sorted(self.buckets):
            seen += self.buckets[bucket]
            if seen >= rank:
                return min(WIDTH ** (bucket + 1), self.max_ns)
        return float(self.max_ns)

    def text(self) -> str:
        """`latency p50 X p99 Y max Z ms`, or nothing before the first result."""
        if not self.count:
            return ""
        p50, p99 = self.percentile_ns(50), self.percentile_ns(99)
        return f" latency p50 {p50 / 1e6:.2f} p99 {p99 / 1e6:.2f} max {self.max_ns / 1e6:.2f} ms"
