"""Shared helpers for the benchmark scripts: timing summaries and the results file."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

OUT = Path(__file__).resolve().parent / "out"


def time_calls(call: Callable[[], object], repeats: int, warmup: int) -> np.ndarray:
    """Wall time of each call in microseconds, after `warmup` untimed calls."""
    for _ in range(warmup):
        call()
    times = np.empty(repeats)
    for i in range(repeats):
        start = time.perf_counter_ns()
        call()
        times[i] = (time.perf_counter_ns() - start) / 1e3
    return times


def summary(times_us: np.ndarray) -> dict[str, float]:
    return {
        "calls": len(times_us),
        "p50_us": round(float(np.percentile(times_us, 50)), 1),
        "p99_us": round(float(np.percentile(times_us, 99)), 1),
        "mean_us": round(float(times_us.mean()), 1),
    }


def report(name: str, rows: dict[str, dict], goals: list[tuple[str, bool]], extra: dict) -> None:
    width = max(len(k) for k in rows)
    print(f"\n{name}")
    print(f"  {'':{width}}  {'calls':>7}  {'p50 µs':>10}  {'p99 µs':>10}")
    for label, s in rows.items():
        print(f"  {label:{width}}  {s['calls']:>7}  {s['p50_us']:>10.3f}  {s['p99_us']:>10.3f}")
    for key, value in extra.items():
        print(f"  {key}: {value}")
    for goal, met in goals:
        print(f"  goal {goal}: {'met' if met else 'MISSED'}")
    OUT.mkdir(exist_ok=True)
    (OUT / f"{name}.json").write_text(
        json.dumps({"rows": rows, "goals": dict(goals), **extra}, indent=1) + "\n"
    )
