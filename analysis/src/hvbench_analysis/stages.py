"""Where a record's time went: the input leg (producer → broker → job), the job's own work
(parse, forecast, route) and the output leg (job → broker → consumer).

Four stamps per record (docs/results.md, "Stage legs"):
    t1 sent_ns, t4 received_ns   on the messaging machine's clock (the run's calibration)
    t2 job_in_ns, t3 job_out_ns  on the job's machine's clock
The job's work is t3 − t2 and needs no second clock. The legs cross machines: with θ the
offset of the job's clock from the messaging machine's, input = t2 − t1 − θ and
output = t4 − t3 + θ (they add up to the latency t4 − t1 whatever θ is).

`clock_relation()` says what θ is known to be, and meta.json records it (`clock.job`):
- "one calibration": the job adopted the run's calibration (bare, or a testbed whose job runs on
  the messaging machine): θ = 0 exactly.
- "causal bounds": the job stamped on its own clock. Every record bounds θ, NTP-style: it
  reached the job after it was sent (θ ≤ t2 − t1) and left the job before it came back
  (θ ≥ t3 − t4). Over the first and the last WINDOW records these intervals intersect into
  [low, high]; θ is taken as its middle, at most half its width off, and interpolated in
  between for drift. An empty intersection (the stamps contradict each other) leaves θ unknown.
- unknown (older runs, no job stamps): the legs are not computed. Stamps of two clocks are
  never subtracted with an unknown offset.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from hvbench_analysis.stats import percentile, sorted_percentile

WINDOW = 200  # records at each end of the run that bound the clock offset
STAMPS = ("sent_ns", "job_in_ns", "job_out_ns", "received_ns")
LEGS = ("input_leg_ns", "job_ns", "output_leg_ns")
LEG_NAMES = {"input_leg_ns": "input leg", "job_ns": "job", "output_leg_ns": "output leg"}
SAME_CLOCK = "one calibration"
CAUSAL = "causal bounds"


def stamped(samples: pd.DataFrame) -> pd.DataFrame:
    """The received records that carry all four stamps, in send order."""
    if not set(STAMPS) <= set(samples.columns):
        return samples.iloc[0:0]
    rows = samples.dropna(subset=list(STAMPS))
    return rows.sort_values("sent_ns", kind="stable")


def offset_bounds(rows: pd.DataFrame) -> dict | None:
    """[low, high] for θ from these records' causality, or None if they contradict."""
    t1, t2, t3, t4 = (rows[c].to_numpy(np.float64) for c in STAMPS)
    low, high = float(np.max(t3 - t4)), float(np.min(t2 - t1))
    if low > high:
        return None
    return {
        "at_ns": float(np.median(t1)),
        "low_ns": low,
        "high_ns": high,
        "offset_ns": (low + high) / 2,
        "bound_ns": (high - low) / 2,
        "records": len(rows),
    }


def clock_relation(samples: pd.DataFrame, shared: bool, window: int = WINDOW) -> dict:
    """What is known of the job's clock against the messaging machine's (see the module's
    doc): meta.json's `clock.job`."""
    if shared:
        return {"method": SAME_CLOCK, "known": True, "offset_ns": 0, "bound_ns": 0}
    rows = stamped(samples)
    method = f"{CAUSAL} over the first and last {window} records (NTP-style)"
    if len(rows) == 0:
        return {"method": method, "known": False, "reason": "no records with the job's stamps"}
    start, end = offset_bounds(rows.head(window)), offset_bounds(rows.tail(window))
    if start is None or end is None:
        reason = "the stamps contradict each other: no offset satisfies every record"
        return {"method": method, "known": False, "reason": reason}
    bound = max(start["bound_ns"], end["bound_ns"])
    return {"method": method, "known": True, "start": start, "end": end, "bound_ns": bound}


def offset_at(relation: dict, sent_ns: np.ndarray) -> np.ndarray:
    """θ at each send time: 0, or interpolated between the run's start and end estimates."""
    if relation.get("method") == SAME_CLOCK:
        return np.zeros(len(sent_ns))
    start, end = relation["start"], relation["end"]
    if end["at_ns"] <= start["at_ns"]:
        return np.full(len(sent_ns), (start["offset_ns"] + end["offset_ns"]) / 2)
    return np.interp(
        sent_ns, [start["at_ns"], end["at_ns"]], [start["offset_ns"], end["offset_ns"]]
    )


def legs(samples: pd.DataFrame, relation: dict | None) -> pd.DataFrame:
    """input_leg_ns, job_ns, output_leg_ns per sample (same index); NaN where a stamp is
    missing, and the two legs NaN throughout when the clock offset is not known."""
    columns = {c: samples[c].to_numpy() for c in STAMPS if c in samples.columns}
    return pd.DataFrame(leg_arrays(columns, len(samples), relation), index=samples.index)


def leg_arrays(stamps: dict[str, np.ndarray], n: int, relation: dict | None) -> dict:
    """legs() of n records from their stamps' columns: each leg an array of n (ns)."""
    out = {leg: np.full(n, np.nan) for leg in LEGS}
    if not set(STAMPS) <= set(stamps):
        return out
    t1, t2, t3, t4 = (np.asarray(stamps[c], np.float64) for c in STAMPS)
    out["job_ns"] = t3 - t2
    if relation and relation.get("known"):
        theta = offset_at(relation, t1)
        out["input_leg_ns"] = t2 - t1 - theta
        out["output_leg_ns"] = t4 - t3 + theta
    return out


def tail_threshold_ns(latency_ns: np.ndarray, deadline_ms: float | None) -> float:
    """Records slower than this are the tail: the deadline, or else the p99.9."""
    if deadline_ms is not None:
        return deadline_ms * 1e6
    return float(percentile(latency_ns, 99.9))


def known_legs(group: pd.DataFrame) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Each leg (ns) and the latency (ns, as stored) of the records that have all three legs:
    arrays of the group's columns (a copy only where some record lacks a leg; copying a
    million rows' columns into a table took 0.3 s)."""
    legs = {leg: group[leg].to_numpy(np.float64) for leg in LEGS}
    latency = group["latency_ns"].to_numpy()
    unknown = np.zeros(len(latency), bool)
    for values in (*legs.values(), latency):
        if values.dtype.kind == "f":  # (an integer column has no NaN)
            unknown |= np.isnan(values)
    if not unknown.any():
        return legs, latency
    known = ~unknown
    return {leg: values[known] for leg, values in legs.items()}, latency[known]


def breakdown(group: pd.DataFrame, deadline_ms: float | None = None) -> dict | None:
    """One configuration's legs: p50, p99 and max of each (ms), and for the tail (records at
    or over the threshold) the share of their latency each leg took. None without legs."""
    return legs_breakdown(*known_legs(group), deadline_ms)


def legs_breakdown(
    legs: dict[str, np.ndarray], latency_ns: np.ndarray, deadline_ms: float | None = None
) -> dict | None:
    """breakdown() of known_legs()."""
    if not len(latency_ns):
        return None
    out: dict = {"records": len(latency_ns)}
    for leg, values in legs.items():
        ms = values / 1e6
        name = LEG_NAMES[leg]
        p50, p99 = percentile(ms, [50, 99])
        out[f"{name} p50 (ms)"] = float(p50)
        out[f"{name} p99 (ms)"] = float(p99)
        out[f"{name} max (ms)"] = float(ms.max())
    latency = latency_ns.astype(np.float64)
    threshold = tail_threshold_ns(latency, deadline_ms)
    tail = latency >= threshold
    out["tail from (ms)"] = threshold / 1e6
    out["tail records"] = int(tail.sum())
    total = latency_ns[tail].sum()
    for leg, values in legs.items():
        share = 100 * values[tail].sum() / total if tail.any() else float("nan")
        out[f"tail share {LEG_NAMES[leg]} (%)"] = float(share)
    return out


BANDS = (("≤ p50", 0, 50), ("p50–p99", 50, 99), ("p99–p99.9", 99, 99.9), ("> p99.9", 99.9, 100))


def by_band(group: pd.DataFrame) -> pd.DataFrame:
    """Mean of each leg (ms) over the records in each latency band of the configuration
    (≤ p50, p50–p99, p99–p99.9, over p99.9): each band's legs add up to its mean latency."""
    return legs_by_band(*known_legs(group))


def legs_by_band(legs: dict[str, np.ndarray], latency_ns: np.ndarray) -> pd.DataFrame:
    """by_band() of known_legs()."""
    latency = latency_ns.astype(np.float64)
    ordered = np.sort(latency)  # every band's bounds from one sort
    out = []
    for name, low, high in BANDS:
        above = latency > sorted_percentile(ordered, low) if low > 0 else True
        within = above & (latency <= sorted_percentile(ordered, high))
        if np.any(within):
            # sum / count, as pandas' mean (the same bits as before, in the tables' CSV)
            means = {LEG_NAMES[leg]: mean(values[within]) / 1e6 for leg, values in legs.items()}
            out.append({"band": name, "records": int(within.sum()), **means})
    return pd.DataFrame(out)


def mean(values: np.ndarray) -> float:
    return values.sum() / len(values)
