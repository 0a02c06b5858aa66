import math
from pathlib import Path

import numpy as np
import pytest
from hvbench_job import detectors
from hvbench_job.routing import (
    NodeTraffic,
    NoRoute,
    RoadGraph,
    Router,
    astar,
    bay_graph,
    costs_to,
    freeway_graph,
    great_circle_m,
)
from hvbench_job.routing.traffic import MIN_SPEED_MPH, expected_speed_mph
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

REL = 1e-9  # rounding allowance when comparing sums of floats
SHARED_GRAPH = Path(__file__).resolve().parents[3] / "shared" / "data" / "sensor_graph"

# ---------------------------------------------------------------- traffic model


@given(
    measured=st.one_of(st.floats(0, 120), st.just(math.nan)),
    flow=st.floats(0, 2000),
    free=st.floats(30, 80),
    capacity=st.floats(50, 1000),
)
def test_expected_speed_is_never_faster_than_free_flow(measured, flow, free, capacity):
    speed = expected_speed_mph(measured, flow, free, capacity)
    assert MIN_SPEED_MPH <= speed <= free or (free < MIN_SPEED_MPH and speed == free)


def test_measured_speed_selects_the_branch_and_the_forecast_places_it():
    free, capacity = 70.0, 600.0
    free_branch = [expected_speed_mph(65, q, free, capacity) for q in (0, 150, 300, 450, 600)]
    jam_branch = [expected_speed_mph(20, q, free, capacity) for q in (0, 150, 300, 450, 600)]
    assert free_branch == sorted(free_branch, reverse=True)  # more flow, slower
    assert jam_branch[1:] == sorted(jam_branch[1:])  # in a jam, more flow means it moves
    assert free_branch[0] == free and jam_branch[0] == MIN_SPEED_MPH
    assert free_branch[-1] == jam_branch[-1] == free / 2  # both meet at capacity
    assert expected_speed_mph(math.nan, 150, free, capacity) == free_branch[1]
    with pytest.raises(ValueError, match="predicted flow"):
        expected_speed_mph(60, math.nan, free, capacity)
    with pytest.raises(ValueError, match="predicted flow"):
        expected_speed_mph(60, -1, free, capacity)


# ---------------------------------------------------------------- freeway graph


def test_freeway_graph_links_the_six_detectors_along_their_freeways():
    graph = freeway_graph()
    assert sorted(graph.ids) == sorted(d.key for d in detectors.DETECTORS)
    assert graph.edge_count == len(detectors.FREEWAY_LINKS) == 6
    for u, v, length in graph.edges():
        gc = great_circle_m(graph.lat[u], graph.lon[u], graph.lat[v], graph.lon[v])
        assert length == pytest.approx(detectors.ROAD_CIRCUITY * gc)
    assert graph.distance_bound == pytest.approx(1.0)


def test_route_el_segundo_to_long_beach_follows_the_forecast():
    router = Router.for_detectors()
    free = router.path_ids(router.route("el_segundo", "long_beach"))
    assert free == ["el_segundo", "wilmington", "long_beach"]  # 405S is shorter
    # Wilmington free-flowing now, but forecast at capacity: the 105/710 detour wins
    router.observe("wilmington", 62.0, 700.0)
    detour = router.path_ids(router.route("el_segundo", "long_beach"))
    assert detour == [
        "el_segundo",
        "athens",
        "lynwood_gardens",
        "east_rancho_dominguez",
        "long_beach",
    ]
    # forecast eases: back to the 405
    router.observe("wilmington", 62.0, 200.0)
    assert router.path_ids(router.route("el_segundo", "long_beach")) == free


def test_origin_and_destination_are_parameters():
    router = Router.for_detectors()
    route = router.route("athens", "long_beach")
    assert router.path_ids(route)[0] == "athens" and router.path_ids(route)[-1] == "long_beach"
    assert router.route("athens", "athens").cost == 0
    with pytest.raises(NoRoute):
        router.route("long_beach", "el_segundo")  # links are one-way, as the freeways' directions
    with pytest.raises(KeyError, match="unknown node 'nowhere'"):
        router.route("nowhere", "long_beach")
    with pytest.raises(ValueError, match="unknown heuristic"):
        Router.for_detectors(heuristic="magic")


# ---------------------------------------------------------------- random graphs


@st.composite
def random_networks(draw):
    """A random road graph with random traffic state and an origin and destination."""
    n = draw(st.integers(2, 18))
    coords = draw(
        st.lists(
            st.tuples(st.floats(33.7, 34.1), st.floats(-118.5, -118.1)), min_size=n, max_size=n
        )
    )
    nodes = [(f"n{i}", lat, lon) for i, (lat, lon) in enumerate(coords)]
    pairs = draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=4 * n))
    edges = []
    for u, v in pairs:
        gc = float(great_circle_m(coords[u][0], coords[u][1], coords[v][0], coords[v][1]))
        # mostly longer than the great circle, sometimes up to 5% shorter as in real data
        edges.append((f"n{u}", f"n{v}", gc * draw(st.floats(0.95, 2.5))))
    traffic = [NodeTraffic(draw(st.floats(45, 75)), draw(st.floats(200, 900))) for _ in range(n)]
    observations = [
        (draw(st.one_of(st.floats(0, 85), st.just(math.nan))), draw(st.floats(0, 1100)))
        for _ in range(n)
    ]
    origin, destination = draw(st.integers(0, n - 1)), draw(st.integers(0, n - 1))
    return RoadGraph.from_edges(nodes, edges), traffic, observations, origin, destination


def observed_router(graph, traffic, observations, heuristic):
    router = Router(graph, traffic, heuristic)
    for node, (speed, flow) in zip(graph.ids, observations, strict=True):
        router.observe(node, speed, flow)
    return router


def assert_admissible_and_consistent(router, destination):
    h = router.heuristic_values(destination)
    exact = costs_to(router.graph, router.pace, destination)
    for node, estimate in enumerate(h):
        if node != destination:
            assert estimate <= exact[node] * (1 + REL)
    for u, v, length in router.graph.edges():
        cost = length * (router.pace[u] + router.pace[v]) / 2
        h_v = 0.0 if v == destination else h[v]
        assert h[u] <= (cost + h_v) * (1 + REL) + 1e-12, f"h inconsistent on edge {u}->{v}"


@settings(max_examples=300, deadline=None)
@given(random_networks())
def test_astar_matches_dijkstra_and_heuristic_is_admissible_and_consistent(network):
    graph, traffic, observations, origin, destination = network
    router = observed_router(graph, traffic, observations, "distance")
    assert_admissible_and_consistent(router, destination)
    exact = costs_to(graph, router.pace, destination)[origin]
    try:
        route = router.route(graph.ids[origin], graph.ids[destination])
    except NoRoute:
        assert math.isinf(exact)
        with pytest.raises(NoRoute):
            astar(graph, router.pace, origin, destination)
        return
    dijkstra = astar(graph, router.pace, origin, destination)
    assert route.cost == pytest.approx(dijkstra.cost, rel=REL)
    assert route.cost == pytest.approx(exact, rel=REL)
    assert route.path[0] == origin and route.path[-1] == destination
    assert route.expanded <= dijkstra.expanded
    # walking the path edge by edge (the cheapest of parallel edges) gives the reported cost
    shortest: dict[tuple[int, int], float] = {}
    for u, v, length in graph.edges():
        shortest[u, v] = min(length, shortest.get((u, v), math.inf))
    walked = sum(
        shortest[u, v] * (router.pace[u] + router.pace[v]) / 2
        for u, v in zip(route.path, route.path[1:], strict=False)
    )
    assert walked == pytest.approx(route.cost, rel=1e-9)


@settings(max_examples=200, deadline=None)
@given(random_networks())
def test_paper_heuristic_is_never_positive_and_still_optimal(network):
    graph, traffic, observations, origin, destination = network
    router = observed_router(graph, traffic, observations, "paper")
    assert all(h <= 0 for h in router.heuristic_values(destination))
    exact = costs_to(graph, router.pace, destination)[origin]
    assume(math.isfinite(exact))
    assert router.route(graph.ids[origin], graph.ids[destination]).cost == pytest.approx(
        exact, rel=REL
    )


def test_paper_heuristic_is_not_consistent_in_general():
    # x → y → goal, y measured above 70 mph with a large forecast: h(y) is very negative
    nodes = [("x", 34.0, -118.3), ("y", 34.0, -118.29), ("goal", 34.0, -118.28)]
    edges = [("x", "y", 1000.0), ("y", "goal", 1000.0)]
    router = Router(RoadGraph.from_edges(nodes, edges), [NodeTraffic(75, 600)] * 3, "paper")
    router.observe("x", 60.0, 100.0)  # v̄ ≤ 70: h(x) = 0
    router.observe("y", 74.0, 100.0)  # h(y) = (70 − 74)·100 = −400
    h = router.heuristic_values(2)
    cost_xy = 1000.0 * (router.pace[0] + router.pace[1]) / 2
    assert h[0] == 0 and h[1] == -400
    assert h[0] > cost_xy + h[1]  # h(x) ≤ c(x, y) + h(y) fails
    assert router.route("x", "goal").cost == pytest.approx(
        costs_to(router.graph, router.pace, 2)[0]
    )


# ---------------------------------------------------------------- PEMS-BAY graph


@pytest.fixture(scope="module")
def bay():
    return bay_graph()


def test_bay_graph_loads_with_its_known_flaw(bay):
    assert len(bay.ids) == 325
    assert bay.edge_count == 8033  # self pairs dropped
    u, v, length = np.array(list(bay.edges())).T
    u, v = u.astype(int), v.astype(int)
    gc = great_circle_m(bay.lat[u], bay.lon[u], bay.lat[v], bay.lon[v])
    assert int((length < gc).sum()) == 68
    assert 0.98 < bay.distance_bound < 1.0
    assert bay.distance_bound <= (length[gc > 0] / gc[gc > 0]).min()


def test_shipped_bay_files_are_the_shared_reference_copy():
    if not SHARED_GRAPH.is_dir():
        pytest.skip("no shared/ reference data beside this checkout")
    shipped = Path(bay_graph.__code__.co_filename).parent / "data" / "pems_bay"
    for name in ("graph_sensor_locations_bay.csv", "distances_bay_2017.csv", "LICENSE"):
        assert (shipped / name).read_bytes() == (SHARED_GRAPH / name).read_bytes()


def free_flow_router(graph, heuristic="distance"):
    return Router(graph, [NodeTraffic(65.0, 600.0)] * len(graph.ids), heuristic)


def test_raw_haversine_would_be_inconsistent_on_bay_but_bounded_one_is_not(bay):
    router = free_flow_router(bay)
    u, v, length = next(
        (u, v, length)
        for u, v, length in bay.edges()
        if length < great_circle_m(bay.lat[u], bay.lon[u], bay.lat[v], bay.lon[v])
    )
    raw = bay.great_circle_to(v) * router._min_pace  # κ = 1
    cost = length * router.pace[u]
    assert raw[u] > cost + 0.0  # the raw heuristic overestimates this edge
    assert_admissible_and_consistent(router, v)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(origin=st.integers(0, 324), destination=st.integers(0, 324), seed=st.integers(0, 2**32 - 1))
def test_astar_on_bay_matches_dijkstra_under_random_traffic(bay, origin, destination, seed):
    rng = np.random.default_rng(seed)
    router = free_flow_router(bay)
    for node in bay.ids:
        router.observe(node, rng.uniform(5, 80), rng.uniform(0, 700))
    assert_admissible_and_consistent(router, destination)
    exact = costs_to(bay, router.pace, destination)[origin]
    assume(math.isfinite(exact))
    route = router.route(bay.ids[origin], bay.ids[destination])
    assert route.cost == pytest.approx(exact, rel=REL)
    assert route.cost == pytest.approx(astar(bay, router.pace, origin, destination).cost, rel=REL)
