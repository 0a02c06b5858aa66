"""The scheduler trace through the kernel's own tracer (tracefs), for real: this machine's
kernel records a thread of this test."""

import threading
import time

import pytest
from hvbench_agent import trace
from hvbench_agent.sched import Refused


def test_the_tsc_is_the_trace_clock_where_the_kernel_offers_it():
    assert trace.pick_clock("[local] global counter mono_raw x86-tsc") == "x86-tsc"
    assert trace.pick_clock("local [mono_raw] boot") == "mono_raw"
    with pytest.raises(Refused, match="none of"):
        trace.pick_clock("[local] global")


def test_the_filters_keep_only_the_given_threads():
    got = trace.filters([7, 9], trace.JOB_EVENTS)
    assert got["sched/sched_switch"] == (
        "prev_pid == 7 || next_pid == 7 || prev_pid == 9 || next_pid == 9"
    )
    assert got["sched/sched_wakeup"] == got["sched/sched_stat_runtime"] == "pid == 7 || pid == 9"


def sleeper(
    sleeps: int, started: threading.Event, tid: list
) -> tuple[threading.Thread, threading.Event]:
    """A thread that sleeps 1 ms `sleeps` times once told to go (the trace started): it
    switches often, and as often on a busy machine as on an idle one."""
    go = threading.Event()

    def run() -> None:
        tid.append(threading.get_native_id())
        started.set()
        go.wait(30)
        for _ in range(sleeps):
            time.sleep(0.001)

    return threading.Thread(target=run, name="hvbench-sleeper"), go


def test_a_thread_is_traced_and_the_instance_goes_afterwards():
    started, tid = threading.Event(), []
    thread, go = sleeper(300, started, tid)
    thread.start()
    started.wait(5)
    with trace.SchedTrace(
        "hvbench-test-trace", {tid[0]: "hvbench-sleeper"}, 512, events=trace.JOB_EVENTS
    ) as traced:
        go.set()
        instance = trace.tracefs() / "instances" / "hvbench-test-trace"
        assert instance.is_dir()
        with pytest.raises(Refused, match="exists"):  # one trace of a name at a time
            trace.SchedTrace("hvbench-test-trace", {tid[0]: "x"}).start()
        thread.join()
    text, summary = traced.result
    assert not instance.exists()
    assert summary["clock"] in trace.CLOCKS and summary["dropped"] == 0
    assert summary["threads"] == {str(tid[0]): "hvbench-sleeper"}
    lines = [line for line in text.splitlines() if not line.startswith("#")]
    assert summary["lines"] == len(lines) > 50  # 300 sleeps of 1 ms, each a switch and a wake
    mine = [f"pid={tid[0]} ", f"prev_pid={tid[0]} ", f"next_pid={tid[0]} "]
    assert all(any(m in line for m in mine) for line in lines)  # only this thread's events


def test_a_trace_of_no_threads_is_refused():
    with pytest.raises(Refused, match="no threads"):
        trace.SchedTrace("hvbench-test-none", {})


def test_kvm_events_are_filtered_on_the_raising_thread():
    got = trace.filters([7, 9], trace.KVM_EVENTS)
    assert got == {
        "kvm/kvm_entry": "common_pid == 7 || common_pid == 9",
        "kvm/kvm_exit": "common_pid == 7 || common_pid == 9",
    }


def test_sync_markers_are_stamped_on_the_traces_clock():
    """The markers a testbed's trace is aligned by (vmtrace): written into this machine's
    trace instance, found again with their stamps, in order."""
    from hvbench_agent import vmtrace

    started, tid = threading.Event(), []
    thread, go = sleeper(200, started, tid)
    thread.start()
    started.wait(5)
    with trace.SchedTrace("hvbench-test-marks", {tid[0]: "hvbench-sleeper"}, 512) as traced:
        go.set()
        for n in range(3):
            traced.mark(f"{vmtrace.MARKER} {n}")
            time.sleep(0.01)
        thread.join()
    stamps = vmtrace.marker_stamps(traced.result[0])
    assert list(stamps) == ["0", "1", "2"]
    values = [float(v) for v in stamps.values()]
    assert values == sorted(values) and values[0] < values[2]
