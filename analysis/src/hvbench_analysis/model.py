"""A performance model of a set of runs: each run's latency statistics (mean, SD, p50, p99,
p99.9, max) predicted from the settings that vary between the runs, with an interval, and
checked by holding out whole configurations.

Each statistic is modelled on its logarithm (latencies are positive and spread in proportion
to their size), in two parts:
- an analytical part (ANALYTIC): a line in log(1 + bound), bound the longest time the
  reservation can leave the job without CPU as read back (bounds.py: 2·(P − B)); or a queue's
  knee in the CPU reserved per record; or a constant;
- a learned part, a Gaussian process (Matérn) over every input that varies (rate, share of a
  CPU, CPU per record, period, extratime, weight, target, scheduler, neighbours), fitted to
  what the analytical part leaves, with the run-to-run spread modelled by setting (a second
  process: runs near a knee spread far more than runs away from it), so its interval is where
  a new run's statistic is expected: Gaussian processes state this from tens of runs, where
  quantile boosting would need hundreds. A knee's own uncertainty (where it lies) comes from
  refitting it on resampled runs (bootstrap_analytic).
Each statistic takes the form (FORMS) that predicted held-out configurations best
(choose_forms). docs/model.md says why.

    table = run_table(load_runs(dirs))       # one row per run: inputs and statistics
    model = fit(table)
    model.predict(rows)                      # median and 90 % interval per statistic
    forms, validation = choose_forms(table)  # each configuration held out in turn
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import least_squares
from scipy.special import digamma
from sklearn.exceptions import ConvergenceWarning
from sklearn.gaussian_process import GaussianProcessRegressor
from sklearn.gaussian_process.kernels import ConstantKernel, Kernel, Matern, WhiteKernel

from hvbench_analysis import bounds, results, stats
from hvbench_analysis.load import Runs, load_runs, run_dirs

STATISTICS = ("mean", "sd", "p50", "p99", "p99.9", "max")
PERCENTILE_OF = {"p50": 50.0, "p99": 99.0, "p99.9": 99.9}
Z = 1.6449  # a two-sided 90 % interval; its upper end is a one-sided 95 % bound
# The settings as the runs asked for them, and what a run is measured with.
SETTINGS = ("target", "sched", "noise", "rate", "budget", "period", "extratime", "cap", "weight")
MEASUREMENT = ("records", "warmup_s")
CATEGORICAL = ("target", "sched", "noise")
# Numeric inputs: the rate, the share of a CPU reserved, the bound and the scheduler
# parameters that are not already in the share. Where a parameter is unset, the scheduler's
# default stands in (period 100 ms, weight 256, extratime 0).
NUMERIC = ("rate", "share", "capacity_ms", "period", "extratime", "weight")
DEFAULTS = {"period": bounds.DEFAULT_PERIOD_US, "weight": 256, "extratime": 0}
TRANSFORM = {"rate": np.log, "capacity_ms": np.log, "weight": np.log}


class ModelError(ValueError):
    """Runs a model cannot be fitted to, or a question it cannot answer, with the reason."""


# ---------------------------------------------------------------------------------------------
# the runs as the model's inputs


def run_statistics(latency_ms: np.ndarray) -> dict[str, float]:
    """A run's statistics (ms) over its measured records."""
    ms = np.asarray(latency_ms, dtype=float)
    found = dict(
        zip(PERCENTILE_OF, stats.percentile(ms, list(PERCENTILE_OF.values())), strict=True)
    )
    return {
        "mean": float(ms.mean()),
        "sd": float(ms.std(ddof=1)),
        **{name: float(value) for name, value in found.items()},
        "max": float(ms.max()),
    }


def cpu_share(setting: dict) -> float:
    """The share of a CPU a setting reserves: B / P, or a cap in % / 100; 1 without one."""
    budget, period, cap = setting.get("budget"), setting.get("period"), setting.get("cap")
    if bounds.known(budget) and budget > 0:
        return budget / (period if bounds.known(period) else bounds.DEFAULT_PERIOD_US)
    if bounds.known(cap) and cap > 0:
        return cap / 100
    return 1.0


def bound_of(setting: dict, sched_readback=None) -> float:
    """The reservation's bound in ms (0 without one): read back where the run kept it."""
    found = bounds.run_reservation(setting, sched_readback)
    return found.bound_ms or 0.0


def run_table(runs: Runs) -> pd.DataFrame:
    """One row per completed run: run_id, settings, measurement, share, bound_ms, config and
    the statistics. Runs with fewer than 100 measured records are refused (a p99.9 needs
    them)."""
    if runs.runs.empty:
        raise ModelError("no completed runs to fit a model to")
    latency = runs.measured.dropna(subset=["latency_ns"]).groupby("run_id", observed=True)
    rows = []
    for tags in runs.runs.to_dict("records"):
        run_id = tags["run_id"]
        ms = (
            latency.get_group(run_id)["latency_ns"].to_numpy() / 1e6
            if run_id in latency.groups
            else np.array([])
        )
        lost = lost_latency_ms(Path(tags["path"])) if tags.get("missing") else np.array([])
        if len(ms) < 100:
            raise ModelError(f"run {run_id} has {len(ms)} measured records; the model needs 100")
        ms = np.concatenate([ms, lost])
        row = {"run_id": run_id, **{k: tags[k] for k in (*SETTINGS, *MEASUREMENT)}}
        row["censored"] = len(lost)
        row["share"] = cpu_share(row)
        row["bound_ms"] = bound_of(tags, tags.get("sched_readback"))
        rows.append({**row, **run_statistics(ms)})
    table = pd.DataFrame(rows)
    table["config"] = config_keys(table)
    return table


def lost_latency_ms(directory: Path) -> np.ndarray:
    """The measured records a run sent and never received (an overloaded run whose drain
    ended first), each at a lower bound of its latency: the run waited for them until DRAIN
    seconds after the last send (and past the last record it received). Left out, they would
    make an overloaded run look fast."""
    samples = results.read_samples(directory)
    drain_s = results.read_meta(directory)["requested"].get("drain_s") or 0.0
    end = max(samples["sent_ns"].max() + drain_s * 1e9, samples["received_ns"].max())
    lost = samples[(samples["copies"] == 0) & ~samples["warmup"] & samples["sent_ns"].notna()]
    return (end - lost["sent_ns"]).to_numpy(float) / 1e6


def config_keys(table: pd.DataFrame) -> pd.Series:
    """A configuration: the settings, as text (repetitions share it)."""

    def text(row) -> str:
        return ", ".join(f"{k}={row[k]}" for k in SETTINGS if bounds.known(row[k]) and row[k] != "")

    return table.apply(text, axis=1)


def numeric_inputs(frame: pd.DataFrame) -> pd.DataFrame:
    """The numeric inputs with the defaults in the gaps."""
    out = pd.DataFrame(index=frame.index)
    for name in NUMERIC:
        if name == "capacity_ms":  # the CPU reserved per record: below its cost, a queue grows
            out[name] = out["share"] * 1000 / out["rate"]
            continue
        column = pd.to_numeric(frame[name], errors="coerce").astype(float)
        out[name] = column.fillna(DEFAULTS.get(name, np.nan))
    return out


def categorical_inputs(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[list(CATEGORICAL)].fillna("").astype(str)


# ---------------------------------------------------------------------------------------------
# the inputs the model uses


@dataclass
class Inputs:
    """The inputs that vary in the training runs (the model's dimensions), the ranges and
    levels it saw, and those that did not vary: the model speaks only of those values."""

    numeric: list[str]
    levels: dict[str, list[str]]
    ranges: dict[str, tuple[float, float]]
    fixed: dict[str, object]
    center: np.ndarray = field(repr=False)
    scale: np.ndarray = field(repr=False)

    @classmethod
    def of(cls, table: pd.DataFrame) -> Inputs:
        numbers, words = numeric_inputs(table), categorical_inputs(table)
        numeric = [n for n in NUMERIC if numbers[n].nunique() > 1]
        levels = {c: sorted(words[c].unique()) for c in CATEGORICAL if words[c].nunique() > 1}
        fixed = {n: float(numbers[n].iloc[0]) for n in NUMERIC if n not in numeric}
        fixed |= {c: words[c].iloc[0] for c in CATEGORICAL if c not in levels}
        if not numeric and not levels:
            raise ModelError("the runs differ in no setting: there is nothing to model")
        ranges = {n: (float(numbers[n].min()), float(numbers[n].max())) for n in numeric}
        raw = cls(numeric, levels, ranges, fixed, np.zeros(0), np.ones(0)).raw_matrix(table)
        center, scale = raw.mean(axis=0), raw.std(axis=0)
        return cls(numeric, levels, ranges, fixed, center, np.where(scale > 0, scale, 1.0))

    @property
    def names(self) -> list[str]:
        return [*self.numeric, *(f"{c}={v}" for c, vs in self.levels.items() for v in vs)]

    def raw_matrix(self, frame: pd.DataFrame) -> np.ndarray:
        numbers, words = numeric_inputs(frame), categorical_inputs(frame)
        columns = [TRANSFORM.get(n, lambda x: x)(numbers[n].to_numpy()) for n in self.numeric]
        for c, values in self.levels.items():
            columns += [(words[c] == v).to_numpy(dtype=float) for v in values]
        return np.column_stack(columns)

    def matrix(self, frame: pd.DataFrame) -> np.ndarray:
        return (self.raw_matrix(frame) - self.center) / self.scale

    def outside(self, frame: pd.DataFrame) -> list[str]:
        """Why rows lie outside what the model saw (empty: inside)."""
        numbers, words = numeric_inputs(frame), categorical_inputs(frame)
        problems = []
        for name, (lo, hi) in self.ranges.items():
            bad = numbers[name][(numbers[name] < lo - 1e-9) | (numbers[name] > hi + 1e-9)]
            if not bad.empty:
                problems.append(f"{name} {bad.iloc[0]:g} is outside the runs' {lo:g}–{hi:g}")
        for name, value in self.fixed.items():
            seen = numbers[name] if name in NUMERIC else words[name]
            if (seen != value).any():
                problems.append(f"{name} was {value!r} in every run, not {seen.iloc[0]!r}")
        for name, values in self.levels.items():
            unseen = sorted(set(words[name]) - set(values))
            if unseen:
                problems.append(f"{name} {unseen[0]!r} is not among the runs' {values}")
        return problems


# ---------------------------------------------------------------------------------------------
# fitting and predicting


# The analytical part of a statistic (its logarithm), by name:
# - bound: a straight line in log(1 + bound), the longest the reservation can leave the job
#   without CPU (a tail from a budget that runs out);
# - knee: base + A · max(0, c / capacity − 1), capacity the CPU reserved per record (ms): below
#   the CPU a record needs (c), records queue and wait longer the more are sent; above it, the
#   base. A queue's knee, with c, the base and A fitted;
# - none: a constant.
ANALYTIC = ("bound", "knee", "none")


@dataclass(frozen=True)
class Form:
    """How one statistic is modelled: its analytical part (ANALYTIC) and how smooth the learned
    part is (Matérn ν: 0.5 can follow a knee, 1.5 prefers a smooth curve)."""

    analytic: str = "bound"
    nu: float = 1.5


FORMS = tuple(Form(a, nu) for a in ANALYTIC for nu in (1.5, 0.5))


def curve_kernel(dimensions: int, nu: float = 1.5) -> Kernel:
    """A scale times a Matérn kernel with one length per input."""
    return ConstantKernel(1.0, (1e-3, 1e3)) * Matern(np.ones(dimensions), (0.3, 1e3), nu=nu)


def first_kernel(dimensions: int, nu: float = 1.5) -> Kernel:
    """The curve and white noise: the same spread from run to run everywhere (the first
    step; the spread is then modelled apart, as it differs by setting)."""
    return curve_kernel(dimensions, nu) + WhiteKernel(0.1, (1e-2, 10.0))


def noise_kernel(dimensions: int) -> Kernel:
    """The log of the spread from run to run over the inputs: smooth, plus white noise (a
    spread estimated from two runs is itself rough)."""
    return curve_kernel(dimensions, 1.5) + WhiteKernel(1.0, (1e-2, 10.0))


@dataclass
class Kernels:
    """One statistic's three fitted kernels; a saved model keeps their parameters."""

    first: Kernel  # the curve with the same noise everywhere (first_kernel)
    noise: Kernel  # the log of the run-to-run variance (noise_kernel)
    curve: Kernel  # the curve, each run's noise taken from the noise process (curve_kernel)

    @classmethod
    def initial(cls, dimensions: int, nu: float) -> Kernels:
        return cls(
            first_kernel(dimensions, nu), noise_kernel(dimensions), curve_kernel(dimensions, nu)
        )


def analytic_part(kind: str, params: np.ndarray, basis: pd.DataFrame) -> np.ndarray:
    """The analytical part's log value for rows with bound_ms and capacity_ms."""
    if kind == "bound":
        return params[0] + params[1] * np.log1p(basis["bound_ms"].to_numpy(float))
    if kind == "knee":
        return knee(params, basis["capacity_ms"].to_numpy(float))
    return np.full(len(basis), params[0])


def knee(params: np.ndarray, capacity_ms: np.ndarray) -> np.ndarray:
    """log(base + A · max(0, c / capacity − 1)), the parameters as logarithms."""
    base, height, cost = np.exp(np.clip(params, -50, 50))  # the optimizer may try far
    return np.log(base + height * np.maximum(0.0, cost / capacity_ms - 1))


KNEES = (0.2, 0.5, 0.8)  # where the knee's c starts, as quantiles of the capacities seen


def fit_analytic(
    kind: str, basis: pd.DataFrame, y: np.ndarray, start: np.ndarray | None = None
) -> np.ndarray:
    """The analytical part's parameters (least squares on the log; the knee from several
    starts of its c across the capacities seen, keeping the best, or from `start`)."""
    if kind == "bound" and np.ptp(basis["bound_ms"]) > 0:
        design = np.column_stack([np.ones(len(y)), np.log1p(basis["bound_ms"].to_numpy(float))])
        return np.linalg.lstsq(design, y, rcond=None)[0]
    capacity = basis["capacity_ms"].to_numpy(float)
    if kind == "knee" and np.ptp(capacity) > 0:
        starts = [[np.median(y), np.log(1e3), np.log(c)] for c in np.quantile(capacity, KNEES)]
        fits = [
            least_squares(lambda p: knee(p, capacity) - y, x0=x0, loss="soft_l1")
            for x0 in (starts if start is None else [start])
        ]
        return min(fits, key=lambda f: f.cost).x
    return np.array([y.mean(), 0.0])  # a constant ("none", or nothing varies)


BOOTSTRAP = 16  # resamples of the runs that say how far the analytical part could lie


def bootstrap_analytic(
    form: Form, params: np.ndarray, basis: pd.DataFrame, y: np.ndarray
) -> np.ndarray:
    """The knee refitted on the runs resampled with replacement, BOOTSTRAP times (seeded: a
    saved model rebuilds the same). Their spread is an uncertainty the process cannot see: a
    knee fitted between two capacities could lie anywhere between them, and just above it the
    statistic could be the base or far above. (A line's error is smooth, and the process
    follows it and says how sure it is; a constant is the process's own.)"""
    if form.analytic != "knee" or len(params) < 3:
        return np.empty((0, 0))
    rng = np.random.default_rng(0)
    draws = []
    for _ in range(BOOTSTRAP):
        rows = rng.integers(0, len(y), len(y))
        draws.append(fit_analytic(form.analytic, basis.iloc[rows], y[rows], start=params))
    # a resample with nothing varying gives a constant instead: left out
    return np.array([d for d in draws if len(d) == len(params)])


@dataclass
class Fitted:
    """One statistic's model: the analytical part and its bootstrap draws, the process of the
    curve on what the analytical part leaves, and the process of the run-to-run spread."""

    form: Form
    params: np.ndarray  # the analytical part's
    curve: GaussianProcessRegressor
    noise: GaussianProcessRegressor  # the log of a run's variance around the curve
    draws: np.ndarray  # the analytical part's parameters on resampled runs (bootstrap_analytic)
    kernels: Kernels  # as fitted

    def predict_log(self, x: np.ndarray, basis: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
        """The log prediction and where a new run's statistic falls (its SD): the curve's
        uncertainty, the spread from run to run at that setting, and the analytical part's
        (its bootstrap), added as variances."""
        mean, sd = self.curve.predict(x, return_std=True)
        variance = sd**2 + np.exp(self.noise.predict(x))
        if len(self.draws):
            variance += np.var([analytic_of(self.form, d, basis) for d in self.draws], axis=0)
        return analytic_of(self.form, self.params, basis) + mean, np.sqrt(variance)


NOISE_FLOOR = 1e-4  # a log variance's floor: runs are never taken to agree closer than 1 %


def process(kernel: Kernel, fixed: bool, restarts: int, alpha=1e-10) -> GaussianProcessRegressor:
    """A process on normalised targets; `fixed` keeps the kernel's parameters (a saved model's)."""
    return GaussianProcessRegressor(
        kernel,
        alpha=alpha,
        normalize_y=True,
        n_restarts_optimizer=restarts,
        optimizer=None if fixed else "fmin_l_bfgs_b",
        random_state=0,
    )


def fit_process(gp: GaussianProcessRegressor, x: np.ndarray, y: np.ndarray):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)  # a length at its bound: flat there
        return gp.fit(x, y)


def spread_by_setting(x: np.ndarray, residual: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per setting (runs with the same inputs): the log of its runs' variance around the first
    curve (the mean square × n/(n − 1), the curve passing near their mean), less the log's
    bias: with k = n − 1 degrees of freedom, a variance's log falls short by
    ψ(k/2) − log(k/2) on average (1.27 for two runs, a factor of 3.6 in the variance)."""
    settings, index = np.unique(x, axis=0, return_inverse=True)
    index = index.ravel()
    runs = np.bincount(index).astype(float)
    freedom = np.maximum(runs - 1, 1)
    variance = np.bincount(index, residual**2) / runs * np.where(runs > 1, runs / freedom, 1.0)
    bias = digamma(freedom / 2) - np.log(freedom / 2)
    return settings, np.log(variance + NOISE_FLOOR) - bias


def fit_statistic(
    x: np.ndarray,
    basis: pd.DataFrame,
    y: np.ndarray,
    kernels: Kernels | None = None,
    form: Form = Form(),
    restarts: int = 2,
) -> Fitted:
    """Fit the analytical part, then the rest in three steps (a heteroscedastic process: runs
    near a knee spread far more than runs away from it):
    1. a process with the same noise everywhere;
    2. a process of the log of each setting's spread of runs around that first curve;
    3. the curve again, each run's noise now the spread the second process gives there.
    With kernels given, their parameters are kept (how a saved model is rebuilt)."""
    y = np.log(np.maximum(y, 1e-6))
    params = fit_analytic(form.analytic, basis, y)
    rest = y - analytic_of(form, params, basis)
    fixed = kernels is not None
    kernels = kernels or Kernels.initial(x.shape[1], form.nu)
    first = fit_process(process(kernels.first, fixed, restarts), x, rest)
    settings, log_spread = spread_by_setting(x, rest - first.predict(x))
    noise = fit_process(process(kernels.noise, fixed, restarts), settings, log_spread)
    # normalize_y divides the targets by their SD: the runs' noise is given in those units
    scale = float(np.var(rest)) or 1.0
    alpha = np.exp(noise.predict(x)) / scale
    curve = fit_process(process(kernels.curve, fixed, restarts, alpha), x, rest)
    return Fitted(
        form,
        params,
        curve,
        noise,
        bootstrap_analytic(form, params, basis, y),
        Kernels(first.kernel_, noise.kernel_, curve.kernel_),
    )


def analytic_of(form: Form, params: np.ndarray, basis: pd.DataFrame) -> np.ndarray:
    """The analytical part as fitted: a knee or line that could not be fitted (nothing varied)
    is the constant fit_analytic gave instead."""
    kind = form.analytic if not (form.analytic == "knee" and len(params) == 2) else "none"
    return analytic_part(kind, params, basis)


def basis_of(frame: pd.DataFrame) -> pd.DataFrame:
    """What the analytical parts read: the bound and the capacity per record."""
    return pd.DataFrame(
        {
            "bound_ms": frame["bound_ms"].to_numpy(float),
            "capacity_ms": numeric_inputs(frame)["capacity_ms"].to_numpy(float),
        }
    )


@dataclass
class Model:
    inputs: Inputs
    fitted: dict[str, Fitted]
    table: pd.DataFrame  # the runs it was fitted to (run_table)
    forms: dict[str, Form]  # per statistic: how it is modelled
    # per statistic: the interval's half-width in standard deviations (Z, or wider where
    # held-out runs fell outside: interval_scales)
    scales: dict[str, float] = field(default_factory=dict)

    def predict(self, frame: pd.DataFrame) -> pd.DataFrame:
        """Per statistic: the median prediction and its 90 % interval (<stat>_lo, <stat>_hi),
        for rows with the settings' columns (SETTINGS)."""
        frame = with_derived(frame)
        x, basis = self.inputs.matrix(frame), basis_of(frame)
        out = pd.DataFrame(index=frame.index)
        for name, fitted in self.fitted.items():
            mean, sd = fitted.predict_log(x, basis)
            half = self.scales.get(name, Z) * sd
            out[name], out[f"{name}_lo"], out[f"{name}_hi"] = (
                np.exp(mean),
                np.exp(mean - half),
                np.exp(mean + half),
            )
        return out


def with_derived(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows of settings with share and bound_ms (as requested) where they are missing."""
    frame = frame.copy()
    for column in SETTINGS:
        if column not in frame:
            frame[column] = None
    if "share" not in frame:
        frame["share"] = [cpu_share(r) for r in frame.to_dict("records")]
    if "bound_ms" not in frame:
        frame["bound_ms"] = [bound_of(r) for r in frame.to_dict("records")]
    return frame


def fit(
    table: pd.DataFrame,
    kernels: dict[str, Kernels] | None = None,
    forms: dict[str, Form] | None = None,
    restarts: int = 2,
) -> Model:
    """A model of every statistic from the runs' table; `kernels` (a saved model's) are kept;
    `forms` says per statistic how it is modelled (default: Form() for every statistic; given,
    only its statistics are fitted). Runs
    measured differently (records, warm-up) are refused: a maximum over more records is
    another statistic."""
    measured = table[list(MEASUREMENT)].astype(str).drop_duplicates()
    if len(measured) > 1:
        kinds = "; ".join(
            ", ".join(f"{k} {v}" for k, v in row.items()) for row in measured.to_dict("records")
        )
        raise ModelError(f"the runs were measured differently ({kinds}): fit them apart (RUNS=)")
    inputs = Inputs.of(table)
    x, basis = inputs.matrix(table), basis_of(table)
    forms = forms or dict.fromkeys(STATISTICS, Form())
    fitted = {
        name: fit_statistic(
            x, basis, table[name].to_numpy(float), (kernels or {}).get(name), form, restarts
        )
        for name, form in forms.items()
    }
    return Model(inputs, fitted, table, forms)


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
    """Per statistic, the form (FORMS) that predicted the held-out configurations best (the
    lowest median error; the first of FORMS where equal), and the validation of that choice.
    The bound explains a tail where the budget runs out; where it does not (a queue that grows
    once the CPU reserved per record is below what a record needs), a line through it
    misleads, and a knee is followed better by the rougher kernel."""
    tried = [validate(table, dict.fromkeys(statistics, form)) for form in FORMS]
    forms, chosen = {}, []
    for name in statistics:
        parts = [v[v["statistic"] == name] for v in tried]
        errors = [p["error_pct"].median() if not p.empty else np.inf for p in parts]
        best = int(np.argmin(errors))
        forms[name] = FORMS[best]
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
    return rebuilt, doc


def saved_kernels(dimensions: int, fitted: dict) -> Kernels:
    initial = Kernels.initial(dimensions, fitted["matern_nu"])
    return Kernels(
        initial.first.clone_with_theta(np.array(fitted["first_theta"])),
        initial.noise.clone_with_theta(np.array(fitted["noise_theta"])),
        initial.curve.clone_with_theta(np.array(fitted["theta"])),
    )


# ---------------------------------------------------------------------------------------------
# `hvbench model fit`


def fit_folder(results: Path, names: list[str], out: Path) -> tuple[Model, pd.DataFrame]:
    """Fit, validate and save the model of the completed runs in a results folder."""
    runs = load_runs(run_dirs(results, names))
    for name, reason in runs.skipped:
        print(f"model: skipped {name}: {reason}", file=sys.stderr)
    for run in runs.left_out:
        print(f"model: left out {run.run_id} ({run.state}): {run.reason}", file=sys.stderr)
    table = run_table(runs)
    fitted, validation = fit_chosen(table)
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
    args = p.parse_args(argv)
    results = Path(args.results)
    out = Path(args.out) if args.out else results / "model"
    names = [n.strip() for n in args.runs.split(",") if n.strip()]
    try:
        fitted, validation = fit_folder(results, names, out)
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
