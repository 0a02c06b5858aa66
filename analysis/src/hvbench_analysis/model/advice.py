"""The budget advisor: the smallest reservation a model predicts to meet a latency SLO.

    slo = parse_slo("p99 <= 20 ms")
    advice = advise(model, {"sched": "deadline", "rate": 60}, slo)

The knob is what the runs varied for that scheduler: the budget, else the cap, else the weight.
Over a fine grid of it, within what the runs covered (never beyond), the advice is the smallest
value whose interval's upper end (a one-sided 95 % bound) is within the SLO, and from which on
the median prediction of every larger value is within it too: more of the CPU does not make
the latency worse, so a curve that wiggles cannot make a value look safe below a failing one,
while the interval, wide between the settings the runs had, is asked of the advice alone. Where
the SLO is crossed: the smallest value from which on the median (the lower end) stays within
it, and the advice, give the crossing and its interval.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

from hvbench_analysis.model.fit import Model, with_derived
from hvbench_analysis.model.table import SETTINGS, STATISTICS, ModelError, Z

KNOBS = ("budget", "cap", "weight")
UNITS = {"budget": "µs", "cap": "%", "weight": ""}
GRID_POINTS = 400
SLO_PATTERN = re.compile(r"^\s*([a-z0-9.]+)\s*(<=|≤|<)\s*([0-9]*\.?[0-9]+)\s*(ms)?\s*$")


@dataclass(frozen=True)
class Slo:
    statistic: str
    limit_ms: float

    def __str__(self) -> str:
        return f"{self.statistic} ≤ {self.limit_ms:g} ms"


def parse_slo(text: str) -> Slo:
    """ "p99<=20", "max <= 50 ms", "p99.9 ≤ 30"; ModelError otherwise."""
    found = SLO_PATTERN.match(text.lower())
    if not found or found.group(1) not in STATISTICS:
        raise ModelError(
            f"SLO {text!r}: write STATISTIC <= MS, a statistic of {', '.join(STATISTICS)}, "
            "e.g. 'p99 <= 20'"
        )
    limit = float(found.group(3))
    if limit <= 0:
        raise ModelError(f"SLO {text!r}: the limit must be above 0 ms")
    return Slo(found.group(1), limit)


@dataclass
class Advice:
    slo: str
    knob: str
    setting: dict  # the settings held (target, sched, rate, ...)
    searched: tuple[float, float]  # the knob's range the runs covered
    value: float | None  # the advice: None where no value in the range meets the SLO
    predicted: dict | None  # at the advice: median, lo, hi (ms)
    crossing: dict  # where the SLO is crossed: {"median": v, "lo": v, "hi": v} (None: never)

    def as_dict(self) -> dict:
        return asdict(self)


def knob_of(model: Model, sched: str) -> str:
    """What the runs of this scheduler varied: budget, cap or weight."""
    runs = model.table[model.table["sched"] == sched]
    if runs.empty:
        raise ModelError(
            f"the model has no runs with sched {sched!r} "
            f"(it has {sorted(model.table['sched'].unique())})"
        )
    for knob in KNOBS:
        if pd.to_numeric(runs[knob], errors="coerce").nunique() > 1:
            return knob
    raise ModelError(f"the runs with sched {sched!r} vary none of {', '.join(KNOBS)}")


def held_setting(model: Model, asked: dict, knob: str) -> dict:
    """The settings besides the knob: as asked, else the one value the runs had (no
    neighbours, unless asked); a setting the runs varied must be asked for."""
    runs = model.table[model.table["sched"] == asked["sched"]]
    setting = {"noise": ""}
    for name in SETTINGS:
        if name == knob or (name == "noise" and asked.get(name) is None):
            continue
        if asked.get(name) is not None:
            setting[name] = asked[name]
            continue
        values = runs[name].dropna().unique()
        if len(values) > 1:
            raise ModelError(f"the runs had several {name} values ({sorted(values)}): say which")
        setting[name] = plain(values[0]) if len(values) == 1 else None
    return setting


def plain(value):
    """A value read from the runs' table as JSON writes it (numpy's numbers as Python's)."""
    return value.item() if isinstance(value, np.generic) else value


def grid(model: Model, sched: str, knob: str) -> np.ndarray:
    """Candidate values, integers, between the smallest and largest the runs had."""
    values = pd.to_numeric(model.table.loc[model.table["sched"] == sched, knob], errors="coerce")
    lo, hi = float(values.min()), float(values.max())
    return np.unique(np.round(np.linspace(lo, hi, GRID_POINTS)))


def smallest_from_which(values: np.ndarray, ok: np.ndarray) -> float | None:
    """The smallest value from which on every larger one is ok."""
    if not ok[-1]:
        return None
    failing = np.flatnonzero(~ok)
    return float(values[failing[-1] + 1] if failing.size else values[0])


def predictions(
    model: Model, asked: dict, values: np.ndarray | None = None
) -> tuple[str, dict, np.ndarray, pd.DataFrame]:
    """(knob, the settings held, the knob's values, the predictions at each): by default over
    a fine grid of what the runs covered at these settings; ModelError where the model cannot
    answer."""
    knob = asked.get("knob") or knob_of(model, asked["sched"])
    setting = held_setting(model, asked, knob)
    if values is None:  # the runs' values at other rates may lie outside what these covered
        candidates = grid(model, asked["sched"], knob)
        # none inside: all of them, and the check below says why
        values = answerable(model, {**asked, "knob": knob}, candidates) or candidates
    values = np.asarray(values, float)
    rows = pd.DataFrame([{**setting, knob: v} for v in values])
    outside = model.inputs.outside(with_derived(rows))
    if outside:
        raise ModelError("the model cannot answer for these settings: " + "; ".join(outside))
    return knob, setting, values, model.predict(rows)


def answerable(model: Model, asked: dict, values) -> list[float]:
    """Those of `values` the model can answer for at the asked settings: within what the runs
    covered (an adaptive search's runs may not reach every candidate yet)."""
    knob = asked.get("knob") or knob_of(model, asked["sched"])
    setting = held_setting(model, asked, knob)
    rows = with_derived(pd.DataFrame([{**setting, knob: float(v)} for v in values]))
    return [v for i, v in enumerate(values) if not model.inputs.outside(rows.iloc[[i]])]


def advise(model: Model, asked: dict, slo: Slo, values=None) -> Advice:
    """The smallest knob value predicted to meet the SLO at the asked settings (asked: sched,
    rate and any other of SETTINGS; the knob can be named as asked["knob"]); among `values`
    if given, else over a fine grid of what the runs covered."""
    knob, setting, values, predicted = predictions(model, asked, values)
    name = slo.statistic
    crossing = {
        end: smallest_from_which(values, predicted[column].to_numpy() <= slo.limit_ms)
        for end, column in (("median", name), ("lo", f"{name}_lo"))
    }
    within = predicted[f"{name}_hi"].to_numpy() <= slo.limit_ms
    value = None
    if crossing["median"] is not None:
        safe = values[(values >= crossing["median"]) & within]
        value = float(safe[0]) if len(safe) else None
    crossing["hi"] = value
    at = None
    if value is not None:
        row = predicted[values == value].iloc[0]
        at = {
            "median": plain(row[name]),
            "lo": plain(row[f"{name}_lo"]),
            "hi": plain(row[f"{name}_hi"]),
        }
    return Advice(
        str(slo), knob, setting, (float(values[0]), float(values[-1])), value, at, crossing
    )


def least_certain(predicted: pd.DataFrame, slo: Slo) -> np.ndarray:
    """Per candidate, how many of its standard deviations (log scale) the upper end of its
    interval lies from the SLO: the advice is where that end crosses the SLO, so the smallest
    is where one more run tells the most (the adaptive search's next setting)."""
    name = slo.statistic
    sd = (np.log(predicted[f"{name}_hi"]) - np.log(predicted[name])) / Z
    gap = np.abs(np.log(predicted[f"{name}_hi"]) - np.log(slo.limit_ms))
    # an interval without an end (too few runs yet) is as uncertain as it gets: 0
    return np.nan_to_num((gap / np.maximum(sd, 1e-9)).to_numpy(), nan=0.0, posinf=0.0)


def advice_text(advice: Advice) -> str:
    """The advice in two or three sentences."""
    unit = UNITS[advice.knob]
    lo, hi = advice.searched
    held = ", ".join(f"{k} {v}" for k, v in advice.setting.items() if v not in (None, ""))
    if advice.value is None:
        return (
            f"No {advice.knob} within the runs' {lo:g}–{hi:g} {unit} is predicted to meet "
            f"{advice.slo} with 95 % confidence ({held})."
        )
    p, c = advice.predicted, advice.crossing
    crossing = (
        ""
        if c["lo"] is None or c["median"] is None
        else (
            f" The SLO is crossed near {c['median']:g} {unit} (90 % interval "
            f"{c['lo']:g}–{c['hi']:g} {unit})."
        )
    )
    return (
        f"Smallest {advice.knob} predicted to meet {advice.slo} with 95 % confidence: "
        f"{advice.value:g} {unit} ({held}); predicted {advice.slo.split()[0]} there "
        f"{p['median']:.2f} ms, 90 % interval {p['lo']:.2f}–{p['hi']:.2f} ms.{crossing}"
    )
