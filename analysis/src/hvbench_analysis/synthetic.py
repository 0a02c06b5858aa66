"""Synthetic run directories with known latencies, written through the results contract
(results.py): for the analysis tests and benchmarks (no broker needed)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from hvbench_analysis import results

DETECTORS = ("athens", "el_segundo", "wilmington", "long_beach", "carson", "torrance")


def write_run(
    directory: Path,
    latency_ns: np.ndarray,
    *,
    target: str = "bare",
    sched: str = "none",
    budget: int | None = None,
    period: int | None = None,
    cap: int | None = None,
    rep: int | None = None,
    campaign: str | None = None,
    warmup: int = 0,
    missing: int = 0,
    producer_period_ms: float = 100.0,
    send_period_ns: int | None = None,
    intended_lag_ns: np.ndarray | None = None,
    started_at: str = "2026-01-01T00:00:00+00:00",
    requested: dict | None = None,
    state: str = "completed",
    reason: str | None = None,
    faults: list[dict] = (),
    counts: dict | None = None,
) -> Path:
    """A run whose measured latencies are exactly `latency_ns` (in order), preceded by `warmup`
    warm-up records of 1 s latency, plus `missing` records that never came back. Each of the six
    producers sends every `producer_period_ms`, so records are that period / 6 apart unless
    `send_period_ns` says otherwise. `requested` adds to (or overrides) what meta.json says was
    asked, e.g. {"warmup_s": 2}; `state` and `reason` are its status (a run that did not
    complete stopped while sending); `counts` adds to or overrides the counts, e.g.
    {"contradictions": 1, "accounted": False}."""
    latency = np.asarray(latency_ns, dtype=np.int64)
    if send_period_ns is None:
        send_period_ns = round(producer_period_ms * 1e6 / len(DETECTORS))
    samples = _samples(latency, warmup, missing, send_period_ns, intended_lag_ns)
    asked = {
        "target": target,
        "sched": sched,
        "budget_us": budget,
        "period_us": period,
        "cap": cap,
        "rep": rep,
        "campaign": campaign,
        "records": len(samples),
        "producer_period_ms": producer_period_ms,
        "producers": len(DETECTORS),
        **(requested or {}),
    }
    meta = {
        "run_id": directory.name,
        "requested": asked,
        "status": _status(state, reason),
        "faults": list(faults),
        "started_at": started_at,
        "sched": {"applied": sched, "readback": {"budget_us": budget, "period_us": period}},
        "clock": {"tsc": {"hz": 2.6e9, "source": "synthetic", "clocksource": "tsc"}},
        "counts": {**_counts(len(samples), missing), **(counts or {})},
        "warmup_excluded_s": warmup * send_period_ns / 1e9,
    }
    return results.write_run(directory, meta, samples, float_format="%.0f")


def _samples(
    latency: np.ndarray,
    warmup: int,
    missing: int,
    send_period_ns: int,
    intended_lag_ns: np.ndarray | None,
) -> pd.DataFrame:
    """Warm-up records (1 s each), then `latency`, then `missing` records never received."""
    n = warmup + len(latency) + missing
    seq = np.arange(n)
    intended = 1_000_000_000_000 + seq * send_period_ns
    lag = np.zeros(n, np.int64)
    if intended_lag_ns is not None:
        lag[warmup : warmup + len(latency)] = intended_lag_ns
    sent = intended + lag
    lat = np.concatenate([np.full(warmup, 1_000_000_000), latency, np.zeros(missing)])
    received = (sent + lat).astype(np.float64)
    copies = np.ones(n, np.int32)
    if missing:
        received[-missing:] = np.nan
        copies[-missing:] = 0
    return pd.DataFrame(
        {
            "detector": [DETECTORS[i % 6] for i in range(n)],
            "seq": seq // 6,
            "intended_ns": intended,
            "sent_ns": sent,
            "delivered": 1,
            "received_ns": received,
            "copies": copies,
            "latency_ns": np.where(copies > 0, lat, np.nan),
            "latency_from_intended_ns": np.where(copies > 0, received - intended, np.nan),
            "warmup": seq < warmup,
            "dead_lettered": False,
        }
    )


def _status(state: str, reason: str | None) -> dict:
    phase = None if state == "completed" else "sending"
    return {"state": state, "reason": reason, "phase": phase}


def _counts(sent: int, missing: int) -> dict:
    return {
        "sent": sent,
        "received": sent - missing,
        "missing": missing,
        "duplicated": 0,
        "dead_lettered": 0,
        **dict.fromkeys(results.COUNT_KEYS_3, 0),
        "accounted": missing == 0,
    }
