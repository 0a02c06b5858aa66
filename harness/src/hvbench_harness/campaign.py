"""`make campaign`: a grid of settings, each point run several times through `make run`'s path.

A campaign file (YAML, see campaigns/README.md) names the target, the settings every point
shares, a grid (every combination of its lists) and/or explicit points, the number of
repetitions and the order: sequential (each point's repetitions in a row, points in file order)
or shuffled (every run of the campaign in a seeded random order, which spreads slow drift of the
host over all points). Or, instead of repetitions at fixed rates, a sustainable-rate search: for
each point, the highest input rate whose p99 stays under an SLO (linear or binary search over a
list of rates, as Theodolite does).

Every run is `python -m hvbench_harness.run` in a child process, as `make run` starts it, with
the run id `<point>-r<rep>` and results in `results/<campaign>/<run-id>/`. The index
`results/<campaign>/campaign.json` says for every run its settings, status (done, failed with
its reason, interrupted) and headline figures; it is rewritten after each run, so an interrupted
campaign resumes (--resume) with the runs that are not done. Each run's output goes to
`results/<campaign>/logs/<run-id>.log`.

    python -m hvbench_harness.campaign validate campaigns/*.yml
    python -m hvbench_harness.campaign run campaigns/table4-rtds.yml \\
        --inventory inventory/lab/hosts.yml
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import math
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import yaml
from hvbench_agent.names import BadName, check_name
from hvbench_agent.sched import Refused
from hvbench_analysis import results as results_contract

from hvbench_harness import spec
from hvbench_harness.parts import RunError
from hvbench_harness.runlocks import hold, registered_machines
from hvbench_harness.runspec import RunSpec
from hvbench_harness.testbed import TARGETS, TestbedError, inventory_target

ORDERS = ("sequential", "shuffled")
SEARCH_METHODS = ("linear", "binary")
TOP_KEYS = {"description", "target", "repetitions", "order", "seed", "settings", "grid"}
TOP_KEYS |= {"points", "search"}
SEARCH_KEYS = {"slo_p99_ms", "rates_per_s", "method", "duration_s"}
MODEL_SEARCH_KEYS = {"method", "slo", "knob", "values", "max_runs", "stable"}
KNOBS = ("budget", "cap", "weight")
# Campaign settings: the run request's fields (spec.FIELDS) but the target, which the file
# names once, and rate (records/s over the network's detectors) instead of send_ms.
SETTING_KEYS = set(spec.CAMPAIGN_KEYS)
# Short names for point ids: p03-rtds-b77500-e0
SHORT = spec.SHORT | {"rate": "r"}  # a campaign may give the rate instead of SEND_MS
# Seconds a run takes besides sending (start Kafka and the job, drain, tear down), until the
# campaign has measured its own.
OVERHEAD_S = {"bare": 60.0, "kvm": 120.0, "xen": 120.0}


class CampaignError(ValueError):
    pass


@dataclass(frozen=True)
class Point:
    id: str
    settings: dict  # campaign setting names → values (None: not set)

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
    from hvbench_analysis.advice import parse_slo
    from hvbench_analysis.model import ModelError

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
    for name, number in (("max_runs", max_runs), ("stable", stable)):
        if number is not None and (not _positive(number) or not isinstance(number, int)):
            errors.append(f"search: {name} must be a whole number ≥ 1, not {number!r}")
    return ModelSearch(str(value.get("slo")), knob, values, max_runs, stable)


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
        points = [p.at(campaign.search.knob, v) for p in points for v in campaign.search.values]
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
    total = send_s + runs * OVERHEAD_S[campaign.target]
    return f"{what} on {campaign.target}, {campaign.order}; about {_duration(total)}"


def _duration(seconds: float) -> str:
    minutes = round(seconds / 60)
    return f"{minutes} min" if minutes < 120 else f"{minutes / 60:.1f} h"


# ---------------------------------------------------------------------------------------------
# the index


class Index:
    """results/<campaign>/campaign.json, rewritten whole (atomically) after every change."""

    def __init__(self, path: Path, doc: dict) -> None:
        self.path = path
        self.doc = doc

    @classmethod
    def open(cls, campaign: Campaign, folder: Path, resume: bool) -> Index:
        path = folder / "campaign.json"
        if path.exists():
            if not resume:
                raise CampaignError(
                    f"{folder} holds a campaign already: RESUME=1 continues it; to start "
                    "again, move that folder away"
                )
            doc = json.loads(path.read_text())
            if doc.get("definition") != campaign.definition:
                raise CampaignError(
                    f"{campaign.file} changed since the campaign in {folder} started; a changed "
                    "campaign is a new one: save it under another name"
                )
            for entry in doc["runs"]:
                if entry["status"] == "running":  # the campaign itself was killed
                    entry["status"] = "interrupted"
                    entry["reason"] = "the campaign stopped during this run"
            return cls(path, doc)
        folder.mkdir(parents=True, exist_ok=True)
        now = _now()
        doc = {
            "campaign": campaign.name,
            "file": campaign.file,
            "definition": campaign.definition,
            "target": campaign.target,
            "order": campaign.order,
            "seed": campaign.seed,
            "repetitions": campaign.repetitions,
            "created_at": now,
            "updated_at": now,
            "runs": [],
            "search": None,
        }
        if isinstance(campaign.search, ModelSearch):
            doc["search"] = {**asdict(campaign.search), "points": {}, "steps": []}
        elif campaign.search:
            s = campaign.search
            doc["search"] = {
                "slo_p99_ms": s.slo_p99_ms,
                "method": s.method,
                "rates_per_s": s.rates_per_s,
                "duration_s": s.duration_s,
                "points": {},
            }
        else:
            doc["runs"] = [_entry(point, rep) for point, rep in campaign.planned()]
        index = cls(path, doc)
        index.save()
        return index

    def entry(self, point: Point, rep: int) -> dict:
        rid = run_id(point, rep)
        for entry in self.doc["runs"]:
            if entry["run_id"] == rid:
                return entry
        entry = _entry(point, rep)
        self.doc["runs"].append(entry)
        return entry

    def save(self) -> None:
        self.doc["updated_at"] = _now()
        tmp = self.path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.doc, indent=1) + "\n")
        tmp.replace(self.path)

    def overhead_s(self, target: str) -> float:
        """Mean time a finished run took besides sending, measured in this campaign."""
        extra = [
            e["duration_s"] - e["expected_send_s"]
            for e in self.doc["runs"]
            if e["status"] == "done" and e.get("duration_s") is not None
        ]
        return sum(extra) / len(extra) if extra else OVERHEAD_S[target]


def _entry(point: Point, rep: int) -> dict:
    return {
        "run_id": run_id(point, rep),
        "point": point.id,
        "rep": rep,
        "settings": point.settings,
        "rate_per_s": point.rate_per_s(),
        "expected_send_s": point.expected_send_s(),
        "status": "pending",
        "reason": None,
        "exit_code": None,
        "started_at": None,
        "ended_at": None,
        "duration_s": None,
        "accounted": None,
        "p99_ms": None,
    }


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


# ---------------------------------------------------------------------------------------------
# running


class Interrupted(Exception):
    pass


@dataclass
class Runner:
    """Runs a campaign's runs one after another (the harness, in a child process each)."""

    campaign: Campaign
    index: Index
    folder: Path
    harness_argv: list[str]  # --inventory, --data, ... as make run passes them
    work: Path
    child: subprocess.Popen | None = None
    stop_signal: int | None = None
    child_stopped: bool = False  # the running child has had its SIGTERM
    # the harness a run starts: `make run`'s own
    harness: tuple[str, ...] = (sys.executable, "-m", "hvbench_harness.run")

    def on_signal(self, signum, _frame) -> None:
        # The child runs in its own session (no terminal Ctrl-C reaches it twice): it gets one
        # SIGTERM, which the harness treats as Ctrl-C (tear down, exit 130).
        self.stop_signal = signum
        self.stop_child()

    def stop_child(self) -> None:
        if self.child is not None and not self.child_stopped and self.child.poll() is None:
            self.child_stopped = True
            self.child.send_signal(signal.SIGTERM)

    def run_one(self, point: Point, rep: int, position: str) -> dict:
        entry = self.index.entry(point, rep)
        if entry["status"] == "done":
            return entry
        if self.stop_signal is not None:
            raise Interrupted
        rid = entry["run_id"]
        if adopt(entry, self.folder / rid):  # finished, but the campaign stopped before noting it
            self.index.save()
            log(f"{position} {rid}: finished before the campaign stopped; taken as done")
            return entry
        stale = self.work / rid
        if stale.exists():  # the partial files of an interrupted attempt
            shutil.rmtree(stale)
        kept = set_aside(self.folder / rid, self.folder / "attempts")
        if kept:
            log(f"{position} {rid}: the last attempt's partial results kept in {kept}")
        if entry["status"] != "pending":
            log(f"{position} {rid}: again (last time {entry['status']}: {entry['reason']})")
        entry.update(status="running", reason=None, started_at=_now(), ended_at=None)
        self.index.save()
        shown = ", ".join(f"{k}={v}" for k, v in point.settings.items() if v is not None)
        log(f"{position} {rid}: {shown}")
        self.conclude(entry, self.launch(self.child_argv(point, rep, rid), rid))
        log(f"{position} {rid}: {summary(entry)}")
        if entry["status"] == "interrupted":
            raise Interrupted
        return entry

    def child_argv(self, point: Point, rep: int, rid: str) -> list[str]:
        return [
            *self.harness,
            *("--target", self.campaign.target),
            *run_argv(point),
            *self.harness_argv,
            *("--results", str(self.folder)),
            *("--work", str(self.work)),
            *("--run-id", rid),
            *("--rep", str(rep)),
            *("--campaign", self.campaign.name),
        ]

    def launch(self, argv: list[str], rid: str) -> tuple[int, float]:
        """Run one child harness, its output to logs/<rid>.log; (exit code, seconds)."""
        logs = self.folder / "logs"
        logs.mkdir(exist_ok=True)
        started = time.monotonic()
        with open(logs / f"{rid}.log", "wb") as out:
            self.child_stopped = False
            self.child = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
            if self.stop_signal is not None:  # it came while the child was being started
                self.stop_child()
            code = self.child.wait()
            self.child = None
        return code, time.monotonic() - started

    def conclude(self, entry: dict, outcome: tuple[int, float]) -> None:
        code, seconds = outcome
        rid = entry["run_id"]
        entry.update(exit_code=code, ended_at=_now(), duration_s=round(seconds, 1))
        if code in (0, 2) and adopt(entry, self.folder / rid):
            pass
        elif self.stop_signal is not None or code == 130:
            entry.update(status="interrupted", reason="interrupted")
        elif (ended := ended_reason(self.folder / rid)) is not None:
            entry.update(status="failed", reason=ended)
        else:
            log_file = self.folder / "logs" / f"{rid}.log"
            entry.update(status="failed", reason=failure_reason(log_file, code))
        self.index.save()

    def eta(self, remaining: list[Point]) -> str:
        overhead = self.index.overhead_s(self.campaign.target)
        left = sum(p.expected_send_s() + overhead for p in remaining)
        at = datetime.now() + timedelta(seconds=left)
        return f"{len(remaining)} run(s) left, ETA {at:%H:%M} (about {_duration(left)})"

    def run_grid(self) -> None:
        plan = self.campaign.planned()
        for i, (point, rep) in enumerate(plan):
            position = f"[{i + 1}/{len(plan)}]"
            before = self.index.entry(point, rep)["status"]
            self.run_one(point, rep, position)
            remaining = [p for p, r in plan[i + 1 :] if self.index.entry(p, r)["status"] != "done"]
            if before != "done" and remaining:
                log(f"  {self.eta(remaining)}")

    def run_search(self) -> None:
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
            found = highest_passing(search, self.trial_passes(point, record))
            record["sustainable_rate_per_s"] = found
            record["finished"] = True
            self.index.save()
            log(
                f"{point.id}: sustainable rate "
                + (f"{found:g} records/s" if found else "none of the rates")
                + f" (p99 ≤ {search.slo_p99_ms:g} ms)"
            )

    def run_model_search(self) -> None:
        from hvbench_harness.model_search import Search as ModelSearchRun

        ModelSearchRun(self, log).run()
        record = self.index.doc["search"]
        log(
            f"model search: {record['runs']} run(s) against the full grid's "
            f"{record['grid_runs']}; model: {record['model']}"
        )

    def trial_passes(self, point: Point, record: dict):
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
                e["status"] == "done" and e["accounted"] and e["p99_ms"] is not None
                for e in entries
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


def adopt(entry: dict, results: Path) -> bool:
    """Take a run's figures from its results if it completed (meta.json written, status
    completed); True if so. A failed or interrupted run's results say so: not adopted."""
    try:
        meta = results_contract.read_meta(results)
    except results_contract.ResultsError:
        return False
    if meta["status"]["state"] != "completed":
        return False
    counts = meta.get("counts") or {}
    entry.update(
        status="done",
        accounted=bool(counts.get("accounted")),
        p99_ms=(meta.get("latency") or {}).get("p99_ms"),
        reason=None if counts.get("accounted") else "records unaccounted for",
    )
    return True


def set_aside(results: Path, attempts: Path) -> Path | None:
    """Move a failed or interrupted attempt's results out of the run's place (into
    attempts/<run-id>.<n>), so that the run can be done again under its name and the partial
    results are kept. None if there was nothing."""
    if not results.exists():
        return None
    attempts.mkdir(exist_ok=True)
    n = 1 + sum(1 for _ in attempts.glob(f"{results.name}.*"))
    target = attempts / f"{results.name}.{n}"
    results.rename(target)
    return target


def ended_reason(results: Path) -> str | None:
    """The reason a run that wrote its results gives for having failed, if it did."""
    try:
        status = results_contract.read_meta(results)["status"]
    except results_contract.ResultsError:
        return None
    return status["reason"] if status["state"] != "completed" else None


def failure_reason(log_file: Path, code: int) -> str:
    """The harness's own message (its `make run: ...` line), else the end of its output."""
    lines = log_file.read_text(errors="replace").splitlines()
    for i, line in enumerate(lines):
        if line.startswith("make run: "):
            return "\n".join([line[len("make run: ") :], *lines[i + 1 : i + 6]])
    return f"exit {code}: " + " / ".join(line for line in lines[-5:] if line.strip())


def summary(entry: dict) -> str:
    took = f"{entry['duration_s']:.0f} s"
    if entry["status"] == "done":
        p99 = entry["p99_ms"]
        figure = f"p99 {p99:.2f} ms" if p99 is not None else "no latency"
        accounted = "every record accounted for" if entry["accounted"] else "RECORDS UNACCOUNTED"
        return f"done in {took}: {figure}, {accounted}"
    return f"{entry['status']} after {took}: {entry['reason'].splitlines()[0]}"


def log(message: str) -> None:
    print(f"[{datetime.now():%H:%M:%S}] {message}", flush=True)


def run_campaign(
    campaign: Campaign, args: argparse.Namespace, harness: tuple[str, ...] | None = None
) -> int:
    if campaign.target != "bare":
        if not args.inventory:
            raise CampaignError(
                f"{campaign.file} runs on {campaign.target}: HOST=<host> or INVENTORY=<dir>"
            )
        found = inventory_target(args.inventory)
        if found != campaign.target:
            raise CampaignError(
                f"{campaign.file} runs on {campaign.target}, but {args.inventory} is {found}"
            )
    machines = registered_machines(campaign.target, args.inventory)
    forced = bool(getattr(args, "concurrent", False) or campaign_settings(campaign, "concurrent"))
    with hold(campaign.name, machines, kind="campaign", forced=forced):
        return run_held(campaign, args, harness, forced)


def campaign_settings(campaign: Campaign, key: str):
    """A setting the campaign's `settings` give every point (None if they do not)."""
    return (campaign.definition.get("settings") or {}).get(key)


def run_held(
    campaign: Campaign, args: argparse.Namespace, harness: tuple[str, ...] | None, forced: bool
) -> int:
    """The campaign's runs, while it holds its machines in the run registry (runlocks); its
    own runs, its children, do not count it as another run. Forced, its runs are too: they
    run beside the runs the campaign was forced past."""
    folder = Path(args.results) / campaign.name
    index = Index.open(campaign, folder, args.resume)
    shutil.copy(campaign.file, folder / "campaign.yml")
    runner = Runner(
        campaign,
        index,
        folder,
        harness_args(args, campaign.target) + (["--concurrent"] if forced else []),
        Path(args.work) / campaign.name,
    )
    if harness:
        runner.harness = harness
    log(f"campaign {campaign.name}: {describe(campaign)}; index {index.path}")
    handlers = {s: signal.signal(s, runner.on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        if isinstance(campaign.search, ModelSearch):
            runner.run_model_search()
        elif campaign.search:
            runner.run_search()
        else:
            runner.run_grid()
    except Interrupted:
        log(f"campaign {campaign.name} interrupted; make campaign ... RESUME=1 goes on from here")
        return 130
    finally:
        index.save()
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
    runs = index.doc["runs"]
    failed = [e for e in runs if e["status"] != "done"]
    unaccounted = [e for e in runs if e["status"] == "done" and not e["accounted"]]
    log(
        f"campaign {campaign.name}: {len(runs) - len(failed)} of {len(runs)} run(s) done"
        + (f", {len(unaccounted)} with records unaccounted for" if unaccounted else "")
        + f"; results in {folder}/"
    )
    for entry in failed:
        log(f"  {entry['run_id']} {entry['status']}: {entry['reason']}")
    return 1 if failed or unaccounted else 0


def harness_args(args: argparse.Namespace, target: str) -> list[str]:
    if target != "bare":
        return ["--inventory", args.inventory]
    return [
        "--data",
        args.data,
        "--model",
        args.model,
        "--kafka-libs",
        args.kafka_libs,
        "--connector-dir",
        args.connector_dir,
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="hvbench campaign", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    check = sub.add_parser("validate", help="check campaign files (nothing runs)")
    check.add_argument("files", nargs="+")
    target = sub.add_parser("target", help="print the target a campaign file names")
    target.add_argument("file")
    go = sub.add_parser("run", help="run a campaign (or resume it)")
    go.add_argument("file")
    go.add_argument("--resume", action="store_true")
    go.add_argument(
        "--concurrent",
        action="store_true",
        help="run although another run or campaign holds the machine (as CONCURRENT=1 does "
        "for a run; `concurrent: true` in the settings does both)",
    )
    go.add_argument("--inventory")
    go.add_argument("--results", default="results")
    go.add_argument("--work", default="work")
    go.add_argument("--data", default="data/pems")
    go.add_argument("--model", default="artifacts/forecaster")
    go.add_argument("--kafka-libs", default="build/kafka/libs")
    go.add_argument("--connector-dir", default="build/flink/lib")
    args = p.parse_args(argv)
    try:
        if args.command == "validate":
            bad = 0
            for file in args.files:
                try:
                    print(f"{file}: {describe(load(file))}")
                except CampaignError as e:
                    print(f"make campaign: {e}", file=sys.stderr)
                    bad += 1
            return 1 if bad else 0
        if args.command == "target":
            print(load(args.file).target)
            return 0
        return run_campaign(load(args.file), args)
    except (CampaignError, TestbedError, RunError) as e:
        print(f"make campaign: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
