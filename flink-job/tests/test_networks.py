import json
import math

import pytest
from hvbench_job import detectors, networks, pems
from hvbench_job.pipeline import Pipeline
from hvbench_job.records import InputRecord, RecordError, parse
from hvbench_job.routing.graph import bay_graph

FLOWS = tuple(float(300 + i) for i in range(12))


def test_the_freeway_network_is_the_studys_six_detectors():
    net = networks.network("freeway")
    assert net.detectors == detectors.DETECTORS and net.district == 7
    assert (net.origin, net.destination) == (
        detectors.DEFAULT_ORIGIN,
        detectors.DEFAULT_DESTINATION,
    )
    assert not net.record_destinations


def test_an_unknown_network_is_refused_with_the_known_ones():
    with pytest.raises(ValueError, match="unknown network 'city'; known: freeway, bay"):
        networks.network("city")


def test_the_bay_network_has_every_pems_bay_sensor_with_plausible_parameters():
    net = networks.network("bay")
    graph = bay_graph()
    assert [d.key for d in net.detectors] == graph.ids and len(net.detectors) == 325
    assert len({d.station for d in net.detectors}) == 325 and net.district == 4
    for d in net.detectors:
        assert d.station == int(d.key) and d.freeway == 0 and d.direction in "NESW"
        assert 3 <= d.lanes <= 5 and 63 <= d.free_flow_mph <= 70
        assert 1900 <= d.capacity_vphpl <= 2150
        assert all(0.40 <= p <= 0.65 for p in net.peaks[d.key])
    # drawn from a fixed seed: built again, the same
    assert networks._bay.__wrapped__().detectors == net.detectors


def test_a_sensors_direction_is_the_bearing_to_its_nearest_downstream_one():
    net = networks.network("bay")
    graph = net.graph
    for key in ("400001", "400017", "401507"):
        i = graph.node(key)
        if not graph.adjacency[i]:
            continue
        distance = graph.great_circle_to(i)
        j = min((v for v, _ in graph.adjacency[i]), key=lambda v: (distance[v], v))
        north = graph.lat[j] - graph.lat[i]
        east = (graph.lon[j] - graph.lon[i]) * math.cos(math.radians(graph.lat[i]))
        expected = (
            ("N" if north > 0 else "S") if abs(north) >= abs(east) else ("E" if east > 0 else "W")
        )
        assert net.by_key[key].direction == expected


def test_reachable_sensors_exclude_the_origin_and_include_the_default_destination():
    net = networks.network("bay")
    reach = net.reachable(net.origin)
    assert net.destination in reach and net.origin not in reach
    isolated = no_way_out(net)
    assert net.reachable(isolated) == [isolated]


def no_way_out(net) -> str:
    """A sensor with no road out of it."""
    return next(k for k in net.graph.ids if not net.graph.adjacency[net.graph.node(k)])


def bay_record(detector: str, destination: str | None) -> str:
    return InputRecord("r", detector, 1, 55.0, FLOWS, 1, 2, destination).to_json()


def test_records_name_detectors_and_destinations_of_their_network():
    record = parse(bay_record("400001", "400017"), "bay")
    assert (record.detector, record.destination) == ("400001", "400017")
    assert parse(bay_record("400001", None), "bay").destination is None
    with pytest.raises(RecordError, match="unknown detector '400001'"):
        parse(bay_record("400001", None))  # a bay sensor in a freeway run
    with pytest.raises(RecordError, match="unknown destination 'athens'"):
        parse(bay_record("400001", "athens"), "bay")
    with pytest.raises(RecordError, match="unknown destination 17"):
        parse(bay_record("400001", None)[:-1] + ',"destination":17}', "bay")


def test_a_bay_pipeline_routes_each_record_to_its_own_destination(small_model):
    pipeline = Pipeline(small_model, network="bay")
    net = networks.network("bay")
    origin = next(k for k in net.graph.ids if len(net.reachable(k)) > 100)
    distance = net.graph.great_circle_to(net.graph.node(origin))
    destination = max(net.reachable(origin), key=lambda k: distance[net.graph.node(k)])
    out = json.loads(pipeline.process(bay_record(origin, destination)).output)
    assert out["route"][0] == origin and out["route"][-1] == destination
    assert out["route_cost_s"] > 0
    default = json.loads(pipeline.process(bay_record(origin, None)).output)
    assert (default["route"][0], default["route"][-1]) == (net.origin, net.destination)


def test_a_destination_out_of_reach_is_dead_lettered_with_its_reason(small_model):
    pipeline = Pipeline(small_model, network="bay")
    net = networks.network("bay")
    isolated = no_way_out(net)
    outcome = pipeline.process(bay_record(isolated, net.destination))
    letter = json.loads(outcome.dead_letter)
    assert outcome.output is None and letter["reason"].startswith(f"no route from {isolated}")
    assert letter["key"] == {"run": "r", "detector": isolated, "seq": 1, "sent_ns": 2}
    assert pipeline.refused == 1


def test_generated_bay_data_is_pems_layout_for_every_sensor(bay_data):
    data_dir, summary = bay_data
    assert summary.files == ["d04_text_station_5min_2024_03_04.txt.gz"]
    data = pems.load(data_dir)
    assert len(data.stations) == 325
    assert set(data.frame["district"]) == {4} and set(data.frame["freeway"]) == {0}
