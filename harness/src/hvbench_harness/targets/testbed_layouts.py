"""A testbed target's two layouts (SCALE): Kafka in the messaging VM and the job in the
real-time VM, or a Kafka cluster over the messaging VMs and a Flink session cluster over the
real-time VMs. Every part runs over SSH, tethered (testbed.Machine.start). The target is
composed with one of them and asks it where each part runs; it holds no branch on the scale.
"""

from __future__ import annotations

import json
import subprocess
import time

from hvbench_job import clients
from hvbench_load.broker import HUNG, new_cluster_id

from hvbench_harness import spec
from hvbench_harness.parts import Parts, RunError, ask_to_stop, line_queue, log, next_line, tail
from hvbench_harness.runspec import RunSpec
from hvbench_harness.targets.common import (
    INPUT_PARTITIONS,
    MIN_INSYNC,
    READY_TIMEOUT_S,
    REPLICATION,
    Paths,
    output,
    topic_names,
)
from hvbench_harness.testbed import Machine, Testbed


def testbed_layout(request: RunSpec, testbed: Testbed, paths: Paths) -> TestbedOne | TestbedCluster:
    """SCALE=cluster: one TaskManager per real-time VM unless TASKMANAGERS says."""
    if request.scale != "cluster":
        return TestbedOne(request, testbed, paths)
    taskmanagers = request.taskmanagers or min(len(testbed.realtime_vms), spec.PRODUCERS)
    return TestbedCluster(request, testbed, paths, taskmanagers)


class TestbedOne:
    """SCALE=one: Kafka in the messaging VM, listening on the guests' private network only;
    the job in the real-time VM. The broker reports its restarts as it goes (one JSON line
    each)."""

    __test__ = False  # not a test class, despite its name
    taskmanagers = None

    def __init__(self, request: RunSpec, testbed: Testbed, paths: Paths):
        self.request, self.testbed, self.paths = request, testbed, paths
        self.broker: subprocess.Popen | None = None
        self.lines = None
        self.broker_faults: list[dict] = []
        self.restarting = False  # the broker said it is being restarted ({"restarting": true})
        self.err = None  # the broker's stderr, here

    def start_kafka(self, parts: Parts) -> dict:
        messaging = self.testbed.messaging
        command = messaging.module(
            "hvbench_load.broker",
            *("--libs", self.paths.kafka_libs, "--work", f"{self.paths.work}/kafka"),
            *("--host", self.testbed.messaging_address),
            *("--topics", ",".join(topic_names(self.request.clients))),
            *("--restarts", str(self.request.broker_restarts)),
        )
        self.err = parts.work / "broker.err"
        broker = parts.start(
            "Kafka",
            messaging,
            command,
            stdout=subprocess.PIPE,
            stderr=open(self.err, "wb"),  # noqa: SIM115 — the child's
        )
        self.lines = line_queue(broker.stdout)
        first = next_line(self.lines, 420)  # the broker waits up to 300 s
        if not first or not first.startswith("{"):
            raise RunError(f"Kafka did not start in {messaging.name}:\n" + tail(self.err))
        self.broker = broker
        return json.loads(first)

    def job_command(self, _parts: Parts, env: list[str], job_args: list[str]) -> list[str]:
        """The job in the real-time VM (whose vCPUs its inventory pins)."""
        return [*env, *self.testbed.realtime.module("hvbench_job.job", *job_args)]

    def job_machines(self) -> set[str]:
        return {self.testbed.realtime.ssh}

    def used_vms(self) -> tuple[int, int]:
        return 1, 1

    def machines(self) -> set[Machine]:
        return set()

    def job_placement(self) -> dict:
        return {}

    def gone(self) -> str | None:
        """Why Kafka cannot serve: it (or its SSH session) ended; its restart lines read."""
        if self.broker is None:
            return None
        while (line := next_line(self.lines, 0)) is not None:
            if line.startswith('{"restarting"'):
                self.restarting = True
            elif line.startswith('{"fault"'):
                self.broker_faults.append(json.loads(line)["fault"])
                self.restarting = False
        if self.broker.poll() is None:
            return None
        err = tail(self.err)
        ended = (
            f"Kafka in {self.testbed.messaging.name} (or its SSH session) ended with "
            f"{self.broker.returncode}:\n{err}"
        )
        hung = [line.removeprefix("broker: ") for line in err.splitlines() if HUNG in line]
        return f"{hung[-1]}\n{ended}" if hung else ended

    def broker_restarting(self) -> bool:
        return self.restarting

    def faults(self) -> list[dict]:
        return list(self.broker_faults)


def free_ports_on(machine: Machine, address: str, count: int) -> list[int]:
    """`count` ports free on a machine's address (asked there: hvbench_load.broker)."""
    command = machine.module("hvbench_load.broker", "--host", address, "--free-ports", count)
    return json.loads(machine.run(command).stdout)


class TestbedCluster:
    """SCALE=cluster on a testbed: the KRaft nodes over the messaging VMs and the TaskManagers
    over the real-time VMs, in turn (a layout with one VM of each runs them all there, as
    several services), the JobManager in the first real-time VM. Every part runs over SSH,
    tethered like the others (testbed.Machine.start); topics are created and checked from the
    first node, the JobManager's readiness from the first real-time VM, since only the guests
    reach their private network."""

    __test__ = False  # not a test class, despite its name

    def __init__(self, request: RunSpec, testbed: Testbed, paths: Paths, taskmanagers: int):
        """request: the run's (runspec.py); taskmanagers: how many, over the real-time VMs."""
        self.request, self.testbed, self.paths = request, testbed, paths
        self.taskmanagers = taskmanagers
        self.nodes: list[dict] = []  # node id, machine, address, ports, process, lines
        self.taskmanager_procs: list[tuple[Machine, subprocess.Popen]] = []
        self.jobmanager: subprocess.Popen | None = None
        self.registered_s: float | None = None
        self.flink_ports: tuple[int, int] = (0, 0)  # REST, RPC

    def job_machines(self) -> set[str]:
        """The SSH destinations whose clocks stamp the job's records: the TaskManagers'."""
        return {vm.ssh for vm in self.testbed.realtime_vms[: self.taskmanagers]}

    def used_vms(self) -> tuple[int, int]:
        """How many of the messaging and real-time VMs run a part (before the client pairs)."""
        return self.request.brokers, self.taskmanagers

    def broker_restarting(self) -> bool:
        return False  # a node's restart is reported as a fault once done

    def job_placement(self) -> dict:
        return {"flink_cluster": self.describe()}

    def machines(self) -> set[Machine]:
        used = {node["machine"] for node in self.nodes} | {m for m, _ in self.taskmanager_procs}
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
            "--taskmanagers", self.taskmanagers,
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
        for i, vm in enumerate(self.placement(tb.realtime_vms, self.taskmanagers), start=1):
            machine = tb.realtime_vms[vm]
            command = [*env, *self.session_args("taskmanager", vm, f"taskmanager-{i}")]
            proc = parts.start(
                f"Flink TaskManager {i}", machine, command,
                **output(logs / f"taskmanager-{i}-out.log"),
            )  # fmt: skip
            self.taskmanager_procs.append((machine, proc))
        wait = first.run(
            [*self.session_args("wait", 0, "client"), "--timeout", READY_TIMEOUT_S * 5],
            check=False, timeout=READY_TIMEOUT_S * 5 + 60,
        )  # fmt: skip
        if wait.returncode != 0:
            raise RunError(f"the Flink session cluster did not come up: {wait.stderr.strip()}")
        self.registered_s = float(wait.stdout.strip())
        log(
            f"Flink session cluster up: {self.taskmanagers} TaskManagers in "
            f"{self.registered_s:.1f} s"
        )

    def job_command(self, parts: Parts, env: list[str], job_args: list[str]) -> list[str]:
        """The session cluster, started, and `flink run` from the first real-time VM at its
        parallelism."""
        self.start_flink(parts, env)
        return self.submit_command(env, job_args)

    def submit_command(self, env: list[str], job_args: list[str]) -> list[str]:
        """`flink run` from the first real-time VM, at the cluster's parallelism."""
        parallelism = ["--parallelism", str(self.taskmanagers)]
        return [*env, *self.session_args("submit", 0, "client"), "--", *job_args, *parallelism]

    def gone(self) -> str | None:
        """Why the cluster cannot serve: one of its parts (or its SSH session) ended."""
        procs = [(f"Kafka node {n['id']}", n["machine"], n["process"]) for n in self.nodes]
        procs += [("Flink JobManager", self.testbed.realtime, self.jobmanager)]
        procs += [
            (f"Flink TaskManager {i + 1}", m, p) for i, (m, p) in enumerate(self.taskmanager_procs)
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
            "taskmanagers": [m.name for m, _ in self.taskmanager_procs],
            "registered_s": None if self.registered_s is None else round(self.registered_s, 1),
            "parallelism": self.taskmanagers,
            "input_partitions": INPUT_PARTITIONS,
            "keyed_by": "detector: producer i writes to input partition i",
        }
