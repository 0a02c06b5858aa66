"""Where a run's parts run, chosen once per run: this machine (bare) or a provisioned KVM or
Xen testbed. Everything a run does differently per target is a method here, so run() reads as
one list of steps whatever the target.

A target knows its two machines (messaging: Kafka, producers, consumer; real-time: the job),
where the inputs are on them, how to calibrate the TSC that stamps both ends, how to start the
broker, which scheduler takes the run's setting, and which facts describe the run.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from hvbench_agent import facts as agent_facts
from hvbench_agent import neighbours, noise, tuning
from hvbench_agent.sched import Setting
from hvbench_agent.sched.linux import LinuxScheduler, threads_of
from hvbench_agent.trace import SchedTrace
from hvbench_analysis.results import BASELINE
from hvbench_job import clients
from hvbench_load.broker import HUNG, KafkaBroker, KafkaCluster

import tsc_timer
from hvbench_harness import readiness, spec
from hvbench_harness.accounting import pair_file
from hvbench_harness.cluster import LocalCluster, TestbedCluster
from hvbench_harness.hosttrace import HostTrace
from hvbench_harness.neighbours import LocalNoise, TestbedNoise, assign
from hvbench_harness.parts import (
    Parts,
    Process,
    RunError,
    line_queue,
    log,
    next_line,
    running,
    stopped_part,
    tail,
)
from hvbench_harness.power import EnergyMeter, HostPower
from hvbench_harness.runspec import RunSpec
from hvbench_harness.testbed import HostScheduler, Machine, Testbed, TestbedError, resolve

TOPICS = {"input": "input", "output": "output", "dead_letter": "dead-letter"}
CALIBRATION = "calibration.json"  # the run's TSC calibration; each client pair's (pair_file)


def topic_names(pairs: int) -> list[str]:
    """The run's topics: the input, each client pair's output (hvbench_job.clients), the dead
    letters."""
    return [TOPICS["input"], *clients.output_topics(pairs), TOPICS["dead_letter"]]


# Where a testbed's guests keep each network's traffic data, under their install directory.
DATA_DIRS = {"freeway": "pems", "bay": "pems-bay"}
# Threads of the job's JVM that handle records (comm names, cut to 15 characters by the
# kernel): the chained task of source + Python operator + sink, the Kafka source's fetcher,
# and the network thread of the results' Kafka sink: three threads, and one more per client
# pair past the first (its sink, job_threads). (Dead letters go out through the operator's own
# client, librdkafka's threads, which no result waits on.) SCHED=deadline applies to these on
# the bare target.
JOB_THREAD_PATTERNS = (r"^Source: kafka-", r"^Source Data Fet", r"^kafka-producer-")
JOB_THREADS = 3


def job_threads(pairs: int) -> int:
    """The job's record-handling threads per JVM: each client pair's sink has a producer."""
    return JOB_THREADS + pairs - 1


# The job's environment, wherever its Python runs (the client, or a TaskManager's JVM).
JOB_ENV = ("OPENBLAS_NUM_THREADS=1", "TF_CPP_MIN_LOG_LEVEL=2")


def job_env(work: str) -> list[str]:
    return ["env", *JOB_ENV, f"FLINK_LOG_DIR={work}/flink-log"]


@dataclass
class Paths:
    """Where the run's inputs and its work directory are on the machines that use them."""

    data: str
    model: str
    kafka_libs: str
    connector_dir: str
    work: str  # on the messaging and the real-time machine


@dataclass(frozen=True)
class Here:
    """What this machine gives a bare run, checked before anything starts: the C-state hold
    and the CPUs of the neighbours' loads (None: any)."""

    cpu_latency: tuning.CpuLatency
    noise_cpus: str | None


def check_readiness(results: dict, facts: dict, request: RunSpec) -> dict:
    """The machines' readiness checks (hvbench_harness.readiness): RunError if a required one
    fails and is not forced; else what meta.json records of them."""
    readiness.set_by_run(results, request.policy.given())
    doc = readiness.verdict(results, request.force, request.force_tsc)
    if doc["refused"]:
        raise RunError(readiness.refusal(doc))
    for failed in doc["failed_required"]:
        log(f"forced: {failed['machine']}: {failed['check']} is {failed['found']}")
    return {**doc, "facts": facts}


def rt_profiles(readiness_doc: dict) -> dict:
    """Each machine's real-time profile as read back before the run (hvbench_agent.rtprofile;
    {"provisioned": false} where none was provisioned)."""
    facts = readiness_doc.get("facts") or {}
    return {name: found.get("rt_profile") for name, found in facts.items()}


class BareTarget:
    """Every part on this machine; the setting goes to the job's JVM threads."""

    name = "bare"
    ready_timeout_s = 180.0
    stall_s = 8.0  # no result for this long while sending is a stall (unless STALL_S says)
    job_shares_clock = True  # the job adopts the run's calibration: one clock for every stamp
    job_clocks = 1  # the machines the job's stamps come from

    def __init__(self, request: RunSpec, run_id: str, here: Here):
        self.request, self.here = request, here
        self.cpu_latency = here.cpu_latency
        self.messaging = self.realtime = Machine("this machine")
        self.paths = Paths(
            request.data,
            request.model,
            request.kafka_libs,
            request.connector_dir,
            str(Path(request.work).resolve() / run_id),
        )
        self.cluster = (
            LocalCluster(request, Path(self.paths.work)) if request.scale == "cluster" else None
        )
        self.taskmanagers = request.taskmanagers  # None: no cluster
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
        if self.cluster is not None:
            self.broker = self.cluster.start_kafka(parts)
            return {**self.broker.describe(), "restarts_allowed": self.request.broker_restarts}
        self.broker = broker = KafkaBroker(self.request.kafka_libs, Path(self.paths.work) / "kafka")
        parts.on_teardown(lambda: parts.record("Kafka", broker.stop()))
        broker.start()
        broker.create_topics(topic_names(self.request.clients))
        broker.keep(self.request.broker_restarts)
        return {**broker.describe(), "restarts_allowed": self.request.broker_restarts}

    def job_command(self, parts: Parts, job_args: list[str]) -> list[str]:
        """The job's command; on a cluster, the session cluster is started first."""
        launch = [*self.job_prefix(), *job_env(self.paths.work)]
        if self.cluster is None:
            return [*launch, *self.realtime.module("hvbench_job.job", *job_args)]
        self.cluster.start_flink(parts, self.realtime, launch)
        return [*launch, *self.cluster.job_command(job_args)]

    def job_started(self, job: subprocess.Popen) -> str:
        """The setting applies to the job's JVM threads: find the JVMs."""
        if self.cluster is not None:
            self.jvm_pids = self.cluster.taskmanager_pids()
        elif (pid := job_jvm_pid(job)) is not None:
            self.jvm_pids = [pid]
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
        }
        if self.cluster is not None and self.cluster.jobmanager is not None:
            pids["flink jobmanager"] = [self.cluster.jobmanager.pid]
        return pids

    def job_placement(self) -> dict:
        """meta.json `job_cpus`: the CPUs asked for and those the JVM may use, read back."""
        return {
            "job_cpus": {
                "requested": self.request.job_cpus or "all",
                "jvm_readback": neighbours.allowed_cpus(self.jvm_pids[0]),
                **(
                    {"taskmanagers_readback": [neighbours.allowed_cpus(p) for p in self.jvm_pids]}
                    if self.cluster
                    else {}
                ),
            },
            **({"flink_cluster": self.cluster.describe()} if self.cluster else {}),
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
        record = self.noise.start()
        for process in self.noise.processes():  # the teardown checks that none is left
            self.seen.setdefault(process.pid, ("a neighbour (stress-ng)", process))
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
        self.trace = SchedTrace(f"hvbench-{Path(self.paths.work).name}", threads)
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
        if self.cluster is not None and (why := self.cluster.gone()):
            return why
        if self.broker is not None and (why := self.broker.failure):
            return why if HUNG in why else f"Kafka is gone: {why}"
        return None

    def flink_pids(self) -> dict[str, list[int]]:
        """The JVMs that handle the records, by name: the job's, or a cluster's."""
        if self.cluster is None:
            return {"the Flink job's JVM": self.jvm_pids}
        jobmanager = self.cluster.jobmanager
        return {
            "a Flink TaskManager's JVM": self.jvm_pids,
            "the Flink JobManager": [jobmanager.pid] if jobmanager else [],
        }

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


class TestbedTarget:
    """A provisioned KVM or Xen host: Kafka, producers and consumer in the messaging VM, the
    job in the real-time VM, the setting on the host through its agent."""

    ready_timeout_s = 900.0  # a JVM and a model inside a guest (very slow under emulation)
    # No result for this long while sending is a stall (unless STALL_S says): results from a
    # guest under emulation come in bursts seconds apart.
    stall_s = 30.0
    restarting = False  # the broker said it is being restarted ({"restarting": true})

    def __init__(self, request: RunSpec, run_id: str, work: Path):
        self.request, self.work = request, work
        work.mkdir(parents=True)
        self.testbed: Testbed = resolve(request.hosts, work / "testbed.json")
        if self.testbed.target != request.target:
            raise RunError(
                f"TARGET={request.target}, but {request.hosts} is a {self.testbed.target} testbed"
            )
        self.name = self.testbed.target
        self.messaging, self.realtime = self.testbed.messaging, self.testbed.realtime
        # the job stamps on the run's clock only where it runs on the messaging machine (the
        # same SSH destination), else on its own, whose offset the run's records bound
        self.job_shares_clock = self.realtime.ssh == self.messaging.ssh
        self.job_clocks = 1  # a cluster's TaskManagers may stamp on several (scale_out)
        base = self.testbed.install_dir  # where the guest roles put everything
        self.paths = Paths(
            f"{base}/data/{DATA_DIRS[request.network]}",
            f"{base}/model",
            f"{base}/kafka/libs",
            f"{base}/flink/lib",
            f"{self.testbed.work_dir}/{run_id}",
        )
        self.taskmanagers: int | None = None  # scale_out
        self.cluster = self.scale_out(request)
        self.scheduler = HostScheduler(self.testbed)
        self.power = HostPower([h.machine for h in self.testbed.each_host()], request.policy)
        self.energy = EnergyMeter(self.power.machines)
        self.readiness: dict = {}
        self.broker: subprocess.Popen | None = None
        self.broker_lines = None
        self.broker_faults: list[dict] = []
        self.trace: HostTrace | None = None
        self.noise: TestbedNoise | None = None
        self.hz = 0.0  # the messaging VM's TSC (calibrate)
        hosts = ", ".join(h.machine.ssh[-1] for h in self.testbed.each_host())
        log(
            f"testbed: host {hosts}, messaging VM, real-time VM "
            f"({', '.join(self.testbed.realtime_domains)})"
        )

    def scale_out(self, request: RunSpec) -> TestbedCluster | None:
        """SCALE=cluster: one TaskManager per real-time VM unless TASKMANAGERS says; the job
        shares the run's clock only if every TaskManager runs on the messaging machine."""
        if request.scale != "cluster":
            return None
        self.taskmanagers = request.taskmanagers or min(
            len(self.testbed.realtime_vms), spec.PRODUCERS
        )
        cluster = TestbedCluster(request, self.testbed, self.paths, self.taskmanagers)
        used = {vm.ssh for vm in self.testbed.realtime_vms[: self.taskmanagers]}
        self.job_shares_clock = used == {self.messaging.ssh}
        self.job_clocks = len(used)
        return cluster

    def machines(self) -> set[Machine]:
        used = {self.messaging, self.realtime, *self.client_machines()}
        return used | self.cluster.machines() if self.cluster else used

    def client_machines(self) -> list[Machine]:
        """Where each client pair runs: the messaging VMs in turn."""
        vms = self.testbed.messaging_vms
        return [vms[k % len(vms)] for k in range(self.request.clients)]

    def calibrate_clients(self) -> list[dict]:
        """Each pair's calibration in its own VM (meta.json `clock.clients`); a pair in the
        first messaging VM shares the run's."""
        found = []
        for pair, machine in enumerate(self.client_machines()):
            out = f"{self.paths.work}/{pair_file(CALIBRATION, pair)}"
            doc = {"client": pair, "machine": machine.name, "calibration": "the run's"}
            if pair > 0 and machine.ssh == self.messaging.ssh:
                machine.run(["cp", f"{self.paths.work}/{CALIBRATION}", out])
            elif pair > 0:
                command = machine.module("tsc_timer", "--out", out, *self.force_tsc())
                doc["calibration"] = json.loads(machine.run(command).stdout)
            found.append(doc)
        return found

    def check(self, setting: Setting, require: list[str]) -> None:
        """The neighbours asked for, admission and the domain on the host, then every
        machine's readiness."""
        neighbour_vms = [d for d, _ in self.testbed.neighbours]
        assign(self.request.noise_groups, neighbour_vms, self.testbed.workload_neighbours)
        self.check_data()
        self.scheduler.check(setting)
        self.readiness = check_readiness(
            *readiness.check_testbed(self.testbed, require), self.request
        )

    def check_data(self) -> None:
        """The network's data is where the producers read it (the guest bundle carries both
        networks'); data that says nothing of its network (real PeMS files) is taken as is."""
        data, machine = self.paths.data, self.messaging
        found = machine.run(["cat", f"{data}/generated.json"], check=False)
        if found.returncode == 0:
            generated_for = json.loads(found.stdout).get("network", "freeway")
            if generated_for != self.request.network:
                raise RunError(
                    f"the data at {data} in {machine.name} is for NETWORK={generated_for}, "
                    f"not {self.request.network}"
                )
        elif machine.run(["sh", "-c", f"ls {data}/*.txt.gz"], check=False).returncode != 0:
            raise RunError(
                f"no {self.request.network} data at {data} in {machine.name}: provision the "
                "testbed again (make provision bundles both networks' data)"
            )

    def describe(self) -> dict:
        return {
            "inputs": {"inventory": str(Path(self.request.hosts).resolve())},
            "hypervisor": self.hypervisor(),
            "guests": self.guests(),
            "readiness": self.readiness,
            "rt_profile": rt_profiles(self.readiness),
            "placement": {
                "kafka, producers, consumer": self.messaging.name,
                **self.pair_placement(),
                "flink job": self.realtime.name,
                "scheduler setting": self.setting_placement(),
                **self.unused_vms(),
            },
        }

    def setting_placement(self) -> str:
        """Where the scheduler setting is applied: on one host, prefixed by its name; with
        several, each host is named in turn."""
        if len(self.scheduler.hosts) > 1:
            return self.scheduler.where()
        return f"{self.scheduler.hosts[0].machine.name}: {self.scheduler.where()}"

    def unused_vms(self) -> dict:
        """The inventory's messaging and real-time VMs that run no part of this run: with
        SCALE=one all but the first of each, with SCALE=cluster those beyond BROKERS and
        TASKMANAGERS. Real-time VMs among them still get the scheduler setting."""
        tb, cluster = self.testbed, self.cluster is not None
        messaging = max(self.request.brokers if cluster else 1, self.request.clients)
        realtime = self.taskmanagers if cluster else 1
        unused = [vm.name for vm in (*tb.messaging_vms[messaging:], *tb.realtime_vms[realtime:])]
        return {"without a part": unused} if unused else {}

    def pair_placement(self) -> dict:
        """With CLIENTS > 1: where each client pair (producers and its consumer) runs."""
        machines = self.client_machines()
        if len(machines) == 1:
            return {}
        return {f"client pair {k}": machine.name for k, machine in enumerate(machines)}

    def hypervisor(self) -> dict:
        """The host's hypervisor as its agent found it before this run: Xen's version and
        changeset (Credit, Credit2 and RTDS behave differently across releases), or KVM's
        QEMU and libvirt."""
        facts = (self.readiness.get("facts") or {}).get(self.testbed.host.name) or {}
        found = facts.get(self.name) or {}
        if self.name == "xen":
            keep = ("version", "changeset", "build", "commandline", "scheduler")
            return {"name": "xen", **{k: found.get(k) for k in keep}}
        return {"name": self.name, **found}

    def guests(self) -> list[dict]:
        """Every guest on the hosts as the hypervisor has it before the run: state, vCPUs and
        the host CPUs they are pinned to; on Xen also the guest's type (pv, pvh, hvm) and
        cpupool. With several hosts each guest names its host (on_host)."""
        hosts = self.testbed.each_host()
        found = []
        for i, host in enumerate(hosts):
            names = [*host.messaging_domains, *host.realtime_domains]
            names += [domain for domain, _ in self.testbed.neighbours] if i == 0 else []
            domains = self.domains_on(host.machine, names)
            found += (
                [{**d, "on_host": host.machine.name} for d in domains]
                if len(hosts) > 1
                else domains
            )
        return found

    def domains_on(self, host: Machine, names: list[str]) -> list[dict]:
        words = ["domains", "read", "--backend", self.name]
        words += [a for name in names if name for a in ("--domain", name)]
        proc = host.run(host.agent(*words), root=True, check=False)
        if proc.returncode != 0:
            return [{"error": proc.stderr.strip() or "hvbench-agent domains read failed"}]
        return json.loads(proc.stdout)["domains"]

    def calibrate(self, parts: Parts) -> tuple[tsc_timer.Calibration, dict]:
        """The TSC calibration in the messaging VM, which stamps both ends."""
        parts.on_teardown(self.fetch_files)  # registered first: runs last
        for machine in self.machines():
            machine.run(["mkdir", "-p", f"{self.paths.work}/flink-log"], root=True)
        calibrate = self.messaging.module(
            "tsc_timer", "--out", f"{self.paths.work}/{CALIBRATION}", *self.force_tsc()
        )
        calibration = tsc_timer.Calibration(**json.loads(self.messaging.run(calibrate).stdout))
        self.hz = calibration.hz
        held = {
            "held": False,
            "reason": "a testbed's C-states are set by make provision (host_tuning)",
        }
        return calibration, held

    def force_tsc(self) -> list[str]:
        return ["--force"] if self.request.force_tsc else []

    def start_broker(self, parts: Parts) -> dict:
        """Kafka in the messaging VM, listening on the guests' private network only; on a
        cluster, its nodes over the messaging VMs."""
        if self.cluster is not None:
            return {
                **self.cluster.start_kafka(parts),
                "restarts_allowed": self.request.broker_restarts,
            }
        broker = parts.start(
            "Kafka",
            self.messaging,
            self.messaging.module(
                "hvbench_load.broker",
                "--libs",
                self.paths.kafka_libs,
                "--work",
                f"{self.paths.work}/kafka",
                "--host",
                self.testbed.messaging_address,
                "--topics",
                ",".join(topic_names(self.request.clients)),
                "--restarts",
                str(self.request.broker_restarts),
            ),
            stdout=subprocess.PIPE,
            stderr=open(parts.work / "broker.err", "wb"),  # noqa: SIM115 — the child's
        )
        self.broker_lines = line_queue(broker.stdout)
        first = next_line(self.broker_lines, 420)  # the broker waits up to 300 s
        if not first or not first.startswith("{"):
            raise RunError(
                f"Kafka did not start in {self.messaging.name}:\n" + tail(parts.work / "broker.err")
            )
        self.broker = broker
        return {**json.loads(first), "restarts_allowed": self.request.broker_restarts}

    def part_pids(self, _job: subprocess.Popen, _load: dict) -> dict[str, list[int]]:
        return {}  # the parts run in guests: their processes are not this machine's

    def job_started(self, job: subprocess.Popen) -> str:
        return f"in {self.realtime.name}"

    def job_command(self, parts: Parts, job_args: list[str]) -> list[str]:
        """The job in the real-time VM (whose vCPUs its inventory pins); on a cluster, the
        session cluster is started first and the job submitted to it from there."""
        env = job_env(self.paths.work)
        if self.cluster is None:
            return [*env, *self.realtime.module("hvbench_job.job", *job_args)]
        self.cluster.start_flink(parts, env)
        return self.cluster.job_command(env, job_args)

    def start_noise(self, parts: Parts) -> dict | None:
        """NOISE: every neighbour VM held as asked (those not named shut down), loads and
        workload copies started in them; without NOISE they are left as they are, and their
        states recorded."""
        if not self.testbed.neighbours:
            return None
        request = self.request
        per_detector = -(-request.records // spec.DETECTORS[request.network])
        longest_s = per_detector * request.send_ms / 1000 + request.warmup + request.drain
        self.noise = TestbedNoise(
            self.testbed, request.noise_groups, Path(self.work).name, longest_s, request
        )
        if not request.noise:
            return {"requested": "", "where": "neighbour VMs, left as they were",
                    "states_at_start": self.noise.read()}  # fmt: skip
        parts.on_teardown(self.noise.stop)
        return self.noise.start()

    def stop_noise(self) -> None:
        if self.noise is not None and self.request.noise:
            self.noise.stop()

    def job_placement(self) -> dict:
        return {"flink_cluster": self.cluster.describe()} if self.cluster else {}

    def part_gone(self, job: subprocess.Popen) -> str | None:
        """Why the run cannot go on: the job or the broker (or the SSH session that tethers
        it) ended; the broker reports its restarts as it goes (one JSON line each)."""
        work = Path(self.work)
        if job.poll() is not None:
            return (
                f"the Flink job in {self.realtime.name} (or its SSH session) ended with "
                f"{job.returncode}:\n{tail(work / 'job.out')}"
            )
        if self.cluster is not None:
            return self.cluster.gone()
        if self.broker is None:
            return None
        while (line := next_line(self.broker_lines, 0)) is not None:
            if line.startswith('{"restarting"'):
                self.restarting = True
            elif line.startswith('{"fault"'):
                self.broker_faults.append(json.loads(line)["fault"])
                self.restarting = False
        if self.broker.poll() is not None:
            err = tail(work / "broker.err")
            ended = (
                f"Kafka in {self.messaging.name} (or its SSH session) ended with "
                f"{self.broker.returncode}:\n{err}"
            )
            hung = [line.removeprefix("broker: ") for line in err.splitlines() if HUNG in line]
            return f"{hung[-1]}\n{ended}" if hung else ended
        return None

    def own_processes(self) -> dict[str, list[Process]]:
        return {}  # the parts run in guests; here only their SSH clients, in their own groups

    def broker_restarting(self) -> bool:
        return self.restarting

    def faults(self) -> list[dict]:
        return self.cluster.faults() if self.cluster else list(self.broker_faults)

    def start_trace(self, parts: Parts) -> None:
        """TRACE=1: the real-time VM's vCPUs as the host's scheduler ran them, from now until
        stop_trace (or the teardown), traced by the host's agent (hosttrace)."""
        self.trace = HostTrace(self.testbed, Path(self.work).name, self.hz)
        started = self.trace.start()
        parts.on_teardown(self.trace.stop)
        log(f"tracing the vCPUs of {self.testbed.realtime_domain} ({started['clock']} clock)")

    def stop_trace(self) -> None:
        summary = self.trace.stop()[1]
        aligned = summary["alignment"]
        how = f"aligned by {aligned['method']}" if aligned["known"] else "not aligned"
        log(f"trace stopped: {summary['lines']} events, {summary['dropped']} dropped, {how}")

    def trace_result(self) -> tuple[str, dict] | None:
        return None if self.trace is None else self.trace.result

    def noise_floor(self, setting: Setting, seconds: float) -> dict:
        """BASELINE=1: cyclictest inside the real-time VM for `seconds`, with the pipeline up
        and idle and the run's setting already on the VM's vCPUs (`hvbench-agent noise`).
        baseline.csv comes back with the run's other files."""
        machine = self.realtime
        log(f"noise floor: cyclictest in {machine.name} for {seconds:g} s, SCHED={setting.sched}")
        csv = f"{self.paths.work}/{BASELINE}"
        found = machine.run(
            machine.agent("noise", "--seconds", f"{seconds:g}", "--csv", csv),
            root=True,
            timeout=seconds + 120,
        )
        summary = json.loads(found.stdout)
        summary["where"] = f"in {machine.name}; the setting on the host: {self.scheduler.where()}"
        log(f"noise floor: {summary.get('count', 0)} wake-ups, max {summary.get('max_us')} µs")
        return summary

    def steal(self, figures: dict) -> dict:
        return figures  # one figure per machine

    def fetch_files(self) -> None:
        """The parts' own files (sent, received, dead letters, job settings, logs) come here,
        then the machines' copies go."""
        for machine in self.machines():
            try:
                machine.fetch(self.paths.work, self.work)
            except TestbedError as e:
                log(f"fetching the run's files failed: {e}")
                return  # keep them there
        for machine in self.machines():
            machine.run(["rm", "-rf", self.paths.work], root=True, check=False)

    def facts(self) -> dict:
        """Host and guest facts: the host's from Ansible, each guest's from itself."""
        found = {"host": self.testbed.host_facts}
        hosts = self.testbed.each_host()
        if len(hosts) > 1:
            found["hosts"] = {h.machine.name: h.facts for h in hosts}
        for role, machine in (("messaging", self.messaging), ("realtime", self.realtime)):
            proc = machine.run(
                machine.agent("facts", "host", "versions", "--model", self.paths.model),
                timeout=120,
            )
            found[role] = json.loads(proc.stdout)
        return {
            "model": found["realtime"].get("model_checksum"),
            "host": found,
            "versions": found["realtime"]["versions"],
            "stamps_where": f"in {self.messaging.name}",
        }


Target = BareTarget | TestbedTarget


def choose(request: RunSpec, run_id: str, work: Path, here: Here | None) -> Target:
    """The run's target, its scheduler checked and its machines found ready, before anything
    starts; RunError (or the scheduler's Refused) otherwise, and nothing is left behind (a
    testbed's work directory, made to find the testbed, goes). `here`: what this machine
    gives a bare run (run.check_machine)."""
    require = readiness.parse_require(request.require)
    try:
        if request.target == "bare":
            target: Target = BareTarget(request, run_id, here)
        else:
            target = TestbedTarget(request, run_id, work)
        target.check(request.setting, require)
        target.power.check()
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return target


def job_jvm_pid(job: subprocess.Popen) -> int | None:
    """The JVM that PyFlink started for the job (its child running PythonGatewayServer)."""
    children = Path(f"/proc/{job.pid}/task/{job.pid}/children")
    try:
        pids = [int(p) for p in children.read_text().split()]
    except OSError:
        return None
    for pid in pids:
        try:
            if b"PythonGatewayServer" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return pid
        except OSError:
            continue
    return None
