"""The host's energy over a run: its energy counters sampled while the run sends.

Sources, tried in this order (the first that answers is used; docs/energy.md):

- powercap: RAPL through the kernel's powercap interface, /sys/class/powercap/intel-rapl:*
  (Intel, and AMD since Linux 5.8 under the same name): each zone's `energy_uj`, a µJ counter
  that wraps after `max_energy_range_uj`. Zones are packages, their DRAM, core and uncore
  subzones, and psys. The host's total is its packages plus their DRAM (core and uncore lie
  inside a package; psys overlaps them both).
- perf: the same RAPL counters through perf's `power` PMU (`perf stat -a -I MS -x,`), which
  prints joules per interval: nothing wraps, the resolution is the interval.
- dcmi: the BMC's power reading (`ipmitool dcmi power reading`), in watts, integrated over
  time (trapezoids between readings): the only source a Xen dom0 has, as RAPL's MSRs are
  neither emulated for dom0 nor on its allow-list.

Where none answers, the run records that energy is not available and why, for each source;
never a zero.

    meter = open_source()                  # Unavailable(reason) if none answers
    counter = Accumulator(meter)           # cumulative joules per domain, wraps handled
    counter.sample()                       # at least once per period, to see every wrap
    window(samples, "measured", "sent")    # joules, seconds, watts between two marks

`hvbench-agent energy --period-s 1` runs a meter until its standard input closes: one JSON line
first (the source, or why none), then one per sample; a line `mark NAME` on its standard input
takes a sample named NAME at once.
"""

from __future__ import annotations

import json
import re
import select
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

POWERCAP = Path("/sys/class/powercap")
PERF_PMU = Path("/sys/bus/event_source/devices/power")
PERF_EVENTS = ("energy-pkg", "energy-ram")  # the packages and their DRAM: the host's total
IPMI_DEVICES = ("/dev/ipmi0", "/dev/ipmi/0", "/dev/ipmidev/0")
XEN_CAPABILITIES = Path("/proc/xen/capabilities")
TOTAL = "total"


class Unavailable(Exception):
    """No energy source answers here; the reason names what was tried."""


# ---------------------------------------------------------------------------------------------
# wrap-around and windows: pure arithmetic, on recorded counters


def counter_delta(before: int, after: int, wraps_at: int) -> int:
    """How far a counter that counts 0 .. wraps_at - 1 moved from `before` to `after`, when it
    is read at least once per wrap (it may have wrapped once, never twice)."""
    return after - before if after >= before else after + wraps_at - before


def window(samples: list[dict], start: str, end: str) -> dict | None:
    """Joules per domain, seconds and mean watts between the samples marked `start` and `end`
    (cumulative joules, as Accumulator gives them); None if either mark is missing."""
    marked = {s["mark"]: s for s in samples if s.get("mark")}
    if start not in marked or end not in marked:
        return None
    a, b = marked[start], marked[end]
    seconds = b["t_s"] - a["t_s"]
    joules = {d: b["joules"][d] - a["joules"].get(d, 0.0) for d in b["joules"]}
    watts = {d: j / seconds for d, j in joules.items()} if seconds > 0 else {}
    return {"from": start, "to": end, "seconds": seconds, "joules": joules, "mean_w": watts}


# ---------------------------------------------------------------------------------------------
# sources: each reads its counters as they are; Accumulator makes them cumulative joules


class Powercap:
    """RAPL zones under /sys/class/powercap, read as µJ counters."""

    name = "powercap"

    def __init__(self, root: Path = POWERCAP):
        paths = sorted(p for p in root.glob("intel-rapl:*") if (p / "energy_uj").exists())
        if not paths:
            raise Unavailable(f"powercap: {root} has no RAPL zone (intel-rapl:*)")
        self.zones = {zone_label(p): p for p in paths}
        self.wraps_at = {label: int(read(p / "max_energy_range_uj")) + 1
                         for label, p in self.zones.items()}  # fmt: skip
        try:
            self.read()
        except PermissionError:
            raise Unavailable(
                f"powercap: {paths[0] / 'energy_uj'} is readable by root only (Linux 5.10 and "
                "later); run the agent as root"
            ) from None

    def read(self) -> dict[str, int]:
        return {label: int(read(p / "energy_uj")) for label, p in self.zones.items()}

    def joules_between(self, domain: str, before: int, after: int, _seconds: float) -> float:
        return counter_delta(before, after, self.wraps_at[domain]) / 1e6

    def in_total(self, label: str) -> bool:
        """A package, or a package's DRAM: together they are the host's total."""
        return (label.startswith("package") and "/" not in label) or label.endswith("/dram")

    def describe(self) -> dict:
        return {
            "source": self.name,
            "what": "RAPL energy counters (the kernel's powercap interface)",
            "domains": sorted(self.zones),
            "total_of": sorted(label for label in self.zones if self.in_total(label)),
            "counter_unit": "µJ (the hardware counts in its energy unit, typically 15.3 µJ or "
            "61 µJ; MSR_RAPL_POWER_UNIT)",
            "wraps_at_uj": self.wraps_at,
        }


def zone_label(path: Path) -> str:
    """intel-rapl:0 → its name (package-0); intel-rapl:0:1 → package-0/dram."""
    name = read(path / "name").strip()
    parent = path.parent
    if parent.name.startswith("intel-rapl:") and (parent / "name").exists():
        return f"{read(parent / 'name').strip()}/{name}"
    if path.name.count(":") == 2:  # the flat /sys/class/powercap listing: intel-rapl:P:S
        package = path.with_name(path.name.rsplit(":", 1)[0])
        return f"{read(package / 'name').strip()}/{name}"
    return name


class Perf:
    """RAPL through perf: `perf stat -a -I` prints each interval's joules per event."""

    name = "perf"

    def __init__(self, interval_ms: int = 100, pmu: Path = PERF_PMU):
        if shutil.which("perf") is None:
            raise Unavailable("perf: not installed (apt-get install linux-perf)")
        events = [e for e in PERF_EVENTS if (pmu / "events" / e).exists()]
        if not events:
            raise Unavailable(f"perf: no RAPL events ({pmu}/events has no energy-pkg)")
        self.interval_ms = interval_ms
        self.events = [f"power/{e}/" for e in events]
        self.command = ["perf", "stat", "-a", "-x,", "-I", str(interval_ms),
                        "-e", ",".join(self.events)]  # fmt: skip
        self.joules = dict.fromkeys(self.events, 0.0)
        self.lock = threading.Lock()
        self.counting, self.said = threading.Event(), []
        self.proc = subprocess.Popen(
            self.command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        follower = threading.Thread(target=self._follow, daemon=True)
        follower.start()
        deadline = time.monotonic() + max(3.0, 3 * interval_ms / 1000)
        while not self.counting.wait(0.05):  # never a silent zero
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                follower.join(2)
                raise Unavailable(f"perf: counted nothing: {' '.join(self.said)[-300:]}")

    def _follow(self) -> None:
        for line in self.proc.stderr:
            found = parse_perf_interval(line)
            if found is None:
                self.said.append(line.strip())
                continue
            with self.lock:
                self.joules[found[0]] = self.joules.get(found[0], 0.0) + found[1]
            self.counting.set()

    def read(self) -> dict[str, float]:
        with self.lock:
            return dict(self.joules)

    def joules_between(self, _domain: str, before: float, after: float, _seconds: float) -> float:
        return after - before  # perf's joules, summed over its intervals: nothing wraps

    def in_total(self, label: str) -> bool:
        return True  # energy-pkg and energy-ram

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)

    def describe(self) -> dict:
        return {
            "source": self.name,
            "what": "RAPL energy counters through perf's power PMU",
            "command": self.command,
            "domains": self.events,
            "total_of": self.events,
            "resolution": f"{self.interval_ms} ms intervals, in joules",
        }


def parse_perf_interval(line: str) -> tuple[str, float] | None:
    """(event, joules) from a `perf stat -I -x,` line such as
    `     1.001092346,24.53,Joules,power/energy-pkg/,1001012345,100.00,,`; None for others
    (comments, `<not counted>`, `<not supported>`)."""
    fields = line.strip().split(",")
    if len(fields) < 4 or fields[2] != "Joules":
        return None
    try:
        return fields[3], float(fields[1])
    except ValueError:
        return None


class Dcmi:
    """The BMC's power reading, in watts, through `ipmitool dcmi power reading`."""

    name = "dcmi"

    def __init__(self):
        if not any(Path(d).exists() for d in IPMI_DEVICES):
            raise Unavailable(f"dcmi: no BMC here (none of {', '.join(IPMI_DEVICES)})")
        if shutil.which("ipmitool") is None:
            raise Unavailable("dcmi: ipmitool is not installed (apt-get install ipmitool)")
        self.read()  # Unavailable if the BMC does not answer DCMI

    def read(self) -> dict[str, float]:
        proc = subprocess.run(
            ["ipmitool", "dcmi", "power", "reading"], capture_output=True, text=True, timeout=10
        )
        watts = parse_dcmi_watts(proc.stdout)
        if proc.returncode != 0 or watts is None:
            raise Unavailable(f"dcmi: no power reading ({(proc.stderr or proc.stdout).strip()})")
        return {"power": watts}

    def joules_between(self, _domain: str, before: float, after: float, seconds: float) -> float:
        return (before + after) / 2 * seconds  # watts: a trapezoid between two readings

    def in_total(self, label: str) -> bool:
        return True

    def describe(self) -> dict:
        return {
            "source": self.name,
            "what": "the BMC's power reading (IPMI DCMI), integrated over time",
            "domains": ["power"],
            "total_of": ["power"],
            "resolution": "1 W, as the BMC reports it; joules by trapezoids between readings",
        }


def parse_dcmi_watts(text: str) -> float | None:
    """The watts of `    Instantaneous power reading:   212 Watts`; None if absent."""
    found = re.search(r"Instantaneous power reading:\s*(\d+(?:\.\d+)?)\s*Watts", text)
    return float(found.group(1)) if found else None


def read(path: Path) -> str:
    return path.read_text()


# ---------------------------------------------------------------------------------------------
# cumulative joules from any source


class Accumulator:
    """Cumulative joules per domain (and their total) since the first sample."""

    def __init__(self, source):
        self.source = source
        self.joules: dict[str, float] = {}
        self.last: dict | None = None
        self.last_t = 0.0
        self.samples: list[dict] = []

    def sample(self, mark: str | None = None) -> dict:
        now, raw = time.monotonic(), self.source.read()
        if self.last is not None:
            for domain, value in raw.items():
                self.joules[domain] = self.joules.get(domain, 0.0) + self.step(domain, value, now)
        else:
            self.joules = dict.fromkeys(raw, 0.0)
        self.last, self.last_t = raw, now
        total = sum(j for d, j in self.joules.items() if self.source.in_total(d))
        found = {"t_s": now, "mark": mark, "joules": {**self.joules, TOTAL: total}}
        self.samples.append(found)
        return found

    def step(self, domain: str, value, now: float) -> float:
        """Joules since the last sample in one domain."""
        before = self.last.get(domain, value)
        return self.source.joules_between(domain, before, value, now - self.last_t)


def open_source(perf_interval_ms: int = 100):
    """The first source that answers here; Unavailable with every source's reason if none."""
    reasons = []
    if dom0():
        reasons.append(
            "powercap and perf: a Xen dom0 cannot read RAPL (the MSRs are neither emulated "
            "for it nor on its allow-list)"
        )
        openers = [Dcmi]
    else:
        openers = [Powercap, lambda: Perf(perf_interval_ms), Dcmi]
    for opener in openers:
        try:
            return opener()
        except Unavailable as e:
            reasons.append(str(e))
        except (OSError, ValueError, subprocess.SubprocessError) as e:
            reasons.append(f"{getattr(opener, 'name', 'perf')}: {e}")
    raise Unavailable("; ".join(reasons))


def dom0() -> bool:
    try:
        return "control_d" in XEN_CAPABILITIES.read_text()
    except OSError:
        return False


def offered() -> dict:
    """What `make check` reports: the source a run would use here, or why there is none."""
    try:
        source = open_source()
    except Unavailable as e:
        return {"available": False, "reason": str(e)}
    described = source.describe()
    if isinstance(source, Perf):
        source.close()
    return {"available": True, **described}


# ---------------------------------------------------------------------------------------------
# hvbench-agent energy


def run(period_s: float, out=sys.stdout, stdin=sys.stdin) -> int:
    """Sample every `period_s` until standard input closes; `mark NAME` lines take a sample
    named NAME. Every line out is JSON: the source first (or why none), then the samples."""
    try:
        source = open_source()
    except Unavailable as e:
        emit(out, {"available": False, "reason": str(e)})
        return 0
    emit(out, {"available": True, "period_s": period_s, **source.describe()})
    counter = Accumulator(source)
    emit(out, counter.sample("start"))
    try:
        while True:
            ready, _, _ = select.select([stdin], [], [], period_s)
            if not ready:
                emit(out, counter.sample())
                continue
            line = stdin.readline()
            if not line:
                break
            words = line.split()
            emit(
                out, counter.sample(words[1] if words[:1] == ["mark"] and len(words) > 1 else None)
            )
        emit(out, counter.sample("stop"))
    finally:
        if isinstance(source, Perf):
            source.close()
    return 0


def emit(out, doc: dict) -> None:
    out.write(json.dumps(doc) + "\n")
    out.flush()
