"""The router the job uses: detector state in, cheapest route out.

Each node holds its latest measured speed and flow forecast; `observe` turns them into an
expected speed with the traffic model, and `route` runs A* on travel times.

Heuristics (`heuristic=`):
- "distance" (default): h(n) = κ·great_circle(n, destination) / v_max, with v_max the highest
  free-flow speed of any node and κ the graph's distance bound. Every edge costs at least
  length / v_max (speeds are capped at free flow) and length ≥ κ·great_circle, so h never
  exceeds the true remaining cost (admissible), and by the triangle inequality
  h(x) ≤ c(x, y) + h(y) on every edge (consistent), on measured as well as generated data.
- "paper": equation (10) of the reference paper as printed,
  h(n) = min(0, min(dist_n, (70 − v̄_n)·q_n)), with dist_n the great-circle distance to the
  destination in miles, v̄_n the measured speed in mph and q_n the predicted flow. Because
  dist_n ≥ 0 it equals min(0, (70 − v̄_n)·q_n): 0 wherever v̄_n ≤ 70 mph, so A* behaves as
  Dijkstra, and negative where v̄_n > 70 mph (common on real freeways at night). A never-positive
  h is admissible but not consistent in general (h(x) = 0 next to a very negative h(y) breaks
  h(x) ≤ c(x, y) + h(y)); its units (mph·vehicles) are not those of a cost either. Our A*
  re-opens nodes, so the route stays optimal, at the price of extra expansions. Use it only to
  reproduce the paper.
- "none": Dijkstra.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from hvbench_job.routing.astar import Route, astar
from hvbench_job.routing.graph import RoadGraph
from hvbench_job.routing.traffic import MPH_TO_MPS, expected_speed_mph

HEURISTICS = ("distance", "paper", "none")
PAPER_SPEED_MPH = 70.0
METRES_PER_MILE = 1609.344


@dataclass(frozen=True)
class NodeTraffic:
    free_flow_mph: float
    capacity: float  # vehicles per 5 minutes


class Router:
    def __init__(
        self,
        graph: RoadGraph,
        traffic: Sequence[NodeTraffic],
        heuristic: str = "distance",
    ) -> None:
        if heuristic not in HEURISTICS:
            raise ValueError(f"unknown heuristic {heuristic!r}; choose one of {HEURISTICS}")
        if len(traffic) != len(graph.ids):
            raise ValueError("one NodeTraffic per graph node is needed")
        self.graph = graph
        self.traffic = list(traffic)
        self.heuristic = heuristic
        n = len(graph.ids)
        # No observation yet: free flow, and nothing that would make the paper's h negative.
        self.speed_mph = [t.free_flow_mph for t in self.traffic]
        self.measured_mph = [math.nan] * n
        self.predicted_flow = [0.0] * n
        self.pace = [1.0 / (s * MPH_TO_MPS) for s in self.speed_mph]
        self._min_pace = 1.0 / (max(t.free_flow_mph for t in self.traffic) * MPH_TO_MPS)
        self._distance_h: dict[int, list[float]] = {}

    @classmethod
    def for_detectors(cls, heuristic: str = "distance") -> Router:
        """The router over the six-detector freeway network."""
        from hvbench_job import networks  # networks is built on this package

        return cls.for_network(networks.network("freeway"), heuristic)

    @classmethod
    def for_network(cls, network, heuristic: str = "distance") -> Router:
        """The router over a network's graph (hvbench_job.networks.Network), with each
        detector's parameters."""
        traffic = [
            NodeTraffic(d.free_flow_mph, d.capacity_per_5min)
            for d in (network.by_key[k] for k in network.graph.ids)
        ]
        return cls(network.graph, traffic, heuristic)

    def observe(self, node: str, measured_speed_mph: float, predicted_flow: float) -> float:
        """Record a detector's latest speed and forecast; returns its expected speed (mph)."""
        i = self.graph.node(node)
        t = self.traffic[i]
        speed = expected_speed_mph(measured_speed_mph, predicted_flow, t.free_flow_mph, t.capacity)
        self.measured_mph[i] = measured_speed_mph
        self.predicted_flow[i] = predicted_flow
        self.speed_mph[i] = speed
        self.pace[i] = 1.0 / (speed * MPH_TO_MPS)
        return speed

    def route(self, origin: str, destination: str) -> Route:
        o, d = self.graph.node(origin), self.graph.node(destination)
        return astar(self.graph, self.pace, o, d, self.heuristic_values(d))

    def path_ids(self, route: Route) -> list[str]:
        return [self.graph.ids[i] for i in route.path]

    def heuristic_values(self, destination: int) -> list[float] | None:
        if self.heuristic == "none":
            return None
        if self.heuristic == "distance":
            h = self._distance_h.get(destination)
            if h is None:  # geometry only: computed once per destination
                gc = self.graph.great_circle_to(destination)
                h = (gc * (self.graph.distance_bound * self._min_pace)).tolist()
                self._distance_h[destination] = h
            return h
        miles = (self.graph.great_circle_to(destination) / METRES_PER_MILE).tolist()
        # a node with no measured speed yet has no speed term; dist ≥ 0 then makes h = 0
        return [
            min(0.0, min(dist, (PAPER_SPEED_MPH - v) * q)) if math.isfinite(v) else 0.0
            for dist, v, q in zip(miles, self.measured_mph, self.predicted_flow, strict=True)
        ]
