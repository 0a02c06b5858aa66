"""Scheduler traces of a few threads (the job's, or a VM's vCPU threads), from the kernel's own
tracer (ftrace events through tracefs).

    with SchedTrace("hvbench-run1", tids={4242: "Source: kafka-"}) as trace:
        ...                                 # the measured window
    text, summary = trace.result            # the raw event lines, and what was recorded

The trace lives in an instance of its own (/sys/kernel/tracing/instances/<name>), so it leaves
other users of the tracer alone, and records only sched_switch and sched_wakeup of the given
threads (in-kernel filters); with JOB_EVENTS, sched_stat_runtime too (the CPU time the
scheduler charges, written in the thread's own context). Its ring buffer is bounded
(`buffer_kb` per CPU) and does not overwrite: when it fills, later events are dropped and
counted (`summary["dropped"]`), never silently lost. Timestamps are the TSC itself (trace clock
x86-tsc) where the kernel offers it, so they convert with the run's TSC calibration exactly as
the records' stamps do; else CLOCK_MONOTONIC_RAW (mono_raw), the timeline that calibration
starts on. docs/tracing.md says how the report reads them. trace-cmd drives the same tracer,
but needs to switch the function tracer on (/proc/sys/kernel/ftrace_enabled), which some
kernels and sandboxes refuse; events alone need only tracefs.
"""

from __future__ import annotations

import contextlib
import subprocess
from pathlib import Path

from .sched.base import Refused
from .sched.sysfs import write_file

TRACEFS = Path("/sys/kernel/tracing")
EVENTS = ("sched/sched_switch", "sched/sched_wakeup")
# and the CPU time the scheduler charges a thread, for the bare target's job threads: it dates
# a run whose switch to the thread this development machine's kernel lost (docs/tracing.md).
# Not in a testbed host's trace: its kernels keep every switch, and each tracepoint enabled
# there is one more code rewrite under emulation (docs/testing.md)
JOB_EVENTS = (*EVENTS, "sched/sched_stat_runtime")
# a KVM vCPU thread entering and leaving its guest: many thousands a second under load, so they
# go to an instance of their own, whose filling up never costs a scheduler event
KVM_EVENTS = ("kvm/kvm_entry", "kvm/kvm_exit")
CLOCKS = ("x86-tsc", "mono_raw")  # the first the kernel offers is used
BUFFER_KB = 8192  # per CPU; a thread switching 2,000 times a second fills 1 MB in ~8 s


def tracefs(root: Path = TRACEFS) -> Path:
    """tracefs, mounted at `root` first if it is not (as root, like `trace-cmd` does);
    Refused when it cannot be."""
    if not (root / "instances").is_dir() and root.is_dir():
        subprocess.run(["mount", "-t", "tracefs", "nodev", str(root)], capture_output=True)
    if (root / "instances").is_dir():
        return root
    raise Refused(f"no tracefs at {root}, and mount -t tracefs nodev {root} failed")


def pick_clock(offered: str) -> str:
    """The trace clock to use from trace_clock's text ("[local] global ... x86-tsc")."""
    names = offered.replace("[", " ").replace("]", " ").split()
    for clock in CLOCKS:
        if clock in names:
            return clock
    raise Refused(f"the kernel's trace clocks ({' '.join(names)}) include none of {CLOCKS}")


def filters(tids: list[int], events: tuple[str, ...] = EVENTS) -> dict[str, str]:
    """In-kernel filters: only the switches, wake-ups and CPU time of these threads (and the
    KVM events they raise)."""
    switch = " || ".join(f"prev_pid == {t} || next_pid == {t}" for t in tids)
    own = " || ".join(f"common_pid == {t}" for t in tids)
    pid = " || ".join(f"pid == {t}" for t in tids)
    chosen = {
        "sched/sched_switch": switch,
        "sched/sched_wakeup": pid,
        "sched/sched_stat_runtime": pid,
    }
    return {event: chosen.get(event, own) for event in events}


class SchedTrace:
    """Start on enter, stop on exit (also on an error); the result is kept in `result`."""

    def __init__(self, name: str, tids: dict[int, str], buffer_kb: int = BUFFER_KB,
                 root: Path = TRACEFS, events: tuple[str, ...] = EVENTS) -> None:  # fmt: skip
        if not tids:
            raise Refused("no threads to trace")
        self.name, self.tids, self.buffer_kb = name, dict(tids), buffer_kb
        self.events = events
        self.root = root
        self.instance: Path | None = None
        self.clock = ""
        self.result: tuple[str, dict] | None = None

    def __enter__(self) -> SchedTrace:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        base = tracefs(self.root)
        instance = base / "instances" / self.name
        try:
            instance.mkdir()
        except FileExistsError:
            raise Refused(f"trace instance {instance} exists (left from an earlier run?)") from None
        self.instance = instance
        try:
            self.clock = pick_clock((instance / "trace_clock").read_text())
            write_file(instance / "trace_clock", self.clock)
            write_file(instance / "buffer_size_kb", str(self.buffer_kb))
            write_file(instance / "options" / "overwrite", "0")  # full: drop new, count them
            for event, text in filters(sorted(self.tids), self.events).items():
                write_file(instance / "events" / event / "filter", text)
                write_file(instance / "events" / event / "enable", "1")
            write_file(instance / "tracing_on", "1")
        except OSError as e:
            self.remove()
            raise Refused(f"cannot start the trace in {instance}: {e}") from e

    def mark(self, text: str) -> None:
        """A line of our own in the trace, stamped on the trace's clock (trace_marker)."""
        if self.instance is not None:
            write_file(self.instance / "trace_marker", text)

    def stop(self) -> tuple[str, dict] | None:
        """Stop recording, keep the events and their counts, remove the instance."""
        if self.instance is None:
            return self.result
        instance = self.instance
        try:
            write_file(instance / "tracing_on", "0")
            text = (instance / "trace").read_text(errors="replace")
            stats = [cpu_stats(p / "stats") for p in sorted((instance / "per_cpu").iterdir())]
        finally:
            self.remove()
        self.result = (text, self.summary(text, stats))
        return self.result

    def summary(self, text: str, stats: list[dict]) -> dict:
        return {
            "tool": "ftrace events via tracefs (kernel tracer; an instance of its own)",
            "instance": self.name,
            "clock": self.clock,
            "events": [e.split("/")[1] for e in self.events],
            "threads": {str(tid): comm for tid, comm in sorted(self.tids.items())},
            "buffer_kb_per_cpu": self.buffer_kb,
            "lines": sum(1 for line in text.splitlines() if line and not line.startswith("#")),
            "dropped": sum(s.get("dropped events", 0) + s.get("overrun", 0) for s in stats),
        }

    def remove(self) -> None:
        """Switch the events off and remove the instance (the kernel frees its buffer)."""
        instance, self.instance = self.instance, None
        if instance is None or not instance.exists():
            return
        for event in self.events:
            with contextlib.suppress(OSError):
                write_file(instance / "events" / event / "enable", "0")
        with contextlib.suppress(OSError):  # busy: a reader still holds it; the next start says so
            instance.rmdir()


def cpu_stats(path: Path) -> dict[str, int]:
    """per_cpu/cpuN/stats: "entries: 583", "overrun: 0", "dropped events: 0", ..."""
    out = {}
    for line in path.read_text().splitlines():
        key, _, value = line.partition(":")
        try:
            out[key.strip()] = int(value.strip())
        except ValueError:
            continue  # the timestamps ("oldest event ts: 2642.311780") are not counts
    return out
