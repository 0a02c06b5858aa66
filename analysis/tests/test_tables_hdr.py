import numpy as np
from hdrh.histogram import HdrHistogram
from hdrh.log import HistogramLogReader
from hvbench_analysis import hdr, tables
from hvbench_analysis.load import by_run, load_runs, run_dirs, run_rows
from hvbench_analysis.synthetic import write_run

MS = 1_000_000


def with_max(max_ns: int, n: int = 100) -> np.ndarray:
    values = np.linspace(MS, max_ns * 0.5, n).astype(np.int64)
    values[n // 2] = max_ns  # the maximum in the middle of the run, as a stall would be
    return values


def test_table_4_layout_budget_and_period(tmp_path):
    write_run(
        tmp_path / "a",
        with_max(30_250_000),
        target="xen",
        sched="rtds",
        budget=50000,
        period=100000,
    )
    write_run(
        tmp_path / "b",
        with_max(12_500_000),
        target="xen",
        sched="rtds",
        budget=77500,
        period=100000,
    )
    write_run(
        tmp_path / "b2",
        with_max(14_000_001),
        target="xen",
        sched="rtds",
        budget=77500,
        period=100000,
    )  # a repetition: the table shows the larger maximum
    write_run(
        tmp_path / "c",
        with_max(9_000_000),
        target="xen",
        sched="rtds",
        budget=150000,
        period=200000,
    )
    write_run(tmp_path / "d", with_max(5_000_000), target="xen", sched="credit", cap=50)
    measured = load_runs(run_dirs(tmp_path)).measured
    # b and b2 are two runs of one configuration: the repetition columns appear; with two runs
    # the interval spans the two values
    assert tables.to_markdown(tables.max_table_budget_period(measured)) == (
        "| Scheduler | Budget (µs) | Period (µs) | Max (ms) | Runs | Mean max (ms) [95 % CI] "
        "| Mean p99 (ms) [95 % CI] |\n"
        "|---|---:|---:|---:|---:|---|---|\n"
        "| RTDS | 50000 | 100000 | 30.25 | 1 | 30.25 | 15.12 |\n"
        "| RTDS | 77500 | 100000 | 14.00 | 2 | 13.25 [12.50, 14.00] | 6.62 [6.25, 7.00] |\n"
        "| RTDS | 150000 | 200000 | 9.00 | 1 | 9.00 | 4.50 |\n"
    )
    table = tables.max_table_budget_period(measured)
    assert table["Max (ms)"].tolist() == [30.25, 14.000001, 9.0]  # CSV keeps full precision


def test_table_5_layout_cap(tmp_path):
    write_run(tmp_path / "a", with_max(40_000_000), target="xen", sched="credit", cap=25)
    write_run(tmp_path / "b", with_max(21_000_000), target="xen", sched="credit", cap=50)
    write_run(tmp_path / "c", with_max(33_000_000), target="xen", sched="credit2", cap=50)
    write_run(tmp_path / "d", with_max(1_000_000), target="xen", sched="credit")  # no cap
    measured = load_runs(run_dirs(tmp_path)).measured
    assert tables.to_markdown(tables.max_table_cap(measured)) == (
        "| Scheduler | Cap (%) | Max (ms) |\n"
        "|---|---:|---:|\n"
        "| Credit | 25 | 40.00 |\n"
        "| Credit | 50 | 21.00 |\n"
        "| Credit2 | 50 | 33.00 |\n"
    )


def test_table_6_layout_scheduler_defaults_with_several_targets(tmp_path):
    write_run(tmp_path / "a", with_max(7_000_000), target="xen", sched="credit2")
    write_run(tmp_path / "b", with_max(3_500_000), target="kvm", sched="cfs")
    write_run(tmp_path / "c", with_max(2_000_000), target="bare", sched="none")
    write_run(tmp_path / "d", with_max(99_000_000), target="xen", sched="credit2", cap=10)
    measured = load_runs(run_dirs(tmp_path)).measured
    assert tables.to_markdown(tables.max_table_scheduler(measured)) == (
        "| Scheduler | Max (ms) |\n"
        "|---|---:|\n"
        "| CFS (kvm) | 3.50 |\n"
        "| Credit2 (xen) | 7.00 |\n"
        "| default (bare) | 2.00 |\n"
    )


def test_intended_versus_actual_send(tmp_path):
    lag = np.zeros(100, np.int64)
    lag[10:20] = 40 * MS  # the producer fell 40 ms behind its schedule for ten records
    write_run(tmp_path / "a", np.full(100, 2 * MS), intended_lag_ns=lag)
    table = tables.intended_vs_actual(load_runs(run_dirs(tmp_path)).measured)
    row = table.iloc[0]
    assert row["max_ms actual"] == 2.0 and row["max_ms intended"] == 42.0
    assert row["p50_ms actual"] == row["p50_ms intended"] == 2.0


def test_percentile_table_per_run_and_config(tmp_path):
    write_run(tmp_path / "a", np.arange(1, 101) * MS, rep=1)
    write_run(tmp_path / "b", np.arange(101, 201) * MS, rep=2)
    measured = load_runs(run_dirs(tmp_path)).measured
    per_config = tables.percentile_table(measured, "config", deadline_ms=150)
    assert per_config.loc[0, "runs"] == 2 and per_config.loc[0, "count"] == 200
    assert per_config.loc[0, "max_ms"] == 200.0 and per_config.loc[0, "p50_ms"] == 100.0
    assert per_config.loc[0, "over_deadline_pct"] == 25.0
    per_run = tables.percentile_table(measured, "run")
    assert per_run["max_ms"].tolist() == [100.0, 200.0]


def test_quantized_recording_equals_recording_every_sample():
    rng = np.random.default_rng(0)
    edges = [1, 1023, 1024, 2047, 2048, 2049, 4095, 4096, 2**40 - 1, 2**40, hdr.HIGHEST_NS]
    values = np.concatenate([rng.integers(1, 5000, 2000), rng.lognormal(15, 2, 20_000), edges])
    values = values.clip(1, hdr.HIGHEST_NS).astype(np.int64)
    one_by_one = HdrHistogram(hdr.LOWEST_NS, hdr.HIGHEST_NS, hdr.DIGITS)
    for v in values.tolist():
        one_by_one.record_value(v)
    bulk = hdr.histogram(values)
    assert bulk.get_total_count() == one_by_one.get_total_count() == len(values)
    for p in (1, 50, 90, 99, 99.9, 100):
        assert bulk.get_value_at_percentile(p) == one_by_one.get_value_at_percentile(p)
    assert bulk.get_max_value() == one_by_one.get_max_value()
    assert bulk.get_min_value() == one_by_one.get_min_value()
    assert bulk.encode() == one_by_one.encode()  # the same counts, bucket by bucket


def test_interval_log_reads_back(tmp_path):
    time_s = np.arange(0, 35, 0.5)
    latency = (np.arange(len(time_s)) + 1) * MS
    path = tmp_path / "run.hlog"
    assert hdr.write_log(path, time_s, latency, start_epoch_s=1.7e9, interval_s=10) == 4
    reader = HistogramLogReader(str(path), HdrHistogram(hdr.LOWEST_NS, hdr.HIGHEST_NS, hdr.DIGITS))
    total, top = 0, 0
    while (h := reader.get_next_interval_histogram()) is not None:
        total += h.get_total_count()
        top = max(top, h.get_max_value())
    assert total == len(time_s)
    assert abs(top - latency.max()) <= latency.max() / 1000  # within 3 significant digits


def test_configurations_found_among_the_runs_are_those_of_every_sample(tmp_path):
    # runs whose tags differ in type and presence (a budget, none, a cap), interleaved by name,
    # with repetitions: the groups are those a grouping of every sample gives, in its order
    rng = np.random.default_rng(2)
    settings = [
        ("a", {"sched": "rtds", "budget": 50_000, "period": 100_000}),
        ("b", {"sched": "credit", "cap": 50}),
        ("c", {"sched": "rtds", "budget": 50_000, "period": 100_000}),
        ("d", {"sched": "credit"}),
        ("e", {"sched": "rtds", "budget": 75_000, "period": 100_000}),
    ]
    for name, tags in settings:
        write_run(tmp_path / name, rng.integers(MS, 9 * MS, 50 + len(name)), target="xen", **tags)
    measured = load_runs(run_dirs(tmp_path)).measured
    every = measured[list(tables.CONFIG)].astype(object)  # each sample's tags, not categories
    groups = every.groupby(list(tables.CONFIG), dropna=False, sort=True)
    expected = [(dict(zip(tables.CONFIG, k, strict=True)), g) for k, g in groups]
    found = tables.by_config(measured)
    assert len(found) == len(expected) == 4
    for (tags, group), (want_tags, want) in zip(found, expected, strict=True):
        assert tags.keys() == want_tags.keys()
        assert all(tags[k] == want_tags[k] or (tags[k] != tags[k] and want_tags[k] != want_tags[k])
                   for k in tags)  # fmt: skip
        assert group.index.equals(want.index)  # the same samples, in the same order
    again = tables.by_config(measured)  # kept: the very same groups, not computed again
    assert all(a[1] is b[1] for a, b in zip(again, found, strict=True))


def test_tags_of_several_kinds_are_codes_per_sample_and_their_values_per_run(tmp_path):
    # a budget, none, and the words of a neighbour: each sample holds a code, and a run's tags
    # read back are those of its meta.json (77500 an int, None where it has none)
    write_run(tmp_path / "a", np.full(30, 2 * MS), target="xen", sched="rtds", budget=77_500,
              period=100_000)  # fmt: skip
    write_run(tmp_path / "b", np.full(20, 3 * MS), target="xen", sched="credit", cap=50)
    samples = load_runs(run_dirs(tmp_path)).samples
    assert samples["budget"].dtype == "category" and samples["cap"].dtype == "category"
    rows = run_rows(samples, ("run_id", "budget", "cap", "period")).to_dict("records")
    assert rows == [
        {"run_id": "a", "budget": 77_500, "cap": None, "period": 100_000},
        {"run_id": "b", "budget": None, "cap": 50, "period": None},
    ]
    assert type(rows[0]["budget"]) is int


def test_each_runs_latencies_are_split_once_in_run_id_order(tmp_path):
    rng = np.random.default_rng(3)
    for name in ("z", "a", "m"):
        write_run(tmp_path / name, rng.integers(MS, 9 * MS, 40), target="xen", sched="credit")
    measured = load_runs(run_dirs(tmp_path)).measured
    runs = by_run(measured)
    assert [run.run_id for run in runs] == ["a", "m", "z"]
    for run, (run_id, group) in zip(runs, measured.groupby("run_id", observed=True), strict=True):
        assert run.run_id == run_id == run.tags["run_id"]
        assert np.array_equal(run.latency_ns, group["latency_ns"].to_numpy())
        assert run.tags["rep"] == group["rep"].iloc[0] and run.tags["sched"] == "credit"
    assert by_run(measured)[0].latency_ns is runs[0].latency_ns  # kept, not split again
