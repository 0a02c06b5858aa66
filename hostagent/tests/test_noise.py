"""The noise floor for real: cyclictest (rt-tests) here, its thread given a setting while it
runs, the wake-ups from before the setting left out."""

import pytest
from hvbench_agent import noise
from hvbench_agent.sched import Setting


def test_the_command_takes_the_runs_cpu_latency_limit_or_none():
    held = noise.cyclictest_command(10, 1000, 0)
    assert "--latency=0" in held and "--threads=1" in held and "--duration=10" in held
    assert "--laptop" in noise.cyclictest_command(2.5, 1000, None)  # leaves the limit alone


def test_verbose_lines_are_read_and_the_summary_is_skipped():
    text = "# /dev/cpu_dma_latency set to 0us\n       0:       0:      90\n       0:     198:  80\n"
    text += "T: 0 ( 9592) P: 0 I:1000 C:    200 Min:     25 Act:   97 Avg:   82 Max:     109\n"
    assert noise.parse_verbose(text) == [(0, 90), (198, 80)]


@pytest.mark.parametrize(
    "setting, applied",
    [(Setting("none"), "none"), (Setting("deadline", 20000, 100000), "SCHED_DEADLINE")],
)
def test_cyclictest_runs_under_the_setting(tmp_path, setting, applied):
    probe = noise.TimerProbe(2, tmp_path / "cyclictest.out", pm_qos_us=None)
    probe.start()
    got = probe.under(setting, f"test-noise-{setting.sched}")
    kept, summary = probe.finish()
    assert got["applied"] == applied and summary["exit_code"] == 0
    policies = {r["policy"] for r in got["readback"]}
    assert policies == ({"SCHED_DEADLINE"} if setting.sched == "deadline" else {"SCHED_OTHER"})
    assert summary["skipped"] >= noise.MARGIN_WAKEUPS and len(kept) > 0
    assert summary["wakeups"] == summary["skipped"] + len(kept) and min(kept) >= 0
