"""The records that travel through Kafka, as JSON objects, and their validation.

Input (producers → input topic), one per detector every 100 ms:
    {"detector": "el_segundo", "seq": 17, "speed_mph": 63.5, "flows": [12 numbers],
     "intended_ns": 123, "sent_ns": 456}
`flows` are the detector's last 12 five-minute flows (vehicles per 5 minutes, oldest first);
`intended_ns` is when the open-loop schedule wanted the record sent and `sent_ns` when it was,
both TSC nanoseconds of the producers' machine: the job copies them through untouched.

Output (job → output topic): the input fields plus the forecast, the route and the job's own
stage durations (TSC ns deltas taken inside the job; never subtracted from producer stamps).

Dead letter (job → dead-letter topic): {"reason": "...", "record": "<the input as received>"}.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from hvbench_job import detectors
from hvbench_job.forecast import LOOKBACK

REQUIRED = ("detector", "seq", "speed_mph", "flows", "intended_ns", "sent_ns")
# A dead letter keeps at most this much of the offending record, so one huge record
# cannot make the dead-letter topic refuse it.
DEAD_LETTER_RECORD_CHARS = 10_000


class RecordError(ValueError):
    """The record cannot be processed; the message is the reason given in the dead letter."""


@dataclass(frozen=True)
class InputRecord:
    detector: str
    seq: int
    speed_mph: float
    flows: tuple[float, ...]
    intended_ns: int
    sent_ns: int

    def to_json(self) -> str:
        return json.dumps(
            {
                "detector": self.detector,
                "seq": self.seq,
                "speed_mph": self.speed_mph,
                "flows": list(self.flows),
                "intended_ns": self.intended_ns,
                "sent_ns": self.sent_ns,
            },
            separators=(",", ":"),
        )


def _integer(obj: dict, name: str) -> int:
    value = obj[name]
    if isinstance(value, bool) or not isinstance(value, int):
        raise RecordError(f"field {name!r} must be an integer, got {value!r}")
    if value < 0:
        raise RecordError(f"field {name!r} must be non-negative, got {value}")
    return value


def _number(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise RecordError(f"{what} must be a number, got {value!r}")
    value = float(value)
    if not math.isfinite(value):
        raise RecordError(f"{what} must be finite, got {value}")
    return value


def parse(raw: str | bytes) -> InputRecord:
    """Validate one input record; raises RecordError with the reason."""
    try:
        # NaN and Infinity are not JSON; Python's parser accepts them, so refuse them here
        obj = json.loads(raw, parse_constant=_refuse_constant)
    except RecordError:
        raise
    except (ValueError, UnicodeDecodeError) as e:
        raise RecordError(f"not JSON: {e}") from None
    if not isinstance(obj, dict):
        raise RecordError(f"not a JSON object but {type(obj).__name__}")
    missing = [name for name in REQUIRED if name not in obj]
    if missing:
        raise RecordError(f"missing field(s): {', '.join(missing)}")
    detector = obj["detector"]
    if detector not in detectors.BY_KEY:
        raise RecordError(f"unknown detector {detector!r}")
    flows = obj["flows"]
    if not isinstance(flows, list):
        raise RecordError(f"field 'flows' must be a list, got {type(flows).__name__}")
    if len(flows) != LOOKBACK:
        raise RecordError(f"field 'flows' must hold {LOOKBACK} values, got {len(flows)}")
    values = tuple(_number(v, f"flows[{i}]") for i, v in enumerate(flows))
    if min(values) < 0:
        raise RecordError(f"flows must be non-negative, got {min(values)}")
    speed = _number(obj["speed_mph"], "field 'speed_mph'")
    if speed < 0:
        raise RecordError(f"field 'speed_mph' must be non-negative, got {speed}")
    return InputRecord(
        detector=detector,
        seq=_integer(obj, "seq"),
        speed_mph=speed,
        flows=values,
        intended_ns=_integer(obj, "intended_ns"),
        sent_ns=_integer(obj, "sent_ns"),
    )


def _refuse_constant(name: str) -> float:
    raise RecordError(f"{name} is not a valid number")


def dead_letter(raw: str | bytes, reason: str) -> str:
    if isinstance(raw, bytes):
        raw = raw.decode("utf-8", errors="replace")
    return json.dumps(
        {"reason": reason, "record": raw[:DEAD_LETTER_RECORD_CHARS], "record_chars": len(raw)},
        separators=(",", ":"),
    )
