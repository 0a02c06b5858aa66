"""Validation: each configuration held out in turn, and the form of each statistic chosen by
how well it predicted the held-out ones."""

from __future__ import annotations

import numpy as np
import pandas as pd

from hvbench_analysis.model.fit import Form, Model, fit, forms_for
from hvbench_analysis.model.table import STATISTICS, ModelError, Z

# ---------------------------------------------------------------------------------------------
# validation: each configuration held out in turn

VALIDATION_COLUMNS = [
    "config",
    "statistic",
    "runs",
    "measured",
    "predicted",
    "lo",
    "hi",
    "error_pct",
    "runs_within",
    "z",
]


def validate(table: pd.DataFrame, forms: dict[str, Form] | None = None) -> pd.DataFrame:
    """Leave one configuration out: fit on the others, predict it, compare with the mean of
    its runs' statistic. runs_within: how many of its runs fell inside the 90 % interval. A
    configuration whose setting no other one shares (a level seen only there) cannot be
    predicted and is left out."""
    rows = []
    for config, held in table.groupby("config", sort=True):
        rest = table[table["config"] != config]
        if rest["config"].nunique() < 2:
            continue
        try:
            model = fit(rest, forms=forms, restarts=0)  # held-out fits: one start of the optimizer
        except ModelError:
            continue
        if model.inputs.outside(held):
            continue
        predicted = model.predict(held.iloc[[0]]).iloc[0]
        for name in model.fitted:
            measured = held[name].to_numpy(float)
            lo, hi = predicted[f"{name}_lo"], predicted[f"{name}_hi"]
            sd = max(np.log(hi / predicted[name]) / Z, 1e-9)
            rows.append(
                {
                    "config": config,
                    "statistic": name,
                    "runs": len(held),
                    "measured": measured.mean(),
                    "predicted": predicted[name],
                    "lo": lo,
                    "hi": hi,
                    "error_pct": 100 * abs(predicted[name] - measured.mean()) / measured.mean(),
                    "runs_within": int(((measured >= lo) & (measured <= hi)).sum()),
                    # how many of its SDs the farthest of its runs lay from the prediction
                    "z": float(np.abs(np.log(measured / predicted[name])).max() / sd),
                }
            )
    return pd.DataFrame(rows, columns=VALIDATION_COLUMNS)


def choose_forms(
    table: pd.DataFrame, statistics: tuple[str, ...] = STATISTICS
) -> tuple[dict[str, Form], pd.DataFrame]:
    """Per statistic, the form (forms_for: FORMS, and the simulated ones where every run has
    its simulation) that predicted the held-out configurations best (the lowest median error;
    the first where equal), and the validation of that choice.
    The bound explains a tail where the budget runs out; where it does not (a queue that grows
    once the CPU reserved per record is below what a record needs), a line through it
    misleads, and a knee is followed better by the rougher kernel."""
    candidates = forms_for(table)
    tried = [validate(table, dict.fromkeys(statistics, form)) for form in candidates]
    forms, chosen = {}, []
    for name in statistics:
        parts = [v[v["statistic"] == name] for v in tried]
        errors = [p["error_pct"].median() if not p.empty else np.inf for p in parts]
        best = int(np.argmin(errors))
        forms[name] = candidates[best]
        chosen.append(parts[best])
    return forms, pd.concat(chosen, ignore_index=True)


def interval_scales(validation: pd.DataFrame) -> dict[str, float]:
    """Per statistic, the half-width of the interval in SDs that held 90 % of the held-out
    configurations' runs (every run of the configuration), never below Z: the process's noise
    is the same everywhere, and runs near a knee spread more than that. Fewer than
    MIN_HELD_OUT held-out configurations say too little: Z then."""
    scales = {}
    for name in validation["statistic"].unique():
        z = validation.loc[validation["statistic"] == name, "z"].dropna().to_numpy()
        enough = len(z) >= MIN_HELD_OUT
        scales[name] = max(Z, float(np.quantile(z, 0.9, method="higher"))) if enough else Z
    return scales


MIN_HELD_OUT = 5


def fit_chosen(
    table: pd.DataFrame, statistics: tuple[str, ...] = STATISTICS
) -> tuple[Model, pd.DataFrame]:
    """The model as make model fits it: each statistic's form chosen on held-out
    configurations, its interval widened as they require; and that validation."""
    forms, validation = choose_forms(table, statistics)
    fitted = fit(table, forms=forms)
    fitted.scales = interval_scales(validation)
    return fitted, validation


def validation_summary(validation: pd.DataFrame) -> pd.DataFrame:
    """Per statistic: configurations held out, mean absolute % error (and the median), the
    share of held-out runs inside their 90 % interval."""
    rows = []
    for name in STATISTICS:
        part = validation[validation["statistic"] == name]
        if part.empty:
            continue
        rows.append(
            {
                "Statistic": name,
                "Configurations held out": len(part),
                "Runs held out": int(part["runs"].sum()),
                "Mean abs. error (%)": part["error_pct"].mean(),
                "Median abs. error (%)": part["error_pct"].median(),
                "Runs inside the 90 % interval (%)": 100
                * part["runs_within"].sum()
                / part["runs"].sum(),
                "Interval used (SDs)": interval_scales(part)[name],
            }
        )
    return pd.DataFrame(rows)
