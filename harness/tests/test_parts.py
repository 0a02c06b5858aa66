"""Teardown with real processes: a stopped part is continued and ended, one that ignores
SIGTERM is killed after the grace period, what is left of a group is found, and each is
reported; the /proc state check that names a stopped part."""

import dataclasses
import os
import signal
import subprocess
import time

from hvbench_harness.parts import (
    Parts,
    group_members,
    read_process,
    running,
    stop_process,
    stopped_part,
)
from hvbench_harness.testbed import Machine

HERE = Machine("this machine")


def start(command: str) -> subprocess.Popen:
    """A shell command as a part starts: in a session (and process group) of its own."""
    return subprocess.Popen(["sh", "-c", command], start_new_session=True)


def wait_state(pid: int, states: str) -> None:
    deadline = time.monotonic() + 10
    while (found := read_process(pid)) is None or found.state not in states:
        assert time.monotonic() < deadline, f"pid {pid} never reached state {states}"
        time.sleep(0.02)


def test_a_stopped_process_is_named_and_its_state_read():
    proc = start("exec sleep 60")
    try:
        wait_state(proc.pid, "S")
        assert stopped_part({"the sleeper": [proc.pid]}) is None
        os.kill(proc.pid, signal.SIGSTOP)
        wait_state(proc.pid, "T")
        found = read_process(proc.pid)
        assert found.stopped and found.name == "sleep" and found.group == proc.pid
        why = stopped_part({"the sleeper": [proc.pid]})
        assert why == f"the sleeper (pid {proc.pid}) is stopped (SIGSTOP?), not running"
    finally:
        proc.kill()
        proc.wait()
    assert read_process(proc.pid) is None and stopped_part({"gone": [proc.pid]}) is None


def test_a_stopped_part_is_continued_ended_and_reported():
    proc = start("exec sleep 60")
    wait_state(proc.pid, "S")
    os.kill(proc.pid, signal.SIGSTOP)
    wait_state(proc.pid, "T")
    ended = stop_process(proc, timeout=5)
    # SIGTERM alone would stay pending for ever: SIGCONT first lets it end
    assert ended == [
        {"pid": proc.pid, "process": "sleep", "signal": "SIGTERM", "was_stopped": True}
    ]
    assert proc.returncode == -signal.SIGTERM and group_members(proc.pid) == []


def test_a_part_that_ignores_sigterm_is_killed_after_the_grace_period():
    # the shell and its child ignore SIGTERM (an ignored signal stays ignored across exec)
    proc = start("trap '' TERM; sleep 60; true")
    deadline = time.monotonic() + 10
    while len(group_members(proc.pid)) < 2:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    child = next(p for p in group_members(proc.pid) if p.pid != proc.pid)
    os.kill(child.pid, signal.SIGSTOP)
    wait_state(child.pid, "T")
    ended = stop_process(proc, timeout=1)
    assert {(e["pid"], e["signal"], e["was_stopped"]) for e in ended} == {
        (proc.pid, "SIGKILL", False),
        (child.pid, "SIGKILL", True),
    }
    assert proc.returncode == -signal.SIGKILL and group_members(proc.pid) == []


def test_what_is_left_of_a_part_whose_first_process_ended_is_ended_too():
    proc = start("sleep 60 & exit 0")
    proc.wait()
    deadline = time.monotonic() + 10
    while not (left := group_members(proc.pid)):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    ended = stop_process(proc, timeout=5)
    assert [(e["pid"], e["signal"]) for e in ended] == [(left[0].pid, "SIGTERM")]
    assert group_members(proc.pid) == []


def test_a_part_that_did_not_run_is_not_reported():
    proc = start("exit 3")
    proc.wait()
    assert stop_process(proc) == [] and stop_process(None) == []


def test_parts_record_the_teardown_and_verify_that_nothing_is_left(tmp_path):
    with Parts(tmp_path) as parts:
        sleeper = parts.start("sleeper", HERE, ["sleep", "60"])
        wait_state(sleeper.pid, "S")
        os.kill(sleeper.pid, signal.SIGSTOP)
        wait_state(sleeper.pid, "T")
        own = start("exec sleep 60")  # a process of the run in a group of its own, as Kafka's
        wait_state(own.pid, "S")
        seen = read_process(own.pid)
    assert parts.stopped == ["sleeper"]
    teardown = parts.verify({"the broker": [seen]})
    assert own.wait(10) == -signal.SIGKILL
    assert teardown["left"] == []
    assert teardown["ended"] == [
        {"part": "sleeper", "when": "teardown", "pid": sleeper.pid, "process": "sleep",
         "signal": "SIGTERM", "was_stopped": True},
        {"part": "the broker", "when": "after teardown", "pid": own.pid, "process": "sleep",
         "signal": "SIGKILL", "was_stopped": False},
    ]  # fmt: skip


def test_a_reused_pid_is_not_taken_for_the_runs_process(tmp_path):
    other = start("exec sleep 60")
    try:
        wait_state(other.pid, "S")
        found = read_process(other.pid)
        earlier = dataclasses.replace(found, started=found.started - 1)  # another process
        with Parts(tmp_path) as parts:
            pass
        teardown = parts.verify({"the broker": [earlier]})
        assert teardown == {"grace_s": teardown["grace_s"], "ended": [], "left": []}
        assert running(other.pid) is not None
    finally:
        other.kill()
        other.wait()
