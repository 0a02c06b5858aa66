"""`make run`: one experiment, on this machine (TARGET=bare) or on a provisioned KVM or Xen
testbed (TARGET=kvm, TARGET=xen). Without --target, the inventory decides: its hosts in
kvm_hosts or xen_hosts make it kvm or xen; no inventory, or one without hosts, is bare.

Order: check the settings (nothing is started for a bad one) → calibrate the TSC → Kafka →
the Flink job → a readiness probe through the job → the scheduler setting, read back →
consumer → producers → drain → tear down (also on Ctrl-C or error) → account for every record →
results/<run-id>/ → summary. The exit code is non-zero if anything failed or any record is
unaccounted for.

On a testbed the harness stays here and starts each part over SSH (hvbench_load.testbed):
Kafka, the producers and the consumer in the messaging VM (its TSC stamps both ends), the job in
the real-time VM, and the scheduler setting for the real-time VM on the host, through the host's
agent: its vCPU threads on KVM, its cpupool and domain on Xen (`hvbench-agent sched`). Their
files come back here at the end.

    python -m hvbench_load.run --sched deadline --budget 20000 --period 100000
    python -m hvbench_load.run --target kvm --inventory inventory/lab/hosts.yml \
        --sched cfs --budget 77500
    python -m hvbench_load.run --inventory inventory/lab/hosts.yml --sched rtds --budget 77500
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from hvbench_agent import facts as agent_facts
from hvbench_agent import tuning
from hvbench_agent.sched import BACKEND_OF_TARGET, Refused, Setting, validate
from hvbench_agent.sched.linux import LinuxScheduler
from hvbench_analysis import results as results_contract

import tsc_timer
from hvbench_load import accounting, meta, probe, readiness, spec
from hvbench_load.broker import KafkaBroker
from hvbench_load.consumer import CONSUMER_CONFIG
from hvbench_load.producers import PRODUCER_CONFIG, send_offset_ns
from hvbench_load.testbed import (
    TARGETS,
    HostScheduler,
    Machine,
    Testbed,
    TestbedError,
    inventory_target,
    resolve,
)

TOPICS = {"input": "input", "output": "output", "dead_letter": "dead-letter"}
# HOST=user@host: the one-host inventory make writes (make's one-off-inventory target).
ONE_OFF_INVENTORY = "build/inventory/hosts.yml"
# The parts' own logs, kept in results/<run-id>/logs/ (with Flink's).
RUN_LOGS = ("job.out", "producers.out", "consumer.err", "broker.err", "kafka/broker.log")
# Threads of the job's JVM that handle records (comm names, cut to 15 characters by the
# kernel): the chained task of source + Python operator + sinks, the Kafka source's fetcher,
# and the network threads of the two Kafka sinks (results, dead letters): four threads.
# SCHED=deadline applies to these on the bare target.
JOB_THREAD_PATTERNS = (r"^Source: kafka-", r"^Source Data Fet", r"^kafka-producer-")
JOB_THREADS = 4
# A JVM and a model inside a guest can be slow to start (very slow under emulation).
READY_TIMEOUT_S = {"bare": 180.0, "kvm": 900.0, "xen": 900.0}


class RunError(RuntimeError):
    pass


@dataclass
class Paths:
    """Where the run's inputs and its work directory are on the machines that use them."""

    data: str
    model: str
    kafka_libs: str
    connector_dir: str
    work: str  # on the messaging and the real-time machine

    @classmethod
    def for_run(cls, args: argparse.Namespace, testbed: Testbed | None, run_id: str) -> Paths:
        if testbed is None:
            return cls(
                args.data,
                args.model,
                args.kafka_libs,
                args.connector_dir,
                str(Path(args.work).resolve() / run_id),
            )
        base = testbed.install_dir  # where the guest roles put everything
        return cls(
            f"{base}/data/pems",
            f"{base}/model",
            f"{base}/kafka/libs",
            f"{base}/flink/lib",
            f"{testbed.work_dir}/{run_id}",
        )


@dataclass
class Processes:
    """Everything the run started, so teardown can find it."""

    broker: KafkaBroker | None = None  # bare: run here, in this process
    remote_broker: subprocess.Popen | None = None  # testbeds: in the messaging VM
    job: subprocess.Popen | None = None
    consumer: subprocess.Popen | None = None
    producers: subprocess.Popen | None = None
    scheduler: LinuxScheduler | HostScheduler | None = None  # applied: reset at the end
    stopped: list[str] = field(default_factory=list)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The run request (spec.FIELDS, as options or as Make's NAME=value words) and the
    harness's own options. SpecError for an unknown NAME."""
    p = argparse.ArgumentParser(
        prog="python -m hvbench_load.run", description=__doc__.split("\n")[0]
    )
    spec.add_arguments(p)
    p.add_argument("--kafka-libs", default="build/kafka/libs")
    p.add_argument("--connector-dir", default="build/flink/lib")
    p.add_argument("--work", default="work", help="broker data and logs while running")
    p.add_argument("--rep", type=int, help="repetition number, recorded with the run")
    p.add_argument("--campaign", help="the campaign this run belongs to, recorded with it")
    p.add_argument("--rerun-of", help="the results directory of the run this repeats (make rerun)")
    p.add_argument(
        "--validate-only",
        action="store_true",
        help="check the request, print its target and stop (make run does, before the inputs)",
    )
    args = p.parse_args(spec.assignments_to_flags(sys.argv[1:] if argv is None else argv))
    args.inventory = inventory_file(args.inventory, args.host)
    return args


def inventory_file(inventory: str | None, host: str | None) -> str | None:
    """The inventory's hosts file: INVENTORY (a directory or a file), or HOST's one-off
    inventory, which make's one-off-inventory writes."""
    if host:
        return ONE_OFF_INVENTORY
    if inventory and Path(inventory).is_dir():
        return str(Path(inventory) / "hosts.yml")
    return inventory


def validate_request(args: argparse.Namespace, need_inventory: bool = True) -> Setting:
    """The requested settings on their own (no machine is looked at): the scheduler setting
    for the target, or RunError. Campaigns check every point with this before running any."""
    if args.target is None:
        args.target = inventory_target(args.inventory) if args.inventory else "bare"
    if args.target not in TARGETS:
        raise RunError(f"unknown TARGET {args.target!r}; valid: {', '.join(TARGETS)}")
    if args.records <= 0 or args.send_ms <= 0 or args.warmup < 0 or args.malformed < 0:
        raise RunError("RECORDS and the send period must be positive, WARMUP and MALFORMED ≥ 0")
    if not 0 <= args.ramp <= args.warmup:
        raise RunError("RAMP must lie within the warm-up: 0 ≤ RAMP ≤ WARMUP")
    if args.rep is not None and args.rep < 1:
        raise RunError("REP (the repetition number) must be ≥ 1")
    setting = validate(
        BACKEND_OF_TARGET[args.target],
        args.sched,
        budget_us=args.budget,
        period_us=args.period,
        priority=args.priority,
        extratime=args.extratime,
        weight=args.weight,
        cap=args.cap,
    )
    if args.target == "bare":
        return setting
    if need_inventory and not args.inventory:
        raise RunError(f"TARGET={args.target} needs the testbed: HOST=<host> or INVENTORY=<dir>")
    if args.cpu_latency not in ("auto", "off"):
        raise RunError(
            "CPU_LATENCY is for the bare target; a testbed's host is tuned by "
            "make provision (host_tuning)"
        )
    return setting


def check_settings(args: argparse.Namespace) -> tuple[Setting, tuning.CpuLatency | None]:
    """Refuse bad settings before anything is started or touched (the scheduler's own check
    comes once the run has its id, see run())."""
    setting = validate_request(args)
    if args.target != "bare":
        return setting, None
    for what, path in (("model", Path(args.model) / "manifest.json"), ("data", Path(args.data))):
        if not path.exists():
            raise RunError(f"no {what} at {path} (make train / make data create it)")
    cpu_latency = tuning.CpuLatency(tuning.parse_cpu_latency(args.cpu_latency))
    cpu_latency.check()
    return setting, cpu_latency


def check_readiness(results: dict, facts: dict, args: argparse.Namespace) -> dict:
    """The machines' readiness checks (hvbench_load.readiness): RunError if a required one
    fails and is not forced; else what meta.json records of them."""
    doc = readiness.verdict(results, args.force, args.force_tsc)
    if doc["refused"]:
        raise RunError(readiness.refusal(doc))
    for failed in doc["failed_required"]:
        log(f"forced: {failed['machine']}: {failed['check']} is {failed['found']}")
    return {**doc, "facts": facts}


def log(message: str) -> None:
    print(f"[{datetime.now():%H:%M:%S}] {message}", flush=True)


def start_job(
    machine: Machine, paths: Paths, bootstrap: str, log_file: Path, force_tsc: bool = False
) -> subprocess.Popen:
    cmd = [
        "env",
        "OPENBLAS_NUM_THREADS=1",
        "TF_CPP_MIN_LOG_LEVEL=2",
        f"FLINK_LOG_DIR={paths.work}/flink-log",
        *machine.module(
            "hvbench_job.job",
            "--bootstrap",
            bootstrap,
            "--model",
            paths.model,
            "--input",
            TOPICS["input"],
            "--output",
            TOPICS["output"],
            "--dead-letter",
            TOPICS["dead_letter"],
            "--connector-dir",
            paths.connector_dir,
            "--settings-out",
            f"{paths.work}/job-settings.json",
            *(["--force-tsc"] if force_tsc else []),
        ),
    ]
    out = open(log_file, "wb")  # noqa: SIM115 — the child writes to it until the end
    return machine.start(cmd, stdout=out, stderr=subprocess.STDOUT)


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


def job_gone(job: subprocess.Popen, log_file: Path):
    def gone() -> str | None:
        if job.poll() is None:
            return None
        return f"the Flink job exited with {job.returncode} while starting:\n" + tail(log_file)

    return gone


def wait_job_ready(
    machine: Machine, bootstrap: str, job: subprocess.Popen, work: Path, timeout: float
) -> float:
    """The readiness probe (hvbench_load.probe), run where the broker is. Returns seconds."""
    gone = job_gone(job, work / "job.out")
    if not machine.remote:
        try:
            return probe.wait_for_job(bootstrap, timeout, job_gone=gone)
        except probe.ProbeError as e:
            raise RunError(f"{e}\n{tail(work / 'job.out')}") from None
    started = time.monotonic()
    prober = machine.start(
        machine.module("hvbench_load.probe", "--bootstrap", bootstrap, "--timeout", str(timeout)),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        while prober.poll() is None:
            reason = gone()
            if reason:
                raise RunError(reason)
            time.sleep(0.5)
        out = prober.stdout.read().decode(errors="replace").strip()
        if prober.returncode != 0:
            raise RunError(f"{out}\n{tail(work / 'job.out')}")
        return time.monotonic() - started
    finally:
        stop_process(prober, "probe", None)


def tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"({path} unreadable)"


def cpu_times(machine: Machine) -> tuning.CpuTimes:
    if not machine.remote:
        return tuning.CpuTimes.now()
    return tuning.CpuTimes.parse(machine.run(["cat", "/proc/stat"], timeout=60).stdout)


def ask_to_stop(proc: subprocess.Popen) -> None:
    """SIGTERM to a part here; there, closing its tether does the same (see testbed.Machine)."""
    if proc.stdin is not None:
        if not proc.stdin.closed:
            proc.stdin.close()
    else:
        os.killpg(proc.pid, signal.SIGTERM)


def stop_process(
    proc: subprocess.Popen | None, name: str, procs: Processes | None, timeout: float = 30.0
) -> None:
    if proc is None or proc.poll() is not None:
        return
    try:
        ask_to_stop(proc)
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        pass
    if procs is not None:
        procs.stopped.append(name)


def teardown(procs: Processes) -> None:
    stop_process(procs.producers, "producers", procs)
    stop_process(procs.consumer, "consumer", procs)
    stop_process(procs.job, "flink job", procs)
    reset_scheduler(procs)
    if procs.broker is not None:
        procs.broker.stop()
        procs.stopped.append("Kafka")
    stop_process(procs.remote_broker, "Kafka", procs)


def reset_scheduler(procs: Processes) -> None:
    """Undo the scheduler setting (a quota's cgroup here, a guest's setting on the host)."""
    if procs.scheduler is None:
        return
    try:
        procs.scheduler.reset()
        procs.stopped.append("scheduler setting reset")
    except (Refused, TestbedError) as e:
        log(f"resetting the scheduler setting failed: {e} (run make sched ACTION=reset)")
    procs.scheduler = None


def fetch_run_files(machines: set[Machine], remote_work: str, work: Path) -> None:
    """The parts' own files (sent, received, dead letters, job settings, logs) come here,
    then the machines' copies go."""
    for machine in machines:
        try:
            machine.fetch(remote_work, work)
        except TestbedError as e:
            log(f"fetching the run's files failed: {e}")
            return  # keep them there
    for machine in machines:
        machine.run(["rm", "-rf", remote_work], root=True, check=False)


def start_remote_broker(machine: Machine, address: str, paths: Paths, work: Path, procs) -> dict:
    """Kafka in the messaging VM, listening on the guests' private network only."""
    procs.remote_broker = machine.start(
        machine.module(
            "hvbench_load.broker",
            "--libs",
            paths.kafka_libs,
            "--work",
            f"{paths.work}/kafka",
            "--host",
            address,
            "--topics",
            ",".join(TOPICS.values()),
        ),
        stdout=subprocess.PIPE,
        stderr=open(work / "broker.err", "wb"),  # noqa: SIM115 — the child's until the end
    )
    lines = line_queue(procs.remote_broker.stdout)
    first = next_line(lines, 420)  # the broker waits up to 300 s for its JVM
    if not first or not first.startswith("{"):
        raise RunError(f"Kafka did not start in {machine.name}:\n{tail(work / 'broker.err')}")
    return json.loads(first)


def testbed_facts(testbed: Testbed, paths: Paths) -> dict:
    """Host and guest facts for meta.json: the host's from Ansible, each guest's from itself."""
    found = {"host": testbed.host_facts}
    for role, machine in (("messaging", testbed.messaging), ("realtime", testbed.realtime)):
        proc = machine.run(
            machine.agent("facts", "host", "versions", "--model", paths.model), timeout=120
        )
        found[role] = json.loads(proc.stdout)
    return found


def run(args: argparse.Namespace) -> int:
    setting, cpu_latency = check_settings(args)
    require = readiness.parse_require(args.require)
    if args.target == "bare":  # a testbed's machines are checked once it is found (below)
        ready = check_readiness(*readiness.check_here(require), args)
    # e.g. 20261122T101500Z-xen-rtds-b77500-p100000-e0, ...-xen-credit-w256-c153
    short = {"budget_us": "b", "period_us": "p", "extratime": "e", "weight": "w", "cap": "c"}
    short["priority"] = "prio"
    run_id = args.run_id or (
        f"{datetime.now(UTC):%Y%m%dT%H%M%SZ}-{args.target}-{setting.sched}"
        + "".join(
            f"-{short[k]}{v}" for k, v in asdict(setting).items() if k in short and v is not None
        )
    )
    scheduler = None
    if args.target == "bare":
        scheduler = LinuxScheduler(run_id, JOB_THREAD_PATTERNS, JOB_THREADS)
        scheduler.check(setting)
    results = Path(args.results) / run_id
    work = Path(args.work) / run_id
    for taken in (results, work):
        if taken.exists():
            raise RunError(f"{taken} exists already; choose another RUN_ID")
    work.mkdir(parents=True)
    testbed = None
    if args.target in ("kvm", "xen"):
        try:
            testbed = resolve(args.inventory, work / "testbed.json")
            if testbed.target != args.target:
                raise RunError(
                    f"TARGET={args.target}, but {args.inventory} is a {testbed.target} testbed"
                )
            log(
                f"testbed: host {testbed.host.ssh[-1]}, messaging VM, real-time VM "
                f"({testbed.realtime_domain})"
            )
            # Admission and the domain are checked on the host before anything starts.
            scheduler = HostScheduler(testbed)
            scheduler.check(setting)
            ready = check_readiness(*readiness.check_testbed(testbed, require), args)
        except (TestbedError, RunError):
            shutil.rmtree(work, ignore_errors=True)
            raise
    messaging = testbed.messaging if testbed else Machine("this machine")
    realtime = testbed.realtime if testbed else messaging
    paths = Paths.for_run(args, testbed, run_id)
    started_at = datetime.now(UTC)
    procs = Processes()
    meta_doc: dict = {
        "run_id": run_id,
        "requested": {
            **{f.requested: getattr(args, f.name) for f in spec.FIELDS},
            # the setting as validated, with its defaults (PERIOD 100000, EXTRATIME 0, ...):
            # its fields are named as meta.json names them
            **asdict(setting),
            "producers": spec.PRODUCERS,
            "rep": args.rep,
            "campaign": args.campaign,
        },
        "started_at": started_at.isoformat(),
        # how the harness was started and what it read: make rerun repeats a run from these
        "invocation": {"argv": sys.argv, "cwd": os.getcwd()},
        "inputs": (
            {"inventory": str(Path(args.inventory).resolve())}
            if testbed
            else {
                "data": str(Path(args.data).resolve()),
                "model": str(Path(args.model).resolve()),
                "kafka_libs": str(Path(args.kafka_libs).resolve()),
                "connector_dir": str(Path(args.connector_dir).resolve()),
            }
        ),
        "readiness": ready,
        "rerun_of": args.rerun_of,
    }
    if testbed:
        meta_doc["placement"] = {
            "kafka, producers, consumer": testbed.messaging.name,
            "flink job": testbed.realtime.name,
            "scheduler setting": f"{testbed.host.name}: {scheduler.where()}",
        }
    jvm_pid = None
    interrupted = False

    def on_signal(signum, _frame):
        raise KeyboardInterrupt(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, on_signal)
    try:
        log(
            f"run {run_id}: {args.records} records from 6 producers every {args.send_ms:g} ms, "
            f"SCHED={setting.sched}"
        )
        if testbed:
            for machine in {messaging, realtime}:
                machine.run(["mkdir", "-p", f"{paths.work}/flink-log"], root=True)
            calibrate = messaging.module(
                "tsc_timer",
                "--out",
                f"{paths.work}/calibration.json",
                *(["--force"] if args.force_tsc else []),
            )
            calibration = tsc_timer.Calibration(**json.loads(messaging.run(calibrate).stdout))
            meta_doc["cpu_latency"] = {
                "held": False,
                "reason": "a testbed's C-states are set by make provision (host_tuning)",
            }
        else:
            calibration = tsc_timer.calibrate(force=args.force_tsc)
            cpu_latency.open()
            meta_doc["cpu_latency"] = cpu_latency.describe()
            log(
                f"CPU latency limit held at {meta_doc['cpu_latency']['readback_us']} µs"
                if cpu_latency.fd is not None
                else f"CPU latency limit not held ({cpu_latency.not_held})"
            )
        (work / "calibration.json").write_text(json.dumps(calibration.as_dict()))
        c = calibration
        log(f"TSC {c.hz / 1e6:.3f} MHz ({c.source}, ±{c.error_ppm:.2f} ppm) in {messaging.name}")

        if testbed:
            broker_description = start_remote_broker(
                messaging, testbed.messaging_address, paths, work, procs
            )
            bootstrap = broker_description["bootstrap"]
        else:
            procs.broker = KafkaBroker(args.kafka_libs, Path(paths.work) / "kafka")
            procs.broker.start()
            procs.broker.create_topics(list(TOPICS.values()))
            broker_description = procs.broker.describe()
            bootstrap = procs.broker.bootstrap
        log(f"Kafka {bootstrap} up, topics {', '.join(TOPICS.values())}")

        procs.job = start_job(realtime, paths, bootstrap, work / "job.out", args.force_tsc)
        ready_s = wait_job_ready(
            messaging, bootstrap, procs.job, work, READY_TIMEOUT_S[args.target]
        )
        if testbed:
            log(f"Flink job running in {realtime.name}, answered the probe in {ready_s:.1f} s")
        else:
            jvm_pid = job_jvm_pid(procs.job)
            if jvm_pid is None:
                raise RunError("the job's JVM was not found")
            log(f"Flink job running (JVM pid {jvm_pid}), answered the probe in {ready_s:.1f} s")
            scheduler.bind(jvm_pid)
        procs.scheduler = scheduler  # reset at the end, also after a failed apply
        meta_doc["sched"] = scheduler.apply(setting)
        log(f"scheduler setting applied and read back: {setting.sched}")

        expect = args.records
        procs.consumer = messaging.start(
            messaging.module(
                "hvbench_load.consumer",
                "--bootstrap",
                bootstrap,
                "--calibration",
                f"{paths.work}/calibration.json",
                "--expect",
                str(expect),
                "--out",
                f"{paths.work}/received.csv",
                "--dead-letters",
                f"{paths.work}/dead_letters.jsonl",
            ),
            stdout=subprocess.PIPE,
            stderr=open(work / "consumer.err", "wb"),  # noqa: SIM115
        )
        lines = line_queue(procs.consumer.stdout)
        subscribed_by = time.monotonic() + (60 if not testbed else 300)
        while next_line(lines, 1.0) != "consumer: assigned":
            if procs.consumer.poll() is not None or time.monotonic() > subscribed_by:
                raise RunError("the consumer got no partitions:\n" + tail(work / "consumer.err"))
        procs.producers = messaging.start(
            messaging.module(
                "hvbench_load.producers",
                "--bootstrap",
                bootstrap,
                "--data",
                paths.data,
                "--calibration",
                f"{paths.work}/calibration.json",
                "--records",
                str(args.records),
                "--period-ms",
                str(args.send_ms),
                "--ramp-s",
                str(args.ramp),
                "--malformed",
                str(args.malformed),
                "--out",
                f"{paths.work}/sent.csv",
            ),
            stdout=open(work / "producers.out", "wb"),  # noqa: SIM115 — the child's until the end
            stderr=subprocess.STDOUT,
        )
        last = send_offset_ns(
            -(-args.records // 6) - 1, round(args.send_ms * 1e6), round(args.ramp * 1e9)
        )
        expected_s = last / 1e9 + args.send_ms / 1000
        log(f"producers started: about {expected_s:.0f} s of sending")
        started = time.monotonic()
        cpu_at_start = {m.name: cpu_times(m) for m in {messaging, realtime}}
        drain_deadline = None
        while procs.consumer.poll() is None:
            line = next_line(lines, 0.2)
            if line:
                relay_line(line, expect, started)
            if procs.producers.poll() is not None and drain_deadline is None:
                drain_deadline = time.monotonic() + args.drain
                steal = {
                    name: tuning.steal_between(before, cpu_times(m))
                    for m in {messaging, realtime}
                    for name, before in [(m.name, cpu_at_start[m.name])]
                }
                # one machine: as before, the figure itself; several: one per machine
                meta_doc["steal_while_sending"] = steal if testbed else steal[messaging.name]
            if procs.job.poll() is not None:
                raise RunError(f"the Flink job died during the run:\n{tail(work / 'job.out')}")
            if drain_deadline is not None and time.monotonic() > drain_deadline:
                ask_to_stop(procs.consumer)
                procs.consumer.wait(60)
        if sys.stdout.isatty():
            print()
        procs.producers.wait()
        if procs.producers.returncode != 0:
            raise RunError("the producers failed:\n" + tail(work / "producers.out"))
        if procs.consumer.returncode != 0:
            raise RunError("the consumer failed:\n" + tail(work / "consumer.err"))
        meta_doc["sched_at_end"] = scheduler.read()
    except KeyboardInterrupt:
        interrupted = True
        log(f"interrupted: tearing everything down (partial files stay in {work})")
    finally:
        teardown(procs)
        if cpu_latency is not None:
            cpu_latency.close()
        log("torn down: " + (", ".join(procs.stopped) or "nothing was left running"))
        if testbed:
            fetch_run_files({messaging, realtime}, paths.work, work)
    if interrupted:
        return 130

    samples, counts, _ = accounting.account(
        work / "sent.csv",
        work / "received.csv",
        work / "dead_letters.jsonl",
        warmup_ns=round(args.warmup * 1e9),
        malformed_sent=args.malformed,
    )
    logs = [work / name for name in RUN_LOGS if (work / name).exists()]
    logs += sorted((work / "flink-log").glob("*.log"))
    if testbed:
        facts = testbed_facts(testbed, paths)
        host_doc, versions = facts, facts["realtime"]["versions"]
        model_checksum = facts["realtime"].get("model_checksum")
        stamps_where = f"in {messaging.name}"
    else:
        host_doc, versions = agent_facts.collect_host(), agent_facts.collect_versions()
        model_checksum = json.loads((Path(args.model) / "manifest.json").read_text()).get(
            "checksum"
        )
        stamps_where = "on this machine"
    latency = accounting.latency_stats(samples)
    meta_doc.update(
        {
            "ended_at": datetime.now(UTC).isoformat(),
            "clock": {
                "tsc": calibration.as_dict(),
                "stamps": "TSC ns, one calibration shared by producers and consumer "
                + stamps_where,
            },
            "counts": counts.as_dict(),
            "latency": latency,
            "latency_from_intended": accounting.latency_stats(samples, "latency_from_intended_ns"),
            "warmup_excluded_s": args.warmup,
            "kafka": broker_description,
            "clients": {"producer": PRODUCER_CONFIG, "consumer": CONSUMER_CONFIG},
            "job": json.loads((work / "job-settings.json").read_text()),
            "model": model_checksum,
            "host": host_doc,
            "versions": versions,
            "git": meta.collect_git(),
        }
    )
    results_contract.write_run(
        results, meta_doc, samples, dead_letters=work / "dead_letters.jsonl", logs=logs
    )
    shutil.rmtree(work, ignore_errors=True)
    print_summary(results, counts, latency, meta_doc.get("steal_while_sending"))
    return 0 if counts.accounted else 2


def line_queue(stream) -> queue.Queue:
    """Lines of a child's output, read on a thread so the harness never blocks on them."""
    lines: queue.Queue = queue.Queue()

    def read() -> None:
        for raw in stream:
            lines.put(raw.decode(errors="replace").strip())

    threading.Thread(target=read, daemon=True).start()
    return lines


def next_line(lines: queue.Queue, timeout: float) -> str | None:
    try:
        return lines.get(timeout=timeout)
    except queue.Empty:
        return None


def relay_line(line: str, expect: int, started: float) -> None:
    if not line.startswith("consumer: received"):
        if line:
            log(line)
        return
    elapsed = time.monotonic() - started
    if sys.stdout.isatty():
        print(f"\r  {line[10:]}  ({elapsed:.0f} s)", end="", flush=True)
    elif int(elapsed) % 10 == 0:
        log(f"  {line[10:]}")


def print_summary(
    results: Path, counts: accounting.Counts, latency: dict, steal: dict | None = None
) -> None:
    print(f"\nresults: {results}/")
    print(
        f"  sent {counts.sent}  received {counts.received}  missing {counts.missing}  "
        f"duplicated {counts.duplicated}  dead-lettered (injected) "
        f"{counts.malformed_dead_lettered}/{counts.malformed_sent}"
    )
    if latency.get("n"):
        print(
            f"  latency over {latency['n']} records (warm-up excluded {counts.warmup}): "
            f"p50 {latency['p50_ms']:.2f} ms  p99 {latency['p99_ms']:.2f} ms  "
            f"p99.9 {latency['p99.9_ms']:.2f} ms  max {latency['max_ms']:.2f} ms"
        )
    # one figure for this machine, or one per machine of a testbed
    per_machine = {"": steal} if steal and "steal_s" in steal else (steal or {})
    for name, figure in per_machine.items():
        if figure["steal_s"] > 0:
            where = f" from {name}" if name else ""
            print(
                f"  the hypervisor took {figure['steal_pct']:.2f} % of CPU time{where} "
                "while sending (steal)"
            )
    if counts.accounted:
        print("  every record accounted for")
    else:
        print("  UNACCOUNTED RECORDS: " + "; ".join(counts.problems()))


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse_args(argv)
        if args.validate_only:
            validate_request(args)
            print(args.target)
            return 0
        return run(args)
    except (
        RunError,
        ValueError,
        Refused,
        tuning.TuningError,
        TestbedError,
        tsc_timer.TscUnavailable,
    ) as e:
        print(f"make run: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
