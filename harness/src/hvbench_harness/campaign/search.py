"""The two searches a campaign may ask instead of fixed points: the sustainable rate (the highest
rate whose p99 meets an SLO, linear or binary, as Theodolite does) and the model search (the
adaptive one, model_search.py)."""

from __future__ import annotations

import random

from hvbench_harness.campaign.file import Point, Search
from hvbench_harness.campaign.model_search import Search as ModelSearchRun
from hvbench_harness.campaign.runner import Runner, log


def run_rate_search(self: Runner) -> None:
    """For each point, the highest rate whose p99 meets the SLO (`search:` with rates)."""
    search = self.campaign.search
    state = self.index.doc["search"]["points"]
    points = list(self.campaign.points)
    if self.campaign.order == "shuffled":
        random.Random(self.campaign.seed).shuffle(points)
    for point in points:
        record = state.setdefault(
            point.id,
            {
                "settings": point.settings,
                "trials": [],
                "sustainable_rate_per_s": None,
                "finished": False,
            },
        )
        # trials are replayed from the index: runs done before are not run again
        record["trials"] = []
        found = highest_passing(search, trial_passes(self, point, record))
        record["sustainable_rate_per_s"] = found
        record["finished"] = True
        self.index.save()
        log(
            f"{point.id}: sustainable rate "
            + (f"{found:g} records/s" if found else "none of the rates")
            + f" (p99 ≤ {search.slo_p99_ms:g} ms)"
        )


def trial_passes(self: Runner, point: Point, record: dict):
    """A function: rate → whether the point meets the SLO at that rate (runs the trial)."""
    search = self.campaign.search

    def passes(rate: float) -> bool:
        trial_point = point.with_rate(rate, search.duration_s)
        entries = [
            self.run_one(trial_point, rep, f"[{point.id} at {rate:g}/s, rep {rep}]")
            for rep in range(1, self.campaign.repetitions + 1)
        ]
        p99 = [e["p99_ms"] for e in entries]
        passed = all(
            e["status"] == "done" and e["accounted"] and e["p99_ms"] is not None for e in entries
        ) and all(v <= search.slo_p99_ms for v in p99)
        record["trials"].append(
            {
                "rate_per_s": rate,
                "run_ids": [e["run_id"] for e in entries],
                "p99_ms": p99,
                "passed": passed,
            }
        )
        self.index.save()
        return passed

    return passes


def run_model_search(self: Runner) -> None:
    """The adaptive search (`search: {method: model}`, model_search.py)."""
    ModelSearchRun(self, log).run()
    record = self.index.doc["search"]
    log(
        f"model search: {record['runs']} run(s) against the full grid's "
        f"{record['grid_runs']}; model: {record['model']}"
    )


def highest_passing(search: Search, passes) -> float | None:
    """The highest rate for which passes(rate) holds, trying rates as the method says. Linear:
    upward until the first failure. Binary: over the sorted rates, assuming that a rate that
    fails makes every higher one fail."""
    rates, best = search.rates_per_s, None
    if search.method == "linear":
        for rate in rates:
            if not passes(rate):
                break
            best = rate
        return best
    low, high = 0, len(rates) - 1
    while low <= high:
        middle = (low + high) // 2
        if passes(rates[middle]):
            best, low = rates[middle], middle + 1
        else:
            high = middle - 1
    return best
