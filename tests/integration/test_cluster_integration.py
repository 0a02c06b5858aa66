"""SCALE=cluster on the bare target for real: three Kafka brokers, a Flink session cluster of
two TaskManagers, the job at parallelism 2 under SCHED_DEADLINE, the load as two client pairs
(CLIENTS=2), each its producers and its own consumer (a short run)."""

import json

import pandas as pd
import pytest
from driver import leftover_processes, run_args
from hvbench_harness import run
from hvbench_job import clients, networks

# make test-testbed's slow tier (docs/testing.md)
pytestmark = [pytest.mark.integration, pytest.mark.slow]

RECORDS = 120


@pytest.fixture(scope="module")
def cluster_run(small_data, small_model, tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("cluster")
    args = run_args(tmp_path, small_data[0], small_model, "--run-id", "cluster", records=RECORDS)
    args += ["--scale", "cluster", "--sched", "deadline", "--budget", "20000", "--clients", "2"]
    args += ["--malformed", "2"]  # injected by the first pair, whose consumer reads the letters
    code = run.main(args)
    results = tmp_path / "results" / "cluster"
    return code, tmp_path, json.loads((results / "meta.json").read_text()), results


def test_a_cluster_run_accounts_for_every_record(cluster_run):
    code, _, meta, results = cluster_run
    assert code == 0
    counts = meta["counts"]
    assert counts["sent"] == RECORDS and counts["received"] == RECORDS and counts["accounted"]
    assert counts["missing"] == 0 and counts["duplicated"] == 0
    samples = pd.read_csv(results / "samples.csv")
    assert len(samples) == RECORDS and samples.detector.nunique() == 6


def test_each_client_pair_sends_and_receives_its_own_groups_on_one_clock(cluster_run):
    """Group g goes to pair g mod 2: detectors 0, 2, 4 to pair 0 (output), 1, 3, 5 to pair 1
    (output-1); every latency is two stamps of its pair's files."""
    _, _, meta, results = cluster_run
    assert meta["requested"]["clients"] == 2
    samples = pd.read_csv(results / "samples.csv")
    keys = [d.key for d in networks.network("freeway").detectors]
    by_detector = clients.clients_by_detector(keys, 6, 2)
    assert (samples.client == samples.detector.map(by_detector)).all()
    assert samples.groupby("client").size().to_dict() == {0: RECORDS / 2, 1: RECORDS / 2}
    pairs = meta["clock"]["clients"]
    assert [(p["client"], p["calibration"]) for p in pairs] == [(0, "the run's"), (1, "the run's")]
    assert "2 client pairs" in meta["clock"]["stamps"]
    assert meta["job"]["answers"] == ["output", "output-1"]
    assert meta["counts"]["malformed_dead_lettered"] == meta["counts"]["malformed_sent"] == 2
    logs = {p.name for p in (results / "logs").iterdir()}
    assert {"producers.out", "producers-1.out", "consumer.err", "consumer-1.err"} <= logs


def test_kafka_is_three_nodes_with_every_partition_on_all_of_them(cluster_run):
    _, _, meta, _ = cluster_run
    kafka = meta["kafka"]
    assert [n["properties"]["node.id"] for n in kafka["nodes"]] == ["1", "2", "3"]
    assert kafka["replication"] == 3 and kafka["min_insync"] == 2
    assert len(kafka["bootstrap"].split(",")) == 3
    assert len(kafka["topics"]["input"]["partitions"]) == 6  # one per detector
    for topic in ("input", "output", "output-1", "dead-letter"):
        read = kafka["topics"][topic]
        assert read["min_insync_replicas"] == "2"
        for partition in read["partitions"]:
            assert sorted(partition["replicas"]) == [1, 2, 3]
            assert sorted(partition["isr"]) == [1, 2, 3]


def test_the_job_runs_on_two_taskmanagers_each_under_the_setting(cluster_run):
    _, _, meta, results = cluster_run
    flink = meta["flink_cluster"]
    assert flink["taskmanagers"] == 2 and flink["parallelism"] == 2
    pids = flink["taskmanager_pids"]
    assert len(set(pids)) == 2
    assert meta["job"]["flink"]["parallelism.default"] == "2"
    sched = meta["sched"]
    assert sched["processes"] == pids
    read = sched["readback"]
    # four threads per JVM: the task, the source's fetcher and each client pair's sink
    assert len(read) == 8 and len({r["tid"] for r in read}) == 8
    assert sum(r["name"].startswith("kafka-producer-") for r in read) == 4
    assert all(r["policy"] == "SCHED_DEADLINE" and r["runtime_ns"] == 20_000_000 for r in read)
    logs = {p.name for p in (results / "logs").iterdir()}
    assert {"broker-1.log", "broker-2.log", "broker-3.log"} <= logs
    assert sum(name.startswith("flink--taskexecutor-") for name in logs) == 2


def test_nothing_of_the_cluster_is_left_running(cluster_run):
    """The teardown records each Kafka node's JVM it ended, as it does the single broker's."""
    _, tmp_path, meta, _ = cluster_run
    assert leftover_processes(tmp_path) == []
    assert meta["teardown"]["left"] == []
    nodes = [e for e in meta["teardown"]["ended"] if e["part"] == "Kafka cluster"]
    assert len({e["pid"] for e in nodes}) == len(meta["kafka"]["nodes"]) == 3
    assert {e["signal"] for e in nodes} == {"SIGTERM"}


def test_each_taskmanager_idles_its_background_threads(cluster_run):
    _, _, meta, _ = cluster_run
    by_process = meta["job"]["jvm"]["background_threads_by_process"]
    assert sorted(map(int, by_process)) == sorted(meta["flink_cluster"]["taskmanager_pids"])
    assert all(applied["not_idle"] == [] for applied in by_process.values())


def test_each_parts_cpu_time_is_recorded_per_record(cluster_run):
    _, _, meta, _ = cluster_run
    cpu = meta["cpu_per_part"]
    parts = cpu["parts"]
    assert parts["kafka"]["processes"] == 3 and parts["flink job"]["processes"] == 2
    assert parts["producers"]["processes"] == parts["consumer"]["processes"] == 2  # two pairs
    assert {"producers", "consumer", "job client", "flink jobmanager"} <= set(parts)
    assert cpu["records"] == RECORDS
    for part in ("kafka", "flink job", "producers", "consumer"):
        assert parts[part]["cpu_s"] > 0, part
    assert cpu["machine_busy_s"] > 0
