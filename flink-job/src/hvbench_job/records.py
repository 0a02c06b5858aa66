"""The records that travel through Kafka, as JSON objects, and their validation.

Input (producers → input topic), one per detector every 100 ms:
    {"run": "<run id>", "detector": "el_segundo", "seq": 17, "speed_mph": 63.5,
     "flows": [12 numbers], "intended_ns": 123, "sent_ns": 456}
`run`, `detector`, `seq` and `sent_ns` name the record exactly: the harness counts a result or
a dead letter for a sent record only if all four match, with their JSON types.
`flows` are the detector's last 12 five-minute flows (vehicles per 5 minutes, oldest first);
`intended_ns` is when the open-loop schedule wanted the record sent and `sent_ns` when it was,
both TSC nanoseconds of the producers' machine: the job copies them through untouched.
`detector` is one of the run's network (hvbench_job.networks). An optional `"destination"`,
another detector of that network, is where the record's route goes (city-scale loads give one
per record); without it the route is the network's default one.

A message may also be a JSON array of such records (producers with `--messages group`: the
records of a detector group that fell due together), at most MESSAGE_MAX_RECORDS of them.
Each element is validated on its own: a bad one becomes its own dead letter, the others are
processed. The job answers an array with one array of outputs, in the same order.

Output (job → output topic): the input fields plus the forecast, the route and the job's own
stage durations (TSC ns deltas taken inside the job; never subtracted from producer stamps).

Integers: `seq`, `intended_ns` and `sent_ns` are JSON integers with 0 <= value < 2**63 (they
fit in signed 64 bits, as pandas, numpy and the consumer's files hold them). `run` is at most
IDENTITY_MAX_CHARS characters, so that a result's size is bounded.

What is refused, each with its reason: a null value (a Kafka tombstone), an empty value, bytes
that are not UTF-8, text that is not JSON (NaN and Infinity included), nesting deeper than the
JSON parser's limit (about 1,000 levels), an object that repeats a key (which of its values
counts would be a guess), a missing field or one of the wrong type or range, an unknown detector
or destination, an array of more than MESSAGE_MAX_RECORDS records, and a message whose answer
would exceed OUTPUT_MAX_BYTES (the output topic's limit). The broker itself refuses a message
over 1 MiB, so none reaches the job.

Dead letter (job → dead-letter topic), at most DEAD_LETTER_MAX_BYTES whatever the input:
    {"reason": "...", "reason_chars": 42, "record": "<the input as received, cut>",
     "record_chars": 812345,
     "key": {"run": ..., "detector": ..., "seq": ..., "sent_ns": ...} or null}
`key` holds the record's identity fields that have the right JSON type and range (others null).
A tombstone's letter has an empty `record` (record_chars 0); bytes that are not UTF-8 are quoted
with U+FFFD in place of each bad byte.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass

from hvbench_job import networks
from hvbench_job.forecast import LOOKBACK

REQUIRED = ("run", "detector", "seq", "speed_mph", "flows", "intended_ns", "sent_ns")
# A dead letter is at most this many bytes of UTF-8 JSON whatever the input (the broker
# accepts 1 MiB), so no input can make the dead-letter topic refuse one.
DEAD_LETTER_MAX_BYTES = 16_384
REASON_MAX_CHARS = 500
RECORD_MAX_CHARS = 10_000
MESSAGE_MAX_RECORDS = 1_000  # records in one array message
SHOWN_VALUE_CHARS = 60  # of an offending value quoted in a reason
IDENTITY_MAX_CHARS = 200  # longer run or detector names are nobody's
INTEGER_LIMIT = 2**63  # seq and the stamps fit in signed 64 bits
# Beyond any road's (a lane carries about 200 vehicles in five minutes), and far inside the
# model's float32: a flow of 1e300 would become inf there, and the forecast NaN.
FLOW_MAX = 1e6  # vehicles per five minutes
SPEED_MAX_MPH = 1000.0
# An answer is at most this many bytes (the sink's and the broker's limit is 1 MiB per record,
# its framing included); only an array message of many records comes near it.
OUTPUT_MAX_BYTES = 1_000_000


class RecordError(ValueError):
    """The record cannot be processed; the message is the reason given in the dead letter,
    `key` the record's identity where it had one (see identity())."""

    key: dict | None = None
    element: str | None = None  # an array element's own JSON, what its dead letter quotes


@dataclass(frozen=True)
class InputRecord:
    run: str
    detector: str
    seq: int
    speed_mph: float
    flows: tuple[float, ...]
    intended_ns: int
    sent_ns: int
    destination: str | None = None

    def to_json(self) -> str:
        fields = {
            "run": self.run,
            "detector": self.detector,
            "seq": self.seq,
            "speed_mph": self.speed_mph,
            "flows": list(self.flows),
            "intended_ns": self.intended_ns,
            "sent_ns": self.sent_ns,
        }
        if self.destination is not None:
            fields["destination"] = self.destination
        return json.dumps(fields, separators=(",", ":"))


def shown(value: object) -> str:
    """A value as a reason quotes it: its repr, cut to SHOWN_VALUE_CHARS."""
    try:
        text = repr(value)
    except RecursionError:  # nested about as deep as the parser allows
        return f"a {type(value).__name__} nested too deep to quote"
    if len(text) <= SHOWN_VALUE_CHARS:
        return text
    return f"{text[:SHOWN_VALUE_CHARS]}… ({len(text)} characters)"


def _is_integer(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)  # JSON true is no number


def _integer(obj: dict, name: str) -> int:
    value = obj[name]
    if not _is_integer(value):
        raise RecordError(f"field {name!r} must be an integer, got {shown(value)}")
    if value < 0:
        raise RecordError(f"field {name!r} must be non-negative, got {value}")
    if value >= INTEGER_LIMIT:
        raise RecordError(f"field {name!r} must be below 2**63 (signed 64 bits): {shown(value)}")
    return value


def _number(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise RecordError(f"{what} must be a number, got {shown(value)}")
    try:
        value = float(value)
    except OverflowError:  # an integer beyond any float
        raise RecordError(f"{what} is too large, got {shown(value)}") from None
    if not math.isfinite(value):
        raise RecordError(f"{what} must be finite, got {value}")
    return value


def parse(raw: str | bytes, network: str = "freeway") -> InputRecord:
    """Validate one input record of `network`; raises RecordError with the reason (and the
    record's identity in `key` when it is a JSON object)."""
    obj = _load(raw)
    if not isinstance(obj, dict):
        raise RecordError(f"not a JSON object but {type(obj).__name__}")
    return _checked(obj, network)


def parse_message(raw: str | bytes, network: str = "freeway") -> list[InputRecord | RecordError]:
    """The records of one message, in order: one for a JSON object, one per element for an
    array, each an InputRecord or the RecordError that refuses it (with its `key` and, for an
    element, its `element`: the element's own JSON). Raises RecordError when the message as a
    whole is refused (not JSON, neither an object nor a non-empty array, too many elements)."""
    obj = _load(raw)
    if isinstance(obj, dict):
        return [_checked(obj, network)]
    if not isinstance(obj, list) or not obj:
        raise RecordError(f"not a JSON object or a non-empty array but {shown(obj)}")
    if len(obj) > MESSAGE_MAX_RECORDS:
        raise RecordError(f"an array of {len(obj)} records, more than {MESSAGE_MAX_RECORDS}")
    parsed = []
    for i, element in enumerate(obj):
        try:
            if not isinstance(element, dict):
                raise RecordError(f"not a JSON object but {type(element).__name__}")
            parsed.append(_checked(element, network))
        except RecordError as e:
            e.args = (f"element {i} of {len(obj)}: {e}",)
            e.element = _text(element)
            parsed.append(e)
    return parsed


def _text(element: object) -> str:
    """An element's own JSON, as its dead letter quotes it."""
    try:
        return json.dumps(element, separators=(",", ":"))
    except RecursionError:  # nested about as deep as the parser allows
        return shown(element)


def decode(raw: str | bytes | None) -> str:
    """The message's text; raises RecordError for a null value, an empty one, or bytes that
    are not UTF-8 (json.loads would guess UTF-16 or UTF-32 for some)."""
    if raw is None:
        raise RecordError("a null value (a Kafka tombstone), not a record")
    if isinstance(raw, bytes):
        try:
            raw = raw.decode()
        except UnicodeDecodeError as e:
            raise RecordError(f"not UTF-8: {e}") from None
    if not raw:
        raise RecordError("an empty value, not a record")
    return raw


def _load(raw: str | bytes | None) -> object:
    text = decode(raw)
    try:
        # NaN and Infinity are not JSON; Python's parser accepts them, so refuse them here
        return json.loads(text, parse_constant=_refuse_constant, object_pairs_hook=_object)
    except RecordError:
        raise
    except RecursionError:
        raise RecordError("nested deeper than the JSON parser allows") from None
    except ValueError as e:
        raise RecordError(f"not JSON: {str(e)[:REASON_MAX_CHARS]}") from None


class _RepeatedKeys(dict):
    """A JSON object that gives a key more than once (json.loads keeps the last value)."""

    repeated: list[str]


def _object(pairs: list[tuple[str, object]]) -> dict:
    obj = dict(pairs)
    if len(obj) == len(pairs):
        return obj
    repeated = _RepeatedKeys(obj)
    repeated.repeated = sorted(k for k, n in Counter(k for k, _ in pairs).items() if n > 1)
    return repeated


def _checked(obj: dict, network: str) -> InputRecord:
    if isinstance(obj, _RepeatedKeys):  # its identity is ambiguous: no key
        names = ", ".join(shown(k) for k in obj.repeated[:5])
        raise RecordError(f"key(s) given more than once: {names}")
    try:
        return _validate(obj, networks.network(network).by_key)
    except RecordError as e:
        e.key = identity(obj)
        raise


def _validate(obj: dict, known: dict) -> InputRecord:
    missing = [name for name in REQUIRED if name not in obj]
    if missing:
        raise RecordError(f"missing field(s): {', '.join(missing)}")
    if not isinstance(obj["run"], str):
        raise RecordError(f"field 'run' must be a string, got {shown(obj['run'])}")
    if len(obj["run"]) > IDENTITY_MAX_CHARS:
        raise RecordError(
            f"field 'run' is longer than {IDENTITY_MAX_CHARS} characters ({len(obj['run'])})"
        )
    detector = obj["detector"]
    if not isinstance(detector, str) or detector not in known:
        raise RecordError(f"unknown detector {shown(detector)}")
    destination = obj.get("destination")
    if destination is not None and (not isinstance(destination, str) or destination not in known):
        raise RecordError(f"unknown destination {shown(destination)}")
    flows = obj["flows"]
    if not isinstance(flows, list):
        raise RecordError(f"field 'flows' must be a list, got {type(flows).__name__}")
    if len(flows) != LOOKBACK:
        raise RecordError(f"field 'flows' must hold {LOOKBACK} values, got {len(flows)}")
    values = tuple(_number(v, f"flows[{i}]") for i, v in enumerate(flows))
    if min(values) < 0:
        raise RecordError(f"flows must be non-negative, got {min(values)}")
    if max(values) > FLOW_MAX:
        raise RecordError(f"flows must be at most {FLOW_MAX:g} vehicles, got {max(values):g}")
    speed = _number(obj["speed_mph"], "field 'speed_mph'")
    if not 0 <= speed <= SPEED_MAX_MPH:
        raise RecordError(f"field 'speed_mph' must lie in 0..{SPEED_MAX_MPH:g}, got {speed:g}")
    return InputRecord(
        run=obj["run"],
        detector=detector,
        seq=_integer(obj, "seq"),
        speed_mph=speed,
        flows=values,
        intended_ns=_integer(obj, "intended_ns"),
        sent_ns=_integer(obj, "sent_ns"),
        destination=destination,
    )


def identity(obj: object) -> dict | None:
    """The record's run, detector, seq and sent_ns where each has its JSON type (string,
    string, integer, integer; else None): what the harness compares with what it sent."""
    if not isinstance(obj, dict):
        return None

    def name(value: object) -> str | None:
        ok = isinstance(value, str) and len(value) <= IDENTITY_MAX_CHARS
        return value if ok else None

    def integer(value: object) -> int | None:
        return value if _is_integer(value) and 0 <= value < INTEGER_LIMIT else None

    return {
        "run": name(obj.get("run")),
        "detector": name(obj.get("detector")),
        "seq": integer(obj.get("seq")),
        "sent_ns": integer(obj.get("sent_ns")),
    }


def _refuse_constant(name: str) -> float:
    raise RecordError(f"{name} is not a valid number")


def dead_letter(raw: str | bytes | None, reason: str, key: dict | None = None) -> str:
    """The dead letter of `raw`: reason and record both cut (their lengths kept) so that the
    letter is at most DEAD_LETTER_MAX_BYTES of UTF-8 whatever the input."""
    if raw is None:  # a tombstone
        raw = ""
    if isinstance(raw, bytes):
        raw = raw.decode("utf-8", errors="replace")
    letter = {
        "reason": reason[:REASON_MAX_CHARS],
        "reason_chars": len(reason),
        "record": "",
        "record_chars": len(raw),
        "key": key,
    }
    # the longest prefix of the record that fits; escaping can grow a character to 12 bytes
    low, high = 0, min(len(raw), RECORD_MAX_CHARS)
    while low < high:
        mid = (low + high + 1) // 2
        if _size(letter, raw[:mid]) <= DEAD_LETTER_MAX_BYTES:
            low = mid
        else:
            high = mid - 1
    letter["record"] = raw[:low]
    return _encode(letter)


def _encode(letter: dict) -> str:
    return json.dumps(letter, separators=(",", ":"))


def _size(letter: dict, record: str) -> int:
    return len(_encode({**letter, "record": record}).encode())
