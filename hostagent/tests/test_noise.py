"""The noise floor for real: cyclictest (rt-tests) here, its thread given a setting while it
runs, the wake-ups from before the setting left out."""

import json
import re
import time
from dataclasses import asdict
from pathlib import Path

import pytest
from hvbench_agent import noise
from hvbench_agent.sched import Setting
from hvbench_agent.sched.deadline import readback_threads


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
    later = readback_after_wakeups([r["tid"] for r in got["readback"]], 5)
    kept, summary = probe.finish()
    assert got["applied"] == applied and summary["exit_code"] == 0
    # the thread keeps the setting: it had set its own policy before (it did so after the
    # setting, now and then, when the setting came as soon as the thread appeared)
    assert [asdict(r) for r in later] == got["readback"]
    policies = {r["policy"] for r in got["readback"]}
    assert policies == ({"SCHED_DEADLINE"} if setting.sched == "deadline" else {"SCHED_OTHER"})
    assert summary["skipped"] >= noise.MARGIN_WAKEUPS and len(kept) > 0
    assert summary["wakeups"] == summary["skipped"] + len(kept) and min(kept) >= 0


def readback_after_wakeups(tids: list[int], wakeups: int) -> list:
    """The threads' settings once each has slept and woken `wakeups` more times."""

    def switches(tid: int) -> int:
        status = Path(f"/proc/{tid}/status").read_text()
        return int(re.search(r"^voluntary_ctxt_switches:\s+(\d+)", status, re.M)[1])

    start = {tid: switches(tid) for tid in tids}
    while any(switches(tid) < start[tid] + wakeups for tid in tids):
        time.sleep(0.001)  # polls a condition
    return readback_threads(tids)


def test_percentiles_are_nearest_rank_as_the_report_takes_them():
    values = list(range(1000, 0, -1))  # 1 … 1000, unsorted
    assert noise.percentiles(values, [50, 99, 99.9, 100]) == [500, 990, 999, 1000]
    assert noise.percentiles([7], [0, 50, 100]) == [7, 7, 7]


def test_the_agents_noise_verb_writes_every_kept_wake_up_and_the_summary(tmp_path, capsys):
    """`hvbench-agent noise`, as a testbed run calls it inside the real-time VM: no setting of
    its own (the host put the run's on the VM's vCPUs), the CSV and the percentiles."""
    from hvbench_agent import cli

    csv = tmp_path / "baseline.csv"
    assert cli.main(["noise", "--seconds", "2", "--csv", str(csv)]) == 0
    summary = json.loads(capsys.readouterr().out)
    kept = [int(v) for v in csv.read_text().split()[1:]]
    assert csv.read_text().startswith("latency_us\n") and len(kept) == summary["count"] > 0
    assert summary["setting"]["applied"] == "none" and "--laptop" in summary["command"]
    assert summary["max_us"] == max(kept) and summary["wakeups"] == summary["skipped"] + len(kept)
    p50, p99 = noise.percentiles(kept, [50, 99])
    assert (summary["p50_us"], summary["p99_us"]) == (p50, p99)
