"""The run request: one table of what a run can be asked, and the typed request built from it.

Every way of asking for a run goes through `FIELDS`: Make variables (`make run RECORDS=100`,
passed on to the harness as NAME=value), the harness's flags (`--records 100`), campaign keys
(`records: 100`), `make rerun` (a run's meta.json `requested`) and `make help`. A name that is
not in the table is refused with the closest one suggested, before anything starts.

Standard library only: the Makefile runs this file with python3 to check the variables on its
command line, before the venv exists.

    python3 harness/src/hvbench_harness/spec.py check-make Makefile RECORD SCHED
    python3 harness/src/hvbench_harness/spec.py make-names Makefile
    python3 harness/src/hvbench_harness/spec.py help
"""

from __future__ import annotations

import difflib
import re
import sys
from dataclasses import dataclass

PRODUCERS = 6  # producer groups (Kafka clients) by default; the freeway network's six detectors
MESSAGES = ("record", "group")  # what one Kafka message carries (hvbench_load.producers)
# Each network's detectors (hvbench_job.networks; a unit test keeps the two equal): one
# record per detector every send period, so the rate is DETECTORS × 1000 / send_ms.
DETECTORS = {"freeway": 6, "bay": 325}


class SpecError(ValueError):
    """A request that names something the table does not have, or a value of the wrong type."""


@dataclass(frozen=True)
class Field:
    name: str  # the RunSpec attribute and the campaign key
    kind: type  # int, float, str or bool (a flag)
    default: object
    flag: str  # the harness's option
    help: str
    requested: str | None = None  # its key in meta.json "requested" (None: an input, not recorded)
    make_name: str | None = None  # the Make variable, when it is not NAME in upper case
    short: str | None = None  # its code in run ids and campaign point ids (None: its name)

    @property
    def make(self) -> str:
        return self.make_name or self.name.upper()


# What a run measures. Each is recorded in meta.json "requested" and can vary in a campaign.
FIELDS = (
    Field("target", str, None, "--target", "bare, kvm or xen; unset: what the inventory implies",
          "target"),
    Field("sched", str, "none", "--sched", "the scheduler (docs/schedulers.md)", "sched"),
    Field("budget", int, None, "--budget", "µs of CPU time per PERIOD", "budget_us", short="b"),
    Field("period", int, None, "--period", "µs; 100000 where it applies", "period_us", short="p"),
    Field("priority", int, None, "--priority", "SCHED=fifo (kvm): 1..99", "priority", short="prio"),
    Field("extratime", int, None, "--extratime", "SCHED=rtds (xen): 0 (default) or 1", "extratime",
          short="e"),
    Field("weight", int, None, "--weight", "SCHED=credit|credit2 (xen): 1..65535, 256", "weight",
          short="w"),
    Field("cap", int, None, "--cap", "SCHED=credit|credit2 (xen): % of one CPU, 0 = none", "cap",
          short="c"),
    Field("tslice_us", int, None, "--tslice-us",
          "SCHED=credit (xen): the real-time pool's time slice, whole ms in µs (1000..1000000); "
          "unset: the boot value (Xen's default 30000)", "tslice_us", short="ts"),
    Field("ratelimit_us", int, None, "--ratelimit-us",
          "SCHED=credit|credit2 (xen): the real-time pool's rate limit, 0 (off) or "
          "100..500000 µs; unset: the boot value (xen_host_sched_ratelimit_us)", "ratelimit_us",
          short="rl"),
    Field("network", str, "freeway", "--network",
          "the road network: freeway (the study's six detectors) or bay (the 325 PEMS-BAY "
          "sensors, each record routed to a destination of its own; bare; docs/cluster.md)",
          "network"),
    Field("producers", int, PRODUCERS, "--producers",
          "producer groups, one Kafka client each: 1 up to the network's detectors", "producers"),
    Field("messages", str, "record", "--messages",
          "what one Kafka message carries: record (one record) or group (a producer group's "
          "records, which then fall due together; docs/cluster.md)", "messages"),
    Field("clients", int, 1, "--clients",
          "client pairs the producer groups are dealt to, each a producers process and its own "
          "consumer on one machine (a testbed's messaging VMs in turn): 1 up to PRODUCERS",
          "clients"),
    Field("records", int, 20_000, "--records", "records in all, over the detectors", "records",
          short="n"),
    Field("send_ms", float, 100.0, "--period-ms", "each detector's send period (ms)",
          "producer_period_ms", short="ms"),
    Field("warmup", float, 10.0, "--warmup-s", "seconds left out of the statistics", "warmup_s",
          short="wu"),
    Field("ramp", float, 0.0, "--ramp-s", "seconds to rise to the full rate, within WARMUP",
          "ramp_s"),
    Field("malformed", int, 0, "--malformed", "malformed records to inject (dead-lettered)",
          "malformed"),
    Field("drain", float, 20.0, "--drain-s", "seconds to wait for results after the last send",
          "drain_s"),
    Field("broker_restarts", int, 1, "--broker-restarts",
          "times Kafka is restarted on its data if it exits mid-run (recorded); 0: the run ends",
          "broker_restarts"),
    Field("stall_s", float, None, "--stall-s",
          "seconds without a result while the producers send that fail the run as stalled; "
          "unset: 8 on the bare target, 30 on a testbed (docs/running.md)", "stall_s"),
    Field("cpu_latency", str, "auto", "--cpu-latency",
          "bare: hold C-states at this many µs while running; auto (0 where permitted) or off",
          "cpu_latency"),
    Field("require", str, None, "--require",
          "readiness checks to require beyond the defaults, comma-separated", "require"),
    Field("force", bool, False, "--force",
          "run although a required readiness check fails (meta.json says which)", "force"),
    Field("concurrent", bool, False, "--concurrent",
          "run although another run or campaign holds this machine or testbed host (they "
          "disturb each other's latency; meta.json `concurrent` records both)", "concurrent"),
    Field("force_tsc", bool, False, "--force-tsc",
          "accept a TSC without constant_tsc/nonstop_tsc (recorded)", "force_tsc"),
    Field("trace", bool, False, "--trace",
          "trace when the job's threads (bare) or the real-time VM's vCPUs (testbed) run, wait "
          "or sleep while sending (docs/tracing.md)",
          "trace"),
    Field("baseline", bool, False, "--baseline",
          "bare: the noise floor first, cyclictest under the same setting (docs/tracing.md)",
          "baseline"),
    Field("baseline_s", float, 10.0, "--baseline-s", "seconds of the noise floor (BASELINE=1)",
          "baseline_s"),
    Field("noise", str, None, "--noise",
          "neighbours and what they do, COUNT:STATE,...: e.g. 3:idle, 3:paused, 2:cpu,1:membw "
          "(docs/interference.md)", "noise", short=""),
    Field("noise_cpus", str, "job", "--noise-cpus",
          "bare: where the loads run: job (the job's CPUs), apart (the others) or a CPU list",
          "noise_cpus", short="on-"),
    Field("scale", str, "one", "--scale",
          "one (a broker, a Flink JVM) or cluster (BROKERS brokers, replication up to 3, "
          "min in-sync up to 2; a Flink session cluster of TASKMANAGERS TaskManagers, the job at "
          "that parallelism; on a testbed over its messaging and real-time VMs) "
          "(docs/cluster.md)", "scale"),
    Field("brokers", int, None, "--brokers", "SCALE=cluster: Kafka nodes, 3 if unset", "brokers"),
    Field("taskmanagers", int, None, "--taskmanagers",
          "SCALE=cluster: TaskManagers, one slot each: the job's parallelism; 2 if unset (on a "
          "testbed one per real-time VM)",
          "taskmanagers"),
    Field("governor", str, None, "--governor",
          "the host's CPU frequency governor for the run: performance, schedutil, powersave, "
          "...; unset: as it is (docs/energy.md)", "governor", short=""),
    Field("max_cstate", int, None, "--max-cstate",
          "the deepest idle state the host's CPUs may enter for the run (Linux: cpuidle state "
          "number; Xen: C-state); unset: as it is", "max_cstate", short="cmax"),
    Field("turbo", str, None, "--turbo", "turbo on or off on the host for the run; unset: as it is",
          "turbo", short="turbo-"),
    Field("job_cpus", str, None, "--job-cpus",
          "bare: the CPUs the job may use, a list such as 1 or 2-3; unset: all", "job_cpus",
          short="job"),
)  # fmt: skip
# Where a run reads and writes, and what it is called: the same for every point of a campaign.
INPUTS = (
    Field("inventory", str, None, "--inventory",
          "a testbed's inventory (a directory or its hosts.yml); unset: bare, this machine"),
    Field("host", str, None, "--host",
          "a one-off testbed host, user@host (make provision HOST=... TARGET=... first)"),
    Field("run_id", str, None, "--run-id", "the run's name; default: time, target and setting"),
    Field("results", str, "results", "--results", "where results/<run-id>/ goes"),
    Field("data", str, "data/pems", "--data",
          "the traffic data (bare); make's default is data/pems-bay for NETWORK=bay",
          make_name="DATA_DIR"),
    Field("model", str, "artifacts/forecaster", "--model", "the trained model (bare)",
          make_name="MODEL_DIR"),
)  # fmt: skip
# The harness's own options: where its tools are, and what a run belongs to. `make run` and
# campaigns set them; they are no Make variables of their own.
OPTIONS = (
    Field("kafka_libs", str, "build/kafka/libs", "--kafka-libs", "Kafka's jars (make kafka)"),
    Field("connector_dir", str, "build/flink/lib", "--connector-dir",
          "the Flink Kafka connector's jars (make flink-connector)"),
    Field("work", str, "work", "--work", "broker data and logs while running"),
    Field("rep", int, None, "--rep", "repetition number, recorded with the run"),
    Field("campaign", str, None, "--campaign", "the campaign this run belongs to, recorded"),
    Field("rerun_of", str, None, "--rerun-of",
          "the results directory of the run this repeats (make rerun)"),
)  # fmt: skip
# Make variables that build a bare run's inputs (make data, make train): make run takes them,
# the harness leaves them to make.
BUILD_VARS = ("PYTHON", "SEED", "DAYS", "START", "EPOCHS")
BY_NAME = {f.name: f for f in FIELDS + INPUTS + OPTIONS}
BY_MAKE = {f.make: f for f in FIELDS + INPUTS}
# Each field's code in run ids (by its meta.json name) and campaign point ids (by its name).
SHORT = {f.name: f.short for f in FIELDS if f.short is not None}
SHORT_REQUESTED = {f.requested: f.short for f in FIELDS if f.short is not None}
# A campaign may give the rate instead of the send period: records/s over all producers.
CAMPAIGN_KEYS = sorted({f.name for f in FIELDS if f.name != "target"} | {"rate"})


def rate_per_s(send_ms: float, network: str | None = "freeway") -> float:
    """Records/s over all the network's detectors at one record per `send_ms` each."""
    return DETECTORS[network or "freeway"] * 1000.0 / send_ms


def send_ms_for(rate: float, network: str | None = "freeway") -> float:
    """The send period that gives `rate` records/s over the network's detectors."""
    return DETECTORS[network or "freeway"] * 1000.0 / rate


def suggest(name: str, valid) -> str:
    """' (did you mean X?)' when a valid name is close to `name`, else ''."""
    close = difflib.get_close_matches(str(name), list(valid), n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


def unknown(names, valid, what: str) -> str:
    """The refusal for names that are not valid, each with its suggestion; '' if all are."""
    bad = [n for n in names if n not in valid]
    if not bad:
        return ""
    return f"unknown {what} " + ", ".join(n + suggest(n, valid) for n in bad)


def convert(field: Field, text: str):
    """A Make variable's or flag's text as the field's type; SpecError if it is not one."""
    if field.kind is bool:
        if text.lower() in ("1", "yes", "true", "on"):
            return True
        if text.lower() in ("", "0", "no", "false", "off"):
            return False
        raise SpecError(f"{field.make} is 1 or 0, not {text!r}")
    if field.kind is str:
        return text
    try:
        return field.kind(text)
    except ValueError:
        noun = "a whole number" if field.kind is int else "a number"
        raise SpecError(f"{field.make} must be {noun}, not {text!r}") from None


ASSIGNMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.S)


def assignments_to_flags(argv: list[str]) -> list[str]:
    """NAME=value words (as Make passes its command line on) as the harness's options; the
    other words as they are. SpecError names an unknown NAME with the closest one."""
    flags: list[str] = []
    for word in argv:
        match = ASSIGNMENT.match(word)
        if not match:
            flags.append(word)
            continue
        name, text = match.groups()
        if name in BUILD_VARS:
            continue
        message = unknown([name], BY_MAKE, "setting")
        if message:
            raise SpecError(message + "; `make help` lists them")
        field = BY_MAKE[name]
        if field.kind is bool:
            flags += [field.flag] if convert(field, text) else []
        elif text != "":  # NAME= (empty) is the default, as in Make
            convert(field, text)
            flags += [field.flag, text]
    return flags


def add_arguments(parser) -> None:
    """The harness's options, one per field."""
    for field in FIELDS + INPUTS + OPTIONS:
        help_text = field.help if field in OPTIONS else f"{field.make}: {field.help}"
        help_text = help_text.replace("%", "%%")  # argparse formats help
        if field.kind is bool:
            parser.add_argument(field.flag, dest=field.name, action="store_true", help=help_text)
        else:
            parser.add_argument(
                field.flag, dest=field.name, type=field.kind, default=field.default, help=help_text
            )


def to_argv(values: dict) -> list[str]:
    """Field values (by name) as the harness's options; None and False are left out."""
    argv: list[str] = []
    for name, value in values.items():
        field = BY_NAME[name]
        if field.kind is bool:
            argv += [field.flag] if value else []
        elif value is not None:
            argv += [field.flag, str(value)]
    return argv


def from_requested(requested: dict) -> dict:
    """A run's meta.json "requested" as field values (for `make rerun`)."""
    return {
        f.name: requested[f.requested] for f in FIELDS if requested.get(f.requested) is not None
    }


def as_requested(spec) -> dict:
    """A RunSpec (runspec.py) as meta.json records it."""
    return {f.requested: getattr(spec, f.name) for f in FIELDS}


def make_names(makefile: str) -> list[str]:
    """Every variable make knows: the Makefile's own (its `?=` lines) and the run request's."""
    with open(makefile) as f:
        own = set(re.findall(r"^([A-Z][A-Z0-9_]*)\s*\?=", f.read(), re.M))
    return sorted(own | set(BY_MAKE) | set(BUILD_VARS))


def check_make(makefile: str, given: list[str]) -> str:
    """The refusal for Make variables on the command line that neither the Makefile nor the
    run request knows; '' if all are known."""
    return unknown(given, make_names(makefile), "variable")


def help_text() -> str:
    rows = ["make run takes these, as NAME=value (a campaign file: the same names in lower case):"]
    for field in FIELDS + INPUTS:
        default = "" if field.default in (None, False) else f" [{field.default}]"
        rows.append(f"  {field.make:<12} {field.help}{default}")
    return "\n".join(rows)


def main(argv: list[str]) -> int:
    if argv[:1] == ["check-make"] and len(argv) >= 2:
        message = check_make(argv[1], argv[2:])
        if message:
            print(f"{message}; `make help` lists them")
            return 1
        return 0
    if argv[:1] == ["make-names"] and len(argv) == 2:
        print(" ".join(make_names(argv[1])))
        return 0
    if argv == ["help"]:
        print(help_text())
        return 0
    usage = "usage: spec.py check-make MAKEFILE NAME... | make-names MAKEFILE | help"
    print(usage, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
