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
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pandas as pd

from hvbench_analysis import results, stages

# The scheduler setting and the load: what a configuration's label always names.
SETTINGS = (
    "target",
    "hypervisor",
    "sched",
    "period",
    "budget",
    "extratime",
    "cap",
    "weight",
    "priority",  # SCHED_FIFO on kvm
    "tslice",  # Credit's time slice (µs) on xen, None: the pool's boot value
    "ratelimit",  # the Credit/Credit2 rate limit (µs) on xen, None: the pool's boot value
    "rate",  # records/s over all producers: runs at different rates are different configs
    "noise",  # the neighbours and what they did (NOISE), "" for none
    "noise_cpus",  # bare: where the loads ran (job, apart or a CPU list), "" without loads
    "job_cpus",  # bare: the CPUs the job was held to, "" for all
    "scale",  # one broker and one Flink JVM (""), or e.g. "3 brokers, 2 TaskManagers"
    "network",  # the six freeway detectors (""), or e.g. "bay" (325 sensors)
    "load",  # six producer groups, a record a message (""), or e.g. "1 group, by group"
    "power",  # the host's power policy as it was (""), or e.g. "powersave, C-state ≤ 1"
)
# How a run measured (requested records, warmup_s, ramp_s, cpu_latency; forced: a failed
# required readiness check was overridden). Runs that differ in these are never pooled.
MEASUREMENT = ("records", "warmup_s", "ramp_s", "cpu_latency", "forced")
NUMERIC_TAGS = ("rate", "records", "warmup_s", "ramp_s")
# Columns that say which configuration produced a record; every table can group on them.
# setup: the measurement settings the label shows, where they tell configurations apart.
TAGS = (*SETTINGS, *MEASUREMENT, "setup", "rep", "run_id")
# A configuration is everything but the repetition and the run's name.
CONFIG = tuple(t for t in TAGS if t not in ("rep", "run_id"))
# How a measurement setting reads in a label: with its value, and when it is unknown.
MEASUREMENT_TEXT = {
    "records": ("{} records", "records unknown"),
    "warmup_s": ("warm-up {} s", "warm-up unknown"),
    "ramp_s": ("ramp {} s", "ramp unknown"),
    "cpu_latency": ("CPU latency {}", "CPU latency unknown"),
}
# Quality flags beside a run's numbers, in the order they are listed (quality_flags).
FLAGS = (
    "failed",
    "interrupted",
    "unaccounted",
    "forced checks",
    "broker restarted",
    "faults",
    "foreign records",
    "dead letters lost",
    "contradictions",
)
HYPERVISOR_OF_TARGET = {"bare": "none", "kvm": "kvm", "xen": "xen"}
# The load: six producers, each sending one record per period (100 ms unless set otherwise).
PRODUCERS = 6
DEFAULT_RATE_PER_S = 60.0

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

    @property
    def measured(self) -> pd.DataFrame:
        """Samples outside the warm-up (all of them if the warm-up was not loaded)."""
        return self.samples[~self.samples["warmup"]]


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


def tags_of(meta: dict) -> dict:
    """Tag values of a run from its meta.json; what a target does not have is None."""
    requested = meta.get("requested")
    if not isinstance(requested, dict):
        raise RunError("meta.json has no 'requested' settings")
    for key in ("target", "sched"):
        if not requested.get(key):
            raise RunError(f"meta.json does not say the {key}")
    target = requested["target"]
    return {
        "target": target,
        "hypervisor": requested.get("hypervisor", HYPERVISOR_OF_TARGET.get(target, target)),
        "sched": requested["sched"],
        "period": requested.get("period_us"),
        "budget": requested.get("budget_us"),
        "extratime": requested.get("extratime"),
        "cap": requested.get("cap"),
        "weight": requested.get("weight"),
        "priority": requested.get("priority"),
        "tslice": requested.get("tslice_us"),
        "ratelimit": requested.get("ratelimit_us"),
        "rate": rate_per_s(requested.get("producer_period_ms"), requested.get("detectors")),
        **noise_tags(requested),
        "scale": scale_tag(requested),
        "network": "" if requested.get("network", "freeway") == "freeway" else requested["network"],
        "load": load_tag(requested),
        "power": power_tag(requested),
        "records": number_or_none(requested.get("records")),
        "warmup_s": number_or_none(requested.get("warmup_s")),
        "ramp_s": number_or_none(requested.get("ramp_s")),
        "cpu_latency": text_or_none(requested.get("cpu_latency")),
        "forced": forced_checks(meta),
        "setup": "",  # filled in when all runs are loaded (setup_labels)
        "rep": requested.get("rep"),
        "run_id": meta.get("run_id"),
    }


def power_tag(requested: dict) -> str:
    """The power policy a run set (GOVERNOR, MAX_CSTATE, TURBO): "" for none, else e.g.
    "powersave, C-state ≤ 1, turbo off"."""
    parts = []
    if governor := requested.get("governor"):
        parts.append(str(governor))
    if (deepest := requested.get("max_cstate")) is not None:
        parts.append(f"C-state ≤ {deepest}")
    if turbo := requested.get("turbo"):
        parts.append(f"turbo {turbo}")
    return ", ".join(parts)


def energy_facts(meta: dict) -> dict:
    """The measured window's energy (meta.json `energy`), or why there is none."""
    energy = meta.get("energy")
    if not isinstance(energy, dict):
        return {"energy": "not recorded", "joules": None, "mean_w": None, "mj_per_record": None}
    window = (energy.get("windows") or {}).get("measured") or {}
    per_record = window.get("joules_per_record")
    if not energy.get("available"):
        what = f"not available: {energy.get('reason')}"
    else:
        what = ", ".join(sorted({h.get("source", "?") for h in energy["hosts"].values()}))
    return {
        "energy": what,
        "joules": window.get("joules"),
        "mean_w": window.get("mean_w"),
        "mj_per_record": per_record * 1000 if per_record is not None else None,
    }


def load_tag(requested: dict) -> str:
    """How the producers sent (PRODUCERS, MESSAGES, CLIENTS): "" for six groups each sending a
    record a message from one client pair (every run before MESSAGES), else e.g. "1 group,
    by group" or "6 groups, 2 client pairs"."""
    groups = requested.get("producers", PRODUCERS)
    by_group = requested.get("messages", "record") == "group"
    pairs = requested.get("clients", 1)
    if groups == PRODUCERS and not by_group and pairs == 1:
        return ""
    tag = f"{groups} group{'s' if groups != 1 else ''}" + (", by group" if by_group else "")
    return tag + (f", {pairs} client pairs" if pairs > 1 else "")


def noise_tags(requested: dict) -> dict:
    """noise, noise_cpus and job_cpus as text, "" where a run had none (runs before schema 5
    had no neighbours and held the job to no CPUs)."""
    noise = str(requested.get("noise") or "")
    where = (
        str(requested.get("noise_cpus") or "") if noise and requested["target"] == "bare" else ""
    )
    return {"noise": noise, "noise_cpus": where, "job_cpus": str(requested.get("job_cpus") or "")}


def scale_tag(requested: dict) -> str:
    """ "" for one broker and one Flink JVM (every run before schema 6), else the cluster."""
    if requested.get("scale", "one") == "one":
        return ""
    brokers, taskmanagers = requested.get("brokers"), requested.get("taskmanagers")
    return f"{brokers} brokers, {taskmanagers} TaskManagers"


def number_or_none(value) -> float | int | None:
    """A number read from meta.json, or None where it is absent or not a number."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return value


def text_or_none(value) -> str | None:
    return None if value is None else str(value)


def forced_checks(meta: dict) -> bool:
    """Whether the run was asked to go ahead despite failed readiness checks, or did."""
    requested = meta.get("requested") or {}
    readiness = meta.get("readiness")
    failed = readiness.get("failed_required") if isinstance(readiness, dict) else None
    return requested.get("force") is True or bool(failed)


def status_of(meta: dict) -> dict:
    """The run's status (state, reason's first line, phase); a status that is absent or not an
    object reads as state "unknown"."""
    status = meta.get("status")
    if not isinstance(status, dict):
        return {"state": "unknown", "reason": "meta.json has no status", "phase": None}
    reason = status.get("reason")
    return {
        "state": str(status.get("state") or "unknown"),
        "reason": str(reason).strip().split("\n")[0] if reason else None,
        "phase": status.get("phase"),
    }


def rate_per_s(producer_period_ms, detectors=None) -> float | None:
    """Records per second over all detectors, from each one's send period (runs before
    schema 7 name no detectors: the six of the freeway network); None if the period is absent
    or not a positive number."""
    if isinstance(producer_period_ms, bool) or not isinstance(producer_period_ms, int | float):
        return None
    if not producer_period_ms > 0:
        return None
    count = detectors if isinstance(detectors, int) and detectors > 0 else PRODUCERS
    return count * 1000.0 / producer_period_ms


def read_run(directory: Path, include_warmup: bool) -> tuple[dict, pd.DataFrame]:
    """(run facts, samples) of one run; RunError says what is wrong with it."""
    meta = results.read_meta(directory)
    tags = tags_of(meta)
    tags["run_id"] = tags["run_id"] or directory.name
    table = results.read_samples(directory)
    start = table["intended_ns"].min() if len(table) else 0
    received = table[table["copies"] > 0]
    if received["latency_ns"].isna().any():
        raise RunError("samples.csv has received records without a latency")
    legs = stages.legs(received, job_clock(meta))
    if not include_warmup:
        received, legs = received[~received["warmup"]], legs[~received["warmup"]]
    samples = pd.DataFrame(
        {
            "detector": received["detector"],
            "seq": received["seq"],
            "time_s": (received["intended_ns"] - start) / 1e9,
            "latency_ns": received["latency_ns"].to_numpy(np.int64),
            "latency_from_intended_ns": received["latency_from_intended_ns"].to_numpy(np.int64),
            "warmup": received["warmup"],
            **{leg: legs[leg] for leg in stages.LEGS},
        }
    )
    return {"meta": meta, "tags": tags, "path": directory}, samples.reset_index(drop=True)


def job_clock(meta: dict) -> dict | None:
    """What the run knows of the job's clock (meta.json clock.job), or None."""
    relation = (meta.get("clock") or {}).get("job")
    return relation if isinstance(relation, dict) else None


def facts(meta: dict) -> dict:
    """What the report says about a run: status, counts, clock, scheduler settings read back,
    faults, quality flags and problems."""
    counts = meta.get("counts") or {}
    tsc = (meta.get("clock") or {}).get("tsc") or {}
    status = status_of(meta)
    return {
        "state": status["state"],
        "reason": status["reason"],
        "sent": counts.get("sent"),
        "received": counts.get("received"),
        "missing": counts.get("missing"),
        "duplicated": counts.get("duplicated"),
        "dead_lettered": counts.get("dead_lettered"),
        "accounted": bool(counts.get("accounted", False)),
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


def nothing_measured(meta: dict, samples: pd.DataFrame) -> str | None:
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


SAMPLE_COLUMNS = [
    *("detector", "seq", "time_s", "latency_ns", "latency_from_intended_ns", "warmup"),
    *stages.LEGS,
]


def tables_of(loaded: list[tuple[dict, pd.DataFrame]]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The runs table (one row per run, with its setup label and repetition number) and every
    sample, each tagged with its run's settings."""
    rows, frames = [], []
    for run, samples in loaded:
        tags = run["tags"]
        rows.append({**tags, **facts(run["meta"]), "path": str(run["path"])})
        for tag, value in tags.items():
            samples[tag] = value
        for tag in NUMERIC_TAGS:
            samples[tag] = samples[tag].astype(float)  # NaN, not None, where it is unknown
        frames.append(samples)
    runs = pd.DataFrame(rows, columns=[*TAGS, *facts({}).keys(), "path"])
    runs["setup"] = setup_labels(runs)
    number_repetitions(runs)
    if frames:
        samples = pd.concat(frames, ignore_index=True)
        for tag in ("rep", "setup"):  # known once every run is loaded
            samples[tag] = samples["run_id"].map(dict(zip(runs["run_id"], runs[tag], strict=True)))
    else:
        samples = pd.DataFrame(columns=[*SAMPLE_COLUMNS, *TAGS])
    for tag in ("target", "hypervisor", "sched", "setup", "run_id"):
        samples[tag] = samples[tag].astype("category")
    return runs, samples


def setup_labels(runs: pd.DataFrame) -> pd.Series:
    """Per run, the measurement settings in which its configuration differs from others with
    the same SETTINGS, as its label shows them (e.g. "warm-up 2 s, 120 records"); "" where all
    agree, so that the usual labels stay short."""
    labels = pd.Series("", index=runs.index, dtype=object)
    if runs.empty:
        return labels
    same_settings = runs[list(SETTINGS)].astype(str).agg("|".join, axis=1)
    for _, group in runs.groupby(same_settings):
        varying = [tag for tag in MEASUREMENT if group[tag].astype(str).nunique() > 1]
        for index, row in group.iterrows():
            texts = (measurement_text(tag, row[tag]) for tag in varying)
            labels[index] = ", ".join(text for text in texts if text)
    return labels


def measurement_text(tag: str, value) -> str:
    """How a measurement setting reads in a label, e.g. "warm-up 2 s", "120 records"; checks
    that were not forced read as nothing."""
    if tag == "forced":
        return "forced checks" if value else ""
    known, unknown = MEASUREMENT_TEXT[tag]
    if value is None or pd.isna(value):
        return unknown
    whole = isinstance(value, float) and value.is_integer()
    return known.format(int(value) if whole else value)  # 120 records, not 120.0


def number_repetitions(runs: pd.DataFrame) -> None:
    """Runs without a rep tag are numbered 1, 2, … within their configuration, by start time."""
    if runs.empty:
        return
    missing = runs["rep"].isna()
    if not missing.any():
        return
    order = runs[missing].sort_values(["started_at", "run_id"], na_position="last")
    keys = order[list(CONFIG)].astype(str).agg("|".join, axis=1)
    runs.loc[order.index, "rep"] = keys.groupby(keys).cumcount() + 1


def config_label(row) -> str:
    """A short name for a configuration: sched and the settings it has, the rate unless it is
    the default, and the measurement settings that tell it apart from configurations with the
    same settings, e.g. xen/rtds P100000 B77500 @120/s warm-up 2 s."""
    parts = [f"{row['target']}/{row['sched']}"]
    for tag, short in (
        ("period", "P"),
        ("budget", "B"),
        ("cap", "cap"),
        ("weight", "w"),
        ("priority", "prio"),
        ("tslice", "ts"),
        ("ratelimit", "rl"),
    ):
        value = row.get(tag)
        if value is not None and not pd.isna(value):
            parts.append(f"{short}{int(value)}")
    if row.get("extratime") is not None and not pd.isna(row.get("extratime")):
        parts.append(f"e{int(row['extratime'])}")
    if rate := rate_label(row.get("rate")):
        parts.append(f"@{rate}/s")
    parts += noise_label(row)
    if scale := row.get("scale"):
        parts.append(f"on {scale}")
    if network := row.get("network"):
        parts.append(f"({network})")
    if load := row.get("load"):
        parts.append(f"({load})")
    if power := row.get("power"):
        parts.append(f"[{power}]")
    setup = row.get("setup")
    if isinstance(setup, str) and setup:
        parts.append(setup)
    return " ".join(parts)


def noise_label(row) -> list[str]:
    """e.g. ["job on CPU 1", "noise 1:cpu on the job's CPUs"]; [] without either."""
    parts = []
    if job_cpus := row.get("job_cpus"):
        parts.append(f"job on CPU {job_cpus}")
    if noise := row.get("noise"):
        where = row.get("noise_cpus")
        places = {"job": " on the job's CPUs", "apart": " apart", "": ""}
        parts.append(f"noise {noise}" + places.get(where, f" on CPU {where}"))
    return parts


def rate_label(rate) -> str:
    """The rate as text (120, 857.143) if it is known and not the default 60/s, else ""."""
    if rate is None or pd.isna(rate) or rate == DEFAULT_RATE_PER_S:
        return ""
    return f"{rate:g}"
