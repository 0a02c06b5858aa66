"""Run-time tuning of the machine the run uses, and what the machine took from the run.

- C-states: the kernel's PM QoS interface `/dev/cpu_dma_latency`. While a process holds it open
  with a value, no CPU enters an idle state whose exit latency is higher (0 µs: only polling),
  so a thread woken by a record starts without waiting for a CPU to leave a deep idle state.
  This is what cyclictest does by default. The setting ends when the file is closed: nothing
  outlives the run. Measured on a 2-vCPU VM (haltpoll idle driver): a pipe ping-pong at 60 Hz
  went from p50 63 µs / p99.9 511 µs to p50 17 µs / p99.9 180 µs, and the pipeline's p50 at
  60 rec/s from 4.0 to 2.8 ms.
- `make check ENFORCE=1` on the bare target: governor performance, turbo off, irqbalance
  stopped (`enforce_here`, until the next boot).
- Steal: time the hypervisor ran something else while this machine's CPUs wanted to run
  (`/proc/stat`). Non-zero only in a VM; a run records it so a reader can see how much of its
  tail the host took.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path

from .facts import CPU, run_tool

PM_QOS = Path("/dev/cpu_dma_latency")


class TuningError(RuntimeError):
    pass


def parse_cpu_latency(value: str) -> int | str | None:
    """CPU_LATENCY as given: a number of µs (held, or refused if it cannot be), `off` (not
    held: None), or `auto` (held at 0 µs where permitted, recorded as not held elsewhere)."""
    if value in ("auto", "off"):
        return None if value == "off" else "auto"
    try:
        us = int(value)
    except ValueError:
        raise TuningError(f"CPU_LATENCY must be auto, off or microseconds, not {value!r}") from None
    if us < 0:
        raise TuningError(f"CPU_LATENCY must be ≥ 0 µs, not {us}")
    return us


class CpuLatency:
    """Holds /dev/cpu_dma_latency at a value for as long as it is open."""

    def __init__(
        self, requested: int | str | None, device: Path = PM_QOS, off_because: str = ""
    ) -> None:
        self.requested = requested
        self.device = device
        self.fd: int | None = None
        self.not_held: str | None = None
        self.off_because = off_because or "CPU_LATENCY=off"

    def check(self) -> None:
        """Refuse an explicit value the kernel will not take, before anything starts."""
        if isinstance(self.requested, int) and not os.access(self.device, os.W_OK):
            raise TuningError(
                f"CPU_LATENCY={self.requested} needs write access to {self.device} "
                "(root); use CPU_LATENCY=off to run without it"
            )

    def open(self) -> None:
        if self.requested is None:
            self.not_held = self.off_because
            return
        value = 0 if self.requested == "auto" else self.requested
        try:
            self.fd = os.open(self.device, os.O_WRONLY)
            os.write(self.fd, struct.pack("i", value))
        except OSError as e:
            if self.fd is not None:
                os.close(self.fd)
                self.fd = None
            if self.requested != "auto":
                raise TuningError(f"cannot hold {self.device} at {value} µs: {e}") from e
            self.not_held = f"{self.device}: {e.strerror}"

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def __enter__(self) -> CpuLatency:
        self.open()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def describe(self) -> dict:
        """What was asked for and what the kernel reports now (read back from the device)."""
        return {
            "requested": self.requested if self.requested is not None else "off",
            "held": self.fd is not None,
            "not_held_because": self.not_held,
            "readback_us": read_cpu_latency(self.device),
        }


def read_cpu_latency(device: Path = PM_QOS) -> int | None:
    """The kernel's current CPU latency limit in µs (the strictest of all holders)."""
    try:
        with open(device, "rb") as f:
            return struct.unpack("i", f.read(4))[0]
    except OSError:
        return None


@dataclass(frozen=True)
class CpuTimes:
    """Jiffies summed over all CPUs, from the first line of /proc/stat."""

    total: int
    steal: int

    @classmethod
    def now(cls, stat: Path = Path("/proc/stat")) -> CpuTimes:
        return cls.parse(stat.read_text())

    @classmethod
    def parse(cls, stat: str) -> CpuTimes:
        fields = stat.split("\n", 1)[0].split()
        values = [int(v) for v in fields[1:9]]  # user … steal; guest time is already in user
        return cls(total=sum(values), steal=values[7])


def steal_between(before: CpuTimes, after: CpuTimes) -> dict:
    """Share of CPU time the hypervisor took between two readings."""
    hz = os.sysconf("SC_CLK_TCK")
    total = after.total - before.total
    steal = after.steal - before.steal
    return {
        "steal_s": steal / hz,
        "cpu_s": total / hz,
        "steal_pct": 100.0 * steal / total if total > 0 else 0.0,
    }


def enforce_here() -> list[str]:
    """Governor performance, turbo off, irqbalance stopped on this machine (until reboot)."""
    done = []
    for g in CPU.glob("cpu[0-9]*/cpufreq/scaling_governor"):
        if _write_value(g, "performance"):
            done.append(f"{g.parent.parent.name}: governor performance")
    if _write_value(CPU / "intel_pstate/no_turbo", "1") or _write_value(CPU / "cpufreq/boost", "0"):
        done.append("turbo off")
    active = run_tool("systemctl", "is-active", "irqbalance") is not None  # None: not active
    if active and run_tool("systemctl", "stop", "irqbalance") is not None:
        done.append("irqbalance stopped")
    return done


def _write_value(path: Path, value: str) -> bool:
    try:
        if path.read_text().strip() == value:
            return False
        path.write_text(value)
        return True
    except OSError:
        return False
