import json

import pytest
from hvbench_job import detectors
from hvbench_job.records import RecordError, parse
from hvbench_load.producers import (
    MALFORMED_KINDS,
    load_windows,
    malformed_record,
    per_detector_counts,
)


def test_records_are_split_evenly_over_the_detectors():
    keys = [d.key for d in detectors.DETECTORS]
    counts = per_detector_counts(20_000, keys)
    assert sum(counts.values()) == 20_000
    assert sorted(set(counts.values())) == [3333, 3334]
    assert per_detector_counts(5, keys)[keys[-1]] == 0


@pytest.mark.parametrize("i", range(len(MALFORMED_KINDS)))
def test_every_injected_malformed_record_is_refused_by_the_job(i):
    text = malformed_record(i)
    assert f"malformed-{i}" in text
    with pytest.raises(RecordError):
        parse(text)


def test_windows_come_from_the_data_and_skip_missing_values(small_data):
    data_dir, _ = small_data
    windows = load_windows(data_dir)
    assert set(windows) == {d.key for d in detectors.DETECTORS}
    for w in windows.values():
        assert w.flows.shape[1] == 12 and len(w.flows) == len(w.speed) > 100
        flows, speed = w.record(len(w.flows) + 1)  # wraps around
        assert flows == w.flows[1].tolist() and speed == w.speed[1]
        record = {
            "detector": w.detector,
            "seq": 0,
            "speed_mph": speed,
            "flows": flows,
            "intended_ns": 0,
            "sent_ns": 0,
        }
        parse(json.dumps(record))
