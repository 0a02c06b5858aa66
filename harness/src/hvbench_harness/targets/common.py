"""What both targets share: the run's topics and calibration file, the job's threads and
environment, where the inputs are (Paths), the readiness verdict, and finding the job's JVM."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

from hvbench_agent import tuning
from hvbench_job import clients

from hvbench_harness import readiness, spec
from hvbench_harness.parts import RunError, log
from hvbench_harness.runspec import RunSpec

TOPICS = {"input": "input", "output": "output", "dead_letter": "dead-letter"}
CALIBRATION = "calibration.json"  # the run's TSC calibration; each client pair's (pair_file)


def topic_names(pairs: int) -> list[str]:
    """The run's topics: the input, each client pair's output (hvbench_job.clients), the dead
    letters."""
    return [TOPICS["input"], *clients.output_topics(pairs), TOPICS["dead_letter"]]


# SCALE=cluster (bare_layouts, testbed_layouts)
REPLICATION, MIN_INSYNC = 3, 2  # at most: fewer nodes hold fewer copies
INPUT_PARTITIONS = spec.PRODUCERS  # one per detector
READY_TIMEOUT_S = 180.0  # a Flink session cluster's TaskManagers registered


def output(path: Path) -> dict:
    """A part's stdout and stderr to a file (the child writes to it until it ends)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return {"stdout": open(path, "wb"), "stderr": subprocess.STDOUT}


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
