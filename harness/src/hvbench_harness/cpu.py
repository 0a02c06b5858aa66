"""The CPU time each part of a bare run used from the first send until the consumer had every
record: per process, user + system over all its threads (/proc/<pid>/stat), sampled while the
run drains, so that a part that exits keeps its last reading. meta.json `cpu_per_part`; the
capacity model (docs/capacity.md) starts from these figures."""

from __future__ import annotations

import os
import time
from pathlib import Path


def process_cpu_s(pid: int) -> float | None:
    """User + system seconds of a process (all threads); None once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_busy_s() -> float:
    """Seconds all CPUs spent busy (user, nice, system, irq, softirq; not idle, not iowait)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:8]]
    user, nice, system, _idle, _iowait, irq, softirq = fields
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


class PartCpu:
    def __init__(self, pids: dict[str, list[int]]):
        self.pids = pids
        self.first: dict[tuple[str, int], float] = {}
        self.last: dict[tuple[str, int], float] = {}
        self.busy = [machine_busy_s()] * 2  # first and last reading
        self.at = [time.monotonic()] * 2
        self.sample()

    def sample(self) -> None:
        self.busy[1], self.at[1] = machine_busy_s(), time.monotonic()
        for part, pids in self.pids.items():
            for pid in pids:
                if (seconds := process_cpu_s(pid)) is not None:
                    self.first.setdefault((part, pid), seconds)
                    self.last[(part, pid)] = seconds

    def result(self, records: int) -> dict:
        """{part: {cpu_s, per_record_ms, processes}}, and the machine's busy time besides."""
        parts = {}
        for part, pids in self.pids.items():
            used = sum(
                self.last[(part, p)] - self.first[(part, p)] for p in pids if (part, p) in self.last
            )
            parts[part] = {
                "cpu_s": round(used, 2),
                "per_record_ms": round(1000 * used / records, 4) if records else None,
                "processes": len(pids),
            }
        busy = self.busy[1] - self.busy[0]
        return {
            "records": records,
            "window_s": round(self.at[1] - self.at[0], 2),  # from the first to the last sample
            "parts": parts,
            "machine_busy_s": round(busy, 2),
            # everything else: the harness, other processes, the kernel's own work
            "rest_s": round(busy - sum(p["cpu_s"] for p in parts.values()), 2),
            "clock_tick_s": 1 / os.sysconf("SC_CLK_TCK"),
        }
