"""The model's `simulated` form (model/simulated.py): runs whose statistics follow what the
reservation simulator gives for their setting, from a traced reference among them, are
predicted through it, and a saved model replays the reference again to advise."""

import shutil

import numpy as np
import pandas as pd
import pytest
from hvbench_analysis import model, prediction
from hvbench_analysis.load import load_runs, run_dirs
from hvbench_analysis.synthetic import add_cpu_trace, write_run

MS = 1_000_000
BUDGETS_US = (5_500, 6_000, 7_000, 9_000, 12_000, 20_000)
RECORDS = 300


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A reference (1 ms of CPU a record, 60 records/s, 3 ms end to end) and SCHED_DEADLINE
    runs whose latencies are 1.2 × what the simulator gives for their budget, plus noise: a
    model that learns the simulator's residual needs only a constant for it."""
    folder = tmp_path_factory.mktemp("results")
    reference = add_cpu_trace(write_run(folder / "reference", np.full(RECORDS, 3 * MS)), MS)
    table = prediction.references(load_runs(run_dirs(folder)).runs)
    ref = next(iter(table.values()))
    rng = np.random.default_rng(1)
    for budget in BUDGETS_US:
        found = [{"budget_us": budget, "period_us": 100_000}]
        simulated = ref.predicted(ref.table, {"target": "bare", "sched": "deadline"}, found)
        for rep in (1, 2):
            noise = rng.normal(1.0, 0.01, len(simulated))
            latency = (1.2 * simulated * noise).astype(np.int64)
            write_run(folder / f"dl-{budget}-r{rep}", latency, sched="deadline", budget=budget,
                      period=100_000, rep=rep)  # fmt: skip
    assert reference.exists()
    return folder, load_runs(run_dirs(folder))


def test_each_run_gets_the_statistics_simulated_for_its_setting(runs):
    _, loaded = runs
    table, simulator = model.with_simulation(model.run_table(loaded), loaded.runs)
    assert simulator is not None and simulator.run_ids == ["reference"]
    by_budget = table.set_index("run_id")
    assert by_budget.loc["reference", "sim_max"] == pytest.approx(3.0)  # none: itself
    # below the knee (6 ms of work a period) the queue grows, above it nothing is added
    assert by_budget.loc["dl-5500-r1", "sim_max"] > by_budget.loc["dl-12000-r1", "sim_max"]
    assert by_budget.loc["dl-20000-r1", "sim_max"] == pytest.approx(3.0)


def test_the_simulated_form_predicts_held_out_budgets_best(runs):
    _, loaded = runs
    table, _ = model.with_simulation(model.run_table(loaded), loaded.runs)
    deadline = table[table["sched"] == "deadline"]
    forms, validation = model.choose_forms(deadline, ("p99",))
    assert forms["p99"].analytic == "simulated"
    assert validation["error_pct"].median() < 5  # the 1.2 is learned, the rest is the noise


ASKED = pd.DataFrame([{"target": "bare", "sched": "deadline", "noise": "", "rate": 60.0,
                       "budget": 8_000, "period": 100_000}])  # fmt: skip


def saved_model(loaded, references_from, out) -> model.Model:
    """A model of the runs whose p99 follows the simulator, saved to out; its references
    read from references_from."""
    table, simulator = model.with_simulation(model.run_table(loaded), loaded.runs, references_from)
    fitted = model.fit(table, forms={"p99": model.Form("simulated", 1.5)})
    fitted.simulator = simulator
    empty = pd.DataFrame(columns=model.VALIDATION_COLUMNS)
    model.save(fitted, empty, out, {"results": str(references_from), "runs": "all"})
    return fitted


def test_a_saved_model_replays_its_reference_for_new_settings(runs):
    folder, loaded = runs
    fitted = saved_model(loaded, folder, folder / "model")
    rebuilt, doc = model.load(folder / "model")
    assert doc["simulator"] == {"references": ["reference"], "results": str(folder)}
    first, again = fitted.predict(ASKED), rebuilt.predict(ASKED)
    assert np.allclose(first.to_numpy(float), again.to_numpy(float))


def test_a_model_saved_away_from_its_runs_reads_its_references_where_they_were(runs, tmp_path):
    # `hvbench model fit --out elsewhere`: the model's parent folder holds no reference
    folder, loaded = runs
    fitted = saved_model(loaded, folder, tmp_path / "elsewhere" / "model")
    rebuilt, _ = model.load(tmp_path / "elsewhere" / "model")
    assert rebuilt.simulator is not None and rebuilt.simulator.folder == folder
    assert np.allclose(
        fitted.predict(ASKED).to_numpy(float), rebuilt.predict(ASKED).to_numpy(float)
    )


def test_a_model_whose_references_are_gone_is_refused_not_predicted_without_them(runs, tmp_path):
    # before, it predicted the simulated form's constant: a p99 of about 1 ms for a budget
    # whose runs measured 96 ms
    folder, loaded = runs
    copied = tmp_path / "results"
    shutil.copytree(folder / "reference", copied / "reference")
    saved_model(loaded, copied, tmp_path / "model")
    shutil.rmtree(copied / "reference")
    with pytest.raises(model.ModelError, match=r"replays the traced runs reference, found in none"):
        model.load(tmp_path / "model")


def test_a_simulated_form_without_its_simulator_refuses_to_predict(runs):
    folder, loaded = runs
    fitted = saved_model(loaded, folder, folder / "model-without")
    fitted.simulator = None
    with pytest.raises(model.ModelError, match=r"p99 follow the simulator, and it has none"):
        fitted.predict(ASKED)
