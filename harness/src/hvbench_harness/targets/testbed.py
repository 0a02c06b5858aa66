"""A testbed target: a provisioned KVM or Xen host, Kafka, producers and consumer in the
messaging VM, the job in the real-time VM, the setting on the host through its agent. The
harness stays on this machine and starts each part over SSH (hvbench_harness.testbed)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from hvbench_agent.sched import Setting
from hvbench_analysis.results import BASELINE

import tsc_timer
from hvbench_harness import readiness, spec
from hvbench_harness.accounting import pair_file
from hvbench_harness.hosttrace import HostTrace
from hvbench_harness.neighbours import TestbedNoise, assign
from hvbench_harness.parts import Parts, Process, RunError, log, tail
from hvbench_harness.power import EnergyMeter, HostPower
from hvbench_harness.runspec import RunSpec
from hvbench_harness.targets.common import (
    CALIBRATION,
    DATA_DIRS,
    Paths,
    check_readiness,
    job_env,
    rt_profiles,
)
from hvbench_harness.targets.host_scheduler import HostScheduler
from hvbench_harness.targets.kinds import kind
from hvbench_harness.targets.testbed_layouts import testbed_layout
from hvbench_harness.testbed import Machine, Testbed, TestbedError, resolve


class TestbedTarget:
    """A provisioned KVM or Xen host: Kafka, producers and consumer in the messaging VM, the
    job in the real-time VM, the setting on the host through its agent."""

    ready_timeout_s = 900.0  # a JVM and a model inside a guest (very slow under emulation)
    subscribe_s = 300.0  # a consumer started over SSH in a guest
    # No result for this long while sending is a stall (unless STALL_S says): results from a
    # guest under emulation come in bursts seconds apart.
    stall_s = 30.0

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
        base = self.testbed.install_dir  # where the guest roles put everything
        self.paths = Paths(
            f"{base}/data/{DATA_DIRS[request.network]}",
            f"{base}/model",
            f"{base}/kafka/libs",
            f"{base}/flink/lib",
            f"{self.testbed.work_dir}/{run_id}",
        )
        self.layout = testbed_layout(request, self.testbed, self.paths)
        self.taskmanagers = self.layout.taskmanagers  # None: SCALE=one
        # the job stamps on the run's clock only where it runs on the messaging machine (the
        # same SSH destination), else on its own, whose offset the run's records bound
        stamping = self.layout.job_machines()
        self.job_shares_clock = stamping == {self.messaging.ssh}
        self.job_clocks = len(stamping)
        self.scheduler = HostScheduler(self.testbed)
        self.power = HostPower([h.machine for h in self.testbed.each_host()], request.policy)
        self.energy = EnergyMeter(self.power.machines)
        self.readiness: dict = {}
        self.trace: HostTrace | None = None
        self.noise: TestbedNoise | None = None
        self.hz = 0.0  # the messaging VM's TSC (calibrate)
        hosts = ", ".join(h.machine.ssh[-1] for h in self.testbed.each_host())
        log(
            f"testbed: host {hosts}, messaging VM, real-time VM "
            f"({', '.join(self.testbed.realtime_domains)})"
        )

    def machines(self) -> set[Machine]:
        used = {self.messaging, self.realtime, *self.client_machines()}
        return used | self.layout.machines()

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
        tb, (messaging, realtime) = self.testbed, self.layout.used_vms()
        messaging = max(messaging, self.request.clients)
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
        keep = kind(self.name).hypervisor_facts
        return {"name": self.name, **({k: found.get(k) for k in keep} if keep else found)}

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
        return {**self.layout.start_kafka(parts), "restarts_allowed": self.request.broker_restarts}

    def part_pids(self, _job: subprocess.Popen, _load: dict) -> dict[str, list[int]]:
        return {}  # the parts run in guests: their processes are not this machine's

    def job_started(self, job: subprocess.Popen) -> str:
        return f"in {self.realtime.name}"

    def job_command(self, parts: Parts, job_args: list[str]) -> list[str]:
        """The job in the real-time VM (whose vCPUs its inventory pins); on a cluster, the
        session cluster is started first and the job submitted to it from there."""
        return self.layout.job_command(parts, job_env(self.paths.work), job_args)

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
        return self.layout.job_placement()

    def part_gone(self, job: subprocess.Popen) -> str | None:
        """Why the run cannot go on: the job, the broker or a cluster's part (or the SSH
        session that tethers it) ended."""
        if job.poll() is not None:
            return (
                f"the Flink job in {self.realtime.name} (or its SSH session) ended with "
                f"{job.returncode}:\n{tail(Path(self.work) / 'job.out')}"
            )
        return self.layout.gone()

    def own_processes(self) -> dict[str, list[Process]]:
        return {}  # the parts run in guests; here only their SSH clients, in their own groups

    def broker_restarting(self) -> bool:
        return self.layout.broker_restarting()

    def faults(self) -> list[dict]:
        return self.layout.faults()

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
