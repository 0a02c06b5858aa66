"""The CPU time of each part of a run, from /proc (hvbench_harness.cpu), on real processes."""

import os
import subprocess
import sys

from hvbench_harness.cpu import PartCpu, process_cpu_s

SPIN = "import time\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass"


def test_a_spinning_part_is_charged_its_time_and_keeps_it_once_gone():
    spinner = subprocess.Popen([sys.executable, "-c", SPIN])
    sleeper = subprocess.Popen(["sleep", "5"])
    try:
        usage = PartCpu({"spinner": [spinner.pid], "sleeper": [sleeper.pid]})
        while spinner.poll() is None:
            usage.sample()  # the last sample before the poll reaps it
        doc = usage.result(records=100)
    finally:
        sleeper.kill()
        sleeper.wait()
    spun = doc["parts"]["spinner"]
    assert 0.1 <= spun["cpu_s"] <= 2.0  # about 0.3 s, sampled at ticks of 10 ms
    assert spun["per_record_ms"] == round(1000 * spun["cpu_s"] / 100, 4)
    assert doc["parts"]["sleeper"]["cpu_s"] < 0.1
    assert doc["machine_busy_s"] >= spun["cpu_s"] - 0.05
    assert doc["window_s"] >= spun["cpu_s"] - 0.05  # one process cannot use more than its time
    assert process_cpu_s(spinner.pid) is None  # reaped: gone


def test_the_fields_after_the_command_name_are_read(tmp_path):
    # the command name may hold spaces and ")": the fields are counted from its last ")"
    odd = tmp_path / "a b) c"
    odd.symlink_to("/bin/sleep")
    proc = subprocess.Popen([str(odd), "5"])
    try:
        assert process_cpu_s(proc.pid) is not None
    finally:
        proc.kill()
        proc.wait()
    assert process_cpu_s(os.getpid()) > 0
