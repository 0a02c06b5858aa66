import csv
import json

import pytest
from hvbench_harness.accounting import account, latency_stats
from hvbench_load.consumer import FIELDS as RECEIVED_FIELDS

MS = 1_000_000


def write_csv(path, header, rows):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)
    return path


@pytest.fixture
def run_files(tmp_path):
    """Ten records of one detector every 100 ms; seq 3 lost, seq 5 received twice, seq 7
    dead-lettered; one malformed record injected and dead-lettered; one stray result."""
    sent = [("athens", i, i * 100 * MS, i * 100 * MS + 1000, 1) for i in range(10)]
    write_csv(
        tmp_path / "sent.csv", ["detector", "seq", "intended_ns", "sent_ns", "delivered"], sent
    )
    header = RECEIVED_FIELDS
    received = []
    for det, seq, intended, sent_ns, _ in sent:
        if seq in (3, 7):
            continue
        received.append(
            (det, seq, intended, sent_ns, sent_ns + (seq + 1) * MS, 1, 1, 1.0, 1.0, "a/b")
        )
    received.append(("athens", 5, 500 * MS, 500 * MS + 1000, 500 * MS + 50 * MS, 1, 1, 1, 1, "a/b"))
    received.append(("athens", 99, 0, 0, 1, 1, 1, 1, 1, "a/b"))
    write_csv(tmp_path / "received.csv", header, received)
    letters = [
        {"reason": "nan", "record": json.dumps({"detector": "athens", "seq": 7})},
        {"reason": "not JSON", "record": '{"marker": "malformed-0", '},
    ]
    (tmp_path / "dead.jsonl").write_text("".join(json.dumps(x) + "\n" for x in letters))
    return tmp_path


def test_every_record_is_accounted_for(run_files):
    samples, counts, letters = account(
        run_files / "sent.csv",
        run_files / "received.csv",
        run_files / "dead.jsonl",
        warmup_ns=200 * MS,
        malformed_sent=1,
    )
    assert len(samples) == 10 and len(letters) == 2
    assert counts.sent == 10
    assert counts.received == 8
    assert counts.missing == 1  # seq 3
    assert counts.dead_lettered == 1  # seq 7
    assert counts.duplicated == 1  # seq 5
    assert counts.unexpected == 1  # seq 99
    assert counts.malformed_dead_lettered == 1
    assert counts.warmup == 2 and counts.measured == 6  # seq 0 and 1 are warm-up
    assert not counts.accounted
    problems = " ".join(counts.problems())
    assert "1 sent records never came back" in problems
    assert "1 valid records were dead-lettered" in problems
    row = samples.set_index("seq").loc[5]
    assert row.copies == 2 and row.latency_ns == 6 * MS  # first copy counts


def test_statistics_exclude_warmup_and_take_the_exact_maximum(run_files):
    samples, _, _ = account(
        run_files / "sent.csv",
        run_files / "received.csv",
        run_files / "dead.jsonl",
        warmup_ns=200 * MS,
    )
    stats = latency_stats(samples)
    assert stats["n"] == 6  # seq 2, 4, 5, 6, 8, 9
    assert stats["max_ms"] == 10.0  # seq 9, exactly
    assert stats["p50_ms"] == 6.0  # nearest rank: the 3rd of 3, 5, 6, 7, 9, 10
    from_intended = latency_stats(samples, "latency_from_intended_ns")
    assert from_intended["max_ms"] == pytest.approx(10.001)


def test_a_clean_run_is_accounted(run_files):
    sent = [("athens", i, i, i + 1, 1) for i in range(3)]
    write_csv(run_files / "s.csv", ["detector", "seq", "intended_ns", "sent_ns", "delivered"], sent)
    header = ["detector", "seq", "intended_ns", "sent_ns", "received_ns"]
    write_csv(run_files / "r.csv", header, [(d, s, i, t, t + 5) for d, s, i, t, _ in sent])
    _, counts, _ = account(run_files / "s.csv", run_files / "r.csv", run_files / "none.jsonl", 0)
    assert counts.accounted and counts.problems() == [] and counts.measured == 3
