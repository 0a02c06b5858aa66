"""Routing: road graphs, the traffic model and A*."""

from hvbench_job.routing.astar import NoRoute, Route, astar, costs_to
from hvbench_job.routing.graph import RoadGraph, bay_graph, freeway_graph, great_circle_m
from hvbench_job.routing.router import HEURISTICS, NodeTraffic, Router

__all__ = [
    "HEURISTICS",
    "NoRoute",
    "NodeTraffic",
    "RoadGraph",
    "Route",
    "Router",
    "astar",
    "bay_graph",
    "costs_to",
    "freeway_graph",
    "great_circle_m",
]
