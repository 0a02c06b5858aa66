"""Where a run's parts run, chosen once per run (choose): this machine (bare.py) or a
provisioned KVM or Xen testbed (testbed.py). Everything a run does differently per target is a
method of the Target protocol below, so run() reads as one list of steps whatever the target;
each target is composed with its layout (one broker and job, or a cluster: *_layouts.py).

A target knows its two machines (messaging: Kafka, producers, consumer; real-time: the job),
where the inputs are on them, how to calibrate the TSC that stamps both ends, how to start the
broker, which scheduler takes the run's setting, and which facts describe the run.

What each target is before one is chosen (testbed or not, its backend, its inputs) is in
kinds.py, which the command line reads without loading any target.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # the targets load Kafka's and Flink's clients: only when one is chosen
    import subprocess

    from hvbench_agent.sched import Setting

    import tsc_timer
    from hvbench_harness.parts import Parts, Process
    from hvbench_harness.runspec import RunSpec
    from hvbench_harness.targets.common import Paths
    from hvbench_harness.testbed import Machine


class Target(Protocol):
    """What a run asks of where it runs (BareTarget, TestbedTarget)."""

    name: str  # bare, kvm or xen
    request: RunSpec
    messaging: Machine  # Kafka, the producers and the consumer (the first client pair)
    realtime: Machine  # the job
    paths: Paths  # the inputs and the work directory, where the parts read them
    ready_timeout_s: float  # for the job to answer the readiness probe
    subscribe_s: float  # for a consumer to get its partitions
    stall_s: float  # no result for this long while sending is a stall (unless STALL_S)
    job_shares_clock: bool  # the job stamps on the run's clock
    job_clocks: int  # the machines whose clocks the job's stamps come from
    taskmanagers: int | None  # a cluster's TaskManagers (None: SCALE=one)
    scheduler: object  # the Scheduler that takes the run's setting (hvbench_agent.sched)
    power: object  # the host's power policy (power.HostPower)
    energy: object  # the host's energy meter (power.EnergyMeter)

    def machines(self) -> set[Machine]: ...
    def client_machines(self) -> list[Machine]: ...
    def check(self, setting: Setting, require: list[str]) -> None: ...
    def describe(self) -> dict: ...
    def calibrate(self, parts: Parts) -> tuple[tsc_timer.Calibration, dict]: ...
    def calibrate_clients(self) -> list[dict]: ...
    def start_broker(self, parts: Parts) -> dict: ...
    def job_command(self, parts: Parts, job_args: list[str]) -> list[str]: ...
    def job_started(self, job: subprocess.Popen) -> str: ...
    def job_placement(self) -> dict: ...
    def part_pids(self, job: subprocess.Popen, load: dict) -> dict[str, list[int]]: ...
    def start_noise(self, parts: Parts) -> dict | None: ...
    def stop_noise(self) -> None: ...
    def noise_floor(self, setting: Setting, seconds: float) -> dict: ...
    def start_trace(self, parts: Parts) -> None: ...
    def stop_trace(self) -> None: ...
    def trace_result(self) -> tuple[str, dict] | None: ...
    def part_gone(self, job: subprocess.Popen) -> str | None: ...
    def broker_restarting(self) -> bool: ...
    def faults(self) -> list[dict]: ...
    def own_processes(self) -> dict[str, list[Process]]: ...
    def steal(self, figures: dict) -> dict: ...
    def facts(self) -> dict: ...


def choose(request: RunSpec, run_id: str, work: Path) -> Target:
    """The run's target, its machines and its scheduler checked and found ready, before
    anything starts; RunError (or the scheduler's Refused) otherwise, and nothing is left
    behind (a testbed's work directory, made to find the testbed, goes)."""
    from hvbench_harness import readiness
    from hvbench_harness.targets.bare import BareTarget
    from hvbench_harness.targets.testbed import TestbedTarget

    require = readiness.parse_require(request.require)
    try:
        if request.on_testbed:
            target: Target = TestbedTarget(request, run_id, work)
        else:
            target = BareTarget(request, run_id)
        target.check(request.setting, require)
        target.power.check()
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return target
