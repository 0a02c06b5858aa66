"""`hvbench model fit`: fit, validate and save the model of a results folder's runs."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from hvbench_analysis.load import load_runs, run_dirs
from hvbench_analysis.model.fit import Model
from hvbench_analysis.model.saved import MODEL_FILE, save
from hvbench_analysis.model.simulated import with_simulation
from hvbench_analysis.model.table import ModelError, run_table
from hvbench_analysis.model.validate import fit_chosen, validation_summary

# ---------------------------------------------------------------------------------------------
# `hvbench model fit`


def fit_folder(
    results: Path, names: list[str], out: Path, references: list[str] | None = None
) -> tuple[Model, pd.DataFrame]:
    """Fit, validate and save the model of the completed runs in a results folder; a traced
    reference among them, or among `references` (run names there), gives the simulated form."""
    runs = load_runs(run_dirs(results, names))
    for name, reason in runs.skipped:
        print(f"model: skipped {name}: {reason}", file=sys.stderr)
    for run in runs.left_out:
        print(f"model: left out {run.run_id} ({run.state}): {run.reason}", file=sys.stderr)
    traced = load_runs(run_dirs(results, references)).runs if references else runs.runs
    table, simulator = with_simulation(run_table(runs), traced, results.resolve())
    fitted, validation = fit_chosen(table)
    fitted.simulator = simulator
    save(fitted, validation, out, {"results": str(results), "runs": names or "all"})
    return fitted, validation


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="hvbench model", description="fit a performance model to runs (docs/model.md)"
    )
    p.add_argument("action", choices=["fit"])
    p.add_argument("--results", required=True, help="the runs' folder, e.g. results/<campaign>")
    p.add_argument("--runs", default="", help="comma-separated run names or globs (default all)")
    p.add_argument("--out", help="where the model goes (default <results>/model)")
    p.add_argument(
        "--references",
        default="",
        help="traced runs without a reservation (names or globs) the simulated form replays, "
        "when they are not among --runs",
    )
    args = p.parse_args(argv)
    results = Path(args.results)
    out = Path(args.out) if args.out else results / "model"
    names = [n.strip() for n in args.runs.split(",") if n.strip()]
    references = [n.strip() for n in args.references.split(",") if n.strip()]
    try:
        fitted, validation = fit_folder(results, names, out, references)
    except (ModelError, OSError) as e:
        print(f"hvbench model: {e}", file=sys.stderr)
        return 1
    summary = validation_summary(validation)
    print(
        f"model: {len(fitted.table)} runs, {fitted.table['config'].nunique()} configurations; "
        f"inputs {', '.join(fitted.inputs.names)} → {out / MODEL_FILE}"
    )
    if summary.empty:
        print("model: no configuration could be held out (it needs three that share settings)")
    else:
        print("held out one configuration at a time:\n" + summary.round(2).to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
