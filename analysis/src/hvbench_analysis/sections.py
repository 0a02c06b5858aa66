"""meta.json's main sections as dataclasses: each key a field, its JSON types the field's
annotation, whether every run has it, and what it says (docs/results.md explains them; a test
keeps the two equal). results.SECTIONS names each section's type.

`from_json` reads a section and `to_json` gives back what was read: the same keys, values and
order, the keys this version does not name kept in `extra`, a key the run did not have left
out (ABSENT; JSON null is None). Writing checks strictly (`strict`: no key the section does not
name, unless it is OPEN); reading lets the keys of other versions through. Standard library
only.

    status = Status.from_json(meta["status"])
    meta["status"] = Status(state="running", reason=None, phase="calibrating the TSC").to_json()
"""

from __future__ import annotations

import enum
import functools
import types
import typing
from dataclasses import MISSING, dataclass, field, fields, make_dataclass
from typing import ClassVar, NamedTuple, Self

from hvbench_analysis.fields import FIELDS


class ResultsError(ValueError):
    """A run directory that cannot be used, with the reason."""


class Absent(enum.Enum):
    """A key a run's section does not have."""

    ABSENT = "absent"

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return "ABSENT"


ABSENT = Absent.ABSENT
JSON_TYPES = {
    bool: "boolean", int: "integer", float: "number", str: "string", dict: "object",
    list: "array", type(None): "null",
}  # fmt: skip


def present(value, absent=None):
    """A field's `value`, or `absent` where the run did not have the key."""
    return absent if value is ABSENT else value


def key(what: str, *, json: str | None = None, optional: bool = False):
    """A section's key: what it says; `json`, its name in the file where that is no Python
    name; optional: some runs do not have it (ABSENT)."""
    return field(default=ABSENT if optional else MISSING, metadata={"what": what, "json": json})


section = dataclass(frozen=True, kw_only=True)  # each section: its keys given by name


class Key(NamedTuple):
    """A section's key, as keys_of finds it."""

    attribute: str
    name: str  # in the file
    hint: object  # the field's annotation: its JSON types
    optional: bool
    what: str


@section
class Section:
    """A section of meta.json: its keys are the fields but `extra` and `order`."""

    OPEN: ClassVar[bool] = False  # another program's answer: keys it does not name are written
    extra: dict = field(default_factory=dict, repr=False)  # the keys it does not name, as read
    order: tuple = field(default=(), repr=False, compare=False)  # its keys' order, as read

    @classmethod
    def from_json(cls, doc, where: str = "", strict: bool = False) -> Self:
        """The section in `doc`; ResultsError names a key it lacks or a value not of its types
        (`where`: the section's place in meta.json, for the message)."""
        where = where or cls.__name__
        if not isinstance(doc, dict):
            raise ResultsError(f"meta.json {where} is {json_type(doc)}, not object")
        values = {}
        for k in keys_of(cls):
            if k.name in doc:
                values[k.attribute] = parse(k.hint, doc[k.name], f"{where}.{k.name}", strict)
            elif not k.optional:
                raise ResultsError(f"meta.json {where} has no {k.name}")
        named = {k.name for k in keys_of(cls)}
        extra = {name: value for name, value in doc.items() if name not in named}
        if extra and strict and not cls.OPEN:
            raise ResultsError(f"meta.json {where} has no key {', '.join(extra)} ({cls.__name__})")
        return cls(**values, extra=extra, order=tuple(doc))

    def to_json(self) -> dict:
        """The section as meta.json has it: its keys in the order read, or (a section made here)
        in the fields' order, then `extra`."""
        doc = {}
        for k in keys_of(type(self)):
            value = getattr(self, k.attribute)
            if value is not ABSENT:
                doc[k.name] = dump(value)
        doc |= self.extra
        position = {name: i for i, name in enumerate(self.order)}
        return {name: doc[name] for name in sorted(doc, key=lambda n: position.get(n, len(doc)))}

    @classmethod
    def of(cls, meta: dict, name: str) -> Self | None:
        """The section `name` of a run's meta.json (read_meta's); None where the run has none."""
        value = meta.get(name)
        return None if value is None else cls.from_json(value, name)

    @classmethod
    def json_schema(cls) -> dict:
        """The section as a JSON Schema (results.json_schema)."""
        keys = keys_of(cls)
        return {
            "type": "object",
            "properties": {k.name: {**schema_of(k.hint), "description": k.what} for k in keys},
            "required": [k.name for k in keys if not k.optional],
            "additionalProperties": cls.OPEN,
        }


@functools.cache
def keys_of(cls: type[Section]) -> tuple[Key, ...]:
    """A section's keys, in the fields' order."""
    hints = typing.get_type_hints(cls)
    return tuple(
        Key(f.name, f.metadata["json"] or f.name, hints[f.name], f.default is ABSENT,
            f.metadata["what"])
        for f in fields(cls)
        if f.name not in ("extra", "order")
    )  # fmt: skip


def options(hint) -> tuple:
    """The types a value of `hint` may have (ABSENT is no value)."""
    union = typing.get_origin(hint) in (typing.Union, types.UnionType)
    return tuple(t for t in (typing.get_args(hint) if union else (hint,)) if t is not Absent)


def parse(hint, value, where: str, strict: bool):
    """`value` as `hint` has it: a section read, a dict's or list's items parsed by their type;
    ResultsError if it is none of its types."""
    for option in options(hint):
        kind, args = typing.get_origin(option) or option, typing.get_args(option)
        if issubclass(kind, Section):
            if isinstance(value, dict):
                return option.from_json(value, where, strict)
        elif matches(kind, value):
            if kind is dict and args:
                return {k: parse(args[1], v, f"{where}.{k}", strict) for k, v in value.items()}
            if kind is list and args:
                return [parse(args[0], v, f"{where}[{i}]", strict) for i, v in enumerate(value)]
            return value
    wanted = " or ".join(json_type_of(t) for t in options(hint))
    raise ResultsError(f"meta.json {where} is {json_type(value)}, not {wanted}")


def matches(kind: type, value) -> bool:
    """Whether `value` is of JSON type `kind` (a bool is no number; an int is a float)."""
    if isinstance(value, bool):
        return kind is bool
    if kind is float:
        return isinstance(value, int | float)
    if kind is list:
        return isinstance(value, list | tuple)
    return isinstance(value, kind)


def dump(value):
    """A field's value as JSON has it (sections as their dicts)."""
    if isinstance(value, Section):
        return value.to_json()
    if isinstance(value, dict):
        return {k: dump(v) for k, v in value.items()}
    if isinstance(value, list):
        return [dump(v) for v in value]
    return value


def json_type(value) -> str:
    return JSON_TYPES.get(type(value), type(value).__name__)


def json_type_of(option) -> str:
    kind = typing.get_origin(option) or option
    return "object" if issubclass(kind, Section) else JSON_TYPES[kind]


def schema_of(hint) -> dict:
    """A JSON Schema of `hint`'s types."""
    parts = [schema_of_one(option) for option in options(hint)]
    if all(part.keys() == {"type"} for part in parts):
        names = [part["type"] for part in parts]
        return {"type": names[0] if len(names) == 1 else names}
    return parts[0] if len(parts) == 1 else {"anyOf": parts}


def schema_of_one(option) -> dict:
    kind, args = typing.get_origin(option) or option, typing.get_args(option)
    if issubclass(kind, Section):
        return option.json_schema()
    if kind is dict and args:
        return {"type": "object", "additionalProperties": schema_of(args[1])}
    if kind is list and args:
        return {"type": "array", "items": schema_of(args[0])}
    return {"type": JSON_TYPES[kind]}


@section
class SendingStatus(Section):
    """How the sending left the run."""

    state: str = key("running while it runs; then completed, failed or interrupted")
    reason: str | None = key("why it stopped (null when it completed)")
    phase: str | None = key("the step it was in, or stopped in")
    traceback: str | Absent = key("a defect's Python traceback, as text", optional=True)


@section
class Status(SendingStatus):
    """meta.json `status`: as the sending left the run, or failed in a step after it."""

    before: SendingStatus | Absent = key(
        "where a step after the sending failed: the status the sending left", optional=True
    )


@section
class Counts(Section):
    """meta.json `counts`: every record sent, accounted for (accounting.Counts)."""

    sent: int = key("valid records the producers sent")
    undelivered: int | Absent = key("records the producers could not deliver", optional=True)
    received: int = key("distinct sent records that came back as results")
    dead_lettered: int = key("distinct sent records the job refused")
    missing: int = key("sent and delivered, neither received nor dead-lettered")
    duplicated: int = key("results received more than once (extra copies)")
    unexpected: int | Absent = key("results with the run's id matching no sent record",
                                   optional=True)  # fmt: skip
    malformed_sent: int | Absent = key("malformed records injected", optional=True)
    malformed_dead_lettered: int | Absent = key("of those, dead-lettered", optional=True)
    warmup: int | Absent = key("received records in the warm-up", optional=True)
    measured: int | Absent = key("received records in the statistics", optional=True)
    foreign_results: int = key("results in the output topic that are not the run's")
    foreign_dead_letters: int = key("dead letters that are not of the run's records")
    contradictions: int = key("sent records both received and dead-lettered")
    dead_letters_lost: int = key("dead letters the job could not write")
    unreadable_rows: int | Absent = key("rows of the parts' files that could not be read",
                                        optional=True)  # fmt: skip
    accounted: bool = key("every sent record is accounted for")


@section
class Latency(Section):
    """meta.json `latency` and `latency_from_intended`: nearest-rank statistics over the
    measured records, in ms; only `n` where there were none."""

    n: int = key("measured records")
    method: str | Absent = key("how the percentiles are taken", optional=True)
    min_ms: float | Absent = key("the least", optional=True)
    p50_ms: float | Absent = key("the median", optional=True)
    p90_ms: float | Absent = key("the 90th percentile", optional=True)
    p99_ms: float | Absent = key("the 99th percentile", optional=True)
    p99_9_ms: float | Absent = key("the 99.9th percentile", json="p99.9_ms", optional=True)
    p99_99_ms: float | Absent = key("the 99.99th percentile", json="p99.99_ms", optional=True)
    max_ms: float | Absent = key("the greatest", optional=True)
    mean_ms: float | Absent = key("the mean", optional=True)
    sd_ms: float | Absent = key("the standard deviation", optional=True)


@section
class Clock(Section):
    """meta.json `clock`: the TSC calibration and which clock each stamp is on."""

    tsc: dict | Absent = key("the TSC calibration: frequency, source, error, clocksource",
                             optional=True)  # fmt: skip
    clients: list | Absent = key("client pairs: each pair's machine and calibration",
                                 optional=True)  # fmt: skip
    stamps: str | Absent = key("where the stamps were taken", optional=True)
    job: dict | Absent = key("what is known of the job's clock", optional=True)


@section
class Sched(Section):
    """meta.json `sched`: the scheduler setting as applied and read back at the start. The
    agent's answer: its other keys are written as they are."""

    OPEN = True
    applied: str = key("what was applied, and where")
    readback: dict | list | Absent | None = key(
        "the setting read back from the kernel or hypervisor", optional=True
    )
    readbacks: list | Absent = key("several VMs: each one's readback", optional=True)


@section
class Power(Section):
    """meta.json `power`: the power policy asked, read back at the start and at the end."""

    requested: dict = key("GOVERNOR, MAX_CSTATE, TURBO as asked; {} for none")
    readback: dict | None = key("each host's policy at the start; null where not read")
    before: dict | Absent = key("each host's policy before, put back on the way out",
                                optional=True)  # fmt: skip
    at_end: dict | Absent = key("each host's policy after the last record", optional=True)
    error: str | Absent = key("why the policy could not be read", optional=True)


@section
class EnergyWindow(Section):
    """One window of meta.json `energy`: between two of the run's marks."""

    from_: str = key("the mark it begins at", json="from")
    to: str = key("the mark it ends at")
    seconds: float = key("its length")
    joules: float = key("the hosts' joules, summed")
    mean_w: float | None = key("joules / seconds")
    records: int | None = key("the records sent (run) or measured (measured)")
    joules_per_record: float | None = key("joules / records")
    per_host: dict | Absent = key("each host's figures", optional=True)


@section
class Energy(Section):
    """meta.json `energy`: each window's joules, or why not available."""

    available: bool = key("every host had an energy source")
    hosts: dict = key("each host's source and domains, or why none")
    windows: dict[str, EnergyWindow | None] = key(
        "run and measured; null where not available or a mark was not reached"
    )
    marks: list | Absent = key("the marks the run reached", optional=True)
    reason: str | Absent = key("why energy is not available", optional=True)


# What `requested` records beside the request's fields: how many detectors send (the network's),
# and the repetition and campaign the run belongs to.
ALSO_REQUESTED = {
    "detectors": (int, "how many detectors send: the network's"),
    "rep": (int, "the repetition (--rep)"),
    "campaign": (str, "the campaign the run belongs to (--campaign)"),
}


def requested_section() -> type[Section]:
    """meta.json `requested` as a section: a key per field of the run request's table
    (fields.FIELDS), of the field's type or null, and ALSO_REQUESTED; older runs lack some."""
    table = [(f.requested, f.kind, f.help) for f in FIELDS]
    table += [(name, kind, what) for name, (kind, what) in ALSO_REQUESTED.items()]
    return make_dataclass(
        "Requested",
        [(name, kind | None | Absent, key(what, optional=True)) for name, kind, what in table],
        bases=(Section,),
        namespace={"__doc__": "meta.json `requested`: the run as asked.", "__module__": __name__},
        frozen=True,
        kw_only=True,
    )


Requested = requested_section()
