"""Fault injection on the bare target, with the real broker and the real job: bad and foreign
input, the broker killed (restarted, or not allowed to be), the job killed, Ctrl-C in each
phase. Each run is `hvbench run` in its own process, driven through its log. Each test asserts
that nothing is left running, that results are written (or not) with the right status, and
that the counts add up exactly. How long each run took to notice its fault is printed (run
pytest with -s to see it); it is not asserted: this machine is shared and noisy."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pandas as pd
import pytest
from confluent_kafka import Producer
from driver import Harness, leftover_processes, run_args
from hvbench_job.records import DEAD_LETTER_MAX_BYTES

pytestmark = pytest.mark.integration

MALFORMED = 5  # one of each kind, the ~800 KB one included


def start(tmp_path, small_data, small_model, run_id, *extra, records=360) -> Harness:
    args = run_args(
        tmp_path, small_data[0], small_model, "--run-id", run_id, *extra, records=records
    )
    return Harness(args)


def results_of(tmp_path, run_id) -> tuple[dict, pd.DataFrame]:
    folder = tmp_path / "results" / run_id
    return json.loads((folder / "meta.json").read_text()), pd.read_csv(folder / "samples.csv")


def assert_counts_add_up(meta: dict, samples: pd.DataFrame) -> None:
    """Every sent record is exactly one of: received, dead-lettered, missing, undelivered."""
    c = meta["counts"]
    assert c["sent"] == len(samples)
    assert c["sent"] == c["received"] + c["dead_lettered"] + c["missing"] + c["undelivered"]
    assert c["received"] == int((samples.copies > 0).sum())
    assert c["measured"] == meta["latency"].get("n", 0)


def kafka_pid(tmp_path, run_id) -> int:
    config = tmp_path / "work" / run_id / "kafka" / "server.properties"
    out = subprocess.run(["pgrep", "-f", f"kafka.Kafka {config}"], capture_output=True, text=True)
    return int(out.stdout.split()[0])


def foreign_records(run_id: str) -> list[bytes]:
    """Look-alikes of the run's records that are not the run's: other run, a seq never sent,
    seq of the wrong JSON type (true, "1"), an ~800 KB bad record, the old marker; an array
    message holding a foreign result and a bad record, and an empty array."""
    good = {
        "detector": "athens",
        "speed_mph": 60.0,
        "flows": [100.0] * 12,
        "intended_ns": 1,
        "sent_ns": 2,
    }
    records = [
        {**good, "run": "another-run", "seq": 1},  # a result, foreign
        {**good, "run": run_id, "seq": 10**9},  # a result with the run's id, never sent
        {**good, "run": run_id, "seq": True},  # dead letters from here on
        {**good, "run": run_id, "seq": "1"},
        {**good, "run": run_id, "seq": 2, "speed_mph": '"\\' * 200_000},
        {**good, "run": run_id, "seq": 3, "flows": "malformed-0"},
    ]
    # a group's message (an array) with one foreign result and one dead letter, and an empty one
    grouped = [{**good, "run": "another-run", "seq": 4}, {**good, "run": run_id, "seq": False}]
    return [json.dumps(r).encode() for r in [*records, grouped, []]]


@pytest.fixture(scope="module")
def bad_input_run(small_data, small_model, tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("bad-input")
    harness = start(tmp_path, small_data, small_model, "bad", "--malformed", str(MALFORMED))
    bootstrap = harness.wait_for(r"Kafka (\S+) up").group(1)
    harness.wait_for("producers started")
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    for record in foreign_records("bad"):
        producer.produce("input", record)
    assert producer.flush(30) == 0
    return harness.finish(), tmp_path, harness


def test_bad_and_foreign_input_leaves_a_clean_run_clean(bad_input_run):
    code, tmp_path, harness = bad_input_run
    meta, samples = results_of(tmp_path, "bad")
    c = meta["counts"]
    assert code == 0, harness.log()
    assert meta["status"] == {"state": "completed", "reason": None, "phase": "draining"}
    assert c["sent"] == c["received"] == 360 and c["accounted"]
    assert c["malformed_sent"] == c["malformed_dead_lettered"] == MALFORMED
    assert c["foreign_results"] == 2 and c["unexpected"] == 1
    assert c["foreign_dead_letters"] == 6 and c["dead_lettered"] == 0
    assert not samples.dead_lettered.any()
    assert_counts_add_up(meta, samples)
    assert leftover_processes(tmp_path) == []


def test_every_dead_letter_is_bounded_and_keeps_the_lengths(bad_input_run):
    _, tmp_path, _ = bad_input_run
    lines = (tmp_path / "results" / "bad" / "dead_letters.jsonl").read_text().splitlines()
    letters = [json.loads(line) for line in lines]
    assert len(letters) == MALFORMED + 6 + 1  # and the readiness probe's
    big = [x for x in letters if x["record_chars"] > 700_000]
    assert len(big) == 2  # the injected oversized one and the foreign one
    for letter in big:
        assert len(letter["record"]) < letter["record_chars"]
        kept = {k: v for k, v in letter.items() if k != "received_ns"}
        assert len(json.dumps(kept, separators=(",", ":")).encode()) <= DEAD_LETTER_MAX_BYTES
    assert {"must be a number", "not JSON", "missing field"} <= {
        reason
        for x in letters
        for reason in ("must be a number", "not JSON", "missing field")
        if reason in x["reason"]
    }


def test_a_broker_killed_mid_run_is_restarted_and_every_record_accounted(
    small_data, small_model, tmp_path
):
    harness = start(tmp_path, small_data, small_model, "restart", records=720)
    harness.wait_for("producers started")
    time.sleep(2)
    os.kill(kafka_pid(tmp_path, "restart"), signal.SIGKILL)
    killed = time.monotonic()
    code = harness.finish()
    meta, samples = results_of(tmp_path, "restart")
    c = meta["counts"]
    assert code == 0, harness.log()
    assert meta["status"]["state"] == "completed"
    [fault] = meta["faults"]
    assert fault["part"] == "broker" and fault["event"] == "restarted"
    assert fault["exit_code"] == -signal.SIGKILL
    assert c["sent"] == c["received"] == 720 and c["missing"] == 0 and c["accounted"]
    assert_counts_add_up(meta, samples)
    assert leftover_processes(tmp_path) == []
    ended = harness.when("consumer: done")
    print(f"\nbroker restart: {fault['detail']}; the run ended {ended - killed:.1f} s after")
    print(f"  duplicates {c['duplicated']}, max latency {meta['latency']['max_ms']:.0f} ms")


@pytest.mark.parametrize("part", ["broker", "job"])
def test_a_part_that_dies_ends_the_run_at_once_and_what_was_measured_is_written(
    part, small_data, small_model, tmp_path
):
    run_id = f"{part}-dies"
    harness = start(
        tmp_path, small_data, small_model, run_id, "--broker-restarts", "0", records=1800
    )
    jvm = int(harness.wait_for(r"JVM pid (\d+)").group(1))
    harness.wait_for("producers started")
    time.sleep(2)
    os.kill(kafka_pid(tmp_path, run_id) if part == "broker" else jvm, signal.SIGKILL)
    killed = time.monotonic()
    code = harness.finish()
    meta, samples = results_of(tmp_path, run_id)
    status, c = meta["status"], meta["counts"]
    assert code == 1, harness.log()
    assert status["state"] == "failed" and status["phase"] == "sending"
    assert ("Kafka is gone" if part == "broker" else "Flink job") in status["reason"]
    assert c["received"] > 0 and c["sent"] < 1800  # cut short, not waited out
    assert not c["accounted"]
    assert_counts_add_up(meta, samples)
    assert leftover_processes(tmp_path) == []
    noticed = harness.when("run failed while")
    shown = {k: c[k] for k in ("sent", "received", "missing", "undelivered")}
    print(f"\n{part} killed: noticed after {noticed - killed:.1f} s: {status['reason'][:70]}")
    print(f"  counts {shown}")


@pytest.mark.parametrize(
    ("phase", "after"),
    [
        ("starting Kafka", r"^\[.*\] TSC "),
        ("starting the Flink job", r"Kafka \S+ up"),
        ("sending", "producers started"),
    ],
)
def test_ctrl_c_in_each_phase_leaves_nothing_and_keeps_what_was_measured(
    phase, after, small_data, small_model, tmp_path
):
    harness = start(tmp_path, small_data, small_model, "ctrl-c", records=1800)
    harness.wait_for(after)
    if phase == "sending":
        time.sleep(2)
    harness.ctrl_c()
    code = harness.finish()
    assert code == 130, harness.log()
    assert leftover_processes(tmp_path) == []
    if phase != "sending":
        assert not (tmp_path / "results").exists()  # nothing was measured
        assert f"interrupted while {phase}" in harness.log()
        return
    meta, samples = results_of(tmp_path, "ctrl-c")
    assert meta["status"] == {
        "state": "interrupted",
        "reason": "interrupted while sending",
        "phase": "sending",
    }
    assert meta["counts"]["received"] > 0 and meta["counts"]["sent"] < 1800
    assert_counts_add_up(meta, samples)
