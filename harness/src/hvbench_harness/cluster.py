"""SCALE=cluster on the bare target: the same run on a Kafka cluster and a Flink session
cluster, as processes on this machine.

- Kafka: BROKERS KRaft nodes (3 by default; each broker and controller), every topic on up to
  three of them, a write with acks=all (the producers' setting) acknowledged once up to two
  have it.
- Flink: a JobManager and TASKMANAGERS TaskManagers (2 by default, one slot each), every one its
  own JVM; the job runs at that parallelism, one task per TaskManager.
- Keyed by detector: the input topic has one partition per detector and each producer writes
  to its own, so each detector's records stay in order on one task, and Flink's source spreads
  the partitions over the tasks (no keyBy: that would add a network hand-off, see
  hvbench_job.job.ForecastAndRoute).

Every stamp is still taken on this machine's TSC: one clock for every latency.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

from hvbench_job import clients
from hvbench_job.session import FlinkSession
from hvbench_load.broker import KafkaCluster, free_port, new_cluster_id

from hvbench_harness import spec
from hvbench_harness.parts import Parts, RunError, ask_to_stop, line_queue, log, next_line, tail
from hvbench_harness.testbed import Machine

REPLICATION, MIN_INSYNC = 3, 2  # at most: fewer nodes hold fewer copies
INPUT_PARTITIONS = spec.PRODUCERS  # one per detector
READY_TIMEOUT_S = 180.0


class LocalCluster:
    """The cluster's parts for one run, in its work directory."""

    def __init__(self, request, work: Path):
        """request: the run's (runspec.py): its sizes, clients and where the jars are."""
        self.request, self.work = request, work
        self.kafka: KafkaCluster | None = None
        self.taskmanager_count = request.taskmanagers
        self.session = FlinkSession(
            work / "flink-cluster",
            request.connector_dir,
            taskmanagers=request.taskmanagers,
            rest_port=free_port(),
            rpc_port=free_port(),
            log_dir=work / "flink-log",  # kept with the run's logs, as the job's are
        )
        self.taskmanagers: list[subprocess.Popen] = []
        self.jobmanager: subprocess.Popen | None = None
        self.registered_s: float | None = None

    def start_kafka(self, parts: Parts) -> KafkaCluster:
        nodes = self.request.brokers
        self.kafka = kafka = KafkaCluster(
            self.request.kafka_libs,
            self.work / "kafka",
            nodes,
            min(REPLICATION, nodes),
            min(MIN_INSYNC, nodes),
        )
        parts.on_teardown(lambda: parts.record("Kafka cluster", kafka.stop()))
        kafka.start()
        kafka.create_topics(["input"], INPUT_PARTITIONS)
        kafka.create_topics([*clients.output_topics(self.request.clients), "dead-letter"])
        kafka.keep(self.request.broker_restarts)
        return kafka

    def start_flink(self, parts: Parts, machine: Machine, prefix: list[str]) -> None:
        """The JobManager and the TaskManagers (under `prefix`: JOB_CPUS), until every
        TaskManager has registered."""
        session = self.session
        session.prepare()
        logs = session.log_dir
        self.jobmanager = parts.start(
            "Flink JobManager",
            machine,
            session.jobmanager_command(),
            **output(logs / "jobmanager-out.log"),
        )
        for i in range(self.taskmanager_count):
            self.taskmanagers.append(
                parts.start(
                    f"Flink TaskManager {i + 1}",
                    machine,
                    [*prefix, *session.taskmanager_command()],
                    **output(logs / f"taskmanager-{i + 1}-out.log"),
                )
            )
        self.registered_s = session.wait_ready(READY_TIMEOUT_S, self.gone)
        log(
            f"Flink session cluster up: {self.taskmanager_count} TaskManagers in "
            f"{self.registered_s:.1f} s"
        )

    def job_command(self, job_args: list[str]) -> list[str]:
        parallelism = str(self.taskmanager_count)
        return self.session.submit_command([*job_args, "--parallelism", parallelism])

    def taskmanager_pids(self) -> list[int]:
        """start-foreground ends in exec: each started process is the TaskManager's JVM."""
        return [tm.pid for tm in self.taskmanagers]

    def gone(self) -> str | None:
        """Why the Flink cluster cannot serve (one of its JVMs exited), else None."""
        procs = [("JobManager", self.jobmanager)]
        procs += [(f"TaskManager {i + 1}", tm) for i, tm in enumerate(self.taskmanagers)]
        for name, proc in procs:
            if proc is not None and proc.poll() is not None:
                return f"the Flink {name} exited with {proc.returncode}; see {self.session.log_dir}"
        return None

    def describe(self) -> dict:
        """meta.json `flink_cluster`."""
        return {
            **self.session.describe(),
            "taskmanager_pids": self.taskmanager_pids(),
            "registered_s": None if self.registered_s is None else round(self.registered_s, 1),
            "parallelism": self.taskmanager_count,
            "input_partitions": INPUT_PARTITIONS,
            "keyed_by": "detector: producer i writes to input partition i",
        }


def free_ports_on(machine: Machine, address: str, count: int) -> list[int]:
    """`count` ports free on a machine's address (asked there: hvbench_load.broker)."""
    command = machine.module("hvbench_load.broker", "--host", address, "--free-ports", count)
    return json.loads(machine.run(command).stdout)


def output(path: Path) -> dict:
    """A part's stdout and stderr to a file (the child writes to it until it ends)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return {"stdout": open(path, "wb"), "stderr": subprocess.STDOUT}


class TestbedCluster:
    """SCALE=cluster on a testbed: the KRaft nodes over the messaging VMs and the TaskManagers
    over the real-time VMs, in turn (a layout with one VM of each runs them all there, as
    several services), the JobManager in the first real-time VM. Every part runs over SSH,
    tethered like the others (testbed.Machine.start); topics are created and checked from the
    first node, the JobManager's readiness from the first real-time VM, since only the guests
    reach their private network."""

    __test__ = False  # not a test class, despite its name

    def __init__(self, request, testbed, paths, taskmanagers: int):
        """request: the run's (runspec.py); taskmanagers: how many, over the real-time VMs."""
        self.request, self.testbed, self.paths = request, testbed, paths
        self.taskmanager_count = taskmanagers
        self.nodes: list[dict] = []  # node id, machine, address, ports, process, lines
        self.taskmanagers: list[tuple[Machine, subprocess.Popen]] = []
        self.jobmanager: subprocess.Popen | None = None
        self.registered_s: float | None = None
        self.flink_ports: tuple[int, int] = (0, 0)  # REST, RPC

    def machines(self) -> set[Machine]:
        used = {node["machine"] for node in self.nodes} | {m for m, _ in self.taskmanagers}
        return used | {self.testbed.realtime}

    def placement(self, vms: tuple, count: int) -> list[int]:
        """Which VM each of `count` processes goes to: in turn."""
        return [i % len(vms) for i in range(count)]

    def start_kafka(self, parts: Parts) -> dict:
        """Every node at once (each waits for a majority of the quorum), then each node's
        first line; the first node creates the topics once all serve."""
        tb, request = self.testbed, self.request
        where = self.placement(tb.messaging_vms, request.brokers)
        ports = {}
        for vm in set(where):
            machine, address = tb.messaging_vms[vm], tb.messaging_addresses[vm]
            ports[vm] = free_ports_on(machine, address, 2 * where.count(vm))
        replicas, insync = min(REPLICATION, request.brokers), min(MIN_INSYNC, request.brokers)
        for node, vm in enumerate(where, start=1):
            port, controller = ports[vm].pop(), ports[vm].pop()
            self.nodes.append({"id": node, "vm": vm, "machine": tb.messaging_vms[vm],
                               "address": tb.messaging_addresses[vm], "port": port,
                               "controller": controller})  # fmt: skip
        voters = ",".join(f"{n['id']}@{n['address']}:{n['controller']}" for n in self.nodes)
        peers = ",".join(f"{n['address']}:{n['port']}" for n in self.nodes)
        cluster_id = new_cluster_id()
        for node in self.nodes:
            command = node["machine"].module(
                "hvbench_load.broker", "--libs", self.paths.kafka_libs,
                "--work", f"{self.paths.work}/kafka/node-{node['id']}",
                "--host", node["address"], "--port", node["port"],
                "--controller-port", node["controller"], "--node-id", node["id"],
                "--voters", voters, "--cluster-id", cluster_id,
                "--replication", replicas, "--min-insync", insync,
                "--restarts", request.broker_restarts,
                *(["--topics", self.topics(), "--peers", peers] if node["id"] == 1 else []),
            )  # fmt: skip
            err = open(parts.work / f"broker-{node['id']}.err", "wb")  # noqa: SIM115 — the child's
            node["process"] = proc = parts.start(
                f"Kafka node {node['id']}", node["machine"], command,
                stdout=subprocess.PIPE, stderr=err,
            )  # fmt: skip
            node["lines"] = line_queue(proc.stdout)
        # asked to stop all at once, before each is waited for (the parts stop in reverse):
        # one after another, the last would wait for a quorum already gone
        parts.on_teardown(self.ask_nodes_to_stop)
        described = [self.first_line(parts, node) for node in self.nodes]
        log(f"Kafka cluster up: {len(self.nodes)} nodes, replication {replicas}")
        return {
            "version": described[0]["version"],
            "bootstrap": peers,
            "nodes": described,
            "replication": replicas,
            "min_insync": insync,
            "topics": described[0]["topics"],
            "placement": {f"node {n['id']}": n["machine"].name for n in self.nodes},
        }

    def ask_nodes_to_stop(self) -> None:
        for node in self.nodes:
            if node["process"].poll() is None:
                ask_to_stop(node["process"])

    def topics(self) -> str:
        outputs = ",".join(clients.output_topics(self.request.clients))
        return f"input:{INPUT_PARTITIONS},{outputs},dead-letter"

    def first_line(self, parts: Parts, node: dict) -> dict:
        """A node's first line: what it runs, once it serves (and, on the first node, once
        the topics are on every node); a RunError if it ends first."""
        deadline = time.monotonic() + 420  # a node waits up to 300 s for its quorum
        while (first := next_line(node["lines"], 1)) is None:
            if node["process"].poll() is not None or time.monotonic() > deadline:
                break
        if not first or not first.startswith("{"):
            raise RunError(
                f"Kafka node {node['id']} did not start in {node['machine'].name}:\n"
                + tail(parts.work / f"broker-{node['id']}.err")
            )
        return json.loads(first)

    def session_args(self, role: str, vm: int, name: str) -> list[str]:
        rest, rpc = self.flink_ports
        machine = self.testbed.realtime_vms[vm]
        return machine.module(
            "hvbench_job.session", role, "--work", f"{self.paths.work}/flink-cluster/{name}",
            "--connectors", self.paths.connector_dir, "--log-dir", f"{self.paths.work}/flink-log",
            "--host", self.testbed.realtime_addresses[vm],
            "--jobmanager", self.testbed.realtime_address, "--rest-port", rest, "--rpc-port", rpc,
            "--taskmanagers", self.taskmanager_count,
        )  # fmt: skip

    def start_flink(self, parts: Parts, env: list[str]) -> None:
        """The JobManager in the first real-time VM, the TaskManagers over all of them (under
        `env`, the job's environment), until every TaskManager has registered."""
        tb, first = self.testbed, self.testbed.realtime
        self.flink_ports = tuple(free_ports_on(first, tb.realtime_address, 2))
        logs = parts.work / "flink-log"  # beside the processes' own logs, fetched from there
        self.jobmanager = parts.start(
            "Flink JobManager", first, self.session_args("jobmanager", 0, "jobmanager"),
            **output(logs / "jobmanager-out.log"),
        )  # fmt: skip
        for i, vm in enumerate(self.placement(tb.realtime_vms, self.taskmanager_count), start=1):
            machine = tb.realtime_vms[vm]
            command = [*env, *self.session_args("taskmanager", vm, f"taskmanager-{i}")]
            proc = parts.start(
                f"Flink TaskManager {i}", machine, command,
                **output(logs / f"taskmanager-{i}-out.log"),
            )  # fmt: skip
            self.taskmanagers.append((machine, proc))
        wait = first.run(
            [*self.session_args("wait", 0, "client"), "--timeout", READY_TIMEOUT_S * 5],
            check=False, timeout=READY_TIMEOUT_S * 5 + 60,
        )  # fmt: skip
        if wait.returncode != 0:
            raise RunError(f"the Flink session cluster did not come up: {wait.stderr.strip()}")
        self.registered_s = float(wait.stdout.strip())
        log(
            f"Flink session cluster up: {self.taskmanager_count} TaskManagers in "
            f"{self.registered_s:.1f} s"
        )

    def job_command(self, env: list[str], job_args: list[str]) -> list[str]:
        """`flink run` from the first real-time VM, at the cluster's parallelism."""
        parallelism = ["--parallelism", str(self.taskmanager_count)]
        return [*env, *self.session_args("submit", 0, "client"), "--", *job_args, *parallelism]

    def gone(self) -> str | None:
        """Why the cluster cannot serve: one of its parts (or its SSH session) ended."""
        procs = [(f"Kafka node {n['id']}", n["machine"], n["process"]) for n in self.nodes]
        procs += [("Flink JobManager", self.testbed.realtime, self.jobmanager)]
        procs += [
            (f"Flink TaskManager {i + 1}", m, p) for i, (m, p) in enumerate(self.taskmanagers)
        ]
        for name, machine, proc in procs:
            if proc is not None and proc.poll() is not None:
                return f"{name} in {machine.name} (or its SSH session) ended with {proc.returncode}"
        return None

    def faults(self) -> list[dict]:
        """Each node's restarts, as it reported them ({"fault": ...} lines)."""
        found = []
        for node in self.nodes:
            while (line := next_line(node["lines"], 0)) is not None:
                if line.startswith('{"fault"'):
                    node.setdefault("faults", []).append(json.loads(line)["fault"])
            found += [{**f, "part": f"broker {node['id']}"} for f in node.get("faults", [])]
        return found

    def describe(self) -> dict:
        """meta.json `flink_cluster`."""
        rest, rpc = self.flink_ports
        return {
            "jobmanager": f"{self.testbed.realtime_address}:{rest}",
            "rpc_port": rpc,
            "taskmanagers": [m.name for m, _ in self.taskmanagers],
            "registered_s": None if self.registered_s is None else round(self.registered_s, 1),
            "parallelism": self.taskmanager_count,
            "input_partitions": INPUT_PARTITIONS,
            "keyed_by": "detector: producer i writes to input partition i",
        }
