"""The adaptive campaign that starts from the simulator (search: {reference: true}), on a
stand-in harness: a traced run without a reservation is each rate's reference (4 ms of CPU a
record, 5 ms end to end), and a SCHED_DEADLINE run's latencies are 1.15 × what the reservation
simulator gives for its budget from that reference. The full grid of 32 runs against the
search, which must reach the same advice with at most a third of them, each advice confirmed
by a second run."""

import json
import sys
import textwrap
from types import SimpleNamespace

import pytest
import yaml
from hvbench_analysis import model
from hvbench_analysis.load import load_runs, run_dirs
from hvbench_analysis.model import advice
from hvbench_harness import campaign
from hvbench_harness.campaign import model_search
from hvbench_harness.campaign.file import ModelSearch
from test_campaign import run_args
from test_model_search import STAND_IN_ARGS

VALUES = [10_000, 20_000, 30_000, 40_000, 50_000, 60_000, 70_000, 80_000]
RATES = (60, 120)
SLO = "p99 <= 30"
RELATION = textwrap.dedent(
    """
    import numpy as np
    import pandas as pd
    from hvbench_analysis import prediction

    MS, RECORDS = 1_000_000, 600

    def deadline_latencies_ns(budget_us, period_ms, seed):
        sent = np.arange(RECORDS, dtype=np.int64) * round(period_ms * 1e6 / 6)
        table = pd.DataFrame({"detector": "d", "seq": np.arange(RECORDS), "sent_ns": sent,
                              "from_ns": sent, "cpu_ns": 4 * MS, "latency_ns": 5 * MS})
        found = [{"budget_us": budget_us, "period_us": 100_000}]
        late = prediction.predicted(table, "bare", "deadline", found)["latency_ns"]
        noise = np.random.default_rng(seed).normal(1.0, 0.01, RECORDS)
        return np.round(1.15 * late.to_numpy() * noise).astype(np.int64)
    """
)
FAKE = (
    RELATION
    + STAND_IN_ARGS
    + textwrap.dedent(
        """
    where, period_ms = pathlib.Path(a.results) / a.run_id, float(a.period_ms)
    common = {"rep": int(a.rep), "campaign": a.campaign, "producer_period_ms": period_ms}
    if a.sched == "none":  # the reference: 4 ms of CPU a record, 5 ms end to end
        write_run(where, np.full(RECORDS, 5 * MS), requested={"trace": True}, **common)
        add_cpu_trace(where, 4 * MS)
    else:
        latency = deadline_latencies_ns(int(a.budget), period_ms, zlib.crc32(a.run_id.encode()))
        write_run(where, latency, sched=a.sched, budget=int(a.budget), period=int(a.period),
                  **common)
    """
    )
)
namespace: dict = {}
exec(RELATION, namespace)


def definition() -> dict:
    search = {"method": "model", "slo": SLO, "knob": "budget", "values": VALUES,
              "reference": True, "confirm": 2}  # fmt: skip
    return {
        "description": "the smallest budget for p99 <= 30 ms, from the simulator",
        "target": "bare",
        "repetitions": 2,
        "points": [{"sched": "deadline", "period": 100_000, "rate": r} for r in RATES],
        "search": search,
    }


@pytest.fixture(scope="module")
def searched(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("search")
    script = tmp / "fake_run.py"
    script.write_text(FAKE)
    path = tmp / "from-simulator.yml"
    path.write_text(yaml.safe_dump(definition()))
    code = campaign.run_campaign(
        campaign.load(path), run_args(tmp), harness=(sys.executable, str(script))
    )
    folder = tmp / "results" / "from-simulator"
    return code, json.loads((folder / "campaign.json").read_text()), folder


def full_grid_advice(folder) -> dict:
    """The advice from every point at every value (the grid), with the same references."""
    latencies = namespace["deadline_latencies_ns"]
    from hvbench_analysis.synthetic import write_run

    for rate in RATES:
        for budget in VALUES:
            for rep in (1, 2):
                write_run(folder / f"grid-r{rate}-b{budget}-{rep}",
                          latencies(budget, 6000 / rate, seed=budget + rate + rep),
                          sched="deadline", budget=budget, period=100_000, rep=rep,
                          producer_period_ms=6000 / rate)  # fmt: skip
    runs = load_runs(run_dirs(folder, ["grid-*"]))
    traced = load_runs(run_dirs(folder, ["reference-*"])).runs
    table, simulator = model.with_simulation(model.run_table(runs), traced)
    fitted = model.fit_chosen(table, ("p99",))[0]
    fitted.simulator = simulator
    asked = {"sched": "deadline", "period": 100_000, "knob": "budget", "target": "bare"}
    slo = advice.parse_slo(SLO)
    return {r: advice.advise(fitted, asked | {"rate": r}, slo, VALUES).value for r in RATES}


@pytest.mark.slow  # a whole adaptive campaign: the slow tier
def test_from_the_simulator_the_search_reaches_the_grids_advice_in_a_third_of_its_runs(searched):
    code, index, folder = searched
    assert code == 0
    search = index["search"]
    assert search["grid_runs"] == len(VALUES) * len(RATES) * 2 == 32
    assert search["runs"] <= search["grid_runs"] / 3, search["runs"]  # the references counted
    found = {6000 / p["settings"]["send_ms"]: p["advice"]["value"]
             for p in search["points"].values()}  # fmt: skip
    assert found == full_grid_advice(folder)
    for point in search["points"].values():  # confirm: 2, each advice ran twice and held
        confirmation = point["confirmation"]
        assert confirmation["held"] and len(confirmation["measured"]) == 2, confirmation
        assert max(confirmation["measured"]) <= 30


@pytest.mark.slow  # a whole adaptive campaign: the slow tier
def test_the_references_run_first_and_each_point_starts_at_the_simulated_advice(searched):
    _, index, _ = searched
    first = index["runs"][: len(RATES)]
    assert [e["settings"]["sched"] for e in first] == ["none"] * len(RATES)
    assert all(e["settings"]["trace"] is True for e in first)
    search = index["search"]
    assert search["references"] == [e["run_id"] for e in first]
    for point, values in search["simulated_start"].items():
        budgets = [e["settings"]["budget"] for e in index["runs"] if e["run_id"].startswith(point)]
        assert budgets[: len(values)] == values  # the simulator's advice, then the one below


def test_reference_must_be_true_or_false(tmp_path):
    doc = definition()
    doc["search"]["reference"] = "yes"
    path = tmp_path / "bad.yml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(campaign.CampaignError, match="reference must be true or false"):
        campaign.load(path)


def search_at(
    tried: dict, measured: dict, repetitions: int = 1, confirm: int = 1
) -> tuple[model_search.Search, SimpleNamespace]:
    """A search of one point with these runs done (value → runs, value → their p99)."""
    point = SimpleNamespace(id="p01")
    found = ModelSearch(slo=SLO, knob="budget", values=VALUES, max_runs=None, reference=True,
                        confirm=confirm)  # fmt: skip
    plan = SimpleNamespace(search=found, points=[point], repetitions=repetitions, target="bare")
    runner = SimpleNamespace(campaign=plan, index=SimpleNamespace(doc={"search": {}}))
    search = model_search.Search(runner, log=print)
    search.tried = {("p01", v): n for v, n in tried.items()}
    search.measured = {("p01", v): found for v, found in measured.items()}
    return search, point


def test_without_an_advice_the_search_climbs_above_its_largest_run():
    # the simulator advised 30 ms and both runs from there missed the SLO: nothing the model
    # can answer for meets it, so the next run is the next value above, up to the largest
    search, point = search_at({20_000: 1, 30_000: 1}, {20_000: [90.0], 30_000: [45.0]})
    for advised in (None, "uncertain"):
        assert not search.bracketed(point, advised)
        assert search.to_measure(point, advised) == 40_000
    search.tried[("p01", 80_000)] = 1
    assert search.bracketed(point, None) and search.to_measure(point, None) is None


def test_an_advice_is_bracketed_by_a_miss_below_it_or_the_value_below_runs_next():
    search, point = search_at({20_000: 1, 30_000: 1}, {20_000: [45.0], 30_000: [12.0]})
    assert search.bracketed(point, 30_000) and search.to_measure(point, 30_000) is None
    # both starts met the SLO: the advice at the lower one lacks a run below it
    search, point = search_at({20_000: 1, 30_000: 1}, {20_000: [25.0], 30_000: [12.0]})
    assert not search.bracketed(point, 20_000) and search.to_measure(point, 20_000) == 10_000


def test_the_simulators_advice_bracketed_by_runs_settles_the_search_at_once():
    # the simulator advised 30 ms from the references; the runs at 30 and 20 ms (met, missed)
    # make it the model's advice too: two sources agree, no more runs for stability
    search, _ = search_at({20_000: 1, 30_000: 1}, {20_000: [45.0], 30_000: [12.0]})
    search.simulated = {"p01": 30_000}
    search.record["steps"] = [{"runs": 2, "advice": {"p01": 30_000.0}}]
    assert search.settled()
    search.simulated = {"p01": 40_000}  # they differ: the advice must stay over `stable` runs
    assert not search.settled()
    search.record["steps"] = [{"runs": n, "advice": {"p01": 30_000.0}} for n in (2, 3, 4)]
    assert search.settled()
    search.record["steps"][-1] = {"runs": 5, "advice": {"p01": "uncertain"}}
    search.simulated = {"p01": 30_000}
    assert not search.settled()  # an advice not known never settles


def test_where_the_runs_and_the_simulator_disagree_the_smaller_value_runs_again():
    ran, measured = {10_000: 1, 20_000: 1, 30_000: 1}, {10_000: [90.0], 20_000: [12.0]}
    search, point = search_at(ran, measured, repetitions=2)
    search.simulated = {"p01": 30_000}
    assert search.disputed(point, 20_000) == 20_000  # one run met the SLO at 20 ms: again
    search.record["steps"] = [{"runs": 4, "advice": {"p01": 20_000.0}}]
    assert search.next_setting(None) == (point, 20_000)
    search.tried[("p01", 20_000)] = 2  # every repetition ran: the runs decide
    assert search.disputed(point, 20_000) is None
    search.simulated = {"p01": 10_000}
    assert search.disputed(point, 30_000) == 10_000  # the simulator's is the smaller: again
    assert search.disputed(point, "uncertain") is None and search.disputed(point, 10_000) is None


def test_the_plan_says_each_advice_is_confirmed(tmp_path):
    path = tmp_path / "confirmed.yml"
    path.write_text(yaml.safe_dump(definition()))
    text = campaign.describe(campaign.load(path))
    assert "at most 32 runs (the full grid: 32), each advice confirmed by 2 runs" in text


def test_with_confirm_2_the_advice_runs_again_before_the_search_settles():
    # bracketed (20 ms missed, 30 ms met) and the simulator's own: one run at it is not enough
    search, point = search_at({20_000: 1, 30_000: 1}, {20_000: [45.0], 30_000: [12.0]},
                              repetitions=2, confirm=2)  # fmt: skip
    search.simulated = {"p01": 30_000}
    search.record["steps"] = [{"runs": 3, "advice": {"p01": 30_000.0}}]
    assert not search.settled() and search.next_setting(None) == (point, 30_000)
    search.tried[("p01", 30_000)] = 2
    search.measured[("p01", 30_000)] = [12.0, 14.5]  # the confirming run met the SLO
    assert search.settled() and search.to_confirm(point, 30_000) is None
    record = search.confirmation(point, 30_000)
    assert record == {"needed": 2, "measured": [12.0, 14.5], "held": True}


def test_a_confirming_run_that_misses_leaves_the_advice_to_the_model_unconfirmed():
    search, point = search_at({20_000: 1, 30_000: 2}, {20_000: [45.0], 30_000: [12.0, 31.0]},
                              repetitions=3, confirm=2)  # fmt: skip
    search.simulated = {"p01": 30_000}
    search.record["steps"] = [{"runs": 4, "advice": {"p01": 30_000.0}}]
    # no third run at 30 ms: the miss is the model's to weigh; the simulator's agreement no
    # longer settles the search, only an advice that stays the same over `stable` runs
    assert search.to_confirm(point, 30_000) is None and not search.confirmed(point, 30_000)
    assert not search.settled()
    search.record["steps"] = [{"runs": n, "advice": {"p01": 30_000.0}} for n in (4, 5, 6)]
    assert search.settled()
    assert search.confirmation(point, 30_000)["held"] is False
    assert search.confirmation(point, None) == {"needed": 2, "measured": [], "held": False}


@pytest.mark.parametrize(
    ("confirm", "reason"),
    [(3, r"confirm \(3\) cannot exceed repetitions \(2\)"),
     (0, "confirm must be a whole number"), ("twice", "confirm must be a whole number"),
     (None, "confirm must be a whole number ≥ 1, not None")],
)  # fmt: skip
def test_confirm_must_be_a_whole_number_within_the_repetitions(tmp_path, confirm, reason):
    doc = definition()
    doc["search"]["confirm"] = confirm
    path = tmp_path / "bad.yml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(campaign.CampaignError, match=reason):
        campaign.load(path)


def test_on_xen_the_reference_is_rtds_with_the_whole_period_as_budget():
    point = campaign.file.Point("p01", {"sched": "rtds", "period": 50_000, "budget": 20_000,
                                        "extratime": 0, "send_ms": 100.0})  # fmt: skip
    xen = point.reference("xen").settings
    assert xen == {"sched": "rtds", "period": 50_000, "budget": 50_000, "extratime": 1,
                   "send_ms": 100.0, "trace": True}  # fmt: skip
    bare = campaign.file.Point("p02", {"sched": "deadline", "budget": 8000}).reference("bare")
    assert bare.settings == {"sched": "none", "trace": True}
    assert bare.id == "reference-rate60"


def test_max_runs_holds_while_the_search_runs_its_starts(tmp_path):
    # two references and two starts a rate from the simulator: max_runs 4 ends it after the
    # first start of each rate, whatever the simulator advised
    script = tmp_path / "fake_run.py"
    script.write_text(FAKE)
    doc = definition()
    doc["search"]["max_runs"] = 4
    path = tmp_path / "capped.yml"
    path.write_text(yaml.safe_dump(doc))
    code = campaign.run_campaign(
        campaign.load(path), run_args(tmp_path), harness=(sys.executable, str(script))
    )
    index = json.loads((tmp_path / "results" / "capped" / "campaign.json").read_text())
    assert code == 0 and index["search"]["runs"] == len(index["runs"]) == 4
    assert [e["settings"]["sched"] for e in index["runs"]] == ["none", "none"] + ["deadline"] * 2


def test_max_runs_that_leaves_nothing_after_the_references_is_refused(tmp_path):
    doc = definition()
    doc["search"]["max_runs"] = 2
    path = tmp_path / "few.yml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(campaign.CampaignError, match="max_runs 2 leaves no run after the 2"):
        campaign.load(path)
