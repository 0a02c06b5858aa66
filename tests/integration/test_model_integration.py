"""The performance model and the budget advisor on real runs: a small campaign on the bare
target under SCHED_DEADLINE (the job's threads as a constant-bandwidth server, the mechanism
of the reference study's CBS reservations) over three budgets and two rates, the model fitted
to it through `make model`, an advice asked through `make advise VERIFY=1` and the confirming
run made and checked. Marker slow: make test-testbed runs it after the testbed modules, alone
(seven real runs take two minutes, and their CPU load starves the TCG guests' boot)."""

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from hvbench_analysis import model

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
NAME = "itest-model"
BUDGETS = (10_000, 25_000, 55_000)  # three threads: admission control allows up to ~63 %
RATES = (60, 120)


def make(*words: str, timeout: float = 1800) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["make", "-s", *words], cwd=REPO, capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture(scope="module")
def advised(small_data, small_model, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("model")
    file = tmp / f"{NAME}.yml"
    points = [
        {"sched": "deadline", "budget": b, "period": 100_000, "rate": r}
        for b in BUDGETS
        for r in RATES
    ]
    settings = {"records": 360, "warmup": 1, "drain": 15}
    file.write_text(
        yaml.safe_dump(
            {
                "description": "budgets × rates for the model",
                "target": "bare",
                "repetitions": 1,
                "order": "shuffled",
                "settings": settings,
                "points": points,
            }
        )
    )
    inputs = [f"DATA_DIR={small_data[0]}", f"MODEL_DIR={small_model}", f"RESULTS={tmp}"]
    campaign = make("campaign", f"CAMPAIGN={file}", *inputs)
    fitted = make("model", f"CAMPAIGN={file}", f"RESULTS={tmp}")
    folder = tmp / NAME
    table = model.read_table(folder / "model" / model.RUNS_FILE)
    # an SLO the runs leave room for: five times the largest p99 measured
    limit = round(5 * table["p99"].max(), 1)
    advice = make(
        "advise", f"CAMPAIGN={file}", "SCHED=deadline", "RATE=60", f"SLO=p99<={limit}",
        "VERIFY=1", *inputs,
    )  # fmt: skip
    shutil.rmtree(REPO / "work" / NAME, ignore_errors=True)  # make campaign's work folder
    return campaign, fitted, advice, folder, limit


def test_the_campaign_runs_every_point(advised):
    campaign, _, _, folder, _ = advised
    assert campaign.returncode == 0, campaign.stdout[-3000:] + campaign.stderr[-3000:]
    index = json.loads((folder / "campaign.json").read_text())
    assert [e["status"] for e in index["runs"]] == ["done"] * len(BUDGETS) * len(RATES)


def test_the_model_is_fitted_validated_and_saved_with_its_inputs(advised):
    _, fitted, _, folder, _ = advised
    assert fitted.returncode == 0, fitted.stdout + fitted.stderr
    assert "held out one configuration at a time" in fitted.stdout
    doc = json.loads((folder / "model" / model.MODEL_FILE).read_text())
    assert doc["runs"] == doc["configurations"] == 6
    assert doc["inputs"]["dimensions"] == ["rate", "share", "capacity_ms"]
    assert doc["source"]["results"] == str(folder)
    validation = {row["Statistic"]: row for row in doc["validation"]}
    assert list(validation) == list(model.STATISTICS)
    # all but the two at the ends of the CPU reserved per record, which the others do not reach
    assert all(row["Configurations held out"] == 4 for row in validation.values())
    # the saved inputs rebuild the same model
    rebuilt, _ = model.load(folder / "model")
    table = model.read_table(folder / "model" / model.RUNS_FILE)
    index = json.loads((folder / "campaign.json").read_text())
    assert sorted(table["run_id"]) == sorted(e["run_id"] for e in index["runs"])
    assert (rebuilt.predict(table)["p99"] > 0).all()


def test_the_advice_is_confirmed_by_a_real_run(advised):
    _, _, advice, folder, limit = advised
    assert advice.returncode in (0, 3), advice.stdout + advice.stderr
    assert f"Smallest budget predicted to meet p99 ≤ {limit:g} ms" in advice.stdout
    record = json.loads(next((folder / "model").glob("advice-*.json")).read_text())
    value = record["advice"]["value"]
    assert BUDGETS[0] <= value <= BUDGETS[-1]
    assert f"SCHED=deadline BUDGET={int(value)} PERIOD=100000" in record["confirm"]["make"]
    assert "SEND_MS=100.0" in record["confirm"]["make"]
    checked = record["verification"]
    assert checked["state"] == "completed" and checked["exit"] == 0
    run = folder / checked["run_id"]
    meta = json.loads((run / "meta.json").read_text())
    assert meta["requested"]["budget_us"] == int(value) and meta["counts"]["accounted"]
    assert meta["requested"]["producer_period_ms"] == 100.0 and meta["requested"]["records"] == 360
    # the verdict is the run's own p99 against the SLO (whatever this shared machine gave)
    assert checked["held"] == (checked["measured_ms"] <= limit)
    assert (advice.returncode == 0) == checked["held"]
    assert f"verification {checked['run_id']}: p99" in advice.stdout
