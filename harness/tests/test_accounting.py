import csv
import json

import pytest
from hvbench_harness.accounting import account, latency_stats
from hvbench_job.dead_letters import LOST_PREFIX
from hvbench_load.consumer import FIELDS as RECEIVED_FIELDS
from hvbench_load.probe import probe_record
from hvbench_load.producers import MALFORMED_KINDS, malformed_record

MS = 1_000_000
RUN = "r1"
SENT_HEADER = ["detector", "seq", "intended_ns", "sent_ns", "delivered"]


def write_csv(path, header, rows):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)
    return path


def write_lines(path, items):
    path.write_text("".join(json.dumps(x) + "\n" for x in items))


def letter(record: str, key=None, reason="bad") -> dict:
    return {"reason": reason, "record": record, "record_chars": len(record), "key": key}


@pytest.fixture
def run_files(tmp_path):
    """Ten records of one detector every 100 ms; seq 3 lost, seq 5 received twice, seq 7
    dead-lettered; one malformed record injected and dead-lettered; one stray result with the
    run's id; the readiness probe's dead letter."""
    sent = [("athens", i, i * 100 * MS, i * 100 * MS + 1000, 1) for i in range(10)]
    write_csv(tmp_path / "sent.csv", SENT_HEADER, sent)
    received = []
    for det, seq, intended, sent_ns, _ in sent:
        if seq in (3, 7):
            continue
        received.append(
            (det, seq, intended, sent_ns, sent_ns + (seq + 1) * MS, 1, 1, 1.0, 1.0, "a/b")
        )
    received.append(("athens", 5, 500 * MS, 500 * MS + 1000, 500 * MS + 50 * MS, 1, 1, 1, 1, "a/b"))
    received.append(("athens", 99, 0, 0, 1, 1, 1, 1, 1, "a/b"))
    write_csv(tmp_path / "received.csv", RECEIVED_FIELDS, received)
    injected = malformed_record(RUN, 0)
    write_lines(tmp_path / "malformed.jsonl", [injected])
    write_lines(
        tmp_path / "dead_letters.jsonl",
        [
            letter(
                "{...}", {"run": RUN, "detector": "athens", "seq": 7, "sent_ns": 700 * MS + 1000}
            ),
            letter(injected),
            letter(probe_record(RUN)),
        ],
    )
    return tmp_path


def test_every_record_is_accounted_for(run_files):
    samples, counts, letters = account(run_files, RUN, 200 * MS, probe_record(RUN))
    assert len(samples) == 10 and len(letters) == 3
    assert counts.sent == 10
    assert counts.received == 8
    assert counts.missing == 1  # seq 3
    assert counts.dead_lettered == 1  # seq 7
    assert counts.duplicated == 1  # seq 5
    assert counts.unexpected == 1  # seq 99: foreign, not a problem
    assert counts.malformed_sent == counts.malformed_dead_lettered == 1
    assert counts.foreign_dead_letters == 0  # the probe is expected
    assert counts.warmup == 2 and counts.measured == 6  # seq 0 and 1 are warm-up
    assert not counts.accounted
    problems = " ".join(counts.problems())
    assert "1 sent records never came back" in problems
    assert "1 valid records were dead-lettered" in problems
    row = samples.set_index("seq").loc[5]
    assert row.copies == 2 and row.latency_ns == 6 * MS  # first copy counts


def test_statistics_exclude_warmup_and_take_the_exact_maximum(run_files):
    samples, _, _ = account(run_files, RUN, 200 * MS)
    stats = latency_stats(samples)
    assert stats["n"] == 6  # seq 2, 4, 5, 6, 8, 9
    assert stats["max_ms"] == 10.0  # seq 9, exactly
    assert stats["p50_ms"] == 6.0  # nearest rank: the 3rd of 3, 5, 6, 7, 9, 10
    from_intended = latency_stats(samples, "latency_from_intended_ns")
    assert from_intended["max_ms"] == pytest.approx(10.001)


@pytest.fixture
def clean_run(tmp_path):
    sent = [("athens", i, i, i + 1, 1) for i in range(3)]
    write_csv(tmp_path / "sent.csv", SENT_HEADER, sent)
    header = ["detector", "seq", "intended_ns", "sent_ns", "received_ns"]
    write_csv(tmp_path / "received.csv", header, [(d, s, i, t, t + 5) for d, s, i, t, _ in sent])
    return tmp_path


def test_a_clean_run_is_accounted(clean_run):
    _, counts, _ = account(clean_run, RUN, 0)
    assert counts.accounted and counts.problems() == [] and counts.measured == 3


def test_look_alike_dead_letters_from_outside_the_run_are_foreign_not_a_problem(clean_run):
    """The reported case: seq JSON true must not stand for seq 1 (True == 1 in Python)."""
    write_lines(
        clean_run / "dead_letters.jsonl",
        [
            letter('{"seq": true}', {"run": RUN, "detector": "athens", "seq": None, "sent_ns": 2}),
            letter("{}", {"run": "other-run", "detector": "athens", "seq": 1, "sent_ns": 2}),
            letter("{}", {"run": RUN, "detector": "athens", "seq": 12345, "sent_ns": 2}),
            letter("{}", {"run": RUN, "detector": "athens", "seq": 1, "sent_ns": 3}),  # not its
            letter("{}", {"run": RUN, "detector": 1, "seq": 1, "sent_ns": 2}),
            letter("{}", None),
            letter("malformed-0"),  # the old substring marker means nothing now
        ],
    )
    (clean_run / "consumer.json").write_text(json.dumps({"foreign_results": 4}))
    _, counts, _ = account(clean_run, RUN, 0)
    assert counts.dead_lettered == 0 and counts.foreign_dead_letters == 7
    assert counts.foreign_results == 4
    assert counts.accounted and "4 results of other runs" in counts.foreign()
    assert "7 dead letters" in counts.foreign()


def test_a_record_received_and_dead_lettered_is_a_contradiction(clean_run):
    write_lines(
        clean_run / "dead_letters.jsonl",
        [letter("{}", {"run": RUN, "detector": "athens", "seq": 1, "sent_ns": 2})],
    )
    _, counts, _ = account(clean_run, RUN, 0)
    assert counts.contradictions == 1 and counts.missing == 0
    assert "1 records were both received and dead-lettered" in counts.problems()


def test_a_cut_dead_letter_matches_its_injected_record_by_prefix_and_exact_length(clean_run):
    oversized = malformed_record(RUN, MALFORMED_KINDS.index("oversized"))
    other_run = malformed_record("r2", MALFORMED_KINDS.index("oversized"))
    write_lines(clean_run / "malformed.jsonl", [oversized])
    cut = {**letter(oversized[:9000]), "record_chars": len(oversized)}
    wrong_length = {**letter(oversized[:9000]), "record_chars": len(oversized) + 1}
    foreign = {**letter(other_run[:9000]), "record_chars": len(other_run)}
    write_lines(clean_run / "dead_letters.jsonl", [cut, wrong_length, foreign])
    _, counts, _ = account(clean_run, RUN, 0)
    assert counts.malformed_dead_lettered == 1 and counts.foreign_dead_letters == 2


def test_a_result_with_the_runs_key_but_another_send_stamp_is_not_that_record(clean_run):
    header = ["detector", "seq", "intended_ns", "sent_ns", "received_ns"]
    rows = [("athens", s, s, s + 1, s + 6) for s in (0, 2)] + [("athens", 1, 1, 999, 1005)]
    write_csv(clean_run / "received.csv", header, rows)
    _, counts, _ = account(clean_run, RUN, 0)
    assert counts.received == 2 and counts.missing == 1 and counts.unexpected == 1


def test_dead_letters_the_job_could_not_write_are_counted_from_its_log(clean_run):
    (clean_run / "job.out").write_text(f"INFO x\n{LOST_PREFIX} (1 so far): too large\n")
    _, counts, _ = account(clean_run, RUN, 0)
    assert counts.dead_letters_lost == 1 and not counts.accounted


def test_a_run_stopped_before_its_files_were_written_counts_what_there_is(tmp_path):
    """A part that never ran writes nothing: counts are zero, nothing raises."""
    samples, counts, letters = account(tmp_path, RUN, 0)
    assert len(samples) == 0 and letters == [] and counts.sent == 0 and counts.received == 0


def test_sent_but_never_acknowledged_is_undelivered_not_missing(clean_run):
    sent = [("athens", i, i, i + 1, int(i < 3)) for i in range(5)]
    write_csv(clean_run / "sent.csv", SENT_HEADER, sent)
    _, counts, _ = account(clean_run, RUN, 0)
    assert counts.undelivered == 2 and counts.missing == 0 and counts.received == 3


def test_two_client_pairs_are_accounted_together_each_row_with_its_pair(tmp_path):
    """Pair 0 sends athens, pair 1 berlin, each pair's files of its own (accounting.pair_file);
    a latency is two stamps of one pair's files; each consumer's foreign results add up."""
    for pair, detector in enumerate(("athens", "berlin")):
        suffix = "" if pair == 0 else f"-{pair}"
        sent = [(detector, i, i * 100 * MS, i * 100 * MS + 10, 1) for i in range(5)]
        received = [
            (d, s, i, sn, sn + (pair + 1) * MS, 1, 1, 1, 1, "a/b") for d, s, i, sn, _ in sent
        ]
        write_csv(tmp_path / f"sent{suffix}.csv", SENT_HEADER, sent)
        write_csv(tmp_path / f"received{suffix}.csv", RECEIVED_FIELDS, received[: 4 + pair])
        (tmp_path / f"consumer{suffix}.json").write_text(json.dumps({"foreign_results": 1}))
    samples, counts, _ = account(tmp_path, RUN, 0, None, pairs=2)
    assert (counts.sent, counts.received, counts.missing, counts.foreign_results) == (10, 9, 1, 2)
    by_pair = samples.groupby("client")
    assert by_pair["detector"].unique().map(list).to_dict() == {0: ["athens"], 1: ["berlin"]}
    assert by_pair["latency_ns"].max().to_dict() == {0: MS, 1: 2 * MS}
    # one pair's files alone: the second pair's are not read
    assert account(tmp_path, RUN, 0, None)[1].sent == 5
