"""`make run`: one experiment, on this machine (TARGET=bare) or on a provisioned KVM or Xen
testbed (TARGET=kvm, TARGET=xen). Without --target, the inventory decides: its hosts in
kvm_hosts or xen_hosts make it kvm or xen; no inventory, or one without hosts, is bare.

Order: check the settings (nothing is started for a bad one) → calibrate the TSC → Kafka →
the Flink job → a readiness probe through the job → the scheduler setting, read back →
consumer → producers → drain → tear down (also on Ctrl-C or error) → account for every record →
results/<run-id>/ → summary. The exit code is non-zero if anything failed or any record is
unaccounted for.

On a testbed the harness stays here and starts each part over SSH (hvbench_harness.testbed):
Kafka, the producers and the consumer in the messaging VM (its TSC stamps both ends), the job in
the real-time VM, and the scheduler setting for the real-time VM on the host, through the host's
agent: its vCPU threads on KVM, its cpupool and domain on Xen (`hvbench-agent sched`). Their
files come back here at the end.

    python -m hvbench_harness.run --sched deadline --budget 20000 --period 100000
    python -m hvbench_harness.run --target kvm --inventory inventory/lab/hosts.yml \
        --sched cfs --budget 77500
    python -m hvbench_harness.run --inventory inventory/lab/hosts.yml --sched rtds --budget 77500
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path

from hvbench_agent import tuning
from hvbench_agent.sched import BACKEND_OF_TARGET, Refused, Setting, validate
from hvbench_analysis import results as results_contract
from hvbench_load import probe
from hvbench_load.consumer import CONSUMER_CONFIG
from hvbench_load.producers import PRODUCER_CONFIG, send_offset_ns

import tsc_timer
from hvbench_harness import accounting, inventory, meta, spec
from hvbench_harness import target as targets
from hvbench_harness.parts import Parts, RunError, line_queue, log, next_line, stop_process, tail
from hvbench_harness.target import TOPICS, Target
from hvbench_harness.testbed import TARGETS, Machine, TestbedError, inventory_target

# The parts' own logs, kept in results/<run-id>/logs/ (with Flink's).
RUN_LOGS = ("job.out", "producers.out", "consumer.err", "broker.err", "kafka/broker.log")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The run request (spec.FIELDS, as options or as Make's NAME=value words) and the
    harness's own options. SpecError for an unknown NAME."""
    p = argparse.ArgumentParser(prog="hvbench run", description=__doc__.split("\n")[0])
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
    if args.host or args.inventory:  # HOST: the one-off inventory (inventory.py)
        args.inventory = inventory.hosts_file(args.inventory, args.host, args.target)
    return args


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


def run(args: argparse.Namespace) -> int:
    """One run, as its steps. Every part it starts is torn down on the way out (Parts)."""
    setting, cpu_latency = check_settings(args)
    run_id = args.run_id or default_run_id(args.target, setting)
    results, work = Path(args.results) / run_id, Path(args.work) / run_id
    for taken in (results, work):
        if taken.exists():
            raise RunError(f"{taken} exists already; choose another RUN_ID")
    target = targets.choose(args, run_id, work, setting, cpu_latency)
    work.mkdir(parents=True, exist_ok=True)
    meta_doc = begin_meta(args, run_id, setting, target)
    signal.signal(signal.SIGTERM, on_signal)
    parts = Parts(work)
    try:
        with parts:
            calibration = measure(args, setting, target, parts, meta_doc)
    except KeyboardInterrupt:
        log(f"interrupted: everything torn down (partial files stay in {work})")
        return 130
    finally:
        log("torn down: " + (", ".join(parts.stopped) or "nothing was left running"))
    return finish(args, target, work, results, meta_doc, calibration)


def measure(
    args: argparse.Namespace, setting: Setting, target: Target, parts: Parts, meta_doc: dict
) -> tsc_timer.Calibration:
    """Calibrate, start Kafka and the job, apply the setting and read it back, send every
    record and drain; meta_doc gets what each step found."""
    log(
        f"run {meta_doc['run_id']}: {args.records} records from 6 producers every "
        f"{args.send_ms:g} ms, SCHED={setting.sched}"
    )
    calibration, meta_doc["cpu_latency"] = target.calibrate(parts)
    (parts.work / "calibration.json").write_text(json.dumps(calibration.as_dict()))
    c = calibration
    log(f"TSC {c.hz / 1e6:.3f} MHz ({c.source}, ±{c.error_ppm:.2f} ppm) in {target.messaging.name}")
    meta_doc["kafka"] = target.start_broker(parts)
    bootstrap = meta_doc["kafka"]["bootstrap"]
    log(f"Kafka {bootstrap} up, topics {', '.join(TOPICS.values())}")
    job = start_job(target, parts, bootstrap)
    ready_s = wait_job_ready(target.messaging, bootstrap, job, parts.work, target.ready_timeout_s)
    log(f"Flink job running ({target.job_started(job)}), answered the probe in {ready_s:.1f} s")
    parts.on_teardown(lambda: reset_scheduler(target, parts))  # also after a failed apply
    meta_doc["sched"] = target.scheduler.apply(setting)
    log(f"scheduler setting applied and read back: {setting.sched}")
    consumer, lines = start_consumer(target, parts, bootstrap, args.records)
    producers = start_producers(target, parts, bootstrap, args)
    steal = drain(args, target, parts, (job, consumer, producers), lines)
    if steal is not None:
        meta_doc["steal_while_sending"] = steal
    meta_doc["sched_at_end"] = target.scheduler.read()
    return calibration


def default_run_id(target: str, setting: Setting) -> str:
    """e.g. 20261122T101500Z-xen-rtds-b77500-p100000-e0, ...-xen-credit-w256-c153"""
    short = {"budget_us": "b", "period_us": "p", "extratime": "e", "weight": "w", "cap": "c"}
    short["priority"] = "prio"
    return f"{datetime.now(UTC):%Y%m%dT%H%M%SZ}-{target}-{setting.sched}" + "".join(
        f"-{short[k]}{v}" for k, v in asdict(setting).items() if k in short and v is not None
    )


def begin_meta(args: argparse.Namespace, run_id: str, setting: Setting, target: Target) -> dict:
    """What meta.json knows before the run starts: the request, the invocation, the target."""
    return {
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
        "started_at": datetime.now(UTC).isoformat(),
        # how the harness was started and what it read: make rerun repeats a run from these
        "invocation": {"argv": sys.argv, "cwd": os.getcwd()},
        **target.describe(),
        "rerun_of": args.rerun_of,
    }


def on_signal(signum, _frame):
    raise KeyboardInterrupt(signal.Signals(signum).name)


def start_job(target: Target, parts: Parts, bootstrap: str) -> subprocess.Popen:
    paths, machine = target.paths, target.realtime
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
            *(["--force-tsc"] if target.args.force_tsc else []),
        ),
    ]
    out = open(parts.work / "job.out", "wb")  # noqa: SIM115 — the child writes to it until the end
    return parts.start("flink job", machine, cmd, stdout=out, stderr=subprocess.STDOUT)


def wait_job_ready(
    machine: Machine, bootstrap: str, job: subprocess.Popen, work: Path, timeout: float
) -> float:
    """The readiness probe (hvbench_load.probe), run where the broker is. Returns seconds."""

    def gone() -> str | None:
        if job.poll() is None:
            return None
        return f"the Flink job exited with {job.returncode} while starting:\n" + tail(
            work / "job.out"
        )

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
        stop_process(prober)


def start_consumer(target: Target, parts: Parts, bootstrap: str, expect: int):
    """The consumer, once it has its partitions; and its output's lines."""
    machine, work = target.messaging, target.paths.work
    consumer = parts.start(
        "consumer",
        machine,
        machine.module(
            "hvbench_load.consumer",
            "--bootstrap",
            bootstrap,
            "--calibration",
            f"{work}/calibration.json",
            "--expect",
            str(expect),
            "--out",
            f"{work}/received.csv",
            "--dead-letters",
            f"{work}/dead_letters.jsonl",
        ),
        stdout=subprocess.PIPE,
        stderr=open(parts.work / "consumer.err", "wb"),  # noqa: SIM115 — the child's
    )
    lines = line_queue(consumer.stdout)
    subscribed_by = time.monotonic() + (60 if not machine.remote else 300)
    while next_line(lines, 1.0) != "consumer: assigned":
        if consumer.poll() is not None or time.monotonic() > subscribed_by:
            raise RunError("the consumer got no partitions:\n" + tail(parts.work / "consumer.err"))
    return consumer, lines


def start_producers(
    target: Target, parts: Parts, bootstrap: str, args: argparse.Namespace
) -> subprocess.Popen:
    machine, work = target.messaging, target.paths.work
    producers = parts.start(
        "producers",
        machine,
        machine.module(
            "hvbench_load.producers",
            "--bootstrap",
            bootstrap,
            "--data",
            target.paths.data,
            "--calibration",
            f"{work}/calibration.json",
            "--records",
            str(args.records),
            "--period-ms",
            str(args.send_ms),
            "--ramp-s",
            str(args.ramp),
            "--malformed",
            str(args.malformed),
            "--out",
            f"{work}/sent.csv",
        ),
        stdout=open(parts.work / "producers.out", "wb"),  # noqa: SIM115 — the child's
        stderr=subprocess.STDOUT,
    )
    last = send_offset_ns(
        -(-args.records // 6) - 1, round(args.send_ms * 1e6), round(args.ramp * 1e9)
    )
    log(f"producers started: about {last / 1e9 + args.send_ms / 1000:.0f} s of sending")
    return producers


def drain(args: argparse.Namespace, target: Target, parts: Parts, procs, lines) -> dict | None:
    """Relay the consumer's progress until it has every record, or until DRAIN seconds after
    the producers finished; the steal time while they sent (None if the consumer was first)."""
    job, consumer, producers = procs
    machines = target.machines()
    started = time.monotonic()
    cpu_at_start = {m.name: cpu_times(m) for m in machines}
    drain_deadline, steal = None, None
    while consumer.poll() is None:
        line = next_line(lines, 0.2)
        if line:
            relay_line(line, args.records, started)
        if producers.poll() is not None and drain_deadline is None:
            drain_deadline = time.monotonic() + args.drain
            steal = target.steal(
                {m.name: tuning.steal_between(cpu_at_start[m.name], cpu_times(m)) for m in machines}
            )
        if job.poll() is not None:
            raise RunError(f"the Flink job died during the run:\n{tail(parts.work / 'job.out')}")
        if drain_deadline is not None and time.monotonic() > drain_deadline:
            stop_process(consumer, 60)
    if sys.stdout.isatty():
        print()
    producers.wait()
    if producers.returncode != 0:
        raise RunError("the producers failed:\n" + tail(parts.work / "producers.out"))
    if consumer.returncode != 0:
        raise RunError("the consumer failed:\n" + tail(parts.work / "consumer.err"))
    return steal


def cpu_times(machine: Machine) -> tuning.CpuTimes:
    if not machine.remote:
        return tuning.CpuTimes.now()
    return tuning.CpuTimes.parse(machine.run(["cat", "/proc/stat"], timeout=60).stdout)


def reset_scheduler(target: Target, parts: Parts) -> None:
    """Undo the scheduler setting (a quota's cgroup here, a guest's setting on the host)."""
    try:
        target.scheduler.reset()
        parts.stopped.append("scheduler setting reset")
    except (Refused, TestbedError) as e:
        log(f"resetting the scheduler setting failed: {e} (run make sched ACTION=reset)")


def finish(
    args: argparse.Namespace,
    target: Target,
    work: Path,
    results: Path,
    meta_doc: dict,
    calibration: tsc_timer.Calibration,
) -> int:
    """Account for every record, write results/<run-id>/ and print the summary."""
    samples, counts, _ = accounting.account(
        work / "sent.csv",
        work / "received.csv",
        work / "dead_letters.jsonl",
        warmup_ns=round(args.warmup * 1e9),
        malformed_sent=args.malformed,
    )
    logs = [work / name for name in RUN_LOGS if (work / name).exists()]
    logs += sorted((work / "flink-log").glob("*.log"))
    facts = target.facts()
    latency = accounting.latency_stats(samples)
    meta_doc.update(
        {
            "ended_at": datetime.now(UTC).isoformat(),
            "clock": {
                "tsc": calibration.as_dict(),
                "stamps": "TSC ns, one calibration shared by producers and consumer "
                + facts["stamps_where"],
            },
            "counts": counts.as_dict(),
            "latency": latency,
            "latency_from_intended": accounting.latency_stats(samples, "latency_from_intended_ns"),
            "warmup_excluded_s": args.warmup,
            "clients": {"producer": PRODUCER_CONFIG, "consumer": CONSUMER_CONFIG},
            "job": json.loads((work / "job-settings.json").read_text()),
            "model": facts["model"],
            "host": facts["host"],
            "versions": facts["versions"],
            "git": meta.collect_git(),
        }
    )
    results_contract.write_run(
        results, meta_doc, samples, dead_letters=work / "dead_letters.jsonl", logs=logs
    )
    shutil.rmtree(work, ignore_errors=True)
    print_summary(results, counts, latency, meta_doc.get("steal_while_sending"))
    return 0 if counts.accounted else 2


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
