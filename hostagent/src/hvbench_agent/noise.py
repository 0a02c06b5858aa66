"""The noise floor: how late a timer wakes a thread on this machine, under the run's scheduler
setting, measured by cyclictest (Debian's rt-tests).

    probe = TimerProbe(seconds=10, pm_qos_us=0)
    probe.start()                     # cyclictest runs; its thread is then given the setting
    probe.under(setting, "run-1")     # SCHED_DEADLINE on its thread, or a CPU quota of its own
    samples, summary = probe.finish() # every wake-up's latency (µs) after the setting applied

or, in one call that also writes every kept wake-up to a CSV and adds the percentiles:

    summary = measure(setting, seconds=10, csv=Path("baseline.csv"), pm_qos_us=None)

One measuring thread wakes every `interval_us` (1 ms) and records how late it woke. cyclictest
cannot start a thread under SCHED_DEADLINE itself, so the setting is applied once its thread
runs its loop: the thread first pins itself and sets its own policy (`--policy`), which would
undo a setting given earlier. The wake-ups before the setting, and a margin, are left out and
counted (`skipped`). cyclictest
holds /dev/cpu_dma_latency at 0 µs unless told otherwise: it is given the run's own limit
(`--latency`), or none (`--laptop`) when the run holds none, so it measures the machine as the
run has it. docs/tracing.md, "BASELINE=1".

On a testbed the probe runs inside the real-time VM (`hvbench-agent noise`): the run's setting
is on the VM's vCPUs, applied by the host, so the probe's thread takes none of its own
(`Setting("none")`) and measures the VM as the setting leaves it.
"""

from __future__ import annotations

import math
import os
import platform
import shutil
import subprocess
import time
from dataclasses import asdict
from pathlib import Path

from .sched.base import Refused, Setting
from .sched.cgroup import CpuQuota
from .sched.deadline import apply_deadline, readback_threads, threads_of

INTERVAL_US = 1000
MARGIN_WAKEUPS = 20  # left out after the setting applied, so none straddles the change
THREAD_START_S = 10  # for the measuring thread to reach its loop (milliseconds when idle)
# The call cyclictest's measuring thread sleeps in, between wake-ups, by architecture: it makes
# none before its loop, after its own affinity and policy are set.
CLOCK_NANOSLEEP = {"x86_64": 230, "aarch64": 115}


def cyclictest_command(seconds: float, interval_us: int, pm_qos_us: int | None) -> list[str]:
    """cyclictest: one SCHED_OTHER thread (a setting comes later), every wake-up printed."""
    latency = [f"--latency={pm_qos_us}"] if pm_qos_us is not None else ["--laptop"]
    return [
        "cyclictest", "--threads=1", f"--interval={interval_us}", "--policy=other",
        f"--duration={math.ceil(seconds)}", "--mlockall", "--verbose", "--quiet", *latency,
    ]  # fmt: skip


def parse_verbose(text: str) -> list[tuple[int, int]]:
    """(loop, latency µs) from cyclictest --verbose lines "  0:   198:    80"."""
    out = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(":")]
        if len(parts) == 3 and all(p.isdigit() for p in parts):
            out.append((int(parts[1]), int(parts[2])))
    return out


class TimerProbe:
    def __init__(self, seconds: float, out: Path, pm_qos_us: int | None,
                 interval_us: int = INTERVAL_US) -> None:  # fmt: skip
        if shutil.which("cyclictest") is None:
            raise Refused("no cyclictest: apt-get install rt-tests")
        self.seconds, self.out, self.interval_us = seconds, out, interval_us
        self.command = cyclictest_command(seconds, interval_us, pm_qos_us)
        self.proc: subprocess.Popen | None = None
        self.started = 0.0
        self.first_kept = 0  # the first wake-up measured under the setting
        self.applied: dict = {"applied": "none"}
        self.quota: CpuQuota | None = None

    def start(self) -> None:
        self.out.parent.mkdir(parents=True, exist_ok=True)
        with open(self.out, "wb") as sink:
            self.proc = subprocess.Popen(self.command, stdout=sink, stderr=subprocess.STDOUT)
        self.started = time.monotonic()

    def measuring_threads(self) -> list[int]:
        """cyclictest's measuring thread (every thread but its main one), once it sleeps in its
        loop, free to run on any CPU its process may use, like the job's threads: cyclictest
        pins it to one CPU, and SCHED_DEADLINE refuses a pinned thread."""
        if platform.machine() not in CLOCK_NANOSLEEP:
            raise Refused(f"no noise floor on {platform.machine()}: its clock_nanosleep unknown")
        deadline = time.monotonic() + THREAD_START_S
        while time.monotonic() < deadline:
            tids = [t for t, _ in threads_of(self.proc.pid, ["^cyclictest"]) if t != self.proc.pid]
            if tids and all(map(in_its_loop, tids)):
                for tid in tids:
                    os.sched_setaffinity(tid, os.sched_getaffinity(self.proc.pid))
                return tids
            time.sleep(0.001)  # polls a condition
        raise Refused(f"cyclictest's measuring thread did not reach its loop in {THREAD_START_S} s")

    def under(self, setting: Setting, name: str) -> dict:
        """Give the measuring thread the run's setting; what was applied and read back."""
        if setting.sched == "deadline":
            readback = apply_deadline(self.measuring_threads(), setting)
            self.applied = {"applied": "SCHED_DEADLINE", "readback": [asdict(r) for r in readback]}
        elif setting.sched == "cfs-quota":
            self.quota = CpuQuota(setting, f"{name}-baseline")
            self.quota.add(self.proc.pid)
            self.applied = {"applied": "cfs-quota", "readback": self.quota.readback()}
        elif setting.sched != "none":
            raise Refused(f"no baseline for SCHED={setting.sched} here")
        else:
            tids = self.measuring_threads()
            self.applied = {
                "applied": "none",
                "readback": [asdict(r) for r in readback_threads(tids)],
            }
        elapsed_us = (time.monotonic() - self.started) * 1e6
        self.first_kept = math.ceil(elapsed_us / self.interval_us) + MARGIN_WAKEUPS
        return self.applied

    def finish(self) -> tuple[list[int], dict]:
        """Wait for cyclictest to end; the latencies kept (µs) and what was measured."""
        try:
            code = self.proc.wait(timeout=self.seconds + 30)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
            if self.quota is not None:
                self.quota.close()
        rows = parse_verbose(self.out.read_text(errors="replace"))
        kept = [latency for loop, latency in rows if loop >= self.first_kept]
        summary = {
            "tool": "cyclictest (rt-tests)",
            "command": self.command,
            "exit_code": code,
            "interval_us": self.interval_us,
            "setting": self.applied,
            "wakeups": len(rows),
            "skipped": len(rows) - len(kept),
        }
        return kept, summary


def in_its_loop(tid: int) -> bool:
    """True once the thread sleeps in clock_nanosleep: /proc/<tid>/syscall begins with the
    number of the call the thread is blocked in ("running" while it runs)."""
    try:
        call = Path(f"/proc/{tid}/syscall").read_text().split()
    except OSError:
        return False
    return bool(call) and call[0] == str(CLOCK_NANOSLEEP[platform.machine()])


def percentiles(values: list[int], ps: list[float]) -> list[int]:
    """Nearest-rank percentiles, the k-th smallest with k = ⌈p/100 · n⌉, as the report takes
    them (hvbench_analysis.stats), with the standard library only."""
    ordered = sorted(values)
    # the small tolerance keeps 99.9 % of 1000 at rank 999 despite float rounding
    n = len(ordered)
    return [ordered[min(n, max(1, math.ceil(p / 100 * n - 1e-9))) - 1] for p in ps]


def measure(
    setting: Setting, seconds: float, csv: Path, pm_qos_us: int | None, name: str = "noise"
) -> dict:
    """cyclictest for `seconds` under `setting`; every kept wake-up (µs) to `csv` (one column,
    `latency_us`), and the summary with its percentiles. A setting the probe cannot take is
    recorded as `error`, not raised: the run goes on without a noise floor."""
    probe = TimerProbe(seconds, csv.with_name("cyclictest.out"), pm_qos_us)
    probe.start()
    try:
        probe.under(setting, name)
    except Refused as e:
        probe.proc.kill()
        probe.finish()
        return {"error": f"the noise floor could not take the setting: {e}"}
    kept, summary = probe.finish()
    csv.write_text("latency_us\n" + "".join(f"{v}\n" for v in kept))
    if kept:
        p50, p99, p999 = percentiles(kept, [50, 99, 99.9])
        summary |= {"count": len(kept), "p50_us": p50, "p99_us": p99,
                    "p99.9_us": p999, "max_us": max(kept)}  # fmt: skip
    return summary
