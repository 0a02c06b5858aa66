"""A run's neighbours (NOISE=): on the bare target, loads as processes on this machine, placed
on the job's CPUs or apart from them (NOISE_CPUS, JOB_CPUS); on a testbed, the neighbour VMs
of the inventory held in a state or running a load. docs/interference.md.

The neighbours start once the setting is applied and stop when sending ends (or at the
teardown, for a run that fails); what each did, stress-ng's own bogo-ops per second, goes to
meta.json `noise`.
"""

from __future__ import annotations

import os
from pathlib import Path

from hvbench_agent import neighbours
from hvbench_agent.neighbours import Group, Load, NoiseError, cpu_list, parse_cpus

from hvbench_harness.parts import RunError, log


def check_request(args) -> tuple[Group, ...]:
    """NOISE, NOISE_CPUS and JOB_CPUS on their own (no machine is looked at): the groups, or
    RunError."""
    try:
        groups = neighbours.parse(args.noise)
        if args.job_cpus:
            parse_cpus(args.job_cpus)
    except NoiseError as e:
        raise RunError(str(e)) from None
    args.noise = neighbours.text(groups) or None  # "none" and "" are no neighbours
    if args.target != "bare":
        placed = [
            name
            for name, value in (
                ("JOB_CPUS", args.job_cpus),
                ("NOISE_CPUS", args.noise_cpus != "job"),
            )
            if value
        ]
        if placed:
            raise RunError(
                f"{' and '.join(placed)}: for the bare target; a testbed's guests and "
                "neighbours are placed by its inventory (make provision)"
            )
        return groups
    vm_states = [str(g) for g in groups if not g.is_load]
    if vm_states:
        raise RunError(
            f"NOISE {', '.join(vm_states)}: a VM's state; on the bare target a neighbour is a "
            f"process running a load ({', '.join(neighbours.LOADS)})"
        )
    if args.job_cpus and args.sched == "deadline":
        raise RunError(
            "SCHED=deadline needs the job's threads free to run on every CPU (the kernel "
            "refuses SCHED_DEADLINE to a thread pinned to some); leave JOB_CPUS unset"
        )
    return groups


def bare_noise_cpus(noise_cpus: str, job_cpus: str | None) -> str | None:
    """The CPUs the bare target's loads go on (None: any), from NOISE_CPUS and JOB_CPUS and
    this machine's CPUs, or RunError before anything starts."""
    online = set(os.sched_getaffinity(0))
    job = parse_cpus(job_cpus) if job_cpus else online
    if not job <= online:
        raise RunError(f"JOB_CPUS={job_cpus}: this machine runs on CPUs {cpu_list(online)}")
    return noise_cpu_list(noise_cpus, job_cpus, job, online)


def noise_cpu_list(
    noise_cpus: str, job_cpus: str | None, job: set[int], online: set[int]
) -> str | None:
    if noise_cpus == "job":
        return job_cpus or None
    if noise_cpus == "apart":
        rest = online - job
        if not job_cpus or not rest:
            raise RunError(
                "NOISE_CPUS=apart needs JOB_CPUS to leave CPUs to the loads, e.g. JOB_CPUS="
                f"{max(online)} on this machine's CPUs {cpu_list(online)}"
            )
        return cpu_list(rest)
    try:
        cpus = parse_cpus(noise_cpus)
    except NoiseError:
        raise RunError(f"NOISE_CPUS is job, apart or a CPU list, not {noise_cpus!r}") from None
    if not cpus <= online:
        raise RunError(f"NOISE_CPUS={noise_cpus}: this machine runs on CPUs {cpu_list(online)}")
    return cpu_list(cpus)


class LocalNoise:
    """The bare target's loads: one stress-ng per group, on `cpus` (None: any CPU)."""

    def __init__(self, groups: tuple[Group, ...], cpus: str | None, where: str, work: Path):
        self.loads = [Load(g, cpus, work, f"noise-{i}") for i, g in enumerate(groups)]
        self.record: dict = {
            "requested": neighbours.text(groups),
            "where": where,
            "cpus": cpus or "any",
            "groups": [],
        }
        self.stopped = False

    def start(self) -> dict:
        """Start every load; the record (meta.json `noise`), which stop() completes."""
        for load in self.loads:
            load.start()
        self.record["groups"] = [{"placement": load.placement()} for load in self.loads]
        for load, group in zip(self.loads, self.record["groups"], strict=True):
            if not load.alive():
                group["placement"]["error"] = "stress-ng ended at once (its log is kept)"
        log(f"noise: {self.record['requested']} on CPUs {self.record['cpus']}")
        return self.record

    def stop(self) -> None:
        if self.stopped:
            return
        self.stopped = True
        for load, group in zip(self.loads, self.record["groups"], strict=True):
            group.update(load.stop())
        done = [f"{g['group']} {bogo_rate(g):.0f} bogo-ops/s" for g in self.record["groups"]]
        log("noise stopped: " + ", ".join(done))

    def logs(self) -> list[Path]:
        return [load.log for load in self.loads if load.log.exists()]


def bogo_rate(group: dict) -> float:
    """A load's bogo-ops per second of wall-clock time, summed over its stressors."""
    return sum(m.get("bogo-ops-per-second-real-time", 0) for m in group.get("metrics", []))
