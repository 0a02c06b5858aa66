"""The run request: one table of what a run can be asked, and the typed request built from it.

Every way of asking for a run goes through `FIELDS` (hvbench_analysis.fields, the table the
analysis reads meta.json `requested` by too): Make variables (`make run RECORDS=100`, passed on
to the harness as NAME=value), the harness's flags (`--records 100`), campaign keys
(`records: 100`), `make rerun` (a run's meta.json `requested`) and `make help`. A name that is
not in the table is refused with the closest one suggested, before anything starts.

Standard library only (and the table): the Makefile runs this module with the system python3
to check the variables on its command line, before the venv exists.

    PYTHONPATH=harness/src:analysis/src python3 -m hvbench_harness.spec check-make Makefile RECORD
    PYTHONPATH=harness/src:analysis/src python3 -m hvbench_harness.spec make-names Makefile
    PYTHONPATH=harness/src:analysis/src python3 -m hvbench_harness.spec help
"""

from __future__ import annotations

import difflib
import re
import sys

# the table, and its constants where the harness has always found them (spec.MESSAGES, ...)
from hvbench_analysis.fields import DETECTORS, FIELDS, MESSAGES, PRODUCERS, Field  # noqa: F401


class SpecError(ValueError):
    """A request that names something the table does not have, or a value of the wrong type."""


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
