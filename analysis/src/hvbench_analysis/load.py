"""Load run directories into one tidy table: one row per received record, tag columns per run.

A run directory holds `meta.json` and `samples.csv` (the results contract: results.py, which
reads them, and docs/results.md). A run whose files are missing or malformed is reported by
name with the reason and skipped; it is never merged in part.

    runs = load_runs(["results/run-a", "results/run-b"])
    runs.samples      # tags + detector, seq, time_s, latency_ns, latency_from_intended_ns, warmup
    runs.runs         # one row per run: tags, counts, clock, settings read back, problems
    runs.skipped      # [(run name, reason)]
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from hvbench_analysis import results

# Columns that say which configuration produced a record; every table can group on them.
TAGS = (
    "target",
    "hypervisor",
    "sched",
    "period",
    "budget",
    "extratime",
    "cap",
    "weight",
    "priority",  # SCHED_FIFO on kvm
    "rate",  # records/s over all producers: runs at different rates are different configs
    "rep",
    "run_id",
)
# A configuration is everything but the repetition and the run's name.
CONFIG = tuple(t for t in TAGS if t not in ("rep", "run_id"))
HYPERVISOR_OF_TARGET = {"bare": "none", "kvm": "kvm", "xen": "xen"}
# The load: six producers, each sending one record per period (100 ms unless set otherwise).
PRODUCERS = 6
DEFAULT_RATE_PER_S = 60.0

# A run directory that cannot be used, with the reason.
RunError = results.ResultsError


@dataclass
class Runs:
    samples: pd.DataFrame
    runs: pd.DataFrame
    skipped: list[tuple[str, str]] = field(default_factory=list)

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
        "rate": rate_per_s(requested.get("producer_period_ms")),
        "rep": requested.get("rep"),
        "run_id": meta.get("run_id"),
    }


def rate_per_s(producer_period_ms) -> float | None:
    """Records per second over all producers, from each producer's send period; None if the
    period is absent or not a positive number."""
    if isinstance(producer_period_ms, bool) or not isinstance(producer_period_ms, int | float):
        return None
    if not producer_period_ms > 0:
        return None
    return PRODUCERS * 1000.0 / producer_period_ms


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
    if not include_warmup:
        received = received[~received["warmup"]]
    samples = pd.DataFrame(
        {
            "detector": received["detector"],
            "seq": received["seq"],
            "time_s": (received["intended_ns"] - start) / 1e9,
            "latency_ns": received["latency_ns"].to_numpy(np.int64),
            "latency_from_intended_ns": received["latency_from_intended_ns"].to_numpy(np.int64),
            "warmup": received["warmup"],
        }
    )
    return {"meta": meta, "tags": tags, "path": directory}, samples.reset_index(drop=True)


def facts(meta: dict) -> dict:
    """What the report says about a run: counts, clock, scheduler settings read back."""
    counts = meta.get("counts") or {}
    tsc = (meta.get("clock") or {}).get("tsc") or {}
    problems = []
    if not counts:
        problems.append("meta.json has no counts")
    elif not counts.get("accounted", False):
        problems.append("records unaccounted for")
    return {
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
        "problems": "; ".join(problems),
    }


def load_runs(directories: list[Path | str], include_warmup: bool = False) -> Runs:
    """One table over all readable runs; unreadable ones are listed in `skipped`."""
    frames, rows, skipped = [], [], []
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
        rows.append({**tags, **facts(run["meta"]), "path": str(run["path"])})
        for tag, value in tags.items():
            samples[tag] = value
        samples["rate"] = samples["rate"].astype(float)  # NaN, not None, where it is unknown
        frames.append(samples)
    runs = pd.DataFrame(rows, columns=[*TAGS, *facts({}).keys(), "path"])
    number_repetitions(runs)
    if frames:
        samples = pd.concat(frames, ignore_index=True)
        samples["rep"] = samples["run_id"].map(dict(zip(runs["run_id"], runs["rep"], strict=True)))
    else:
        samples = pd.DataFrame(
            columns=[
                "detector",
                "seq",
                "time_s",
                "latency_ns",
                "latency_from_intended_ns",
                "warmup",
                *TAGS,
            ]
        )
    for tag in ("target", "hypervisor", "sched", "run_id"):
        samples[tag] = samples[tag].astype("category")
    return Runs(samples=samples, runs=runs, skipped=skipped)


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
    """A short name for a configuration: sched and the settings it has, and the rate unless it is
    the default, e.g. xen/rtds P100000 B77500 @120/s."""
    parts = [f"{row['target']}/{row['sched']}"]
    for tag, short in (
        ("period", "P"),
        ("budget", "B"),
        ("cap", "cap"),
        ("weight", "w"),
        ("priority", "prio"),
    ):
        value = row.get(tag)
        if value is not None and not pd.isna(value):
            parts.append(f"{short}{int(value)}")
    if row.get("extratime") is not None and not pd.isna(row.get("extratime")):
        parts.append(f"e{int(row['extratime'])}")
    if rate := rate_label(row.get("rate")):
        parts.append(f"@{rate}/s")
    return " ".join(parts)


def rate_label(rate) -> str:
    """The rate as text (120, 857.143) if it is known and not the default 60/s, else ""."""
    if rate is None or pd.isna(rate) or rate == DEFAULT_RATE_PER_S:
        return ""
    return f"{rate:g}"
