"""A* and Dijkstra over a RoadGraph whose edge costs are travel times.

The cost of edge u→v of length L is L·(pace[u] + pace[v])/2 seconds, where pace is seconds per
metre at each detector: half the link at the upstream detector's expected speed, half at the
downstream one's. Costs are computed during the search, so a new forecast changes routes without
rebuilding anything.

The search keeps no closed set: a node reached again more cheaply is queued again. With a
consistent heuristic (the default) that never happens and every node is expanded at most once;
with a merely admissible one (the paper's option) it keeps the result optimal.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

from hvbench_job.routing.graph import RoadGraph


class NoRoute(LookupError):
    pass


@dataclass(frozen=True)
class Route:
    path: tuple[int, ...]  # node indices, origin first
    cost: float  # seconds
    expanded: int  # nodes taken off the queue and expanded


def astar(
    graph: RoadGraph,
    pace: Sequence[float],
    origin: int,
    destination: int,
    heuristic: Sequence[float] | None = None,
) -> Route:
    """Cheapest route from `origin` to `destination`; `heuristic=None` is Dijkstra.

    `heuristic[n]` estimates the cost from n to the destination. The destination's own value
    is taken as 0, as A* requires.
    """
    adjacency = graph.adjacency
    n = len(adjacency)
    h = heuristic if heuristic is not None else [0.0] * n
    inf = float("inf")
    best = [inf] * n
    parent = [-1] * n
    best[origin] = 0.0
    queue = [(0.0 if origin == destination else h[origin], 0.0, origin)]
    expanded = 0
    while queue:
        _, g, u = heapq.heappop(queue)
        if g > best[u]:
            continue  # stale entry: u was reached more cheaply since
        if u == destination:
            path = [u]
            while u != origin:
                u = parent[u]
                path.append(u)
            return Route(tuple(reversed(path)), g, expanded)
        expanded += 1
        pace_u = pace[u]
        for v, length in adjacency[u]:
            cost = g + length * (pace_u + pace[v]) * 0.5
            if cost < best[v]:
                best[v] = cost
                parent[v] = u
                heapq.heappush(queue, (cost + (0.0 if v == destination else h[v]), cost, v))
    raise NoRoute(f"no route from {graph.ids[origin]} to {graph.ids[destination]}")


def costs_to(graph: RoadGraph, pace: Sequence[float], destination: int) -> list[float]:
    """Exact cheapest cost from every node to `destination` (Dijkstra on reversed edges).

    The perfect heuristic: tests compare heuristics against it.
    """
    n = len(graph.adjacency)
    reverse: list[list[tuple[int, float]]] = [[] for _ in range(n)]
    for u, v, length in graph.edges():
        reverse[v].append((u, length))
    best = [float("inf")] * n
    best[destination] = 0.0
    queue = [(0.0, destination)]
    while queue:
        g, v = heapq.heappop(queue)
        if g > best[v]:
            continue
        for u, length in reverse[v]:
            cost = g + length * (pace[u] + pace[v]) * 0.5
            if cost < best[u]:
                best[u] = cost
                heapq.heappush(queue, (cost, u))
    return best
