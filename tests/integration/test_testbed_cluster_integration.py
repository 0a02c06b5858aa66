"""SCALE=cluster on a testbed, its parts for real on this machine: the KRaft nodes and the
Flink processes started as the testbed starts them (hvbench_load.broker and
hvbench_job.session as commands, each given its node id, ports, quorum and addresses), over a
layout of one messaging VM and two real-time VMs that are all this machine. make
test-testbed runs the same through SSH on a QEMU host (test_provision_kvm.py)."""

import pytest
from driver import REPO, leftover_processes
from hvbench_harness.parts import Parts
from hvbench_harness.runspec import RunSpec
from hvbench_harness.targets.common import Paths, job_env
from hvbench_harness.targets.testbed_layouts import TestbedCluster
from hvbench_harness.testbed import Machine, Testbed
from hvbench_job import session

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # real KRaft nodes and Flink


def local_testbed() -> Testbed:
    """One messaging VM and two real-time VMs, every one this machine (no SSH)."""
    return Testbed(
        host=Machine("host"),
        messaging_vms=(Machine("messaging"),),
        realtime_vms=(Machine("realtime 1"), Machine("realtime 2")),
        messaging_addresses=("127.0.0.1",),
        realtime_addresses=("127.0.0.1", "127.0.0.1"),
        realtime_domains=("rt-1", "rt-2"),
        install_dir="",
        work_dir="",
    )


def test_the_nodes_and_taskmanagers_start_where_the_layout_puts_them(tmp_path):
    work = tmp_path / "work"
    paths = Paths("", "", str(REPO / "build/kafka/libs"), str(REPO / "build/flink/lib"), str(work))
    request = RunSpec.parse(
        {"scale": "cluster", "brokers": 3, "broker_restarts": 0, "clients": 2},
        need_inventory=False,
    )
    cluster = TestbedCluster(request, local_testbed(), paths, taskmanagers=2)
    with Parts(tmp_path) as parts:
        kafka = cluster.start_kafka(parts)
        cluster.start_flink(parts, job_env(paths.work))
        assert cluster.gone() is None and cluster.faults() == []
        flink = cluster.describe()
        # one real-time machine is a TaskManager's each; the first holds the JobManager
        _, second = cluster.taskmanager_procs[1]
        second.kill()
        second.wait()
        gone = cluster.gone()
    assert [n["node_id"] for n in kafka["nodes"]] == [1, 2, 3]
    assert kafka["replication"] == 3 and kafka["min_insync"] == 2
    assert len(kafka["bootstrap"].split(",")) == 3
    assert set(kafka["placement"].values()) == {"messaging"}
    assert len(kafka["topics"]["input"]["partitions"]) == 6  # one per detector
    for topic in ("input", "output", "output-1", "dead-letter"):  # output-1: the second pair's
        for partition in kafka["topics"][topic]["partitions"]:
            assert sorted(partition["replicas"]) == sorted(partition["isr"]) == [1, 2, 3]
    assert flink["taskmanagers"] == ["realtime 1", "realtime 2"]
    assert flink["parallelism"] == 2 and flink["registered_s"] is not None
    assert gone is not None and gone.startswith("Flink TaskManager 2 in realtime 2")
    # the submit command as session's own command line reads it
    submit = cluster.submit_command(["env"], ["--bootstrap", kafka["bootstrap"]])
    args, job_args = session.parse_args(submit[submit.index("hvbench_job.session") + 1 :])
    assert args.role == "submit" and args.taskmanagers == 2
    assert job_args == ["--bootstrap", kafka["bootstrap"], "--parallelism", "2"]
    assert leftover_processes(tmp_path) == []  # every node and Flink process stopped
    # each node's process ended by itself, its JVM stopped (or killed) first: killed by its
    # tether instead (137), it would have left the JVM running
    assert [n["process"].returncode for n in cluster.nodes] == [0, 0, 0]
