"""A Debian 12 KVM host, beside the Debian 13 host of test_provision_kvm.py: its fixtures with
this module's SUITE (its own image, and layers of kind kvm-bookworm), the first provision, a
second that changes nothing, and a make run at cluster scale on it. Debian 12 is the release
the lab hosts ran so far; this keeps it covered."""

from __future__ import annotations

import pandas as pd
import pytest
from test_provision_kvm import (  # noqa: F401 (the fixtures and tests this module runs)
    every_vm,
    finished_run,
    here,
    host,
    image,
    layer,
    suite,
    test_provision_sets_up_the_host_and_the_guests,
    test_second_provision_changes_nothing,
    workload_dirs,
)

pytestmark = [pytest.mark.testbed, pytest.mark.timeout(3600)]

SUITE = "bookworm"


# (host: the fixture imported above)
def test_make_run_scale_cluster_on_kvm_spreads_kafka_and_flink(host, tmp_path):  # noqa: F811
    """SCALE=cluster on the testbed: three KRaft nodes in the messaging machine and a Flink
    session cluster (JobManager, two TaskManagers) in the real-time machine, every one started
    over SSH as the testbed starts them, as services side by side (one machine plays each VM,
    see with_workload); the setting on both nested real-time VMs, read back from each; the load
    as two client pairs, each its producers and its own consumer (CLIENTS=2)."""
    kept, meta = finished_run(
        host, tmp_path, "kvm-cluster", SCALE="cluster", TASKMANAGERS=2, CLIENTS=2
    )
    assert meta["host"]["host"]["os"].startswith("Debian 12"), meta["host"]["host"]
    counts = meta["counts"]
    assert (counts["sent"], counts["received"], counts["missing"]) == (60, 60, 0)
    assert counts["accounted"] and counts["malformed_dead_lettered"] == 2
    kafka = meta["kafka"]
    assert [n["node_id"] for n in kafka["nodes"]] == [1, 2, 3]
    assert set(kafka["placement"].values()) == {"messaging (controller)"}
    assert kafka["replication"] == 3 and kafka["min_insync"] == 2
    for partition in kafka["topics"]["input"]["partitions"]:
        assert sorted(partition["isr"]) == [1, 2, 3]
    flink = meta["flink_cluster"]
    assert flink["taskmanagers"] == ["realtime (controller)"] * 2 and flink["parallelism"] == 2
    assert meta["job"]["flink"]["parallelism.default"] == "2"
    for when in ("sched", "sched_at_end"):
        for readback in every_vm(meta[when]):
            assert readback["vcpus"][0]["cpu_max"] == "50000 100000", (when, readback)
    # one machine stamps both ends; the TaskManagers run there too: one clock throughout
    assert meta["clock"]["job"]["method"] == "one calibration"
    # both pairs in the one messaging machine, on the run's calibration; each its own records
    pairs = [(p["client"], p["machine"], p["calibration"]) for p in meta["clock"]["clients"]]
    assert pairs == [(k, "messaging (controller)", "the run's") for k in (0, 1)]
    samples = pd.read_csv(kept / "samples.csv")
    assert samples.groupby("client").size().to_dict() == {0: 30, 1: 30}
    install_dir, run_dir = workload_dirs(host)
    assert here(f"pgrep -af '[/]{str(install_dir)[1:]}' || true").strip() == ""
    assert list(run_dir.iterdir()) == []
    logs = {p.name for p in (kept / "logs").iterdir()}
    assert {"broker-1.log", "broker-2.log", "broker-3.log"} <= logs, logs
