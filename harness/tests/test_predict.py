"""A setting's latencies predicted from a traced run's demands (hvbench_analysis.prediction), on
records laid out by hand."""

import numpy as np
import pandas as pd
import pytest
from hvbench_agent.sched import Refused, validate
from hvbench_analysis import prediction, results
from hvbench_analysis.synthetic import add_cpu_trace, write_run
from hvbench_harness import predict

MS = 1_000_000


def records() -> pd.DataFrame:
    """Two records 100 ms apart, each 30 ms of CPU (20 on thread 1, 10 on thread 2), 35 ms of
    latency measured unconstrained."""
    return pd.DataFrame(
        {"detector": ["a", "a"], "seq": [0, 1], "sent_ns": [0, 100 * MS],
         "received_ns": [35 * MS, 135 * MS], "latency_ns": [35 * MS, 35 * MS],
         "from_ns": [1 * MS, 101 * MS], "cpu_ns": [30 * MS, 30 * MS],
         "cpu_ns:1": [20 * MS, 20 * MS], "cpu_ns:2": [10 * MS, 10 * MS]}
    )  # fmt: skip


def test_no_reservation_predicts_what_was_measured():
    out = predict.predicted(records(), "bare", validate("linux", "none"))
    assert out["latency_ns"].tolist() == [35 * MS, 35 * MS]


def test_a_quota_below_the_demand_adds_the_wait_for_the_next_period():
    # 20 ms per 100 ms for the threads together: 30 ms of CPU from 1 ms runs 1–21 (period
    # 0–100), waits for 100, runs 100–110: done at 110 instead of 31, 79 ms more
    setting = validate("linux", "cfs-quota", budget_us=20_000, period_us=100_000)
    out = predict.predicted(records().iloc[:1], "bare", setting)
    assert out["latency_ns"].tolist() == [(35 + 79) * MS]


def test_sched_deadline_on_each_thread_adds_each_threads_delay():
    # 15 ms per 100 ms on each thread: thread 1's 20 ms wait for its deadline (85 ms more),
    # thread 2's 10 ms fit; the threads in series: 85 ms more
    setting = validate("linux", "deadline", budget_us=15_000, period_us=100_000)
    out = predict.predicted(records().iloc[:1], "bare", setting)
    assert out["latency_ns"].tolist() == [(35 + 85) * MS]


def test_statistics_and_the_share_over_the_deadline():
    row = prediction.statistics([10 * MS, 20 * MS, 30 * MS, 40 * MS], deadline_ms=25)
    assert row["max"] == 40.0 and row["p50"] == 20.0 and row["over 25 ms (%)"] == 50.0  # rank


def test_a_cap_over_one_cpu_is_split_over_the_domains_vcpus_under_credit_only():
    # one record of 200 ms of CPU. Credit: cap 153 over two active vCPUs is 76 each, which
    # parks the vCPU on the way; over one vCPU it caps nothing. Credit2's budget is the
    # domain's: 153 % of a period never runs out for one vCPU
    heavy = records().iloc[:1].assign(cpu_ns=200 * MS, latency_ns=205 * MS)
    one = predict.predicted(heavy, "xen", validate("xen", "credit", cap=153), vcpus=1)
    two = predict.predicted(heavy, "xen", validate("xen", "credit", cap=153), vcpus=2)
    credit2 = predict.predicted(heavy, "xen", validate("xen", "credit2", cap=153), vcpus=2)
    assert one["latency_ns"].tolist() == credit2["latency_ns"].tolist() == [205 * MS]
    assert two["latency_ns"].iloc[0] > 205 * MS


def test_a_run_without_a_trace_is_refused_saying_how_to_make_one(tmp_path, capsys):
    write_run(tmp_path / "r0", np.full(20, 2 * MS))
    args = ["--run", str(tmp_path / "r0"), "--sched", "deadline", "--budget", "20000"]
    assert predict.main(args) == 1
    assert "has no trace to read (make run TRACE=1)" in capsys.readouterr().err


def test_a_bad_setting_is_refused_before_anything_is_simulated():
    with pytest.raises(Refused, match="unknown SCHED"):
        predict.settings(predict.parse_args(["--run", "x", "--sched", "dedline"]), "bare")


def test_a_grid_with_one_output_file_is_refused(capsys):
    args = ["--run", "x", "--sched", "deadline", "--budgets", "1000,2000", "--out", "p.csv"]
    assert predict.main(args) == 2
    assert "--out takes one setting" in capsys.readouterr().err


def test_credit_beside_a_busy_neighbour_takes_the_weights_from_the_command_line():
    # one record of 100 ms of CPU beside a busy vCPU of the same weight, the accounting from
    # its window's start: done 161 ms after it (worked out in test_credit.py), 61 ms more
    heavy = records().iloc[:1].assign(cpu_ns=100 * MS, latency_ns=105 * MS)
    setting = validate("xen", "credit")
    alone = predict.predicted(heavy, "xen", setting)
    beside = predict.predicted(heavy, "xen", setting, beside=(256,))
    assert alone["latency_ns"].tolist() == [105 * MS]
    assert beside["latency_ns"].tolist() == [(105 + 61) * MS]
    args = predict.parse_args(["--run", "x", "--sched", "credit", "--beside", "256,512"])
    assert args.beside == (256, 512)


def test_rtds_beside_busy_neighbours_replays_them_on_one_cpu_first_at_equal_periods():
    # one record of 30 ms of CPU at 1 ms, ours 30 per 100 ms; a busy neighbour 50 per 100 ms,
    # first at equal periods, runs 0–50: ours waits from 1 to 50, done at 80 (alone, 31)
    heavy = records().iloc[:1].assign(cpu_ns=30 * MS, latency_ns=35 * MS)
    setting = validate("xen", "rtds", budget_us=30_000, period_us=100_000, extratime=0)
    found = predict.parse_args(["--run", "x", "--sched", "rtds", "--beside", "50000/100000"])
    assert found.beside == ({"budget_us": 50_000, "period_us": 100_000, "extratime": False},)
    out = predict.predicted(heavy, "xen", setting, beside=found.beside)
    assert out["latency_ns"].tolist() == [(35 + 49) * MS]
    over = ({"budget_us": 80_000, "period_us": 100_000, "extratime": True},)
    with pytest.raises(ValueError, match="more than one CPU"):
        predict.predicted(heavy, "xen", setting, beside=over)


def test_rtds_on_a_pool_of_two_cpus_runs_beside_its_busy_neighbour():
    # the record and neighbour above, on a pool of two CPUs (--cpus 2): ours runs at once on
    # the other CPU (alone: 35 ms); beside two such neighbours it waits until 50 again
    heavy = records().iloc[:1].assign(cpu_ns=30 * MS, latency_ns=35 * MS)
    setting = validate("xen", "rtds", budget_us=30_000, period_us=100_000, extratime=0)
    args = ["--run", "x", "--sched", "rtds", "--beside", "50000/100000", "--cpus", "2"]
    found = predict.parse_args(args)
    out = predict.predicted(heavy, "xen", setting, beside=found.beside, cpus=found.cpus)
    assert out["latency_ns"].tolist() == [35 * MS]
    two = found.beside * 2
    out = predict.predicted(heavy, "xen", setting, beside=two, cpus=2)
    assert out["latency_ns"].tolist() == [(35 + 49) * MS]


def test_several_cpus_are_refused_where_they_have_no_model():
    setting = validate("xen", "credit", cap=50)
    with pytest.raises(prediction.NotModelled, match="RTDS beside neighbours"):
        predict.predicted(records(), "xen", setting, beside=(256,), cpus=2)
    rtds = validate("xen", "rtds", budget_us=30_000, period_us=100_000, extratime=0)
    with pytest.raises(prediction.NotModelled, match="RTDS beside neighbours"):
        predict.predicted(records(), "xen", rtds, cpus=2)  # alone: no neighbours to share
    for bad in ("0", "-1", "two"):
        with pytest.raises(SystemExit):
            predict.parse_args(["--run", "x", "--sched", "rtds", "--cpus", bad])


def test_an_rtds_neighbour_with_periodic_work_is_read_and_replayed():
    # the record of 30 ms as above; the neighbour's 10 ms of work comes with our first record
    # and every 40 ms after: it runs first (its deadline), ours after it, 10 ms later than
    # alone (beside the always-busy neighbour above: 49 ms later)
    heavy = records().iloc[:1].assign(cpu_ns=30 * MS, latency_ns=35 * MS)
    setting = validate("xen", "rtds", budget_us=30_000, period_us=100_000, extratime=0)
    text = "50000/100000:10000/40000"
    found = predict.parse_args(["--run", "x", "--sched", "rtds", "--beside", text])
    assert found.beside == (
        {"budget_us": 50_000, "period_us": 100_000, "extratime": False, "work_us": 10_000,
         "every_us": 40_000},
    )  # fmt: skip
    out = predict.predicted(heavy, "xen", setting, beside=found.beside)
    assert out["latency_ns"].tolist() == [(35 + 10) * MS]


def test_a_credit_neighbour_with_periodic_work_is_read_and_replayed():
    # the neighbour runs 5 ms of every 25 ms from the accounting's start; one record of 3 ms
    # at 26 ms waits for the neighbour's work released at 25 ms: done at 33 ms (test_credit.py)
    found = predict.parse_args(["--run", "x", "--sched", "credit", "--beside", "256:5000/25000"])
    assert found.beside == ({"weight": 256, "work_us": 5_000, "period_us": 25_000},)
    serve = prediction.server("credit", {"beside": list(found.beside)})
    assert serve(np.array([0, 26 * MS]), np.array([0, 3 * MS])).tolist() == [0, 33 * MS]


@pytest.mark.parametrize(
    "text",
    ["256;rm", "0", "50000/100000/2", "9/8", "1/2/3/4", "../x", "", "256:", "256:9/8",
     "256:0/10", "0:1/2", "256:1/2/3", "x:1/2", "5/10:6/5", "5/10:0/5", "5/10:1/2/3",
     "5/10/2:1/2"],
)  # fmt: skip
def test_bad_neighbours_are_refused_naming_them(text, capsys):
    with pytest.raises(SystemExit):
        predict.parse_args(["--run", "x", "--sched", "rtds", "--beside", text])
    assert "argument --beside" in capsys.readouterr().err


def test_the_output_says_how_the_setting_serves_the_records(tmp_path, capsys):
    # a traced run whose one thread runs 3 ms of each record; as a testbed's trace names it,
    # the thread is the real-time VM's vCPU 0
    run = add_cpu_trace(write_run(tmp_path / "r0", np.full(40, 5 * MS)), 3 * MS)
    args = ["--run", str(run), "--sched", "deadline", "--budget", "20000", "--period", "100000"]
    assert predict.main(args) == 0
    assert "Served by a server per job thread (1), their delays added." in capsys.readouterr().out
    meta = results.read_meta(run)
    meta["trace"]["threads"] = {"100": "CPU 0/KVM"}
    results.rewrite_meta(run, meta)
    assert predict.main([*args, "--target", "kvm"]) == 0
    assert "Served by a server per vCPU (0), their delays added." in capsys.readouterr().out
    assert predict.main([*args[:3], "credit", "--cap", "50", "--target", "xen"]) == 0
    assert "Served by one server for the job's CPU time." in capsys.readouterr().out
