"""The run's power policy and energy meter, through the agent on this machine (the bare
target's host): a refusal before anything changes, MAX_CSTATE applied, read back and put back,
and the meter's "not available" here; the windows' arithmetic on recorded samples."""

import os
from pathlib import Path

import pytest
from hvbench_agent.power import validate_policy
from hvbench_harness import readiness, rerun
from hvbench_harness.parts import RunError
from hvbench_harness.power import EnergyMeter, HostPower
from hvbench_harness.testbed import Machine

HERE = Machine("this machine")
STATE1 = Path("/sys/devices/system/cpu/cpu0/cpuidle/state1/disable")


def test_a_control_the_host_lacks_is_refused_by_its_agent():
    if Path("/sys/devices/system/cpu/cpu0/cpufreq").exists():
        pytest.skip("this machine has cpufreq")
    with pytest.raises(RunError, match=r"this machine: .*GOVERNOR=powersave: .*no frequency"):
        HostPower([HERE], validate_policy("powersave")).check()


@pytest.mark.skipif(os.geteuid() != 0 or not STATE1.exists(), reason="root, two idle states")
def test_max_cstate_is_applied_read_back_and_restored_through_the_agent(idle_states):
    before = STATE1.read_text()
    host = HostPower([HERE], validate_policy(max_cstate=0))
    host.check()
    applied = host.apply()
    try:
        assert applied["requested"] == {"max_cstate": 0}
        assert applied["readback"]["this machine"]["max_cstate"] == 0
        assert STATE1.read_text().strip() == "1"
        assert "this machine" in applied["before"]
    finally:
        host.restore()
    assert STATE1.read_text() == before
    assert host.read()["this machine"]["max_cstate"] >= 1


def test_the_meter_here_records_not_available_with_the_reason():
    meter = EnergyMeter([HERE])
    meter.start()
    for mark in ("sending", "measured", "sent"):
        meter.mark(mark)
    meter.stop()
    summary = meter.summary({"run": 10, "measured": 8})
    host = summary["hosts"]["this machine"]
    if host["available"]:  # a machine with RAPL or a BMC: the windows have figures
        assert summary["windows"]["measured"]["records"] == 8
        return
    assert summary["available"] is False
    assert summary["windows"] == {"run": None, "measured": None}
    assert summary["reason"].startswith("this machine: powercap: ")
    assert meter.samples_csv() == "host,t_s,mark,domain,joules\n"


def test_windows_sum_the_hosts_and_divide_by_their_records():
    meter = EnergyMeter([Machine("host-a"), Machine("host-b")])

    def lines(watts: float) -> list[dict]:
        marks = [("start", 0.0), ("sending", 1.0), ("measured", 3.0), (None, 5.0), ("sent", 11.0)]
        header = {"available": True, "source": "powercap", "domains": ["package-0"]}
        return [header] + [
            {"t_s": t, "mark": m, "joules": {"package-0": watts * t, "total": watts * t}}
            for m, t in marks
        ]

    meter.lines = {"host-a": lines(100.0), "host-b": lines(50.0)}
    meter.marked = ["sending", "measured", "sent"]
    summary = meter.summary({"run": 600, "measured": 480})
    run, measured = summary["windows"]["run"], summary["windows"]["measured"]
    assert run["joules"] == pytest.approx(150 * 10)
    assert run["mean_w"] == pytest.approx(150)
    assert run["joules_per_record"] == pytest.approx(1500 / 600)
    assert measured["seconds"] == 8.0
    assert measured["joules"] == pytest.approx(150 * 8)
    assert measured["joules_per_record"] == pytest.approx(1200 / 480)
    assert measured["per_host"]["host-b"]["joules"]["total"] == pytest.approx(400)
    rows = meter.samples_csv().splitlines()
    assert rows[1] == "host-a,0.000000,start,package-0,0.000000"
    assert len(rows) == 1 + 2 * 5 * 2


def test_a_run_that_ended_before_a_mark_has_no_figure_for_that_window():
    meter = EnergyMeter([Machine("host-a")])
    header = {"available": True, "source": "powercap", "domains": ["package-0"]}
    meter.lines = {
        "host-a": [header, {"t_s": 1.0, "mark": "sending", "joules": {"total": 0.0}}],
    }
    assert meter.summary({"run": 10})["windows"] == {"run": None, "measured": None}


def test_checks_the_power_policy_sets_are_not_required():
    results = {
        "host": [
            {"check": "governor", "status": "fail", "required": True},
            {"check": "cstates", "status": "fail", "required": True},
            {"check": "turbo", "status": "fail", "required": True},
        ]
    }
    readiness.set_by_run(results, {"governor": "powersave", "max_cstate": 2})
    governor, cstates, turbo = results["host"]
    assert governor["required"] is False and governor["set_by_run"] == "GOVERNOR=powersave"
    assert cstates["required"] is False and cstates["set_by_run"] == "MAX_CSTATE=2"
    assert turbo["required"] is True and "set_by_run" not in turbo


def test_a_rerun_whose_host_read_back_another_policy_differs():
    def meta(max_cstate) -> dict:
        readback = {"h": {"backend": "linux", "governor": "performance", "max_cstate": max_cstate,
                          "turbo": "off", "idle_states": []}}  # fmt: skip
        return {"requested": {"max_cstate": 1}, "sched": {"readback": {"quota_us": 80000}},
                "power": {"requested": {"max_cstate": 1}, "readback": readback}}  # fmt: skip

    assert rerun.compare(meta(1), meta(1))["readback_equal"]
    assert not rerun.compare(meta(1), meta(3))["readback_equal"]
    assert rerun.power_policy({"requested": {}}) == {}
