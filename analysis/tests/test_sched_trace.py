"""The scheduler trace (TRACE=1) read into thread states on the run's clock, and slow records
explained by the time the job's threads waited for a CPU."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hvbench_analysis import report, results, sched_trace, synthetic

# The kernel's own lines (tracefs `trace`, clock x86-tsc) for one job thread (its comm has a
# space, as the JVM names its task threads) and the threads it switched with.
TRACE = (Path(__file__).parent / "data" / "sched_trace_sample.txt").read_text()
THREADS = {100: "Source: kafka-i"}
ONE_GHZ = {"base_ticks": 0, "base_ns": 0, "hz": 1e9}  # one TSC count per ns


def spans() -> pd.DataFrame:
    to_ns = sched_trace.clock_to_ns("x86-tsc", ONE_GHZ)
    return sched_trace.intervals(sched_trace.parse(TRACE), THREADS, to_ns)


def test_the_kernels_lines_become_the_threads_states():
    events = sched_trace.parse(TRACE)
    assert len(events) == 7 and list(events["event"]).count("sched_wakeup") == 1
    got = [(r.state, r.start_ns, r.end_ns) for r in spans().itertuples()]
    assert got == [
        ("running", 1000, 3000),
        ("runnable", 3000, 7000),  # switched away while still runnable: preempted
        ("running", 7000, 8000),
        ("blocked", 8000, 9000),  # waited for something (S) until woken
        ("runnable", 9000, 9500),  # woken, waiting for the CPU
        ("running", 9500, 12000),
    ]
    assert set(spans()["comm"]) == {"Source: kafka-i"}


def without(stamp: str, added: str = "") -> pd.DataFrame:
    """The sample trace's states with the switch at `stamp` lost (and `added` lines before
    its last)."""
    lines = [line for line in TRACE.splitlines() if f" {stamp}: " not in line]
    lost = "\n".join([*lines[:-1], *added.splitlines(), lines[-1]])
    to_ns = sched_trace.clock_to_ns("x86-tsc", ONE_GHZ)
    return sched_trace.intervals(sched_trace.parse(lost), THREADS, to_ns)


def test_a_switch_away_from_a_thread_the_trace_holds_as_waiting_counts_a_lost_switch():
    """Some kernels drop switch events (docs/tracing.md, "Switches lost"): without the switch
    to the thread at 7000, after it was preempted, it seems to wait from 3000 until its switch
    away at 8000, and nothing dates when it ran."""
    assert spans().attrs["switch_ins_lost"] == (0, 3, 0)
    got = without("7000")
    assert [(r.state, r.start_ns, r.end_ns) for r in got.itertuples()][1:3] == [
        ("runnable", 3000, 8000),
        ("blocked", 8000, 9000),
    ]
    assert got.attrs["switch_ins_lost"] == (1, 3, 0)
    assert sched_trace.lost_switch_ins(got) == "1 of 3 (0 dated by their CPU time)"
    warning = sched_trace.undated_warning(got.attrs, "r1")
    assert warning.startswith("The trace of r1 lacks the switch to a job thread before 1 of its 3")


# the CPU time the scheduler charged the thread as it ran: at a tick, then as it blocked
RUNTIME = "".join(
    f" Source: kafka-i-100 [000] d..2. {ts}: sched_stat_runtime: comm=Source: kafka-i pid=100 "
    f"runtime={ns} [ns]\n"
    for ts, ns in ((11000, 1200), (11990, 800))
)


def test_a_lost_switch_to_a_thread_is_dated_by_the_cpu_time_charged_to_it():
    """Without the switch at 9500, the thread seems to wait from its wake-up at 9000 until its
    switch away at 12000; the 2,000 ns charged to it meanwhile say it ran from 10000."""
    got = without("9500", RUNTIME)
    assert [(r.state, r.start_ns, r.end_ns) for r in got.itertuples()][-3:] == [
        ("blocked", 8000, 9000),
        ("runnable", 9000, 10000),
        ("running", 10000, 12000),
    ]
    assert got.attrs["switch_ins_lost"] == (1, 3, 1)
    assert sched_trace.undated_warning(got.attrs, "r1") is None
    assert sched_trace.undated_warning({}, "r1") is None  # a trace with nothing lost
    to_ns = sched_trace.clock_to_ns("x86-tsc", ONE_GHZ)
    *head, last = TRACE.splitlines()
    both = "\n".join([*head, *RUNTIME.splitlines(), last])
    seen = sched_trace.intervals(sched_trace.parse(both), THREADS, to_ns)
    assert seen.attrs["switch_ins_lost"] == (0, 3, 0)  # seen switches need no dating
    assert seen[["state", "start_ns", "end_ns"]].equals(spans()[["state", "start_ns", "end_ns"]])


def test_tsc_counts_convert_with_the_runs_calibration():
    to_ns = sched_trace.clock_to_ns("x86-tsc", {"base_ticks": 1000, "base_ns": 5e9, "hz": 2e9})
    assert to_ns([3000]) == pytest.approx([5e9 + 1000])
    assert sched_trace.clock_to_ns("mono_raw", {})([12.5]) == pytest.approx([12.5e9])
    with pytest.raises(ValueError, match="local"):
        sched_trace.clock_to_ns("local", {})


# a Xen trace's lines as the host's agent writes them from xentrace's records (vmtrace)
XEN = """d5v0 [002] xen 1000: runstate: vcpu=0 blocked->runnable
d5v0 [002] xen 1500: runstate: vcpu=0 runnable->running
d5v0 [002] xen 4000: runstate: vcpu=0 running->runnable
d5v0 [003] xen 6000: runstate: vcpu=0 runnable->running
d5v0 [003] xen 7000: runstate: vcpu=0 running->offline
"""


def test_a_xen_vcpus_runstates_are_its_states():
    to_ns = sched_trace.clock_to_ns("tsc", ONE_GHZ)
    got = sched_trace.intervals(sched_trace.parse(XEN), {0: "d5v0"}, to_ns)
    assert [(r.state, r.start_ns, r.end_ns) for r in got.itertuples()] == [
        ("runnable", 1000, 1500),
        ("running", 1500, 4000),
        ("runnable", 4000, 6000),  # out of budget, or another vCPU's turn
        ("running", 6000, 7000),
    ]


def test_a_trace_from_another_clock_goes_through_its_alignment():
    # run ticks = 0.5 × trace stamp + 100; then the run's calibration (1 GHz, origin 0)
    aligned = {"known": True, "scale": 0.5, "offset_ticks": 100}
    assert sched_trace.clock_to_ns("x86-tsc", ONE_GHZ, aligned)([1000]) == pytest.approx([600])
    with pytest.raises(ValueError, match="not aligned: no syncs"):
        sched_trace.clock_to_ns("x86-tsc", ONE_GHZ, {"known": False, "reason": "no syncs"})


def test_syncs_give_the_line_through_their_tightest_brackets():
    """Trace stamps t and run ticks r with r = 2t + 50: each sync's bracket holds the true r;
    the tightest at each end decide, and the bound is the wider of their half-widths."""
    syncs = []
    for n, (t, before, after) in enumerate(
        [(100, 20, 60), (110, 5, 60), (120, 10, 30), (5000, 30, 30), (5010, 2, 4)]
    ):
        r = 2 * t + 50
        syncs.append({"n": n, "trace_ts": str(t), "sent_ticks": r - before,
                      "answered_ticks": r + after})  # fmt: skip
    found = sched_trace.alignment_from_syncs(syncs, hz=1e9, window=3)
    # the tightest first is n=2 (width 40, midpoint r+10), the last n=4 (width 6, r+1)
    assert found["known"] and found["bound_ns"] == pytest.approx(20)
    assert found["scale"] * 120 + found["offset_ticks"] == pytest.approx(2 * 120 + 50 + 10)
    assert found["scale"] * 5010 + found["offset_ticks"] == pytest.approx(2 * 5010 + 50 + 1)
    lost = sched_trace.alignment_from_syncs([{**syncs[0], "trace_ts": None}], hz=1e9)
    assert not lost["known"] and "no sync" in lost["reason"]


def test_a_kvm_guests_tsc_offset_and_ratio_align_the_hosts_trace():
    vcpu = {"tsc-offset": -5000, "tsc-scaling-ratio": 3 << 47, "tsc-scaling-ratio-frac-bits": 48}
    start = {"kind": "kvm tsc offset", "vcpus": {"vcpu0": vcpu}}
    found = sched_trace.alignment_from_guest_clock(start, start)
    assert found == {"method": "kvm tsc offset", "known": True, "scale": 1.5,
                     "offset_ticks": -5000, "bound_ns": 0}  # fmt: skip
    moved = {**start, "vcpus": {"vcpu0": {**vcpu, "tsc-offset": 7}}}
    assert not sched_trace.alignment_from_guest_clock(start, moved)["known"]
    pv = {"kind": "xen pv tsc", "host_tsc": True}
    assert sched_trace.alignment_from_guest_clock(pv, pv)["scale"] == 1.0
    hvm = {"kind": "xen hvm tsc", "host_tsc": False, "type": "hvm", "tsc_mode": "default"}
    assert not sched_trace.alignment_from_guest_clock(hvm, hvm)["known"]


def test_a_slow_record_is_explained_by_the_time_its_threads_waited_for_a_cpu():
    samples = pd.DataFrame(
        {
            "detector": ["athens", "athens", "carson"],
            "seq": [1, 2, 1],
            "sent_ns": [2000.0, 2500.0, 11000.0],
            "received_ns": [10000.0, 3000.0, 13000.0],  # the third ends after the trace
            "latency_ns": [8000.0, 500.0, 2000.0],
        }
    )
    explained = sched_trace.explain(samples, spans(), threshold_ns=1000)
    assert list(explained["seq"]) == [1]  # under the threshold, or not seen whole: left out
    (row,) = explained.itertuples()
    assert row.runnable_ms == pytest.approx(4500 / 1e6)  # 3000–7000 and 9000–9500
    assert row.explained_pct == pytest.approx(56.25)


def test_overlapping_waits_of_two_threads_count_once():
    spans = np.array([[0, 10], [5, 20], [30, 40]], float)
    assert sched_trace.covered_ns(spans, 2, 35) == pytest.approx(8 + 10 + 5)


SLOW = [600, 610, 620, 630, 640, 650]  # records 167 ms apart: their stalls never overlap


def traced_run(tmp_path) -> Path:
    """A synthetic run in which six records take 45 ms instead of 5, and a trace in which the
    job's thread was runnable but not running for 40 ms from each one's send."""
    latency = np.full(3000, 5e6)
    latency[SLOW] = 45e6
    return synthetic.add_trace(synthetic.write_run(tmp_path / "traced", latency), SLOW, 40 * 10**6)


def test_the_report_explains_a_traced_runs_tail(tmp_path):
    folder = traced_run(tmp_path)
    explained = sched_trace.run_explanation(folder, results.read_meta(folder), None)
    summary = explained["summary"]
    assert summary["tail records"] == 6 and summary["mean explained (%)"] == pytest.approx(
        100 * 40 / 45, abs=0.5
    )
    out = tmp_path / "report"
    assert report.main(["--results", str(tmp_path), "--out", str(out)]) == 0
    page = (out / "index.html").read_text()
    assert "Tails explained by the scheduler trace" in page
    assert (out / "tables" / "tail_explained.csv").exists()
    assert len(list((out / "figures").glob("trace_traced_*.svg"))) == report.WORST_SHOWN


def test_a_traced_run_with_no_slow_record_is_reported_without_one(tmp_path):
    # DEADLINE_MS above every record: the run is traced, its table of slow records empty (it
    # used to end the whole report with a TypeError on choosing the slowest ones)
    folder = traced_run(tmp_path)
    explained = sched_trace.run_explanation(folder, results.read_meta(folder), 1_000.0)
    assert explained["records"].empty and explained["summary"]["tail records"] == 0
    assert explained["records"]["latency_ms"].dtype == float
    out = tmp_path / "report"
    args = ["--results", str(tmp_path), "--out", str(out), "--deadline-ms", "1000"]
    assert report.main(args) == 0
    assert "Tails explained by the scheduler trace" in (out / "index.html").read_text()


def test_within_parsed_once_each_trace_is_parsed_once_and_after_it_nothing_is_kept(
    tmp_path, monkeypatch
):
    folder = traced_run(tmp_path)
    meta = results.read_meta(folder)
    parsed, parse = [], sched_trace.parse
    monkeypatch.setattr(sched_trace, "parse", lambda text: parsed.append(text) or parse(text))
    with sched_trace.parsed_once():
        spans, _ = sched_trace.traced(folder, meta)
        again, _ = sched_trace.traced(tmp_path / "traced" / ".." / "traced", meta)
        assert again is spans and len(parsed) == 1  # the same file, the same reading
        read_otherwise = {**meta, "trace": {**meta["trace"], "threads": {"100": "renamed"}}}
        renamed, _ = sched_trace.traced(folder, read_otherwise)
        assert len(parsed) == 2 and set(renamed["comm"]) == {"renamed"}
    assert sched_trace._parsed is None  # nothing kept after it
    outside, _ = sched_trace.traced(folder, meta)
    assert len(parsed) == 3 and outside is not spans
    pd.testing.assert_frame_equal(outside, spans)


def test_the_covered_time_is_that_of_the_union_walked_span_by_span():
    rng = np.random.default_rng(5)
    starts = rng.uniform(0, 1000, 300)
    spans = np.column_stack([starts, starts + rng.exponential(3, 300)])
    windows = np.sort(rng.uniform(-10, 1010, (200, 2)), axis=1)

    def walked(start: float, end: float) -> float:  # span by span, in order of their starts
        total, reach = 0.0, start
        for a, b in spans[np.argsort(spans[:, 0])]:
            a, b = max(a, reach), min(b, end)
            if b > a:
                total, reach = total + b - a, b
        return total

    got = sched_trace.covered_ns(spans, windows[:, 0], windows[:, 1])
    assert got == pytest.approx([walked(s, e) for s, e in windows])
    assert sched_trace.covered_ns(np.empty((0, 2)), [0.0], [5.0]).tolist() == [0.0]
    assert sched_trace.covered_ns(spans, 2000.0, 3000.0) == 0.0  # after every span
