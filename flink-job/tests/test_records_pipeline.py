import json
import math
import re

import pytest
from hvbench_job import detectors
from hvbench_job.pipeline import Pipeline
from hvbench_job.records import (
    DEAD_LETTER_MAX_BYTES,
    REASON_MAX_CHARS,
    InputRecord,
    RecordError,
    dead_letter,
    parse,
    parse_message,
)
from hypothesis import given, settings
from hypothesis import strategies as st

import tsc_timer

GOOD = InputRecord("run-1", "athens", 7, 58.5, tuple(float(100 + i) for i in range(12)), 10, 20)


def with_changes(**changes) -> str:
    obj = json.loads(GOOD.to_json())
    for key, value in changes.items():
        if value is None:
            del obj[key]
        else:
            obj[key] = value
    return json.dumps(obj)


def test_a_valid_record_round_trips():
    assert parse(GOOD.to_json()) == GOOD
    assert parse(GOOD.to_json().encode()) == GOOD


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        ("not json", "not JSON"),
        ("[1, 2]", "not a JSON object"),
        (b"\xff\xfe", "not UTF-8"),
        (with_changes(flows=None), "missing field(s): flows"),
        (with_changes(seq=None, sent_ns=None), "missing field(s): seq, sent_ns"),
        (with_changes(flows=[1.0] * 11), "must hold 12 values, got 11"),
        (with_changes(flows="12 flows"), "must be a list"),
        (with_changes(flows=[1.0] * 11 + ["x"]), "flows[11] must be a number"),
        (with_changes(flows=[-1.0] + [1.0] * 11), "non-negative"),
        (GOOD.to_json().replace("100.0", "NaN", 1), "NaN is not a valid number"),
        (GOOD.to_json().replace("58.5", "Infinity"), "Infinity is not a valid number"),
        (with_changes(detector="nowhere"), "unknown detector 'nowhere'"),
        (with_changes(seq=1.5), "'seq' must be an integer"),
        (with_changes(seq=True), "'seq' must be an integer"),
        (with_changes(sent_ns=-1), "'sent_ns' must be non-negative"),
        (with_changes(run=None), "missing field(s): run"),
        (with_changes(run=7), "'run' must be a string"),
        (with_changes(detector=["athens"]), "unknown detector ['athens']"),
    ],
)
def test_malformed_records_are_refused_with_their_reason(raw, reason):
    with pytest.raises(RecordError) as e:
        parse(raw)
    assert reason in str(e.value)


def test_dead_letter_keeps_the_record_and_the_reason():
    letter = json.loads(dead_letter("x" * 20_000, "too long"))
    assert letter["reason"] == "too long"
    assert letter["record_chars"] == 20_000 and len(letter["record"]) == 10_000
    assert json.loads(dead_letter(b"\xff", "bad"))["record"] == "\ufffd"


def refusal(raw: str | bytes) -> tuple[str, dict]:
    """(the dead letter as bytes, decoded) of a record the job refuses."""
    with pytest.raises(RecordError) as e:
        parse(raw)
    letter = dead_letter(raw, str(e.value), e.value.key).encode()
    return letter, json.loads(letter)


def test_a_huge_bad_value_gives_a_small_dead_letter_with_the_lengths_kept():
    """The reported case: ~800 KB with a bad value, quoted whole and inflated by escaping."""
    raw = with_changes(speed_mph='"\\' * 200_000)  # escaping doubles every character
    assert 790_000 < len(raw.encode()) < 1_048_576  # within what the input topic accepts
    letter, doc = refusal(raw)
    assert len(letter) <= DEAD_LETTER_MAX_BYTES
    assert doc["record_chars"] == len(raw) and raw.startswith(doc["record"])
    assert "speed_mph" in doc["reason"] and "characters)" in doc["reason"]
    assert doc["key"] == {"run": "run-1", "detector": "athens", "seq": 7, "sent_ns": 20}


def test_a_long_reason_is_cut_and_its_length_kept():
    doc = json.loads(dead_letter("{}", "r" * 5000))
    assert len(doc["reason"]) == REASON_MAX_CHARS and doc["reason_chars"] == 5000


def test_the_key_holds_only_identity_fields_of_the_right_json_type():
    assert refusal(with_changes(seq=True))[1]["key"] == {
        "run": "run-1",
        "detector": "athens",
        "seq": None,  # JSON true is not the integer 1
        "sent_ns": 20,
    }
    assert refusal(with_changes(run=1, detector=None, sent_ns="20"))[1]["key"] == {
        "run": None,
        "detector": None,
        "seq": 7,
        "sent_ns": None,
    }
    assert refusal("[1]")[1]["key"] is None


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=40_000))
def test_any_bytes_give_a_bounded_dead_letter(raw):
    try:
        parse(raw)
    except RecordError as e:
        letter = dead_letter(raw, str(e), e.key)
        assert len(letter.encode()) <= DEAD_LETTER_MAX_BYTES
        assert json.loads(letter)["record_chars"] == len(raw.decode("utf-8", "replace"))


SCALARS = st.none() | st.booleans() | st.integers() | st.text()
JSON = st.recursive(
    SCALARS | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: st.lists(inner, max_size=6) | st.dictionaries(st.text(), inner, max_size=6),
    max_leaves=60,
)


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["run", "detector", "seq", "flows", "speed_mph", "sent_ns", "x"]), JSON
    ),
    st.text(min_size=0, max_size=3).map(lambda s: s * 3000),  # control and wide characters
)
def test_any_json_object_gives_a_bounded_dead_letter_or_a_valid_record(fields, filler):
    obj = {**json.loads(GOOD.to_json()), **fields, "pad": filler}
    raw = json.dumps(obj, ensure_ascii=False)
    try:
        record = parse(raw)
    except RecordError as e:
        letter = dead_letter(raw, str(e), e.key)
        assert len(letter.encode()) <= DEAD_LETTER_MAX_BYTES
        key = json.loads(letter)["key"]
        assert key["seq"] is None or type(key["seq"]) is int
    else:
        assert type(record.seq) is int and isinstance(record.run, str)


@pytest.fixture(scope="module")
def pipeline(small_model):
    return Pipeline(small_model)


def test_pipeline_forecasts_routes_and_copies_the_stamps(pipeline):
    outcome = pipeline.process(GOOD.to_json())
    assert outcome.dead_letter is None
    out = json.loads(outcome.output)
    for field in ("run", "detector", "seq", "speed_mph", "flows", "intended_ns", "sent_ns"):
        assert out[field] == json.loads(GOOD.to_json())[field]
    assert out["predicted_flow"] == pytest.approx(pipeline.forecaster.predict(GOOD.flows), abs=1e-3)
    assert out["route"][0] == detectors.DEFAULT_ORIGIN
    assert out["route"][-1] == detectors.DEFAULT_DESTINATION
    assert math.isfinite(out["route_cost_s"]) and out["route_cost_s"] > 0
    assert out["predict_ns"] > 0 and out["route_ns"] > 0
    # arrival and hand-off stamps bracket the job's own work
    assert out["job_out_ns"] - out["job_in_ns"] >= out["predict_ns"] + out["route_ns"]


def test_pipeline_stamps_on_an_adopted_calibration(small_model):
    """Given the run's calibration (the job on the machine that stamps send and receipt), the
    job's stamps are on that clock: a calibration whose origin lies an hour ahead moves them."""
    current = tsc_timer.calibration() or tsc_timer.calibrate(force=True)
    try:
        ahead = {**current.as_dict(), "base_ns": current.base_ns + 3600 * 10**9}
        on_current_clock = tsc_timer.now_ns()
        pipeline = Pipeline(small_model, calibration=ahead)
        out = json.loads(pipeline.process(GOOD.to_json()).output)
        assert out["job_in_ns"] - on_current_clock >= 3600 * 10**9
        assert out["job_in_ns"] <= out["job_out_ns"] <= tsc_timer.now_ns()
    finally:
        tsc_timer.adopt(current.as_dict())


def test_pipeline_sends_malformed_records_to_the_dead_letter_and_goes_on(pipeline):
    before = pipeline.refused
    outcome = pipeline.process(with_changes(flows=[1.0] * 3))
    assert outcome.output is None
    assert "must hold 12 values" in json.loads(outcome.dead_letter)["reason"]
    assert pipeline.refused == before + 1
    assert pipeline.process(GOOD.to_json()).output is not None


def test_pipeline_keeps_the_latest_state_per_detector(pipeline):
    """A crawl measured at Wilmington on 405S, kept as state, moves later routes off it."""
    fresh = Pipeline(pipeline.forecaster.directory)
    free = json.loads(fresh.process(GOOD.to_json()).output)["route"]
    crawl = with_changes(detector="wilmington", speed_mph=8.0, flows=[1.0] * 12)
    assert fresh.process(crawl).output is not None  # congested branch: 8 mph at low flow
    jammed = json.loads(fresh.process(GOOD.to_json()).output)["route"]
    assert "wilmington" in free and "wilmington" not in jammed


def test_a_message_is_one_record_or_an_array_each_element_checked_alone():
    assert parse_message(GOOD.to_json()) == [GOOD]
    bad = json.loads(with_changes(detector="nowhere"))
    items = parse_message(json.dumps([json.loads(GOOD.to_json()), bad, 3]))
    assert items[0] == GOOD
    assert isinstance(items[1], RecordError) and str(items[1]).startswith("element 1 of 3: ")
    assert "unknown detector 'nowhere'" in str(items[1]) and items[1].key["seq"] == GOOD.seq
    assert json.loads(items[1].element) == bad
    assert "not a JSON object but int" in str(items[2]) and items[2].key is None


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        ("[]", "not a JSON object or a non-empty array"),
        ('"text"', "not a JSON object or a non-empty array"),
        ("[" + ",".join(["{}"] * 1001) + "]", "an array of 1001 records, more than 1000"),
        ("[{]", "not JSON"),
    ],
)
def test_a_message_refused_as_a_whole(raw, reason):
    with pytest.raises(RecordError, match=re.escape(reason)):
        parse_message(raw)


def test_an_array_is_forecast_in_one_batch_and_answered_with_one_array(small_model):
    """The batch path gives what one record at a time gives, in order; a bad element is a dead
    letter of its own and the others go on."""
    records = [
        GOOD,
        json.loads(with_changes(detector="nowhere", seq=8)),
        *(InputRecord("run-1", d, 9 + i, 30.0 + i, tuple(float(50 * i + k) for k in range(12)),
                      1, 2) for i, d in enumerate(["wilmington", "long_beach", "athens"] * 4)),
    ]  # fmt: skip
    raw = json.dumps([r if isinstance(r, dict) else json.loads(r.to_json()) for r in records])
    batched = Pipeline(small_model).process_message(raw)
    alone = Pipeline(small_model)
    expected = [
        json.loads(alone.process(r.to_json()).output) for r in records if isinstance(r, InputRecord)
    ]
    outputs = json.loads(batched.output)
    assert [o["seq"] for o in outputs] == [e["seq"] for e in expected]
    for got, want in zip(outputs, expected, strict=True):
        assert got["predicted_flow"] == pytest.approx(want["predicted_flow"], abs=1e-3)
        assert got["route"] == want["route"] and got["route_cost_s"] == want["route_cost_s"]
        assert got["job_in_ns"] + got["predict_ns"] + got["route_ns"] <= got["job_out_ns"]
    (letter,) = [json.loads(x) for x in batched.dead_letters]
    assert letter["reason"].startswith("element 1 of 14: unknown detector")
    # the job answers the message's client pair, named by its (first) record's detector
    assert batched.detector == outputs[0]["detector"]
    assert letter["key"]["seq"] == 8 and json.loads(letter["record"])["detector"] == "nowhere"


def test_an_array_of_only_bad_elements_gives_dead_letters_and_no_output(pipeline):
    outcome = pipeline.process_message(json.dumps([1, 2]))
    assert outcome.output is None and len(outcome.dead_letters) == 2
    whole = pipeline.process_message("[]")
    assert whole.output is None
    assert "non-empty array" in json.loads(whole.dead_letters[0])["reason"]


def test_pipeline_refuses_an_unknown_route_end(small_model):
    with pytest.raises(KeyError):
        Pipeline(small_model, origin="nowhere")
