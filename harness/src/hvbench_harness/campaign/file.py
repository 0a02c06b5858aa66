"""A campaign file (YAML, campaigns/README.md): its keys checked, its points expanded (a grid
and/or explicit points, each crossed with the repetitions, in its order), each point checked
as the run it will be (runspec.py) before any runs."""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import random
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from hvbench_agent.names import BadName, check_name
from hvbench_agent.sched import Refused

from hvbench_harness import spec
from hvbench_harness.parts import RunError
from hvbench_harness.runspec import RunSpec
from hvbench_harness.targets.kinds import kind
from hvbench_harness.testbed import TARGETS

ORDERS = ("sequential", "shuffled")
SEARCH_METHODS = ("linear", "binary")
TOP_KEYS = {"description", "target", "repetitions", "order", "seed", "settings", "grid"}
TOP_KEYS |= {"points", "search"}
SEARCH_KEYS = {"slo_p99_ms", "rates_per_s", "method", "duration_s"}
MODEL_SEARCH_KEYS = {"method", "slo", "knob", "values", "max_runs", "stable", "reference",
                     "confirm"}  # fmt: skip
KNOBS = ("budget", "cap", "weight")
# A point's scheduler settings, which its model search's reference run leaves out.
RESERVATION = ("sched", "budget", "period", "priority", "extratime", "weight", "cap", "tslice_us",
               "ratelimit_us")  # fmt: skip
XEN_REFERENCE_PERIOD_US = 100_000
# Campaign settings: the run request's fields (spec.FIELDS) but the target, which the file
# names once, and rate (records/s over the network's detectors) instead of send_ms.
SETTING_KEYS = set(spec.CAMPAIGN_KEYS)
# Short names for point ids: p03-rtds-b77500-e0
SHORT = spec.SHORT | {"rate": "r"}  # a campaign may give the rate instead of SEND_MS
# Seconds a run takes besides sending (start Kafka and the job, drain, tear down), until the
# campaign has measured its own.


class CampaignError(ValueError):
    pass


@dataclass(frozen=True)
class Point:
    id: str
    settings: dict  # campaign setting names → values (None: not set)

    def shown(self) -> str:
        """The settings set, as a log line shows them: records=1500, sched=deadline, …"""
        return ", ".join(f"{k}={v}" for k, v in self.settings.items() if v is not None)

    def send_ms(self) -> float:
        return float(self.settings.get("send_ms", 100.0))

    def detectors(self) -> int:
        return spec.DETECTORS[self.settings.get("network") or "freeway"]

    def rate_per_s(self) -> float:
        return spec.rate_per_s(self.send_ms(), self.settings.get("network"))

    def expected_send_s(self) -> float:
        return math.ceil(int(self.settings.get("records", 20_000)) / self.detectors()) * (
            self.send_ms() / 1000
        )

    def with_rate(self, rate_per_s: float, duration_s: float) -> Point:
        """The point at an input rate (a search trial): records = rate × duration."""
        settings = dict(self.settings)
        settings["send_ms"] = spec.send_ms_for(rate_per_s, settings.get("network"))
        settings["records"] = max(self.detectors(), round(rate_per_s * duration_s))
        return Point(f"{self.id}-rate{rate_per_s:g}", settings)

    def reference(self, target: str) -> Point:
        """The point without a reservation, traced: a model search's reference at its rate.
        Xen has no SCHED=none: RTDS with the whole period as budget, extratime on."""
        kept = {k: v for k, v in self.settings.items() if k not in RESERVATION}
        rate = f"{self.rate_per_s():g}"
        free = {"sched": "none"}
        if target == "xen":
            period = self.settings.get("period") or XEN_REFERENCE_PERIOD_US
            free = {"sched": "rtds", "period": period, "budget": period, "extratime": 1}
        return Point(f"reference-rate{rate}", {**kept, **free, "trace": True})

    def at(self, knob: str, value: float) -> Point:
        """The point at one value of the model search's knob."""
        number = int(value) if float(value).is_integer() else value
        settings = {**self.settings, knob: number}
        return Point(f"{self.id}-{SHORT.get(knob, knob)}{number:g}", settings)


@dataclass
class Search:
    slo_p99_ms: float
    rates_per_s: list[float]
    method: str
    duration_s: float


@dataclass
class ModelSearch:
    """Adaptive: each next run at the knob value where the performance model is least
    certain on which side of the SLO the advice falls (docs/model.md)."""

    slo: str  # e.g. "p99 <= 20"
    knob: str  # budget, cap or weight
    values: list[float]  # the candidates: the full grid's values
    max_runs: int | None  # None: the full grid's number
    stable: int = 2  # stop once the advice stayed the same over this many more runs
    method: str = "model"
    # first a traced run without a reservation at each rate, and each point starts at the
    # value the reservation simulator advises from it (docs/simulate.md)
    reference: bool = False
    # runs at each point's advice that must meet the SLO before the search stops: 1, the run
    # that brackets it; 2, that run and one more (a confirming run)
    confirm: int = 1


@dataclass
class Campaign:
    name: str
    file: str
    definition: dict
    target: str
    repetitions: int
    order: str
    seed: int
    points: list[Point]
    search: Search | ModelSearch | None = None
    errors: list[str] = field(default_factory=list)

    def grid_runs(self) -> int:
        """Runs of the full grid (a model search: every point at every value, each repeated)."""
        values = len(self.search.values) if isinstance(self.search, ModelSearch) else 1
        return len(self.points) * values * self.repetitions

    def planned(self) -> list[tuple[Point, int]]:
        """(point, repetition) in the order they run (the grid campaigns)."""
        runs = [(p, rep) for p in self.points for rep in range(1, self.repetitions + 1)]
        if self.order == "shuffled":
            random.Random(self.seed).shuffle(runs)
        return runs


def run_id(point: Point, rep: int) -> str:
    return f"{point.id}-r{rep}"


# ---------------------------------------------------------------------------------------------
# the campaign file


def load(path: str | Path) -> Campaign:
    """Read and check a campaign file; CampaignError lists everything wrong with it."""
    path = Path(path)
    try:
        definition = yaml.safe_load(path.read_text())
    except OSError as e:
        raise CampaignError(f"{path}: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise CampaignError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(definition, dict):
        raise CampaignError(f"{path}: a campaign file is a mapping (target, settings, grid, ...)")
    # as the index stores it (JSON), so that a resumed campaign compares like with like
    definition = json.loads(json.dumps(definition, default=str))
    errors: list[str] = []
    unknown = spec.unknown(sorted(definition), TOP_KEYS, "key(s)")
    if unknown:
        errors.append(f"{unknown}; valid: {', '.join(sorted(TOP_KEYS))}")
    target = definition.get("target")
    if target not in TARGETS:
        errors.append(f"target must be one of {', '.join(TARGETS)}, not {target!r}")
    repetitions = definition.get("repetitions", 1)
    if isinstance(repetitions, bool) or not isinstance(repetitions, int) or repetitions < 1:
        errors.append(f"repetitions must be a whole number ≥ 1, not {repetitions!r}")
        repetitions = 1
    order = definition.get("order", "sequential")
    if order not in ORDERS:
        errors.append(f"order must be {' or '.join(ORDERS)}, not {order!r}")
    seed = definition.get("seed")
    if seed is None:  # the same file always runs in the same order
        seed = int(hashlib.sha256(path.stem.encode()).hexdigest()[:8], 16)
    elif isinstance(seed, bool) or not isinstance(seed, int):
        errors.append(f"seed must be a whole number, not {seed!r}")
    try:
        check_name(path.stem, "the campaign's name (its file's name)")
    except BadName as e:
        errors.append(str(e))
    search = _search(definition.get("search"), errors)
    confirm = search.confirm if isinstance(search, ModelSearch) else 1
    if _positive(confirm) and confirm > repetitions:  # a value runs at most `repetitions` times
        errors.append(f"search: confirm ({confirm}) cannot exceed repetitions ({repetitions})")
    points = _points(definition, search, errors)
    campaign = Campaign(
        name=path.stem,
        file=str(path),
        definition=definition,
        target=target,
        repetitions=repetitions,
        order=order,
        seed=seed,
        points=points,
        search=search,
    )
    if not errors and target in TARGETS:
        errors.extend(check_points(campaign))
    if errors:
        raise CampaignError(f"{path}:\n  " + "\n  ".join(errors))
    return campaign


def _settings(where: str, value, errors: list[str]) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        errors.append(f"{where} must be a mapping of settings")
        return {}
    unknown = spec.unknown(sorted(value), SETTING_KEYS, "setting(s)")
    if unknown:
        errors.append(f"{where}: {unknown}; valid: " + ", ".join(sorted(SETTING_KEYS)))
    return {k: v for k, v in value.items() if k in SETTING_KEYS}


def _points(definition: dict, search, errors: list[str]) -> list[Point]:
    shared = _settings("settings", definition.get("settings"), errors)
    grid = definition.get("grid") or {}
    if not isinstance(grid, dict):
        errors.append("grid must be a mapping of setting → list of values")
        grid = {}
    for key, values in grid.items():
        if key not in SETTING_KEYS:
            errors.append(
                f"grid: {spec.unknown([key], SETTING_KEYS, 'setting')}; valid: "
                + ", ".join(sorted(SETTING_KEYS))
            )
        elif not isinstance(values, list) or not values:
            errors.append(f"grid: {key} must be a non-empty list of values")
    grid = {k: v for k, v in grid.items() if k in SETTING_KEYS and isinstance(v, list) and v}
    explicit = definition.get("points") or [{}]
    if not isinstance(explicit, list):
        errors.append("points must be a list of mappings of settings")
        explicit = [{}]
    explicit = [_settings(f"points[{i}]", p, errors) for i, p in enumerate(explicit)]
    combos = [dict(zip(grid, values, strict=True)) for values in itertools.product(*grid.values())]
    merged = [{**shared, **p, **g} for p in explicit for g in combos]
    # The point id names what differs between points.
    varying = [k for k in SETTING_KEYS if len({json.dumps(m.get(k)) for m in merged}) > 1]
    order = [f.name for f in spec.FIELDS]
    varying.sort(key=lambda k: order.index(k) if k in order else len(order))
    points, seen = [], set()
    for i, settings in enumerate(merged, start=1):
        if "rate" in settings:
            if "send_ms" in settings:
                errors.append(f"point {i}: give rate or send_ms, not both")
                continue
            rate = settings.pop("rate")
            if isinstance(rate, bool) or not isinstance(rate, int | float) or rate <= 0:
                errors.append(f"point {i}: rate must be a positive number, not {rate!r}")
                continue
            if settings.get("network", "freeway") not in spec.DETECTORS:
                errors.append(f"point {i}: unknown network {settings['network']!r}")
                continue
            settings["send_ms"] = spec.send_ms_for(rate, settings.get("network"))
        if isinstance(search, ModelSearch) and search.knob in settings:
            errors.append(f"point {i}: the model search sets {search.knob} itself; remove it")
        if isinstance(search, Search) and ({"send_ms", "records"} & set(settings)):
            errors.append(
                f"point {i}: a search sets the rate and records itself; "
                "remove send_ms, rate and records"
            )
        key = json.dumps(settings, sort_keys=True)
        if key in seen:
            errors.append(f"point {i} repeats an earlier point: {key}")
        seen.add(key)
        points.append(Point(_point_id(i, settings, varying), settings))
    return points


def _point_id(index: int, settings: dict, varying: list[str]) -> str:
    parts = [f"p{index:02d}"]
    for key in varying:
        value = settings.get(key)
        if value is None:  # unset: the point's number tells it apart
            continue
        if key == "sched":
            parts.append(str(value))
        elif isinstance(value, bool):
            parts.append(key if value else f"no{key}")
        else:
            text = f"{value:g}" if isinstance(value, float) else str(value)
            text = text.replace(":", "").replace(",", "+")  # NOISE=2:cpu,1:membw: 2cpu+1membw
            text = re.sub(r"[^A-Za-z0-9._+-]", "", text)  # a point id is a name (names.py)
            parts.append(f"{SHORT.get(key, key)}{text}")
    return "-".join(parts)


def _search(value, errors: list[str]) -> Search | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        errors.append("search must be a mapping: slo_p99_ms, rates_per_s, method, duration_s")
        return None
    if value.get("method") == "model":
        return _model_search(value, errors)
    unknown = spec.unknown(sorted(value), SEARCH_KEYS, "key(s)")
    if unknown:
        errors.append(f"search: {unknown}")
    slo = value.get("slo_p99_ms")
    rates = value.get("rates_per_s")
    method = value.get("method", "binary")
    duration = value.get("duration_s", 60)
    if not _positive(slo):
        errors.append(f"search: slo_p99_ms must be a positive number, not {slo!r}")
    if (
        not isinstance(rates, list)
        or not rates
        or not all(_positive(r) for r in rates)
        or sorted(set(rates)) != rates
    ):
        errors.append("search: rates_per_s must be a list of positive rates, ascending, no repeats")
        rates = []
    if method not in SEARCH_METHODS:
        errors.append(f"search: method must be {' or '.join(SEARCH_METHODS)}, not {method!r}")
    if not _positive(duration):
        errors.append(f"search: duration_s must be a positive number, not {duration!r}")
    return Search(slo, [float(r) for r in rates], method, duration)


def _model_search(value: dict, errors: list[str]) -> ModelSearch:
    from hvbench_analysis.model import ModelError
    from hvbench_analysis.model.advice import parse_slo

    unknown = spec.unknown(sorted(value), MODEL_SEARCH_KEYS, "key(s)")
    if unknown:
        errors.append(f"search: {unknown}; valid: {', '.join(sorted(MODEL_SEARCH_KEYS))}")
    try:
        parse_slo(str(value.get("slo")))
    except ModelError as e:
        errors.append(f"search: {e}")
    knob, values = value.get("knob", "budget"), value.get("values")
    if knob not in KNOBS:
        errors.append(f"search: knob must be one of {', '.join(KNOBS)}, not {knob!r}")
    if (
        not isinstance(values, list)
        or len(values) < 3
        or not all(_positive(v) for v in values)
        or sorted(set(values)) != values
    ):
        errors.append("search: values must list at least 3 positive numbers, ascending")
        values = []
    max_runs, stable = value.get("max_runs"), value.get("stable", 2)
    confirm = value.get("confirm", 1)
    whole = {"max_runs": max_runs} if max_runs is not None else {}  # None: the full grid
    for name, number in (whole | {"stable": stable, "confirm": confirm}).items():
        if not _positive(number) or not isinstance(number, int):
            errors.append(f"search: {name} must be a whole number ≥ 1, not {number!r}")
    reference = value.get("reference", False)
    if not isinstance(reference, bool):
        errors.append(f"search: reference must be true or false, not {reference!r}")
    slo = str(value.get("slo"))
    return ModelSearch(
        slo, knob, values, max_runs, stable, reference=reference is True, confirm=confirm
    )


def _positive(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value > 0


def run_argv(point: Point) -> list[str]:
    """The point's settings as `python -m hvbench_harness.run` options."""
    return spec.to_argv(point.settings)


def check_points(campaign: Campaign) -> list[str]:
    """Every point (every rate of a search) through the run request's own check (runspec.py),
    as each run will be checked."""
    errors = []
    points = campaign.points
    if isinstance(campaign.search, ModelSearch):
        s = campaign.search
        points = [p.at(s.knob, v) for p in points for v in s.values]
        if s.reference:  # one at each rate, first, counted among the runs
            references = {r.id: r for r in (p.reference(campaign.target) for p in campaign.points)}
            points += list(references.values())
            if s.max_runs is not None and s.max_runs <= len(references):
                errors.append(f"search: max_runs {s.max_runs} leaves no run after the "
                              f"{len(references)} reference run(s)")  # fmt: skip
    elif campaign.search:
        points = [
            p.with_rate(r, campaign.search.duration_s)
            for p in campaign.points
            for r in campaign.search.rates_per_s
        ]
    for point in points:
        try:
            check_name(run_id(point, campaign.repetitions), "a run's id")
        except BadName as e:
            errors.append(f"{point.id}: {e}")
            continue
        try:
            RunSpec.parse({**point.settings, "target": campaign.target}, need_inventory=False)
        except (RunError, Refused, ValueError) as e:
            errors.append(f"{point.id}: {e}")
    return errors


def describe(campaign: Campaign) -> str:
    if isinstance(campaign.search, ModelSearch):
        s, grid = campaign.search, campaign.grid_runs()
        runs = s.max_runs or grid
        what = (
            f"{len(campaign.points)} point(s), model search over {len(s.values)} {s.knob} "
            f"values for {s.slo}: at most {runs} runs (the full grid: {grid})"
            + (f", each advice confirmed by {s.confirm} runs" if s.confirm > 1 else "")
        )
        send_s = max(p.expected_send_s() for p in campaign.points) * runs
    elif campaign.search:
        s = campaign.search
        steps = len(s.rates_per_s) if s.method == "linear" else len(s.rates_per_s).bit_length()
        runs = len(campaign.points) * steps * campaign.repetitions
        what = (
            f"{len(campaign.points)} point(s), {s.method} search over {len(s.rates_per_s)} "
            f"rates for p99 ≤ {s.slo_p99_ms:g} ms, × {campaign.repetitions} repetition(s): "
            f"at most {runs} runs"
        )
        send_s = runs * s.duration_s
    else:
        runs = len(campaign.points) * campaign.repetitions
        what = (
            f"{len(campaign.points)} point(s) × {campaign.repetitions} repetition(s) = {runs} runs"
        )
        send_s = sum(p.expected_send_s() for p in campaign.points) * campaign.repetitions
    total = send_s + runs * kind(campaign.target).overhead_s
    return f"{what} on {campaign.target}, {campaign.order}; about {duration(total)}"


def duration(seconds: float) -> str:
    minutes = round(seconds / 60)
    return f"{minutes} min" if minutes < 120 else f"{minutes / 60:.1f} h"
