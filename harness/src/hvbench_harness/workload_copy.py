"""A second copy of the whole workload as a run's neighbour (NOISE=N:workload; the reference
study's N workloads over M VMs): the embedded default run (`hvbench_harness.run`, its own
Kafka, job, producers and consumer) beside the measured one, on this machine (bare target) or
inside a neighbour VM that provisioning gave the workload (hvbench_neighbours.workload).

A copy sends at the measured run's rate for longer than it, until it is stopped. Stopped, it
writes what it measured, as any interrupted run does, and its counts and latency become the
neighbour's record in meta.json `noise`.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from hvbench_agent.neighbours import WORKLOAD
from hvbench_analysis import results as results_contract

from hvbench_harness.parts import RunError, tail
from hvbench_harness.testbed import TestbedError

READY_LINE = "producers started"  # the copy's log says so once it sends
COPY_STOP_S = 300.0  # a stopped copy tears down and writes its results (minutes in emulation)


def copy_command(python: str, run_id: str, base: str, request, inputs: dict[str, str]) -> list[str]:
    """The copy's command line, at the rate of the run's request (runspec.py): its results and
    work under `base`, its inputs (data, model, kafka_libs, connector_dir) where that machine
    has them."""
    return [
        python, "-m", "hvbench_harness.run", "--run-id", run_id,
        "--results", f"{base}/results", "--work", f"{base}/work",
        "--records", str(max(request.records * 3, 600)), "--period-ms", str(request.send_ms),
        "--warmup-s", "0", "--drain-s", "10", "--cpu-latency", "off",
        # a copy runs beside the run it disturbs (and beside the other copies) by design
        "--concurrent",
        "--data", inputs["data"], "--model", inputs["model"],
        "--kafka-libs", inputs["kafka_libs"], "--connector-dir", inputs["connector_dir"],
    ]  # fmt: skip


def copy_record(meta: dict | None, seconds: float, log_tail: str) -> dict:
    """The neighbour's record from the copy's meta.json (None: it wrote none)."""
    done = {"group": f"1:{WORKLOAD}", "stressor": WORKLOAD, "seconds": round(seconds, 3)}
    if meta is None:
        return done | {"error": f"the workload neighbour wrote no results:\n{log_tail}"}
    counts = meta.get("counts") or {}
    keep = ("sent", "received", "missing", "accounted")
    return done | {
        "status": meta.get("status"),
        "counts": {k: counts.get(k) for k in keep},
        "latency": meta.get("latency"),
        "job_cpus": meta.get("job_cpus"),
        "records_per_s": round(counts.get("received", 0) / seconds, 1) if seconds else None,
    }


class WorkloadCopy:
    """A copy on this machine, in a child process, its job on the neighbours' CPUs."""

    part = "a neighbour (a workload copy)"  # its name as a part of the run

    def __init__(self, request, cpus: str | None, work: Path, name: str):
        self.name, self.cpus = name, cpus
        self.run_id = f"{work.name}-{name}"
        self.base, self.log = work / "neighbours", work / f"{name}.log"
        inputs = {k: getattr(request, k) for k in ("data", "model", "kafka_libs", "connector_dir")}
        self.cmd = [
            *copy_command(sys.executable, self.run_id, str(self.base), request, inputs),
            *(["--force"] if request.force else []),
            *(["--force-tsc"] if request.force_tsc else []),
            *(["--job-cpus", cpus] if cpus else []),
        ]
        self.proc: subprocess.Popen | None = None
        self.started = 0.0

    def start(self, launch: Callable[..., subprocess.Popen], patience_s: float = 300.0) -> None:
        """Start it with `launch` (Parts.launcher: a part of the run here) and wait until its
        producers send; RunError if it ends first."""
        with open(self.log, "wb") as sink:
            self.proc = launch(
                self.cmd, stdout=sink, stderr=subprocess.STDOUT,
                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
            )  # fmt: skip
        deadline = time.monotonic() + patience_s
        while READY_LINE not in self.log.read_text(errors="replace"):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()  # what it started goes, whether it ended or not
                raise RunError(f"the workload neighbour did not start sending:\n{tail(self.log)}")
            time.sleep(0.5)
        self.started = time.monotonic()

    def placement(self) -> dict:
        return {"run_id": self.run_id, "cpus_requested": self.cpus or "any", "pid": self.proc.pid}

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> dict:
        """Interrupt it (it tears down and writes its results); its counts and latency."""
        seconds = time.monotonic() - self.started if self.started else 0.0
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
        try:
            code = self.proc.wait(timeout=COPY_STOP_S)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            code = self.proc.wait()
        try:
            meta = results_contract.read_meta(self.base / "results" / self.run_id)
        except results_contract.ResultsError:
            meta = None  # it wrote none
        return {"exit_code": code, **copy_record(meta, seconds, tail(self.log))}


class RemoteWorkloadCopy:
    """A copy inside a neighbour VM, started over SSH in the background (it outlives a
    dropped connection, but not its own records: it ends by itself once they are sent) and
    stopped with SIGTERM, which the run takes as an interruption. Once its meta.json is read
    back, its files leave the VM."""

    def __init__(self, machine, request, install_dir: str, work_dir: str, run_id: str):
        self.machine, self.run_id = machine, run_id
        self.base = f"{work_dir}/neighbour-copies"
        self.log = f"{self.base}/{run_id}.log"
        inputs = {
            "data": f"{install_dir}/data/pems",
            "model": f"{install_dir}/model",
            "kafka_libs": f"{install_dir}/kafka/libs",
            "connector_dir": f"{install_dir}/flink/lib",
        }
        python = f"{install_dir}/venv/bin/python"
        # a VM's own readiness and TSC are not what the measured run depends on: recorded, forced
        forced = ["--force", "--force-tsc"]
        self.cmd = [*copy_command(python, run_id, self.base, request, inputs), *forced]
        self.pid = 0
        self.started = 0.0

    def start(self, patience_s: float = 1800.0) -> None:
        """Start it and wait until its producers send; RunError if it ends first."""
        script = (
            f"mkdir -p {self.base} && cd {self.base} && "
            f"nohup {shlex.join(self.cmd)} >{self.log} 2>&1 </dev/null & echo $!"
        )
        self.pid = int(self.machine.run(["sh", "-c", script], root=True).stdout.split()[-1])
        deadline = time.monotonic() + patience_s
        while not self.sending():
            if not self.alive() or time.monotonic() > deadline:
                log_tail = self.read_log()
                self.stop()
                raise RunError(
                    f"the workload copy in {self.machine.name} did not start sending:\n{log_tail}"
                )
            time.sleep(5)
        self.started = time.monotonic()

    def sending(self) -> bool:
        found = self.machine.run(["grep", "-q", READY_LINE, self.log], check=False)
        return found.returncode == 0

    def alive(self) -> bool:
        found = self.machine.run(["kill", "-0", str(self.pid)], root=True, check=False)
        return found.returncode == 0

    def read_log(self) -> str:
        return self.machine.run(["tail", "-n", "30", self.log], check=False).stdout

    def placement(self) -> dict:
        return {"run_id": self.run_id, "machine": self.machine.name, "pid": self.pid}

    def stop(self) -> dict:
        """SIGTERM, then wait for it to write its results; its counts and latency."""
        seconds = time.monotonic() - self.started if self.started else 0.0
        meta_file = f"{self.base}/results/{self.run_id}/meta.json"
        polls = int(COPY_STOP_S)
        script = (
            f"kill -TERM {self.pid} 2>/dev/null; i=0; while kill -0 {self.pid} 2>/dev/null && "
            f"[ $i -lt {polls} ]; do sleep 1; i=$((i+1)); done; "
            f"kill -0 {self.pid} 2>/dev/null && kill -KILL {self.pid}; cat {meta_file}; "
            # what it kept (its broker's data above all) goes: the VM's disk is small
            f"rm -rf {self.base}/work/{self.run_id} {self.base}/results/{self.run_id} "
            f"{self.log}; rmdir {self.base}/work {self.base}/results {self.base} 2>/dev/null"
        )
        try:
            out = self.machine.run(["sh", "-c", script], root=True, check=False,
                                   timeout=COPY_STOP_S + 120).stdout  # fmt: skip
        except TestbedError as e:
            return copy_record(None, seconds, f"it could not be stopped or read: {e}")
        try:
            meta = results_contract.upgrade(json.loads(out)) if out.strip() else None
        except (json.JSONDecodeError, results_contract.ResultsError, AttributeError):
            meta = None
        return copy_record(meta, seconds, "" if meta else self.read_log())
