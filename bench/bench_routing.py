"""A* route time on the six-detector graph and the 325-node PEMS-BAY graph, next to Dijkstra.

Goal: A* p50 ≤ 1 ms on the Bay graph. Each query is the job's call: `Router.route` with the
current traffic state (heuristic cached per destination, as in the job).
"""

from __future__ import annotations

import numpy as np
from common import report, summary, time_calls
from hvbench_job.routing import NodeTraffic, Router, astar, bay_graph, costs_to


def observed(router: Router, rng: np.random.Generator) -> Router:
    for i, node in enumerate(router.graph.ids):
        t = router.traffic[i]
        router.observe(node, rng.uniform(10, 75), rng.uniform(0, 1.1 * t.capacity))
    return router


def main() -> None:
    rng = np.random.default_rng(3)
    rows, extra = {}, {}

    six = observed(Router.for_detectors(), rng)
    route = lambda: six.route("el_segundo", "long_beach")  # noqa: E731
    rows["6-node A*"] = summary(time_calls(route, 20000, 500))
    es, lb = six.graph.node("el_segundo"), six.graph.node("long_beach")
    rows["6-node Dijkstra"] = summary(
        time_calls(lambda: astar(six.graph, six.pace, es, lb), 20000, 500)
    )

    bay = bay_graph()
    router = observed(Router(bay, [NodeTraffic(65.0, 600.0)] * len(bay.ids)), rng)
    # 2,000 origin–destination pairs that have a route: 200 destinations, 10 origins each
    pairs = []
    for d in rng.permutation(len(bay.ids)):
        reachable = np.flatnonzero(np.isfinite(costs_to(bay, router.pace, int(d))))
        reachable = reachable[reachable != d]
        if len(reachable):
            pairs += [(int(o), int(d)) for o in rng.choice(reachable, 10)]
        if len(pairs) == 2000:
            break
    rng.shuffle(pairs)
    for _, d in pairs:  # the job computes each destination's heuristic once
        router.heuristic_values(d)
    ids = bay.ids
    queue = iter(pairs * 3)
    rows["Bay A*"] = summary(
        time_calls(lambda: router.route(*(ids[i] for i in next(queue))), 4000, 500)
    )
    queue = iter(pairs * 3)
    rows["Bay Dijkstra"] = summary(
        time_calls(lambda: astar(bay, router.pace, *next(queue)), 4000, 500)
    )
    expanded_astar = np.mean([router.route(ids[o], ids[d]).expanded for o, d in pairs[:500]])
    expanded_dijkstra = np.mean([astar(bay, router.pace, o, d).expanded for o, d in pairs[:500]])
    extra["Bay nodes expanded (mean) A* / Dijkstra"] = (
        f"{expanded_astar:.1f} / {expanded_dijkstra:.1f}"
    )
    extra["Bay p50 ratio Dijkstra / A*"] = round(
        rows["Bay Dijkstra"]["p50_us"] / rows["Bay A*"]["p50_us"], 1
    )
    extra["6-node p50 ratio Dijkstra / A*"] = round(
        rows["6-node Dijkstra"]["p50_us"] / rows["6-node A*"]["p50_us"], 2
    )
    report("routing", rows, [("Bay A* p50 <= 1000 us", rows["Bay A*"]["p50_us"] <= 1000)], extra)


if __name__ == "__main__":
    main()
