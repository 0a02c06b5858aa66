"""The sustainable rate of one job, two parallel tasks and the bare cluster, side by side in one
run, and the records per second per core beside the Blue Danube study's figure.

Each layout gets the rate steps of bench_pipeline.py (a fresh run per rate: a 30 s ramp inside
a 60 s warm-up, then the measured seconds) until p99 passes 50 ms:

- p=1: one broker, the job in one local Flink JVM (SCALE=one);
- p=2: one broker, a session cluster of two TaskManagers (SCALE=cluster BROKERS=1);
- cluster: three brokers (replication 3, min in-sync 2) and two TaskManagers (SCALE=cluster);
- bay: p=1 with the 325 PEMS-BAY sensors (NETWORK=bay), each record routed to a destination of
  its own (A* over 325 nodes instead of 6);
- grouped: p=1, the six freeway detectors as one producer group whose records of a round go
  out as one message (PRODUCERS=1 MESSAGES=group): one Kafka request, one fetch, one hand-off
  into Python and one batched forecast for six records;
- bay grouped: bay, its six groups of 54 or 55 sensors each sending a round as one message.

The grouped layout climbs from higher rates (--grouped-rates) than the others (--rates).

The producers, the consumer and every JVM share this machine's cores, so records/s per core is
the sustainable rate over all of them. Blue Danube's Linear Road figure, about 8,300 tuples/s
per core (8.29 million tuples/s on 50 nodes), is work of another kind: a tuple there is a
position report through filters, joins and aggregates; a record here goes through two Kafka
hops, an LSTM forecast and an A* route, each in Python.

    python bench/bench_scale.py --model artifacts/forecaster --data data/pems \
        --bay-data data/pems-bay
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_pipeline import rate_steps, sustainable
from common import OUT

import tsc_timer

GROUPED = ("--messages", "group")
LAYOUTS = {
    "p=1": (),
    "p=2": ("--scale", "cluster", "--brokers", "1", "--taskmanagers", "2"),
    "cluster": ("--scale", "cluster"),
    "bay": ("--network", "bay"),
    "grouped": ("--producers", "1", *GROUPED),
    "bay grouped": ("--network", "bay", *GROUPED),
}
DETECTORS = {"bay": 325, "bay grouped": 325}  # the other layouts: the six freeway detectors
BAY_DATA = ("bay", "bay grouped")
GROUPED_RATES = "2400,3000,3600,4800,6000,7200"
BLUE_DANUBE_PER_CORE = 8_300
# records/s on two cores at p99 ≤ 50 ms: a record a message (p=1), and grouped (issue 44)
GOALS = {"p=1": 2_400, "grouped": 6_000}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="artifacts/forecaster")
    p.add_argument("--data", default="data/pems")
    p.add_argument("--bay-data", default="data/pems-bay", help="make data NETWORK=bay")
    p.add_argument("--layouts", default=",".join(LAYOUTS), help="of " + ", ".join(LAYOUTS))
    p.add_argument("--rates", default="900,1200,1500,1800,2400", help="rec/s, rising")
    p.add_argument("--grouped-rates", default=GROUPED_RATES, help="of the grouped layout")
    p.add_argument("--ramp-seconds", type=float, default=30.0)
    p.add_argument("--warmup-seconds", type=float, default=60.0)
    p.add_argument("--step-seconds", type=float, default=30.0, help="measured, per rate step")
    return p.parse_args()


def cpu_at(steps: list[dict], rate: float) -> dict:
    """Each part's CPU per record (meta.json cpu_per_part) in the step at `rate`."""
    for step in steps:
        if step["rate"] == rate and step.get("cpu_per_part"):
            return step["cpu_per_part"]["parts"]
    return {}


def main() -> int:
    args = parse_args()
    unknown = set(args.layouts.split(",")) - set(LAYOUTS)
    if unknown:
        raise SystemExit(f"unknown layouts {sorted(unknown)}; known: {', '.join(LAYOUTS)}")
    tsc_timer.calibrate()
    cores = len(os.sched_getaffinity(0))
    figures = {}
    for name in args.layouts.split(","):
        inputs = vars(args) | ({"data": args.bay_data} if name in BAY_DATA else {})
        if name == "grouped":
            inputs["rates"] = args.grouped_rates
        detectors = DETECTORS.get(name, 6)
        tag = "-" + name.replace("=", "").replace(" ", "-")
        steps = rate_steps(argparse.Namespace(**inputs), LAYOUTS[name], tag, detectors)
        best = sustainable(steps)
        figures[name] = {"steps": steps, "sustainable": best, "per_core": best / cores}
    print(f"\nsustainable rate (p99 ≤ 50 ms, every record accounted), {cores} cores:")
    for name, found in figures.items():
        for step in found["steps"]:
            lat = step["latency"] or {}
            print(
                f"  {name:<8} {step['rate']:>6.0f} rec/s: p50 {lat.get('p50_ms', 0):.2f} ms  "
                f"p99 {lat.get('p99_ms', 0):.2f} ms  exit {step['exit']}"
            )
        if cpu := cpu_at(found["steps"], found["sustainable"]):
            shares = ", ".join(f"{part} {v['per_record_ms']:.3f}" for part, v in cpu.items())
            print(f"  {name:<8} CPU ms per record at {found['sustainable']:g} rec/s: {shares}")
        ratio = found["per_core"] / BLUE_DANUBE_PER_CORE
        print(
            f"  {name:<8} sustains {found['sustainable']:g} rec/s = {found['per_core']:.0f} "
            f"rec/s per core ({ratio:.3f} of Blue Danube's {BLUE_DANUBE_PER_CORE} tuples/s/core)"
        )
    for name, goal in GOALS.items():
        if name in figures:
            best = figures[name]["sustainable"]
            print(
                f"  goal {name} ≥ {goal} rec/s on {cores} cores (measured {best:g}): "
                f"{'met' if best >= goal else 'MISSED'}"
            )
    OUT.mkdir(exist_ok=True)
    doc = {"cores": cores, "layouts": figures, "blue_danube_per_core": BLUE_DANUBE_PER_CORE}
    (OUT / "scale.json").write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
