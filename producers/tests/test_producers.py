import json

import numpy as np
import pytest
from confluent_kafka import KafkaException
from hvbench_job import clients, detectors, networks
from hvbench_job.records import RecordError, parse
from hvbench_load.consumer import Receiver, results_of
from hvbench_load.producers import (
    MALFORMED_KINDS,
    load_windows,
    malformed_record,
    per_detector_counts,
    rounds,
    schedule,
    schedule_each,
    send_offset_ns,
    sources_of,
    topic_partitions,
)


def test_records_are_split_evenly_over_the_detectors():
    keys = [d.key for d in detectors.DETECTORS]
    counts = per_detector_counts(20_000, keys)
    assert sum(counts.values()) == 20_000
    assert sorted(set(counts.values())) == [3333, 3334]
    assert per_detector_counts(5, keys)[keys[-1]] == 0


def test_without_a_ramp_records_are_one_period_apart():
    assert [send_offset_ns(i, 100) for i in range(4)] == [0, 100, 200, 300]


def test_a_ramp_rises_from_a_tenth_to_the_full_rate_and_then_holds():
    period, ramp = 1_000_000, 1_000_000_000  # 1 ms at full rate, 1 s ramp
    offsets = np.array([send_offset_ns(i, period, ramp) for i in range(2_000)])
    gaps = np.diff(offsets)
    assert offsets[0] == 0 and (gaps > 0).all()
    assert gaps[0] == pytest.approx(10 * period, rel=0.05)  # a tenth of the rate at first
    # the ramp holds (1 + 0.1) / 2 × 1000 = 550 records, then the full rate without a jump
    assert offsets[550] == pytest.approx(ramp, abs=period)
    assert (gaps[551:] == period).all()
    assert gaps[540:550] == pytest.approx([period] * 10, rel=0.02)
    # the rate is linear in time on the ramp: halfway through it runs at 55 %
    halfway = np.searchsorted(offsets, ramp // 2)
    assert gaps[halfway] == pytest.approx(period / 0.55, rel=0.02)


@pytest.mark.parametrize("i", range(len(MALFORMED_KINDS)))
def test_every_injected_malformed_record_is_refused_by_the_job(i):
    text = malformed_record("run-7", i)
    assert f"run-7:malformed-{i}" in text
    assert len(text.encode()) < 1_000_000  # what the producer's client accepts
    with pytest.raises(RecordError):
        parse(text)


def test_the_oversized_kind_is_close_to_the_topics_limit():
    text = malformed_record("r", MALFORMED_KINDS.index("oversized"))
    assert 790_000 < len(text.encode()) < 1_000_000


def test_windows_come_from_the_data_and_skip_missing_values(small_data):
    data_dir, _ = small_data
    windows = load_windows(data_dir)
    assert set(windows) == {d.key for d in detectors.DETECTORS}
    for w in windows.values():
        assert w.flows.shape[1] == 12 and len(w.flows) == len(w.speed) > 100
        flows, speed = w.record(len(w.flows) + 1)  # wraps around
        assert flows == w.flows[1].tolist() and speed == w.speed[1]
        record = {
            "run": "r",
            "detector": w.detector,
            "seq": 0,
            "speed_mph": speed,
            "flows": flows,
            "intended_ns": 0,
            "sent_ns": 0,
        }
        parse(json.dumps(record))


def test_freeway_sources_send_the_studys_records_without_a_destination(small_data):
    net = networks.network("freeway")
    sources = sources_of(net, load_windows(small_data[0]), 20, 600, partitions=6)
    assert [s.log.detector for s in sources] == [d.key for d in net.detectors]
    assert [s.offset_ns for s in sources] == [0, 100, 200, 300, 400, 500]
    assert [s.partition for s in sources] == list(range(6))
    assert [s.count for s in sources] == [4, 4, 3, 3, 3, 3]
    record = json.loads(sources[0].record("r", 0, 5, 6))
    assert "destination" not in record and parse(json.dumps(record)).detector == "el_segundo"


def test_a_group_sends_its_detectors_records_in_the_order_they_fall_due(small_data):
    net = networks.network("freeway")
    sources = sources_of(net, load_windows(small_data[0]), 20, 600, partitions=4)
    group = sources[1::3]  # detectors 1 and 4, as the producers deal them to three groups
    order = [(seq, s.log.detector) for seq, s in schedule(group)]
    w, g = "wilmington", "lynwood_gardens"  # four records and three
    assert order == [(0, w), (0, g), (1, w), (1, g), (2, w), (2, g), (3, w)]
    due = [s.offset_ns + send_offset_ns(seq, 600) for seq, s in schedule(group)]
    assert due == sorted(due)
    assert [s.partition for s in sources] == [0, 1, 2, 3, 0, 1]


def test_bay_records_each_go_to_a_sensor_their_own_can_reach(bay_data):
    net = networks.network("bay")
    windows = load_windows(bay_data[0], "bay")
    assert len(windows) == 325
    sources = sources_of(net, windows, 650, 100_000_000, partitions=6)
    assert sum(s.count for s in sources) == 650 and {s.count for s in sources} == {2}
    for source in sources[:40]:
        reach = set(net.reachable(source.log.detector))
        for seq in range(3):
            record = parse(source.record("r", seq, 1, 2), "bay")
            assert record.destination in reach and record.detector == source.log.detector
    # seeded by sensor: the same destinations in every run
    first, again = (sources_of(net, windows, 650, 10**8, partitions=6)[300] for _ in range(2))
    assert [first.record("r", i, 1, 2) for i in range(3)] == [
        again.record("r", i, 1, 2) for i in range(3)
    ]


def test_grouped_detectors_share_their_groups_place_and_go_out_as_one_round(small_data):
    """--messages group: detector j reports with group j mod G, all at the group's offset,
    so each round of a group is one message of the records due at that instant."""
    net = networks.network("freeway")
    sources = sources_of(net, load_windows(small_data[0]), 20, 600, partitions=6, groups=2)
    assert [s.offset_ns for s in sources] == [0, 300, 0, 300, 0, 300]
    group = sources[0::2]  # detectors 0, 2 and 4: four, three and three records
    got = [(seq, [s.log.detector for s in due]) for seq, due in rounds(group)]
    keys = [s.log.detector for s in group]
    assert got == [(0, keys), (1, keys), (2, keys), (3, keys[:1])]
    # one record a message: the schedule itself, one source at a time
    assert [(seq, due) for seq, due in schedule_each(group)] == [
        (seq, [s]) for seq, s in schedule(group)
    ]


def test_the_consumer_takes_each_result_of_an_array_message():
    one = b'{"run":"r","detector":"athens","seq":1}'
    assert results_of(one) == [one]
    both = b'[{"run":"r","detector":"athens","seq":1},{"run":"r","detector":"long_beach","seq":2}]'
    assert [json.loads(r)["seq"] for r in results_of(both)] == [1, 2]
    assert results_of(b"[not json") == [b"[not json"]  # one foreign value, not lost


def test_client_pairs_split_the_detectors_and_their_records_exactly_once():
    """Each pair's consumer waits for its own groups' detectors only (group g to pair g mod
    CLIENTS); over the pairs, every detector and every record once."""
    keys = [d.key for d in networks.network("bay").detectors]
    receivers = [
        Receiver("127.0.0.1:1", ["output"], "g", "r1", 20_000, "bay", (6, 4, pair))
        for pair in range(4)
    ]
    assert sum(r.expected for r in receivers) == 20_000
    assert sorted(k for r in receivers for k in r.due) == sorted(keys)
    by_detector = clients.clients_by_detector(keys, 6, 4)
    for pair, receiver in enumerate(receivers):
        assert all(by_detector[k] == pair for k in receiver.due)
        assert all(keys.index(k) % 6 % 4 == pair for k in receiver.due)  # group j mod 6
    assert [clients.output_topic(k) for k in range(3)] == ["output", "output-1", "output-2"]
    for r in receivers:
        r.close()


def test_the_partition_count_is_asked_again_until_the_broker_answers(monkeypatch):
    """A broker that is away (restarting) is asked again; past the wait, its error is raised."""
    from types import SimpleNamespace

    from hvbench_load import producers

    answers = [KafkaException("away"), KafkaException("away"), None]

    class Restarting:
        def __init__(self, _config):
            pass

        def list_topics(self, topic, timeout):
            if (answer := answers.pop(0)) is not None:
                raise answer
            return SimpleNamespace(topics={topic: SimpleNamespace(partitions={0: 0, 1: 1})})

    monkeypatch.setattr(producers, "Producer", Restarting)
    monkeypatch.setattr(producers.time, "sleep", lambda _s: None)
    assert topic_partitions("broker:9092", "input") == 2 and answers == []
    monkeypatch.undo()
    with pytest.raises(KafkaException):  # nothing listens there, and no wait is left
        topic_partitions("127.0.0.1:1", "input", wait_s=0, attempt_s=0.5)
