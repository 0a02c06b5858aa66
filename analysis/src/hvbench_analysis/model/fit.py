"""Fitting a statistic: its analytical part (ANALYTIC, FORMS), then a Gaussian process over
what that part leaves, with the run-to-run spread by setting; the Model of every statistic."""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy.optimize import least_squares
from scipy.special import digamma
from sklearn.exceptions import ConvergenceWarning
from sklearn.gaussian_process import GaussianProcessRegressor
from sklearn.gaussian_process.kernels import ConstantKernel, Kernel, Matern, WhiteKernel

from hvbench_analysis.model.table import (
    MEASUREMENT,
    SETTINGS,
    SIM,
    SIM_COLUMNS,
    STATISTICS,
    Inputs,
    ModelError,
    Z,
    bound_of,
    cpu_share,
    numeric_inputs,
)

# ---------------------------------------------------------------------------------------------
# fitting and predicting


# The analytical part of a statistic (its logarithm), by name:
# - bound: a straight line in log(1 + bound), the longest the reservation can leave the job
#   without CPU (a tail from a budget that runs out);
# - knee: base + A · max(0, c / capacity − 1), capacity the CPU reserved per record (ms): below
#   the CPU a record needs (c), records queue and wait longer the more are sent; above it, the
#   base. A queue's knee, with c, the base and A fitted;
# - simulated: a line in the log of the statistic the reservation simulator gives for the
#   setting (model/simulated.py), where the runs hold a traced reference: the process then
#   learns what the simulator misses;
# - none: a constant.
ANALYTIC = ("bound", "knee", "simulated", "none")


@dataclass(frozen=True)
class Form:
    """How one statistic is modelled: its analytical part (ANALYTIC) and how smooth the learned
    part is (Matérn ν: 0.5 can follow a knee, 1.5 prefers a smooth curve)."""

    analytic: str = "bound"
    nu: float = 1.5


FORMS = tuple(Form(a, nu) for a in ANALYTIC if a != "simulated" for nu in (1.5, 0.5))
SIMULATED_FORMS = (Form("simulated", 1.5), Form("simulated", 0.5))


def forms_for(table: pd.DataFrame) -> tuple[Form, ...]:
    """The forms a table can take: the simulated ones where every run has its simulation."""
    simulated = all(c in table and np.isfinite(table[c].to_numpy(float)).all()
                    for c in SIM_COLUMNS)  # fmt: skip
    return FORMS + SIMULATED_FORMS if simulated else FORMS


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
    """The analytical part's log value for rows with bound_ms, capacity_ms and (for the
    statistic modelled) its simulated value."""
    if kind == "bound":
        return params[0] + params[1] * np.log1p(basis["bound_ms"].to_numpy(float))
    if kind == "simulated":
        return params[0] + params[1] * np.log(simulated_of(basis))
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
    if kind == "simulated" and "simulated" in basis and np.ptp(simulated_of(basis)) > 0:
        design = np.column_stack([np.ones(len(y)), np.log(simulated_of(basis))])
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
    if kind == "simulated" and "simulated" not in basis:
        kind = "none"  # nothing simulated to follow: fit_analytic's constant
    return analytic_part(kind, params, basis)


def simulated_of(basis: pd.DataFrame) -> np.ndarray:
    return np.maximum(basis["simulated"].to_numpy(float), 1e-6)


def for_statistic(basis: pd.DataFrame, name: str) -> pd.DataFrame:
    """The basis with the statistic's own simulated value as `simulated`, where there is one."""
    column = f"{SIM}{name}"
    return basis.assign(simulated=basis[column]) if column in basis else basis


def basis_of(frame: pd.DataFrame) -> pd.DataFrame:
    """What the analytical parts read: the bound, the capacity per record and, where the
    runs have them, the simulated statistics."""
    basis = pd.DataFrame(
        {
            "bound_ms": frame["bound_ms"].to_numpy(float),
            "capacity_ms": numeric_inputs(frame)["capacity_ms"].to_numpy(float),
        }
    )
    for column in SIM_COLUMNS:
        if column in frame:
            basis[column] = pd.to_numeric(frame[column], errors="coerce").to_numpy(float)
    return basis


@dataclass
class Model:
    inputs: Inputs
    fitted: dict[str, Fitted]
    table: pd.DataFrame  # the runs it was fitted to (run_table)
    forms: dict[str, Form]  # per statistic: how it is modelled
    # per statistic: the interval's half-width in standard deviations (Z, or wider where
    # held-out runs fell outside: interval_scales)
    scales: dict[str, float] = field(default_factory=dict)
    # the runs' traced references (model/simulated.Simulator), where a form is `simulated`
    simulator: object | None = None

    def predict(self, frame: pd.DataFrame) -> pd.DataFrame:
        """Per statistic: the median prediction and its 90 % interval (<stat>_lo, <stat>_hi),
        for rows with the settings' columns (SETTINGS)."""
        frame = with_derived(frame)
        if self.simulator is not None and SIM_COLUMNS[0] not in frame:
            frame = self.simulator.columns(frame)
        following = [n for n, f in self.forms.items() if f.analytic == "simulated"]
        if following and SIM_COLUMNS[0] not in frame:  # it would predict a constant instead
            raise ModelError(f"the model's {', '.join(following)} follow the simulator, "
                             "and it has none: its traced references were not read")  # fmt: skip
        x, basis = self.inputs.matrix(frame), basis_of(frame)
        out = pd.DataFrame(index=frame.index)
        for name, fitted in self.fitted.items():
            mean, sd = fitted.predict_log(x, for_statistic(basis, name))
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
            x,
            for_statistic(basis, name),
            table[name].to_numpy(float),
            (kernels or {}).get(name),
            form,
            restarts,
        )
        for name, form in forms.items()
    }
    return Model(inputs, fitted, table, forms)
