import json

import numpy as np
import pytest
from hvbench_analysis.load import load_runs, run_dirs
from hvbench_analysis.stats import ecdf_points, over_deadline_pct, summarize
from hvbench_analysis.synthetic import write_run
from hvbench_analysis.tags import TAGS

MS = 1_000_000


def test_runs_load_into_one_table_with_tags_and_warmup_excluded(tmp_path):
    write_run(
        tmp_path / "a", np.arange(1, 101) * MS, sched="rtds", budget=77500, period=100000, warmup=7
    )
    write_run(tmp_path / "b", np.full(50, 3 * MS), sched="credit", cap=50)
    runs = load_runs(run_dirs(tmp_path))
    assert set(TAGS) <= set(runs.samples.columns)
    assert len(runs.samples) == 150  # the 7 warm-up rows are left out
    a = runs.samples[runs.samples["run_id"] == "a"]
    assert a["latency_ns"].tolist() == list(np.arange(1, 101) * MS)
    assert (a["sched"] == "rtds").all() and (a["budget"] == 77500).all()
    assert (runs.samples[runs.samples["run_id"] == "b"]["cap"] == 50).all()
    assert runs.samples["latency_ns"].dtype == np.int64
    with_warmup = load_runs(run_dirs(tmp_path), include_warmup=True)
    assert len(with_warmup.samples) == 157 and with_warmup.samples["warmup"].sum() == 7
    assert len(with_warmup.measured) == 150


def test_missing_records_are_not_samples_and_the_run_is_flagged(tmp_path):
    write_run(tmp_path / "lossy", np.full(10, MS), missing=3)
    runs = load_runs([tmp_path / "lossy"])
    assert len(runs.samples) == 10
    assert runs.runs.loc[0, "missing"] == 3
    assert "unaccounted" in runs.runs.loc[0, "problems"]


def test_malformed_runs_are_reported_by_name_and_skipped(tmp_path):
    write_run(tmp_path / "good", np.full(10, MS))
    (tmp_path / "no-meta").mkdir()
    (tmp_path / "no-meta" / "samples.csv").write_text("x\n1\n")
    bad_json = write_run(tmp_path / "bad-json", np.full(10, MS))
    (bad_json / "meta.json").write_text("{not json")
    no_column = write_run(tmp_path / "no-column", np.full(10, MS))
    text = (no_column / "samples.csv").read_text().replace("latency_ns", "lat")
    (no_column / "samples.csv").write_text(text)
    bad_value = write_run(tmp_path / "bad-value", np.full(10, MS))
    lines = (bad_value / "samples.csv").read_text().splitlines()
    lines[3] = lines[3].replace(",1000000,", ",fast,", 1)
    (bad_value / "samples.csv").write_text("\n".join(lines) + "\n")
    no_target = write_run(tmp_path / "no-target", np.full(10, MS))
    meta = json.loads((no_target / "meta.json").read_text())
    del meta["requested"]["target"]
    (no_target / "meta.json").write_text(json.dumps(meta))
    runs = load_runs([*run_dirs(tmp_path), tmp_path / "absent"])
    assert runs.runs["run_id"].tolist() == ["good"]
    reasons = dict(runs.skipped)
    assert reasons["no-meta"] == "no meta.json"
    assert "not valid JSON" in reasons["bad-json"]
    assert "lacks column(s) latency_ns" in reasons["no-column"]
    assert "malformed values" in reasons["bad-value"]
    assert "target" in reasons["no-target"]
    assert reasons["absent"] == "no such run directory"


def test_runs_can_be_picked_by_name_or_glob(tmp_path):
    for name in ("rtds-1", "rtds-2", "credit-1"):
        write_run(tmp_path / name, np.full(5, MS))
    assert [p.name for p in run_dirs(tmp_path, ["rtds-*"])] == ["rtds-1", "rtds-2"]
    assert [p.name for p in run_dirs(tmp_path, ["credit-1", "rtds-2"])] == ["credit-1", "rtds-2"]


def test_repetitions_are_numbered_per_configuration_by_start_time(tmp_path):
    write_run(tmp_path / "x2", np.full(5, MS), started_at="2026-01-02T00:00:00+00:00")
    write_run(tmp_path / "x1", np.full(5, MS), started_at="2026-01-01T00:00:00+00:00")
    write_run(tmp_path / "y", np.full(5, MS), sched="deadline", budget=1, period=2)
    write_run(tmp_path / "z", np.full(5, MS), rep=7)
    runs = load_runs(run_dirs(tmp_path)).runs.set_index("run_id")
    assert runs.loc["x1", "rep"] == 1 and runs.loc["x2", "rep"] == 2
    assert runs.loc["y", "rep"] == 1 and runs.loc["z", "rep"] == 7


def test_percentiles_are_nearest_rank_and_the_maximum_is_the_raw_sample():
    values = np.arange(1, 1001) * MS  # 1 … 1000 ms
    values[-1] = 1_234_567_891  # a raw maximum no bucket would keep
    s = summarize(values)
    assert s["count"] == 1000 and s["min_ms"] == 1.0
    assert (s["p50_ms"], s["p90_ms"], s["p99_ms"], s["p99.9_ms"]) == (500.0, 900.0, 990.0, 999.0)
    assert s["p99.99_ms"] == s["max_ms"] == 1234.567891
    assert s["mean_ms"] == pytest.approx(np.mean(values) / MS)
    assert s["sd_ms"] == pytest.approx(np.std(values / MS, ddof=1))


def test_share_over_a_deadline():
    values = np.array([1, 2, 3, 50, 51, 100]) * MS
    assert over_deadline_pct(values, 50) == pytest.approx(100 * 2 / 6)  # 50 ms is on time
    assert summarize(values, deadline_ms=2.5)["over_deadline_pct"] == pytest.approx(400 / 6)


def test_ecdf_points_keep_the_extremes_and_stay_small():
    rng = np.random.default_rng(1)
    values = rng.lognormal(1, 1, 1_000_000)
    x, f = ecdf_points(values)
    assert len(x) < 4_000
    assert x[0] == values.min() and x[-1] == values.max() and f[-1] == 1.0
    assert (np.diff(x) >= 0).all() and (np.diff(f) > 0).all()
    # each kept point is a true ECDF point
    i = len(x) // 3
    assert f[i] == pytest.approx(np.mean(values <= x[i]))
    small_x, small_f = ecdf_points(np.array([3.0, 1.0, 2.0]))
    assert small_x.tolist() == [1.0, 2.0, 3.0] and small_f.tolist() == [1 / 3, 2 / 3, 1.0]
