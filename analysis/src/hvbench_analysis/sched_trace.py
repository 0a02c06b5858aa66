"""A run's scheduler trace (TRACE=1: `sched_trace.txt`, the kernel's sched_switch and
sched_wakeup events of the job's threads) as intervals on the run's clock, and the slow records
it explains (docs/tracing.md).

    events = parse(text)                                  # one row per event
    spans = intervals(events, threads, to_ns)             # tid, comm, state, start_ns, end_ns
    explained = explain(samples, spans, threshold_ns)     # per slow record: the share covered

A thread is `running` from a switch to it until a switch away; then `runnable` if it still
wanted the CPU (prev_state R: preempted, or its budget used up) or `blocked` (it waited for
something: S, D, ...) until it is woken, and `runnable` from its wake-up until it runs. A slow
record is explained by the time, within its latency, during which any of the job's threads was
runnable but not running: the CPU it needed was withheld.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd

# "<comm>-<pid> [003] d..2. 2642311780147: sched_switch: prev_comm=... ==> next_comm=..."
# (comm may hold spaces and dashes; the timestamp is TSC counts, or seconds.micros)
# (a Xen trace's lines, made by the host's agent from xentrace's records, read the same way:
# "d5v0 [002] xen 8620163127352: runstate: vcpu=0 running->runnable")
LINE = re.compile(
    r"\[(\d+)\]\s+\S+\s+(\d+(?:\.\d+)?): (sched_switch|sched_wakeup|sched_stat_runtime|runstate): "
    r"(.*)$"
)
SWITCH = re.compile(
    r"prev_comm=(.*) prev_pid=(\d+) prev_prio=-?\d+ prev_state=(\S+) ==> "
    r"next_comm=(.*) next_pid=(\d+) next_prio=-?\d+"
)
WAKEUP = re.compile(r"comm=(.*) pid=(\d+) prio=-?\d+")
RUNTIME = re.compile(r"comm=(.*) pid=(\d+) runtime=(\d+) \[ns\]")
RUNSTATE = re.compile(r"vcpu=(\d+) (\w+)->(\w+)")
# a Xen vCPU's runstates as a thread's states (offline: it cannot run, as if blocked)
XEN_STATES = {"running": "running", "runnable": "runnable", "blocked": "blocked",
              "offline": "blocked"}  # fmt: skip
SYNC = "sync exchange through the trace (NTP-style)"
STATES = ("running", "runnable", "blocked")


def parse(text: str) -> pd.DataFrame:
    """The events: ts (as printed), cpu, event, prev_pid, prev_state, next_pid, pid (woken,
    or charged runtime_ns of CPU time)."""
    rows = []
    for line in text.splitlines():
        found = LINE.search(line)
        if not found:
            continue
        cpu, ts, event, payload = found.groups()
        row = {"ts": ts, "cpu": int(cpu), "event": event}
        if event == "sched_switch" and (m := SWITCH.match(payload)):
            row.update(prev_pid=int(m[2]), prev_state=m[3], next_pid=int(m[5]))
        elif event == "sched_wakeup" and (m := WAKEUP.match(payload)):
            row.update(pid=int(m[2]))
        elif event == "sched_stat_runtime" and (m := RUNTIME.match(payload)):
            row.update(pid=int(m[2]), runtime_ns=int(m[3]))
        elif event == "runstate" and (m := RUNSTATE.match(payload)):
            row.update(pid=int(m[1]), new_state=XEN_STATES.get(m[3], "blocked"))
        else:
            continue
        rows.append(row)
    columns = ["ts", "cpu", "event", "prev_pid", "prev_state", "next_pid", "pid", "new_state",
               "runtime_ns"]  # fmt: skip
    return pd.DataFrame(rows, columns=columns)


def clock_to_ns(clock: str, tsc: dict, alignment: dict | None = None):
    """A function from printed trace timestamps to the run's ns. A trace made on the machine
    that stamps the records (no `alignment`): x86-tsc counts convert with the run's TSC
    calibration, as the records' stamps do; mono_raw is already that timeline (seconds,
    microsecond resolution). A trace made elsewhere (a testbed's host) first goes through its
    `alignment` (run ticks = scale × trace timestamp + offset); ValueError if that is unknown."""
    base_ticks, base_ns, hz = tsc.get("base_ticks"), tsc.get("base_ns"), tsc.get("hz")
    if alignment is not None:
        if not alignment.get("known"):
            raise ValueError(f"the trace's clock is not aligned: {alignment.get('reason')}")
        scale, offset = alignment["scale"], alignment["offset_ticks"]
        return lambda ts: (
            base_ns + (np.asarray(ts, np.float64) * scale + offset - base_ticks) * 1e9 / hz
        )
    if clock in ("x86-tsc", "tsc"):
        return lambda ts: base_ns + (np.asarray(ts, np.float64) - base_ticks) * 1e9 / hz
    if clock == "mono_raw":
        return lambda ts: np.asarray(ts, np.float64) * 1e9
    raise ValueError(f"trace clock {clock!r} cannot be put on the run's clock")


def alignment_from_syncs(syncs: list[dict], hz: float, window: int = 8) -> dict:
    """The trace's clock against the run's, from syncs in the order sent: each has the run's
    TSC just before it was sent and just after its answer came (`sent_ticks`,
    `answered_ticks`) and the trace's stamp of its marker (`trace_ts`), which lies in between.
    The tightest sync of the first `window` and of the last give two points (their brackets'
    midpoints); the line through them maps trace stamps to run ticks, within the larger
    half-bracket (`bound_ns`)."""
    usable = [s for s in syncs if s.get("trace_ts") is not None]
    if not usable:
        return {"method": SYNC, "known": False, "reason": "no sync came back through the trace"}

    def width(s: dict) -> int:
        return s["answered_ticks"] - s["sent_ticks"]

    first, last = min(usable[:window], key=width), min(usable[-window:], key=width)
    t0, t1 = float(first["trace_ts"]), float(last["trace_ts"])
    m0 = (first["sent_ticks"] + first["answered_ticks"]) / 2
    m1 = (last["sent_ticks"] + last["answered_ticks"]) / 2
    scale = (m1 - m0) / (t1 - t0) if t1 > t0 else 1.0
    return {
        "method": SYNC,
        "known": True,
        "scale": scale,
        "offset_ticks": m0 - scale * t0,
        "bound_ns": max(width(first), width(last)) / 2 * 1e9 / hz,
        "syncs": len(usable),
    }


def alignment_from_guest_clock(start: dict, end: dict) -> dict:
    """The trace's clock (the host's TSC) against the run's (the messaging VM's TSC) from what
    the host said of that guest at the trace's start and end: KVM's offset and scaling ratio
    (guest = host × ratio / 2^frac_bits + offset), or a Xen PV guest reading the host's TSC."""
    method = start.get("kind", "guest clock")
    if start.get("error") or end.get("error"):
        return {"method": method, "known": False, "reason": start.get("error") or end["error"]}
    if method.startswith("xen"):
        if not start.get("host_tsc"):
            reason = f"a {start.get('type')} guest with tsc_mode {start.get('tsc_mode')}"
            return {"method": method, "known": False, "reason": reason}
        return {"method": method, "known": True, "scale": 1.0, "offset_ticks": 0, "bound_ns": 0}
    if start.get("vcpus") != end.get("vcpus"):
        reason = "the guest's TSC offset or scaling changed during the trace"
        return {"method": method, "known": False, "reason": reason}
    vcpu = start["vcpus"][min(start["vcpus"])]
    frac = vcpu.get("tsc-scaling-ratio-frac-bits", 0)
    scale = vcpu.get("tsc-scaling-ratio", 1 << frac) / (1 << frac)
    offset = vcpu["tsc-offset"]
    return {"method": method, "known": True, "scale": scale, "offset_ticks": offset, "bound_ns": 0}


def transitions(events: pd.DataFrame, tids: set[int]) -> pd.DataFrame:
    """(ts, tid, state, switched_out, ran_ns) each time a traced thread's state changes, in
    trace order; switched_out: a switch away from the thread (it ran until then), and ran_ns
    the CPU time the scheduler charged it since its switch away before (sched_stat_runtime;
    0 where not traced)."""
    rows = []
    charged: dict[int, int] = {}
    for e in events.itertuples(index=False):
        if e.event == "sched_switch":
            if e.prev_pid in tids:
                tid = int(e.prev_pid)
                state = "runnable" if str(e.prev_state).startswith("R") else "blocked"
                rows.append((e.ts, tid, state, True, charged.pop(tid, 0)))
            if e.next_pid in tids:
                rows.append((e.ts, int(e.next_pid), "running", False, 0))
        elif e.event == "sched_stat_runtime":
            if e.pid in tids:
                charged[int(e.pid)] = charged.get(int(e.pid), 0) + int(e.runtime_ns)
        elif e.event == "runstate":
            if e.pid in tids:
                rows.append((e.ts, int(e.pid), e.new_state, False, 0))
        elif e.pid in tids:
            rows.append((e.ts, int(e.pid), "wakeup", False, 0))
    return pd.DataFrame(rows, columns=["ts", "tid", "state", "switched_out", "ran_ns"])


def intervals(events: pd.DataFrame, threads: dict[int, str], to_ns) -> pd.DataFrame:
    """tid, comm, state (running, runnable, blocked), start_ns, end_ns: each traced thread's
    states between its first and its last event. A switch away from a thread the trace holds
    as waiting lost the switch to it (docs/tracing.md, "Switches lost"): the CPU time charged
    to the thread since its switch away before dates when it began to run; without it, the
    time it ran is counted as waiting."""
    changes = transitions(events, set(threads))
    rows = []
    outs = unseen = dated = 0  # switches away; of them, after a switch to it not traced; dated
    for tid, group in changes.groupby("tid", sort=True):
        times = to_ns(group["ts"].astype(float).to_numpy())
        ends = [*times[1:], None]  # each state lasts until the thread's next change
        state = None
        for start, end, change, out, ran in zip(
            times, ends, group["state"], group["switched_out"], group["ran_ns"], strict=True
        ):
            if out and state in ("runnable", "blocked"):
                unseen += 1
                dated += date_lost_run(rows, tid, start, ran)
            if change == "wakeup":  # a wake-up makes a blocked thread runnable, nothing else
                change = "runnable" if state in (None, "blocked") else state
            outs += bool(out)
            state = change
            if end is not None and end > start:
                rows.append((tid, threads[tid], state, start, end))
    spans = pd.DataFrame(rows, columns=["tid", "comm", "state", "start_ns", "end_ns"])
    spans.attrs["switch_ins_lost"] = (unseen, outs, dated)
    return spans


def date_lost_run(rows: list[tuple], tid: int, out_ns: float, ran_ns: float) -> bool:
    """The thread ran `ran_ns` until `out_ns`, though its last span says it waited: the end of
    that span becomes running. Whether there was such a span and CPU time to date it by."""
    if ran_ns <= 0 or not rows or rows[-1][0] != tid:
        return False
    _, comm, waited, start, end = rows.pop()
    began = max(start, out_ns - ran_ns)
    if began > start:
        rows.append((tid, comm, waited, start, began))
    rows.append((tid, comm, "running", began, end))
    return True


def covered_ns(spans: np.ndarray, starts, ends) -> np.ndarray | float:
    """How much of each [start, end] the union of `spans` (n × 2, in any order) covers: the
    union's length up to the end less its length up to the start. The union is made once and
    each point found in it by bisection (a run's thousands of slow records against its hundred
    thousand spans, without walking the spans for each)."""
    a, b = union(spans)
    before = np.concatenate([[0.0], np.cumsum(b - a)])  # the union's length before each part

    def length_up_to(x: np.ndarray) -> np.ndarray:
        if not len(a):
            return np.zeros_like(x)
        k = np.searchsorted(a, x, side="right") - 1  # the last part beginning at or before x
        at = np.maximum(k, 0)
        return np.where(k >= 0, before[at] + np.clip(x - a[at], 0, b[at] - a[at]), 0.0)

    total = length_up_to(np.asarray(ends, np.float64)) - length_up_to(
        np.asarray(starts, np.float64)
    )
    return total if total.ndim else float(total)


def union(spans: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The union of intervals (n × 2) as its disjoint parts' starts and ends, in order."""
    spans = np.asarray(spans, np.float64).reshape(-1, 2)
    if not len(spans):
        return spans[:, 0], spans[:, 1]
    spans = spans[np.argsort(spans[:, 0], kind="stable")]
    reach = np.maximum.accumulate(spans[:, 1])  # the furthest end of the spans so far
    first = np.flatnonzero(np.r_[True, spans[1:, 0] > reach[:-1]])  # where a part begins
    return spans[first, 0], reach[np.r_[first[1:] - 1, len(spans) - 1]]


def explain(samples: pd.DataFrame, spans: pd.DataFrame, threshold_ns: float) -> pd.DataFrame:
    """Each record at or over the threshold whose latency the trace saw whole: its latency,
    how long a job thread was runnable but not running within it, and that share (%)."""
    waiting = spans[spans["state"] == "runnable"][["start_ns", "end_ns"]].to_numpy(np.float64)
    seen_from, seen_to = spans["start_ns"].min(), spans["end_ns"].max()
    slow = samples[(samples["latency_ns"] >= threshold_ns)]
    slow = slow[(slow["sent_ns"] >= seen_from) & (slow["received_ns"] <= seen_to)]
    covered = covered_ns(waiting, slow["sent_ns"].to_numpy(), slow["received_ns"].to_numpy())
    rows = {
        "detector": slow["detector"].to_numpy(),
        "seq": slow["seq"].to_numpy(),
        "sent_ns": slow["sent_ns"].to_numpy(),
        "latency_ms": slow["latency_ns"].to_numpy() / 1e6,
        "runnable_ms": covered / 1e6,
        "explained_pct": 100 * covered / slow["latency_ns"].to_numpy(),
    }
    # typed even without a row: a traced run with no record over the threshold seen whole
    # made an empty table of objects, and the report's choice of the slowest failed on it
    columns = {"detector": object, "seq": "int64", "sent_ns": "int64", "latency_ms": float,
               "runnable_ms": float, "explained_pct": float}  # fmt: skip
    return pd.DataFrame(rows, columns=list(columns)).astype(columns)


# Each trace's intervals, by its file and how meta.json reads it, while parsed_once() lasts
_parsed: dict[tuple[str, str], pd.DataFrame] | None = None


@contextlib.contextmanager
def parsed_once() -> Iterator[None]:
    """Within it, traced() parses each trace once and hands out the same intervals (to be
    read, not changed). The report reads a traced run's trace for its explanation and again
    for the simulator's demands: on the recorded campaign, 8 traces parsed twice took 1.9 s of
    the report's own 4.4. Outside it nothing is kept: a trace's intervals take megabytes."""
    global _parsed
    _parsed = {}
    try:
        yield
    finally:
        _parsed = None


def traced(directory, meta: dict) -> tuple[pd.DataFrame, pd.DataFrame] | None:
    """A traced run's thread intervals on the run's clock and its received records past the
    warm-up; None if the run has no trace or its clock cannot be put on the run's."""
    from hvbench_analysis import results  # the report's module, loaded on first use

    trace, tsc = meta.get("trace") or {}, (meta.get("clock") or {}).get("tsc") or {}
    path = Path(directory) / results.SCHED_TRACE
    if not trace or not path.exists():
        return None
    try:
        to_ns = clock_to_ns(trace.get("clock", ""), tsc, trace.get("alignment"))
    except (ValueError, KeyError):
        return None
    threads = {int(tid): comm for tid, comm in (trace.get("threads") or {}).items()}
    key = (str(path.resolve()), json.dumps([trace, tsc], sort_keys=True, default=str))
    spans = _parsed.get(key) if _parsed is not None else None
    if spans is None:
        spans = intervals(parse(path.read_text(errors="replace")), threads, to_ns)
        if _parsed is not None:
            _parsed[key] = spans
    samples = results.read_samples(directory)
    samples = samples[(samples["copies"] > 0) & ~samples["warmup"]]
    if spans.empty or samples.empty or "sent_ns" not in samples:
        return None
    return spans, samples


def run_explanation(directory, meta: dict, deadline_ms: float | None) -> dict | None:
    """A traced run's slow records explained: {"summary": one table row, "records": explain()'s
    table, "spans": the intervals, "samples": the run's received records}; None if the run
    has no trace or its clock cannot be put on the run's."""
    from hvbench_analysis import stages  # the report's module, loaded on first use

    found = traced(directory, meta)
    if found is None:
        return None
    spans, samples = found
    trace = meta["trace"]
    threshold = stages.tail_threshold_ns(samples["latency_ns"].to_numpy(), deadline_ms)
    records = explain(samples, spans, threshold)
    return {
        "summary": explanation_row(meta, trace, threshold, records, spans),
        "records": records,
        "spans": spans,
        "samples": samples,
    }


def lost_switch_ins(spans: pd.DataFrame) -> str:
    """The text "n of m (k dated ...)": of m switches away from the threads, n whose switch to
    the thread the trace lacks, k of them dated by the CPU time charged (intervals)."""
    lost, outs, dated = switch_ins_lost(spans.attrs)
    return f"{lost} of {outs} ({dated} dated by their CPU time)"


def switch_ins_lost(attrs: dict) -> tuple[int, int, int]:
    """(lost, switches away, dated by their CPU time) as intervals found them."""
    lost, outs, *dated = attrs.get("switch_ins_lost", (0, 0, 0))
    return lost, outs, (dated[0] if dated else 0)


def undated_warning(attrs: dict, name: str) -> str | None:
    """What a trace whose lost switches to a thread could not all be dated means for the CPU
    demands read from it; None when nothing is missing."""
    lost, outs, dated = switch_ins_lost(attrs)
    if lost == dated:
        return None
    return (
        f"The trace of {name} lacks the switch to a job thread before {lost - dated} of its "
        f'{outs} switches away with no CPU time to date it by (docs/tracing.md, "Switches '
        'lost"): the time the thread ran since each is counted as waiting, so its CPU demands, '
        "and the delays simulated from them, are low."
    )


def explanation_row(
    meta: dict, trace: dict, threshold_ns: float, records: pd.DataFrame, spans: pd.DataFrame
) -> dict:
    shares = records["explained_pct"]
    return {
        "run_id": meta.get("run_id"),
        "threads": len(trace.get("threads") or {}),
        "clock": trace.get("clock"),
        "aligned by": (trace.get("alignment") or {}).get("method", "the run's own clock"),
        "alignment bound (ms)": (trace.get("alignment") or {}).get("bound_ns", 0) / 1e6,
        "events": trace.get("lines"),
        "dropped": trace.get("dropped"),
        "switches to a thread lost": lost_switch_ins(spans),
        "tail from (ms)": threshold_ns / 1e6,
        "tail records": len(records),
        "mean explained (%)": float(shares.mean()) if len(shares) else float("nan"),
        "median explained (%)": float(shares.median()) if len(shares) else float("nan"),
        "≥ 50 % explained": int((shares >= 50).sum()),
    }
