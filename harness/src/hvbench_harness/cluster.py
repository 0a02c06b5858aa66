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

import subprocess
from pathlib import Path

from hvbench_job.session import FlinkSession
from hvbench_load.broker import KafkaCluster, free_port

from hvbench_harness import spec
from hvbench_harness.parts import Parts, log
from hvbench_harness.testbed import Machine

REPLICATION, MIN_INSYNC = 3, 2  # at most: fewer nodes hold fewer copies
INPUT_PARTITIONS = spec.PRODUCERS  # one per detector
READY_TIMEOUT_S = 180.0


class LocalCluster:
    """The cluster's parts for one run, in its work directory."""

    def __init__(self, args, work: Path):
        self.args, self.work = args, work
        self.kafka: KafkaCluster | None = None
        self.taskmanager_count = args.taskmanagers
        self.session = FlinkSession(
            work / "flink-cluster",
            args.connector_dir,
            taskmanagers=args.taskmanagers,
            rest_port=free_port(),
            rpc_port=free_port(),
            log_dir=work / "flink-log",  # kept with the run's logs, as the job's are
        )
        self.taskmanagers: list[subprocess.Popen] = []
        self.jobmanager: subprocess.Popen | None = None
        self.registered_s: float | None = None

    def start_kafka(self, parts: Parts) -> KafkaCluster:
        nodes = self.args.brokers
        self.kafka = kafka = KafkaCluster(
            self.args.kafka_libs,
            self.work / "kafka",
            nodes,
            min(REPLICATION, nodes),
            min(MIN_INSYNC, nodes),
        )
        parts.on_teardown(lambda: (kafka.stop(), parts.stopped.append("Kafka cluster")))
        kafka.start()
        kafka.create_topics(["input"], INPUT_PARTITIONS)
        kafka.create_topics(["output", "dead-letter"])
        kafka.keep(self.args.broker_restarts)
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


def output(path: Path) -> dict:
    """A part's stdout and stderr to a file (the child writes to it until it ends)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return {"stdout": open(path, "wb"), "stderr": subprocess.STDOUT}
