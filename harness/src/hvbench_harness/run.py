"""`make run`: one experiment, on this machine (TARGET=bare) or on a provisioned KVM or Xen
testbed (TARGET=kvm, TARGET=xen). Without --target, the inventory decides: its hosts in
kvm_hosts or xen_hosts make it kvm or xen; no inventory, or one without hosts, is bare.

Order: check the settings (nothing is started for a bad one) → calibrate the TSC → Kafka →
the Flink job → a readiness probe through the job → the scheduler setting, read back →
consumer → producers → drain → tear down (also on Ctrl-C or error) → account for every record →
results/<run-id>/ → summary.

While it runs, the broker and the job are watched: a part that dies, is stopped or hangs ends
the run at once with the reason (Kafka is first restarted on its data, BROKER_RESTARTS times),
and so do STALL_S seconds without a result while the producers send. A run that started
sending always writes results/<run-id>/, with meta.json `status` completed, failed or
interrupted, the counts so far and every sample received. Exit code: 0 completed with every
record accounted for, 2 completed with records unaccounted for, 1 failed, 130 interrupted.

On a testbed the harness stays here and starts each part over SSH (hvbench_harness.testbed):
Kafka, the producers and the consumer in the messaging VM (its TSC stamps both ends; with
CLIENTS, each client pair in a messaging VM, docs/cluster.md), the job in the real-time VM, and
the scheduler setting for the real-time VM on the host, through the host's agent: its vCPU
threads on KVM, its cpupool and domain on Xen (`hvbench-agent sched`). Their files come back
here at the end.

    python -m hvbench_harness.run --sched deadline --budget 20000 --period 100000
    python -m hvbench_harness.run --target kvm --inventory inventory/lab/hosts.yml \
        --sched cfs --budget 77500
    python -m hvbench_harness.run --inventory inventory/lab/hosts.yml --sched rtds --budget 77500
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path

from hvbench_agent import tuning
from hvbench_agent.sched import Refused, Setting
from hvbench_analysis import results as results_contract
from hvbench_job.session import SessionError
from hvbench_load import probe
from hvbench_load.broker import BrokerError
from hvbench_load.consumer import CONSUMER_CONFIG
from hvbench_load.producers import PRODUCER_CONFIG, RAMP_START, SENDING, send_offset_ns

import tsc_timer
from hvbench_harness import accounting, inventory, meta, neighbours, rawfiles, spec
from hvbench_harness import target as targets
from hvbench_harness.accounting import pair_file
from hvbench_harness.cpu import PartCpu
from hvbench_harness.parts import (
    Parts,
    RunError,
    line_queue,
    log,
    next_line,
    stop_process,
    stopped_part,
    tail,
)
from hvbench_harness.runlocks import hold, registered_machines
from hvbench_harness.runspec import RunSpec
from hvbench_harness.target import CALIBRATION, TOPICS, Here, Target
from hvbench_harness.testbed import Machine, TestbedError

# The parts' own logs, kept in results/<run-id>/logs/ (with Flink's).
RUN_LOGS = ("job.out", "producers.out", "consumer.err", "broker.err", "kafka/broker.log")
PAIR_LOGS = ("producers.out", "consumer.err")  # each client pair's (accounting.pair_file)
# Errors that end a run (after its checks): the run's results are written if it was sending.
# A part that could not start (BrokerError, SessionError) ends the run like one that died.
RUN_ENDING = (
    RunError,
    TestbedError,
    Refused,
    tuning.TuningError,
    OSError,
    BrokerError,
    SessionError,
)
EXIT_CODES = {"failed": 1, "interrupted": 130}


def parse_args(argv: list[str] | None = None) -> tuple[RunSpec, bool]:
    """The command line (spec's fields, as options or as Make's NAME=value words) as the run's
    request, and whether only to validate it. SpecError for an unknown NAME, RunError (or the
    scheduler's Refused) for a bad value."""
    words = spec.assignments_to_flags(sys.argv[1:] if argv is None else argv)
    args = vars(arguments().parse_args(words))
    validate_only = args.pop("validate_only")
    return RunSpec.parse(args), validate_only


def arguments() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hvbench run", description=__doc__.split("\n")[0])
    spec.add_arguments(p)
    p.add_argument(
        "--validate-only",
        action="store_true",
        help="check the request, print its target and stop (make run does, before the inputs)",
    )
    return p


def data_network(data: Path) -> str | None:
    """The network `make data` generated `data` for (its generated.json); None for data
    that says nothing (real PeMS files)."""
    try:
        return json.loads((data / "generated.json").read_text()).get("network", "freeway")
    except (OSError, ValueError, AttributeError):
        return None


def check_machine(request: RunSpec) -> Here | None:
    """What a bare run needs of this machine, before anything is started or touched: its model
    and data (for the request's NETWORK), its CPUs for JOB_CPUS and NOISE_CPUS, and the
    C-state hold. None on a testbed (its target checks its machines)."""
    if request.target != "bare":
        return None
    for what, path in (
        ("model", Path(request.model) / "manifest.json"),
        ("data", Path(request.data)),
    ):
        if not path.exists():
            raise RunError(f"no {what} at {path} (make train / make data create it)")
    generated_for = data_network(Path(request.data))
    if generated_for not in (None, request.network):
        raise RunError(
            f"the data at {request.data} is for NETWORK={generated_for}, not {request.network} "
            f"(make data NETWORK={request.network} DATA_DIR=... makes it)"
        )
    noise_cpus = neighbours.bare_noise_cpus(request.noise_cpus, request.job_cpus)
    requested, why = tuning.parse_cpu_latency(request.cpu_latency), ""
    if request.max_cstate is not None and requested == "auto":  # the run's idle states, not 0 µs
        requested, why = None, f"MAX_CSTATE={request.max_cstate} sets the idle states"
    cpu_latency = tuning.CpuLatency(requested, off_because=why)
    cpu_latency.check()
    return Here(cpu_latency, noise_cpus)


def run(request: RunSpec) -> int:
    """One run: checked, then run while it holds its machines in the run registry
    (runlocks: refused if another run holds one, unless CONCURRENT=1)."""
    here = check_machine(request)
    run_id = request.run_id or default_run_id(request.target, request.setting)
    results, work = under(request.results, run_id), under(request.work, run_id)
    for taken in (results, work):
        if taken.exists():
            raise RunError(f"{taken} exists already; choose another RUN_ID")
    if request.host and request.target != "bare":  # HOST: its one-off inventory (inventory.py)
        inventory.write_one_off(request.host, request.target, request.inventory)
    machines = registered_machines(request.target, request.hosts)
    with hold(run_id, machines, forced=request.concurrent) as held:
        return run_held(request, here, (run_id, results, work), held)


def under(folder: str, name: str) -> Path:
    """folder/name, which must lie in folder once both are resolved (RunError otherwise)."""
    path = Path(folder) / name
    if Path(folder).resolve() not in path.resolve().parents:
        raise RunError(f"{path} does not lie in {folder}: RUN_ID must be a name")
    return path


def run_held(request: RunSpec, here: Here | None, names: tuple, held) -> int:
    """The run's steps, while it holds its machines (`held`, whose record is meta.json
    `concurrent`). Every part it starts is torn down on the way out (Parts)."""
    run_id, results, work = names
    target = targets.choose(request, run_id, work, here)
    work.mkdir(parents=True, exist_ok=True)
    meta_doc = begin_meta(request, run_id, target)
    meta_doc["concurrent"] = held.record  # the runs seen at the start; at the end: below
    status = meta_doc["status"]
    interrupt = Interrupt()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, interrupt)
    parts = Parts(work)
    error = None
    try:
        with parts:
            measure(request, target, parts, meta_doc, held.glance)
        status["state"] = "completed"
    except KeyboardInterrupt:
        mark_interrupted(status)
    except Exception as e:
        if interrupt.taken:  # the interrupt, turned into an error by the C code it landed in
            mark_interrupted(status)
        elif isinstance(e, RUN_ENDING):
            status.update(state="failed", reason=str(e))
            log(f"run failed while {status['phase']}: {str(e).splitlines()[0]}; tearing down")
            error = e
        elif status["phase"] in SENDING_PHASES:  # a defect of ours: what was sent is kept
            status.update(
                state="failed", reason=f"{type(e).__name__}: {e}", traceback=traceback.format_exc()
            )
            log(f"run failed while {status['phase']} ({type(e).__name__}: {e}); tearing down")
        else:
            raise
    finally:
        log("torn down: " + (", ".join(parts.stopped) or "nothing was left running"))
        meta_doc["teardown"] = parts.verify(target.own_processes())  # none may be left
    if status["phase"] not in SENDING_PHASES and status["state"] != "completed":
        if error is not None:
            raise error
        log(f"interrupted before sending: nothing measured (partial files stay in {work})")
        return 130
    held.look_again()  # the other runs live at the end, in meta.json `concurrent`
    return finish(request, target, work, results, meta_doc)


SENDING_PHASES = ("sending", "draining")


def enter(meta_doc: dict, phase: str) -> None:
    """The run's current step, named in its status (and in the reason if it ends there)."""
    meta_doc["status"]["phase"] = phase


def measure(
    request: RunSpec,
    target: Target,
    parts: Parts,
    meta_doc: dict,
    glance: Callable[[], None],
) -> None:
    """Calibrate, start Kafka and the job, apply the setting and read it back, send every
    record and drain (glancing at the other runs on the machine); meta_doc gets what each
    step found."""
    setting = request.setting
    run_id = meta_doc["run_id"]
    log(
        f"run {run_id}: {request.records} records from {spec.DETECTORS[request.network]} detectors "
        f"({request.network}) every {request.send_ms:g} ms, SCHED={setting.sched}"
    )
    calibration, meta_doc["cpu_latency"] = target.calibrate(parts)
    meta_doc["clock"] = {"tsc": calibration.as_dict()}
    (parts.work / CALIBRATION).write_text(json.dumps(calibration.as_dict()))
    if request.clients > 1:
        meta_doc["clock"]["clients"] = target.calibrate_clients()
    # each step's phase is entered before the last one's line is logged: a Ctrl-C right after
    # that line is reported in the phase that follows it
    enter(meta_doc, "starting Kafka")
    c = calibration
    log(f"TSC {c.hz / 1e6:.3f} MHz ({c.source}, ±{c.error_ppm:.2f} ppm) in {target.messaging.name}")
    meta_doc["kafka"] = target.start_broker(parts)
    bootstrap = meta_doc["kafka"]["bootstrap"]
    enter(meta_doc, "starting the Flink job")
    log(f"Kafka {bootstrap} up, topics {', '.join(TOPICS.values())}")
    job = start_job(target, parts, bootstrap)
    ready_s = wait_job_ready(target, parts, bootstrap, job, run_id)
    started = target.job_started(job)
    meta_doc.update(target.job_placement())
    enter(meta_doc, "applying the scheduler setting")
    log(f"Flink job running ({started}), answered the probe in {ready_s:.1f} s")
    parts.on_teardown(lambda: reset_scheduler(target, parts))  # also after a failed apply
    meta_doc["sched"] = target.scheduler.apply(setting)
    enter(meta_doc, "applying the power policy")
    meta_doc["power"] = apply_power(target, parts)
    enter(meta_doc, "starting the neighbours")
    if (noise := target.start_noise(parts)) is not None:
        meta_doc["noise"] = noise
    if request.baseline:
        enter(meta_doc, "measuring the noise floor")
        meta_doc["baseline"] = target.noise_floor(setting, request.baseline_s)
    enter(meta_doc, "starting the consumer")
    pairs = range(request.clients)
    consumers = [start_consumer(target, parts, bootstrap, k, (job, run_id)) for k in pairs]
    enter(meta_doc, "sending")
    if request.trace:
        target.start_trace(parts)
    parts.on_teardown(target.energy.stop)
    target.energy.start()
    producers = [start_producers(target, parts, bootstrap, run_id, k) for k in pairs]
    steal = drain(request, target, parts, (job, consumers, producers), meta_doc, glance)
    target.energy.stop()
    if request.trace:
        target.stop_trace()
    target.stop_noise()
    if steal is not None:
        meta_doc["steal_while_sending"] = steal
    meta_doc["sched_at_end"] = target.scheduler.read()
    if meta_doc["power"]["readback"] is not None:
        meta_doc["power"]["at_end"] = target.power.read()


def job_clock_unknown(target: Target) -> dict | None:
    """meta.json `clock.job` where the job's stamps cannot be related to the run's clock,
    else None (the samples tell how: stages.clock_relation). TaskManagers on several machines
    stamp on as many clocks, whose offsets the records cannot tell apart: the stage legs are
    then left unknown (the latencies themselves are unaffected)."""
    if target.job_clocks > 1 and not target.job_shares_clock:
        reason = (
            f"the job's TaskManagers run on {target.job_clocks} machines, each stamping on "
            "its own clock"
        )
        return {"method": "none", "known": False, "reason": reason}
    if (machines := len({m.ssh for m in target.client_machines()})) > 1:
        reason = f"the client pairs stamp on {machines} machines' clocks"
        return {"method": "none", "known": False, "reason": reason}
    return None


def default_run_id(target: str, setting: Setting) -> str:
    """e.g. 20261122T101500Z-xen-rtds-b77500-p100000-e0, ...-xen-credit-w256-c153"""
    short = {"budget_us": "b", "period_us": "p", "extratime": "e", "weight": "w", "cap": "c"}
    short |= {"priority": "prio", "tslice_us": "ts", "ratelimit_us": "rl"}
    return f"{datetime.now(UTC):%Y%m%dT%H%M%SZ}-{target}-{setting.sched}" + "".join(
        f"-{short[k]}{v}" for k, v in asdict(setting).items() if k in short and v is not None
    )


def begin_meta(request: RunSpec, run_id: str, target: Target) -> dict:
    """What meta.json knows before the run starts: the request, the invocation, the target."""
    return {
        "run_id": run_id,
        "requested": {
            **request.requested(),
            "taskmanagers": target.taskmanagers,  # on a testbed, one per real-time VM if unset
            # the setting as validated, with its defaults (PERIOD 100000, EXTRATIME 0, ...):
            # its fields are named as meta.json names them
            **asdict(request.setting),
            "detectors": spec.DETECTORS[request.network],
            "rep": request.rep,
            "campaign": request.campaign,
        },
        "started_at": datetime.now(UTC).isoformat(),
        "status": {"state": "running", "reason": None, "phase": "calibrating the TSC"},
        # how the harness was started and what it read: make rerun repeats a run from these
        "invocation": {"argv": sys.argv, "cwd": os.getcwd()},
        **target.describe(),
        "rerun_of": request.rerun_of,
    }


class Interrupt:
    """The run's SIGINT and SIGTERM handler: KeyboardInterrupt wherever the run is, and the
    signal remembered. A C extension the exception lands in can replace it with an error of
    its own (the Kafka client's subscribe turned one into "TypeError: expected list of unicode
    strings"); the run is still an interrupted one."""

    def __init__(self) -> None:
        self.taken: str | None = None

    def __call__(self, signum, _frame) -> None:
        self.taken = signal.Signals(signum).name
        raise KeyboardInterrupt(self.taken)


def mark_interrupted(status: dict) -> None:
    status.update(state="interrupted", reason=f"interrupted while {status['phase']}")
    log(f"run interrupted while {status['phase']}: tearing down")


def start_job(target: Target, parts: Parts, bootstrap: str) -> subprocess.Popen:
    paths = target.paths
    job_args = [
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
        *("--tmp-dir", f"{paths.work}/job-tmp"),  # removed with the work directory
        *("--network", target.request.network),
        *(["--force-tsc"] if target.request.force_tsc else []),
        # on the machine that stamps send and receipt, the job stamps on the same clock
        *(["--calibration", f"{paths.work}/{CALIBRATION}"] if target.job_shares_clock else []),
        *("--producers", str(target.request.producers), "--clients", str(target.request.clients)),
    ]
    cmd = target.job_command(parts, job_args)
    out = open(parts.work / "job.out", "wb")  # noqa: SIM115 — the child writes to it until the end
    return parts.start("flink job", target.realtime, cmd, stdout=out, stderr=subprocess.STDOUT)


def wait_job_ready(
    target: Target, parts: Parts, bootstrap: str, job: subprocess.Popen, run_id: str
) -> float:
    """The readiness probe (hvbench_load.probe), run where the broker is. Returns seconds."""
    machine, work, timeout = target.messaging, parts.work, target.ready_timeout_s

    def gone() -> str | None:
        return target.part_gone(job)

    if not machine.remote:
        try:
            return probe.wait_for_job(bootstrap, timeout, run_id, job_gone=gone)
        except probe.ProbeError as e:
            raise RunError(f"{e}\n{tail(work / 'job.out')}") from None
    started = time.monotonic()
    prober = machine.start(
        machine.module(
            "hvbench_load.probe",
            *("--bootstrap", bootstrap, "--run-id", run_id, "--timeout", str(timeout)),
        ),
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
        stop_process(prober)


def start_consumer(target: Target, parts: Parts, bootstrap: str, pair: int, watched):
    """Client pair `pair`'s consumer, once it has its partitions; and its output's lines."""
    job, run_id = watched
    request, work = target.request, target.paths.work
    machine = target.client_machines()[pair]
    consumer = parts.start(
        "consumer" if pair == 0 else f"consumer {pair}",
        machine,
        machine.module(
            "hvbench_load.consumer",
            *("--bootstrap", bootstrap, "--calibration", f"{work}/{pair_file(CALIBRATION, pair)}"),
            *("--run-id", run_id, "--expect", str(request.records), "--network", request.network),
            *("--producers", str(request.producers), "--clients", str(request.clients)),
            *("--client", str(pair), "--out", f"{work}/{pair_file('received.csv', pair)}"),
            *("--summary", f"{work}/{pair_file('consumer.json', pair)}"),
            *("--dead-letters", f"{work}/{pair_file('dead_letters.jsonl', pair)}"),
        ),
        stdout=subprocess.PIPE,
        stderr=open(parts.work / pair_file("consumer.err", pair), "wb"),  # noqa: SIM115
    )
    lines = line_queue(consumer.stdout)
    subscribed_by = time.monotonic() + (60 if not machine.remote else 300)
    while next_line(lines, 1.0) != "consumer: assigned":
        if consumer.poll() is not None or time.monotonic() > subscribed_by:
            err = tail(parts.work / pair_file("consumer.err", pair))
            raise RunError(f"the consumer got no partitions:\n{err}")
        watch(target, job)
    return consumer, lines


def watch(target: Target, job: subprocess.Popen, clients: dict | None = None) -> None:
    """RunError at once if the job or the broker is gone or hung (the broker after its
    restarts), or one of the `clients` (producers, consumers here) is stopped."""
    reason = target.part_gone(job) or stopped_part(clients or {})
    if reason:
        raise noticed(reason)


def noticed(reason: str) -> RunError:
    """The fault that ends the run, logged when it is noticed (before the teardown)."""
    log(f"noticed: {reason.splitlines()[0]}")
    return RunError(reason)


# After a broker restart the clients reconnect before results come again: librdkafka's
# reconnect backoff grows up to 10 s (reconnect.backoff.max.ms), the stall clock waits as long.
RECONNECT_S = 10.0
STALL_GAPS = 4  # a stall lasts at least this many of the longest gaps between two sends


class Stall:
    """No result (nor dead letter) for `limit_s` seconds while the producers send: the job,
    or Kafka between it and the consumers, makes no progress. A slow job still makes some."""

    def __init__(self, limit_s: float) -> None:
        self.limit_s, self.results, self.quiet_since = limit_s, 0, time.monotonic()

    def progress(self, progress: dict, now: float) -> None:
        """The consumers' progress (relay): results and dead letters so far."""
        results = sum(got + letters for got, _, letters in progress.values())
        if results > self.results:
            self.results, self.quiet_since = results, now

    def hold(self, until: float) -> None:
        """No result can come before `until` (sending starts, Kafka restarts)."""
        self.quiet_since = max(self.quiet_since, until)

    def check(self, now: float, progress: dict) -> str | None:
        if now - self.quiet_since <= self.limit_s:
            return None
        totals = [sum(figures) for figures in zip(*progress.values(), strict=True)]
        got, due, letters = totals or [0, "?", 0]  # no progress line yet: none received
        return (
            f"no result for {now - self.quiet_since:.0f} s while the producers were sending "
            f"(received {got} of {due}, dead letters {letters}): the Flink job, or Kafka "
            f"between it and the consumer, makes no progress (STALL_S={self.limit_s:g})"
        )


def stall_limit(request: RunSpec, target: Target) -> float:
    """STALL_S, else the target's; never under STALL_GAPS of the longest gap between two
    sends (a detector's send period; at the start of a ramp, the slower rate's)."""
    gap_s = request.send_ms / 1000 / (RAMP_START if request.ramp > 0 else 1)
    return max(request.stall_s or target.stall_s, STALL_GAPS * gap_s)


def client_pids(target: Target, consumers: list, producers: list) -> dict[str, list[int]]:
    """The producers' and consumers' processes that run here and have not ended (those
    in guests are watched through their progress only)."""
    here = [not m.remote for m in target.client_machines()]
    alive = [
        (name, proc)
        for pair, local in enumerate(here)
        if local
        for name, proc in (("the producers", producers[pair]), ("the consumer", consumers[pair][0]))
    ]
    found: dict[str, list[int]] = {}
    for name, proc in alive:
        if proc.returncode is None:
            found.setdefault(name, []).append(proc.pid)
    return found


def start_producers(
    target: Target, parts: Parts, bootstrap: str, run_id: str, pair: int
) -> subprocess.Popen:
    """Client pair `pair`'s producers: its groups' records, each group in its place in the
    staggered schedule, from the pair's own start."""
    request, work = target.request, target.paths.work
    machine = target.client_machines()[pair]
    producers = parts.start(
        "producers" if pair == 0 else f"producers {pair}",
        machine,
        machine.module(
            "hvbench_load.producers",
            *("--bootstrap", bootstrap, "--data", target.paths.data),
            *("--calibration", f"{work}/{pair_file(CALIBRATION, pair)}", "--run-id", run_id),
            *("--records", str(request.records), "--period-ms", str(request.send_ms)),
            *("--network", request.network),
            *("--producers", str(request.producers), "--messages", request.messages),
            *("--clients", str(request.clients), "--client", str(pair)),
            # the first pair injects the malformed records (its consumer reads the dead letters)
            *(
                "--ramp-s",
                str(request.ramp),
                "--malformed",
                str(request.malformed if pair == 0 else 0),
            ),
            *("--out", f"{work}/{pair_file('sent.csv', pair)}"),
            *("--malformed-out", f"{work}/malformed.jsonl"),
        ),
        stdout=open(parts.work / pair_file("producers.out", pair), "wb"),  # noqa: SIM115
        stderr=subprocess.STDOUT,
    )
    if pair == 0:
        per_detector = -(-request.records // spec.DETECTORS[request.network])
        ramp_ns = round(request.ramp * 1e9)
        last = send_offset_ns(per_detector - 1, round(request.send_ms * 1e6), ramp_ns)
        log(f"producers started: about {last / 1e9 + request.send_ms / 1000:.0f} s of sending")
    return producers


def drain(
    request: RunSpec,
    target: Target,
    parts: Parts,
    procs,
    meta_doc: dict,
    glance: Callable[[], None],
) -> dict | None:
    """Relay the consumers' progress until each has its pair's records, or until DRAIN seconds
    after the producers finished, watching the parts (watch) and, while the producers send,
    the results' progress (Stall) and the other runs on the machine (glance); the steal time
    while the producers sent (None if the consumers were first)."""
    job, consumers, producers = procs
    machines = target.machines()
    started = time.monotonic()
    cpu_at_start = {m.name: cpu_times(m) for m in machines}
    pids = target.part_pids(job, {"producers": producers, "consumer": [c for c, _ in consumers]})
    usage, sending, progress = PartCpu(pids), False, {}
    drain_deadline, steal, warmed_up = None, None, 0.0
    stall = Stall(stall_limit(request, target))
    meta_doc["watch"] = {"stall_s": stall.limit_s}
    while any(c.poll() is None for c, _ in consumers):
        time.sleep(0.2)
        relay(consumers, progress, started)
        stall.progress(progress, time.monotonic())
        if not sending and SENDING in (parts.work / "producers.out").read_text(errors="replace"):
            usage, sending = PartCpu(pids), True  # from here: loading the data is not sending
            target.energy.mark("sending")
            warmed_up = time.monotonic() + request.warmup
            stall.hold(time.monotonic())
        if sending and drain_deadline is None and time.monotonic() >= warmed_up:
            target.energy.mark("measured")
        usage.sample()  # before the poll below reaps the producers
        if all(p.poll() is not None for p in producers) and drain_deadline is None:
            enter(meta_doc, "draining")
            target.energy.mark("sent")
            drain_deadline = time.monotonic() + request.drain
            steal = target.steal(
                {m.name: tuning.steal_between(cpu_at_start[m.name], cpu_times(m)) for m in machines}
            )
        watch(target, job, client_pids(target, consumers, producers))
        glance()
        if target.broker_restarting():
            stall.hold(time.monotonic() + RECONNECT_S)
        if sending and drain_deadline is None and (why := stall.check(time.monotonic(), progress)):
            raise noticed(why)
        if drain_deadline is not None and time.monotonic() > drain_deadline:
            for consumer, _ in consumers:
                stop_process(consumer, 60)
    relay(consumers, progress, started)
    if drain_deadline is None:
        # the consumers had every record before the producers were seen to end (under load,
        # a producer's exit can take seconds): the sending window still ends when they do
        wait_for_producers(producers)
        target.energy.mark("sent")
    if sys.stdout.isatty():
        print()
    if usage.pids:
        meta_doc["cpu_per_part"] = usage.result(request.records)
    check_clients(parts, consumers, producers)
    return steal


# Once the consumers have every record, a pair's producers only flush and exit (seconds under
# load); not ended after this long, they are hung (stopped, say) and the run fails instead of
# waiting on them. Its teardown then ends them as it ends every part.
PRODUCERS_EXIT_S = 60.0


def wait_for_producers(
    producers: list[subprocess.Popen], limit_s: float = PRODUCERS_EXIT_S
) -> None:
    """Every pair's producers ended within `limit_s` seconds in all, else RunError."""
    deadline = time.monotonic() + limit_s
    for pair, proc in enumerate(producers):
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            raise RunError(
                f"the producers (pair {pair}, pid {proc.pid}) had not ended {limit_s:g} s after "
                "the consumers had every record: hung (stopped?)"
            ) from None


def check_clients(parts: Parts, consumers: list, producers: list[subprocess.Popen]) -> None:
    """RunError if a pair's producers or consumer failed."""
    for pair, proc in enumerate(producers):
        if proc.wait() != 0:
            out = tail(parts.work / pair_file("producers.out", pair))
            raise RunError(f"the producers failed:\n{out}")
    for pair, (consumer, _) in enumerate(consumers):
        if consumer.returncode != 0:
            err = tail(parts.work / pair_file("consumer.err", pair))
            raise RunError(f"the consumer failed:\n{err}")


def cpu_times(machine: Machine) -> tuning.CpuTimes:
    if not machine.remote:
        return tuning.CpuTimes.now()
    return tuning.CpuTimes.parse(machine.run(["cat", "/proc/stat"], timeout=60).stdout)


def apply_power(target: Target, parts: Parts) -> dict:
    """GOVERNOR, MAX_CSTATE, TURBO on the host(s), read back, put back on the way out; with
    none asked, the host's policy as it is."""
    power = target.power
    if not power.policy.given():
        try:
            return {"requested": {}, "readback": power.read()}
        except (RunError, TestbedError) as e:  # e.g. a host's agent from before `power`
            return {"requested": {}, "readback": None, "error": str(e)}
    parts.on_teardown(lambda: restore_power(target, parts))  # also after a failed apply
    applied = power.apply()
    log("power policy: " + ", ".join(f"{k}={v}" for k, v in power.policy.given().items()))
    return applied


def restore_power(target: Target, parts: Parts) -> None:
    try:
        target.power.restore()
        parts.stopped.append("power policy restored")
    except (RunError, TestbedError) as e:
        log(f"restoring the power policy failed: {e}")


def reset_scheduler(target: Target, parts: Parts) -> None:
    """Undo the scheduler setting (a quota's cgroup here, a guest's setting on the host)."""
    try:
        target.scheduler.reset()
        parts.stopped.append("scheduler setting reset")
    except (Refused, TestbedError) as e:
        log(f"resetting the scheduler setting failed: {e} (run make sched ACTION=reset)")


# What finish() does after the sending, in order: a run whose results could not be made is
# written as failed in one of these steps (its status.phase), with its raw files.
FINISHING = ("saving the raw files", "collecting the run's facts", "accounting", "summarizing")
WRITING = "writing the results"


def finish(request: RunSpec, target: Target, work: Path, results: Path, meta_doc: dict) -> int:
    """Account for every record, write results/<run-id>/ and print the summary; also for a
    run that failed or was interrupted while sending (its status says so). meta_doc is saved
    beside the raw files first (rawfiles.save): whatever fails after that, results/<run-id>/
    is written as failed with the raw files (finish_failed), or, where it cannot be written
    (a full disk), `work` stays and the error says how to account it again."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # what was measured is written first
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    step, accounted = FINISHING[0], None
    try:
        how = accounting_how(request, target)
        rawfiles.save(work, meta_doc, how)
        step = FINISHING[1]
        gather(request, target, work, meta_doc)
        saved = rawfiles.save(work, meta_doc, how)
        step = FINISHING[2]
        accounted = rawfiles.account(work, saved)
        step = FINISHING[3]
        summary = summary_lines(results, accounted.counts, accounted.meta)
    except Exception as e:
        return finish_failed(request, work, results, meta_doc, (step, e), accounted)
    try:
        logs = run_logs(work, request.clients)
        rawfiles.write(results, accounted.meta, accounted.samples, work, logs, keep_raw=False)
    except OSError as e:
        raise RunError(not_written(results, work, e)) from None
    except Exception as e:
        return finish_failed(request, work, results, meta_doc, (WRITING, e), accounted)
    shutil.rmtree(work, ignore_errors=True)
    print("\n".join(summary))
    return exit_code(accounted.meta, accounted.counts)


def exit_code(meta_doc: dict, counts: accounting.Counts) -> int:
    """0 completed with every record accounted for, 2 completed with some not, 1 failed,
    130 interrupted."""
    return EXIT_CODES.get(meta_doc["status"]["state"], 0 if counts.accounted else 2)


def accounting_how(request: RunSpec, target: Target) -> dict:
    """What accounting needs beyond the raw files and meta.json (rawfiles.account)."""
    return {
        "warmup_ns": round(request.warmup * 1e9),
        "pairs": request.clients,
        "job_clock": job_clock_unknown(target),
        "job_shares_clock": target.job_shares_clock,
    }


def gather(request: RunSpec, target: Target, work: Path, meta_doc: dict) -> None:
    """What the target knows of the run that the raw files do not, into meta_doc: the end,
    the faults, the machines' facts, the energy, the trace, the settings; the energy samples
    and the trace go into `work` as files."""
    facts = collect_facts(target)
    meta_doc.update(
        {
            "ended_at": datetime.now(UTC).isoformat(),
            "faults": target.faults(),
            "warmup_excluded_s": request.warmup,
            "clients": {"producer": PRODUCER_CONFIG, "consumer": CONSUMER_CONFIG},
            "job": read_json(work / "job-settings.json"),
            "model": facts.get("model"),
            "host": facts.get("host"),
            "versions": facts.get("versions"),
            "git": meta.collect_git(),
        }
    )
    meta_doc["energy"] = target.energy.summary({})  # the records per window come with the counts
    (work / results_contract.ENERGY).write_text(target.energy.samples_csv())
    meta_doc.setdefault("clock", {})["stamps"] = stamps_text(request.clients, facts)
    keep_trace(target, work, meta_doc)


def run_logs(work: Path, pairs: int) -> list[Path]:
    """The parts' own logs in `work`, for results/<run-id>/logs/."""
    names = RUN_LOGS + tuple(pair_file(n, k) for k in range(1, pairs) for n in PAIR_LOGS)
    logs = [work / name for name in names if (work / name).exists()]
    logs += sorted((work / "flink-log").glob("*.log")) + sorted(work.glob("noise-*.log"))
    logs += sorted(work.glob("workload-*.log")) + sorted(work.glob("kafka/node-*/broker-*.log"))
    return logs


def finish_failed(
    request: RunSpec,
    work: Path,
    results: Path,
    meta_doc: dict,
    failure: tuple[str, Exception],
    accounted: rawfiles.Accounted | None,
) -> int:
    """results/<run-id>/ of a run whose results could not be made: status failed, in the
    step that failed, with the reason and the traceback; the counts and samples only if
    accounting made them (never invented); the raw files as they are in raw/. Exit code 1."""
    step, error = failure
    trace = "".join(traceback.format_exception(error))
    doc = accounted.meta if accounted is not None else dict(meta_doc)
    if accounted is None:
        doc.update(counts=None, latency=None, latency_from_intended=None)
    before = meta_doc["status"]
    doc["status"] = {
        "state": "failed",
        "reason": finishing_reason(step, error, before),
        "phase": step,
        "traceback": trace,
        "before": before,
    }
    log(f"{step} failed: {type(error).__name__}: {error}; the raw files go into the results")
    print(trace, file=sys.stderr, end="")
    samples = accounted.samples if accounted is not None and step != WRITING else None
    try:
        rawfiles.write(results, doc, samples, work, run_logs(work, request.clients), keep_raw=True)
    except Exception as e:  # a full disk (OSError), or what failed before fails again
        raise RunError(not_written(results, work, e)) from None
    shutil.rmtree(work, ignore_errors=True)
    raw = results / results_contract.RAW
    print(f"\nresults: {results}/\n  RUN FAILED: {doc['status']['reason']}")
    print(f"  the raw files are in {raw}/; account them again: {rawfiles.again(raw)}")
    return EXIT_CODES["failed"]


def finishing_reason(step: str, error: Exception, before: dict) -> str:
    """status.reason of a run whose results could not be made, with how the run had ended."""
    ended = f"the run had {before['state']}"
    if before["state"] != "completed":
        first = str(before.get("reason") or "").splitlines()[:1]
        ended += f" while {before['phase']}" + (f" ({first[0]})" if first else "")
    first = str(error).splitlines()[:1]
    return f"{step} failed: {type(error).__name__}{': ' + first[0] if first else ''} ({ended})"


def not_written(results: Path, work: Path, error: Exception) -> str:
    """Why results/<run-id>/ is not there, where the raw files are and how to account them."""
    return (
        f"writing {results}/ failed: {error}; nothing was left there. The run's raw files are "
        f"in {work}/: account them again with {rawfiles.again(work, results.parent)}"
    )


def stamps_text(pairs: int, facts: dict) -> str:
    """meta.json `clock.stamps`: which clock each latency's two stamps are on."""
    if pairs == 1:
        return "TSC ns, one calibration shared by producers and consumer " + facts.get(
            "stamps_where", ""
        )
    return (
        f"TSC ns; {pairs} client pairs, each pair's producers and consumer on one machine and "
        "one calibration (clock.clients): a latency is two stamps of one clock, never two "
        "machines' (samples.csv `client`)"
    )


def keep_trace(target: Target, work: Path, meta_doc: dict) -> Path | None:
    """The scheduler trace (TRACE=1) as a file for the results, and its summary in meta_doc;
    also what a failed or interrupted run recorded until it stopped."""
    found = target.trace_result()
    if found is None:
        return None
    text, summary = found
    path = work / results_contract.SCHED_TRACE
    path.write_text(text)
    meta_doc["trace"] = summary
    return path


def collect_facts(target: Target) -> dict:
    """The target's facts; what went wrong instead, if a machine no longer answers."""
    try:
        return target.facts()
    except (TestbedError, OSError, ValueError) as e:
        return {"error": f"facts not collected: {e}"}


def read_json(path: Path) -> dict | None:
    """A part's JSON file; None if absent, what is wrong with it if it cannot be read (a part
    stopped while writing it)."""
    try:
        return json.loads(path.read_text()) if path.exists() else None
    except (OSError, ValueError) as e:
        return {"error": f"{path.name} cannot be read: {e}"}


def relay(consumers: list, progress: dict, started: float) -> None:
    """The consumers' lines: their progress (summed over the pairs) on one line, the rest
    logged as they come."""
    fresh, before = False, sum(figures[0] for figures in progress.values())
    for pair, (_, lines) in enumerate(consumers):
        while (line := next_line(lines, 0)) is not None:
            if line.startswith("consumer: received"):
                progress[pair], fresh = [int(n) for n in re.findall(r"\d+", line)[:3]], True
            elif line:
                log(line if pair == 0 else f"pair {pair}: {line}")
    if not fresh:
        return
    got, due, letters = (sum(figures) for figures in zip(*progress.values(), strict=True))
    text, elapsed = f"received {got}/{due} dead-letters {letters}", time.monotonic() - started
    if sys.stdout.isatty():
        print(f"\r  {text}  ({elapsed:.0f} s)", end="", flush=True)
    elif int(elapsed) % 10 == 0 or (before == 0 and got > 0):  # every 10 s, and the first
        log(f"  {text}")


def summary_lines(results: Path, counts: accounting.Counts, meta_doc: dict) -> list[str]:
    """The summary a run ends with (made before the results are written: a failure in it is
    the run's, with the raw files kept)."""
    status, latency = meta_doc["status"], meta_doc["latency"]
    lines = [f"\nresults: {results}/"]
    if status["state"] != "completed":
        lines.append(f"  RUN {status['state'].upper()}: {status['reason'].splitlines()[0]}")
        lines.append("  (what it measured until then is written, marked as such)")
    lines.append(
        f"  sent {counts.sent}  received {counts.received}  missing {counts.missing}  "
        f"undelivered {counts.undelivered}  duplicated {counts.duplicated}  "
        f"dead-lettered (injected) {counts.malformed_dead_lettered}/{counts.malformed_sent}"
    )
    if latency.get("n"):
        lines.append(
            f"  latency over {latency['n']} records (warm-up excluded {counts.warmup}): "
            f"p50 {latency['p50_ms']:.2f} ms  p99 {latency['p99_ms']:.2f} ms  "
            f"p99.9 {latency['p99.9_ms']:.2f} ms  max {latency['max_ms']:.2f} ms"
        )
    lines += steal_lines(meta_doc.get("steal_while_sending"))
    lines += energy_lines(meta_doc.get("energy") or {})
    for fault in meta_doc.get("faults", []):
        lines.append(f"  fault: {fault['part']} {fault['event']}: {fault['detail']}")
    if counts.foreign():
        lines.append(f"  {counts.foreign()}")
    if counts.accounted:
        lines.append("  every record accounted for")
    else:
        lines.append("  UNACCOUNTED RECORDS: " + "; ".join(counts.problems()))
    return lines


def energy_lines(energy: dict) -> list[str]:
    measured = (energy.get("windows") or {}).get("measured")
    if not energy.get("available"):
        return [f"  energy: not available ({energy.get('reason')})"]
    if not measured:
        return []
    per_record = measured["joules_per_record"]
    return [
        f"  energy over the measured window: {measured['joules']:.1f} J in "
        f"{measured['seconds']:.1f} s, {measured['mean_w']:.1f} W"
        + (f", {per_record * 1000:.2f} mJ per record" if per_record else "")
    ]


def steal_lines(steal: dict | None) -> list[str]:
    """One figure for this machine, or one per machine of a testbed."""
    per_machine = {"": steal} if steal and "steal_s" in steal else (steal or {})
    return [
        f"  the hypervisor took {figure['steal_pct']:.2f} % of CPU time"
        + (f" from {name}" if name else "")
        + " while sending (steal)"
        for name, figure in per_machine.items()
        if figure["steal_s"] > 0
    ]


def main(argv: list[str] | None = None) -> int:
    # a run takes SIGINT and SIGTERM over (and ignores them while it writes its results):
    # the caller's handlers come back afterwards, for callers in the same process (tests,
    # benchmarks), whose later children would otherwise inherit SIGINT ignored
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        request, validate_only = parse_args(argv)
        if validate_only:
            print(request.target)
            return 0
        return run(request)
    except (*RUN_ENDING, ValueError, tsc_timer.TscUnavailable) as e:
        print(f"make run: {e}", file=sys.stderr)
        return 1
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)


if __name__ == "__main__":
    sys.exit(main())
