"""The adaptive campaign (search: {method: model}) against the full grid, on a stand-in harness
whose runs follow a known relation: 2 % of the records wait a uniform share of the
reservation's bound 2·(P − B), so a run's p99 is close to its base time + (P − B). The real
pipeline runs the model and the advisor in tests/integration/test_model_integration.py."""

import json
import sys
import textwrap

import pytest
import yaml
from hvbench_analysis import model
from hvbench_analysis.load import load_runs, run_dirs
from hvbench_analysis.model import advice
from hvbench_analysis.synthetic import write_run
from hvbench_harness import campaign
from test_campaign import run_args

VALUES = [10_000, 20_000, 30_000, 40_000, 50_000, 60_000, 70_000, 80_000, 90_000]
RATES = (60,)
SLO = "p99 <= 30"
RELATION = textwrap.dedent(
    """
    import numpy as np

    def latencies_ns(budget_us, rate, seed, records=2400):
        rng = np.random.default_rng(seed)
        base = (2.0 + 0.01 * rate) * rng.lognormal(0.0, 0.1, records)
        bound_ms = 2 * (100_000 - budget_us) / 1000
        waits = np.where(rng.random(records) < 0.02, rng.uniform(0, bound_ms, records), 0.0)
        return np.round((base + waits) * 1e6)
    """
)
# A stand-in run's command line: what the campaign passes (a flag for TRACE=1)
STAND_IN_ARGS = textwrap.dedent(
    """
    import argparse, pathlib, zlib
    from hvbench_analysis.synthetic import add_cpu_trace, write_run
    p = argparse.ArgumentParser()
    for o in ("--target", "--sched", "--budget", "--period", "--period-ms", "--results",
              "--work", "--run-id", "--rep", "--campaign", "--data", "--model", "--kafka-libs",
              "--connector-dir", "--records"):
        p.add_argument(o)
    p.add_argument("--trace", action="store_true")
    a = p.parse_args()
    """
)
FAKE = (
    RELATION
    + STAND_IN_ARGS
    + textwrap.dedent(
        """
    rate = 6000 / float(a.period_ms)
    seed = zlib.crc32(a.run_id.encode())
    write_run(pathlib.Path(a.results) / a.run_id, latencies_ns(int(a.budget), rate, seed),
              sched=a.sched, budget=int(a.budget), period=int(a.period), rep=int(a.rep),
              campaign=a.campaign, producer_period_ms=float(a.period_ms))
    """
    )
)
namespace: dict = {}
exec(RELATION, namespace)
latencies_ns = namespace["latencies_ns"]


def definition(max_runs=None) -> dict:
    search = {"method": "model", "slo": SLO, "knob": "budget", "values": VALUES}
    return {
        "description": "the smallest budget for p99 <= 30 ms",
        "target": "bare",
        "repetitions": 2,
        "points": [{"sched": "deadline", "period": 100_000, "rate": r} for r in RATES],
        "search": search | ({"max_runs": max_runs} if max_runs else {}),
    }


@pytest.fixture(scope="module")
def searched(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("search")
    script = tmp / "fake_run.py"
    script.write_text(FAKE)
    path = tmp / "adaptive.yml"
    path.write_text(yaml.safe_dump(definition()))
    args = run_args(tmp)
    code = campaign.run_campaign(campaign.load(path), args, harness=(sys.executable, str(script)))
    folder = tmp / "results" / "adaptive"
    return code, json.loads((folder / "campaign.json").read_text()), folder, tmp


@pytest.fixture(scope="module")
def full_grid_advice(tmp_path_factory):
    """The advice from every point at every value, as a grid campaign would give it."""
    folder = tmp_path_factory.mktemp("grid")
    for rate in RATES:
        for budget in VALUES:
            for rep in (1, 2):
                write_run(
                    folder / f"r{rate}-b{budget}-{rep}",
                    latencies_ns(budget, rate, seed=budget + rate + rep),
                    sched="deadline",
                    budget=budget,
                    period=100_000,
                    rep=rep,
                    producer_period_ms=6000 / rate,
                )
    fitted, _ = model.fit_chosen(model.run_table(load_runs(run_dirs(folder))), ("p99",))
    slo = advice.parse_slo(SLO)
    asked = {"sched": "deadline", "period": 100_000, "knob": "budget"}
    return {r: advice.advise(fitted, asked | {"rate": r}, slo, VALUES).value for r in RATES}


@pytest.mark.slow  # a whole adaptive campaign: the slow tier
def test_the_search_needs_fewer_runs_than_the_grid_for_the_same_advice(searched, full_grid_advice):
    code, index, _, _ = searched
    assert code == 0
    search = index["search"]
    assert search["grid_runs"] == len(VALUES) * len(RATES) * 2 == 18
    assert search["runs"] < search["grid_runs"]
    found = {p["settings"]["send_ms"]: p["advice"]["value"] for p in search["points"].values()}
    assert {6000 / ms: v for ms, v in found.items()} == full_grid_advice
    # the relation crosses 30 ms near B = 72.6 ms
    assert all(70_000 <= v <= 90_000 for v in found.values()), found
    # the advice and the value below it were run
    budgets = {e["settings"]["budget"] for e in index["runs"]}
    assert {v for v in found.values()} | {v - 10_000 for v in found.values()} <= budgets


@pytest.mark.slow  # a whole adaptive campaign: the slow tier
def test_the_search_keeps_every_step_and_saves_the_model_beside_the_runs(searched):
    _, index, folder, _ = searched
    search = index["search"]
    first = {e["settings"]["budget"] for e in index["runs"][:3]}
    assert first == {10_000, 50_000, 90_000}  # the ends and the middle first
    steps = search["steps"]
    assert steps[0]["runs"] == 3 and all("next" in s for s in steps[:-1])
    assert steps[-1]["advice"] == steps[-1 - search["stable"]]["advice"]  # it settled
    assert [e["status"] for e in index["runs"]] == ["done"] * search["runs"]
    doc = json.loads((folder / "model" / model.MODEL_FILE).read_text())
    assert doc["runs"] == search["runs"] and search["model"] == str(folder / "model")


@pytest.mark.slow  # a whole adaptive campaign: the slow tier
def test_a_resumed_search_replays_and_runs_nothing_again(searched):
    _, _, folder, tmp = searched
    before = json.loads((folder / "campaign.json").read_text())
    args = run_args(tmp, "--resume")
    path = tmp / "adaptive.yml"
    code = campaign.run_campaign(campaign.load(path), args, harness=("false",))  # runs nothing
    after = json.loads((folder / "campaign.json").read_text())
    assert code == 0
    assert [e["started_at"] for e in after["runs"]] == [e["started_at"] for e in before["runs"]]
    assert after["search"]["steps"] == before["search"]["steps"]


@pytest.mark.parametrize(
    ("search", "reason"),
    [
        ({"slo": "p98 <= 3"}, "SLO 'p98 <= 3'"),
        ({"knob": "quota"}, "knob must be one of budget, cap, weight"),
        ({"values": [3, 2, 1]}, "values must list at least 3 positive numbers, ascending"),
        ({"max_runs": 0}, "max_runs must be a whole number"),
        ({"rates": [1]}, "unknown key"),
    ],
)
def test_a_bad_model_search_is_refused_before_anything_runs(tmp_path, search, reason):
    doc = definition()
    doc["search"] |= search
    path = tmp_path / "bad.yml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(campaign.CampaignError, match=reason):
        campaign.load(path)


def test_a_point_that_sets_the_knob_is_refused(tmp_path):
    doc = definition()
    doc["points"][0]["budget"] = 50_000
    path = tmp_path / "bad.yml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(campaign.CampaignError, match="the model search sets budget itself"):
        campaign.load(path)


def test_the_plan_says_the_most_it_will_run_against_the_grid(tmp_path):
    path = tmp_path / "plan.yml"
    path.write_text(yaml.safe_dump(definition(max_runs=12)))
    text = campaign.describe(campaign.load(path))
    assert "model search over 9 budget values for p99 <= 30: at most 12 runs" in text
    assert "(the full grid: 18)" in text


@pytest.mark.slow  # a whole adaptive campaign: the slow tier
def test_the_report_shows_the_search_its_runs_and_its_advice(searched, tmp_path):
    from hvbench_analysis import report

    _, index, folder, _ = searched
    advised = int(index["search"]["points"]["p01"]["advice"]["value"])
    out = tmp_path / "report"
    assert report.main(["--results", str(folder), "--out", str(out)]) == 0
    page = (out / "index.html").read_text()
    assert "<h3>Model search</h3>" in page and "where the full grid takes 18" in page
    table = (out / "tables" / "campaign_model_search.md").read_text()
    assert "| p01 |" in table and f"| budget {advised} |" in table
    assert "<h2>Performance model</h2>" in page
