"""The results contract: what `results/<run-id>/` holds, with one writer and one reader.

docs/results.md describes every file and field. Everything that writes a run (the harness, the
synthetic test data) goes through `write_run`; everything that reads one (the report, campaigns,
`make rerun`) through `read_meta` / `read_samples`. Both check meta.json against SECTIONS, whose
main sections are the dataclasses of sections.py: the writers build them there and the readers
pick their fields there. `meta.json` carries `schema`, the version of this contract; a run
written before the version was recorded is version 1 and is upgraded when read, so old results
still load.

    write_run(folder, meta, samples, dead_letters=..., logs=[...])
    meta = read_meta(folder)              # upgraded to SCHEMA_VERSION
    samples = read_samples(folder)        # the columns the analysis needs, typed
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
from pathlib import Path

import pandas as pd

from hvbench_analysis import sections
from hvbench_analysis.sections import (
    Clock,
    Counts,
    Energy,
    Latency,
    Power,
    Requested,
    ResultsError,
    Sched,
    Status,
)

# 1: runs before the version was recorded. 2: `schema` recorded; `requested` names every
# scheduler parameter (budget_us, period_us, priority, extratime, weight, cap), None where unset.
# 3: `status` (completed, failed or interrupted: a run that stopped while sending is written
# too), `faults` (parts that exited or were restarted) and four more counts. 4: the job's
# stamps (`job_in_ns`, `job_out_ns` in samples.csv) and what is known of its clock
# (`clock.job`), for the stage legs; older runs have neither, and their legs are unknown.
# 5: the neighbours (`requested.noise`, `noise_cpus`, `job_cpus`; `noise`, what they did) and,
# on the bare target, the CPUs the job was held to (`job_cpus`); older runs had neither.
# 6: the scale (`requested.scale`, `brokers`, `taskmanagers`; `flink_cluster`, the Kafka
# cluster's nodes and topics in `kafka`) and each part's CPU time (`cpu_per_part`); older runs
# ran one broker and one Flink JVM.
# 7: the road network (`requested.network`, freeway or bay, and `requested.detectors`, how many
# send); older runs used the six freeway detectors.
# 8: `requested.messages` (record or group) and `requested.producers` as asked.
# 9: client pairs (`requested.clients`; `clock.clients`, each pair's machine and calibration;
# samples.csv `client`); older runs had one pair.
# 10: the power policy (`requested.governor`, `max_cstate`, `turbo`; `power`, each host's
# readback) and the energy (`energy`, each window's joules, or why not available; energy.csv,
# every sample); older runs recorded neither.
# 11: the Xen pool's time slice and rate limit (`requested.tslice_us`, `ratelimit_us`) and each
# host's real-time profile (`rt_profile`, its settings read back); older runs had neither, and
# ran with the pool's boot values.
# 12: a run whose results could not be made from its raw files (its accounting, or what
# follows it, failed) is written too: `status` gains `traceback` and `before` (the status the
# sending left), its `counts` and `latency` are null where not computed, samples.csv may be
# absent, and raw/ keeps the raw files; `accounted_again` where `hvbench rerun --account` made
# the results later. Also `concurrent` (the other runs seen on the run's machines),
# `watch` (the stall limit), `teardown` (what it ended, what was left) and
# `requested.concurrent`, `requested.stall_s`. Older runs have none of these, and need none.
SCHEMA_VERSION = 12
META = "meta.json"
SAMPLES = "samples.csv"
# The same rows and columns in Parquet, where pyarrow is installed: for other tools, and read in
# the CSV's place while it holds the CSV's digest (the CSV stays the record: see read_samples).
SAMPLES_PARQUET = "samples.parquet"
CSV_DIGEST = b"hvbench.samples_csv_sha256"
DEAD_LETTERS = "dead_letters.jsonl"
SCHED_TRACE = "sched_trace.txt"  # TRACE=1: the kernel's sched events of the job's threads
ENERGY = "energy.csv"  # the hosts' energy samples: cumulative joules per domain
BASELINE = "baseline.csv"  # BASELINE=1: every timer wake-up's latency (µs) of the noise floor
LOGS = "logs"
RAW = "raw"  # the raw files as the parts wrote them, where kept (a failed accounting)
NOISE_KEYS = ("noise", "noise_cpus", "job_cpus")  # in `requested` from version 5
SCALE_ONE = {"scale": "one", "brokers": None, "taskmanagers": None}  # `requested` before 6
FREEWAY = {"network": "freeway", "detectors": 6}  # `requested` before 7
# Runs before schema 8 sent each record as a message of its own (MESSAGES=record).
A_RECORD_A_MESSAGE = {"messages": "record"}
ONE_PAIR = {"clients": 1}  # `requested` before 9
POWER_AS_IT_WAS = {"governor": None, "max_cstate": None, "turbo": None}  # before 10
POOL_AS_IT_WAS = {"tslice_us": None, "ratelimit_us": None}  # before 11: the boot values
SETTING_KEYS = ("budget_us", "period_us", "priority", "extratime", "weight", "cap")
# Counts added in version 3: foreign records are other runs' (reported, never a problem);
# contradictions and lost dead letters are problems.
COUNT_KEYS_3 = ("foreign_results", "foreign_dead_letters", "contradictions", "dead_letters_lost")
# Every run before version 3 that wrote a meta.json had completed.
COMPLETED = Status(state="completed", reason=None, phase=None)

# What the analysis reads of samples.csv (one row per record sent; the harness writes more).
SAMPLE_COLUMNS = (
    "detector",
    "seq",
    "intended_ns",
    "received_ns",
    "copies",
    "latency_ns",
    "latency_from_intended_ns",
    "warmup",
)
# Read too where present: the send stamp and the job's stamps, for the stage legs (stages.py).
OPTIONAL_COLUMNS = ("sent_ns", "job_in_ns", "job_out_ns")
DTYPES = {
    "detector": "category",
    "seq": "int64",
    "intended_ns": "int64",
    "received_ns": "float64",  # empty where a record never came back
    "copies": "int32",
    "latency_ns": "float64",
    "latency_from_intended_ns": "float64",
    "warmup": "bool",
    **dict.fromkeys(OPTIONAL_COLUMNS, "float64"),  # empty where a record never came back
}


# meta.json's sections: each key a run may write, the type of its value (its JSON types; a
# section of sections.py, checked key by key) and what it says (docs/results.md explains each;
# a test keeps the two equal). write_run refuses a key that is not here, or a value of another
# type; `schema` exports them as a JSON Schema.
SECTIONS: dict[str, tuple[object, str]] = {
    "schema": (int, "this contract's version"),
    "run_id": (str, "the run's name"),
    "started_at": (str, "UTC, when the run started"),
    "ended_at": (str, "UTC, when the sending ended"),
    "status": (Status, "completed, failed or interrupted, why, and in which phase"),
    "concurrent": (dict, "the other runs and campaigns live on the run's machines"),
    "accounted_again": (dict, "when make account made the results from raw files"),
    "faults": (list, "parts that exited, hung or were restarted"),
    "watch": (dict, "how the run watched its parts' progress"),
    "teardown": (dict, "what the teardown ended and what was left"),
    "requested": (Requested, "the run as asked (the run request's fields)"),
    "invocation": (dict, "how the harness was started"),
    "inputs": (dict, "what the run read: data, model, jars, or a testbed's inventory"),
    "rerun_of": (str | None, "the run this one repeats (make rerun)"),
    "replayed_from": (str, "the recorded run this one is a copy of (a replayed campaign)"),
    "placement": (dict, "testbeds: which machine ran each part"),
    "hypervisor": (dict, "testbeds: the host's hypervisor as its agent found it"),
    "readiness": (dict, "every readiness check per machine"),
    "cpu_latency": (dict, "the CPU latency limit held, read back, or why not"),
    "sched": (Sched, "the scheduler setting as applied and read back"),
    "sched_at_end": (dict | list, "the same readback after the last record"),
    "trace": (dict, "TRACE=1: the trace's tool, clock and summary"),
    "baseline": (dict, "BASELINE=1: the noise floor's command, setting and summary"),
    "noise": (dict, "the neighbours and what they did"),
    "job_cpus": (dict, "bare: the CPUs the job was held to, read back"),
    "guests": (list, "testbeds: every guest as the hypervisor had it"),
    "flink_cluster": (dict, "SCALE=cluster: the Flink session cluster"),
    "cpu_per_part": (dict, "bare: each part's CPU time while sending"),
    "power": (Power, "the power policy asked, read back, at the end"),
    "rt_profile": (dict, "each machine's real-time profile, read back"),
    "energy": (Energy, "each window's joules, or why not available"),
    "steal_while_sending": (dict, "CPU time the hypervisor took while sending"),
    "clock": (Clock, "the TSC calibration and where each stamp was taken"),
    "counts": (Counts | None, "every record sent, accounted for"),
    "latency": (Latency | None, "p50 … max over the measured records, ms"),
    "latency_from_intended": (Latency | None, "the same from the intended send time"),
    "warmup_excluded_s": (float, "the warm-up left out of the statistics"),
    "kafka": (dict, "the broker's version, properties and JVM options"),
    "clients": (dict, "the producers' and consumer's Kafka settings"),
    "job": (dict | None, "the job's settings as it started"),
    "model": (str | None, "the model's checksum"),
    "host": (dict | None, "the machines' facts"),
    "versions": (dict | None, "Python packages and librdkafka"),
    "git": (dict, "the controller's commit, and whether it was dirty"),
    "files": (dict, "the files this run has"),
}


def check_sections(meta: dict, strict: bool = True) -> None:
    """ResultsError naming a key SECTIONS does not have, or a value not of its type (a
    section's keys each checked). strict, for writing: nothing the contract does not name;
    reading lets the keys of other versions through."""
    unknown = sorted(set(meta) - set(SECTIONS))
    if unknown and strict:
        raise ResultsError(f"meta.json has no section {', '.join(unknown)} (results.SECTIONS)")
    for key, value in meta.items():
        if key in SECTIONS:
            sections.parse(SECTIONS[key][0], value, key, strict)


def json_schema() -> dict:
    """SECTIONS as a JSON Schema (docs/meta.schema.json), for users of the files."""
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": f"hvbench meta.json, schema {SCHEMA_VERSION}",
        "type": "object",
        "required": ["schema", "run_id", "requested", "status", "files"],
        "additionalProperties": False,
        "properties": {
            key: {**sections.schema_of(kind), "description": what}
            for key, (kind, what) in SECTIONS.items()
        },
    }


def write_run(
    directory: Path,
    meta: dict,
    samples: pd.DataFrame | None,
    *,
    dead_letters: Path | None = None,
    logs: list[Path] = (),
    float_format: str | None = None,
    sched_trace: Path | None = None,
    baseline: Path | None = None,
    energy: Path | None = None,
    raw: list[Path] = (),
) -> Path:
    """Write one run, whole or not at all: every file goes into a hidden folder beside
    `directory` (the same filesystem), meta.json last, and that folder then takes the run's
    place (an earlier version of the run is replaced: `hvbench rerun --account`). On any error
    (a full disk: OSError) the hidden folder is removed and the error raised, so that nothing
    half-written is left and a meta.json says the run's files are complete (campaigns rely on
    that); whether the run itself completed, its `status` says. `samples` is None for a run
    whose records could not be accounted (no samples.csv); `raw` are its raw files, kept as
    they are in raw/."""
    if samples is not None:
        absent = [c for c in SAMPLE_COLUMNS if c not in samples.columns]
        if absent:
            raise ResultsError(f"samples lack column(s) {', '.join(absent)}")
    directory = Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    writing = directory.parent / f".{directory.name}.writing-{os.getpid()}"
    shutil.rmtree(writing, ignore_errors=True)
    try:
        writing.mkdir()
        files = _write_files(writing, samples, float_format, dead_letters, logs, raw)
        files |= _copy_files(writing, sched_trace=sched_trace, baseline=baseline, energy=energy)
        doc = {"schema": SCHEMA_VERSION, **meta, "files": files}
        check_sections(doc)
        (writing / META).write_text(json.dumps(doc, indent=2, default=str) + "\n")
        _put_in_place(writing, directory)
    except BaseException:
        shutil.rmtree(writing, ignore_errors=True)
        raise
    return directory


def integer_ns(samples: pd.DataFrame) -> pd.DataFrame:
    """The nanosecond columns as integers, a record with none (never received) an empty field:
    `395342835089`, not the `395342835089.0` a column with gaps becomes. A column with a
    fraction in it stays as it is."""
    whole = {
        column: "Int64"
        for column in samples.columns
        if column.endswith("_ns")
        and samples[column].dtype.kind == "f"
        and (samples[column].dropna() % 1 == 0).all()
    }
    return samples.astype(whole) if whole else samples


def _write_files(
    folder: Path,
    samples: pd.DataFrame | None,
    float_format: str | None,
    dead_letters: Path | None,
    logs: list[Path],
    raw: list[Path],
) -> dict:
    """samples.csv, the dead letters, logs/ and raw/ into `folder`; meta.json's `files`."""
    files = {}
    if samples is not None:
        written = integer_ns(samples)
        written.to_csv(folder / SAMPLES, index=False, float_format=float_format)
        files["samples"] = SAMPLES
        if write_parquet(written, folder):
            files["samples_parquet"] = SAMPLES_PARQUET
    if dead_letters is not None:
        shutil.copy(dead_letters, folder / DEAD_LETTERS)
        files["dead_letters"] = DEAD_LETTERS
    for name, paths in ((LOGS, logs), (RAW, raw)):
        if paths:
            (folder / name).mkdir()
            for path in paths:
                shutil.copy(path, folder / name / Path(path).name)
            files[name] = f"{name}/"
    return files


def write_parquet(samples: pd.DataFrame, folder: Path) -> bool:
    """samples.parquet beside samples.csv (already written), holding the CSV's digest; False
    where pyarrow is not installed."""
    if importlib.util.find_spec("pyarrow") is None:
        return False
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pandas(samples, preserve_index=False)
    tags = {**(table.schema.metadata or {}), CSV_DIGEST: csv_digest(folder / SAMPLES).encode()}
    pq.write_table(table.replace_schema_metadata(tags), folder / SAMPLES_PARQUET)
    return True


def csv_digest(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _copy_files(folder: Path, **sources: Path | None) -> dict:
    """The optional single files (sched_trace, baseline, energy) that exist, copied."""
    names = {"sched_trace": SCHED_TRACE, "baseline": BASELINE, "energy": ENERGY}
    files = {}
    for key, source in sources.items():
        if source is not None and Path(source).exists():
            shutil.copy(source, folder / names[key])
            files[key] = names[key]
    return files


def _put_in_place(written: Path, directory: Path) -> None:
    """`written` becomes `directory`; an earlier `directory` is replaced, and comes back if
    the renaming fails."""
    if not directory.exists():
        written.rename(directory)
        return
    replaced = directory.parent / f".{directory.name}.replaced-{os.getpid()}"
    shutil.rmtree(replaced, ignore_errors=True)
    directory.rename(replaced)
    try:
        written.rename(directory)
    except BaseException:
        replaced.rename(directory)
        raise
    shutil.rmtree(replaced, ignore_errors=True)


def upgrade(meta: dict) -> dict:
    """meta.json of any version as the current version has it."""
    version = meta.get("schema", 1)
    if not isinstance(version, int) or not 1 <= version <= SCHEMA_VERSION:
        raise ResultsError(f"meta.json has schema {version!r}; this code reads 1..{SCHEMA_VERSION}")
    meta = dict(meta)
    if version < 2 and isinstance(meta.get("requested"), dict):
        meta["requested"] = {**dict.fromkeys(SETTING_KEYS), **meta["requested"]}
    if version < 3:
        meta["status"] = COMPLETED.to_json()
        meta["faults"] = []
        if isinstance(meta.get("counts"), dict):
            meta["counts"] = {**dict.fromkeys(COUNT_KEYS_3, 0), **meta["counts"]}
    if version < 5 and isinstance(meta.get("requested"), dict):
        meta["requested"] = {**dict.fromkeys(NOISE_KEYS), **meta["requested"]}
    if version < 6 and isinstance(meta.get("requested"), dict):
        meta["requested"] = {**SCALE_ONE, **meta["requested"]}
    if version < 7 and isinstance(meta.get("requested"), dict):
        meta["requested"] = {**FREEWAY, **meta["requested"]}
    if version < 8 and isinstance(meta.get("requested"), dict):
        meta["requested"] = {**A_RECORD_A_MESSAGE, **meta["requested"]}
    if version < 9 and isinstance(meta.get("requested"), dict):
        meta["requested"] = {**ONE_PAIR, **meta["requested"]}
    if version < 10 and isinstance(meta.get("requested"), dict):
        meta["requested"] = {**POWER_AS_IT_WAS, **meta["requested"]}
    if version < 11 and isinstance(meta.get("requested"), dict):
        meta["requested"] = {**POOL_AS_IT_WAS, **meta["requested"]}
    meta["schema"] = SCHEMA_VERSION
    return meta


def read_meta(directory: Path) -> dict:
    """A run's meta.json, upgraded to SCHEMA_VERSION; ResultsError says what is wrong."""
    directory = Path(directory)
    if not directory.is_dir():
        raise ResultsError("no such run directory")
    try:
        meta = json.loads((directory / META).read_text())
    except FileNotFoundError:
        raise ResultsError("no meta.json") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ResultsError(f"meta.json is not valid JSON: {e}") from None
    if not isinstance(meta, dict):
        raise ResultsError("meta.json is not an object")
    meta = upgrade(meta)
    check_sections(meta, strict=False)
    return meta


def rewrite_meta(directory: Path, meta: dict) -> None:
    """A written run's meta.json replaced whole (checked as write_run checks it; a file
    renamed into place): for what is added to a run after it was written (its synthetic trace,
    noise floor or energy)."""
    doc = {**meta, "schema": SCHEMA_VERSION}
    check_sections(doc)
    path = Path(directory) / META
    writing = path.with_name(f".{META}.{os.getpid()}")
    writing.write_text(json.dumps(doc, indent=2, default=str) + "\n")
    os.replace(writing, path)


# results/<campaign>/campaign.json, a campaign's index: written by `make campaign`
# (hvbench_harness.campaign.index), read by it to resume and by the report. 1: before the
# version was recorded; 2: `version` recorded.
CAMPAIGN_FILE = "campaign.json"
CAMPAIGN_VERSION = 2


def read_campaign_index(folder: Path) -> dict | None:
    """A campaign's index in `folder`, as this version has it; None if there is none,
    ResultsError if it cannot be read."""
    path = Path(folder) / CAMPAIGN_FILE
    if not path.exists():
        return None
    try:
        doc = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ResultsError(f"{CAMPAIGN_FILE} cannot be read: {e}") from None
    if not isinstance(doc, dict):
        raise ResultsError(f"{CAMPAIGN_FILE} is not an object")
    version = doc.get("version", 1)
    if not isinstance(version, int) or not 1 <= version <= CAMPAIGN_VERSION:
        raise ResultsError(f"{CAMPAIGN_FILE} has version {version!r}; this code reads 1..2")
    return {**doc, "version": CAMPAIGN_VERSION}


def write_campaign_index(folder: Path, doc: dict) -> None:
    """The index written whole: a file renamed into place."""
    path = Path(folder) / CAMPAIGN_FILE
    writing = path.with_suffix(".json.tmp")
    writing.write_text(json.dumps({**doc, "version": CAMPAIGN_VERSION}, indent=1) + "\n")
    writing.replace(path)


def read_samples(directory: Path) -> pd.DataFrame:
    """samples.csv's SAMPLE_COLUMNS (and those of OPTIONAL_COLUMNS it has), typed;
    ResultsError says what is wrong. From samples.parquet where it holds the digest of the
    samples.csv beside it (the same rows, read faster); else, or if the CSV was changed since,
    from the CSV."""
    path = Path(directory) / SAMPLES
    if not path.exists():
        raise ResultsError("no samples.csv")
    current = read_current_parquet(Path(directory))
    if current is not None:
        return current
    try:
        header = pd.read_csv(path, nrows=0).columns
    except (pd.errors.EmptyDataError, pd.errors.ParserError, UnicodeDecodeError) as e:
        raise ResultsError(f"samples.csv cannot be read: {e}") from None
    absent = [c for c in SAMPLE_COLUMNS if c not in header]
    if absent:
        raise ResultsError(f"samples.csv lacks column(s) {', '.join(absent)}")
    try:
        columns = [*SAMPLE_COLUMNS, *(c for c in OPTIONAL_COLUMNS if c in header)]
        return pd.read_csv(path, usecols=columns, dtype=DTYPES, engine="c")
    except (ValueError, pd.errors.ParserError) as e:
        raise ResultsError(f"samples.csv has malformed values: {e}") from None


def read_current_parquet(directory: Path) -> pd.DataFrame | None:
    """samples.parquet's columns as read_samples gives the CSV's, if it was written from the
    samples.csv beside it (its digest agrees); None otherwise, or where pyarrow is absent."""
    parquet = directory / SAMPLES_PARQUET
    if not parquet.exists() or importlib.util.find_spec("pyarrow") is None:
        return None
    import pyarrow.parquet as pq

    try:
        schema = pq.read_schema(parquet)
        tag = (schema.metadata or {}).get(CSV_DIGEST, b"").decode()
        if tag != csv_digest(directory / SAMPLES):
            return None
        wanted = {*SAMPLE_COLUMNS, *OPTIONAL_COLUMNS}
        columns = [c for c in schema.names if c in wanted]  # in the file's order, as the CSV's
        # the detector's words read once each (a million strings took 0.3 s)
        words = ["detector"] if "detector" in columns else []
        frame = pq.read_table(parquet, columns=columns, read_dictionary=words).to_pandas()
    except (OSError, ValueError):  # pyarrow's errors derive from these: read the CSV instead
        return None
    frame["detector"] = as_words(frame["detector"])
    differ = {c: DTYPES[c] for c in columns if frame[c].dtype != DTYPES[c]}
    return frame.astype(differ)  # only those that differ: each astype copies its column


def as_words(column: pd.Series) -> pd.Series:
    """A column of words as read_csv's `category` reads it: its categories as text, sorted."""
    if not isinstance(column.dtype, pd.CategoricalDtype):
        return column.astype(str).astype("category")
    words = column.cat.rename_categories([str(c) for c in column.cat.categories])
    return words.cat.reorder_categories(sorted(words.cat.categories))


def is_run(directory: Path) -> bool:
    """Whether a directory holds a run (or what is left of one); a hidden one is write_run's
    own, being written."""
    return (
        not directory.name.startswith(".")
        and directory.is_dir()
        and ((directory / META).exists() or (directory / SAMPLES).exists())
    )


if __name__ == "__main__":  # python -m hvbench_analysis.results: the JSON Schema of meta.json
    print(json.dumps(json_schema(), indent=2, ensure_ascii=False))
