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


def two_records(cpu_ms: int) -> pd.DataFrame:
    """Two records 1 ms apart: the second arrives while the first is served."""
    return pd.DataFrame(
        {"detector": ["a", "a"], "seq": [0, 1], "sent_ns": [0, MS],
         "received_ns": [(cpu_ms + 5) * MS, (2 * cpu_ms + 5) * MS],
         "latency_ns": [(cpu_ms + 5) * MS, (2 * cpu_ms + 4) * MS], "from_ns": [0, MS],
         "cpu_ns": [cpu_ms * MS, cpu_ms * MS]}
    )  # fmt: skip


def test_a_record_behind_another_needs_the_queued_share_of_its_demand():
    """10 ms per 100 ms, 15 ms a record: the first runs 0–10 and 100–105; the second, behind
    it, needs 15 ms (105–110 and 200–210) or a fifth of that (105–108). Without a reservation
    it is done at 30 ms, or at 18 ms with the queued share."""
    found = [{"budget_us": 10_000, "period_us": 100_000}]
    table = two_records(15)
    alone = prediction.predicted(table, "bare", "deadline", found)["latency_ns"]
    shared = prediction.predicted(table, "bare", "deadline", found, queued_share=0.2)
    assert alone.tolist() == [(20 + 90) * MS, (34 + 180) * MS]
    assert shared["latency_ns"].tolist() == [(20 + 90) * MS, (34 + 90) * MS]


def test_the_queued_share_is_measured_in_held_back_runs_with_enough_queued_records():
    reference = pd.DataFrame({"cpu_ns": [2 * MS] * 10})
    held = pd.DataFrame({"sent_ns": range(200), "from_ns": [s + (s % 2) for s in range(200)],
                         "cpu_ns": [MS // 2 if s % 2 else 3 * MS for s in range(200)]})  # fmt: skip
    assert prediction.held_back_share([held], reference) == pytest.approx(0.25)  # 0.5 of 2
    assert prediction.held_back_share([held.iloc[:150]], reference) is None  # 75 queued
    assert prediction.held_back_share([], reference) is None


def on_two_vcpus() -> pd.DataFrame:
    """One record from 0: 30 ms of CPU on vCPU 0, 10 ms on vCPU 1, 45 ms measured."""
    return one_record(40).assign(
        latency_ns=45 * MS, **{"vcpu_ns:0": [30 * MS], "vcpu_ns:1": [10 * MS]}
    )


def test_each_vcpu_is_its_own_server_and_their_delays_add_up():
    # 15 ms per 100 ms on each vCPU: vCPU 0's 30 ms run 0–15 and 100–115 (85 ms more than
    # alone), vCPU 1's 10 ms fit. One server for the 40 ms together would run them 0–15,
    # 100–115 and 200–210: 170 ms more
    each = [{"budget_us": 15_000, "period_us": 100_000}]
    for target, sched in (("kvm", "deadline"), ("kvm", "cfs"), ("xen", "rtds")):
        late = prediction.predicted(on_two_vcpus(), target, sched, each)
        assert late["latency_ns"].tolist() == [(45 + 85) * MS], (target, sched)
    summed = prediction.predicted(on_two_vcpus().drop(columns=["vcpu_ns:0", "vcpu_ns:1"]),
                                  "kvm", "deadline", each)  # fmt: skip
    assert summed["latency_ns"].tolist() == [(45 + 170) * MS]


def test_each_vcpu_is_served_by_its_own_reservation_as_read_back():
    # read back in another order: vCPU 0 has 15 ms (its 30 ms wait: 85 ms more), vCPU 1 35 ms
    found = [{"budget_us": 35_000, "period_us": 100_000, "vcpu": 1},
             {"budget_us": 15_000, "period_us": 100_000, "vcpu": 0}]  # fmt: skip
    late = prediction.predicted(on_two_vcpus(), "kvm", "deadline", found)
    assert late["latency_ns"].tolist() == [(45 + 85) * MS]
    # only vCPU 1 under SCHED_DEADLINE: vCPU 0 has no reservation and adds nothing
    late = prediction.predicted(on_two_vcpus(), "kvm", "deadline", found[:1])
    assert late["latency_ns"].tolist() == [45 * MS]
    served = prediction.served(on_two_vcpus(), "kvm", "deadline", found)
    assert served == [("vcpu_ns:0", found[1]), ("vcpu_ns:1", found[0])]
    # a reference of other vCPUs than those read back: refused, not served by none
    other = [{**found[0], "vcpu": 3}]
    with pytest.raises(
        prediction.NotModelled, match=r"vCPUs \(0, 1\) are none of those read back \(3\)"
    ):
        prediction.predicted(on_two_vcpus(), "kvm", "deadline", other)


def test_a_domains_cap_and_neighbours_serve_the_jobs_cpu_time_together():
    cap = [{"cap": 50}]
    assert prediction.served(on_two_vcpus(), "xen", "credit", cap) == [("cpu_ns", cap[0])]
    beside = [{"budget_us": 15_000, "period_us": 100_000, "beside": [{"budget_us": 1}]}]
    assert prediction.served(on_two_vcpus(), "xen", "rtds", beside) == [("cpu_ns", beside[0])]
