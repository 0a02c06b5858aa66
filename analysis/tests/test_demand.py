"""Each record's demand from a trace (hvbench_analysis.demand), on spans laid out by hand."""

import math

import numpy as np
import pandas as pd
from hvbench_analysis import demand


def test_time_in_counts_the_spans_within_each_window():
    starts, ends = np.array([0.0, 5.0]), np.array([2.0, 8.0])
    lo, hi = np.array([1.0, -5.0, 2.0, 3.0]), np.array([6.0, 100.0, 5.0, 3.0])
    assert demand.time_in(starts, ends, lo, hi).tolist() == [2.0, 5.0, 0.0, 0.0]


def spans(rows) -> pd.DataFrame:
    return pd.DataFrame(
        [(tid, f"t{tid}", state, a, b) for tid, state, a, b in rows],
        columns=["tid", "comm", "state", "start_ns", "end_ns"],
    )


def test_a_records_cpu_time_is_its_threads_running_time_after_the_previous_record_left():
    """Record 0 is sent at 0 and received at 10, record 1 sent at 5 and received at 30: record
    1 is the job's from 10. Thread 1 runs 1–4 and 12–15 and waits for a CPU 15–18; thread 2
    runs 6–9 and 20–22 (blocked otherwise, which the trace sees from 0 to 40)."""
    traced = spans([
        (1, "running", 1, 4), (1, "blocked", 4, 12), (1, "running", 12, 15),
        (1, "runnable", 15, 18), (1, "blocked", 18, 40),
        (2, "blocked", 0, 6), (2, "running", 6, 9), (2, "blocked", 9, 20),
        (2, "running", 20, 22), (2, "blocked", 22, 40),
    ])  # fmt: skip
    samples = pd.DataFrame(
        {"detector": ["a", "b"], "seq": [0, 0], "sent_ns": [0, 5], "received_ns": [10, 30],
         "latency_ns": [10, 25]}
    )  # fmt: skip
    table = demand.record_demands(traced, samples)
    assert table["cpu_ns"].tolist() == [6, 5]
    assert table["runnable_ns"].tolist() == [0, 3]
    assert table["other_ns"].tolist() == [4, 17]
    assert table["from_ns"].tolist() == [0, 10]
    assert (table["cpu_ns:1"].tolist(), table["cpu_ns:2"].tolist()) == ([3, 3], [3, 2])


def test_records_the_trace_did_not_see_whole_are_left_out():
    traced = spans([(1, "running", 10, 20)])
    samples = pd.DataFrame(
        {"detector": ["a", "b"], "seq": [0, 1], "sent_ns": [5, 12], "received_ns": [15, 18],
         "latency_ns": [10, 6]}
    )  # fmt: skip
    assert demand.record_demands(traced, samples)["seq"].tolist() == [1]


def test_autocorrelation_of_alike_and_alternating_demands():
    assert demand.autocorrelation([1, 2, 3, 4, 5, 6]) > 0.99
    assert demand.autocorrelation([1, 5, 1, 5, 1, 5]) < -0.99
    assert math.isnan(demand.autocorrelation([3, 3, 3, 3]))


def test_a_testbeds_vcpus_get_a_column_each_by_their_number():
    """KVM's vCPU threads 900 and 901 are vCPUs 1 and 0; record 0's window is 0–10."""
    traced = spans([(900, "blocked", 0, 1), (900, "running", 1, 4), (901, "running", 5, 7),
                    (901, "blocked", 7, 20)])  # fmt: skip
    traced["comm"] = traced["tid"].map({900: "CPU 1/KVM", 901: "CPU 0/KVM"})
    samples = pd.DataFrame(
        {"detector": ["a"], "seq": [0], "sent_ns": [0], "received_ns": [10], "latency_ns": [10]}
    )
    table = demand.record_demands(traced, samples)
    assert table["vcpu_ns:0"].tolist() == table["cpu_ns:901"].tolist() == [2]
    assert table["vcpu_ns:1"].tolist() == table["cpu_ns:900"].tolist() == [3]
    assert list(demand.vcpu_columns(table)) == [0, 1]
    # a job's threads (a bare run's trace) are not vCPUs: no vCPU columns
    job = spans([(1, "blocked", 0, 1), (1, "running", 1, 4), (1, "blocked", 4, 20)])
    assert not demand.vcpu_columns(demand.record_demands(job, samples))


def test_a_vcpu_is_known_by_the_name_the_testbeds_trace_gives_it():
    assert [demand.vcpu_of(n) for n in ("CPU 0/KVM", "CPU 12/KVM", "d5v1", "d12v3")] == [
        0, 12, 1, 3
    ]  # fmt: skip
    for name in ("java", "CPU 1/KVMx", "xd5v0", "d5v", "Source Data Fetcher", ""):
        assert demand.vcpu_of(name) is None, name
