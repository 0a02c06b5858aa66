"""The model's files, beside the runs: model.json (the kernels fitted), runs.csv (the table
it came from) and validation.csv; load() rebuilds the same predictions."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
from sklearn.gaussian_process.kernels import Kernel

from hvbench_analysis.model.fit import Form, Kernels, Model, fit
from hvbench_analysis.model.simulated import Simulator
from hvbench_analysis.model.table import (
    CATEGORICAL,
    MEASUREMENT,
    SIM_COLUMNS,
    STATISTICS,
    Inputs,
    ModelError,
    Z,
)
from hvbench_analysis.model.validate import validation_summary

# ---------------------------------------------------------------------------------------------
# the model's files: beside the runs, with the inputs it came from

FORMAT = 2  # 2: a heteroscedastic process (three kernels per statistic)
MODEL_FILE, RUNS_FILE, VALIDATION_FILE = "model.json", "runs.csv", "validation.csv"


def save(model: Model, validation: pd.DataFrame, directory: Path, source: dict) -> Path:
    """model.json (inputs, kernels, validation summary, where the runs came from), runs.csv
    (the runs' table it was fitted to) and validation.csv. load() rebuilds the same model."""
    directory.mkdir(parents=True, exist_ok=True)
    model.table.to_csv(directory / RUNS_FILE, index=False)
    validation.to_csv(directory / VALIDATION_FILE, index=False)
    doc = {
        "format": FORMAT,
        "source": source,
        "runs": len(model.table),
        "configurations": int(model.table["config"].nunique()),
        "statistics": list(STATISTICS),
        "inputs": {
            "dimensions": model.inputs.names,
            "ranges": model.inputs.ranges,
            "levels": model.inputs.levels,
            "fixed": model.inputs.fixed,
        },
        "fitted": {
            name: {
                "analytic": f.form.analytic,
                "analytic_params": [float(v) for v in f.params],
                "matern_nu": f.form.nu,
                "interval_sd": model.scales.get(name, Z),
                "kernel": str(f.kernels.curve),
                "noise_kernel": str(f.kernels.noise),
                "theta": theta_of(f.kernels.curve),
                "noise_theta": theta_of(f.kernels.noise),
                "first_theta": theta_of(f.kernels.first),
            }
            for name, f in model.fitted.items()
        },
        "validation": validation_summary(validation).to_dict("records"),
        # the traced references the `simulated` forms replay, and the folder they are read
        # again from (else the model's parent folder: results/<campaign>/model)
        "simulator": {
            "references": model.simulator.run_ids,
            "results": str(model.simulator.folder) if model.simulator.folder else None,
        }
        if model.simulator
        else None,
        "made_with": {"scikit-learn": sklearn_version()},
    }
    (directory / MODEL_FILE).write_text(json.dumps(doc, indent=2) + "\n")
    return directory / MODEL_FILE


def theta_of(kernel: Kernel) -> list[float]:
    return [float(v) for v in kernel.theta]


def sklearn_version() -> str:
    import sklearn

    return sklearn.__version__


def read_table(path: Path) -> pd.DataFrame:
    """runs.csv as written: empty text stays "" (no neighbours), not NaN."""
    table = pd.read_csv(path, keep_default_na=False, na_values={c: [""] for c in NUMERIC_COLUMNS})
    for column in (*CATEGORICAL, "config", "run_id"):
        table[column] = table[column].astype(str)
    return table


def read_validation(path: Path) -> pd.DataFrame:
    validation = pd.read_csv(path, keep_default_na=False, na_values={"predicted": [""]})
    validation["config"] = validation["config"].astype(str)
    return validation


NUMERIC_COLUMNS = (
    "censored",
    "rate",
    "budget",
    "period",
    "extratime",
    "cap",
    "weight",
    *MEASUREMENT,
    "share",
    "bound_ms",
    *STATISTICS,
    *SIM_COLUMNS,
)


def load(directory: Path) -> tuple[Model, dict]:
    """The saved model, rebuilt from its runs with its kernels as fitted, and model.json."""
    try:
        doc = json.loads((directory / MODEL_FILE).read_text())
        table = read_table(directory / RUNS_FILE)
    except (OSError, ValueError, KeyError) as e:
        raise ModelError(f"no model in {directory} ({e}): make model CAMPAIGN=... first") from None
    if doc.get("format") != FORMAT:
        raise ModelError(f"{directory / MODEL_FILE} is format {doc.get('format')}, not {FORMAT}")
    inputs = Inputs.of(table)
    kernels = {name: saved_kernels(len(inputs.names), f) for name, f in doc["fitted"].items()}
    forms = {name: Form(f["analytic"], f["matern_nu"]) for name, f in doc["fitted"].items()}
    rebuilt = fit(table, kernels, forms)
    rebuilt.scales = {name: f.get("interval_sd", Z) for name, f in doc["fitted"].items()}
    rebuilt.simulator = saved_simulator(doc.get("simulator") or {}, directory)
    return rebuilt, doc


def saved_simulator(saved: dict, directory: Path) -> Simulator | None:
    """The simulator a saved model's `simulated` forms replay: its references read again from
    the folder they were read from, or else from the model's parent folder; ModelError where
    they are in neither (a model that cannot simulate would predict without it)."""
    references = saved.get("references") or []
    if not references:
        return None
    folders = dict.fromkeys(Path(f) for f in (saved.get("results"), directory.parent) if f)
    for folder in folders:
        found = Simulator.from_folder(folder, references)
        if found is not None:
            return found
    raise ModelError(
        f"the model in {directory} replays the traced runs {', '.join(references)}, found "
        f"in none of {', '.join(map(str, folders))}: keep them beside the model, or fit it again"
    )


def saved_kernels(dimensions: int, fitted: dict) -> Kernels:
    initial = Kernels.initial(dimensions, fitted["matern_nu"])
    return Kernels(
        initial.first.clone_with_theta(np.array(fitted["first_theta"])),
        initial.noise.clone_with_theta(np.array(fitted["noise_theta"])),
        initial.curve.clone_with_theta(np.array(fitted["theta"])),
    )
