"""What each record asked of the job's CPU, from a traced run (TRACE=1): the simulator's input.

A record is the job's from the moment the previous record left the job's last thread (or from
its own send, if later) until it is received: the job handles records in order, one after
another (`from_ns`: where its window starts). Within that window, the CPU time the job's
threads spent running (`cpu_ns`, summed over the threads: two of them may run at once on two
CPUs; each thread's own in `cpu_ns:<thread id>`; on a testbed, where the traced threads are the
real-time VM's vCPUs, each vCPU's also in `vcpu_ns:<vCPU>`) is its demand; the time any of them
waited for a CPU (`runnable_ns`) is what the scheduler withheld; the rest of its latency
(`other_ns`: the Kafka hops, the waits on I/O and timers) is what the CPU did not decide.

    table = record_demands(spans, samples)    # one row per record, in send order
    lag1 = autocorrelation(table["cpu_ns"])   # are consecutive demands alike?
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from hvbench_analysis import sched_trace

COLUMNS = ["detector", "seq", "sent_ns", "received_ns", "latency_ns", "from_ns", "cpu_ns",
           "runnable_ns", "other_ns"]  # fmt: skip
THREAD_CPU = "cpu_ns:"  # + a thread's id: that thread's running time in the window
VCPU_CPU = "vcpu_ns:"  # + a vCPU's number: that vCPU's running time in the window
# How a testbed's trace names a vCPU (hostagent vmtrace.py): KVM's vCPU threads as QEMU names
# them, "CPU 1/KVM"; Xen's vCPUs as d<domain>v<vCPU>
VCPU_NAMES = (re.compile(r"CPU (\d+)/KVM"), re.compile(r"d\d+v(\d+)"))


def vcpu_of(comm: str) -> int | None:
    """The vCPU a traced thread is, by its name; None for a thread that is not a vCPU."""
    for pattern in VCPU_NAMES:
        if found := pattern.fullmatch(str(comm)):
            return int(found.group(1))
    return None


def vcpu_columns(table: pd.DataFrame) -> dict[int, str]:
    """The table's vCPU columns (VCPU_CPU) by vCPU, in vCPU order; none for a job's threads."""
    found = {int(c.removeprefix(VCPU_CPU)): c for c in table if c.startswith(VCPU_CPU)}
    return dict(sorted(found.items()))


def time_in(starts: np.ndarray, ends: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """For each window [lo, hi], how long the disjoint spans [starts, ends] (sorted) cover it."""
    before = np.concatenate([[0.0], np.cumsum(ends - starts)])

    def covered_until(t: np.ndarray) -> np.ndarray:
        k = np.searchsorted(starts, t, side="right")  # spans that start at or before t
        last = np.maximum(k - 1, 0)
        inside = np.where(k > 0, np.clip(t - starts[last], 0, ends[last] - starts[last]), 0)
        return before[last] * (k > 0) + inside

    return np.maximum(covered_until(hi) - covered_until(lo), 0)


def windows(samples: pd.DataFrame) -> tuple[pd.DataFrame, np.ndarray, np.ndarray]:
    """The records in send order and each one's window [lo, hi] on the run's clock."""
    records = samples.sort_values("sent_ns", kind="stable").reset_index(drop=True)
    sent = records["sent_ns"].to_numpy(np.float64)
    received = records["received_ns"].to_numpy(np.float64)
    previous = np.maximum.accumulate(np.concatenate([[-np.inf], received[:-1]]))
    return records, np.maximum(sent, previous), received


def state_time(
    spans: pd.DataFrame, state: str, lo: np.ndarray, hi: np.ndarray
) -> dict[int, np.ndarray]:
    """Per thread id, the time it spent in `state` within each window."""
    found = {}
    for tid, thread in spans[spans["state"] == state].groupby("tid"):
        thread = thread.sort_values("start_ns")
        starts = thread["start_ns"].to_numpy(np.float64)
        ends = thread["end_ns"].to_numpy(np.float64)
        found[int(tid)] = time_in(starts, ends, lo, hi)
    return found


def record_demands(spans: pd.DataFrame, samples: pd.DataFrame) -> pd.DataFrame:
    """One row per record the trace saw whole: its latency split into the job's CPU time,
    the time a job thread waited for a CPU, and the rest (COLUMNS), each thread's CPU time
    (THREAD_CPU), and each vCPU's where the threads are vCPUs (VCPU_CPU)."""
    seen_from, seen_to = spans["start_ns"].min(), spans["end_ns"].max()
    whole = samples[(samples["sent_ns"] >= seen_from) & (samples["received_ns"] <= seen_to)]
    records, lo, hi = windows(whole)
    per_thread = state_time(spans, "running", lo, hi)
    cpu = sum(per_thread.values(), np.zeros(len(lo)))
    runnable = sum(state_time(spans, "runnable", lo, hi).values(), np.zeros(len(lo)))
    latency = records["latency_ns"].to_numpy(np.float64)
    table = records[["detector", "seq", "sent_ns", "received_ns", "latency_ns"]].copy()
    table["from_ns"] = lo.round().astype(np.int64)
    table["cpu_ns"] = cpu.round().astype(np.int64)
    table["runnable_ns"] = runnable.round().astype(np.int64)
    table["other_ns"] = (latency - cpu - runnable).round().astype(np.int64)
    for tid, time in sorted(per_thread.items()):
        table[f"{THREAD_CPU}{tid}"] = time.round().astype(np.int64)
    vcpus = per_vcpu(per_thread, spans)
    for vcpu, time in vcpus.items():
        table[f"{VCPU_CPU}{vcpu}"] = time.round().astype(np.int64)
    return table[
        COLUMNS
        + [f"{THREAD_CPU}{tid}" for tid in sorted(per_thread)]
        + [f"{VCPU_CPU}{vcpu}" for vcpu in vcpus]
    ]


def per_vcpu(per_thread: dict[int, np.ndarray], spans: pd.DataFrame) -> dict[int, np.ndarray]:
    """Each vCPU's time, in vCPU order, where every traced thread is a vCPU; else none. (A
    vCPU traced under two thread ids, as after a restart, adds up.)"""
    names = spans.drop_duplicates("tid").set_index("tid")["comm"]
    vcpus = {tid: vcpu_of(names.get(tid, "")) for tid in per_thread}
    if not vcpus or None in vcpus.values():
        return {}
    found: dict[int, np.ndarray] = {}
    for tid, vcpu in vcpus.items():
        found[vcpu] = found.get(vcpu, 0) + per_thread[tid]
    return dict(sorted(found.items()))


def autocorrelation(values, lag: int = 1) -> float:
    """The correlation of each value with the one `lag` places later (nan if too few)."""
    x = np.asarray(values, dtype=np.float64)
    if len(x) <= lag + 1 or np.std(x[:-lag]) == 0 or np.std(x[lag:]) == 0:
        return float("nan")
    return float(np.corrcoef(x[:-lag], x[lag:])[0, 1])


def background_share(table: pd.DataFrame, meta: dict) -> float | None:
    """The CPU the job's JVM used besides the records' windows on the traced threads, as a
    share of one CPU: its other threads (the compiler, the collector, timers) and the traced
    ones between records; from the run's CPU time per part (meta.json `cpu_per_part`, while
    sending), None where the run has none. A CPU quota on the whole JVM pays for it too."""
    parts = (meta.get("cpu_per_part") or {}).get("parts") or {}
    window_s = (meta.get("cpu_per_part") or {}).get("window_s")
    jvm = parts.get(JVM_PART) or {}
    if not window_s or jvm.get("cpu_s") is None or len(table) < 2:
        return None
    span_ns = float(table["received_ns"].max() - table["from_ns"].min())
    records = float(table["cpu_ns"].sum()) / span_ns if span_ns > 0 else 0.0
    return max(jvm["cpu_s"] / window_s - records, 0.0)


JVM_PART = "flink job"  # the job's JVM in meta.json cpu_per_part (harness/cpu.py)


def run_demands(directory, meta: dict) -> pd.DataFrame | None:
    """record_demands of a run's folder; None if it has no trace the report can read."""
    found = sched_trace.traced(directory, meta)
    if found is None:
        return None
    table = record_demands(*found)
    table.attrs["switch_ins_lost"] = sched_trace.switch_ins_lost(found[0].attrs)
    return table
