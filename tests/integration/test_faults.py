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
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from confluent_kafka import Producer
from driver import REPO, Harness, leftover_processes, run_args
from hvbench_harness.parts import running
from hvbench_job.records import DEAD_LETTER_MAX_BYTES

pytestmark = pytest.mark.integration

MALFORMED = 5  # one of each kind, the ~800 KB one included


# The harness's progress line once results arrive (it logs the first, then every 10 s): the run
# is measuring, whatever the machine's speed.
FIRST_RESULTS = r"received [1-9]\d*/\d+ dead-letters"


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


def foreign_records(run_id: str) -> list[tuple[str, bytes | None, bytes | None]]:
    """(topic, key, value) of input the job must refuse whatever it holds: a tombstone (a key,
    no value), an empty value, bytes that are not UTF-8, the run's id with seq 10**40, 100,000
    nested arrays, an object that repeats a key; look-alikes of the run's records that are not
    the run's: other run, a seq never sent, seq of the wrong JSON type (true, "1"), an ~800 KB
    bad record, the old marker; an array message holding a foreign result and a bad record, an
    empty array; and, straight to the output topic, a result with the run's id and seq 10**40."""
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
    refused = [
        b"",
        b'{"run": "' + run_id.encode() + b'", "seq": "\xff"}',
        json.dumps({**good, "run": run_id, "seq": 10**40}).encode(),
        b"[" * 100_000 + b"]" * 100_000,
        json.dumps({**good, "run": run_id, "seq": 5})[:-1].encode() + b', "seq": 6}',
    ]
    forged = {**good, "run": run_id, "seq": 10**40, "predicted_flow": 1.0, "route": []}
    return [
        ("input", b"k", None),  # a tombstone
        *(("input", None, value) for value in refused),
        *(("input", None, json.dumps(r).encode()) for r in [*records, grouped, []]),
        ("output", None, json.dumps(forged).encode()),
    ]


@pytest.fixture(scope="module")
def bad_input_run(small_data, small_model, tmp_path_factory):
    """A run fed foreign and bad input while it sends, with PyFlink's driver (the job's Python
    client, the JVM's parent) stopped: neither may disturb it."""
    tmp_path = tmp_path_factory.mktemp("bad-input")
    harness = start(tmp_path, small_data, small_model, "bad", "--malformed", str(MALFORMED))
    bootstrap = harness.wait_for(r"Kafka (\S+) up").group(1)
    driver = parent_of(int(harness.wait_for(r"JVM pid (\d+)").group(1)))
    harness.wait_for("producers started")
    os.kill(driver, signal.SIGSTOP)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    for topic, key, value in foreign_records("bad"):
        producer.produce(topic, value, key)
    assert producer.flush(30) == 0
    harness.driver = driver
    return harness.finish(), tmp_path, harness


def test_bad_and_foreign_input_leaves_a_clean_run_clean(bad_input_run):
    code, tmp_path, harness = bad_input_run
    meta, samples = results_of(tmp_path, "bad")
    c = meta["counts"]
    assert code == 0, harness.log()
    assert meta["status"] == {"state": "completed", "reason": None, "phase": "draining"}
    assert c["sent"] == c["received"] == 360 and c["accounted"]
    assert c["malformed_sent"] == c["malformed_dead_lettered"] == MALFORMED
    assert c["foreign_results"] == 3 and c["unexpected"] == 1
    assert c["foreign_dead_letters"] == 12 and c["dead_lettered"] == 0
    assert c["unreadable_rows"] == 0
    assert not samples.dead_lettered.any()
    assert_counts_add_up(meta, samples)
    assert leftover_processes(tmp_path) == []


def test_every_dead_letter_is_bounded_and_keeps_the_lengths(bad_input_run):
    _, tmp_path, _ = bad_input_run
    lines = (tmp_path / "results" / "bad" / "dead_letters.jsonl").read_text().splitlines()
    letters = [json.loads(line) for line in lines]
    assert len(letters) == MALFORMED + 12 + 1  # and the readiness probe's
    big = [x for x in letters if x["record_chars"] > 700_000]
    assert len(big) == 2  # the injected oversized one and the foreign one
    for letter in big:
        assert len(letter["record"]) < letter["record_chars"]
        kept = {k: v for k, v in letter.items() if k != "received_ns"}
        assert len(json.dumps(kept, separators=(",", ":")).encode()) <= DEAD_LETTER_MAX_BYTES
    expected = [
        *("must be a number", "not JSON", "missing field"),
        *("a null value (a Kafka tombstone)", "an empty value", "not UTF-8"),
        *("'seq' must be below 2**63", "nested deeper than", "key(s) given more than once"),
    ]
    for reason in expected:
        assert any(reason in x["reason"] for x in letters), reason


def test_a_stopped_job_client_holds_no_record_and_is_ended_at_teardown(bad_input_run):
    """PyFlink's driver only waits for the job in thread mode: the run went on (the test
    above), and the teardown continued and ended the driver, and said so."""
    _, tmp_path, harness = bad_input_run
    meta, _ = results_of(tmp_path, "bad")
    teardown = meta["teardown"]
    [ended] = [e for e in teardown["ended"] if e["pid"] == harness.driver]
    assert ended["part"] == "flink job" and ended["was_stopped"] and ended["when"] == "teardown"
    assert teardown["left"] == [] and running(harness.driver) is None
    assert meta["faults"] == []


@pytest.mark.slow
def test_a_broker_killed_mid_run_is_restarted_and_every_record_accounted(
    small_data, small_model, tmp_path
):
    harness = start(tmp_path, small_data, small_model, "restart", records=720)
    harness.wait_for(FIRST_RESULTS)
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


# the broker's case in the slow tier, for make test's budget (docs/testing.md)
@pytest.mark.parametrize("part", [pytest.param("broker", marks=pytest.mark.slow), "job"])
def test_a_part_that_dies_ends_the_run_at_once_and_what_was_measured_is_written(
    part, small_data, small_model, tmp_path
):
    run_id = f"{part}-dies"
    harness = start(
        tmp_path, small_data, small_model, run_id, "--broker-restarts", "0", records=1800
    )
    jvm = int(harness.wait_for(r"JVM pid (\d+)").group(1))
    harness.wait_for(FIRST_RESULTS)
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
        pytest.param("sending", "producers started", marks=pytest.mark.slow),  # make test's budget
    ],
)
def test_ctrl_c_in_each_phase_leaves_nothing_and_keeps_what_was_measured(
    phase, after, small_data, small_model, tmp_path
):
    harness = start(tmp_path, small_data, small_model, "ctrl-c", records=1800)
    harness.wait_for(after)
    if phase == "sending":
        harness.wait_for(FIRST_RESULTS)
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


# The harness with accounting made to fail after the run completed (as a record whose seq does
# not fit 64 bits once did), in its own process like any run.
ACCOUNTING_FAILS = """
import sys
import hvbench_harness.accounting as accounting
def fail(*args, **kwargs):
    raise OverflowError("injected: accounting fails")
accounting.account = fail
from hvbench_harness.run import main
sys.exit(main())
"""


def account_again(folder, *extra) -> subprocess.CompletedProcess:
    """`hvbench rerun --account folder` in its own process."""
    command = [sys.executable, "-m", "hvbench_harness.cli", "rerun", "--account", str(folder)]
    return subprocess.run([*command, *extra], cwd=REPO, capture_output=True, text=True)


@pytest.fixture
def full_disk(small_disk):
    """A 64 KiB tmpfs, filled up."""
    try:
        with open(small_disk / "filler", "wb") as filler:
            while filler.write(b"x" * 4096):
                filler.flush()  # until OSError: the disk is full
    except OSError:
        pass
    return small_disk


@pytest.mark.slow
def test_an_accounting_failure_writes_the_raw_files_and_the_run_is_accounted_again(
    small_data, small_model, tmp_path, full_disk
):
    harness = Harness(
        run_args(tmp_path, small_data[0], small_model, "--run-id", "unaccounted"),
        command=[sys.executable, "-c", ACCOUNTING_FAILS],
    )
    code = harness.finish()
    folder = tmp_path / "results" / "unaccounted"
    meta = json.loads((folder / "meta.json").read_text())
    status = meta["status"]
    assert code == 1, harness.log()
    assert (status["state"], status["phase"]) == ("failed", "accounting")
    assert "OverflowError: injected" in status["reason"]
    assert "the run had completed" in status["reason"]
    assert "OverflowError: injected" in status["traceback"]
    assert status["before"]["state"] == "completed" and status["before"]["reason"] is None
    assert meta["counts"] is None and not (folder / "samples.csv").exists()
    raw = {p.name for p in (folder / "raw").iterdir()}
    assert {"sent.csv", "received.csv", "dead_letters.jsonl", "consumer.json"} <= raw
    assert {"calibration.json", "job-settings.json", "before-accounting.json"} <= raw
    assert f"make account RUN={folder}" in harness.log()
    assert not (tmp_path / "work" / "unaccounted").exists()
    assert leftover_processes(tmp_path) == []

    again = account_again(folder)
    meta, samples = results_of(tmp_path, "unaccounted")
    c = meta["counts"]
    assert again.returncode == 0, again.stdout + again.stderr
    assert meta["status"] == status["before"]  # as the sending left it
    assert meta["accounted_again"]["status_replaced"]["phase"] == "accounting"
    assert c["sent"] == c["received"] == 360 and c["accounted"]
    assert_counts_add_up(meta, samples)

    written = {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    into_full = account_again(folder, "--results", str(full_disk))
    assert into_full.returncode == 1, into_full.stdout + into_full.stderr
    assert "No space left on device" in into_full.stderr
    assert f"make account RUN={folder} RESULTS={full_disk}" in into_full.stderr
    assert [p.name for p in full_disk.iterdir()] == ["filler"]  # nothing half-written
    assert {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()} == written
    print(f"\n{status['reason']}; accounted again: {c['received']} of {c['sent']} received")


# A part that stops making progress (SIGSTOP: it lives but runs no code) is a fault like one
# that dies; teardown continues what is stopped before it asks it to end, and records it.


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


@pytest.mark.slow
@pytest.mark.parametrize("part", ["job", "broker"])
def test_a_stopped_part_fails_the_run_at_once_and_the_teardown_ends_it(
    part, small_data, small_model, tmp_path
):
    run_id = f"{part}-stopped"
    harness = start(
        tmp_path, small_data, small_model, run_id, "--broker-restarts", "0", records=1800
    )
    jvm = int(harness.wait_for(r"JVM pid (\d+)").group(1))
    harness.wait_for(r"received [1-9]")  # results are coming
    pid = kafka_pid(tmp_path, run_id) if part == "broker" else jvm
    os.kill(pid, signal.SIGSTOP)
    stopped = time.monotonic()
    code = harness.finish()
    meta, samples = results_of(tmp_path, run_id)
    status, c, teardown = meta["status"], meta["counts"], meta["teardown"]
    assert code == 1, harness.log()
    assert status["state"] == "failed" and status["phase"] == "sending"
    why = {
        "job": f"the Flink job's JVM (pid {pid}) is stopped (SIGSTOP?), not running",
        "broker": f"Kafka does not answer (hung): its JVM (pid {pid}) is stopped (SIGSTOP?)",
    }[part]
    assert status["reason"].startswith(why)
    assert c["received"] > 0 and c["sent"] < 1800 and not c["accounted"]  # not waited out
    assert_counts_add_up(meta, samples)
    [ended] = [e for e in teardown["ended"] if e["pid"] == pid]
    assert ended["was_stopped"] and ended["part"] == {"job": "flink job", "broker": "Kafka"}[part]
    assert ended["when"] == {"job": "teardown", "broker": "hung"}[part]
    assert teardown["left"] == [] and running(pid) is None
    assert leftover_processes(tmp_path) == []
    noticed, failed = harness.when("noticed: "), harness.when("run failed while")
    shown = {k: c[k] for k in ("sent", "received", "missing", "undelivered")}
    print(
        f"\n{part} stopped: noticed after {noticed - stopped:.1f} s, torn down after "
        f"{failed - stopped:.1f} s: {status['reason'][:80]}"
    )
    print(f"  counts {shown}; ended: {ended}")


FREEZER = Path("/sys/fs/cgroup/freezer")  # cgroup v1's freezer, where this machine has one


@pytest.fixture
def freezer():
    """A freezer cgroup of the test's own; skipped where none can be made."""
    group = FREEZER / f"hvbench-test-{os.getpid()}"
    try:
        group.mkdir()
    except OSError as e:
        pytest.skip(f"no cgroup v1 freezer here (needs root): {e}")
    try:
        yield group
    finally:
        (group / "freezer.state").write_text("THAWED")
        deadline = time.monotonic() + 60
        while group.exists() and time.monotonic() < deadline:
            try:
                group.rmdir()  # once the teardown has ended what was in it
            except OSError:
                time.sleep(0.5)


@pytest.mark.slow
def test_a_job_that_makes_no_progress_while_sending_is_a_stall(
    small_data, small_model, tmp_path, freezer
):
    """The job's JVM frozen: it lives and is not stopped (state D, not T), but no result comes
    while the producers send; after STALL_S that is the run's fault."""
    harness = start(tmp_path, small_data, small_model, "frozen", records=1800)
    jvm = int(harness.wait_for(r"JVM pid (\d+)").group(1))
    harness.wait_for(r"received [1-9]")  # results are coming
    (freezer / "cgroup.procs").write_text(str(jvm))
    (freezer / "freezer.state").write_text("FROZEN")
    frozen = time.monotonic()
    harness.wait_for("noticed: ")
    # a frozen process takes no signal, not even SIGKILL: thawed for the teardown
    (freezer / "freezer.state").write_text("THAWED")
    code = harness.finish()
    meta, samples = results_of(tmp_path, "frozen")
    status, c = meta["status"], meta["counts"]
    assert code == 1, harness.log()
    assert status["state"] == "failed" and status["phase"] == "sending"
    assert status["reason"].startswith("no result for ")
    assert "while the producers were sending" in status["reason"]
    assert "(STALL_S=8)" in status["reason"] and meta["watch"]["stall_s"] == 8.0
    # Thawed for the teardown, the job may deliver what it held before the consumer stops (it
    # did in a tier run: all 573 sent were received): accounted or not, every record is one of
    # received, dead-lettered, missing or undelivered.
    assert c["received"] > 0 and c["sent"] < 1800
    assert_counts_add_up(meta, samples)
    assert meta["teardown"]["left"] == [] and leftover_processes(tmp_path) == []
    noticed = harness.when("noticed: ")
    print(f"\njob frozen: noticed after {noticed - frozen:.1f} s: {status['reason'][:90]}")


@pytest.mark.slow
def test_a_second_run_on_this_machine_is_refused_and_a_forced_one_recorded_by_both(
    small_data, small_model, tmp_path, monkeypatch
):
    """Run A holds this machine; run B, started while A runs, is refused at once naming A,
    before it starts anything; run C with CONCURRENT=1 runs beside A and completes, and each
    one's meta.json `concurrent` names the other (C at its start, A while sending). The
    registry is the test's own (HVBENCH_RUNS_DIR)."""
    monkeypatch.setenv("HVBENCH_RUNS_DIR", str(tmp_path / "registry"))
    first = start(tmp_path, small_data, small_model, "run-a")
    first.wait_for(r"^\[.*\] TSC ")  # A holds the machine from before it calibrates
    asked = time.monotonic()
    refused = start(tmp_path, small_data, small_model, "run-b")
    assert refused.finish() == 1, refused.log()
    took = time.monotonic() - asked
    assert f"make run: another run holds this machine: run run-a (pid {first.proc.pid}," in (
        refused.log()
    )
    assert "TSC" not in refused.log() and "Kafka" not in refused.log()
    assert not (tmp_path / "work" / "run-b").exists()
    assert not (tmp_path / "results" / "run-b").exists()
    forced = start(tmp_path, small_data, small_model, "run-c", "--concurrent")
    assert first.finish() == 0, first.log()
    assert forced.finish() == 0, forced.log()
    meta_a, samples_a = results_of(tmp_path, "run-a")
    meta_c, samples_c = results_of(tmp_path, "run-c")
    a, c = meta_a["concurrent"], meta_c["concurrent"]
    assert (a["forced"], a["at_start"], a["machines"]) == (False, [], ["this machine"])
    # C started while A was starting and sent while A did: seen by A while sending (and at
    # its end too if C outlived A, which this test does not depend on)
    assert [(e["id"], e["pid"]) for e in a["seen"]] == [("run-c", forced.proc.pid)]
    assert meta_a["requested"]["concurrent"] is False and meta_c["requested"]["concurrent"]
    assert c["forced"] is True
    assert [(e["id"], e["pid"], e["forced"]) for e in c["at_start"]] == [
        ("run-a", first.proc.pid, False)
    ]
    for meta, samples, sent in ((meta_a, samples_a, 360), (meta_c, samples_c, 360)):
        assert meta["counts"]["sent"] == meta["counts"]["received"] == sent
        assert_counts_add_up(meta, samples)
    assert list((tmp_path / "registry").glob("*.lock")) == []
    assert leftover_processes(tmp_path) == []
    print(f"\nsecond run refused after {took:.1f} s; the forced one ran beside it")
