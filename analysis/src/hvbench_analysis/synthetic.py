"""Synthetic run directories with known latencies, written through the results contract
(results.py): for the analysis tests and benchmarks (no broker needed)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from hvbench_analysis import results, stages
from hvbench_analysis.sections import (
    ABSENT,
    Clock,
    Counts,
    Energy,
    EnergyWindow,
    Requested,
    Sched,
    Status,
)

DETECTORS = ("athens", "el_segundo", "wilmington", "long_beach", "carson", "torrance")
# Each latency splits into input leg, job and output leg in these shares (stages.py).
LEG_SHARES = (0.4, 0.2, 0.4)


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
    job_offset_ns: int | None = 0,
) -> Path:
    """A run whose measured latencies are exactly `latency_ns` (in order), preceded by `warmup`
    warm-up records of 1 s latency, plus `missing` records that never came back. Each of the six
    producers sends every `producer_period_ms`, so records are that period / 6 apart unless
    `send_period_ns` says otherwise. `requested` adds to (or overrides) what meta.json says was
    asked, e.g. {"warmup_s": 2}; `state` and `reason` are its status (a run that did not
    complete stopped while sending); `counts` adds to or overrides the counts, e.g.
    {"contradictions": 1, "accounted": False}. The job's stamps split each latency in
    LEG_SHARES; they are on a clock `job_offset_ns` ahead of the sender's (0: the run's own
    clock; None: no job stamps, as before schema 4)."""
    latency = np.asarray(latency_ns, dtype=np.int64)
    if send_period_ns is None:
        send_period_ns = round(producer_period_ms * 1e6 / len(DETECTORS))
    samples = _samples(latency, warmup, missing, send_period_ns, intended_lag_ns)
    if job_offset_ns is not None:
        samples = _with_job_stamps(samples, job_offset_ns)
    asked = {"target": target, "sched": sched, "budget_us": budget, "period_us": period}
    asked |= {"cap": cap, "rep": rep, "campaign": campaign, "records": len(samples)}
    asked |= {"producer_period_ms": producer_period_ms, "producers": len(DETECTORS)}
    asked |= requested or {}
    meta = {
        "run_id": directory.name,
        "requested": Requested.from_json(asked, "requested", strict=True).to_json(),
        "status": _status(state, reason).to_json(),
        "faults": list(faults),
        "started_at": started_at,
        "sched": Sched(applied=sched, readback=_readback(target, sched, asked)).to_json(),
        "clock": _clock(samples, job_offset_ns).to_json(),
        "counts": Counts(**_counts(len(samples), missing) | (counts or {})).to_json(),
        "warmup_excluded_s": warmup * send_period_ns / 1e9,
    }
    return results.write_run(directory, meta, samples, float_format="%.0f")


def _clock(samples: pd.DataFrame, job_offset_ns: int | None) -> Clock:
    job = ABSENT if job_offset_ns is None else _job_clock(samples, job_offset_ns)
    return Clock(tsc={"hz": 2.6e9, "source": "synthetic", "clocksource": "tsc"}, job=job)


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


def _with_job_stamps(samples: pd.DataFrame, offset_ns: int) -> pd.DataFrame:
    """job_in_ns and job_out_ns splitting each latency in LEG_SHARES, on the job's clock."""
    latency = samples["received_ns"] - samples["sent_ns"]
    job_in = samples["sent_ns"] + LEG_SHARES[0] * latency + offset_ns
    return samples.assign(job_in_ns=job_in, job_out_ns=job_in + LEG_SHARES[1] * latency)


def _job_clock(samples: pd.DataFrame, offset_ns: int) -> dict:
    return stages.clock_relation(samples, shared=offset_ns == 0)


def _readback(target: str, sched: str, asked: dict) -> dict | list:
    """The setting read back as the agent's backends report it (hostagent sched/), for a
    two-vCPU VM or two threads."""
    budget, period = asked.get("budget_us") or 0, asked.get("period_us") or 100_000
    vcpus = (0, 1)
    if target == "xen" and sched == "rtds":
        each = {"budget_us": budget, "period_us": period, "extratime": asked.get("extratime") or 0}
        return {"sched": "rtds", "vcpus": [{"vcpu": i, **each} for i in vcpus]}
    if target == "xen" and sched in ("credit", "credit2"):
        return {"sched": sched, "weight": asked.get("weight") or 256, "cap": asked.get("cap") or 0}
    if target == "kvm" and sched == "cfs":
        return {"vcpus": [{"vcpu": i, "cpu_max": f"{budget} {period}"} for i in vcpus]}
    if sched == "cfs-quota":
        return {"version": 2, "quota_us": budget, "period_us": period}
    if sched == "deadline":
        thread = {"policy": "SCHED_DEADLINE", "runtime_ns": budget * 1000}
        thread["period_ns"] = thread["deadline_ns"] = period * 1000
        if target == "kvm":
            return {"vcpus": [{"vcpu": i, "thread": thread} for i in vcpus]}
        return [{"tid": 100 + i, **thread} for i in vcpus]
    return {"threads": 2, "policies": {"SCHED_OTHER": 2}}


def _status(state: str, reason: str | None) -> Status:
    phase = None if state == "completed" else "sending"
    return Status(state=state, reason=reason, phase=phase)


def _counts(sent: int, missing: int) -> dict:
    """The counts every run has (sections.Counts), of `sent` records `missing` of which never
    came back."""
    return {
        "sent": sent,
        "received": sent - missing,
        "missing": missing,
        "duplicated": 0,
        "dead_lettered": 0,
        **dict.fromkeys(results.COUNT_KEYS_3, 0),
        "accounted": missing == 0,
    }


def add_trace(directory: Path, slow: list[int], wait_ns: int) -> Path:
    """A scheduler trace (TRACE=1) for a run written above: the job's one thread is preempted
    when each record of `slow` (indices into samples.csv) is sent and runs again `wait_ns`
    later; the run's clock is a 1 GHz TSC from 0, so trace counts are the records' ns."""
    samples = pd.read_csv(directory / results.SAMPLES)
    sent = samples["sent_ns"].astype(np.int64)
    lines = []
    for at in sorted(sent.iloc[slow]):
        lines.append(_switch(at, "R", to_job=False))  # preempted, still runnable
        lines.append(_switch(at + wait_ns, "S", to_job=True))  # back on a CPU
    lines.append(_switch(sent.iloc[-1], "S", to_job=False))  # the trace lasts to the end
    return _write_trace(directory, lines)


def add_cpu_trace(directory: Path, cpu_ns: int) -> Path:
    """A scheduler trace (TRACE=1) for a run written above in which the job's one thread runs
    `cpu_ns` from each record's send and then waits for the next (the demand each record
    makes, hvbench_analysis.demand); the clock as in add_trace."""
    samples = pd.read_csv(directory / results.SAMPLES)
    lines = [_switch(0, "S", to_job=False)]
    for at in sorted(samples["sent_ns"].astype(np.int64)):
        lines.append(_switch(at, "S", to_job=True))  # woken by the record: on a CPU
        lines.append(_switch(at + cpu_ns, "S", to_job=False))  # done with it: waits
    last = int(samples["received_ns"].max())
    lines.append(_switch(last + 1, "S", to_job=True))  # the trace lasts past the last one
    return _write_trace(directory, lines)


def _write_trace(directory: Path, lines: list[str]) -> Path:
    """The trace's lines beside the run, and meta.json saying so (a 1 GHz TSC from 0)."""
    meta = results.read_meta(directory)
    meta["clock"]["tsc"].update(base_ticks=0, base_ns=0, hz=1e9)
    (directory / results.SCHED_TRACE).write_text("\n".join(lines) + "\n")
    meta["trace"] = {"clock": "x86-tsc", "threads": {"100": JOB_THREAD}, "lines": len(lines),
                     "dropped": 0}  # fmt: skip
    meta["files"]["sched_trace"] = results.SCHED_TRACE
    results.rewrite_meta(directory, meta)
    return directory


JOB_THREAD = "Source: kafka-i"  # as the kernel names the job's task thread (15 characters)


def _switch(ts: int, state: str, to_job: bool) -> str:
    """A sched_switch line as tracefs prints it, away from or back to the job's thread."""
    job, other = f"comm={JOB_THREAD} ", "comm=java "
    prev, nxt = (other, job) if to_job else (job, other)
    prev_pid, next_pid = (77, 100) if to_job else (100, 77)
    return (
        f" x-1 [000] d..2. {ts}: sched_switch: prev_{prev}prev_pid={prev_pid} prev_prio=120 "
        f"prev_state={state} ==> next_{nxt}next_pid={next_pid} next_prio=120"
    )


def add_baseline(directory: Path, latencies_us: np.ndarray) -> Path:
    """A noise floor (BASELINE=1) for a run written above: these timer wake-up latencies."""
    values = np.asarray(latencies_us, np.int64)
    pd.DataFrame({"latency_us": values}).to_csv(directory / results.BASELINE, index=False)
    meta = results.read_meta(directory)
    p50, p99, p999 = np.percentile(values, [50, 99, 99.9], method="inverted_cdf")
    meta["baseline"] = {
        "tool": "cyclictest (rt-tests)",
        "setting": {"applied": meta["requested"]["sched"]},
        "count": len(values),
        **{"p50_us": int(p50), "p99_us": int(p99), "p99.9_us": int(p999)},
        "max_us": int(values.max()),
    }
    meta["files"]["baseline"] = results.BASELINE
    results.rewrite_meta(directory, meta)
    return directory


def add_energy(directory: Path, joules: float | None, seconds: float = 10.0) -> Path:
    """The run's meta.json `energy` as the harness writes it: a measured window of `joules`
    over `seconds` on one host with RAPL, per record measured; None: not available here."""
    meta = results.read_meta(directory)
    meta["energy"] = _energy(joules, seconds, meta["counts"]["received"]).to_json()
    results.rewrite_meta(directory, meta)
    return directory


def _energy(joules: float | None, seconds: float, records: int) -> Energy:
    if joules is None:
        reason = "powercap: /sys/class/powercap has no RAPL zone (intel-rapl:*)"
        host = {"available": False, "reason": reason}
        return Energy(available=False, hosts={"host": host}, reason=f"host: {reason}",
                      windows={"run": None, "measured": None})  # fmt: skip
    window = EnergyWindow(from_="measured", to="sent", seconds=seconds, joules=joules,
                          mean_w=joules / seconds, records=records,
                          joules_per_record=joules / records)  # fmt: skip
    host = {"available": True, "source": "powercap", "domains": ["package-0"]}
    return Energy(available=True, hosts={"host": host},
                  windows={"run": window, "measured": window})  # fmt: skip
