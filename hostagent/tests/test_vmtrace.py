"""A Xen trace's records (xentrace's binary output) become the lines the report reads. The
bytes are laid out as xentrace writes them (a header word: event:28, extra words:3, TSC
included:1; then the TSC, then the words; xentrace's CPU-change records between windows):
a recorded layout, not a live trace (that is the Xen testbed test's)."""

import struct

from hvbench_agent import vmtrace


def record(event: int, words: list[int], tsc: int | None = None) -> bytes:
    header = event | (len(words) << 28) | ((1 << 31) if tsc is not None else 0)
    out = struct.pack("<I", header)
    if tsc is not None:
        out += struct.pack("<Q", tsc)
    return out + struct.pack(f"<{len(words)}I", *words)


def runstate(dom: int, vcpu: int, old: int, new: int, tsc: int) -> bytes:
    event = vmtrace.TRC_SCHED_RUNSTATE_CHANGE | (old << 8) | (new << 4)
    return record(event, [(dom << 16) | vcpu], tsc)


def test_the_domains_runstate_changes_become_lines_with_their_cpu_and_tsc():
    data = (
        record(vmtrace.TRC_TRACE_CPU_CHANGE, [2, 64])
        + runstate(5, 0, 2, 1, 1000)  # blocked -> runnable
        + runstate(0, 0, 0, 2, 1001)  # dom0: not ours
        + runstate(5, 0, 1, 0, 1500)  # runnable -> running
        + record(vmtrace.TRC_TRACE_CPU_CHANGE, [3, 64])
        + record(vmtrace.TRC_LOST_RECORDS, [7, 0], 1600)
        + runstate(5, 1, 0, 1, 2000)  # vCPU 1, on CPU 3: running -> runnable
        + runstate(5, 1, 1, 0, 2500)[:-2]  # cut short when xentrace stopped
    )
    lines, vcpus, lost = vmtrace.xen_lines(data, domid=5)
    assert lines == [
        "d5v0 [002] xen 1000: runstate: vcpu=0 blocked->runnable",
        "d5v0 [002] xen 1500: runstate: vcpu=0 runnable->running",
        "d5v1 [003] xen 2000: runstate: vcpu=1 running->runnable",
    ]
    assert vcpus == {0: "d5v0", 1: "d5v1"} and lost == 7
