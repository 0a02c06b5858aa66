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


def test_tsc_counts_convert_with_the_runs_calibration():
    to_ns = sched_trace.clock_to_ns("x86-tsc", {"base_ticks": 1000, "base_ns": 5e9, "hz": 2e9})
    assert to_ns([3000]) == pytest.approx([5e9 + 1000])
    assert sched_trace.clock_to_ns("mono_raw", {})([12.5]) == pytest.approx([12.5e9])
    with pytest.raises(ValueError, match="local"):
        sched_trace.clock_to_ns("local", {})


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
    assert len(list((out / "figures").glob("trace_traced_*.png"))) == report.WORST_SHOWN
