"""A setting's latencies predicted from a reference's demands (hvbench_analysis.prediction),
and the JVM's other work a CPU quota pays for (demand.background_share), on records laid out
by hand."""

import pandas as pd
import pytest
from hvbench_analysis import demand, prediction

MS = 1_000_000
QUOTA = [{"budget_us": 20_000, "period_us": 100_000}]


def one_record(cpu_ms: int) -> pd.DataFrame:
    return pd.DataFrame(
        {"detector": ["a"], "seq": [0], "sent_ns": [0], "received_ns": [(cpu_ms + 5) * MS],
         "latency_ns": [(cpu_ms + 5) * MS], "from_ns": [0], "cpu_ns": [cpu_ms * MS]}
    )  # fmt: skip


def test_a_quota_on_the_whole_jvm_leaves_the_records_what_its_other_work_does_not_take():
    # 20 ms per 100 ms, a tenth of a CPU taken by the rest of the JVM: 10 ms left a period;
    # 15 ms of CPU from 0 runs 0–10, waits for 100, runs 100–105: 90 ms more than alone
    alone = prediction.predicted(one_record(15), "bare", "cfs-quota", QUOTA)
    shared = prediction.predicted(one_record(15), "bare", "cfs-quota", QUOTA, background=0.1)
    assert alone["latency_ns"].tolist() == [20 * MS]  # 15 ms fit in 20: nothing added
    assert shared["latency_ns"].tolist() == [(20 + 90) * MS]


def test_other_work_that_takes_the_whole_quota_is_not_modelled():
    with pytest.raises(prediction.NotModelled, match="takes the whole quota"):
        prediction.predicted(one_record(1), "bare", "cfs-quota", QUOTA, background=0.2)


def test_sched_deadline_on_the_threads_is_not_charged_for_the_jvms_other_work():
    found = [{"budget_us": 20_000, "period_us": 100_000}]
    late = prediction.predicted(one_record(15), "bare", "deadline", found, background=0.5)
    assert late["latency_ns"].tolist() == [20 * MS]


def test_the_background_is_the_jvms_cpu_less_the_records_on_the_traced_threads():
    # records: 1 ms of CPU each over 100 ms (1 %); the JVM: 3 s of CPU over 100 s (3 %)
    table = pd.DataFrame(
        {"from_ns": [0, 50 * MS], "received_ns": [10 * MS, 100 * MS], "cpu_ns": [MS, 0]}
    )
    meta = {"cpu_per_part": {"window_s": 100.0, "parts": {"flink job": {"cpu_s": 3.0}}}}
    assert demand.background_share(table, meta) == pytest.approx(0.02)
    assert demand.background_share(table, {}) is None  # a run without CPU times
    idle = {"cpu_per_part": {"window_s": 100.0, "parts": {"flink job": {"cpu_s": 0.5}}}}
    assert demand.background_share(table, idle) == 0.0  # never below none


def test_a_scheduler_without_a_model_is_refused_with_the_reason():
    with pytest.raises(prediction.NotModelled, match="SCHED=fifo on bare"):
        prediction.predicted(one_record(1), "bare", "fifo", QUOTA)


def test_a_table_without_threads_columns_is_one_thread_under_sched_deadline():
    # 10 ms per 100 ms: 15 ms of CPU runs 0–10, is throttled to the deadline at 100, ends at
    # 105: 90 ms more than alone
    found = [{"budget_us": 10_000, "period_us": 100_000}]
    late = prediction.predicted(one_record(15), "bare", "deadline", found)
    assert late["latency_ns"].tolist() == [(20 + 90) * MS]
