"""The bare target: every part on this machine, the scheduler setting on the job's JVM
threads (the bare-metal baseline)."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

from hvbench_agent import facts as agent_facts
from hvbench_agent import neighbours, noise, tuning
from hvbench_agent.sched import Setting
from hvbench_agent.sched.deadline import threads_of
from hvbench_agent.sched.linux import LinuxScheduler
from hvbench_agent.trace import JOB_EVENTS, SchedTrace
from hvbench_analysis.results import BASELINE
from hvbench_load.broker import HUNG, KafkaBroker, KafkaCluster

import tsc_timer
from hvbench_harness import build, readiness
from hvbench_harness.accounting import pair_file
from hvbench_harness.neighbours import NEIGHBOUR, LocalNoise, bare_noise_cpus
from hvbench_harness.parts import Parts, Process, RunError, log, running, stopped_part, tail
from hvbench_harness.power import EnergyMeter, HostPower
from hvbench_harness.runspec import RunSpec
from hvbench_harness.targets.bare_layouts import local_layout
from hvbench_harness.targets.common import (
    CALIBRATION,
    JOB_THREAD_PATTERNS,
    Here,
    Paths,
    check_readiness,
    job_env,
    job_threads,
    rt_profiles,
)
from hvbench_harness.testbed import HERE, Machine


class BareTarget:
    """Every part on this machine; the setting goes to the job's JVM threads."""

    name = "bare"
    ready_timeout_s = 180.0
    subscribe_s = 60.0
    stall_s = 8.0  # no result for this long while sending is a stall (unless STALL_S says)
    job_shares_clock = True  # the job adopts the run's calibration: one clock for every stamp
    job_clocks = 1  # the machines the job's stamps come from

    def __init__(self, request: RunSpec, run_id: str, here: Here | None = None):
        """here: what this machine gives the run (by default its inputs, made where missing,
        and the machine checked: build_inputs, check_machine)."""
        if here is None:
            check_job_runs_here()
            build_inputs(request)
            here = check_machine(request)
        self.request, self.here = request, here
        self.cpu_latency = self.here.cpu_latency
        self.messaging = self.realtime = HERE
        self.paths = Paths(
            request.data,
            request.model,
            request.kafka_libs,
            request.connector_dir,
            str(Path(request.work).resolve() / run_id),
        )
        self.layout = local_layout(request, Path(self.paths.work))
        self.taskmanagers = self.layout.taskmanagers  # None: SCALE=one
        threads = job_threads(request.clients) * (self.taskmanagers or 1)
        self.scheduler = LinuxScheduler(run_id, JOB_THREAD_PATTERNS, threads)
        self.power = HostPower([self.messaging], request.policy)  # this machine plays the host
        self.energy = EnergyMeter(self.power.machines)
        self.readiness: dict = {}
        self.broker: KafkaBroker | KafkaCluster | None = None
        self.jvm_pids: list[int] = []  # the job's JVM, or the TaskManagers' JVMs
        self.seen: dict[int, tuple[str, Process]] = {}  # the JVMs' and broker's, as watched
        self.trace: SchedTrace | None = None
        self.noise: LocalNoise | None = None

    def machines(self) -> set[Machine]:
        return {self.messaging}

    def client_machines(self) -> list[Machine]:
        """Where each client pair runs: here, every one."""
        return [self.messaging] * self.request.clients

    def calibrate_clients(self) -> list[dict]:
        """meta.json `clock.clients`: every pair here shares the run's calibration."""
        work = Path(self.paths.work)
        for pair in range(1, self.request.clients):
            shutil.copy(work / CALIBRATION, work / pair_file(CALIBRATION, pair))
        return [
            {"client": k, "machine": self.messaging.name, "calibration": "the run's"}
            for k in range(self.request.clients)
        ]

    def check(self, setting: Setting, require: list[str]) -> None:
        """Before anything starts: this machine's readiness and the scheduler's own check."""
        self.readiness = check_readiness(*readiness.check_here(require), self.request)
        self.scheduler.check(setting)

    def describe(self) -> dict:
        """What meta.json records of where the run ran and what it read."""
        request = self.request
        return {
            "inputs": {
                name: str(Path(value).resolve())
                for name, value in (
                    ("data", request.data),
                    ("model", request.model),
                    ("kafka_libs", request.kafka_libs),
                    ("connector_dir", request.connector_dir),
                )
            },
            "readiness": self.readiness,
            "rt_profile": rt_profiles(self.readiness),
        }

    def calibrate(self, parts: Parts) -> tuple[tsc_timer.Calibration, dict]:
        """The TSC calibration here, and the CPU latency limit held for the run."""
        calibration = tsc_timer.calibrate(force=self.request.force_tsc)
        self.cpu_latency.open()
        parts.on_teardown(self.cpu_latency.close)
        held = self.cpu_latency.describe()
        log(
            f"CPU latency limit held at {held['readback_us']} µs"
            if self.cpu_latency.fd is not None
            else f"CPU latency limit not held ({self.cpu_latency.not_held})"
        )
        return calibration, held

    def start_broker(self, parts: Parts) -> dict:
        self.broker = self.layout.start_kafka(parts)
        return {**self.broker.describe(), "restarts_allowed": self.request.broker_restarts}

    def job_command(self, parts: Parts, job_args: list[str]) -> list[str]:
        """The job's command; on a cluster, the session cluster is started first."""
        launch = [*self.job_prefix(), *job_env(self.paths.work)]
        return self.layout.job_command(parts, self.realtime, launch, job_args)

    def job_started(self, job: subprocess.Popen) -> str:
        """The setting applies to the job's JVM threads: find the JVMs."""
        self.jvm_pids = self.layout.jvm_pids(job)
        if not self.jvm_pids:
            raise RunError("the job's JVM was not found")
        self.scheduler.bind(*self.jvm_pids)
        return f"JVM pid {', '.join(map(str, self.jvm_pids))}"

    def job_prefix(self) -> list[str]:
        """JOB_CPUS: the job (PyFlink and its JVM, every thread they start) on those CPUs."""
        return ["taskset", "--cpu-list", self.request.job_cpus] if self.request.job_cpus else []

    def part_pids(self, job: subprocess.Popen, load: dict) -> dict[str, list[int]]:
        """The processes of each part, for the CPU they use while sending (harness.cpu)."""
        pids = {
            "kafka": self.broker.pids() if self.broker else [],
            "flink job": list(self.jvm_pids),
            "job client": [job.pid],  # PyFlink's driver; on a cluster, `flink run`
            **{name: [proc.pid for proc in procs] for name, procs in load.items()},
            **self.layout.other_pids(),
        }
        return pids

    def job_placement(self) -> dict:
        """meta.json `job_cpus`: the CPUs asked for and those the JVM may use, read back."""
        readback, placed = self.layout.job_placement(self.jvm_pids)
        return {
            "job_cpus": {
                "requested": self.request.job_cpus or "all",
                "jvm_readback": neighbours.allowed_cpus(self.jvm_pids[0]),
                **readback,
            },
            **placed,
        }

    def start_noise(self, parts: Parts) -> dict | None:
        """NOISE: the loads as processes here, on the CPUs NOISE_CPUS names."""
        request = self.request
        if not request.noise:
            return None
        self.noise = LocalNoise(
            request.noise_groups, self.here.noise_cpus, request, Path(self.paths.work)
        )
        parts.on_teardown(self.noise.stop)
        record = self.noise.start(parts)
        for process in self.noise.processes():  # the teardown checks that none is left
            self.seen.setdefault(process.pid, (NEIGHBOUR, process))
        return record

    def stop_noise(self) -> None:
        if self.noise is not None:
            self.noise.stop()

    def start_trace(self, parts: Parts) -> None:
        """TRACE=1: the kernel's sched events of the job's record-handling threads, from now
        until stop_trace (or the teardown)."""
        threads = {
            tid: name
            for pid in self.jvm_pids
            for tid, name in threads_of(pid, list(JOB_THREAD_PATTERNS))
        }
        self.trace = SchedTrace(f"hvbench-{Path(self.paths.work).name}", threads, events=JOB_EVENTS)
        self.trace.start()
        parts.on_teardown(self.trace.stop)
        log(f"tracing {len(threads)} threads of the job ({self.trace.clock} clock)")

    def stop_trace(self) -> None:
        summary = self.trace.stop()[1]
        log(f"trace stopped: {summary['lines']} events, {summary['dropped']} dropped")

    def noise_floor(self, setting: Setting, seconds: float) -> dict:
        """BASELINE=1: cyclictest here for `seconds`, its thread under the run's setting, with
        the pipeline up and idle (hvbench_agent.noise): every kept wake-up's latency to
        baseline.csv (µs), the summary to meta.json. A setting the probe cannot take is
        recorded, not fatal."""
        held = self.cpu_latency.describe()
        pm_qos = held.get("readback_us") if self.cpu_latency.fd is not None else None
        log(f"noise floor: cyclictest for {seconds:g} s under SCHED={setting.sched}")
        work = Path(self.paths.work)
        summary = noise.measure(setting, seconds, work / BASELINE, pm_qos, work.name)
        log(f"noise floor: {summary.get('count', 0)} wake-ups, max {summary.get('max_us')} µs")
        return summary

    def trace_result(self) -> tuple[str, dict] | None:
        """The trace's event lines and summary, if the run traced."""
        return None if self.trace is None else self.trace.result

    def part_gone(self, job: subprocess.Popen) -> str | None:
        """Why the run cannot go on: the job or its JVM exited or is stopped (the job's
        client, PyFlink's driver, is not on the records' path: see docs/running.md), Kafka is
        gone or hung for good."""
        work = Path(self.paths.work)
        if job.poll() is not None:
            end = tail(work / "job.out")
            return f"the Flink job exited with {job.returncode}; the end of its log:\n{end}"
        for pid in self.jvm_pids:
            if not Path(f"/proc/{pid}").exists():
                return f"the Flink job's JVM (pid {pid}) is gone:\n{tail(work / 'job.out')}"
        self.remember()
        if why := stopped_part(self.flink_pids()):
            return why
        if why := self.layout.gone():
            return why
        if self.broker is not None and (why := self.broker.failure):
            return why if HUNG in why else f"Kafka is gone: {why}"
        return None

    def flink_pids(self) -> dict[str, list[int]]:
        """The JVMs that handle the records, by name: the job's, or a cluster's."""
        return self.layout.flink_pids(self.jvm_pids)

    def remember(self) -> None:
        """The JVMs and the broker's processes as they are now, so that the teardown can
        tell them from a later process that reuses a pid (own_processes)."""
        pids = {**self.flink_pids(), "Kafka": self.broker.pids() if self.broker else []}
        for name, found in pids.items():
            for pid in found:
                if pid not in self.seen and (process := running(pid)) is not None:
                    self.seen[pid] = (name, process)

    def own_processes(self) -> dict[str, list[Process]]:
        """Processes of the run that are not the leaders of the process groups it started
        (the job's JVM, the broker's): the teardown checks that none is left."""
        self.remember()
        found: dict[str, list[Process]] = {}
        for name, process in self.seen.values():
            found.setdefault(name, []).append(process)
        return found

    def broker_restarting(self) -> bool:
        """Kafka is being restarted (no result can come meanwhile)."""
        return bool(self.broker is not None and self.broker.restarting)

    def faults(self) -> list[dict]:
        return list(self.broker.faults) if self.broker else []

    def steal(self, figures: dict) -> dict:
        return figures[self.messaging.name]  # one machine: the figure itself

    def facts(self) -> dict:
        manifest = json.loads((Path(self.request.model) / "manifest.json").read_text())
        return {
            "model": manifest.get("checksum"),
            "host": agent_facts.collect_host(),
            "versions": agent_facts.collect_versions(),
            "stamps_where": "on this machine",
        }


def data_network(data: Path) -> str | None:
    """The network `make data` generated `data` for (its generated.json); None for data
    that says nothing (real PeMS files)."""
    try:
        return json.loads((data / "generated.json").read_text()).get("network", "freeway")
    except (OSError, ValueError, AttributeError):
        return None


# What making the inputs printed (Maven's, TensorFlow's lines), off the run's screen.
INPUTS_LOG = "build/logs/workload-inputs.log"


def check_job_runs_here() -> None:
    """The bare target runs the Flink job on this machine, with PyFlink (apache-flink 2.3.0:
    wheels for CPython 3.11 and 3.12, none for 3.13). A controller installed to drive testbeds
    has none: refused at once, saying what it needs."""
    if importlib.util.find_spec("pyflink") is None:
        version = ".".join(map(str, sys.version_info[:2]))
        raise RunError(
            f"a run on this machine (the bare target) runs the Flink job here, and this Python "
            f"({version}, {sys.executable}) has no PyFlink: `make venv` makes one with it on "
            "Debian 12 (Python 3.11); `pip install 'hvbench-job[job]'` adds it under Python 3.11 "
            "or 3.12 (PyFlink has no wheels for 3.13). A testbed run (HOST= or INVENTORY=) "
            "needs none here"
        )


def build_inputs(request: RunSpec) -> None:
    """In a source checkout, make makes what a run here reads where it is missing: Kafka's and
    the connector's jars, the data for NETWORK and the model (minutes on a fresh clone: make
    workload-inputs), and cyclictest and stress-ng for BASELINE and NOISE (make rt-tools). The
    request is checked whole before (RunSpec.parse), so a bad setting builds nothing."""
    goals = ["workload-inputs", *(["rt-tools"] if request.baseline or request.noise else [])]
    paths = {"DATA_DIR": request.data, "MODEL_DIR": request.model}  # make runs in the checkout
    variables = {name: str(Path(path).resolve()) for name, path in paths.items()}
    if not (Path(request.model) / "manifest.json").exists():
        log(f"making the data and training the model first (minutes, once): {INPUTS_LOG}")
    try:
        build.make(goals, {**variables, "NETWORK": request.network}, log=build.REPO / INPUTS_LOG)
    except build.BuildError as e:
        raise RunError(str(e)) from None


def check_machine(request: RunSpec) -> Here:
    """What a bare run needs of this machine, before anything is started or touched: its model
    and data (for the request's NETWORK), its CPUs for JOB_CPUS and NOISE_CPUS, and the
    C-state hold."""
    for what, path in (
        ("model", Path(request.model) / "manifest.json"),
        ("data", Path(request.data)),
    ):
        if not path.exists():
            raise RunError(f"no {what} at {path} (make train / make data create it)")
    generated_for = data_network(Path(request.data))
    if generated_for not in (None, request.network):
        raise RunError(
            f"the data at {request.data} is for NETWORK={generated_for}, not {request.network} "
            f"(make data NETWORK={request.network} DATA_DIR=... makes it)"
        )
    noise_cpus = bare_noise_cpus(request.cpus)
    requested, why = request.cpu_latency_limit, ""
    if request.max_cstate is not None and requested == "auto":  # the run's idle states, not 0 µs
        requested, why = None, f"MAX_CSTATE={request.max_cstate} sets the idle states"
    cpu_latency = tuning.CpuLatency(requested, off_because=why)
    cpu_latency.check()
    return Here(cpu_latency, noise_cpus)
