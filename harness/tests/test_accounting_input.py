"""Accounting never fails on what the parts' files hold: a row out of range or malformed is
left out and counted (`unreadable_rows`, a problem), the rest is accounted as usual. And a
result written to the output topic by someone else with the run's id and seq 10**40 ends as a
foreign result, never in the received file."""

import csv
import json

from hvbench_harness.accounting import account, read_csv
from hvbench_load.consumer import FIELDS as RECEIVED_FIELDS
from hvbench_load.consumer import Receiver

MS = 1_000_000
RUN = "r1"
SENT_HEADER = ["detector", "seq", "intended_ns", "sent_ns", "delivered"]


def write_csv(path, header, rows) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)


def sent_rows(n: int = 10) -> list[tuple]:
    return [("athens", i, i * 100 * MS, i * 100 * MS + 1000, 1) for i in range(n)]


def received_row(det, seq, intended, sent_ns) -> tuple:
    return (det, seq, intended, sent_ns, sent_ns + MS, 1, 1, 1, 2, 1.0, 1.0, "a/b")


def test_a_good_file_is_read_as_before_with_64_bit_integers(tmp_path):
    write_csv(tmp_path / "sent.csv", SENT_HEADER, sent_rows())
    table, left_out = read_csv(tmp_path / "sent.csv", SENT_HEADER)
    assert left_out == 0 and len(table) == 10
    assert {str(table[c].dtype) for c in SENT_HEADER[1:]} == {"int64"}


def test_rows_out_of_range_or_malformed_are_left_out_and_counted(tmp_path):
    sent = sent_rows()
    write_csv(tmp_path / "sent.csv", SENT_HEADER, sent)
    received = [received_row(*row[:4]) for row in sent]
    received += [
        received_row("athens", 10**40, 0, 0),  # a 64-bit column cannot hold it
        received_row("athens", 2**63, 0, 0),
        received_row("athens", 4, 10**40, 400 * MS + 1000),
        received_row("athens", -1, 0, 0),
        received_row("athens", "1.5", 0, 0),
        received_row("athens", "", 0, 0),
        (*received_row("athens", 5, 0, 0), "an extra field"),
    ]
    write_csv(tmp_path / "received.csv", RECEIVED_FIELDS, received)
    with open(tmp_path / "dead_letters.jsonl", "w") as f:
        f.write('{"reason": "bad", "key": {"run": "r1", "seq": 100000000000000000000000}}\n')
        f.write('{"reason": "cut sho\n')  # a line cut short
    samples, counts, letters = account(tmp_path, RUN, 0)
    assert counts.unreadable_rows == 7 + 1
    assert counts.sent == counts.received == 10 and counts.missing == 0
    assert counts.unexpected == 0 and counts.foreign_dead_letters == 1
    assert len(letters) == 1 and samples.received_ns.notna().all()
    assert "8 rows of the parts' files could not be read" in " ".join(counts.problems())
    assert samples.seq.dtype == "int64" and samples.sent_ns.dtype == "int64"


def test_a_file_of_only_bad_rows_leaves_an_empty_table(tmp_path):
    write_csv(tmp_path / "sent.csv", SENT_HEADER, [("athens", 10**40, 0, 0, 1)])
    table, left_out = read_csv(tmp_path / "sent.csv", SENT_HEADER)
    assert left_out == 1 and len(table) == 0


def test_a_result_with_seq_10_40_is_foreign_from_the_consumer_to_the_counts(tmp_path):
    """The reported case: the run's id and a JSON integer seq of 10**40 on the output topic."""
    sent = sent_rows(3)
    write_csv(tmp_path / "sent.csv", SENT_HEADER, sent)
    receiver = Receiver("127.0.0.1:1", ["output", "dead-letter"], "g", RUN, 3)
    try:
        for det, seq, intended, sent_ns, _ in sent:
            good = {"run": RUN, "detector": det, "seq": seq, "intended_ns": intended}
            receiver._take_result(json.dumps({**good, "sent_ns": sent_ns}).encode(), sent_ns + MS)
        forged = {"run": RUN, "detector": "athens", "seq": 10**40, "intended_ns": 0, "sent_ns": 0}
        receiver._take_result(json.dumps(forged).encode(), 5)
        receiver.dead_letters += [(6, b""), (7, b"\xff")]  # a tombstone, and not JSON
    finally:
        receiver.close()
    receiver.write(
        tmp_path / "received.csv", tmp_path / "dead_letters.jsonl", tmp_path / "consumer.json"
    )
    samples, counts, _ = account(tmp_path, RUN, 0)
    assert len(samples) == 3 and list(samples.seq) == [0, 1, 2]
    assert counts.received == 3 and counts.foreign_results == 1 and counts.unexpected == 0
    assert counts.foreign_dead_letters == 2 and counts.unreadable_rows == 0
    assert counts.accounted
