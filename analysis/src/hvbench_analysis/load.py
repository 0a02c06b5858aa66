"""Load run directories into one tidy table: one row per received record, tag columns per run.

A run directory holds `meta.json` and `samples.csv` (the results contract: results.py, which
reads them, and docs/results.md). A run whose files are missing or malformed is reported by
name with the reason and skipped; it is never merged in part. A run that failed or was
interrupted is left out of the statistics (listed in `left_out`) unless include_failed; so is
a run with no measured sample (every record it received was warm-up, or none came), always.

    runs = load_runs(["results/run-a", "results/run-b"])
    runs.samples      # tags + detector, seq, time_s, latency_ns, latency_from_intended_ns, warmup,
                      # input_leg_ns, job_ns, output_leg_ns (stages.py; NaN where unknown)
    runs.runs         # one row per run: tags, counts, clock, readback, flags, problems
    runs.skipped      # [(run name, reason)]
    runs.left_out     # [LeftOut(run_id, configuration, state, phase, reason)]
    by_run(runs.measured)  # each run's tags (as its meta.json has them) and latencies

A tag of words, or of numbers and None, is categorical in `samples` (a code per sample);
run_rows and by_run give each run's values back, None where it has none.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pandas as pd

from hvbench_analysis import results, stages
from hvbench_analysis.labels import config_label, number_repetitions, setup_labels
from hvbench_analysis.sections import Clock, Counts, present
from hvbench_analysis.tags import (
    CONFIG,
    FLAGS,
    NUMERIC_TAGS,
    TAGS,
    energy_facts,
    forced_checks,
    number_or_none,
    status_of,
    tags_of,
)

# A run directory that cannot be used, with the reason.
RunError = results.ResultsError


class LeftOut(NamedTuple):
    """A run left out of the statistics: it did not complete (reason: its status's first
    line), or it has no measured sample (reason: "no measured samples: ...")."""

    run_id: str
    configuration: str
    state: str
    phase: str | None
    reason: str | None


@dataclass
class Runs:
    samples: pd.DataFrame
    runs: pd.DataFrame
    skipped: list[tuple[str, str]] = field(default_factory=list)
    left_out: list[LeftOut] = field(default_factory=list)

    @cached_property
    def measured(self) -> pd.DataFrame:
        """Samples outside the warm-up (all of them if the warm-up was not loaded); one table,
        shared by every section (tables.by_config keeps its groups once)."""
        return rows_where(self.samples, ~self.samples["warmup"].to_numpy(bool))


def rows_where(table: pd.DataFrame, mask: np.ndarray) -> pd.DataFrame:
    """table[mask], by position: pandas merged a million-row table's columns by type for a
    boolean mask first (a second), not for take."""
    return table.take(np.flatnonzero(mask))


def run_dirs(folder: Path | str, names: list[str] | None = None) -> list[Path]:
    """The run directories in `folder` (those holding a meta.json or samples.csv), or the ones
    named; a name may be a glob."""
    folder = Path(folder)
    if not names:
        return sorted(p for p in folder.iterdir() if results.is_run(p))
    picked: list[Path] = []
    for name in names:
        matches = sorted(p for p in folder.glob(name) if p.is_dir())
        picked.extend(matches or [folder / name])  # a missing one is reported when loaded
    return list(dict.fromkeys(picked))


def read_run(directory: Path, include_warmup: bool) -> tuple[dict, dict]:
    """(run facts, its samples' SAMPLE_COLUMNS: an array each); RunError says what is wrong
    with it. Arrays, not a table: tables_of makes one table of every run's."""
    meta = results.read_meta(directory)
    tags = tags_of(meta)
    tags["run_id"] = tags["run_id"] or directory.name
    table = results.read_samples(directory)
    start = table["intended_ns"].min() if len(table) else 0
    received = table["copies"].to_numpy() > 0
    if np.isnan(table["latency_ns"].to_numpy()[received]).any():
        raise RunError("samples.csv has received records without a latency")
    kept = received if include_warmup else received & ~table["warmup"].to_numpy()

    def column(name: str) -> np.ndarray:  # one column's kept rows (not the whole table's)
        return table[name].to_numpy()[kept]

    stamps = {c: column(c) for c in stages.STAMPS if c in table.columns}
    samples = {
        "detector": table["detector"].array[kept],
        "seq": column("seq"),
        "time_s": (column("intended_ns") - start) / 1e9,
        "latency_ns": column("latency_ns").astype(np.int64),
        "latency_from_intended_ns": column("latency_from_intended_ns").astype(np.int64),
        "warmup": column("warmup"),
        **stages.leg_arrays(stamps, int(kept.sum()), job_clock(meta)),
    }
    return {"meta": meta, "tags": tags, "path": directory}, samples


def job_clock(meta: dict) -> dict | None:
    """What the run knows of the job's clock (meta.json clock.job), or None."""
    clock = Clock.of(meta, "clock")
    return present(clock.job) if clock is not None else None


def facts(meta: dict) -> dict:
    """What the report says about a run: status, counts, clock, scheduler settings read back,
    faults, quality flags and problems."""
    counts = Counts.of(meta, "counts")
    clock = Clock.of(meta, "clock")
    tsc = present(clock.tsc, {}) if clock is not None else {}
    status = status_of(meta)
    return {
        "state": status["state"],
        "reason": status["reason"],
        "sent": counts.sent if counts else None,
        "received": counts.received if counts else None,
        "missing": counts.missing if counts else None,
        "duplicated": counts.duplicated if counts else None,
        "dead_lettered": counts.dead_lettered if counts else None,
        "accounted": bool(counts and counts.accounted),
        "clock": tsc.get("clock") or ("TSC" if tsc else None),
        "tsc_hz": tsc.get("hz"),
        "tsc_source": tsc.get("source"),
        "clocksource": tsc.get("clocksource"),
        "sched_readback": meta.get("sched"),
        "sched_readback_at_end": meta.get("sched_at_end"),
        "warmup_excluded_s": meta.get("warmup_excluded_s"),
        "started_at": meta.get("started_at"),
        "campaign": (meta.get("requested") or {}).get("campaign"),
        "faults": "; ".join(fault_text(fault) for fault in faults_of(meta)),
        "flags": ", ".join(quality_flags(meta)),
        "problems": "; ".join(problems_of(meta)),
        "noise_work": noise_work(meta),
        "copy_work": copy_work(meta),
        **energy_facts(meta),
    }


def noise_work(meta: dict) -> float | None:
    """The work the run's loads did: stress-ng's bogo-ops per second of wall-clock time, summed
    over every load (bare: its groups; a testbed: its neighbour VMs); None without loads."""
    noise = meta.get("noise") or {}
    loads = noise.get("groups") or noise.get("loads") or []
    rates = [
        m.get("bogo-ops-per-second-real-time")
        for load in loads
        for m in load.get("metrics") or []
        if isinstance(m, dict)
    ]
    rates = [r for r in rates if isinstance(r, int | float)]
    return float(sum(rates)) if rates else None


def copy_work(meta: dict) -> float | None:
    """The records per second that the run's workload copies (NOISE=N:workload) received,
    summed over them; None without copies."""
    noise = meta.get("noise") or {}
    loads = noise.get("groups") or noise.get("loads") or []
    rates = [
        load.get("records_per_s")
        for load in loads
        if isinstance(load, dict) and load.get("stressor") == "workload"
    ]
    rates = [r for r in rates if isinstance(r, int | float)]
    return float(sum(rates)) if rates else None


def problems_of(meta: dict) -> list[str]:
    """What is wrong with a run's results: it did not complete, or records are unaccounted."""
    counts = meta.get("counts") or {}
    status = status_of(meta)
    problems = []
    if status["state"] != "completed":
        problems.append(f"run {status['state']}: {status['reason'] or 'no reason given'}")
    if not counts:
        problems.append("meta.json has no counts")
    elif not counts.get("accounted", False):
        problems.append("records unaccounted for")
    return problems


def quality_flags(meta: dict) -> list[str]:
    """What a reader should know beside a run's numbers, from FLAGS; a restart is named by
    its part (the harness restarts only the broker)."""
    counts = meta.get("counts") or {}
    state = status_of(meta)["state"]
    faults = faults_of(meta)
    restarts = [f"{f.get('part')} restarted" for f in faults if f.get("event") == "restarted"]
    foreign = count_of(counts, "foreign_results") + count_of(counts, "foreign_dead_letters")
    checks = [
        (state != "completed", state),
        (not counts.get("accounted", False), "unaccounted"),
        (forced_checks(meta), "forced checks"),
        *((True, restart) for restart in dict.fromkeys(restarts)),
        (len(restarts) < len(faults), "faults"),
        (foreign > 0, "foreign records"),  # other runs' records: informational
        (count_of(counts, "dead_letters_lost") > 0, "dead letters lost"),
        (count_of(counts, "contradictions") > 0, "contradictions"),
    ]
    return [flag for hit, flag in checks if hit]


def union_flags(flag_texts) -> str:
    """The flags of several runs (each comma-separated) as one text, each flag once, in FLAGS
    order (others after them)."""
    flags = {flag for text in flag_texts for flag in str(text).split(", ") if flag}
    order = {flag: i for i, flag in enumerate(FLAGS)}
    return ", ".join(sorted(flags, key=lambda flag: (order.get(flag, len(FLAGS)), flag)))


def count_of(counts: dict, key: str) -> int:
    """A count from meta.json; 0 where it is absent or not an integer."""
    value = counts.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def faults_of(meta: dict) -> list[dict]:
    faults = meta.get("faults")
    return [f for f in faults if isinstance(f, dict)] if isinstance(faults, list) else []


def fault_text(fault: dict) -> str:
    """e.g. broker restarted at 41.2 s (exit 137): killed by the OOM killer"""
    at_s = number_or_none(fault.get("at_s"))
    text = f"{fault.get('part', '?')} {fault.get('event', '?')}"
    text += f" at {at_s:.1f} s" if at_s is not None else ""
    text += f" (exit {fault['exit_code']})" if fault.get("exit_code") is not None else ""
    return text + (f": {fault['detail']}" if fault.get("detail") else "")


def load_runs(
    directories: list[Path | str], include_warmup: bool = False, include_failed: bool = False
) -> Runs:
    """One table over all readable runs; unreadable ones are listed in `skipped`. Runs that did
    not complete are listed in `left_out`, or with include_failed loaded (and flagged)."""
    loaded, skipped, left_out = [], [], []
    seen: set[str] = set()
    for directory in map(Path, directories):
        try:
            run, samples = read_run(directory, include_warmup)
        except RunError as e:
            skipped.append((directory.name, str(e)))
            continue
        tags = run["tags"]
        if tags["run_id"] in seen:
            skipped.append((directory.name, f"run id {tags['run_id']} loaded already"))
            continue
        seen.add(tags["run_id"])
        status = status_of(run["meta"])
        if status["state"] != "completed" and not include_failed:
            why = status["reason"]
        elif (why := nothing_measured(run["meta"], samples)) is None:
            loaded.append((run, samples))
            continue
        where = (config_label(tags), status["state"], status["phase"])
        left_out.append(LeftOut(tags["run_id"], *where, why))
    runs, samples = tables_of(loaded)
    return Runs(samples=samples, runs=runs, skipped=skipped, left_out=left_out)


def nothing_measured(meta: dict, samples: dict) -> str | None:
    """Why a run has no measured sample (every record received was warm-up, or none came),
    or None if it has some."""
    if (~samples["warmup"].astype(bool)).any():
        return None
    received = count_of(meta.get("counts") or {}, "received")
    warmup_s = number_or_none(meta.get("warmup_excluded_s"))
    warmup = f"WARMUP={warmup_s:g} s" if warmup_s is not None else "the warm-up"
    if received == 0:
        return "no measured samples: no record was received"
    return f"no measured samples: all {received} records received fell in {warmup}"


def tag_row(tags: dict) -> pd.DataFrame:
    """A row of the run's tags, each column typed as when the tag is set on all its samples."""
    row = pd.DataFrame(index=[0])
    for tag, value in tags.items():
        row[tag] = value
    for tag in NUMERIC_TAGS:
        row[tag] = row[tag].astype(float)  # NaN, not None, where it is unknown
    return row


# Tags of words, their categories in sorted order (a grouping by them is in that order).
WORDS = ("target", "hypervisor", "sched", "setup", "run_id")


def each_sample(tags: pd.DataFrame, counts: list[int]) -> dict:
    """The runs' tags, a row per sample: each run's row repeated for its samples. A tag with
    values of several kinds (a number or None, words) is categorical: a code per sample,
    not a million Python objects (copying those took seconds; run_rows gives them back)."""
    columns = {}
    for tag in tags.columns:
        values = tags[tag].to_numpy()
        if values.dtype != object:
            columns[tag] = np.repeat(values, counts)
            continue
        codes, kinds = pd.factorize(values, sort=tag in WORDS)  # None: code -1, missing
        categories = pd.Index(kinds, dtype=object)  # 77500 stays an int, True a bool
        columns[tag] = pd.Categorical.from_codes(np.repeat(codes, counts), categories)
    return columns


def run_rows(samples: pd.DataFrame, columns) -> pd.DataFrame:
    """The first sample of each run (in the order of the samples), `columns` of it, each tag
    as the run's tags have it (read_run): a categorical's missing value is None again."""
    codes = pd.factorize(samples["run_id"])[0]
    first = np.unique(codes, return_index=True)[1]
    rows = samples.iloc[np.sort(first)][list(columns)]
    for column in rows.columns:
        if isinstance(rows[column].dtype, pd.CategoricalDtype):
            values = rows[column].to_numpy(dtype=object)
            values[pd.isna(values)] = None
            rows[column] = pd.Series(values, index=rows.index, dtype=object)
    return rows


class RunSamples(NamedTuple):
    """One run's measured samples: its tags (with rep and run_id) and latencies (ns)."""

    run_id: str
    tags: dict
    latency_ns: np.ndarray


def once_per_table(compute: Callable[[pd.DataFrame], list]) -> Callable[[pd.DataFrame], list]:
    """compute(table), worked out once and kept while the table lives: every section of a
    report asks for the same split of the same samples table."""
    kept: dict[int, list] = {}  # by the table's id, emptied when the table goes

    @functools.wraps(compute)
    def once(table: pd.DataFrame) -> list:
        key = id(table)
        if key not in kept:
            kept[key] = compute(table)
            weakref.finalize(table, kept.pop, key, None)
        return list(kept[key])

    return once


@once_per_table
def by_run(measured: pd.DataFrame) -> list[RunSamples]:
    """Each run's tags and latencies, in run id order, from the latency column alone
    (splitting every column by run took longer than the statistics)."""
    codes, _ = pd.factorize(measured["run_id"])
    order = np.argsort(codes, kind="stable")
    latency = np.split(measured["latency_ns"].to_numpy()[order],
                       np.cumsum(np.bincount(codes))[:-1])  # fmt: skip
    rows = run_rows(measured, (*CONFIG, "rep", "run_id")).to_dict("records")
    runs = [RunSamples(row["run_id"], row, ns) for row, ns in zip(rows, latency, strict=True)]
    return sorted(runs, key=lambda run: run.run_id)


SAMPLE_COLUMNS = [
    *("detector", "seq", "time_s", "latency_ns", "latency_from_intended_ns", "warmup"),
    *stages.LEGS,
]


def joined(frames: list[dict]) -> dict:
    """The runs' SAMPLE_COLUMNS, one after the other (a detector column of runs with other
    detectors is of words, as pandas joins categoricals)."""
    columns = {c: np.concatenate([frame[c] for frame in frames]) for c in SAMPLE_COLUMNS[1:]}
    detectors = [pd.Series(frame["detector"]) for frame in frames]
    return {"detector": pd.concat(detectors, ignore_index=True), **columns}


def tables_of(loaded: list[tuple[dict, dict]]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The runs table (one row per run, with its setup label and repetition number) and every
    sample, each tagged with its run's settings."""
    rows, frames, tag_rows = [], [], []
    for run, samples in loaded:
        tags = run["tags"]
        rows.append({**tags, **facts(run["meta"]), "path": str(run["path"])})
        frames.append(samples)
        tag_rows.append(tag_row(tags))
    runs = pd.DataFrame(rows, columns=[*TAGS, *facts({}).keys(), "path"])
    runs["setup"] = setup_labels(runs)
    number_repetitions(runs)
    if frames:
        tags = pd.concat(tag_rows, ignore_index=True)
        for tag in ("rep", "setup"):  # known once every run is loaded
            tags[tag] = pd.Series(runs[tag].tolist())  # typed by its values (rep: int64)
        counts = [len(frame["seq"]) for frame in frames]
        # copy=False: a block per column, not one per type (stacking a million rows of each
        # took a second, and a 2-D block's rows are slower to pick than a column's)
        samples = pd.DataFrame({**joined(frames), **each_sample(tags, counts)}, copy=False)
    else:
        samples = pd.DataFrame(columns=[*SAMPLE_COLUMNS, *TAGS])
        samples = samples.astype(dict.fromkeys(WORDS, "category"))
    return runs, samples
