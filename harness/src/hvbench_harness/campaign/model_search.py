"""The adaptive campaign (`search: {method: model, ...}`): instead of every point at every value
of the knob, runs one setting at a time where the performance model is least certain of the
answer.

1. Each point first runs at the smallest, the largest and the middle value. With `reference:
   true`, a traced run without a reservation runs first at each rate, and each point starts
   instead at the value the reservation simulator advises from it (the smallest whose
   simulated statistic meets the SLO) and at the value below it; the model then also learns
   the residual between the runs and the simulator (hvbench_analysis.model, form simulated).
2. Then, after each run, the model (hvbench_analysis.model) is fitted to every run done so far
   and asked, for each point, for the advice (the smallest value whose 90 % interval stays
   within the SLO, hvbench_analysis.advice). The next run goes to the (point, value) whose
   interval's upper end lies the fewest of its standard deviations from the SLO: where the
   advice is decided; but first what an advice lacks in runs: a run at it, and below it a run
   that missed the SLO or else every repetition. A value runs at most `repetitions` times.
3. The search stops when runs bracket the advice of every point and it stayed the same over
   `stable` more runs, or is the simulator's own (two sources agree: the simulator, from the
   references alone, and the model of the runs), and `confirm` runs at each advice met the SLO
   (with `confirm: 2`, a confirming run follows the one that bracketed it; an advice whose
   runs cannot confirm it, one having missed, is recorded as not confirmed); or after
   `max_runs` (default: the full grid's number). It saves the model beside the runs.

Every step (runs so far, the advice, the next setting) is kept in campaign.json; a resumed
search replays the runs done before (the same fits choose the same settings) and goes on.
"""

from __future__ import annotations

from pathlib import Path

from hvbench_analysis import model
from hvbench_analysis.campaign import confirmation_text
from hvbench_analysis.load import load_runs, run_dirs
from hvbench_analysis.model import advice as advisor

# Point settings the advice is asked at, besides the scheduler, the rate and the target.
HELD = ("period", "extratime", "weight", "cap", "noise")


def first_values(values: list[float]) -> list[float]:
    """The smallest, the largest and the middle value."""
    return list(dict.fromkeys([values[0], values[-1], values[len(values) // 2]]))


def asked_of(point, target: str, knob: str) -> dict:
    asked = {"sched": point.settings.get("sched", "none"), "rate": point.rate_per_s()}
    asked |= {k: point.settings[k] for k in HELD if point.settings.get(k) is not None}
    return {**asked, "target": target, "knob": knob}


class Search:
    def __init__(self, runner, log) -> None:
        self.runner, self.log = runner, log
        self.campaign = runner.campaign
        self.search = runner.campaign.search
        self.slo = advisor.parse_slo(self.search.slo)
        self.record = runner.index.doc["search"]
        self.tried: dict[tuple[str, float], int] = {}
        self.done: list[str] = []  # the runs done, in the search's order (a resume replays it)
        self.setting_of: dict[str, tuple[str, float]] = {}  # run id → (point id, value)
        self.measured: dict[tuple[str, float], list[float]] = {}  # the SLO's statistic per run
        self.references: list[str] = []  # the traced runs without a reservation (reference)
        self.simulator: model.Simulator | None = None  # built once from them
        self.simulated: dict[str, float] = {}  # point id → the simulator's advice

    def run(self) -> None:
        self.record["steps"] = []  # replayed from the runs done before
        for point in self.campaign.points:
            self.record["points"][point.id] = {"settings": point.settings, "runs": []}
        limit = self.search.max_runs or self.campaign.grid_runs()
        starts = self.simulated_starts() if self.search.reference else {}
        plan = {p.id: starts.get(p.id) or first_values(self.search.values)
                for p in self.campaign.points}  # fmt: skip
        for i in range(max(len(values) for values in plan.values())):
            for point in self.campaign.points:
                if i < len(plan[point.id]) and sum(self.tried.values()) < limit:
                    self.run_at(point, plan[point.id][i])
        while sum(self.tried.values()) < limit:
            fitted = self.fit()
            step = {"runs": sum(self.tried.values()), "advice": self.advice(fitted)}
            self.record["steps"].append(step)
            if self.settled():
                break
            choice = self.next_setting(fitted)
            if choice is None:
                break
            step["next"] = {"point": choice[0].id, self.search.knob: choice[1]}
            self.runner.index.save()
            self.run_at(*choice)
        self.finish()

    def run_at(self, point, value: float) -> None:
        n = self.tried.get((point.id, value), 0) + 1
        self.tried[(point.id, value)] = n
        label = f"[{point.id} at {self.search.knob} {value:g}, run {sum(self.tried.values())}]"
        entry = self.runner.run_one(point.at(self.search.knob, value), n, label)
        self.record["points"][point.id]["runs"].append(entry["run_id"])
        if entry["status"] == "done":
            self.done.append(entry["run_id"])
            self.setting_of[entry["run_id"]] = (point.id, value)

    def simulated_starts(self) -> dict[str, list[float]]:
        """The reference of each rate run, then each point's first values: the simulator's
        advice and the value below it (none where no value meets the SLO in the simulation,
        or the reference failed)."""
        for point in self.campaign.points:
            reference = point.reference(self.campaign.target)
            if (reference.id, 0) in self.tried:
                continue
            self.tried[(reference.id, 0)] = 1
            entry = self.runner.run_one(reference, 1, f"[{reference.id}, the reference]")
            if entry["status"] == "done":
                self.references.append(entry["run_id"])
        self.record["references"] = self.references
        if not self.references:
            return {}
        runs = load_runs(run_dirs(self.runner.folder, self.references)).runs
        self.simulator = simulator = model.Simulator.of(runs)
        starts = {}
        for point in self.campaign.points:
            advised = self.simulated_advice(simulator, point) if simulator else None
            if advised is not None:
                self.simulated[point.id] = advised
                starts[point.id] = [v for v in (advised, self.below(advised)) if v is not None]
        self.record["simulated_start"] = starts
        return starts

    def simulated_advice(self, simulator, point) -> float | None:
        """The smallest value whose simulated SLO statistic meets the SLO."""
        asked = asked_of(point, self.campaign.target, self.search.knob)
        for value in self.search.values:
            found = simulator.statistics({**asked, self.search.knob: value})
            if found[f"{model.SIM}{self.slo.statistic}"] <= self.slo.limit_ms:
                return value
        return None

    def fit(self) -> model.Model | None:
        """The model of every run done; None where it cannot be fitted yet."""
        try:
            runs = load_runs(run_dirs(self.runner.folder, self.done))
            table, simulator = model.run_table(runs), self.simulator
            if simulator is not None:  # the references' traces, read once (simulated_starts)
                table = simulator.columns(table)
            else:
                table, simulator = model.with_simulation(table, runs.runs)
            self.measured = {}
            for run_id, statistic in zip(table["run_id"], table[self.slo.statistic], strict=True):
                self.measured.setdefault(self.setting_of[run_id], []).append(statistic)
            # as make model would, for the SLO's statistic alone
            fitted = model.fit_chosen(table, (self.slo.statistic,))[0]
            fitted.simulator = simulator
            return fitted
        except model.ModelError:
            return None

    def advice(self, fitted: model.Model | None) -> dict[str, float | str | None]:
        """Each point's advice: the value; None where even the median misses the SLO
        everywhere; "uncertain" where the median meets it but no interval is within it yet;
        "unknown" without a model."""
        found: dict[str, float | str | None] = {}
        for point in self.campaign.points:
            found[point.id] = "unknown"
            if fitted is None:
                continue
            try:
                found_here = self.advise(fitted, point)
            except model.ModelError:
                continue
            uncertain = found_here.value is None and found_here.crossing["median"] is not None
            found[point.id] = "uncertain" if uncertain else found_here.value
        return found

    def advise(self, fitted: model.Model, point) -> advisor.Advice:
        """The advice among the values the runs so far let the model answer for."""
        asked = asked_of(point, self.campaign.target, self.search.knob)
        values = advisor.answerable(fitted, asked, self.search.values)
        if not values:
            raise model.ModelError(f"{point.id}: no value within what the runs covered")
        return advisor.advise(fitted, asked, self.slo, values)

    def settled(self) -> bool:
        """Every point's advice is known and rests on runs at both sides (bracketed: not on
        the model alone), no advice waits for a confirming run (to_confirm), and either it
        stayed the same over the last `stable` runs, or it is what the simulator advised from
        the references before any reservation ran and its runs confirm it."""
        steps = self.record["steps"]
        advice = steps[-1]["advice"]
        known = not {"unknown", "uncertain"} & set(map(str, advice.values()))
        points = self.campaign.points
        if not (known and all(self.bracketed(p, advice[p.id]) for p in points)):
            return False
        if any(self.to_confirm(p, advice[p.id]) is not None for p in points):
            return False
        if all(advice[p.id] == self.simulated.get(p.id) and self.confirmed(p, advice[p.id])
               for p in points):  # fmt: skip
            return True
        recent = steps[-(self.search.stable + 1) :]
        return len(recent) > self.search.stable and all(s["advice"] == advice for s in recent)

    def below(self, advised: float) -> float | None:
        """The search's value just below the advice; None at the smallest."""
        return next((v for v in reversed(self.search.values) if v < advised), None)

    def above(self, point) -> float | None:
        """The search's value just above the largest run at that point; None at the largest."""
        ran = [v for v in self.search.values if (point.id, v) in self.tried]
        return next((v for v in self.search.values if ran and v > max(ran)), None)

    def bracketed(self, point, advised: float | str | None) -> bool:
        """The runs at that point say what they can of the advice: one ran at it, and below it
        one missed the SLO or every repetition ran (or it is the smallest value). Without an
        advice value (none met the SLO, or none surely): the largest value ran (a search from
        the simulator's advice has not run them all)."""
        if not isinstance(advised, int | float):
            return self.above(point) is None
        below = self.below(advised)
        missed = any(r > self.slo.limit_ms for r in self.measured.get((point.id, below), []))
        ran = (point.id, advised) in self.tried
        return ran and (below is None or missed or not self.open(point, below))

    def at_advice(self, point, advised: float | str | None) -> list[float]:
        """The SLO's statistic of each run at the advice (none without an advice value)."""
        if not isinstance(advised, int | float):
            return []
        return self.measured.get((point.id, advised), [])

    def confirmed(self, point, advised: float | str | None) -> bool:
        """`confirm` runs at the advice, every one within the SLO."""
        found = self.at_advice(point, advised)
        return len(found) >= self.search.confirm and max(found) <= self.slo.limit_ms

    def to_confirm(self, point, advised: float | str | None) -> float | None:
        """The advice again, where it lacks a confirming run and can run again; else None."""
        if not isinstance(advised, int | float) or self.confirmed(point, advised):
            return None
        if any(r > self.slo.limit_ms for r in self.at_advice(point, advised)):
            return None  # a run there missed: the model, not another run, decides
        return advised if self.open(point, advised) else None

    def to_measure(self, point, advised: float | str | None) -> float | None:
        """The run an advice lacks to be bracketed: at the advice if none ran there; else
        below it, while that value can run again; without an advice value, the next above the
        largest run. None otherwise (the model then chooses)."""
        if self.bracketed(point, advised):
            return None
        if not isinstance(advised, int | float):
            return self.above(point)
        if (point.id, advised) not in self.tried:
            return advised
        below = self.below(advised)
        return below if self.open(point, below) else None

    def next_setting(self, fitted: model.Model | None):
        """What an advice still lacks in runs (to_measure, disputed, then to_confirm once
        bracketed); else the (point, value) least certain near the SLO; without a model, the
        value farthest from those run. None when every value ran its repetitions."""
        advice = self.record["steps"][-1]["advice"]
        for point in self.campaign.points:
            value = self.to_measure(point, advice[point.id])
            if value is None:
                value = self.disputed(point, advice[point.id])
            if value is None and self.bracketed(point, advice[point.id]):
                value = self.to_confirm(point, advice[point.id])
            if value is not None:
                return point, value
        best, best_score = None, float("inf")
        for point in self.campaign.points:
            open_values = [v for v in self.search.values if self.open(point, v)]
            if not open_values:
                continue
            scores = self.scores(fitted, point, open_values)
            for value, score in zip(open_values, scores, strict=True):
                if score < best_score:
                    best, best_score = (point, value), score
        return best

    def disputed(self, point, advised: float | str | None) -> float | None:
        """Where the runs' advice and the simulator's differ, the smaller of the two (the one
        whose safety is in question) while it can run again; else None."""
        simulated = self.simulated.get(point.id)
        if simulated is None or not isinstance(advised, int | float) or advised == simulated:
            return None
        smaller = min(advised, simulated)
        return smaller if self.open(point, smaller) else None

    def open(self, point, value: float) -> bool:
        return self.tried.get((point.id, value), 0) < self.campaign.repetitions

    def scores(self, fitted: model.Model | None, point, values: list[float]) -> list[float]:
        """Smaller is sooner: the model's distance to the SLO, or without one, minus the
        distance to the nearest value run (the farthest first)."""
        if fitted is not None:
            asked = asked_of(point, self.campaign.target, self.search.knob)
            try:
                inside = advisor.answerable(fitted, asked, values)
                if inside:  # the values outside what the runs covered: never the model's pick
                    _, _, _, predicted = advisor.predictions(fitted, asked, inside)
                    scores = advisor.least_certain(predicted, self.slo)
                    found = dict(zip(inside, scores, strict=True))
                    return [found.get(v, float("inf")) for v in values]
            except model.ModelError:
                pass
        run = [v for v in self.search.values if (point.id, v) in self.tried]
        return [-min(abs(v - r) for r in run) if run else 0.0 for v in values]

    def finish(self) -> None:
        """The final advice per point and the model, saved beside the runs."""
        self.record["runs"], self.record["grid_runs"] = (
            sum(self.tried.values()),
            self.campaign.grid_runs(),
        )
        folder: Path = self.runner.folder
        try:
            fitted, _ = model.fit_folder(folder, self.done, folder / "model", self.references)
        except model.ModelError as e:
            self.record["model"] = f"not fitted: {e}"
            self.runner.index.save()
            return
        self.record["model"] = str(folder / "model")
        for point in self.campaign.points:
            try:
                found = self.advise(fitted, point)
            except model.ModelError as e:
                self.record["points"][point.id]["advice"] = f"none: {e}"
                continue
            self.record["points"][point.id]["advice"] = found.as_dict()
            confirmation = self.confirmation(point, found.value)
            self.record["points"][point.id]["confirmation"] = confirmation
            confirmed = confirmation_text(self.search.slo, confirmation)
            shown = advisor.advice_text(found) + (f" ({confirmed})" if confirmed else "")
            self.log(f"{point.id}: {shown}")
        self.runner.index.save()

    def confirmation(self, point, advised: float | None) -> dict:
        """The runs at the final advice: their SLO statistic, how many the search asks for
        (`confirm`) and whether they confirm it."""
        found = self.at_advice(point, advised)
        held = self.confirmed(point, advised)
        return {"needed": self.search.confirm, "measured": found, "held": held}
