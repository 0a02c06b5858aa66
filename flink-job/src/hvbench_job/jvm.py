"""The workload's two JVMs, the Kafka broker's and the Flink job's: the options they start with
and the scheduling of their background threads.

Measured on two cores at 60 rec/s, with a trace of every CPU (docs/workload.md, "The JVMs"):
- C2 kept compiling for minutes into a run and held both CPUs while records waited: each
  woken record-handling thread waited for the compiler's slice to end, up to a scheduler
  tick (4 ms at HZ=250), at each of a record's hops. C1 alone compiles the hot code within
  seconds;
- a G1 young collection stops a JVM for 5-15 ms. The job's JVM, whose heap PyFlink let shrink
  to 120 MB, collected every 28 s; with a heap of 1 GB it collected once in 90 s of sending. ZGC
  stops a JVM for well under a millisecond, but on two cores (JDK 17) it cost the pipeline a
  quarter of its capacity, so both JVMs keep G1;
- a collection that copies into heap pages never used before page-faults on each of them
  (a first 40 MB copied took 55 ms instead of 6): the heap is touched at start-up.
The background threads (compilers, G1's concurrent threads) run under SCHED_IDLE: they still
take every idle cycle, but the fair scheduler hands the CPU to any other thread that wakes, at
once. Every such thread is made at start-up, so one pass finds them all.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

OPTIONS = (
    "-XX:TieredStopAtLevel=1",  # C1 only
    "-XX:+UseG1GC",
    "-XX:+AlwaysPreTouch",
    "-XX:-UseDynamicNumberOfCompilerThreads",
    "-XX:-UseDynamicNumberOfGCThreads",
)
# The job's JVM also gets a heap that never shrinks below 1 GB (PyFlink's default starts at
# 1/64 of the machine's memory and shrank to 120 MB: a collection every 28 s), and room for the
# classes PyFlink loads, so that their loading does not start a collection of its own. The
# broker's launcher sets the broker's heap.
JOB_OPTIONS = ("-Xms1g", "-XX:MetaspaceSize=256m", *OPTIONS)
# Background threads, by the names the kernel keeps (15 characters): the compilers, G1's
# concurrent marking and refinement threads, the sweeper and the periodic task. The GC workers
# (`GC Thread#N`) keep their policy: they run while the JVM is stopped, and slowing them would
# lengthen its pauses.
BACKGROUND = re.compile(
    r"^(C1 CompilerThre|C2 CompilerThre|G1 Conc#|G1 Refine#|G1 Service|G1 Main Marker"
    r"|Sweeper thread|VM Periodic Tas)"
)
POLICY_NAMES = {os.SCHED_OTHER: "SCHED_OTHER", os.SCHED_IDLE: "SCHED_IDLE"}


def threads(pid: int) -> dict[int, str]:
    """The process's threads: {tid: name}; those that end meanwhile are left out."""
    found = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            found[int(task.name)] = (task / "comm").read_text().strip()
        except OSError:
            continue
    return found


def idle_background_threads(pid: int) -> dict:
    """SCHED_IDLE on the JVM's background threads, as the kernel reads it back, for meta.json:
    {"policy": "SCHED_IDLE", "threads": {name: count}, "not_idle": [...]}."""
    named = {tid: name for tid, name in threads(pid).items() if BACKGROUND.match(name)}
    not_idle = []
    for tid, name in named.items():
        try:
            os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
            policy = os.sched_getscheduler(tid)
        except OSError as e:
            not_idle.append(f"{name} ({tid}): {e.strerror}")
            continue
        if policy != os.SCHED_IDLE:
            not_idle.append(f"{name} ({tid}): {POLICY_NAMES.get(policy, policy)}")
    counts: dict[str, int] = {}
    for name in named.values():
        kind = re.sub(r"#?\d+$", "", name)
        counts[kind] = counts.get(kind, 0) + 1
    return {"policy": "SCHED_IDLE", "threads": counts, "not_idle": not_idle}
