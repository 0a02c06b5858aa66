"""The simulator's statistics for the model's rows: each setting replayed from the traced
reference run of its rate (hvbench_analysis.prediction), in columns `sim_<statistic>` (ms). The
analytical form `simulated` is a line in their logarithm, and the process learns what the
simulator misses: the residual between the runs and the simulator, not the raw statistic."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from hvbench_analysis import prediction
from hvbench_analysis.load import load_runs, run_dirs
from hvbench_analysis.model.table import DEFAULTS, SIM, SIM_COLUMNS, STATISTICS, run_statistics
from hvbench_analysis.tags import float_or_none


def key_of(row) -> tuple[str, float, str]:
    """What a reference shares with a row of the model: the target, the rate, the neighbours
    (the rest of the workload is the same in every run a model is fitted to)."""
    noise = row.get("noise")
    return str(row["target"]), float(row["rate"]), "" if noise is None else str(noise)


@dataclass
class Simulator:
    """The traced references of a set of runs, by key_of."""

    references: dict[tuple[str, float, str], prediction.Reference]
    folder: Path | None = None  # the results folder the references were read from

    @classmethod
    def of(cls, runs: pd.DataFrame, folder: Path | None = None) -> Simulator | None:
        """From the runs' table (load.Runs.runs, read from folder); None without a traced
        reference."""
        found = prediction.references(runs)
        if not found:
            return None
        by_key = {}
        for key, reference in found.items():
            row = dict(zip(prediction.WORKLOAD, key, strict=True))
            by_key[key_of({**row, "rate": float(row["rate"])})] = reference
        return cls(by_key, folder)

    @classmethod
    def from_folder(cls, folder: Path, run_ids: list[str]) -> Simulator | None:
        """A saved model's: its reference runs, read again from the results folder; None
        where one of them is not there (or no longer a traced reference)."""
        if not run_ids:
            return None
        found = cls.of(load_runs(run_dirs(folder, run_ids)).runs, folder)
        return found if found is not None and found.run_ids == sorted(run_ids) else None

    @property
    def run_ids(self) -> list[str]:
        return sorted(r.run_id for r in self.references.values())

    def statistics(self, row: dict) -> dict[str, float]:
        """A row's simulated statistics; nan where no reference or model serves it."""
        reference = self.references.get(key_of(row))
        if reference is None:
            return dict.fromkeys(SIM_COLUMNS, np.nan)
        try:
            late = reference.predicted(reference.table, row, [reservation(row)])
        except ValueError:  # prediction.NotModelled: nothing to simulate
            return dict.fromkeys(SIM_COLUMNS, np.nan)
        found = run_statistics(np.asarray(late, dtype=float) / 1e6)
        return {f"{SIM}{name}": found[name] for name in STATISTICS}

    def columns(self, frame: pd.DataFrame) -> pd.DataFrame:
        """`frame` with the sim_ columns (each setting simulated once)."""
        rows = frame.to_dict("records")
        seen: dict[str, dict] = {}
        values = []
        for row in rows:
            text = repr(sorted((k, str(v)) for k, v in row.items() if k in SETTINGS_OF_ROW))
            if text not in seen:
                seen[text] = self.statistics(row)
            values.append(seen[text])
        return frame.assign(**pd.DataFrame(values, index=frame.index))


def with_simulation(table: pd.DataFrame, runs: pd.DataFrame, folder: Path | None = None):
    """The model's table with each run's simulated statistics, and the simulator, where the
    runs (load.Runs.runs, read from folder) hold a traced reference; else the table as it was
    and None."""
    simulator = Simulator.of(runs, folder)
    return (table, None) if simulator is None else (simulator.columns(table), simulator)


SETTINGS_OF_ROW = ("target", "sched", "noise", "rate", "budget", "period", "extratime", "cap")


def reservation(row: dict) -> dict:
    """A model row's setting as prediction takes it (as asked: the model's inputs are)."""

    def number(name):
        return float_or_none(row.get(name))

    budget, period = number("budget"), number("period")
    if budget is not None and period is None:
        period = float(DEFAULTS["period"])
    return {"budget_us": budget, "period_us": period, "cap": number("cap"),
            "extratime": number("extratime")}  # fmt: skip
