"""Noisy neighbours: what shares the machine with the real-time workload during a run.

A run's neighbours are written as groups, `COUNT:STATE` separated by commas (`NOISE=` on the
command line, `noise:` in a campaign file):

    3:idle              three neighbour VMs, booted and idle
    3:paused            three neighbour VMs, paused by the hypervisor
    2:cpu,1:membw       two running a CPU load, one a memory-bandwidth load

A state is what the hypervisor holds a neighbour VM in (absent and shutdown: not running;
paused; idle: running, nothing asked of it), a load it runs (from stress-ng, Debian's
package) or `workload`, a second copy of the whole workload. On the bare target a neighbour is
a process, so only loads and the workload apply there.

    groups = parse("2:cpu,1:membw")
    load = Load(groups[0], cpus="1", work=Path("work/run"))
    load.start()                   # one stress-ng process for the group, its stressors placed
    load.placement()               # where each stressor may run, read back from /proc
    metrics = load.stop()          # SIGINT: stress-ng stops and reports its bogo-ops per second

Standard library only: it runs on hosts and guests (docs/interference.md).
"""

from __future__ import annotations

import difflib
import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from .names import check_name

# States a neighbour VM is held in by the hypervisor. absent and shutdown are the same to the
# hypervisor (no vCPU exists); both are accepted because the study's tables name both.
VM_STATES = ("absent", "shutdown", "paused", "idle")
# Loads: the stress-ng stressor behind each, one instance per neighbour.
LOADS = {
    "cpu": "cpu",  # integer and floating-point work on one CPU
    "cache": "cache",  # thrashes the CPU caches
    "membw": "stream",  # STREAM copy/scale/add/triad: memory bandwidth
    "io": "hdd",  # writes and reads a file in the run's work directory
    "net": "sock",  # TCP over the loopback interface
}
# A second copy of the whole workload (the reference study's N workloads over M VMs): on the
# bare target a second run of the pipeline, started by the harness.
WORKLOAD = "workload"
STATES = (*VM_STATES, *LOADS, WORKLOAD)
# The STREAM arrays are sized from the last-level cache; a virtual CPU may report a huge one
# (480 MiB here), so the size stress-ng is told is at most this.
STREAM_CACHE_MAX = 64 * 1024 * 1024
IO_BYTES = "256M"
# Long enough for any run; the load is stopped with SIGINT when the run's sending ends.
TIMEOUT_S = 24 * 3600


class NoiseError(ValueError):
    """A NOISE text that names a state that does not exist or a count that is not one."""


@dataclass(frozen=True)
class Group:
    count: int
    state: str

    @property
    def is_load(self) -> bool:
        return self.state in LOADS

    def __str__(self) -> str:
        return f"{self.count}:{self.state}"


def parse(text: str | None) -> tuple[Group, ...]:
    """The groups of a NOISE text; () for none (unset, empty or "none")."""
    if text is None or text.strip() in ("", "none"):
        return ()
    groups = []
    for item in text.split(","):
        count, sep, state = item.strip().partition(":")
        if not sep or not count.strip().isdigit() or int(count) < 1:
            raise NoiseError(
                f"NOISE item {item.strip()!r} is COUNT:STATE with COUNT ≥ 1, e.g. 2:cpu"
            )
        state = state.strip()
        if state not in STATES:
            close = difflib.get_close_matches(state, STATES, n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise NoiseError(f"unknown NOISE state {state!r}{hint}; states: {', '.join(STATES)}")
        groups.append(Group(int(count), state))
    return tuple(groups)


def text(groups: tuple[Group, ...]) -> str:
    """The groups as a NOISE text, as meta.json records it ("" for none)."""
    return ",".join(str(g) for g in groups)


def parse_cpus(text: str) -> set[int]:
    """A taskset CPU list ("1", "0,2-3") as CPU numbers; NoiseError if it is not one."""
    cpus: set[int] = set()
    for item in text.split(","):
        low, dash, high = item.strip().partition("-")
        if not low.isdigit() or (dash and not high.isdigit()):
            raise NoiseError(f"{text!r} is not a CPU list such as 1 or 0,2-3")
        cpus.update(range(int(low), int(high or low) + 1))
    return cpus


def cpu_list(cpus: set[int]) -> str:
    """CPU numbers as a taskset list, e.g. {0, 2, 3} → "0,2-3"."""
    ranges: list[list[int]] = []
    for cpu in sorted(cpus):
        if ranges and cpu == ranges[-1][1] + 1:
            ranges[-1][1] = cpu
        else:
            ranges.append([cpu, cpu])
    return ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in ranges)


def stream_cache_bytes() -> int:
    """The last-level cache stress-ng's STREAM sizes its arrays from, capped."""
    caches = sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"))
    sizes = [parse_size(p.read_text()) for p in caches]
    found = max(sizes, default=0)
    return min(found, STREAM_CACHE_MAX) if found else STREAM_CACHE_MAX


def parse_size(value: str) -> int:
    """ "491520K" → bytes."""
    value = value.strip()
    units = {"K": 1024, "M": 1024**2, "G": 1024**3}
    if value and value[-1] in units:
        return int(value[:-1]) * units[value[-1]]
    return int(value)


def command(group: Group, cpus: str | None, work: Path, yaml_out: Path) -> list[str]:
    """stress-ng for one group of loads: COUNT instances of the load's stressor, placed on
    `cpus` (a taskset list) or anywhere, reporting its metrics to `yaml_out`."""
    stressor = LOADS[group.state]
    cmd = ["stress-ng", f"--{stressor}", str(group.count), "--timeout", f"{TIMEOUT_S}s"]
    if stressor == "stream":
        cmd += ["--stream-l3-size", str(stream_cache_bytes())]
    if stressor == "hdd":
        cmd += ["--hdd-bytes", IO_BYTES, "--temp-path", str(work)]
    if cpus:
        cmd += ["--taskset", cpus]
    return [*cmd, "--metrics", "--yaml", str(yaml_out)]


# STREAM's rates, which stress-ng prints in its log only: "stream  7397.96 memory read rate (MB
# per sec) ..."
RATE_LINE = re.compile(r"metrc: \[\d+\] (\S+)\s+([\d.]+) (memory \w+ rate \(MB per sec\))")


def parse_metrics(yaml_text: str, log_text: str = "") -> list[dict]:
    """Each stressor's metrics from stress-ng's --yaml file (its `metrics:` list of flat
    entries), with the extra rates it prints only in its log (STREAM's memory rate)."""
    entries: list[dict] = []
    inside = False
    for line in yaml_text.splitlines():
        if line.startswith("metrics:"):
            inside = True
            continue
        if not inside or not line.strip() or line.startswith("..."):
            continue
        if not line.startswith(" "):
            break
        key, _, value = line.strip().removeprefix("- ").partition(":")
        if line.strip().startswith("- "):
            entries.append({})
        if entries:
            entries[-1][key.strip()] = number(value.strip())
    extra = re.findall(RATE_LINE, log_text)
    for stressor, value, what in extra:
        for entry in entries:
            if entry.get("stressor") == stressor:
                entry[what.replace(" (MB per sec)", "_mb_per_s").replace(" ", "_")] = float(value)
    return entries


def number(value: str):
    try:
        return float(value) if "." in value else int(value)
    except ValueError:
        return value


def allowed_cpus(pid: int) -> str | None:
    """The CPUs a task may run on (/proc/PID/status Cpus_allowed_list); None if it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Cpus_allowed_list:"):
                return line.split(":", 1)[1].strip()
    except OSError:
        return None
    return None


def children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


class Load:
    """One group of loads as one stress-ng process on this machine."""

    def __init__(self, group: Group, cpus: str | None, work: Path, name: str) -> None:
        check_name(name, "a load's name")  # its files are work/<name>.yaml and .log
        if not group.is_load:
            raise NoiseError(f"{group.state} is a VM's state, not a load")
        if shutil.which("stress-ng") is None:
            raise NoiseError("no stress-ng: apt-get install stress-ng")
        self.group, self.cpus = group, cpus
        self.yaml = work / f"{name}.yaml"
        self.log = work / f"{name}.log"
        self.cmd = command(group, cpus, work, self.yaml)
        self.proc: subprocess.Popen | None = None
        self.started = 0.0

    def start(self) -> None:
        self.yaml.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "wb") as sink:
            self.proc = subprocess.Popen(self.cmd, stdout=sink, stderr=subprocess.STDOUT)
        self.started = time.monotonic()

    def placement(self, patience_s: float = 10.0) -> dict:
        """Where stress-ng and each of its stressors may run, once they all started."""
        deadline = time.monotonic() + patience_s
        stressors = children(self.proc.pid)
        while len(stressors) < self.group.count and time.monotonic() < deadline:
            time.sleep(0.05)
            stressors = children(self.proc.pid)
        return {
            "stress_ng_pid": self.proc.pid,
            "cpus_requested": self.cpus or "any",
            "stressors": {str(pid): allowed_cpus(pid) for pid in stressors},
        }

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> dict:
        """Stop it (SIGINT: stress-ng ends its stressors and writes its metrics); what it
        did. A load that ended by itself is reported with its exit code."""
        ended_early = self.proc.poll() is not None
        if not ended_early:
            os.kill(self.proc.pid, signal.SIGINT)
        try:
            code = self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        log_text = self.log.read_text(errors="replace") if self.log.exists() else ""
        yaml_text = self.yaml.read_text(errors="replace") if self.yaml.exists() else ""
        return {
            "group": str(self.group),
            "stressor": LOADS[self.group.state],
            "command": self.cmd,
            "exit_code": code,
            "ended_before_the_run": ended_early,
            "seconds": round(time.monotonic() - self.started, 3),
            "metrics": parse_metrics(yaml_text, log_text),
        }
