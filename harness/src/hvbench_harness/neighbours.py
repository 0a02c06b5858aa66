"""A run's neighbours (NOISE=): on the bare target, loads as processes on this machine, placed
on the job's CPUs or apart from them (NOISE_CPUS, JOB_CPUS); on a testbed, the neighbour VMs
of the inventory held in a state or running a load. docs/interference.md.

The neighbours start once the setting is applied and stop when sending ends (or at the
teardown, for a run that fails); what each did, stress-ng's own bogo-ops per second, goes to
meta.json `noise`.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from hvbench_agent import neighbours
from hvbench_agent.neighbours import (
    WORKLOAD,
    Group,
    Load,
    NoiseError,
    children,
    cpu_list,
    parse_cpus,
)

from hvbench_harness.parts import Parts, Process, RunError, log, running
from hvbench_harness.testbed import HERE, TestbedError
from hvbench_harness.workload_copy import RemoteWorkloadCopy, WorkloadCopy


@dataclass(frozen=True)
class CpuSets:
    """JOB_CPUS and NOISE_CPUS as parsed: the job's CPUs (None: any), and where the loads go
    (a set of CPUs, or "job" or "apart"). This machine's CPUs are checked once a bare run
    starts (bare_noise_cpus)."""

    job: frozenset[int] | None
    noise: frozenset[int] | str

    @classmethod
    def parse(cls, noise_cpus: str, job_cpus: str | None) -> CpuSets:
        try:
            job = frozenset(parse_cpus(job_cpus)) if job_cpus else None
        except NoiseError as e:
            raise RunError(f"JOB_CPUS: {e}") from None
        if noise_cpus == "apart" and not job:
            raise RunError("NOISE_CPUS=apart needs JOB_CPUS to leave CPUs to the loads")
        if noise_cpus in ("job", "apart"):
            return cls(job, noise_cpus)
        try:
            return cls(job, frozenset(parse_cpus(noise_cpus)))
        except NoiseError:
            raise RunError(f"NOISE_CPUS is job, apart or a CPU list, not {noise_cpus!r}") from None


def check_request(request) -> tuple[tuple[Group, ...], CpuSets]:
    """NOISE, NOISE_CPUS and JOB_CPUS of a request (runspec.py) on their own (no machine is
    looked at): the groups and the CPU sets, or RunError."""
    try:
        groups = neighbours.parse(request.noise)
    except NoiseError as e:
        raise RunError(str(e)) from None
    (check_testbed if request.on_testbed else check_bare)(request, groups)
    return groups, CpuSets.parse(request.noise_cpus, request.job_cpus)


def check_bare(request, groups: tuple[Group, ...]) -> None:
    vm_states = [str(g) for g in groups if g.state in neighbours.VM_STATES]
    if vm_states:
        raise RunError(
            f"NOISE {', '.join(vm_states)}: a VM's state; on the bare target a neighbour is a "
            f"process running a load ({', '.join(neighbours.LOADS)}) or the {WORKLOAD}"
        )
    if request.job_cpus and request.sched == "deadline":
        raise RunError(
            "SCHED=deadline needs the job's threads free to run on every CPU (the kernel "
            "refuses SCHED_DEADLINE to a thread pinned to some); leave JOB_CPUS unset"
        )


def check_testbed(request, groups: tuple[Group, ...]) -> None:
    given = {"JOB_CPUS": bool(request.job_cpus), "NOISE_CPUS": request.noise_cpus != "job"}
    placed = [name for name, set_here in given.items() if set_here]
    if placed:
        raise RunError(
            f"{' and '.join(placed)}: for the bare target; a testbed's guests and neighbours "
            "are placed by its inventory (make provision)"
        )


def bare_noise_cpus(cpus: CpuSets) -> str | None:
    """The CPUs the bare target's loads go on (None: any), from the request's CPU sets and
    this machine's CPUs, or RunError before anything starts."""
    online = set(os.sched_getaffinity(0))
    job = set(cpus.job or online)
    if not job <= online:
        raise RunError(f"JOB_CPUS={cpu_list(job)}: this machine runs on CPUs {cpu_list(online)}")
    if cpus.noise == "job":
        return cpu_list(job) if cpus.job else None
    if cpus.noise == "apart":
        rest = online - job
        if not rest:
            raise RunError(
                "NOISE_CPUS=apart needs JOB_CPUS to leave CPUs to the loads, e.g. JOB_CPUS="
                f"{max(online)} on this machine's CPUs {cpu_list(online)}"
            )
        return cpu_list(rest)
    if not cpus.noise <= online:
        raise RunError(
            f"NOISE_CPUS={cpu_list(cpus.noise)}: this machine runs on CPUs {cpu_list(online)}"
        )
    return cpu_list(cpus.noise)


NEIGHBOUR = "a neighbour (stress-ng)"


class LocalLoad(Load):
    """One group of loads as one stress-ng here, started as every part of a run is: on a
    Machine (this one, in a session of its own), through Parts."""

    part = NEIGHBOUR  # its name as a part of the run

    def start(self, launch: Callable[..., subprocess.Popen]) -> None:
        self.yaml.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "wb") as sink:
            self.proc = launch(self.cmd, stdout=sink, stderr=subprocess.STDOUT)
        self.started = time.monotonic()


class LocalNoise:
    """The bare target's neighbours: one stress-ng per group of loads, or a second run of the
    whole pipeline per workload copy, on `cpus` (None: any CPU)."""

    def __init__(self, groups: tuple[Group, ...], cpus: str | None, request, work: Path):
        self.parts: list[Load | WorkloadCopy] = []
        for i, group in enumerate(groups):
            if group.state == WORKLOAD:
                self.parts += [WorkloadCopy(request, cpus, work, f"workload-{i}-{k}")
                               for k in range(group.count)]  # fmt: skip
            else:
                self.parts.append(LocalLoad(group, cpus, work, f"noise-{i}"))
        self.record: dict = {
            "requested": neighbours.text(groups),
            "where": request.noise_cpus,
            "cpus": cpus or "any",
            "groups": [],
        }
        self.stopped = False

    def start(self, parts: Parts) -> dict:
        """Start every neighbour, each a part of the run here (Parts.launch: stop() stops
        them); the record (meta.json `noise`), which stop() completes."""
        for part in self.parts:
            part.start(parts.launcher(part.part, HERE))  # one that fails leaves those before it
            # to stop()
            self.record["groups"].append({"placement": part.placement()})
        for part, group in zip(self.parts, self.record["groups"], strict=True):
            if not part.alive():
                group["placement"]["error"] = "it ended at once (its log is kept)"
        log(f"noise: {self.record['requested']} on CPUs {self.record['cpus']}")
        return self.record

    def processes(self) -> list[Process]:
        """Each stress-ng and its stressors as they run now: the teardown checks that none is
        left (a stopped stress-ng killed after its grace leaves its stressors behind)."""
        pids = [p for part in self.loads() for p in (part.proc.pid, *children(part.proc.pid))]
        return [process for pid in pids if (process := running(pid)) is not None]

    def loads(self) -> list[LocalLoad]:
        return [p for p in self.parts if isinstance(p, LocalLoad) and p.proc is not None]

    def stop(self) -> None:
        if self.stopped:
            return
        self.stopped = True
        for process in self.processes():  # a stopped stress-ng keeps SIGINT pending
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGCONT)
        for part, group in zip(self.parts, self.record["groups"], strict=False):
            group.update(part.stop())  # the parts that started
        log("noise stopped: " + ", ".join(work_text(g) for g in self.record["groups"]))


def work_text(group: dict) -> str:
    """What one neighbour did, for the log."""
    if group.get("stressor") == WORKLOAD:
        return f"{group['group']} {group.get('records_per_s') or 0:.0f} records/s"
    return f"{group['group']} {bogo_rate(group):.0f} bogo-ops/s"


def bogo_rate(group: dict) -> float:
    """A load's bogo-ops per second of wall-clock time, summed over its stressors."""
    return sum(m.get("bogo-ops-per-second-real-time", 0) for m in group.get("metrics", []))


# What the hypervisor holds a neighbour in for each state; a load's VM runs.
HELD = {"absent": "absent", "shutdown": "shutdown", "paused": "paused", "idle": "running"}
BOOT_TIMEOUT_S = 900.0  # a neighbour started for the run must answer SSH by then (emulation)


def assign(
    groups: tuple[Group, ...], domains: list[str], with_workload: tuple[str, ...] = ()
) -> list[tuple[str, str]]:
    """(domain, state) for every provisioned neighbour, in order: each workload copy in a
    neighbour that has the workload (`with_workload`), the other states in the rest, shutdown
    for those no group names; RunError if the groups ask for more than there are."""
    states = [g.state for g in groups for _ in range(g.count)]
    copies = states.count(WORKLOAD)
    capable = [d for d in domains if d in with_workload]
    if copies > len(capable):
        raise RunError(
            f"NOISE asks for {copies} workload copies; this testbed has {len(capable)} "
            "neighbour VMs with the workload (hvbench_neighbours.workload: true in its "
            "inventory, then make provision)"
        )
    if len(states) > len(domains):
        raise RunError(
            f"NOISE asks for {len(states)} neighbours; this testbed has {len(domains)} "
            "(hvbench_neighbours.count in its inventory, then make provision)"
        )
    plan = dict.fromkeys(domains, "shutdown") | dict.fromkeys(capable[:copies], WORKLOAD)
    others = iter(s for s in states if s != WORKLOAD)
    for domain in [d for d in domains if d not in capable[:copies]]:
        plan[domain] = next(others, "shutdown")
    return list(plan.items())


class TestbedNoise:
    """A testbed's neighbour VMs held in their states through the host's agent, and loads
    (stress-ng, in the guest image) or workload copies started in them over SSH. stress-ng
    gets a timeout of its own beyond the run's length, and a copy sends a fixed number of
    records, so a lost connection cannot leave either behind for good."""

    __test__ = False  # not a test class, despite its name

    def __init__(
        self, testbed, groups: tuple[Group, ...], run_name: str, longest_s: float, request=None
    ):
        """longest_s: how long the run may last; request: the run's (runspec.py), which a
        workload copy follows (its rate and inputs)."""
        self.testbed, self.request, self.run_name = testbed, request, run_name
        self.machines = dict(testbed.neighbours)
        self.plan = assign(groups, list(self.machines), testbed.workload_neighbours)
        self.timeout_s = round(longest_s + 600)
        self.loads: dict[str, tuple[Group, int]] = {}  # domain → (its load, stress-ng's pid)
        self.copies: dict[str, RemoteWorkloadCopy] = {}
        self.stressors: dict[str, dict[str, str]] = {}  # domain → {stressor's pid: its CPUs}
        self.record: dict = {"requested": neighbours.text(groups), "where": "neighbour VMs"}
        self.stopped = False

    def agent(self, *args: str) -> list[dict]:
        host = self.testbed.host
        proc = host.run(host.agent("domains", *args, "--backend", self.testbed.target), root=True)
        return json.loads(proc.stdout)["domains"]

    def read(self) -> list[dict]:
        return self.agent("read", *[a for d in self.machines for a in ("--domain", d)])

    def start(self) -> dict:
        """Every neighbour in its state, the running ones answering, the loads started; the
        states read back."""
        for state in dict.fromkeys(HELD.get(s, "running") for _, s in self.plan):
            names = [d for d, s in self.plan if HELD.get(s, "running") == state]
            self.agent("hold", "--state", state, *[a for d in names for a in ("--domain", d)])
        for domain, state in self.plan:
            if HELD.get(state) is None or state == "idle":
                wait_until_answering(self.machines[domain])
            if state in neighbours.LOADS:
                self.loads[domain] = (Group(1, state), self.start_load(domain, state))
                self.stressors[domain] = self.wait_started(domain)
            if state == WORKLOAD:
                self.copies[domain] = self.start_copy(domain)
        self.record |= {
            "plan": [{"domain": d, "state": s} for d, s in self.plan],
            "states_at_start": self.read(),
        }
        log(f"noise: {self.record['requested']} over {len(self.plan)} neighbour VM(s)")
        return self.record

    def files(self, domain: str) -> tuple[str, str]:
        base = f"/tmp/hvbench-noise-{self.run_name}-{domain}"
        return f"{base}.yaml", f"{base}.log"

    def start_load(self, domain: str, state: str) -> int:
        yaml_out, log_out = self.files(domain)
        cmd = neighbours.command(Group(1, state), None, Path("/tmp"), Path(yaml_out))
        cmd[cmd.index("--timeout") + 1] = f"{self.timeout_s}s"
        script = f"nohup {shlex.join(cmd)} >{log_out} 2>&1 </dev/null & echo $!"
        return int(self.machines[domain].run(["sh", "-c", script], root=True).stdout.split()[-1])

    def wait_started(self, domain: str) -> dict[str, str]:
        """Once stress-ng runs its stressors in the neighbour, each stressor's pid and the CPUs
        it may use there. A slow guest takes seconds to start stress-ng, and stress-ng stopped
        before then writes no metrics (see STRESS_NG_SH): the run measures only once they run. A
        stress-ng that ends or hangs before then is a RunError, with its log."""
        machine, (_, log_out) = self.machines[domain], self.files(domain)
        pid, tries = self.loads[domain][1], round(START_PATIENCE_S / 0.1)
        script = (
            f"{STRESS_NG_SH} pid={pid}; i=0; while alive && ! started && [ $i -lt {tries} ]; "
            "do sleep 0.1; i=$((i+1)); done; started && for c in $(stressors); do "
            "echo $c $(sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' /proc/$c/status); done; "
            f"echo {SEPARATOR}; alive && echo running || echo ended; cat {log_out}"
        )
        out = machine.run(["sh", "-c", script], root=True).stdout
        started, _, rest = out.partition(SEPARATOR + "\n")
        stressors = dict(line.split(" ", 1) for line in started.splitlines() if " " in line)
        if stressors:
            return stressors
        alive, _, log_text = rest.partition("\n")
        why = f"hangs before its stressors run ({START_PATIENCE_S:.0f} s)" if alive == "running" \
            else "ended before its stressors ran"  # fmt: skip
        raise RunError(f"stress-ng in {domain} {why}: {log_text.strip()[-1000:] or '(no log)'}")

    def start_copy(self, domain: str) -> RemoteWorkloadCopy:
        copy = RemoteWorkloadCopy(
            self.machines[domain], self.request, self.testbed.install_dir, self.testbed.work_dir,
            f"{self.run_name}-{domain}",
        )  # fmt: skip
        copy.start()
        return copy

    def stop(self) -> None:
        """Stop the loads (SIGINT: stress-ng writes its metrics) and the workload copies, and
        read the states back."""
        if self.stopped:
            return
        self.stopped = True
        done = []
        for domain, (group, pid) in self.loads.items():
            stressors = self.stressors.get(domain, {})
            done.append({"domain": domain, "group": str(group), "stressors": stressors,
                         **self.stop_load(domain, pid)})  # fmt: skip
        for domain, copy in self.copies.items():
            done.append({"domain": domain, "placement": copy.placement(), **copy.stop()})
        self.record["loads"] = done
        try:
            self.record["states_at_end"] = self.read()
        except TestbedError as e:
            self.record["states_at_end"] = {"error": str(e)}
        rates = [f"{g['domain']} {work_text(g).partition(' ')[2]}" for g in done]
        log("noise stopped" + (": " + ", ".join(rates) if rates else ""))

    def stop_load(self, domain: str, pid: int) -> dict:
        """Stop a neighbour's stress-ng and read what it wrote (its files go once read)."""
        machine, (yaml_out, log_out) = self.machines[domain], self.files(domain)
        script = (
            f"{STRESS_NG_SH} pid={pid}; kill -INT $pid 2>/dev/null; kill -CONT $pid 2>/dev/null; "
            f"i=0; while alive && [ $i -lt {round(STOP_GRACE_S / 0.1)} ]; do sleep 0.1; "
            "i=$((i+1)); done; "
            f"alive && kill -KILL $pid; cat {yaml_out}; echo {SEPARATOR}; cat {log_out}"
        )
        try:
            out, lost = send_stop(machine, script)
            if out is not None:
                machine.run(["rm", "-f", yaml_out, log_out], root=True, check=False)
        except TestbedError as e:
            out, lost = None, [str(e)]
        if out is None:
            return {"error": "the load could not be stopped or read: " + "; ".join(lost)}
        yaml_text, _, log_text = out.partition(SEPARATOR)
        read = {"connections_lost": lost} if lost else {}
        metrics = neighbours.parse_metrics(yaml_text, log_text)
        if not metrics:  # stress-ng wrote none: keep what it said instead
            return {
                "metrics": [],
                "log": log_text.strip()[-2000:] or "(stress-ng wrote nothing)",
            } | read
        return {"metrics": metrics} | read


def send_stop(machine, script: str) -> tuple[str | None, list[str]]:
    """The stop script's output (None if it never came) and the connections lost on the way.
    A lost connection (ssh's exit 255 with the output cut short: a loaded neighbour's sshd
    answers late) gets the stop sent once more over a new one: the load must not outlive the
    run, and the stop is idempotent (a SIGINT to an ended stress-ng does nothing)."""
    lost = []
    for _ in range(2):
        proc = machine.run(["sh", "-c", script], root=True, check=False)
        if SEPARATOR in proc.stdout:
            return proc.stdout, lost
        lost.append(f"exit {proc.returncode}: {proc.stderr.strip()[-500:] or '(no output)'}")
    return None, lost


SEPARATOR = "--- hvbench: the log follows ---"
STOP_GRACE_S = 30.0  # for a stopped stress-ng to write its metrics and end, before SIGKILL
START_PATIENCE_S = 180.0  # for stress-ng's stressors to start in a neighbour (nested TCG: slow)
# Shell functions on stress-ng's $pid in a neighbour. alive: not ended (a zombie has ended).
# started: it catches SIGINT and its stressors run. stress-ng sets its SIGINT handler first and
# forks its stressors next; a SIGINT before then (a slow guest takes seconds to start it) ends
# it without a word, and it writes no metrics.
STRESS_NG_SH = (
    'status() { sed -n "s/^$1:[[:space:]]*//p" /proc/$pid/status 2>/dev/null; }; '
    'alive() { s=$(status State); [ -n "$s" ] && [ "${s#Z}" = "$s" ]; }; '
    "stressors() { cat /proc/$pid/task/$pid/children 2>/dev/null; }; "
    'started() { m=$(status SigCgt); [ -n "$m" ] && [ $((0x$m & 2)) -ne 0 ] && '
    '[ -n "$(stressors)" ]; };'
)


def wait_until_answering(machine, timeout_s: float = BOOT_TIMEOUT_S) -> None:
    """Until the neighbour answers over SSH (it has booted); RunError after timeout_s, or at
    once when it answers but refuses the key (no boot will change that)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            machine.run(["true"], timeout=60)
            return
        except TestbedError as e:
            if "Permission denied" in str(e):
                raise RunError(f"{machine.name} refuses the testbed's SSH key: {e}") from None
            if time.monotonic() > deadline:
                raise RunError(f"{machine.name} did not answer in {timeout_s:.0f} s: {e}") from None
            time.sleep(5)
