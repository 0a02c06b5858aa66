"""The bare target's two layouts (SCALE): one broker and the job's own JVM, or a Kafka cluster
and a Flink session cluster, all on this machine. The target is composed with one of them and
asks it where each part runs; it holds no branch on the scale.

Cluster (SCALE=cluster):
- Kafka: BROKERS KRaft nodes (3 by default; each broker and controller), every topic on up to
  three of them, a write with acks=all (the producers' setting) acknowledged once up to two
  have it.
- Flink: a JobManager and TASKMANAGERS TaskManagers (2 by default, one slot each), every one its
  own JVM; the job runs at that parallelism, one task per TaskManager.
- Keyed by detector: the input topic has one partition per detector and each producer writes
  to its own, so each detector's records stay in order on one task, and Flink's source spreads
  the partitions over the tasks (no keyBy: that would add a network hand-off, see
  hvbench_job.job.ForecastAndRoute).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from hvbench_agent.neighbours import allowed_cpus
from hvbench_job import clients
from hvbench_job.session import FlinkSession
from hvbench_load.broker import KafkaBroker, KafkaCluster, free_port

from hvbench_harness.parts import Parts, log
from hvbench_harness.runspec import RunSpec
from hvbench_harness.targets.common import (
    INPUT_PARTITIONS,
    MIN_INSYNC,
    READY_TIMEOUT_S,
    REPLICATION,
    job_jvm_pid,
    output,
    topic_names,
)
from hvbench_harness.testbed import HERE, Machine


def local_layout(request: RunSpec, work: Path) -> LocalOne | LocalCluster:
    return LocalCluster(request, work) if request.scale == "cluster" else LocalOne(request, work)


class LocalOne:
    """SCALE=one here: one Kafka broker, and the job in the JVM that PyFlink starts for it."""

    taskmanagers = None

    def __init__(self, request: RunSpec, work: Path):
        self.request, self.work = request, work

    def start_kafka(self, parts: Parts) -> KafkaBroker:
        broker = KafkaBroker(
            self.request.kafka_libs, self.work / "kafka", spawn=parts.launcher("Kafka", HERE)
        )
        parts.on_teardown(lambda: parts.record("Kafka", broker.stop()))
        broker.start()
        broker.create_topics(topic_names(self.request.clients))
        broker.keep(self.request.broker_restarts)
        return broker

    def job_command(
        self, _parts: Parts, machine: Machine, launch: list[str], job_args: list[str]
    ) -> list[str]:
        return [*launch, *machine.module("hvbench_job.job", *job_args)]

    def jvm_pids(self, job: subprocess.Popen) -> list[int]:
        pid = job_jvm_pid(job)
        return [] if pid is None else [pid]

    def flink_pids(self, jvm_pids: list[int]) -> dict[str, list[int]]:
        return {"the Flink job's JVM": jvm_pids}

    def other_pids(self) -> dict[str, list[int]]:
        return {}

    def job_placement(self, _jvm_pids: list[int]) -> tuple[dict, dict]:
        return {}, {}

    def gone(self) -> str | None:
        return None  # the job's own exit is the target's to see


class LocalCluster:
    """SCALE=cluster here: a Kafka cluster and a Flink session cluster, as processes on this
    machine, in the run's work directory. Every stamp is still taken on this machine's TSC:
    one clock for every latency."""

    def __init__(self, request, work: Path):
        """request: the run's (runspec.py): its sizes, clients and where the jars are."""
        self.request, self.work = request, work
        self.kafka: KafkaCluster | None = None
        self.taskmanagers: int = request.taskmanagers
        self.session = FlinkSession(
            work / "flink-cluster",
            request.connector_dir,
            taskmanagers=request.taskmanagers,
            rest_port=free_port(),
            rpc_port=free_port(),
            log_dir=work / "flink-log",  # kept with the run's logs, as the job's are
        )
        self.taskmanager_procs: list[subprocess.Popen] = []
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
            spawn=parts.launcher("Kafka cluster", HERE),
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
        for i in range(self.taskmanagers):
            self.taskmanager_procs.append(
                parts.start(
                    f"Flink TaskManager {i + 1}",
                    machine,
                    [*prefix, *session.taskmanager_command()],
                    **output(logs / f"taskmanager-{i + 1}-out.log"),
                )
            )
        self.registered_s = session.wait_ready(READY_TIMEOUT_S, self.gone)
        log(
            f"Flink session cluster up: {self.taskmanagers} TaskManagers in "
            f"{self.registered_s:.1f} s"
        )

    def job_command(
        self, parts: Parts, machine: Machine, launch: list[str], job_args: list[str]
    ) -> list[str]:
        """The session cluster, started (under `launch`: JOB_CPUS and the job's environment),
        and `flink run` of the job at its parallelism."""
        self.start_flink(parts, machine, launch)
        parallelism = str(self.taskmanagers)
        return [*launch, *self.session.submit_command([*job_args, "--parallelism", parallelism])]

    def jvm_pids(self, _job: subprocess.Popen) -> list[int]:
        """start-foreground ends in exec: each started process is a TaskManager's JVM."""
        return [tm.pid for tm in self.taskmanager_procs]

    def flink_pids(self, jvm_pids: list[int]) -> dict[str, list[int]]:
        """The JVMs that handle the records, by name."""
        jobmanager = [self.jobmanager.pid] if self.jobmanager else []
        return {"a Flink TaskManager's JVM": jvm_pids, "the Flink JobManager": jobmanager}

    def other_pids(self) -> dict[str, list[int]]:
        return {"flink jobmanager": [self.jobmanager.pid]} if self.jobmanager else {}

    def job_placement(self, jvm_pids: list[int]) -> tuple[dict, dict]:
        """meta.json: the TaskManagers' CPUs read back (beside job_cpus), `flink_cluster`."""
        readback = {"taskmanagers_readback": [allowed_cpus(p) for p in jvm_pids]}
        return readback, {"flink_cluster": self.describe()}

    def gone(self) -> str | None:
        """Why the Flink cluster cannot serve (one of its JVMs exited), else None."""
        procs = [("JobManager", self.jobmanager)]
        procs += [(f"TaskManager {i + 1}", tm) for i, tm in enumerate(self.taskmanager_procs)]
        for name, proc in procs:
            if proc is not None and proc.poll() is not None:
                return f"the Flink {name} exited with {proc.returncode}; see {self.session.log_dir}"
        return None

    def describe(self) -> dict:
        """meta.json `flink_cluster`."""
        return {
            **self.session.describe(),
            "taskmanager_pids": self.jvm_pids(None),
            "registered_s": None if self.registered_s is None else round(self.registered_s, 1),
            "parallelism": self.taskmanagers,
            "input_partitions": INPUT_PARTITIONS,
            "keyed_by": "detector: producer i writes to input partition i",
        }
