import os
import struct

import pytest
from hvbench_agent import tuning


def test_cpu_latency_values():
    assert tuning.parse_cpu_latency("auto") == "auto"
    assert tuning.parse_cpu_latency("off") is None
    assert tuning.parse_cpu_latency("20") == 20
    for bad, says in (("-1", "≥ 0"), ("fast", "auto, off or microseconds")):
        with pytest.raises(tuning.TuningError, match=says):
            tuning.parse_cpu_latency(bad)


def test_held_value_is_written_and_read_back(tmp_path):
    device = tmp_path / "cpu_dma_latency"  # a plain file takes the same 4 bytes
    device.write_bytes(struct.pack("i", 2_000_000_000))
    with tuning.CpuLatency(0, device) as held:
        assert held.describe() == {
            "requested": 0,
            "held": True,
            "not_held_because": None,
            "readback_us": 0,
        }
    assert held.fd is None  # closed: the kernel drops the request with the file


def test_explicit_value_is_refused_where_it_cannot_be_held(tmp_path):
    missing = tmp_path / "none"
    with pytest.raises(tuning.TuningError, match="CPU_LATENCY=off"):
        tuning.CpuLatency(0, missing).check()
    with pytest.raises(tuning.TuningError, match="cannot hold"):
        tuning.CpuLatency(0, missing).open()


def test_auto_records_why_it_was_not_held(tmp_path):
    held = tuning.CpuLatency("auto", tmp_path / "none")
    held.check()  # auto never refuses
    with held:
        pass
    described = held.describe()
    assert described["held"] is False and "No such file" in described["not_held_because"]
    assert described["readback_us"] is None


def test_off_leaves_the_device_alone(tmp_path):
    device = tmp_path / "cpu_dma_latency"
    device.write_bytes(struct.pack("i", 123))
    with tuning.CpuLatency(None, device) as held:
        assert held.describe()["held"] is False
    assert device.read_bytes() == struct.pack("i", 123)


def test_steal_share_between_two_readings(tmp_path):
    stat = tmp_path / "stat"
    stat.write_text("cpu  100 0 50 800 10 0 5 35 0 0\ncpu0 1 2 3\n")
    before = tuning.CpuTimes.now(stat)
    assert before == tuning.CpuTimes(total=1000, steal=35)
    stat.write_text("cpu  200 0 100 1600 20 0 10 70 0 0\ncpu0 1 2 3\n")
    share = tuning.steal_between(before, tuning.CpuTimes.now(stat))
    hz = os.sysconf("SC_CLK_TCK")
    assert share == {"steal_s": 35 / hz, "cpu_s": 1000 / hz, "steal_pct": 3.5}
