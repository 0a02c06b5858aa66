import json

import numpy as np
import pytest
from hvbench_job import detectors
from hvbench_job.records import RecordError, parse
from hvbench_load.producers import (
    MALFORMED_KINDS,
    load_windows,
    malformed_record,
    per_detector_counts,
    send_offset_ns,
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
