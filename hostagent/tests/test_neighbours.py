"""Noisy neighbours' loads for real: stress-ng (Debian's package) placed on a CPU, stopped with
SIGINT, its own metrics read back."""

import os

import pytest
from hvbench_agent import neighbours
from hvbench_agent.neighbours import Group, NoiseError


def test_noise_text_is_groups_of_count_and_state():
    assert neighbours.parse("3:idle") == (Group(3, "idle"),)
    groups = neighbours.parse(" 2:cpu , 1:membw")
    assert groups == (Group(2, "cpu"), Group(1, "membw"))
    assert neighbours.text(groups) == "2:cpu,1:membw"
    assert neighbours.parse(None) == neighbours.parse("") == neighbours.parse("none") == ()
    assert [g.is_load for g in neighbours.parse("1:paused,1:io,2:workload")] == [False, True, False]


@pytest.mark.parametrize(
    "text, message",
    [
        ("3:idel", r"unknown NOISE state 'idel' \(did you mean idle\?\)"),
        ("cpu", "COUNT:STATE"),
        ("0:cpu", "COUNT ≥ 1"),
        ("two:cpu", "COUNT:STATE"),
    ],
)
def test_a_bad_noise_text_is_refused_with_what_it_should_be(text, message):
    with pytest.raises(NoiseError, match=message):
        neighbours.parse(text)


def test_cpu_lists_read_and_write_as_taskset_takes_them():
    assert neighbours.parse_cpus("0,2-3") == {0, 2, 3}
    assert neighbours.cpu_list({0, 2, 3, 5}) == "0,2-3,5"
    with pytest.raises(NoiseError, match="not a CPU list"):
        neighbours.parse_cpus("1-")


def test_each_load_is_its_stress_ng_stressor_placed_and_reporting():
    cmd = neighbours.command(Group(2, "membw"), "1", neighbours.Path("/w"), neighbours.Path("/m"))
    assert cmd[:3] == ["stress-ng", "--stream", "2"]
    assert cmd[cmd.index("--taskset") + 1] == "1" and "--stream-l3-size" in cmd
    assert cmd[-3:] == ["--metrics", "--yaml", "/m"]
    io = neighbours.command(Group(1, "io"), None, neighbours.Path("/w"), neighbours.Path("/m"))
    assert "--hdd" in io and "/w" in io and "--taskset" not in io


def test_streams_rates_from_its_log_join_its_metrics():
    yaml = "---\nsystem-info:\n  cpus: 2\n\nmetrics:\n    - stressor: stream\n      bogo-ops: 44\n"
    yaml += "      bogo-ops-per-second-real-time: 8.69\n\n...\n"
    log = "stress-ng: metrc: [30628] stream              7397.96 memory read rate (MB per sec)"
    (entry,) = neighbours.parse_metrics(yaml, log)
    assert entry == {"stressor": "stream", "bogo-ops": 44, "bogo-ops-per-second-real-time": 8.69,
                     "memory_read_rate_mb_per_s": 7397.96}  # fmt: skip


@pytest.mark.parametrize("state", ["cpu", "cache"])
def test_a_load_runs_where_it_is_placed_and_reports_its_work(tmp_path, state):
    cpu = max(os.sched_getaffinity(0))
    load = neighbours.Load(Group(1, state), str(cpu), tmp_path, f"noise-{state}")
    load.start()
    try:
        placed = load.placement()
        assert load.alive()
    finally:
        done = load.stop()
    assert list(placed["stressors"].values()) == [str(cpu)]
    assert done["exit_code"] == 0 and not done["ended_before_the_run"]
    (metrics,) = done["metrics"]
    assert metrics["stressor"] == state and metrics["bogo-ops"] > 0


def test_a_vm_state_is_not_a_load(tmp_path):
    with pytest.raises(NoiseError, match="a VM's state"):
        neighbours.Load(Group(1, "paused"), None, tmp_path, "noise-0")
