"""NETWORK=bay on the bare target for real: the 325 PEMS-BAY sensors in six producer groups,
each record routed by the job from its own sensor to a destination of its own (a short run);
and again with MESSAGES=group, each group's records of a round in one message."""

import json

import pandas as pd
import pytest
from driver import leftover_processes, run_args
from hvbench_analysis.load import load_runs
from hvbench_harness import run

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SENSORS = 325
RECORDS = 2 * SENSORS


def bay(tmp_path_factory, data, model, run_id: str, *extra: str):
    """A short bay run at 162.5 records/s (`extra`: more of its flags): its exit code, its
    folders, its meta.json and its results."""
    tmp_path = tmp_path_factory.mktemp(run_id)
    args = run_args(tmp_path, data, model, "--run-id", run_id, records=RECORDS)
    code = run.main([*args, "--network", "bay", "--period-ms", "2000", *extra])
    results = tmp_path / "results" / run_id
    return code, tmp_path, json.loads((results / "meta.json").read_text()), results


@pytest.fixture(scope="module")
def bay_run(bay_data, small_model, tmp_path_factory):
    return bay(tmp_path_factory, bay_data[0], small_model, "bay")


@pytest.fixture(scope="module")
def grouped_run(bay_data, small_model, tmp_path_factory):
    return bay(tmp_path_factory, bay_data[0], small_model, "grouped", "--messages", "group")


def test_a_grouped_bay_run_accounts_for_every_record_of_every_group(grouped_run):
    code, tmp_path, meta, results = grouped_run
    assert code == 0
    counts = meta["counts"]
    assert counts["sent"] == counts["received"] == RECORDS and counts["accounted"]
    assert meta["requested"]["messages"] == "group" and meta["requested"]["producers"] == 6
    assert meta["job"]["forecast"]["batch"] == 8
    samples = pd.read_csv(results / "samples.csv", dtype={"detector": str})
    assert samples.detector.nunique() == SENSORS
    # a round's records went out together: one send stamp per group and round
    sent = samples.groupby("sent_ns").size()
    assert len(sent) == 6 * 2 and sent.sum() == RECORDS
    assert leftover_processes(tmp_path) == []


def test_a_bay_run_accounts_for_a_record_of_every_sensor(bay_run):
    code, _, meta, results = bay_run
    assert code == 0
    counts = meta["counts"]
    assert counts["sent"] == RECORDS and counts["received"] == RECORDS and counts["accounted"]
    assert counts["dead_lettered"] == 0  # every destination is one its sensor can reach
    samples = pd.read_csv(results / "samples.csv", dtype={"detector": str})
    assert samples.detector.nunique() == SENSORS
    assert samples.groupby("detector").size().eq(2).all()


def test_the_run_says_which_network_it_ran(bay_run):
    _, _, meta, results = bay_run
    assert (meta["requested"]["network"], meta["requested"]["detectors"]) == ("bay", SENSORS)
    assert meta["job"]["network"] == "bay"
    runs = load_runs([results])
    row = runs.runs.iloc[0]
    assert row["network"] == "bay" and row["rate"] == pytest.approx(162.5)


def test_nothing_is_left_running(bay_run):
    _, tmp_path, _, _ = bay_run
    assert leftover_processes(tmp_path) == []
