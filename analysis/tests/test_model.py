"""The performance model and the budget advisor on synthetic runs with a known relation.

Each record takes a base time that grows with the rate, and 2 % of the records also wait a
uniform share of the reservation's bound 2·(P − B): so a run's p99 is close to base + (P − B)
and its maximum close to base + 2·(P − B). The model has to find that from the runs alone.
"""

import json

import numpy as np
import pandas as pd
import pytest
from hvbench_analysis import model, report
from hvbench_analysis.load import load_runs, run_dirs
from hvbench_analysis.model import advice
from hvbench_analysis.synthetic import write_run

PERIOD_US = 100_000
BUDGETS_US = (10_000, 30_000, 50_000, 70_000, 90_000)
RATES = (60, 120)
RECORDS = 3_000


def latencies_ms(budget_us: int, rate: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    base = (2.0 + 0.01 * rate) * rng.lognormal(0.0, 0.1, RECORDS)
    bound_ms = 2 * (PERIOD_US - budget_us) / 1000
    waits = np.where(rng.random(RECORDS) < 0.02, rng.uniform(0, bound_ms, RECORDS), 0.0)
    return base + waits


def true_p99_ms(budget_us: int, rate: float) -> float:
    """The p99 of the relation, over many records."""
    records = [latencies_ms(budget_us, rate, seed) for seed in range(900, 920)]
    return float(np.percentile(np.concatenate(records), 99))


def write_grid(folder, budgets=BUDGETS_US, rates=RATES, reps=2):
    seed = 0
    for budget in budgets:
        for rate in rates:
            for rep in range(1, reps + 1):
                seed += 1
                write_run(
                    folder / f"b{budget}-r{rate}-{rep}",
                    np.round(latencies_ms(budget, rate, seed) * 1e6),
                    sched="deadline",
                    budget=budget,
                    period=PERIOD_US,
                    rep=rep,
                    producer_period_ms=6000 / rate,
                )
    return folder


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    folder = write_grid(tmp_path_factory.mktemp("grid"))
    return model.run_table(load_runs(run_dirs(folder)))


@pytest.fixture(scope="module")
def fitted(table):
    return model.fit(table)


def test_the_table_has_one_row_per_run_with_its_reservation_and_statistics(table):
    assert len(table) == len(BUDGETS_US) * len(RATES) * 2
    assert table["config"].nunique() == len(BUDGETS_US) * len(RATES)
    row = table[(table["budget"] == 30_000) & (table["rate"] == 60)].iloc[0]
    assert row["bound_ms"] == 140.0 and row["share"] == 0.3
    assert row["p50"] < row["p99"] < row["p99.9"] <= row["max"]


def test_the_inputs_are_what_varies_and_the_rest_is_held(fitted):
    assert fitted.inputs.numeric == ["rate", "share", "capacity_ms"]  # the bound: analytical
    assert fitted.inputs.fixed["sched"] == "deadline" and fitted.inputs.fixed["period"] == 1e5
    assert fitted.inputs.ranges["rate"] == (60.0, 120.0)


@pytest.mark.slow  # a model fit per held-out configuration: the slow tier
def test_held_out_configurations_are_predicted_within_a_known_error(table):
    forms, validation = model.choose_forms(table)  # as make model chooses them
    assert forms["p99"].analytic == "bound"  # the relation's tail comes from the bound
    # every configuration is held out once, but the two at the ends of the CPU reserved per
    # record (10 % at 120/s, 90 % at 60/s): the others do not reach them
    assert validation["config"].nunique() == table["config"].nunique() - 2
    summary = model.validation_summary(validation).set_index("Statistic")
    error = summary["Mean abs. error (%)"]
    # against the runs' own noisy p99 (about 60 waiting records set it) ...
    assert error["mean"] < 15 and error["p50"] < 5 and error["p99"] < 25, summary
    # ... and against the relation itself, where the held-out budget lies inside the others
    p99 = validation[validation["statistic"] == "p99"]
    inside = p99[~p99["config"].str.contains("budget=10000,|budget=90000,")]
    truth = [true_p99_ms(*setting_of(config)) for config in inside["config"]]
    assert np.allclose(inside["predicted"], truth, rtol=0.15), list(
        zip(inside["predicted"], truth, strict=True)
    )
    # the interval is for a new run, so most held-out runs fall inside it (the report shows
    # the share per statistic: held out at the edge of the budgets, a p50 can fall outside)
    within = validation["runs_within"].sum() / validation["runs"].sum()
    assert within >= 0.6, summary


def setting_of(config: str) -> tuple[int, float]:
    words = dict(part.split("=") for part in config.split(", "))
    return int(words["budget"]), float(words["rate"])


def test_the_advice_meets_the_slo_and_is_not_wasteful(fitted):
    slo = advice.parse_slo("p99 <= 30 ms")
    found = advice.advise(fitted, {"sched": "deadline", "rate": 60}, slo)
    assert found.knob == "budget" and found.searched == (10_000, 90_000)
    # the relation crosses 30 ms near B = 72.6 ms; the advice is at or above it, not far
    assert true_p99_ms(found.value, 60) <= 30
    assert 70_000 <= found.value <= 85_000
    assert found.crossing["lo"] <= found.crossing["median"] <= found.crossing["hi"] == found.value
    assert found.predicted["lo"] <= found.predicted["median"] <= found.predicted["hi"] <= 30
    assert "Smallest budget predicted to meet p99 ≤ 30 ms" in advice.advice_text(found)


def test_only_the_values_within_what_the_runs_covered_are_answerable(fitted):
    asked = {"sched": "deadline", "rate": 60}
    values = [5_000, 10_000, 50_000, 90_000, 95_000]
    assert advice.answerable(fitted, asked, values) == [10_000, 50_000, 90_000]
    assert advice.answerable(fitted, {**asked, "rate": 480}, values) == []


def test_an_slo_out_of_reach_says_so(fitted):
    found = advice.advise(fitted, {"sched": "deadline", "rate": 60}, advice.parse_slo("max<=1"))
    assert found.value is None and found.predicted is None
    assert advice.advice_text(found).startswith("No budget within the runs' 10000–90000 µs")


@pytest.mark.parametrize(
    ("asked", "reason"),
    [
        ({"sched": "deadline", "rate": 480}, "rate 480 is outside the runs' 60–120"),
        ({"sched": "rtds", "rate": 60}, "the model has no runs with sched 'rtds'"),
        ({"sched": "deadline"}, "several rate values"),
        ({"sched": "deadline", "rate": 60, "period": 50_000}, "period was 100000.0 in every run"),
    ],
)
def test_questions_outside_the_runs_are_refused(fitted, asked, reason):
    with pytest.raises(model.ModelError, match=reason):
        advice.advise(fitted, asked, advice.parse_slo("p99 <= 30"))


@pytest.mark.parametrize("text", ["p98 <= 3", "p99 >= 3", "p99 <= 0", "p99"])
def test_a_malformed_slo_is_refused(text):
    with pytest.raises(model.ModelError, match="SLO"):
        advice.parse_slo(text)


def test_a_saved_model_is_rebuilt_to_the_same_predictions(fitted, table, tmp_path):
    validation = model.validate(table)
    model.save(fitted, validation, tmp_path, {"results": "somewhere"})
    rebuilt, doc = model.load(tmp_path)
    rows = pd.DataFrame(
        [
            {"sched": "deadline", "target": "bare", "rate": r, "budget": b, "period": PERIOD_US}
            for r in (60, 90)
            for b in (20_000, 65_000)
        ]
    )
    pd.testing.assert_frame_equal(fitted.predict(rows), rebuilt.predict(rows))
    assert doc["runs"] == len(table) and doc["source"] == {"results": "somewhere"}
    assert [s["Statistic"] for s in doc["validation"]] == list(model.STATISTICS)
    assert json.loads((tmp_path / model.MODEL_FILE).read_text())["fitted"]["p99"]["theta"]


def test_a_saved_knee_is_rebuilt_with_the_same_bootstrap(table, tmp_path):
    knee = model.fit(table, forms={"p99": model.Form("knee", 0.5)})
    assert len(knee.fitted["p99"].draws) > 0
    model.save(knee, model.validate(table, knee.forms), tmp_path, {"results": "somewhere"})
    rows = pd.DataFrame([{"sched": "deadline", "target": "bare", "rate": 90, "budget": 40_000}])
    rows["period"] = PERIOD_US
    pd.testing.assert_frame_equal(knee.predict(rows), model.load(tmp_path)[0].predict(rows))


def one_input(x: np.ndarray) -> tuple[np.ndarray, pd.DataFrame]:
    """The inputs and the analytical basis of a statistic over one input, the capacity."""
    return np.log(x)[:, None], pd.DataFrame({"capacity_ms": x, "bound_ms": 0.0})


def test_runs_that_spread_more_at_some_settings_get_a_wider_interval_there():
    """Two runs per setting: above 1 ms of capacity they agree within 2 %, below it they
    differ by a factor of 3 (as near a knee). The interval follows the spread."""
    capacity = np.repeat([0.3, 0.4, 0.5, 0.6, 0.8, 1.2, 1.6, 2.4, 3.2, 4.8], 2)
    rng = np.random.default_rng(3)
    spread = np.where(capacity < 1, 0.6, 0.02)
    statistic = 4.0 * np.exp(rng.normal(0, spread))
    fitted = model.fit_statistic(*one_input(capacity), statistic, form=model.Form("none", 1.5))
    _, sd = fitted.predict_log(*one_input(np.array([0.45, 2.0])))
    assert sd[0] > 4 * sd[1], sd
    assert 0.3 < sd[0] < 1.5 and sd[1] < 0.15, sd


def test_the_knees_place_widens_the_interval_just_above_it():
    """Records queue below 1 ms of CPU per record, and runs spread by 30 %. Between the last
    capacity that queued (0.8) and the first that did not (1.2) the runs do not pin the knee:
    just above the fitted knee, the interval is wider than far above it, by the knee's
    bootstrap."""
    capacity = np.repeat([0.4, 0.6, 0.8, 1.2, 1.6, 2.4, 3.2], 2)
    rng = np.random.default_rng(1)
    queue = 2000 * np.maximum(0, 1.0 / capacity - 1)
    statistic = (3 + queue) * rng.lognormal(0, 0.3, capacity.size)
    fitted = model.fit_statistic(*one_input(capacity), statistic, form=model.Form("knee", 0.5))
    assert len(fitted.draws) == model.BOOTSTRAP
    knee = np.exp(fitted.params[2])
    assert 0.8 < knee < 1.2
    x, basis = one_input(np.array([1.02 * knee, 3.0]))
    _, sd = fitted.predict_log(x, basis)
    knees = np.std([model.analytic_of(fitted.form, d, basis) for d in fitted.draws], axis=0)
    assert knees[0] > 0.5 and knees[1] < 0.1, knees
    assert sd[0] > 3 * sd[1], sd


def test_runs_that_do_not_differ_cannot_be_modelled(tmp_path):
    write_grid(tmp_path, budgets=(50_000,), rates=(60,), reps=3)
    with pytest.raises(model.ModelError, match="differ in no setting"):
        model.fit(model.run_table(load_runs(run_dirs(tmp_path))))


@pytest.mark.slow  # a whole synthetic campaign fitted and reported: the slow tier
def test_model_fit_saves_beside_the_runs_and_the_report_shows_model_and_advice(tmp_path, capsys):
    budgets = (10_000, 30_000, 50_000, 70_000, 90_000)
    results = write_grid(tmp_path / "results", budgets=budgets, reps=1)
    assert model.main(["fit", "--results", str(results)]) == 0
    assert "held out one configuration at a time" in capsys.readouterr().out
    fitted, _ = model.load(results / "model")
    found = advice.advise(fitted, {"sched": "deadline", "rate": 60}, advice.parse_slo("p99<=30"))
    record = {"slo": found.slo, "advice": found.as_dict(), "confirm": {"make": "make run ..."}}
    (results / "model" / "advice-p99.json").write_text(json.dumps(record))
    out = tmp_path / "report"
    assert report.main(["--results", str(results), "--out", str(out)]) == 0
    page = (out / "index.html").read_text()
    assert "<h2>Performance model</h2>" in page and "Fitted to 10 runs in 10 configurations" in page
    assert "Advice (p99 ≤ 30 ms): Smallest budget predicted to meet p99 ≤ 30 ms" in page
    assert "Not verified yet: make run ..." in page
    table = (out / "tables" / "model_validation.md").read_text()
    assert "Mean abs. error (%)" in table and "| p99.9 |" in table
    assert (out / "figures" / "model_predicted_vs_measured.svg").exists()


def test_model_fit_of_a_folder_without_runs_says_why(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert model.main(["fit", "--results", str(tmp_path / "empty")]) == 1
    assert "no completed runs" in capsys.readouterr().err


def test_runs_measured_differently_are_not_pooled(table):
    mixed = table.copy()
    mixed.loc[mixed.index[:3], "records"] = 600
    with pytest.raises(model.ModelError, match="measured differently"):
        model.fit(mixed)


def test_records_an_overloaded_run_never_received_count_at_a_lower_bound(tmp_path):
    latency = np.full(1000, 5_000_000)  # 5 ms each; then 50 records never received
    requested = {"drain_s": 20}
    write_run(tmp_path / "lost", latency, sched="deadline", budget=4000, period=100_000,
              missing=50, requested=requested)  # fmt: skip
    row = model.run_table(load_runs(run_dirs(tmp_path))).iloc[0]
    assert row["censored"] == 50
    # each lost record waited at least until 20 s after the last send: 5 % of the records
    # are that late, so the p99 is, while the p50 is the received records' own
    assert (
        row["p50"] == 5.0
        and row["p99"] >= 20_000
        and row["max"] == pytest.approx(20_000 + 49 * 100 / 6)
    )
