"""The run request, checked once: `RunSpec.parse(values)` builds a frozen RunSpec from the
field table's values (spec.py: Make variables, the harness's flags, a campaign's point, a
rerun's `requested`), refuses every bad value with one line naming it, and derives what the
values imply: the target, the scheduler's Setting, the power policy, the neighbours' groups, a
cluster's sizes. Nothing is started, written or looked at on a machine here (an inventory is
read); nothing downstream checks a value again or changes one.

What needs the machine (the bare target's data, model and CPUs, the C-state hold) is checked
when the run looks at it (run.check_machine, the targets' check).

    RunSpec.parse({"sched": "deadline", "budget": 20000, "records": 600})
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from pathlib import Path

from hvbench_agent import tuning
from hvbench_agent.names import BadName, check_name
from hvbench_agent.neighbours import Group
from hvbench_agent.neighbours import text as noise_text
from hvbench_agent.power import Policy, validate_policy
from hvbench_agent.sched import Setting, validate
from hvbench_load.producers import send_offset_ns

from hvbench_harness import inventory, neighbours, spec
from hvbench_harness.parts import RunError
from hvbench_harness.readiness import parse_require
from hvbench_harness.targets.kinds import kind
from hvbench_harness.testbed import TARGETS, inventory_target

SCALES = ("one", "cluster")
TABLE = spec.FIELDS + spec.INPUTS + spec.OPTIONS

# Every field as asked, its default where it was not: one attribute per field of the table.
Asked = dataclasses.make_dataclass(
    "Asked",
    [(f.name, f.kind | None, dataclasses.field(default=f.default)) for f in TABLE],
    frozen=True,
)


@dataclasses.dataclass(frozen=True)
class RunSpec(Asked):
    """A checked run request: the fields (with `target` resolved, `noise` in its one spelling,
    `brokers` and `taskmanagers` at their defaults) and what they imply."""

    hosts: str | None = None  # the testbed's hosts file (INVENTORY's, or HOST's one-off)
    setting: Setting | None = None  # the scheduler setting, with its defaults
    policy: Policy | None = None  # GOVERNOR, MAX_CSTATE, TURBO
    noise_groups: tuple[Group, ...] = ()
    cpus: neighbours.CpuSets | None = None  # JOB_CPUS and NOISE_CPUS, parsed
    cpu_latency_limit: int | str | None = None  # CPU_LATENCY parsed (bare): µs, auto or None

    @classmethod
    def parse(cls, values: Mapping[str, object], need_inventory: bool = True) -> RunSpec:
        """The request from field values by name (None: the default), or RunError (SpecError
        for a name or type the table does not have; the scheduler's Refused)."""
        asked = cls(**typed(values))
        check_names(asked)
        asked = dataclasses.replace(asked, **where(asked))
        check_numbers(asked)
        check_network(asked)
        check_load(asked)
        check_measures(asked)
        groups, cpus = neighbours.check_request(asked)
        return dataclasses.replace(
            asked,
            **sizes(asked),
            noise=noise_text(groups) or None,  # "none" and "" are no neighbours
            noise_groups=groups,
            cpus=cpus,
            require=checked_require(asked.require),
            setting=scheduler_setting(asked),
            policy=power_policy(asked),
        ).checked_placement(need_inventory)

    def checked_placement(self, need_inventory: bool) -> RunSpec:
        """CPU_LATENCY for the bare target; a testbed needs its inventory."""
        if not self.on_testbed:
            try:
                limit = tuning.parse_cpu_latency(self.cpu_latency)
            except tuning.TuningError as e:
                raise RunError(str(e)) from None
            return dataclasses.replace(self, cpu_latency_limit=limit)
        if need_inventory and not self.hosts:
            raise RunError(
                f"TARGET={self.target} needs the testbed: HOST=<host> or INVENTORY=<dir>"
            )
        if self.cpu_latency not in ("auto", "off"):
            raise RunError(
                "CPU_LATENCY is for the bare target; a testbed's host is tuned by "
                "make provision (host_tuning)"
            )
        return self

    @property
    def on_testbed(self) -> bool:
        """A KVM or Xen testbed (HOST or INVENTORY), not this machine."""
        return kind(self.target).testbed

    def requested(self) -> dict:
        """The request as meta.json `requested` records it (spec.FIELDS)."""
        return spec.as_requested(self)


def typed(values: Mapping[str, object]) -> dict:
    """The values given (None left out), each of its field's type; SpecError names the field."""
    message = spec.unknown(values, spec.BY_NAME, "setting")
    if message:
        raise spec.SpecError(message)
    given = {}
    for name, value in values.items():
        field = spec.BY_NAME[name]
        if value is None:
            continue
        if isinstance(value, str) and field.kind is not str:
            value = spec.convert(field, value)
        elif field.kind is float and type(value) is int:
            value = float(value)
        if type(value) is not field.kind:
            raise spec.SpecError(
                f"{field.make} must be of type {field.kind.__name__}, not {value!r}"
            )
        given[name] = value
    return given


def check_names(asked) -> None:
    """RUN_ID, the campaign and HOST are names: they become folders here and on every guest,
    and go into every SSH command (hvbench_agent.names)."""
    try:
        if asked.run_id is not None:
            check_name(asked.run_id, "RUN_ID")
        if asked.campaign is not None:
            check_name(asked.campaign, "the campaign's name")
    except BadName as e:
        raise RunError(str(e)) from None
    if asked.host:
        check_host(asked.host)


def check_host(host: str) -> None:
    """HOST is [user@]host, each part a name."""
    user, at, name = host.rpartition("@")
    try:
        check_name(name, "HOST")
        if at:
            check_name(user, "HOST's user")
    except BadName as e:
        raise RunError(f"{e} (HOST is [user@]host)") from None


def where(asked) -> dict:
    """The target (given, or what the inventory implies: bare without hosts) and the testbed's
    hosts file: INVENTORY's, or HOST's one-off inventory (written when the run starts)."""
    hosts = None
    if asked.host or asked.inventory:
        try:
            hosts = inventory.hosts_path(asked.inventory, asked.host, asked.target)
        except inventory.InventoryError as e:
            raise RunError(str(e)) from None
    target = asked.target
    if target is None:
        if hosts and not Path(hosts).exists():
            raise RunError(f"INVENTORY={asked.inventory}: no such file or directory")
        target = inventory_target(hosts) if hosts else "bare"
    if target not in TARGETS:
        raise RunError(f"unknown TARGET {target!r}; valid: {', '.join(TARGETS)}")
    return {"target": target, "hosts": hosts}


# Numbers with a lower bound: > 0, or ≥ 0 (each named by its Make variable when refused).
POSITIVE = ("records", "send_ms", "baseline_s")
NOT_NEGATIVE = ("warmup", "ramp", "malformed", "drain", "broker_restarts")


def check_numbers(asked) -> None:
    """Counts and durations in their ranges, finite; RAMP within the warm-up; REP ≥ 1."""
    for name in POSITIVE + NOT_NEGATIVE:
        value, make = getattr(asked, name), spec.BY_NAME[name].make
        if not math.isfinite(value):
            raise RunError(f"{make} must be a finite number, not {value}")
        if name in POSITIVE and not value > 0:
            raise RunError(f"{make} must be > 0, not {value:g}")
        if name in NOT_NEGATIVE and not value >= 0:
            raise RunError(f"{make} must be ≥ 0, not {value:g}")
    if not asked.ramp <= asked.warmup:
        raise RunError("RAMP must lie within the warm-up: 0 ≤ RAMP ≤ WARMUP")
    if asked.stall_s is not None and not (math.isfinite(asked.stall_s) and asked.stall_s > 0):
        raise RunError(f"STALL_S must be a finite number of seconds > 0, not {asked.stall_s:g}")
    if asked.rep is not None and asked.rep < 1:
        raise RunError("REP (the repetition number) must be ≥ 1")


def check_network(asked) -> None:
    """NETWORK is known (its data is checked where it is: run.check_machine here,
    TestbedTarget.check_data on a testbed)."""
    if asked.network not in spec.DETECTORS:
        raise RunError(
            f"unknown NETWORK {asked.network!r}{spec.suggest(asked.network, spec.DETECTORS)}; "
            f"valid: {', '.join(spec.DETECTORS)}"
        )


def check_load(asked) -> None:
    """PRODUCERS, MESSAGES and CLIENTS (hvbench_load.producers): known values only."""
    if asked.messages not in spec.MESSAGES:
        raise RunError(
            f"unknown MESSAGES {asked.messages!r}{spec.suggest(asked.messages, spec.MESSAGES)}; "
            f"valid: {', '.join(spec.MESSAGES)}"
        )
    detectors = spec.DETECTORS[asked.network]
    if not 1 <= asked.producers <= detectors:
        raise RunError(
            f"PRODUCERS={asked.producers}: NETWORK={asked.network} has {detectors} detectors, "
            f"so 1..{detectors} producer groups"
        )
    if not 1 <= asked.clients <= asked.producers:
        raise RunError(
            f"CLIENTS={asked.clients}: each client pair needs a producer group of its own, "
            f"so 1..{asked.producers} (PRODUCERS={asked.producers})"
        )


def check_measures(asked) -> None:
    """RunError if every record would be sent within the warm-up, so that nothing would be
    measured: the message says how many records the warm-up takes, the smallest RECORDS that
    measures something and the WARMUP these RECORDS would need. The schedule is the
    producers' (one pair's): detector j sends its records from its staggered offset, at
    send_offset_ns (the ramp included); a record is warm-up if it is due within WARMUP of the
    first."""
    detectors = spec.DETECTORS[asked.network]
    period_ns = max(1, round(asked.send_ms * 1e6))
    ramp_ns, warmup_ns = round(asked.ramp * 1e9), round(asked.warmup * 1e9)
    slots = asked.producers if asked.messages == "group" else detectors
    offsets = [(j % slots) * period_ns // slots for j in range(detectors)]
    # each detector's first record past the warm-up: its index i, which needs i + 1 records
    first_measured = [first_due_at(warmup_ns - offset, period_ns, ramp_ns) for offset in offsets]
    per_detector = [
        asked.records // detectors + (j < asked.records % detectors) for j in range(detectors)
    ]
    if any(count > i for count, i in zip(per_detector, first_measured, strict=True)):
        return
    smallest = min(i * detectors + j + 1 for j, i in enumerate(first_measured))
    last_ns = max(
        offset + send_offset_ns(count - 1, period_ns, ramp_ns)
        for offset, count in zip(offsets, per_detector, strict=True)
        if count > 0
    )
    raise RunError(
        f"RECORDS={asked.records} measures nothing: the warm-up (WARMUP={asked.warmup:g} s) "
        f"takes the first {sum(first_measured)} records ({detectors} detectors every "
        f"{asked.send_ms:g} ms); give RECORDS={smallest} or more, or WARMUP="
        f"{math.floor(last_ns / 1e7) / 100:g} or less"
    )


def first_due_at(at_ns: int, period_ns: int, ramp_ns: int) -> int:
    """The index of a detector's first record due at or after at_ns from its start."""
    low, high = 0, 1
    while send_offset_ns(high, period_ns, ramp_ns) < at_ns:
        low, high = high, high * 2
    while low < high:
        middle = (low + high) // 2
        if send_offset_ns(middle, period_ns, ramp_ns) < at_ns:
            low = middle + 1
        else:
            high = middle
    return low


def sizes(asked) -> dict:
    """SCALE: one or cluster (targets/*_layouts.py). BROKERS defaults to 3; TASKMANAGERS
    to 2 here, on a testbed to one per real-time VM (TestbedTarget.scale_out)."""
    if asked.scale not in SCALES:
        raise RunError(
            f"unknown SCALE {asked.scale!r}{spec.suggest(asked.scale, SCALES)}; "
            f"valid: {', '.join(SCALES)}"
        )
    given = [n for n in ("brokers", "taskmanagers") if getattr(asked, n) is not None]
    if asked.scale != "cluster":
        if given:
            raise RunError(f"{', '.join(n.upper() for n in given)}: for SCALE=cluster")
        return {}
    brokers = 3 if asked.brokers is None else asked.brokers
    taskmanagers = asked.taskmanagers
    if taskmanagers is None and not asked.on_testbed:
        taskmanagers = 2
    if not 1 <= brokers <= 9 or not 1 <= (taskmanagers or 1) <= spec.PRODUCERS:
        raise RunError(
            f"BROKERS is 1..9 and TASKMANAGERS 1..{spec.PRODUCERS} (one input partition "
            f"per detector: more tasks would idle)"
        )
    return {"brokers": brokers, "taskmanagers": taskmanagers}


def checked_require(require: str | None) -> str | None:
    """REQUIRE names known readiness checks (readiness.parse_require reads it again)."""
    try:
        parse_require(require)
    except ValueError as e:
        raise RunError(str(e)) from None
    return require


def scheduler_setting(asked) -> Setting:
    """The scheduler setting for the target's backend (Refused names a bad value)."""
    return validate(
        kind(asked.target).backend,
        asked.sched,
        budget_us=asked.budget,
        period_us=asked.period,
        priority=asked.priority,
        extratime=asked.extratime,
        weight=asked.weight,
        cap=asked.cap,
        tslice_us=asked.tslice_us,
        ratelimit_us=asked.ratelimit_us,
    )


def power_policy(asked) -> Policy:
    return validate_policy(asked.governor, asked.max_cstate, asked.turbo)
