"""The road networks a run can use: their detectors, road graph and default route.

- `freeway`: the reference study's six detectors and the freeway links between them
  (`hvbench_job.detectors`), PeMS district 7.
- `bay`: the 325 sensors of PEMS-BAY and DCRNN's road distances between them (the files in
  routing/data/pems_bay), PeMS district 4, for city-scale loads.

DCRNN's files give each sensor's id and position only. What the generator and the router need
beyond that is ours, drawn once per sensor from a seeded generator (`_bay_detector`): lane count,
free-flow speed, per-lane capacity and the sizes of the two daily peaks. The direction of travel
is the compass point of the bearing to the sensor's nearest downstream neighbour; the freeway
number is not in the files and is written as 0.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import numpy as np

from hvbench_job import detectors
from hvbench_job.detectors import Detector
from hvbench_job.routing.graph import RoadGraph, bay_graph, freeway_graph

NAMES = ("freeway", "bay")
BAY_SEED = 2017  # the draws of each bay sensor's parameters; fixed, so the network is fixed
# The freeway detectors' peak sizes (share of capacity added at the peak): (morning, evening).
FREEWAY_PEAKS = {
    "el_segundo": (0.62, 0.50),
    "wilmington": (0.42, 0.60),
    "long_beach": (0.52, 0.62),
    "athens": (0.60, 0.42),
    "lynwood_gardens": (0.48, 0.60),
    "east_rancho_dominguez": (0.50, 0.45),
}
# The two bay sensors farthest apart (26.6 km) with a route from the first to the second.
BAY_ORIGIN, BAY_DESTINATION = "400519", "401507"


@dataclass(frozen=True)
class Network:
    name: str
    district: int  # the PeMS district the generator writes
    detectors: tuple[Detector, ...]
    peaks: dict[str, tuple[float, float]]  # by detector key: (morning, evening)
    graph: RoadGraph
    origin: str  # the route of a record that names no destination
    destination: str
    record_destinations: bool  # the producers give each record a destination of its own
    by_key: dict[str, Detector] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "by_key", {d.key: d for d in self.detectors})

    def detector(self, key: str) -> Detector:
        try:
            return self.by_key[key]
        except KeyError:
            raise KeyError(f"unknown detector {key!r} in the {self.name} network") from None

    def reachable(self, origin: str) -> list[str]:
        """The detectors a route from `origin` can reach, itself excluded, in the network's
        order; [origin] when no other is."""
        seen = _reach(self.graph, self.graph.node(origin))
        others = [self.graph.ids[i] for i in sorted(seen) if self.graph.ids[i] != origin]
        return others or [origin]


def network(name: str) -> Network:
    """The network called `name`; ValueError naming the known ones otherwise."""
    if name == "freeway":
        return _freeway()
    if name == "bay":
        return _bay()
    raise ValueError(f"unknown network {name!r}; known: {', '.join(NAMES)}")


@functools.cache
def _freeway() -> Network:
    return Network(
        "freeway",
        7,
        detectors.DETECTORS,
        FREEWAY_PEAKS,
        freeway_graph(),
        detectors.DEFAULT_ORIGIN,
        detectors.DEFAULT_DESTINATION,
        record_destinations=False,
    )


@functools.cache
def _bay() -> Network:
    graph = bay_graph()
    upstream: list[list[int]] = [[] for _ in graph.ids]
    for u, v, _ in graph.edges():
        upstream[v].append(u)
    sensors = tuple(_bay_detector(graph, i, upstream[i]) for i in range(len(graph.ids)))
    peaks = {}
    for d in sensors:
        rng = np.random.default_rng([BAY_SEED, d.station, 1])
        peaks[d.key] = (round(float(rng.uniform(0.40, 0.65)), 2),
                        round(float(rng.uniform(0.40, 0.65)), 2))  # fmt: skip
    return Network("bay", 4, sensors, peaks, graph, BAY_ORIGIN, BAY_DESTINATION, True)


def _bay_detector(graph: RoadGraph, i: int, upstream: list[int]) -> Detector:
    key = graph.ids[i]
    rng = np.random.default_rng([BAY_SEED, int(key)])
    return Detector(
        key,
        f"PEMS-BAY sensor {key}",
        (f"0{_direction(graph, i, upstream)}",),
        float(graph.lat[i]),
        float(graph.lon[i]),
        int(key),
        int(rng.integers(3, 6)),  # 3 to 5 lanes
        round(float(rng.uniform(63.0, 70.0)), 1),
        round(float(rng.uniform(1900.0, 2150.0)), -1),
    )


def _direction(graph: RoadGraph, i: int, upstream: list[int]) -> str:
    """N, E, S or W: the bearing to the nearest sensor downstream; without one, from the
    nearest upstream; without either, to the nearest sensor at all."""
    downstream = [v for v, _ in graph.adjacency[i] if v != i]
    upstream = [u for u in upstream if u != i]
    if downstream:
        j, towards = _nearest(graph, i, downstream), True
    elif upstream:
        j, towards = _nearest(graph, i, upstream), False
    else:
        j, towards = _nearest(graph, i, [k for k in range(len(graph.ids)) if k != i]), True
    a, b = (i, j) if towards else (j, i)
    north = graph.lat[b] - graph.lat[a]
    east = (graph.lon[b] - graph.lon[a]) * math.cos(math.radians(graph.lat[a]))
    bearing = math.degrees(math.atan2(east, north)) % 360
    return "NESW"[int((bearing + 45) // 90) % 4]


def _nearest(graph: RoadGraph, i: int, candidates: list[int]) -> int:
    distance = graph.great_circle_to(i)
    return min(candidates, key=lambda k: (distance[k], k))


def _reach(graph: RoadGraph, start: int) -> set[int]:
    seen, stack = {start}, [start]
    while stack:
        for v, _ in graph.adjacency[stack.pop()]:
            if v not in seen:
                seen.add(v)
                stack.append(v)
    return seen
