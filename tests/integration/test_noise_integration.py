"""Noisy neighbours on the bare target for real: a short run with a CPU and a memory-bandwidth
load (stress-ng) and a second copy of the whole workload on the job's CPU, every record
accounted for, where the loads and the jobs ran read back and the neighbours' own work in
meta.json. A copy of the workload also runs as a testbed starts it in a neighbour VM."""

import json
import os
import re
import time

import pytest
from driver import REPO, leftover_processes, run_args
from hvbench_analysis.labels import config_label
from hvbench_analysis.load import load_runs
from hvbench_harness import run
from hvbench_harness.runspec import RunSpec
from hvbench_harness.testbed import Machine
from hvbench_harness.workload_copy import RemoteWorkloadCopy

# make test-testbed's slow tier (docs/testing.md)
pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def noisy_run(small_data, small_model, tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("noise")
    job_cpu = str(max(os.sched_getaffinity(0)))
    extra = ("--run-id", "noisy", "--noise", "1:cpu,1:membw,1:workload", "--job-cpus", job_cpu)
    code = run.main(run_args(tmp_path, small_data[0], small_model, *extra, records=240))
    return code, tmp_path, tmp_path / "results" / "noisy", job_cpu


def test_a_run_with_neighbours_on_the_jobs_cpu_accounts_for_every_record(noisy_run):
    code, tmp_path, results, _ = noisy_run
    assert code == 0
    meta = json.loads((results / "meta.json").read_text())
    assert meta["counts"]["sent"] == meta["counts"]["received"] == 240
    assert meta["counts"]["accounted"]
    assert meta["requested"]["noise"] == "1:cpu,1:membw,1:workload"
    assert leftover_processes(tmp_path) == []


def test_where_the_job_and_the_loads_ran_is_read_back(noisy_run):
    _, _, results, job_cpu = noisy_run
    meta = json.loads((results / "meta.json").read_text())
    assert meta["job_cpus"] == {"requested": job_cpu, "jvm_readback": job_cpu}
    noise = meta["noise"]
    assert (noise["where"], noise["cpus"]) == ("job", job_cpu)
    loads, (copy,) = noise["groups"][:2], noise["groups"][2:]
    for group in loads:
        assert list(group["placement"]["stressors"].values()) == [job_cpu]
    assert copy["job_cpus"] == {"requested": job_cpu, "jvm_readback": job_cpu}


def test_the_loads_own_work_is_recorded(noisy_run):
    _, _, results, _ = noisy_run
    noise = json.loads((results / "meta.json").read_text())["noise"]
    by_group = {g["group"]: g for g in noise["groups"]}
    assert set(by_group) == {"1:cpu", "1:membw", "1:workload"}
    for group, stressor in (("1:cpu", "cpu"), ("1:membw", "stream")):
        done = by_group[group]
        assert done["exit_code"] == 0 and not done["ended_before_the_run"]
        (metrics,) = done["metrics"]
        assert metrics["stressor"] == stressor and metrics["bogo-ops"] > 0
        assert metrics["bogo-ops-per-second-real-time"] > 0
    assert {"noise-0.log", "noise-1.log"} <= {p.name for p in (results / "logs").iterdir()}


def test_the_workload_copy_ran_beside_the_run_and_was_stopped_with_it(noisy_run):
    """The second copy of the workload sent and received records of its own until the run
    stopped it, and wrote what it measured as an interrupted run does."""
    _, _, results, _ = noisy_run
    noise = json.loads((results / "meta.json").read_text())["noise"]
    copy = next(g for g in noise["groups"] if g["group"] == "1:workload")
    assert copy["exit_code"] == 130 and copy["status"]["state"] == "interrupted"
    assert copy["counts"]["received"] > 0 and copy["records_per_s"] > 0
    assert copy["latency"]["n"] > 0
    assert "workload-2-0.log" in {p.name for p in (results / "logs").iterdir()}


def test_the_report_names_the_run_by_its_neighbours(noisy_run):
    _, _, results, job_cpu = noisy_run
    runs = load_runs([results])
    label = config_label(runs.runs.iloc[0])
    assert label.endswith(f"job on CPU {job_cpu} noise 1:cpu,1:membw,1:workload on the job's CPUs")


def test_a_workload_copy_runs_where_the_guest_roles_install_it(small_data, small_model, tmp_path):
    """The copy a testbed starts in a neighbour VM, here on this machine with the same
    commands (the SSH hop aside): launched in the background from the install directory the
    guest roles lay out, found sending, stopped with SIGTERM, its results read back."""
    install = tmp_path / "install"
    for link, target in {
        "venv": REPO / ".venv", "data/pems": small_data[0], "model": small_model,
        "kafka/libs": REPO / "build/kafka/libs", "flink/lib": REPO / "build/flink/lib",
    }.items():  # fmt: skip
        (install / link).parent.mkdir(parents=True, exist_ok=True)
        (install / link).symlink_to(target)
    request = RunSpec.parse({"records": 120, "send_ms": 100.0, "warmup": 1.0})
    copy = RemoteWorkloadCopy(Machine("neighbour"), request, str(install), str(tmp_path), "c-0")
    copy.start(patience_s=300)
    assert copy.alive() and copy.placement()["pid"] > 0
    deadline = time.monotonic() + 300  # until its first results (its log says so), not a sleep
    while not re.search(r"received [1-9]\d*/\d+ dead-letters", copy.read_log()):
        assert time.monotonic() < deadline and copy.alive(), copy.read_log()
        time.sleep(0.5)
    done = copy.stop()
    assert done["status"]["state"] == "interrupted", done
    assert done["counts"]["received"] > 0 and done["counts"]["accounted"], done
    assert done["records_per_s"] > 0 and done["latency"]["n"] > 0
    assert not copy.alive()
    assert not (tmp_path / "neighbour-copies").exists()  # its files went
    assert leftover_processes(tmp_path) == []
