"""The JVMs' background threads under SCHED_IDLE, on a real JVM started with the workload's
options (Java comes with `make test`: the broker and Flink need it)."""

import os
import subprocess
import time

import pytest
from hvbench_job import jvm

SLEEPER = """class Sleeper {
    public static void main(String[] a) throws Exception { Thread.sleep(60000); }
}"""


@pytest.fixture
def sleeping_jvm(tmp_path):
    source = tmp_path / "Sleeper.java"
    source.write_text(SLEEPER)
    proc = subprocess.Popen(["java", *jvm.JOB_OPTIONS, "-Xmx1g", str(source)])
    try:
        deadline = time.monotonic() + 60
        # G1's threads start before the compiler's, and each thread takes its name once it
        # runs: on a busy machine the C1 thread was still unnamed when G1 Service was up, and
        # the periodic task thread, among the last the JVM starts, came after the C1 thread
        started = {"G1 Service", "C1 CompilerThre", "VM Periodic Tas"}
        while not started <= set(jvm.threads(proc.pid).values()):
            assert proc.poll() is None and time.monotonic() < deadline, "the JVM did not start"
            time.sleep(0.1)
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


def test_background_threads_run_idle_and_the_rest_keep_their_policy(sleeping_jvm):
    applied = jvm.idle_background_threads(sleeping_jvm)
    assert applied["policy"] == "SCHED_IDLE" and applied["not_idle"] == []
    assert {"C1 CompilerThre", "G1 Conc", "G1 Refine", "G1 Service"} <= set(applied["threads"])
    assert "C2 CompilerThre" not in applied["threads"]  # C1 only
    for tid, name in jvm.threads(sleeping_jvm).items():
        policy = os.sched_getscheduler(tid)
        if jvm.BACKGROUND.match(name):
            assert policy == os.SCHED_IDLE, name
        else:  # the main thread, the GC workers (they run while the JVM is stopped), ...
            assert policy == os.SCHED_OTHER, name
    assert any(name.startswith("GC Thread#") for name in jvm.threads(sleeping_jvm).values())
