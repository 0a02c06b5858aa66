"""Whatever a message holds, the job's step per message (Pipeline.process_message, what the
Flink operator calls with the bytes it reads, None for a tombstone) gives a result or dead
letters, each with its reason and at most DEAD_LETTER_MAX_BYTES; it never raises. One test per
input class, at and over each limit, and property tests over any bytes and any JSON."""

import json

import pytest
from hvbench_job import pipeline as pipeline_module
from hvbench_job.pipeline import Pipeline
from hvbench_job.records import (
    DEAD_LETTER_MAX_BYTES,
    IDENTITY_MAX_CHARS,
    MESSAGE_MAX_RECORDS,
    OUTPUT_MAX_BYTES,
    RecordError,
    parse_message,
    shown,
)
from hypothesis import given, settings
from hypothesis import strategies as st

GOOD = {
    "run": "run-1",
    "detector": "athens",
    "seq": 7,
    "speed_mph": 58.5,
    "flows": [float(100 + i) for i in range(12)],
    "intended_ns": 10,
    "sent_ns": 20,
}
GOOD_TEXT = json.dumps(GOOD).encode()


def message(**changes) -> bytes:
    return json.dumps({**GOOD, **changes}).encode()


def nested(depth: int, inner: str = "1") -> str:
    return "[" * depth + inner + "]" * depth


@pytest.fixture(scope="module")
def pipeline(small_model):
    return Pipeline(small_model)


def letters_of(outcome) -> list[dict]:
    """The outcome's dead letters, each checked to be bounded JSON."""
    for letter in outcome.dead_letters:
        assert len(letter.encode()) <= DEAD_LETTER_MAX_BYTES
    return [json.loads(letter) for letter in outcome.dead_letters]


REFUSED = [
    ("tombstone", None, "a null value (a Kafka tombstone)"),
    ("empty value", b"", "an empty value"),
    ("only spaces", b" \n ", "not JSON"),
    ("not UTF-8", b'{"run": "\xff\xfe"}', "not UTF-8: 'utf-8' codec can't decode byte 0xff"),
    ("UTF-16, which json.loads would take", GOOD_TEXT.decode().encode("utf-16"), "not UTF-8"),
    ("a UTF-8 byte order mark", b"\xef\xbb\xbf" + GOOD_TEXT, "not JSON: Unexpected UTF-8 BOM"),
    ("seq 2**63", message(seq=2**63), "'seq' must be below 2**63 (signed 64 bits): 9223"),
    ("seq 10**40", message(seq=10**40), "'seq' must be below 2**63"),
    ("intended_ns 2**64", message(intended_ns=2**64), "'intended_ns' must be below 2**63"),
    ("sent_ns 2**63", message(sent_ns=2**63), "'sent_ns' must be below 2**63"),
    ("seq -1", message(seq=-1), "'seq' must be non-negative"),
    ("an integer of 5,000 digits", message(seq=0).replace(b'"seq": 0', b'"seq": ' + b"9" * 5000),
     "not JSON: Exceeds the limit (4300 digits)"),
    ("a flow beyond any float", message(flows=[10**400] + [1.0] * 11), "flows[0] is too large"),
    ("a flow of 1e400", message(speed_mph=1).replace(b'"speed_mph": 1', b'"speed_mph": 1e400'),
     "'speed_mph' must be finite"),
    ("a flow of 1e300, inf in the model's float32", message(flows=[1e300] + [1.0] * 11),
     "flows must be at most 1e+06 vehicles"),
    ("a speed of 1e300", message(speed_mph=1e300), "'speed_mph' must lie in 0..1000"),
    ("100,000 nested arrays", nested(100_000).encode(), "nested deeper than the JSON parser"),
    ("100,000 nested objects", ('{"a":' * 100_000 + "1" + "}" * 100_000).encode(),
     "nested deeper than the JSON parser"),
    ("a repeated key", GOOD_TEXT.replace(b"}", b', "seq": 8}'), "given more than once: 'seq'"),
    ("run over its limit", message(run="r" * (IDENTITY_MAX_CHARS + 1)),
     f"field 'run' is longer than {IDENTITY_MAX_CHARS} characters"),
    ("too many records", json.dumps([GOOD] * (MESSAGE_MAX_RECORDS + 1)).encode(),
     f"more than {MESSAGE_MAX_RECORDS}"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("raw", "reason"), [(raw, reason) for _, raw, reason in REFUSED], ids=[x[0] for x in REFUSED]
)
def test_each_bad_input_class_is_one_dead_letter_with_its_reason(pipeline, raw, reason):
    outcome = pipeline.process_message(raw)
    assert outcome.output is None
    [letter] = letters_of(outcome)
    assert reason in letter["reason"]


def test_a_tombstone_and_bytes_that_are_not_utf8_are_quoted_as_they_can_be(pipeline):
    [tombstone] = letters_of(pipeline.process_message(None))
    assert tombstone["record"] == "" and tombstone["record_chars"] == 0
    assert tombstone["key"] is None
    [bad] = letters_of(pipeline.process_message(b'{"a": "\xff"}'))
    assert bad["record"] == '{"a": "\ufffd"}'


def test_an_integer_out_of_range_keeps_the_other_identity_fields(pipeline):
    [letter] = letters_of(pipeline.process_message(message(seq=10**40)))
    assert letter["key"] == {"run": "run-1", "detector": "athens", "seq": None, "sent_ns": 20}


def test_a_repeated_key_gives_no_key_its_identity_is_ambiguous(pipeline):
    [letter] = letters_of(pipeline.process_message(GOOD_TEXT.replace(b"}", b', "run": "x"}')))
    assert letter["key"] is None


def test_a_value_nested_about_as_deep_as_the_parser_allows_is_refused_not_fatal(pipeline):
    """Every depth around the parser's limit, in a field and as an array element: refused
    with its reason, never an exception (quoting the value nests as deep again)."""
    for depth in range(900, 1_001):
        raw = json.dumps(GOOD).replace('"athens"', nested(depth), 1)
        [letter] = letters_of(pipeline.process_message(raw.encode()))
        assert "unknown detector" in letter["reason"] or "nested deeper" in letter["reason"]
        outcome = pipeline.process_message(f"[{json.dumps(GOOD)}, {nested(depth)}]".encode())
        [letter] = letters_of(outcome)
        if outcome.output is None:
            assert letter["reason"] == "nested deeper than the JSON parser allows"
        else:
            assert letter["reason"] == "element 1 of 2: not a JSON object but list"


def test_a_value_too_deep_to_quote_is_named_not_quoted():
    deep: list = []
    for _ in range(100_000):
        deep = [deep]
    assert shown(deep) == "a list nested too deep to quote"


def test_every_integer_limit_is_inclusive_below_2_63(pipeline):
    top = 2**63 - 1
    outcome = pipeline.process_message(message(seq=top, intended_ns=top, sent_ns=0))
    out = json.loads(outcome.output)
    assert (out["seq"], out["intended_ns"], out["sent_ns"]) == (top, top, 0)


def test_records_at_each_size_limit_are_processed(pipeline):
    at_limit = pipeline.process_message(message(run="r" * IDENTITY_MAX_CHARS))
    assert json.loads(at_limit.output)["run"] == "r" * IDENTITY_MAX_CHARS
    most = [{**GOOD, "seq": i} for i in range(MESSAGE_MAX_RECORDS)]
    answer = pipeline.process_message(json.dumps(most).encode())
    assert [o["seq"] for o in json.loads(answer.output)] == list(range(MESSAGE_MAX_RECORDS))
    assert answer.dead_letters == []
    # about what the input topic takes (1 MiB), in a field the job does not use
    big = message(pad="x" * 1_040_000)
    assert 1_040_000 < len(big) < 1_048_576
    assert json.loads(pipeline.process_message(big).output)["seq"] == GOOD["seq"]


def test_a_repeated_key_in_one_element_refuses_that_element_only(pipeline):
    bad = json.dumps({**GOOD, "seq": 8})[:-1] + ', "seq": 9}'
    outcome = pipeline.process_message(f"[{json.dumps(GOOD)}, {bad}]".encode())
    assert [o["seq"] for o in json.loads(outcome.output)] == [GOOD["seq"]]
    [letter] = letters_of(outcome)
    assert letter["reason"] == "element 1 of 2: key(s) given more than once: 'seq'"


def test_an_answer_over_the_output_limit_is_dead_lettered_record_by_record(pipeline, monkeypatch):
    """No message the job takes can make its answer one the output topic refuses (which would
    end the job): the limit is lowered here to reach it with a few records."""
    monkeypatch.setattr(pipeline_module, "OUTPUT_MAX_BYTES", 1_000)
    records = [{**GOOD, "seq": i} for i in range(5)]
    outcome = pipeline.process_message(json.dumps(records).encode())
    assert outcome.output is None
    letters = letters_of(outcome)
    assert [x["key"]["seq"] for x in letters] == list(range(5))
    assert all(
        "answer would be" in x["reason"] and "more than 1000" in x["reason"] for x in letters
    )


# --- property tests: never raises, always bounded --------------------------------------------

INTEGERS = st.integers() | st.sampled_from([2**63 - 1, 2**63, 2**64, 10**40, -(2**63), -1, 0])
FLOATS = st.floats(allow_nan=False, allow_infinity=False) | st.sampled_from([1e308, 5e-324])
SCALARS = st.none() | st.booleans() | INTEGERS | FLOATS | st.text(max_size=20)
JSON = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner, max_size=5)
    ),
    max_leaves=30,
)
FIELDS = st.sampled_from([*GOOD, "destination", "x"])
NUMBERS = INTEGERS | FLOATS
# records of the right shape with any values: these reach the forecast and the route
VALID_SHAPED = st.fixed_dictionaries(
    {"speed_mph": NUMBERS, "flows": st.lists(NUMBERS, min_size=12, max_size=12)},
    optional={"seq": INTEGERS, "sent_ns": INTEGERS, "intended_ns": INTEGERS},
)
RECORDS = (st.dictionaries(FIELDS, JSON, max_size=4) | VALID_SHAPED).map(
    lambda changes: {**GOOD, **changes}
)
MESSAGES = (
    st.none()
    | st.binary(max_size=2_000)
    | JSON.map(lambda v: json.dumps(v, ensure_ascii=False).encode())
    | RECORDS.map(lambda r: json.dumps(r, ensure_ascii=False).encode())
    | st.lists(RECORDS | JSON, min_size=1, max_size=4).map(lambda r: json.dumps(r).encode())
    # a good record with a few bytes put in somewhere: near-misses of every kind
    | st.tuples(st.integers(0, len(GOOD_TEXT)), st.binary(min_size=1, max_size=6)).map(
        lambda cut: GOOD_TEXT[: cut[0]] + cut[1] + GOOD_TEXT[cut[0] :]
    )
)


def records_in(raw: bytes | None) -> int | None:
    """How many records a message that parses as JSON holds (None: it does not parse)."""
    try:
        value = json.loads(raw.decode())
    except (AttributeError, ValueError, RecursionError):
        return None
    return len(value) if isinstance(value, list) and 0 < len(value) <= MESSAGE_MAX_RECORDS else 1


def refuse_constant(name: str) -> None:
    raise AssertionError(f"{name} in an answer")


@settings(max_examples=300, deadline=None)
@given(MESSAGES)
def test_parse_message_gives_records_or_refusals_and_raises_nothing_else(raw):
    try:
        items = parse_message(raw)
    except RecordError:
        return
    assert items and all(isinstance(x, RecordError) or x.seq < 2**63 for x in items)


@settings(max_examples=200, deadline=None)
@given(MESSAGES)
def test_any_message_gives_a_result_or_bounded_dead_letters_and_never_raises(pipeline, raw):
    outcome = pipeline.process_message(raw)
    letters = letters_of(outcome)
    assert outcome.output is not None or letters
    assert outcome.output is None or len(outcome.output.encode()) <= OUTPUT_MAX_BYTES
    # strict JSON: no NaN or Infinity, which json.dumps writes and other readers refuse
    strict = {"parse_constant": refuse_constant}
    answered = json.loads(outcome.output, **strict) if outcome.output is not None else []
    answered = answered if isinstance(answered, list) else [answered]
    for result in answered:
        assert 0 <= result["seq"] < 2**63 and 0 <= result["sent_ns"] < 2**63
    # each record of a message answered is answered or dead-lettered: none is lost
    expected = records_in(raw)
    if outcome.output is not None and expected is not None:
        assert len(answered) + len(letters) == expected
