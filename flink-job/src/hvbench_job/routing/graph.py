"""Directed road graphs: the six-detector freeway graph and the PEMS-BAY sensor graph.

Edge lengths are road distances in metres. A routing heuristic built on great-circle distance
needs the road distance of every edge to be at least the great-circle distance of its ends;
real data breaks that (68 PEMS-BAY edges are up to 1.6% shorter), so each graph carries
`distance_bound`, the largest κ ≤ 1 with κ·great_circle(u, v) ≤ length(u, v) on every edge.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import numpy as np

from hvbench_job import detectors

EARTH_RADIUS_M = 6_371_008.8  # mean radius (IUGG)
# κ is shrunk by this much so rounding in the haversine can never make it too large.
_BOUND_SLACK = 1e-9


def great_circle_m(lat1, lon1, lat2, lon2):
    """Haversine distance in metres; works on floats and on NumPy arrays."""
    p1, p2 = np.radians(lat1), np.radians(lat2)
    dp = p2 - p1
    dl = np.radians(lon2) - np.radians(lon1)
    a = np.sin(dp / 2) ** 2 + np.cos(p1) * np.cos(p2) * np.sin(dl / 2) ** 2
    return 2 * EARTH_RADIUS_M * np.arcsin(np.sqrt(np.minimum(a, 1.0)))


@dataclass
class RoadGraph:
    ids: list[str]
    lat: np.ndarray
    lon: np.ndarray
    # adjacency[u] = [(v, length_m), ...] with node indices
    adjacency: list[list[tuple[int, float]]]
    index: dict[str, int] = field(init=False)
    distance_bound: float = field(init=False)

    def __post_init__(self) -> None:
        self.index = {node: i for i, node in enumerate(self.ids)}
        if len(self.index) != len(self.ids):
            raise ValueError("node ids must be unique")
        self.distance_bound = self._distance_bound()

    @classmethod
    def from_edges(
        cls,
        nodes: Iterable[tuple[str, float, float]],
        edges: Iterable[tuple[str, str, float]],
    ) -> RoadGraph:
        """Nodes as (id, lat, lon); edges as (from, to, length_m). Self loops are dropped."""
        nodes = list(nodes)
        ids = [str(n[0]) for n in nodes]
        index = {node: i for i, node in enumerate(ids)}
        adjacency: list[list[tuple[int, float]]] = [[] for _ in ids]
        for u, v, length in edges:
            u, v, length = str(u), str(v), float(length)
            if u == v:
                continue
            if u not in index or v not in index:
                raise ValueError(f"edge {u}->{v} names an unknown node")
            if not math.isfinite(length) or length < 0:
                raise ValueError(f"edge {u}->{v} has invalid length {length!r}")
            adjacency[index[u]].append((index[v], length))
        lat = np.array([float(n[1]) for n in nodes])
        lon = np.array([float(n[2]) for n in nodes])
        return cls(ids, lat, lon, adjacency)

    @property
    def edge_count(self) -> int:
        return sum(len(a) for a in self.adjacency)

    def edges(self) -> Iterable[tuple[int, int, float]]:
        for u, out in enumerate(self.adjacency):
            for v, length in out:
                yield u, v, length

    def node(self, node_id: str) -> int:
        try:
            return self.index[node_id]
        except KeyError:
            raise KeyError(f"unknown node {node_id!r}") from None

    def great_circle_to(self, target: int) -> np.ndarray:
        """Great-circle distance in metres from every node to `target`."""
        return great_circle_m(self.lat, self.lon, self.lat[target], self.lon[target])

    def _distance_bound(self) -> float:
        edges = np.array([(u, v, length) for u, v, length in self.edges()], dtype=float)
        if len(edges) == 0:
            return 1.0
        u, v, length = edges[:, 0].astype(int), edges[:, 1].astype(int), edges[:, 2]
        gc = great_circle_m(self.lat[u], self.lon[u], self.lat[v], self.lon[v])
        positive = gc > 0
        if not positive.any():
            return 1.0
        ratio = float(np.min(length[positive] / gc[positive]))
        return min(1.0, ratio) * (1.0 - _BOUND_SLACK)


def freeway_graph() -> RoadGraph:
    """The six detectors and the directed freeway links between them."""
    nodes = [(d.key, d.lat, d.lon) for d in detectors.DETECTORS]
    edges = []
    for u, v, _freeway in detectors.FREEWAY_LINKS:
        a, b = detectors.BY_KEY[u], detectors.BY_KEY[v]
        edges.append(
            (u, v, detectors.ROAD_CIRCUITY * float(great_circle_m(a.lat, a.lon, b.lat, b.lon)))
        )
    return RoadGraph.from_edges(nodes, edges)


def bay_graph(directory: Path | str | None = None) -> RoadGraph:
    """The 325-sensor PEMS-BAY graph (DCRNN's files); by default the copy shipped here."""
    base = (
        Path(directory)
        if directory
        else Path(str(resources.files(__package__) / "data" / "pems_bay"))
    )
    with open(base / "graph_sensor_locations_bay.csv", newline="") as f:
        nodes = [(row[0], float(row[1]), float(row[2])) for row in csv.reader(f) if row]
    with open(base / "distances_bay_2017.csv", newline="") as f:
        edges = [(row[0], row[1], float(row[2])) for row in csv.reader(f) if row]
    return RoadGraph.from_edges(nodes, edges)
