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
        # the source launcher compiles Sleeper first; the JIT's and ZGC's threads are up then
        while not any(name == "ZDriver" for name in jvm.threads(proc.pid).values()):
            assert proc.poll() is None and time.monotonic() < deadline, "the JVM did not start"
            time.sleep(0.1)
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


def test_background_threads_run_idle_and_the_rest_keep_their_policy(sleeping_jvm):
    applied = jvm.idle_background_threads(sleeping_jvm)
    assert applied["policy"] == "SCHED_IDLE" and applied["not_idle"] == []
    assert {"C1 CompilerThre", "ZWorker", "ZDirector"} <= set(applied["threads"])
    assert "C2 CompilerThre" not in applied["threads"]  # C1 only
    for tid, name in jvm.threads(sleeping_jvm).items():
        policy = os.sched_getscheduler(tid)
        if jvm.BACKGROUND.match(name):
            assert policy == os.SCHED_IDLE, name
        else:  # the main thread, ZGC's driver (it starts the collector's pauses), ...
            assert policy == os.SCHED_OTHER, name
    assert "ZDriver" in jvm.threads(sleeping_jvm).values()
