"""A campaign's results folder through the report: repetitions at two rates, a failed run and a
rate search in campaign.json; and the parts on their own (rate tag, intervals, ECDF bands)."""

import json
import re

import numpy as np
import pandas as pd
import pytest
from hvbench_analysis import campaign, compare, figures, report, tables
from hvbench_analysis.labels import config_label
from hvbench_analysis.load import load_runs, run_dirs
from hvbench_analysis.stats import percentile, tail_levels
from hvbench_analysis.synthetic import write_run

MS = 1_000_000
RTDS = {"target": "xen", "sched": "rtds", "budget": 77500, "period": 100000}
CAP = {"target": "xen", "sched": "credit", "cap": 50}
# (run id, settings, producer period in ms, rep, maximum latency in ms)
RUNS = [
    ("p01-b77500-r1", RTDS, 100.0, 1, 10),
    ("p01-b77500-r2", RTDS, 100.0, 2, 14),
    ("p01-b77500-r3", RTDS, 100.0, 3, 18),
    ("p02-b77500-ms50-r1", RTDS, 50.0, 1, 30),
    ("p02-b77500-ms50-r2", RTDS, 50.0, 2, 40),
    ("p03-c50-r1", CAP, 100.0, 1, 20),
    ("p03-c50-r2", CAP, 100.0, 2, 24),
    ("p04-credit2-r1", {"target": "xen", "sched": "credit2"}, 100.0, 1, 7),
]
FAILED_REASON = "Flink job did not start\nlast line of its log"


def latencies(max_ms: float) -> np.ndarray:
    """1000 even steps up to a quarter of the maximum, one of them replaced by the maximum: runs
    with different maxima differ in their p99 too."""
    values = (np.arange(1, 1001) * max_ms / 4000 * MS).astype(np.int64)
    values[500] = max_ms * MS
    return values


def p99_ms(values_ns: np.ndarray) -> float:
    return float(np.sort(values_ns)[989]) / MS  # nearest rank: the 990th of 1000


def campaign_doc() -> dict:
    entries = [
        {"run_id": run_id, "point": run_id.rsplit("-", 1)[0], "rep": rep, "status": "done"}
        for run_id, _, _, rep, _ in RUNS
    ]
    entries += [
        {
            "run_id": "p01-b77500-r4",
            "point": "p01-b77500",
            "rep": 4,
            "status": "failed",
            "reason": FAILED_REASON,
            "exit_code": 2,
        },
        {"run_id": "p03-c50-r3", "point": "p03-c50", "rep": 3, "status": "pending"},
        {"run_id": "p03-c50-r4", "point": "p03-c50", "rep": 4, "status": "done"},  # no folder
    ]
    return {
        "campaign": "table4-rtds",
        "file": "campaigns/table4-rtds.yml",
        "target": "xen",
        "order": "shuffled",
        "seed": 7,
        "repetitions": 3,
        "updated_at": "2026-11-22T12:00:00+00:00",
        "runs": entries,
        "search": {
            "slo_p99_ms": 50.0,
            "method": "binary",
            "rates_per_s": [60, 120, 240],
            "points": {
                "s01-rtds-b77500": {
                    "settings": {"sched": "rtds", "budget": 77500, "period": 100000},
                    "trials": [
                        {"rate_per_s": 120.0, "run_ids": ["a", "b"], "p99_ms": [31.2, 29.8],
                         "passed": True},
                        {"rate_per_s": 240.0, "run_ids": ["c", "d"], "p99_ms": [80.5, None],
                         "passed": False},
                    ],
                    "sustainable_rate_per_s": 120.0,
                    "finished": True,
                },
                "s02-rtds-b25000": {
                    "settings": {"sched": "rtds", "budget": 25000, "period": 100000},
                    "trials": [
                        {"rate_per_s": 60.0, "run_ids": ["e"], "p99_ms": [95.0], "passed": False}
                    ],
                    "sustainable_rate_per_s": None,
                    "finished": True,
                },
                "s03-credit": {"settings": {"sched": "credit"}, "trials": [], "finished": False},
            },
        },
    }  # fmt: skip


def write_results(folder) -> None:
    for run_id, settings, period_ms, rep, max_ms in RUNS:
        write_run(
            folder / run_id,
            latencies(max_ms),
            **settings,
            rep=rep,
            campaign="table4-rtds",
            producer_period_ms=period_ms,
        )
    (folder / "logs").mkdir()
    (folder / "logs" / "p01-b77500-r4.log").write_text("make run: Flink job did not start\n")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    results = tmp_path_factory.mktemp("table4-rtds")
    write_results(results)
    (results / "campaign.json").write_text(json.dumps(campaign_doc()))
    out = results.parent / "report-table4-rtds"
    code = report.main(["--results", str(results), "--out", str(out), "--seed", "3"])
    return code, out


def mean_and_interval(text: str) -> tuple[float, float, float]:
    """ "13.25 [12.50, 14.00]" → (13.25, 12.5, 14.0)."""
    match = re.fullmatch(r"([\d.]+) \[([\d.]+), ([\d.]+)\]", text)
    assert match, text
    return tuple(float(v) for v in match.groups())


def test_max_tables_have_means_over_runs_with_intervals(built):
    code, out = built
    assert code == 0
    table = pd.read_csv(out / "tables" / "max_budget_period.csv")
    assert table.columns.tolist() == [
        "Scheduler",
        "Budget (µs)",
        "Period (µs)",
        "Rate (/s)",
        "Max (ms)",
        "Runs",
        "Mean max (ms) [95 % CI]",
        "Mean p99 (ms) [95 % CI]",
    ]
    rows = table.set_index("Rate (/s)")
    for rate, maxima in ((60, [10, 14, 18]), (120, [30, 40])):
        row = rows.loc[rate]
        assert row["Runs"] == len(maxima) and row["Max (ms)"] == max(maxima)
        mean, low, high = mean_and_interval(row["Mean max (ms) [95 % CI]"])
        assert mean == pytest.approx(np.mean(maxima))
        assert min(maxima) <= low < mean < high <= max(maxima)
        p99s = [p99_ms(latencies(m)) for m in maxima]
        mean, low, high = mean_and_interval(row["Mean p99 (ms) [95 % CI]"])
        assert mean == pytest.approx(np.mean(p99s), abs=0.005)
        assert min(p99s) - 0.005 <= low < mean < high <= max(p99s) + 0.005
    cap = pd.read_csv(out / "tables" / "max_cap.csv").iloc[0]
    assert (cap["Cap (%)"], cap["Runs"], cap["Max (ms)"]) == (50, 2, 24.0)
    assert mean_and_interval(cap["Mean max (ms) [95 % CI]"])[0] == 22.0
    # one run per configuration: the table stays as it was
    assert (out / "tables" / "max_scheduler.md").read_text() == (
        "| Scheduler | Max (ms) |\n|---|---:|\n| Credit2 | 7.00 |\n"
    )


def test_rate_separates_configurations(built):
    _, out = built
    by_config = pd.read_csv(out / "tables" / "percentiles_by_config.csv").set_index("configuration")
    assert by_config.loc["xen/rtds P100000 B77500", "runs"] == 3
    assert by_config.loc["xen/rtds P100000 B77500 @120/s", "runs"] == 2
    assert by_config.loc["xen/rtds P100000 B77500 @120/s", "max_ms"] == 40.0
    runs = pd.read_csv(out / "tables" / "runs.csv").set_index("run_id")
    assert runs.loc["p02-b77500-ms50-r1", "rate"] == 120.0
    assert runs.loc["p01-b77500-r1", "campaign"] == "table4-rtds"


def test_band_figures_are_written(built):
    _, out = built
    page = (out / "index.html").read_text()
    assert "ECDF with intervals across repetitions" in page
    assert "95 % bootstrap interval over runs of the mean of each run" in page
    for name in ("ecdf_bands_all", "ecdf_bands_xen_rtds"):
        assert (out / "figures" / f"{name}.svg").stat().st_size > 5_000, name
        assert (out / "figures" / f"{name}.svg").read_text().startswith("<?xml"), name
        assert f"figures/{name}.svg" in page


def test_campaign_section_and_tables(built):
    _, out = built
    page = (out / "index.html").read_text()
    assert page.index("<h2>Campaign</h2>") < page.index("<h2>Latency percentiles per configuration")
    assert "Campaign table4-rtds from campaigns/table4-rtds.yml: target xen, order shuffled" in page
    assert "Runs: 11 (9 done, 1 failed, 1 pending)" in page
    assert "without a run directory here: p03-c50-r4" in page
    assert "Skipped" not in page  # logs/ holds no meta.json: it is no run
    not_done = pd.read_csv(out / "tables" / "campaign_runs_not_done.csv", keep_default_na=False)
    assert not_done.to_dict("records") == [
        {
            "Run": "p01-b77500-r4",
            "Point": "p01-b77500",
            "Rep": 4,
            "Status": "failed",
            "Reason": "Flink job did not start / last line of its log",
        },
        {"Run": "p03-c50-r3", "Point": "p03-c50", "Rep": 3, "Status": "pending", "Reason": ""},
    ]
    assert "Flink job did not start / last line of its log" in page
    rates = pd.read_csv(out / "tables" / "campaign_sustainable_rate.csv").set_index("Point")
    first = rates.loc["s01-rtds-b77500"]
    assert first["Configuration"] == "xen/rtds P100000 B77500"
    assert (first["SLO p99 (ms)"], first["Method"]) == (50.0, "binary")
    assert first["Sustainable rate (/s)"] == "120"
    assert first["Trials (rate/s: p99 ms of each run)"] == (
        "120: 31.20, 29.80 pass; 240: 80.50, n/a fail"
    )
    assert rates.loc["s02-rtds-b25000", "Sustainable rate (/s)"] == "none of the rates"
    assert rates.loc["s03-credit", "Sustainable rate (/s)"] == "search unfinished"
    markdown = (out / "tables" / "campaign_sustainable_rate.md").read_text()
    assert "| s01-rtds-b77500 | xen/rtds P100000 B77500 | 50.00 | binary | 120 |" in markdown


def test_a_corrupt_campaign_file_is_flagged_and_the_report_still_builds(tmp_path):
    results = tmp_path / "results"
    for rep in (1, 2):
        write_run(results / f"r{rep}", latencies(10 + rep), **RTDS, rep=rep)
    (results / "campaign.json").write_text('{"campaign": "table4-rtds", "runs": [')
    out = tmp_path / "report"
    assert report.main(["--results", str(results), "--out", str(out)]) == 0
    page = (out / "index.html").read_text()
    assert re.search(r'<p class="flag">campaign\.json cannot be read: [^<]+</p>', page)
    assert "Mean max (ms) [95 % CI]" in (out / "tables" / "max_budget_period.md").read_text()
    assert not (out / "tables" / "campaign_runs_not_done.md").exists()


@pytest.mark.parametrize(
    "doc",
    [
        {},
        {"runs": "all of them", "search": {"points": [1, 2]}},
        {"runs": [1, None, {"status": None}], "search": {"points": {"p": {"trials": 5}}}},
        {"search": {"points": {"p": {"settings": {"budget": "big"}, "trials": [{"p99_ms": 3}]}}}},
    ],
)
def test_odd_campaign_files_do_not_break_the_tables(doc):
    campaign.summary(doc)
    campaign.runs_not_done(doc)
    campaign.sustainable_rates(doc)


def test_campaign_file_that_is_no_object(tmp_path):
    assert campaign.read_campaign(tmp_path) is None
    (tmp_path / "campaign.json").write_text("[]")
    with pytest.raises(campaign.CampaignFileError, match="not an object"):
        campaign.read_campaign(tmp_path)


def test_settings_label_reads_the_campaign_names():
    assert campaign.settings_label({"sched": "credit", "cap": 50, "send_ms": 50.0}, "xen") == (
        "xen/credit cap50 @120/s"
    )
    assert campaign.settings_label({"sched": "rtds", "budget": "big"}, "xen") == (
        "sched=rtds, budget=big"
    )


def test_rate_tag_from_the_producer_period(tmp_path):
    write_run(tmp_path / "default", np.full(12, MS))
    write_run(tmp_path / "fast", np.full(12, MS), producer_period_ms=5.0)
    old = write_run(tmp_path / "old", np.full(12, MS))
    meta = json.loads((old / "meta.json").read_text())
    del meta["requested"]["producer_period_ms"]
    (old / "meta.json").write_text(json.dumps(meta))
    runs = load_runs(run_dirs(tmp_path)).runs.set_index("run_id")
    assert runs.loc["default", "rate"] == 60.0 and runs.loc["fast", "rate"] == 1200.0
    assert pd.isna(runs.loc["old", "rate"])
    labels = {run_id: config_label(row) for run_id, row in runs.iterrows()}
    assert labels == {"default": "bare/none", "fast": "bare/none @1200/s", "old": "bare/none"}


def test_a_xen_pools_slice_and_rate_limit_tell_configurations_apart():
    row = {"target": "xen", "sched": "credit", "cap": 153, "tslice": 1000, "ratelimit": 0}
    assert config_label(row) == "xen/credit cap153 ts1000 rl0"
    assert config_label({**row, "tslice": None, "ratelimit": None}) == "xen/credit cap153"


def test_rate_column_without_repetitions(tmp_path):
    write_run(tmp_path / "a", latencies(9), **CAP)
    write_run(tmp_path / "b", latencies(12), **CAP, producer_period_ms=10.0)
    table = tables.max_table_cap(load_runs(run_dirs(tmp_path)).measured)
    assert tables.to_markdown(table) == (
        "| Scheduler | Cap (%) | Rate (/s) | Max (ms) |\n"
        "|---|---:|---|---:|\n"
        "| Credit | 50 | 60 | 9.00 |\n"
        "| Credit | 50 | 600 | 12.00 |\n"
    )


def test_intervals_are_reproducible_with_a_seed(tmp_path):
    for rep, max_ms in enumerate((10, 13, 19, 11), start=1):
        write_run(tmp_path / f"r{rep}", latencies(max_ms), **RTDS, rep=rep)
    measured = load_runs(run_dirs(tmp_path)).measured
    first = tables.max_table_budget_period(measured, seed=5)
    assert first.equals(tables.max_table_budget_period(measured, seed=5))
    mean, low, high = mean_and_interval(first.loc[0, "Mean max (ms) [95 % CI]"])
    assert mean == 13.25 and 10 <= low < mean < high <= 19


def test_identical_runs_give_a_band_of_zero_width_on_their_quantiles():
    values = np.random.default_rng(2).lognormal(1, 1, 5_000)
    levels, mean, low, high = compare.ecdf_band([values, values, values], np.random.default_rng(0))
    expected = percentile(values, levels * 100)
    np.testing.assert_allclose(mean, expected)
    np.testing.assert_allclose(low, expected)
    np.testing.assert_allclose(high, expected)
    assert levels[-1] == 1.0 and mean[-1] == values.max()


def test_band_brackets_the_mean_and_matches_the_table_interval_at_the_maximum():
    rng = np.random.default_rng(4)
    runs = [
        rng.lognormal(1, 0.5, n) * scale for n, scale in ((4000, 1.0), (3000, 1.2), (5000, 0.9))
    ]
    levels, mean, low, high = compare.ecdf_band(runs, np.random.default_rng(9))
    assert (low <= mean).all() and (mean <= high).all() and (low < high).any()
    quantiles = np.array([percentile(v, levels * 100) for v in runs])
    np.testing.assert_allclose(mean, quantiles.mean(axis=0))
    # F = 1 is each run's maximum; the same seed gives the tables' interval of the mean max
    maxima = [v.max() for v in runs]
    assert mean[-1] == pytest.approx(np.mean(maxima))
    ci = compare.bootstrap_mean_ci(np.array(maxima), np.random.default_rng(9))
    assert (low[-1], high[-1]) == pytest.approx(ci)


def test_levels_are_dense_in_the_tail():
    levels = tail_levels(1_000_000)
    assert levels[-1] == 1.0 and (np.diff(levels) > 0).all()
    assert (levels > 0.999).sum() >= 100  # the top 0.1 % is not one step of the curve
    assert levels[-2] == pytest.approx(1 - 1e-6)
    assert tail_levels(10).tolist()[-1] == 1.0 and tail_levels(10).min() == pytest.approx(0.1)


def test_band_figure_draws_single_runs_as_plain_lines():
    rng = np.random.default_rng(6)
    configs = [
        ("three runs", [rng.lognormal(np.log(5e6), 0.3, 2000) for _ in range(3)]),
        ("one run", [rng.lognormal(np.log(8e6), 0.3, 2000)]),
    ]
    fig = figures.ecdf_bands(configs, "bands")
    ax = fig.axes[0]
    assert ax.get_xscale() == "log"
    assert len(ax.collections) == 1  # one band, for the configuration with repetitions
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == [
        "three runs (3 runs, n=6,000)",
        "one run (1 run, n=2,000)",
        "95 % interval over runs",
    ]


def model_search_doc(confirmation: dict | None, confirm=2) -> dict:
    point = {"settings": {"sched": "deadline", "budget": None, "period": 100000, "send_ms": 100.0},
             "runs": ["a", "b"], "advice": {"value": 8000}}  # fmt: skip
    if confirmation is not None:
        point["confirmation"] = confirmation
    search = {"method": "model", "knob": "budget", "slo": "p99 <= 30", "values": [4000, 8000],
              "stable": 2, "reference": True, "confirm": confirm, "runs": 9, "grid_runs": 24,
              "model": "m", "points": {"p01": point}, "steps": []}  # fmt: skip
    return {"target": "bare", "search": search}


def test_the_model_search_table_says_how_the_runs_at_the_advice_confirm_it():
    held = {"needed": 2, "measured": [5.04, 13.66], "held": True}
    table = campaign.model_search_table(model_search_doc(held))
    assert table["Advice"][0] == (
        "budget 8000; confirmed: 2 runs at it met p99 <= 30 (5.04, 13.66 ms)"
    )
    missed = {"needed": 2, "measured": [12.0, 31.5], "held": False}
    table = campaign.model_search_table(model_search_doc(missed))
    assert table["Advice"][0] == (
        "budget 8000; not confirmed: 2 runs within p99 <= 30 asked for, at it: 12.00, 31.50 ms"
    )
    # one run asked for (confirm: 1), or a search recorded before confirm: the advice alone
    one = {"needed": 1, "measured": [5.0], "held": True}
    for doc in (model_search_doc(one, confirm=1), model_search_doc(None, confirm=None)):
        assert campaign.model_search_table(doc)["Advice"][0] == "budget 8000"
    text = campaign.model_search_summary(model_search_doc(held))
    assert "each point started at the simulator's advice and the value below it" in text
    assert "stayed the same over 2 more runs or was the simulator's own" in text
    assert "and 2 runs at each advice met the SLO." in text
    text = campaign.model_search_summary(model_search_doc(None, confirm="two"))
    assert "runs at each advice" not in text
