"""The progress watch's stall clock: no result for STALL_S while sending is a stall; a slow
job (results slow, not zero), the start of sending and a broker restart are not. Producers
that do not end once the consumers have every record fail the run instead of holding it."""

import argparse
import os
import signal
import subprocess
import sys
from types import SimpleNamespace

import pytest
from hvbench_harness.parts import RunError
from hvbench_harness.targets import bare as bare_target
from hvbench_harness.targets import testbed as testbed_target
from hvbench_harness.watch import (
    RECONNECT_S,
    Progress,
    Stall,
    drained,
    stall_limit,
    wait_for_producers,
)


def figures(got: int, due: int = 360, letters: int = 0) -> dict:
    return {0: [got, due, letters]}


def test_no_result_for_the_limit_is_a_stall_named_with_the_counts():
    stall = Stall(8.0)
    stall.hold(100.0)  # sending starts
    stall.progress(figures(10), 101.0)
    assert stall.check(109.0, figures(10)) is None
    why = stall.check(109.5, figures(10))
    assert why.startswith("no result for 8 s while the producers were sending")
    assert "received 10 of 360" in why and "STALL_S=8" in why


def test_slow_results_and_dead_letters_are_progress():
    stall = Stall(8.0)
    stall.hold(0.0)
    for t in range(1, 60):
        stall.progress(figures(t // 5, letters=t // 7), float(t))  # a result every 5 s or so
        assert stall.check(float(t), figures(t // 5)) is None


def test_a_broker_restart_holds_the_clock_until_the_clients_reconnect():
    stall = Stall(8.0)
    stall.hold(0.0)
    stall.hold(20.0 + RECONNECT_S)  # seen restarting at 20 s
    assert stall.check(20.0 + RECONNECT_S + 8.0, figures(0)) is None
    assert "received 0 of ?" in Stall(1.0).check(1e9, {})


def test_the_limit_is_the_requested_or_the_targets_and_never_under_a_few_send_gaps():
    def args(**given) -> argparse.Namespace:
        return argparse.Namespace(**{"stall_s": None, "send_ms": 100.0, "ramp": 0.0, **given})

    bare, testbed = bare_target.BareTarget, testbed_target.TestbedTarget  # class-wide defaults
    assert stall_limit(args(), bare) == 8.0 and stall_limit(args(), testbed) == 30.0
    assert stall_limit(args(stall_s=3.0), bare) == 3.0
    assert stall_limit(args(send_ms=5000.0), bare) == 20.0  # a record every 5 s
    assert stall_limit(args(send_ms=1000.0, ramp=5.0), bare) == 40.0  # 10 % of the rate


def test_producers_stopped_after_the_consumers_had_everything_fail_the_run_not_hang_it():
    # a real process stopped (SIGSTOP) as a hung producer would be, beside one that has ended
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    hung = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        os.kill(hung.pid, signal.SIGSTOP)
        with pytest.raises(RunError) as failed:
            wait_for_producers([ended, hung], limit_s=1.0)
        why = str(failed.value)
        assert f"(pair 1, pid {hung.pid}) had not ended 1 s after the consumers" in why
        assert ended.returncode == 0 and hung.poll() is None
    finally:
        os.kill(hung.pid, signal.SIGCONT)
        hung.kill()
        hung.wait()


def test_consumers_that_end_before_the_producers_are_seen_to_still_end_in_draining(tmp_path):
    # A loaded machine's race (it failed the bad-input integration test once): the consumer had
    # every record and ended while the producers were still exiting. Real processes; the
    # target is a stand-in that records its energy marks.
    producers = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.3)"])]
    consumer = subprocess.Popen([sys.executable, "-c", "pass"])
    consumer.wait()
    meta = {"status": {"state": "running", "reason": None, "phase": "sending"}}
    marks: list[str] = []
    target = SimpleNamespace(energy=SimpleNamespace(mark=marks.append))
    clients = (SimpleNamespace(work=tmp_path), [(consumer, None)], producers)
    drained(None, target, clients, SimpleNamespace(pids=[]), meta, None)
    assert meta["status"]["phase"] == "draining" and marks == ["sent"]
    assert producers[0].returncode == 0


def test_the_progress_line_has_the_latency_so_far_and_the_time_left():
    progress = Progress(rate=60.0)
    progress.take(0, "consumer: received 600/20000 dead-letters 2")
    assert progress.text() == "received 600/20000 dead-letters 2, about 5 min left"
    progress.take(
        0, "consumer: received 1200/10000 dead-letters 2 latency p50 3.10 p99 8.20 max 12.00 ms"
    )
    progress.take(
        1, "consumer: received 1100/10000 dead-letters 0 latency p50 2.00 p99 9.50 max 11.00 ms"
    )
    assert progress.text() == (
        "received 2300/20000 dead-letters 2, latency p50 2.00 p99 9.50 max 11.00 ms so far "
        "(the worst pair's), about 5 min left"
    )
    assert progress.pairs == {0: [1200, 10000, 2], 1: [1100, 10000, 0]}  # as Stall reads them
    progress.take(0, "consumer: received 10000/10000 dead-letters 2")
    progress.take(1, "consumer: received 10000/10000 dead-letters 0")
    assert progress.text().endswith("so far (the worst pair's)")  # nothing left to send
