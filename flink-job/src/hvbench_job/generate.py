"""Generate realistic traffic data in the exact PeMS station 5-minute layout.

For the detectors of a network (`hvbench_job.networks`: the six freeway detectors by default,
or the 325 PEMS-BAY sensors), one gzip file per day (named like PeMS's own
`d07_text_station_5min_YYYY_MM_DD.txt.gz`, with the network's district). The model, per
detector:
- demand as a share of capacity: weekday morning and evening peaks of detector-specific size,
  a midday plateau and a low night; weekends lower with one broad afternoon peak; a day-to-day
  factor and slowly varying noise;
- Greenshields' speed–flow relation (see routing/traffic.py): free-flowing speeds fall as flow
  approaches capacity; when demand exceeds capacity a queue forms and the detector switches to
  the congested branch (low speed, flow below capacity) until demand falls well below
  capacity; occasional incidents congest it off-peak too;
- noise on flow and speed, per-lane splits, occupancy from density;
- occasional rows with missing values (% Observed 0, empty measurements) and detector outages
  (rows absent for one to four hours), both listed in the returned summary.
The same seed gives the same files byte for byte.
"""

from __future__ import annotations

import argparse
import gzip
import json
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from pathlib import Path

import numpy as np

from hvbench_job import networks
from hvbench_job.detectors import Detector
from hvbench_job.networks import Network
from hvbench_job.routing.traffic import greenshields_flow

STEPS_PER_DAY = 288
STATION_LENGTH_MI = 0.5
SAMPLES_PER_LANE = 10  # one sample per 30 s
VEHICLE_LENGTH_FT = 22.0  # effective length seen by a loop detector
MISSING_ROW_PROBABILITY = 0.003
OUTAGES_PER_MONTH = 1.5
INCIDENTS_PER_WEEK = 1.0
SHOWN_STATIONS = 10  # printed at the end; generated.json lists them all


@dataclass
class Summary:
    files: list[str] = field(default_factory=list)
    rows: int = 0
    missing_rows: dict[int, int] = field(default_factory=dict)  # station -> rows with no data
    outages: dict[int, list[tuple[str, int]]] = field(default_factory=dict)  # start, intervals
    congested_share: dict[int, float] = field(default_factory=dict)


def gaussian(x: np.ndarray, centre: float, width: float) -> np.ndarray:
    return np.exp(-0.5 * ((x - centre) / width) ** 2)


def demand_share(
    d: Detector, peaks: tuple[float, float], start: date, days: int, rng: np.random.Generator
) -> np.ndarray:
    """Demand as a share of capacity for every 5-minute interval; `peaks` is the share added
    at the morning and at the evening peak."""
    t = np.arange(days * STEPS_PER_DAY)
    hour = (t % STEPS_PER_DAY) / 12.0
    weekday = np.array([(start + timedelta(days=int(i))).weekday() < 5 for i in t // STEPS_PER_DAY])
    morning, evening = peaks
    workday = (
        0.06
        + 0.55 * gaussian(hour, 13.0, 4.5)
        + morning * gaussian(hour, 7.6, 1.0)
        + evening * gaussian(hour, 17.3, 1.3)
        - 0.05 * gaussian(hour, 3.5, 1.5)
    )
    weekend = 0.06 + 0.60 * gaussian(hour, 14.0, 3.8) - 0.04 * gaussian(hour, 4.0, 1.5)
    share = np.where(weekday, workday, weekend)
    share *= np.repeat(rng.normal(1.0, 0.04, days), STEPS_PER_DAY)  # day-to-day factor
    # slowly varying fluctuation: AR(1) with a time constant of about an hour
    noise = np.empty(len(t))
    level = 0.0
    shocks = rng.normal(0.0, 0.012, len(t))
    for i, shock in enumerate(shocks):
        level = 0.92 * level + shock
        noise[i] = level
    return np.clip(share + noise, 0.02, None)


def simulate(
    d: Detector, peaks: tuple[float, float], start: date, days: int, rng: np.random.Generator
):
    """Total flow (veh/5 min), average speed (mph) and a congestion flag per interval."""
    demand = demand_share(d, peaks, start, days, rng)
    n = len(demand)
    capacity = d.capacity_per_5min
    incident = np.zeros(n, dtype=bool)
    for _ in range(rng.poisson(INCIDENTS_PER_WEEK * days / 7)):
        begin = int(rng.integers(0, n))
        incident[begin : begin + int(rng.integers(6, 19))] = True  # 30–90 minutes
    flow = np.empty(n)
    speed = np.empty(n)
    congested = np.zeros(n, dtype=bool)
    queue_speed = 0.0
    jammed = False
    threshold = rng.uniform(0.90, 0.98)  # where this bottleneck breaks down
    for i in range(n):
        if not jammed and (demand[i] > threshold or incident[i]):
            jammed = True
            queue_speed = d.free_flow_mph * rng.uniform(0.25, 0.45)
        elif jammed and demand[i] < 0.75 and not incident[i]:
            jammed = False
        if jammed:
            queue_speed = np.clip(
                queue_speed + rng.normal(0.0, 1.5), 0.12 * d.free_flow_mph, 0.48 * d.free_flow_mph
            )
            speed[i] = queue_speed
            flow[i] = greenshields_flow(queue_speed, d.free_flow_mph, capacity)
            congested[i] = True
        else:
            q = min(demand[i], 0.99) * capacity
            flow[i] = q
            speed[i] = d.free_flow_mph / 2 * (1 + np.sqrt(1 - q / capacity))
    flow = np.maximum(0.0, flow * rng.normal(1.0, 0.04, n) + rng.normal(0.0, 2.0, n))
    speed = np.clip(speed + rng.normal(0.0, 1.2, n), 3.0, d.free_flow_mph + 4.0)
    return np.round(flow), np.round(speed, 1), congested


def _lane_fields(d: Detector, flow: float, speed: float, rng: np.random.Generator) -> list[str]:
    """Five fields per lane: Samples, Flow, Avg Occ, Avg Speed, Observed."""
    shares = rng.dirichlet(np.linspace(1.4, 0.8, d.lanes) * 40)
    lane_flows = np.round(flow * shares)
    offsets = np.linspace(2.5, -2.5, d.lanes)  # inner lanes are faster
    fields = []
    for lane_flow, offset in zip(lane_flows, offsets, strict=True):
        lane_speed = max(3.0, speed + offset + rng.normal(0.0, 0.8))
        occupancy = _occupancy(lane_flow, lane_speed, 1)
        fields += [
            str(SAMPLES_PER_LANE),
            f"{lane_flow:.0f}",
            f"{occupancy:.4f}",
            f"{lane_speed:.1f}",
            "1",
        ]
    return fields


def _occupancy(flow_5min: float, speed_mph: float, lanes: int) -> float:
    density_per_mile = flow_5min * 12.0 / lanes / max(speed_mph, 1.0)
    return min(1.0, density_per_mile * VEHICLE_LENGTH_FT / 5280.0)


def generate(
    out: Path | str, start: date, days: int, seed: int, network: str = "freeway"
) -> Summary:
    net = networks.network(network)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    summary = Summary()
    n = days * STEPS_PER_DAY
    series = {}
    for d in net.detectors:
        rng = np.random.default_rng([seed, d.station])  # one stream per detector
        flow, speed, congested = simulate(d, net.peaks[d.key], start, days, rng)
        present = np.ones(n, dtype=bool)
        outages = []
        for _ in range(rng.poisson(OUTAGES_PER_MONTH * days / 30)):
            begin, length = int(rng.integers(0, n)), int(rng.integers(12, 49))
            present[begin : begin + length] = False
        # list outages as the runs of absent intervals they make (they may overlap)
        absent = np.flatnonzero(~present)
        if len(absent):
            runs = np.split(absent, np.flatnonzero(np.diff(absent) > 1) + 1)
            outages = [(_time(start, int(r[0])).isoformat(), len(r)) for r in runs]
        missing = (rng.random(n) < MISSING_ROW_PROBABILITY) & present
        series[d.key] = (flow, speed, present, missing, rng)
        summary.outages[d.station] = outages
        summary.missing_rows[d.station] = int(missing.sum())
        summary.congested_share[d.station] = round(float(congested.mean()), 4)
    for day in range(days):
        when = start + timedelta(days=day)
        path = out / f"d{net.district:02d}_text_station_5min_{when:%Y_%m_%d}.txt.gz"
        lines = []
        for step in range(day * STEPS_PER_DAY, (day + 1) * STEPS_PER_DAY):
            stamp = _time(start, step).strftime("%m/%d/%Y %H:%M:%S")
            for d in net.detectors:
                flow, speed, present, missing, rng = series[d.key]
                if not present[step]:
                    continue
                row = _row(net, d, stamp, flow[step], speed[step], missing[step], rng)
                lines.append(",".join(row))
        # mtime=0 keeps the gzip bytes identical from run to run
        with open(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as f:
            f.write(("\n".join(lines) + "\n").encode("ascii"))
        summary.files.append(path.name)
        summary.rows += len(lines)
    # what was generated, for whoever reads the data (the harness checks the network)
    described = {"seed": seed, "start": start.isoformat(), "days": days, "network": net.name}
    record = json.dumps({**described, **summary.__dict__}, indent=1)
    (out / "generated.json").write_text(record + "\n")
    return summary


def _row(
    net: Network, d: Detector, stamp: str, flow: float, speed: float, missing: bool, rng
) -> list[str]:
    head = [
        stamp,
        str(d.station),
        str(net.district),
        str(d.freeway),
        d.direction,
        "ML",
        f"{STATION_LENGTH_MI:.3f}",
    ]
    if missing:
        return [*head, "0", "0", "", "", "", *([""] * 5 * d.lanes)]
    occupancy = _occupancy(flow, speed, d.lanes)
    return [
        *head,
        str(SAMPLES_PER_LANE * d.lanes),
        "100",
        f"{flow:.0f}",
        f"{occupancy:.4f}",
        f"{speed:.1f}",
        *_lane_fields(d, flow, speed, rng),
    ]


def _time(start: date, step: int) -> datetime:
    return datetime(start.year, start.month, start.day) + timedelta(minutes=5 * step)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="data/pems", help="output directory")
    parser.add_argument("--start", default="2024-03-01", type=date.fromisoformat, help="first day")
    parser.add_argument("--days", default=30, type=int, help="number of days")
    parser.add_argument("--seed", default=42, type=int)
    parser.add_argument("--network", default="freeway", choices=networks.NAMES)
    args = parser.parse_args(argv)
    if args.days < 1:
        parser.error("--days must be at least 1")
    summary = generate(args.out, args.start, args.days, args.seed, args.network)
    print(f"wrote {len(summary.files)} files, {summary.rows} rows to {args.out}")
    shares = list(summary.congested_share.items())
    for station, share in shares[:SHOWN_STATIONS]:
        print(
            f"  station {station}: congested {share:.1%}, rows without data "
            f"{summary.missing_rows[station]}, outages {len(summary.outages[station])}"
        )
    if len(shares) > SHOWN_STATIONS:
        print(f"  ... and {len(shares) - SHOWN_STATIONS} more stations (generated.json)")


if __name__ == "__main__":
    main()
