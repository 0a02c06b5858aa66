"""TSC timestamps in nanoseconds, for stamping records at send and at receipt.

`calibrate()` once per process, then `now_ns()` costs one RDTSCP and a multiply. The TSC
frequency comes from the kernel where it knows it (sysfs, its boot log, CPUID leaf 0x15) and is
otherwise measured against CLOCK_MONOTONIC_RAW; either way it is also measured, and the two
figures, the source and an error bound are reported in the returned `Calibration`. `now_ns()` is
on the CLOCK_MONOTONIC_RAW timeline at the moment of calibration. Processes on one machine that
must subtract each other's stamps share one calibration: one process calibrates and the others
`adopt()` its `as_dict()`, so all convert ticks with the same frequency and origin. Stamps from
different machines (or VMs) can never be subtracted.

A TSC without `constant_tsc` (rate follows the core clock) or `nonstop_tsc` (stops in deep
C-states) is refused unless `force=True`; a forced calibration says so.
"""

from __future__ import annotations

import re
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from tsc_timer import _tsc

REQUIRED_FLAGS = ("constant_tsc", "nonstop_tsc")
SYSFS_KHZ = Path("/sys/devices/system/cpu/cpu0/tsc_freq_khz")
CLOCKSOURCE = Path("/sys/devices/system/clocksource/clocksource0/current_clocksource")
# Beyond this the kernel's figure and ours disagree for real, and we trust the measurement.
DISAGREEMENT_PPM = 50.0

ticks = _tsc.ticks
ticks_lfence = _tsc.ticks_lfence
ticks_cpu = _tsc.ticks_cpu
now_ns = _tsc.now_ns


class TscUnavailable(RuntimeError):
    pass


@dataclass(frozen=True)
class Calibration:
    hz: float  # the frequency now_ns() uses
    source: str
    error_ppm: float  # bound on the relative error of `hz`
    measured_hz: float  # against CLOCK_MONOTONIC_RAW, always taken
    measured_error_ppm: float
    measured_seconds: float
    kernel_hz: float | None
    cpu_flags: dict[str, bool]
    forced: bool
    clocksource: str  # the kernel's current clocksource
    base_ticks: int = 0  # the TSC reading that maps to base_ns
    base_ns: int = 0  # CLOCK_MONOTONIC_RAW at base_ticks
    instruction: str = "rdtscp"
    clock: str = "tsc"

    def as_dict(self) -> dict:
        return asdict(self)


_calibration: Calibration | None = None


def calibration() -> Calibration | None:
    """The calibration in force in this process, if any."""
    return _calibration


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> set[str]:
    for line in cpuinfo.read_text().splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def parse_kernel_log(text: str, known_freq: bool) -> tuple[float, str, float] | None:
    """TSC Hz from kernel log lines: the refined calibration, else the boot figure when the
    kernel read it from the hardware (`tsc_known_freq`) rather than estimating it early."""
    refined = re.findall(r"Refined TSC clocksource calibration: ([\d.]+) MHz", text)
    if refined:
        return _from_mhz(refined[-1], "kernel log: refined TSC calibration")
    detected = re.findall(r"tsc: Detected ([\d.]+) MHz processor", text)
    if detected and known_freq:
        return _from_mhz(detected[-1], "kernel log: TSC frequency known to the kernel")
    return None


def _from_mhz(figure: str, source: str) -> tuple[float, str, float]:
    decimals = len(figure.split(".")[1]) if "." in figure else 0
    hz = float(figure) * 1e6
    half_digit_hz = 0.5 * 10 ** (6 - decimals)
    return hz, source, half_digit_hz / hz * 1e6


def kernel_tsc_hz(flags: set[str]) -> tuple[float, str, float] | None:
    """(Hz, source, error bound in ppm) from what the kernel or CPU states, or None."""
    try:
        khz = int(SYSFS_KHZ.read_text())
        return khz * 1e3, "sysfs tsc_freq_khz", 0.5e3 / (khz * 1e3) * 1e6
    except (OSError, ValueError):
        pass
    try:
        log = subprocess.run(
            ["dmesg"], capture_output=True, text=True, timeout=5, check=False
        ).stdout
    except (OSError, subprocess.SubprocessError):
        log = ""
    found = parse_kernel_log(log, "tsc_known_freq" in flags)
    if found:
        return found
    hz = _tsc.cpuid_tsc_hz()
    return (float(hz), "cpuid leaf 0x15", 1.0) if hz else None


def _best_pair(samples: int = 64) -> tuple[int, int, int]:
    """The (ticks, raw ns, width ns) sample with the tightest CLOCK_MONOTONIC_RAW bracket."""
    return min((_tsc.paired_sample() for _ in range(samples)), key=lambda s: s[2])


def measure_hz(seconds: float) -> tuple[float, float, tuple[int, int, int]]:
    """TSC Hz against CLOCK_MONOTONIC_RAW over `seconds`, its error bound (ppm), first sample."""
    first = _best_pair()
    time.sleep(seconds)
    last = _best_pair()
    elapsed_ns = last[1] - first[1]
    hz = (last[0] - first[0]) * 1e9 / elapsed_ns
    error_ppm = (first[2] + last[2]) / 2 / elapsed_ns * 1e6
    return hz, error_ppm, first


def clocksource() -> str:
    try:
        return CLOCKSOURCE.read_text().strip()
    except OSError:
        return "unknown"


def calibrate(
    force: bool = False, seconds: float = 0.5, cpuinfo: Path = Path("/proc/cpuinfo")
) -> Calibration:
    """Check the TSC, find its frequency, and start now_ns() on the CLOCK_MONOTONIC_RAW timeline."""
    global _calibration
    flags = cpu_flags(cpuinfo)
    if "tsc" not in flags or "rdtscp" not in flags:
        raise TscUnavailable("this CPU offers no TSC with RDTSCP (flags 'tsc', 'rdtscp')")
    missing = [f for f in REQUIRED_FLAGS if f not in flags]
    if missing and not force:
        raise TscUnavailable(
            f"the TSC lacks {', '.join(missing)}: its rate may follow the core clock or stop in "
            "deep C-states, so its stamps are not a time. Force it (force=True) only if you know "
            "this host keeps it steady; the results will say it was forced."
        )
    measured, measured_error, (base_ticks, base_ns, _) = measure_hz(seconds)
    known = kernel_tsc_hz(flags)
    if known and abs(known[0] - measured) / measured * 1e6 <= DISAGREEMENT_PPM + measured_error:
        hz, source, error_ppm = known
    else:
        hz, source, error_ppm = measured, "measured against CLOCK_MONOTONIC_RAW", measured_error
        if known:
            source += f" (the kernel's {known[0]:.0f} Hz disagreed)"
    _tsc.set_calibration(hz, base_ticks, base_ns)
    _calibration = Calibration(
        hz=hz,
        source=source,
        error_ppm=error_ppm,
        measured_hz=measured,
        measured_error_ppm=measured_error,
        measured_seconds=seconds,
        kernel_hz=known[0] if known else None,
        cpu_flags={f: f in flags for f in (*REQUIRED_FLAGS, "tsc_known_freq", "rdtscp")},
        forced=bool(missing),
        clocksource=clocksource(),
        base_ticks=base_ticks,
        base_ns=base_ns,
    )
    return _calibration


def adopt(calibration: dict) -> Calibration:
    """Use a calibration made by another process on this machine (from `Calibration.as_dict()`)."""
    global _calibration
    adopted = Calibration(**calibration)
    if adopted.base_ticks <= 0 or adopted.hz <= 0:
        raise ValueError("this calibration has no frequency or origin to adopt")
    _tsc.set_calibration(adopted.hz, adopted.base_ticks, adopted.base_ns)
    _calibration = adopted
    return _calibration
