"""The run always writes its results (run.finish): a failure after the sending (accounting,
the summary) writes results/<run-id>/ as failed with the raw files, which `hvbench rerun
--account` accounts again; results that do not fit on the disk leave nothing half-written
there, and the work folder stays. The run is a synthetic work folder, as the parts write it,
finished by the harness's own code with a real bare target."""

from __future__ import annotations

import csv
import dataclasses
import json
import signal

import pandas as pd
import pytest
from hvbench_agent import tuning
from hvbench_analysis import results as results_contract
from hvbench_analysis import sections
from hvbench_harness import accounting, rawfiles, rerun
from hvbench_harness import finish as finishing
from hvbench_harness import run as harness
from hvbench_harness.parts import RunError
from hvbench_harness.targets.bare import BareTarget
from hvbench_harness.targets.common import Here
from hvbench_load.consumer import FIELDS as RECEIVED_FIELDS
from hvbench_load.probe import probe_record

RUN = "r1"
MS = 1_000_000
DETECTORS = ("athens", "el_segundo", "wilmington", "long_beach", "carson", "torrance")
RECORDS = 1200  # samples.csv of about 100 KB: more than the small disk holds
MISSING, DEAD_LETTERED, UNDELIVERED = {5, 600}, 77, 901  # by record number
SENT_HEADER = ["detector", "seq", "intended_ns", "sent_ns", "delivered"]
ACCOUNT = accounting.account  # the real one, put back after a failure
RAW_NAMES = {
    rawfiles.BEFORE,
    "sent.csv",
    "received.csv",
    "dead_letters.jsonl",
    "malformed.jsonl",
    "consumer.json",
    "calibration.json",
    "job-settings.json",
    "job.out",
    results_contract.ENERGY,
}


def write_csv(path, header, rows) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)


def write_work(work) -> None:
    """The parts' files of a bare run of RECORDS records: two never came back, one was
    dead-lettered, one was never delivered; the probe's dead letter; the logs."""
    work.mkdir(parents=True)
    sent, received = [], []
    for n in range(RECORDS):
        detector, seq = DETECTORS[n % 6], n // 6
        intended = n * 17 * MS
        sent.append((detector, seq, intended, intended + 1000, int(n != UNDELIVERED)))
        if n not in MISSING | {DEAD_LETTERED, UNDELIVERED}:
            stamps = (intended, intended + 1000, intended + 9 * MS, 1, 2)
            received.append((detector, seq, *stamps, intended + 3 * MS, intended + 7 * MS))
            received[-1] += (50.0, 120.0, "a/b")
    write_csv(work / "sent.csv", SENT_HEADER, sent)
    write_csv(work / "received.csv", RECEIVED_FIELDS, received)
    refused = sent[DEAD_LETTERED]
    key = {"run": RUN, "detector": refused[0], "seq": refused[1], "sent_ns": refused[3]}
    probe = probe_record(RUN)
    letters = [
        {"reason": "bad", "record": "{}", "record_chars": 2, "key": key},
        {"reason": "bad", "record": probe, "record_chars": len(probe), "key": None},
    ]
    (work / "dead_letters.jsonl").write_text("".join(json.dumps(x) + "\n" for x in letters))
    (work / "malformed.jsonl").write_text("")
    (work / "consumer.json").write_text(json.dumps({"foreign_results": 0}))
    (work / "calibration.json").write_text(json.dumps({"hz": 2.6e9, "source": "synthetic"}))
    (work / "job-settings.json").write_text(json.dumps({"parallelism": 1}))
    for log in ("job.out", "producers.out", "consumer.err", "broker.err"):
        (work / log).write_text(f"{log}: the part's log\n")


@pytest.fixture
def bare_run(tmp_path):
    """(request, target, work, results, meta_doc) of a bare run whose sending completed."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "manifest.json").write_text(json.dumps({"checksum": "sha256:synthetic"}))
    argv = ["--run-id", RUN, "--records", str(RECORDS), "--warmup-s", "1", "--drain-s", "1"]
    argv += ["--results", str(tmp_path / "results"), "--work", str(tmp_path / "work")]
    request, _ = harness.parse_args([*argv, "--model", str(model), "--data", str(tmp_path)])
    target = BareTarget(request, RUN, Here(tuning.CpuLatency(None), None))
    work, results = tmp_path / "work" / RUN, tmp_path / "results" / RUN
    write_work(work)
    meta_doc = harness.begin_meta(request, RUN, target)
    meta_doc["status"].update(state="completed", phase="draining")
    return request, target, work, results, meta_doc


def finish(bare_run) -> int:
    """run.finish as the run calls it; the test's own signal handlers back afterwards."""
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        return finishing.finish(*bare_run)
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)


def read(folder) -> tuple[dict, pd.DataFrame]:
    return results_contract.read_meta(folder), pd.read_csv(folder / "samples.csv")


def assert_counts_add_up(meta: dict, samples: pd.DataFrame) -> None:
    """Every sent record is exactly one of: received, dead-lettered, missing, undelivered."""
    c = meta["counts"]
    assert c["sent"] == len(samples) == RECORDS
    assert c["sent"] == c["received"] + c["dead_lettered"] + c["missing"] + c["undelivered"]
    assert (c["missing"], c["dead_lettered"], c["undelivered"]) == (2, 1, 1)
    assert c["received"] == int((samples.copies > 0).sum()) == RECORDS - 4
    assert c["measured"] == meta["latency"]["n"] > 0


@pytest.fixture
def accounting_fails(monkeypatch):
    def fail(*_args, **_kwargs):
        raise OverflowError("Python int too large to convert to C long")

    monkeypatch.setattr(accounting, "account", fail)


def test_a_finished_run_is_accounted_and_its_work_folder_goes(bare_run):
    _, _, work, results, _ = bare_run
    assert finish(bare_run) == 2  # records missing
    meta, samples = read(results)
    assert meta["status"] == {"state": "completed", "reason": None, "phase": "draining"}
    assert_counts_add_up(meta, samples)
    assert meta["clock"]["job"]["method"] == "one calibration"
    assert meta["energy"]["windows"] == {"run": None, "measured": None}  # no meter here
    assert "raw" not in meta["files"] and not (results / "raw").exists()
    assert sorted(p.name for p in (results / "logs").iterdir()) == sorted(
        ["job.out", "producers.out", "consumer.err", "broker.err"]
    )
    assert not work.exists()


@pytest.mark.parametrize("fails", [False, True])
def test_the_sections_the_harness_writes_read_back_as_written(fails, bare_run, monkeypatch):
    """Each section of sections.py in the run's meta.json, read and written again, is the same
    text, keys in order: the harness builds them there (a failed run's status too)."""
    if fails:
        monkeypatch.setattr(accounting, "account", lambda *_: 1 / 0)
    finish(bare_run)
    written = json.loads((bare_run[3] / "meta.json").read_text())
    found = set()
    for key, (kind, _) in results_contract.SECTIONS.items():
        for cls in sections.options(kind):
            if issubclass(cls, sections.Section) and written.get(key) is not None:
                again = cls.from_json(written[key], key, strict=True).to_json()
                assert json.dumps(again) == json.dumps(written[key]), key
                found.add(key)
    statistics = set() if fails else {"counts", "latency", "latency_from_intended"}
    assert found == {"requested", "status", "clock", "energy", *statistics}
    assert ("before" in written["status"]) == fails


@pytest.mark.parametrize("sending_ended", ["completed", "failed"])
def test_an_accounting_failure_writes_the_run_failed_with_its_raw_files_and_it_is_accounted_again(
    sending_ended, bare_run, accounting_fails, monkeypatch, capsys
):
    _, _, work, results, meta_doc = bare_run
    if sending_ended == "failed":
        meta_doc["status"].update(state="failed", phase="sending", reason="the job exited")
    before = dict(meta_doc["status"])
    raw_before = {p.name: p.read_bytes() for p in work.iterdir() if p.name in RAW_NAMES}
    assert finish(bare_run) == 1
    meta = results_contract.read_meta(results)
    status = meta["status"]
    assert status["state"] == "failed" and status["phase"] == "accounting"
    assert status["reason"].startswith("accounting failed: OverflowError: Python int too large")
    assert f"the run had {sending_ended}" in status["reason"]
    assert "OverflowError" in status["traceback"] and "rawfiles.py" in status["traceback"]
    assert status["before"] == before
    assert (meta["counts"], meta["latency"]) == (None, None)  # not computed: not invented
    assert "samples" not in meta["files"] and not (results / "samples.csv").exists()
    assert meta["files"]["raw"] == "raw/" and meta["files"]["logs"] == "logs/"
    raw = {p.name: p.read_bytes() for p in (results / "raw").iterdir()}
    assert raw.keys() >= RAW_NAMES
    assert {name: raw[name] for name in raw_before} == raw_before  # as they were
    assert not work.exists()
    out = capsys.readouterr().out
    assert f"make account RUN={results}" in out

    monkeypatch.setattr(accounting, "account", ACCOUNT)  # accounting works again
    code = rerun.main(["--account", str(results)])
    meta, samples = read(results)
    assert code == (2 if sending_ended == "completed" else 1)
    assert meta["status"] == before  # as the sending left it
    assert meta["accounted_again"]["status_replaced"]["phase"] == "accounting"
    assert_counts_add_up(meta, samples)
    assert meta["files"]["raw"] == "raw/" and (results / "raw" / rawfiles.BEFORE).exists()
    assert (results / "logs" / "job.out").exists()


def test_a_failure_in_the_summary_keeps_what_accounting_made(bare_run, monkeypatch):
    _, _, work, results, _ = bare_run

    def fail(*_args):
        raise KeyError("p99_ms")

    monkeypatch.setattr(finishing, "summary_lines", fail)
    assert finish(bare_run) == 1
    meta, samples = read(results)
    assert meta["status"]["phase"] == "summarizing" and "KeyError" in meta["status"]["reason"]
    assert_counts_add_up(meta, samples)  # computed, so kept
    assert (results / "raw" / "sent.csv").exists() and not work.exists()


def test_results_that_do_not_fit_leave_nothing_there_and_the_work_folder_names_the_command(
    bare_run, small_disk, tmp_path
):
    request, target, work, _, meta_doc = bare_run
    results = small_disk / RUN
    request = dataclasses.replace(request, results=str(small_disk))
    with pytest.raises(RunError) as refused:
        finish((request, target, work, results, meta_doc))
    message = str(refused.value)
    assert "No space left on device" in message
    assert f"raw files are in {work}/" in message
    assert f"make account RUN={work} RESULTS={small_disk}" in message
    assert list(small_disk.iterdir()) == []  # no hidden folder, no half-written run
    assert (work / rawfiles.BEFORE).exists() and (work / "sent.csv").exists()

    elsewhere = tmp_path / "elsewhere"
    assert rerun.main(["--account", str(work), "--results", str(elsewhere)]) == 2
    meta, samples = read(elsewhere / RUN)
    assert meta["status"] == {"state": "completed", "reason": None, "phase": "draining"}
    assert meta["accounted_again"]["status_replaced"] is None
    assert_counts_add_up(meta, samples)
    assert not work.exists()  # its raw files are in the results' raw/


def test_accounting_again_into_a_full_disk_leaves_the_run_as_it_was(
    bare_run, accounting_fails, monkeypatch, small_disk, capsys
):
    """An update in place that does not fit keeps the earlier results whole; into another
    folder that does not fit, nothing is left there."""
    _, _, _, results, _ = bare_run
    assert finish(bare_run) == 1
    monkeypatch.setattr(accounting, "account", ACCOUNT)
    written = {p.relative_to(results): p.read_bytes() for p in results.rglob("*") if p.is_file()}
    assert rerun.main(["--account", str(results), "--results", str(small_disk)]) == 1
    error = capsys.readouterr().err
    assert "No space left on device" in error and f"raw files are still in {results}/raw/" in error
    assert f"make account RUN={results} RESULTS={small_disk}" in error
    assert list(small_disk.iterdir()) == []
    after = {p.relative_to(results): p.read_bytes() for p in results.rglob("*") if p.is_file()}
    assert after == written


def test_an_update_in_place_that_fails_keeps_the_earlier_results(tmp_path, small_disk):
    """write_run replaces a run only whole: the earlier one stays if the new one fails."""
    folder = small_disk / "run"
    samples = pd.DataFrame({c: [1] for c in results_contract.SAMPLE_COLUMNS})
    results_contract.write_run(folder, {"run_id": "run", "started_at": "1"}, samples)
    big = pd.concat([samples] * 20_000, ignore_index=True)
    with pytest.raises(OSError, match="No space left"):
        results_contract.write_run(folder, {"run_id": "run", "started_at": "2"}, big)
    assert json.loads((folder / "meta.json").read_text())["started_at"] == "1"
    assert [p.name for p in small_disk.iterdir()] == ["run"]
    results_contract.write_run(folder, {"run_id": "run", "started_at": "3"}, samples)
    assert json.loads((folder / "meta.json").read_text())["started_at"] == "3"


def test_accounting_again_is_refused_clearly_where_it_cannot_be_done(bare_run, tmp_path, capsys):
    _, _, work, results, _ = bare_run
    assert rerun.main(["--account", str(tmp_path / "nothing")]) == 1
    assert "no raw files of" in capsys.readouterr().err
    rawfiles.save(work, bare_run[4], finishing.accounting_how(bare_run[0], bare_run[1]))
    results.mkdir(parents=True)
    assert rerun.main(["--account", str(work), "--results", str(results.parent)]) == 1
    assert "exists already" in capsys.readouterr().err
    assert work.exists()


def test_the_energy_per_record_comes_with_the_counts():
    """The meter's summary is taken before accounting: each window's records and joules per
    record are filled in from the counts, never guessed where a window was not reached."""
    run = {"from": "sending", "to": "sent", "seconds": 10.0, "joules": 300.0, "mean_w": 30.0,
           "records": None, "joules_per_record": None}  # fmt: skip
    energy = {"available": True, "hosts": {}, "windows": {"run": run, "measured": None}}
    filled = rawfiles.with_records(energy, {"run": 1200, "measured": 1100})
    assert filled["windows"]["run"] == {**run, "records": 1200, "joules_per_record": 0.25}
    assert filled["windows"]["measured"] is None
    assert energy["windows"]["run"]["records"] is None  # the meter's own summary is left as it was
