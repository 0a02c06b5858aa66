"""A run's raw files, and how they become its results.

The parts write their own files into the run's work folder (sent.csv, received.csv, the dead
letters, the injected records, the consumers' summaries, the calibration, the job's settings and
log). When the sending is over, the harness saves beside them what the run knows that the
files do not (`meta.json` as it stands, and how to account: BEFORE), then accounts for every
record. The work folder alone is then enough to account the run again later, anywhere: where
the accounting failed, the run's results keep these files as they are in `raw/`, and where the
results could not be written (a full disk) the work folder stays. `hvbench rerun --account`
(make account) accounts either again (docs/running.md).

    saved = save(work, meta_doc, how)      # before accounting
    accounted = account(work, saved)       # meta.json complete, samples, counts
    write(results / run_id, accounted, work, logs)
"""

from __future__ import annotations

import copy
import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from hvbench_analysis import results as results_contract
from hvbench_analysis import stages
from hvbench_analysis.sections import Energy, EnergyWindow
from hvbench_load.probe import probe_record

from hvbench_harness import accounting

# What the run knew when its sending ended: {"meta": meta.json so far, "how": accounting's
# settings}. Its status is the run's as the sending left it.
BEFORE = "before-accounting.json"
# The files results are made from, kept as they are (a client pair's own: sent-1.csv, ...).
RAW_PATTERNS = (
    BEFORE,
    "sent*.csv",
    "received*.csv",
    "dead_letters*.jsonl",
    "malformed.jsonl",
    "consumer*.json",
    "calibration*.json",
    "job-settings.json",
    "job.out",  # the job's log: the dead letters it could not write are counted from it
    results_contract.ENERGY,
    results_contract.BASELINE,
    results_contract.SCHED_TRACE,
)


class RawError(ValueError):
    """Raw files that cannot be accounted, with the reason."""


@dataclass
class Accounted:
    meta: dict  # meta.json, complete
    samples: pd.DataFrame  # one row per sent record
    counts: accounting.Counts


def save(folder: Path, meta_doc: dict, how: dict) -> dict:
    """Keep meta_doc as it stands and `how` (warmup_ns, pairs, job_clock, job_shares_clock)
    beside the raw files; what account() takes."""
    saved = {"meta": meta_doc, "how": how}
    (folder / BEFORE).write_text(json.dumps(saved, indent=1, default=str) + "\n")
    return json.loads((folder / BEFORE).read_text())


def load(folder: Path) -> dict:
    """What save() kept in `folder`; RawError if it is absent or unreadable."""
    try:
        saved = json.loads((folder / BEFORE).read_text())
    except FileNotFoundError:
        raise RawError(f"no {BEFORE} in {folder}") from None
    except (OSError, ValueError) as e:
        raise RawError(f"{folder / BEFORE} cannot be read: {e}") from None
    if not isinstance(saved, dict) or not {"meta", "how"} <= saved.keys():
        raise RawError(f"{folder / BEFORE} lacks the run's meta and how to account it")
    return saved


def files(folder: Path) -> list[Path]:
    """The raw files present in `folder`."""
    found = {path for pattern in RAW_PATTERNS for path in folder.glob(pattern) if path.is_file()}
    return sorted(found)


def account(folder: Path, saved: dict) -> Accounted:
    """Every record of the run accounted for from the raw files in `folder`: meta.json with
    the counts, the latency statistics, the job's clock and the energy per record."""
    meta, how = copy.deepcopy(saved["meta"]), saved["how"]
    run_id = meta["run_id"]
    samples, counts, _ = accounting.account(
        folder, run_id, how["warmup_ns"], probe_record(run_id), how["pairs"]
    )
    meta["counts"] = counts.as_dict()
    meta["latency"] = accounting.latency_stats(samples)
    meta["latency_from_intended"] = accounting.latency_stats(samples, "latency_from_intended_ns")
    meta.setdefault("clock", {})["job"] = how["job_clock"] or stages.clock_relation(
        samples, how["job_shares_clock"]
    )
    if meta.get("energy"):
        meta["energy"] = with_records(
            meta["energy"], {"run": counts.sent, "measured": counts.measured}
        )
    return Accounted(meta, samples, counts)


def with_records(energy: dict, records: dict[str, int]) -> dict:
    """meta.json `energy` with each window's records and joules per record (the meter's
    summary is taken before accounting, when the records are not known yet)."""
    summary = Energy.from_json(energy, "energy")
    windows = {
        name: None if window is None else counted(window, records.get(name))
        for name, window in summary.windows.items()
    }
    return dataclasses.replace(summary, windows=windows).to_json()


def counted(window: EnergyWindow, records: int | None) -> EnergyWindow:
    per_record = window.joules / records if records else None
    return dataclasses.replace(window, records=records, joules_per_record=per_record)


def write(
    directory: Path,
    meta: dict,
    samples: pd.DataFrame | None,
    folder: Path,
    logs: list[Path],
    keep_raw: bool,
) -> Path:
    """results/<run-id>/ from the raw files in `folder` (with them in raw/ if keep_raw),
    written whole or not at all (results.write_run); OSError if the disk is full."""

    def present(name: str) -> Path | None:
        return folder / name if (folder / name).exists() else None

    return results_contract.write_run(
        directory,
        meta,
        samples,
        dead_letters=present("dead_letters.jsonl"),
        logs=logs,
        sched_trace=present(results_contract.SCHED_TRACE),
        baseline=present(results_contract.BASELINE),
        energy=present(results_contract.ENERGY),
        raw=files(folder) if keep_raw else (),
    )


def again(folder: Path, results: Path | None = None) -> str:
    """The command that accounts the raw files in `folder` again (into `results`)."""
    run = folder.parent if folder.name == results_contract.RAW else folder
    into = f" RESULTS={results}" if results is not None else ""
    flags = f" --results {results}" if results is not None else ""
    return f"make account RUN={run}{into} (or: hvbench rerun --account {run}{flags})"
