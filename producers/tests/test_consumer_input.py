"""What the consumer reads from the output and dead-letter topics is checked before it is kept:
a result is the run's own only with every integer in its range (0 <= value < 2**63), and no
message, whatever it holds, stops the consumer."""

import json

import pytest
from hvbench_load.consumer import letter_line, own_result, results_of

RESULT = {
    "run": "r1",
    "detector": "athens",
    "seq": 3,
    "intended_ns": 10,
    "sent_ns": 20,
    "predict_ns": 1,
    "route_ns": 1,
    "job_in_ns": 30,
    "job_out_ns": 40,
    "route": ["a", "b"],
}


def own_key(value: bytes, run_id: str) -> tuple[str, int] | None:
    """(detector, seq) of what the consumer takes as a result of run_id; None if not one."""
    record = own_result(value, run_id)
    return None if record is None else (record["detector"], record["seq"])


def result(**changes) -> bytes:
    return json.dumps({**RESULT, **changes}).encode()


def test_a_result_of_the_run_in_range_is_its_own():
    assert own_key(result(), "r1") == ("athens", 3)
    assert own_key(result(seq=2**63 - 1, sent_ns=0), "r1") == ("athens", 2**63 - 1)
    without_job_stamps = {
        k: v for k, v in RESULT.items() if not k.endswith(("job_in_ns", "_out_ns"))
    }
    assert own_key(json.dumps(without_job_stamps).encode(), "r1") == ("athens", 3)


@pytest.mark.parametrize(
    "changes",
    [
        {"seq": 10**40},
        {"seq": 2**63},
        {"seq": -1},
        {"seq": True},
        {"intended_ns": 2**64},
        {"sent_ns": "20"},
        {"intended_ns": None},
        {"job_in_ns": 10**40},
        {"route_ns": -5},
        {"route": [1, 2]},
        {"route": "a/b"},
        {"run": "r2"},
    ],
    ids=repr,
)
def test_a_result_out_of_range_or_of_the_wrong_type_is_foreign(changes):
    assert own_key(result(**changes), "r1") is None


@pytest.mark.parametrize(
    "value", [b"", b"\xff\xfe", b"[" * 100_000 + b"]" * 100_000, b'{"run": "r1"', b"null"]
)
def test_no_output_message_stops_the_consumer(value):
    for one in results_of(value):
        assert own_key(one, "r1") is None


def test_each_dead_letter_is_kept_and_anything_else_on_its_topic_kept_as_text():
    letter = {"reason": "bad", "record": "x", "record_chars": 1, "key": None}
    assert json.loads(letter_line(json.dumps(letter).encode(), 5)) == {**letter, "received_ns": 5}
    for value in (b"", b"\xff", b"[1, 2]", b"[" * 100_000 + b"]" * 100_000):
        kept = json.loads(letter_line(value, 5))
        assert kept["not_a_letter"] == value[:300].decode(errors="replace")
        assert kept["bytes"] == len(value) and kept["received_ns"] == 5
