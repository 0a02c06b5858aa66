"""`make run`: one experiment on the bare target (this machine, no hypervisor).

Order: check the settings (nothing is started for a bad one) → calibrate the TSC → Kafka →
the Flink job → a readiness probe through the job → the scheduler setting, read back →
consumer → producers → drain → tear down (also on Ctrl-C or error) → account for every record →
results/<run-id>/ → summary. The exit code is non-zero if anything failed or any record is
unaccounted for.

    python -m hvbench_load.run --sched deadline --budget 20000 --period 100000
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
import uuid
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from confluent_kafka import Consumer, Producer

import tsc_timer
from hvbench_load import accounting, meta, sched, tuning
from hvbench_load.broker import KafkaBroker
from hvbench_load.consumer import CONSUMER_CONFIG
from hvbench_load.producers import PRODUCER_CONFIG, send_offset_ns

TARGETS = ("bare",)  # kvm and xen come with `make provision`
TOPICS = {"input": "input", "output": "output", "dead_letter": "dead-letter"}
# Threads of the job's JVM that handle records (comm names, cut to 15 characters by the
# kernel): the chained task of source + Python operator + sinks, the Kafka source's fetcher,
# and the network threads of the two Kafka sinks (results, dead letters): four threads.
# SCHED=deadline applies to these.
JOB_THREAD_PATTERNS = (r"^Source: kafka-", r"^Source Data Fet", r"^kafka-producer-")
JOB_THREADS = 4
PROBE_PREFIX = "hvbench-readiness-probe-"


class RunError(RuntimeError):
    pass


@dataclass
class Processes:
    """Everything the run started, so teardown can find it."""

    broker: KafkaBroker | None = None
    job: subprocess.Popen | None = None
    consumer: subprocess.Popen | None = None
    producers: subprocess.Popen | None = None
    quota: sched.CpuQuota | None = None
    stopped: list[str] = field(default_factory=list)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m hvbench_load.run", description=__doc__.split("\n")[0]
    )
    p.add_argument("--target", default="bare")
    p.add_argument("--sched", default="none")
    p.add_argument("--budget", type=int, help="microseconds")
    p.add_argument("--period", type=int, help="microseconds (default 100000 where it applies)")
    p.add_argument("--records", type=int, default=20_000, help="in total over the six producers")
    p.add_argument("--period-ms", type=float, default=100.0, help="send period of each producer")
    p.add_argument("--warmup-s", type=float, default=10.0, help="excluded from the statistics")
    p.add_argument("--ramp-s", type=float, default=0.0, help="rise to the full rate over this")
    p.add_argument("--malformed", type=int, default=0, help="malformed records to inject")
    p.add_argument(
        "--cpu-latency",
        default="auto",
        help="hold /dev/cpu_dma_latency at this many µs during the run; auto = 0 where "
        "permitted; off = leave C-states alone",
    )
    p.add_argument("--drain-s", type=float, default=20.0, help="wait for late results this long")
    p.add_argument("--data", default="data/pems")
    p.add_argument("--model", default="artifacts/forecaster")
    p.add_argument("--kafka-libs", default="build/kafka/libs")
    p.add_argument("--connector-dir", default="build/flink/lib")
    p.add_argument("--results", default="results")
    p.add_argument("--work", default="work", help="broker data and logs while running")
    p.add_argument("--run-id")
    p.add_argument("--force-tsc", action="store_true", help="run on a TSC without constant/nonstop")
    return p.parse_args(argv)


def check_settings(args: argparse.Namespace) -> tuple[sched.SchedSetting, tuning.CpuLatency]:
    """Refuse bad settings before anything is started or touched."""
    if args.target not in TARGETS:
        raise RunError(
            f"unknown TARGET {args.target!r}; valid here: {', '.join(TARGETS)} "
            "(kvm and xen run on a host set up with `make provision`)"
        )
    setting = sched.validate(args.sched, args.budget, args.period)
    if args.records <= 0 or args.period_ms <= 0 or args.warmup_s < 0 or args.malformed < 0:
        raise RunError("RECORDS and the send period must be positive, WARMUP and MALFORMED ≥ 0")
    if not 0 <= args.ramp_s <= args.warmup_s:
        raise RunError("RAMP must lie within the warm-up: 0 ≤ RAMP ≤ WARMUP")
    for what, path in (("model", Path(args.model) / "manifest.json"), ("data", Path(args.data))):
        if not path.exists():
            raise RunError(f"no {what} at {path} (make train / make data create it)")
    sched.check_permitted(setting, threads=JOB_THREADS)
    cpu_latency = tuning.CpuLatency(tuning.parse_cpu_latency(args.cpu_latency))
    cpu_latency.check()
    return setting, cpu_latency


def log(message: str) -> None:
    print(f"[{datetime.now():%H:%M:%S}] {message}", flush=True)


def start_job(args, broker: KafkaBroker, work: Path) -> subprocess.Popen:
    env = {
        **os.environ,
        "OPENBLAS_NUM_THREADS": "1",
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "FLINK_LOG_DIR": str(work / "flink-log"),
    }
    cmd = [
        sys.executable,
        "-m",
        "hvbench_job.job",
        "--bootstrap",
        broker.bootstrap,
        "--model",
        args.model,
        "--input",
        TOPICS["input"],
        "--output",
        TOPICS["output"],
        "--dead-letter",
        TOPICS["dead_letter"],
        "--connector-dir",
        args.connector_dir,
        "--settings-out",
        str(work / "job-settings.json"),
    ]
    out = open(work / "job.out", "wb")  # noqa: SIM115 — the child writes to it until the end
    return subprocess.Popen(
        cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
    )


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


def wait_job_ready(broker: KafkaBroker, job: subprocess.Popen, work: Path, timeout: float) -> float:
    """Send a probe the job must refuse and wait for it in the dead-letter topic: then the
    whole path (source, Python operator with its model, sinks) is running. Returns seconds."""
    probe = PROBE_PREFIX + uuid.uuid4().hex
    consumer = Consumer(
        {"bootstrap.servers": broker.bootstrap, "group.id": f"probe-{probe}", **CONSUMER_CONFIG}
    )
    consumer.subscribe([TOPICS["dead_letter"]])
    producer = Producer({"bootstrap.servers": broker.bootstrap, **PRODUCER_CONFIG})
    producer.produce(TOPICS["input"], probe.encode())
    producer.flush(10)
    start = time.monotonic()
    try:
        while time.monotonic() - start < timeout:
            if job.poll() is not None:
                raise RunError(
                    f"the Flink job exited with {job.returncode} while starting:\n"
                    + tail(work / "job.out")
                )
            msg = consumer.poll(0.5)
            if msg is not None and not msg.error() and probe.encode() in msg.value():
                return time.monotonic() - start
        raise RunError(
            f"the Flink job did not answer the probe within {timeout:.0f} s:\n"
            + tail(work / "job.out")
        )
    finally:
        consumer.close()


def tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"({path} unreadable)"


def apply_sched(setting: sched.SchedSetting, jvm_pid: int, run_id: str, procs: Processes) -> dict:
    """Apply the scheduler setting to the job and read it back from the kernel."""
    if setting.sched == "none":
        return {"applied": "none", "readback": sched.readback_none(jvm_pid)}
    if setting.sched == "cfs-quota":
        procs.quota = sched.CpuQuota(setting, run_id)
        procs.quota.add(jvm_pid)
        return {
            "applied": "cfs-quota on every thread of the job's JVM",
            "readback": procs.quota.readback(),
        }
    threads = sched.threads_of(jvm_pid, list(JOB_THREAD_PATTERNS))
    if not threads:
        raise RunError(f"no job threads matching {JOB_THREAD_PATTERNS} in JVM {jvm_pid}")
    sched.check_permitted(setting, threads=len(threads))
    readback = sched.apply_deadline([tid for tid, _ in threads], setting)
    return {
        "applied": "SCHED_DEADLINE on the job's record-handling threads",
        "thread_patterns": list(JOB_THREAD_PATTERNS),
        "readback": [asdict(r) for r in readback],
    }


def final_sched_readback(setting: sched.SchedSetting, jvm_pid: int | None, procs: Processes):
    if jvm_pid is None or not Path(f"/proc/{jvm_pid}").exists():
        return None
    if setting.sched == "cfs-quota" and procs.quota is not None:
        return procs.quota.readback()
    if setting.sched == "deadline":
        threads = sched.threads_of(jvm_pid, list(JOB_THREAD_PATTERNS))
        return [asdict(r) for r in sched.readback_threads([tid for tid, _ in threads])]
    return sched.readback_none(jvm_pid)


def stop_process(
    proc: subprocess.Popen | None,
    name: str,
    procs: Processes,
    sig: int = signal.SIGTERM,
    timeout: float = 15.0,
) -> None:
    if proc is None or proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, sig)
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        pass
    procs.stopped.append(name)


def teardown(procs: Processes) -> None:
    stop_process(procs.producers, "producers", procs)
    stop_process(procs.consumer, "consumer", procs)
    stop_process(procs.job, "flink job", procs)
    if procs.quota is not None:
        procs.quota.close()
    if procs.broker is not None:
        procs.broker.stop()


def run(args: argparse.Namespace) -> int:
    setting, cpu_latency = check_settings(args)
    run_id = args.run_id or (
        f"{datetime.now(UTC):%Y%m%dT%H%M%SZ}-{args.target}-{setting.sched}"
        + (f"-b{setting.budget_us}-p{setting.period_us}" if setting.budget_us else "")
    )
    results = Path(args.results) / run_id
    work = Path(args.work) / run_id
    for taken in (results, work):
        if taken.exists():
            raise RunError(f"{taken} exists already; choose another RUN_ID")
    work.mkdir(parents=True)
    started_at = datetime.now(UTC)
    procs = Processes()
    meta_doc: dict = {
        "run_id": run_id,
        "requested": {
            "target": args.target,
            "sched": setting.sched,
            "budget_us": setting.budget_us,
            "period_us": setting.period_us,
            "records": args.records,
            "producer_period_ms": args.period_ms,
            "producers": 6,
            "warmup_s": args.warmup_s,
            "ramp_s": args.ramp_s,
            "malformed": args.malformed,
            "cpu_latency": args.cpu_latency,
        },
        "started_at": started_at.isoformat(),
    }
    jvm_pid = None
    interrupted = False

    def on_signal(signum, _frame):
        raise KeyboardInterrupt(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, on_signal)
    try:
        log(
            f"run {run_id}: {args.records} records from 6 producers every {args.period_ms:g} ms, "
            f"SCHED={setting.sched}"
        )
        calibration = tsc_timer.calibrate(force=args.force_tsc)
        (work / "calibration.json").write_text(json.dumps(calibration.as_dict()))
        c = calibration
        log(f"TSC {c.hz / 1e6:.3f} MHz ({c.source}, ±{c.error_ppm:.2f} ppm)")
        cpu_latency.open()
        meta_doc["cpu_latency"] = cpu_latency.describe()
        log(
            f"CPU latency limit held at {meta_doc['cpu_latency']['readback_us']} µs"
            if cpu_latency.fd is not None
            else f"CPU latency limit not held ({cpu_latency.not_held})"
        )

        procs.broker = KafkaBroker(args.kafka_libs, work / "kafka")
        procs.broker.start()
        procs.broker.create_topics(list(TOPICS.values()))
        log(f"Kafka {procs.broker.bootstrap} up, topics {', '.join(TOPICS.values())}")

        procs.job = start_job(args, procs.broker, work)
        ready_s = wait_job_ready(procs.broker, procs.job, work, timeout=180)
        jvm_pid = job_jvm_pid(procs.job)
        if jvm_pid is None:
            raise RunError("the job's JVM was not found")
        log(f"Flink job running (JVM pid {jvm_pid}), answered the probe in {ready_s:.1f} s")
        meta_doc["sched"] = apply_sched(setting, jvm_pid, run_id, procs)
        log(f"scheduler setting applied and read back: {setting.sched}")

        expect = args.records
        procs.consumer = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "hvbench_load.consumer",
                "--bootstrap",
                procs.broker.bootstrap,
                "--calibration",
                str(work / "calibration.json"),
                "--expect",
                str(expect),
                "--out",
                str(work / "received.csv"),
                "--dead-letters",
                str(work / "dead_letters.jsonl"),
            ],
            stdout=subprocess.PIPE,
            stderr=open(work / "consumer.err", "wb"),  # noqa: SIM115
            start_new_session=True,
        )
        lines = line_queue(procs.consumer.stdout)
        subscribed_by = time.monotonic() + 60
        while next_line(lines, 1.0) != "consumer: assigned":
            if procs.consumer.poll() is not None or time.monotonic() > subscribed_by:
                raise RunError("the consumer got no partitions:\n" + tail(work / "consumer.err"))
        procs.producers = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "hvbench_load.producers",
                "--bootstrap",
                procs.broker.bootstrap,
                "--data",
                args.data,
                "--calibration",
                str(work / "calibration.json"),
                "--records",
                str(args.records),
                "--period-ms",
                str(args.period_ms),
                "--ramp-s",
                str(args.ramp_s),
                "--malformed",
                str(args.malformed),
                "--out",
                str(work / "sent.csv"),
            ],
            stdout=open(work / "producers.out", "wb"),  # noqa: SIM115 — the child's until the end
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        last = send_offset_ns(
            -(-args.records // 6) - 1, round(args.period_ms * 1e6), round(args.ramp_s * 1e9)
        )
        expected_s = last / 1e9 + args.period_ms / 1000
        log(f"producers started: about {expected_s:.0f} s of sending")
        started = time.monotonic()
        cpu_at_start = tuning.CpuTimes.now()
        drain_deadline = None
        while procs.consumer.poll() is None:
            line = next_line(lines, 0.2)
            if line:
                relay_line(line, expect, started)
            if procs.producers.poll() is not None and drain_deadline is None:
                drain_deadline = time.monotonic() + args.drain_s
                meta_doc["steal_while_sending"] = tuning.steal_between(
                    cpu_at_start, tuning.CpuTimes.now()
                )
            if procs.job.poll() is not None:
                raise RunError(f"the Flink job died during the run:\n{tail(work / 'job.out')}")
            if drain_deadline is not None and time.monotonic() > drain_deadline:
                procs.consumer.send_signal(signal.SIGTERM)
                procs.consumer.wait(60)
        if sys.stdout.isatty():
            print()
        procs.producers.wait()
        if procs.producers.returncode != 0:
            raise RunError("the producers failed:\n" + tail(work / "producers.out"))
        if procs.consumer.returncode != 0:
            raise RunError("the consumer failed:\n" + tail(work / "consumer.err"))
        meta_doc["sched_at_end"] = final_sched_readback(setting, jvm_pid, procs)
    except KeyboardInterrupt:
        interrupted = True
        log(f"interrupted: tearing everything down (partial files stay in {work})")
    finally:
        broker_description = procs.broker.describe() if procs.broker else None
        teardown(procs)
        cpu_latency.close()
        log("torn down: " + (", ".join(procs.stopped) or "nothing was left running") + ", Kafka")
    if interrupted:
        return 130

    samples, counts, _ = accounting.account(
        work / "sent.csv",
        work / "received.csv",
        work / "dead_letters.jsonl",
        warmup_ns=round(args.warmup_s * 1e9),
        malformed_sent=args.malformed,
    )
    results.mkdir(parents=True)
    samples.to_csv(results / "samples.csv", index=False)
    shutil.copy(work / "dead_letters.jsonl", results / "dead_letters.jsonl")
    logs = results / "logs"
    logs.mkdir()
    for name in ("job.out", "producers.out", "consumer.err", "kafka/broker.log"):
        if (work / name).exists():
            shutil.copy(work / name, logs / Path(name).name)
    for f in (work / "flink-log").glob("*.log"):
        shutil.copy(f, logs / f.name)
    latency = accounting.latency_stats(samples)
    meta_doc.update(
        {
            "ended_at": datetime.now(UTC).isoformat(),
            "clock": {
                "tsc": calibration.as_dict(),
                "stamps": "TSC ns, one calibration shared by "
                "producers and consumer on this machine",
            },
            "counts": counts.as_dict(),
            "latency": latency,
            "latency_from_intended": accounting.latency_stats(samples, "latency_from_intended_ns"),
            "warmup_excluded_s": args.warmup_s,
            "kafka": broker_description,
            "clients": {"producer": PRODUCER_CONFIG, "consumer": CONSUMER_CONFIG},
            "job": json.loads((work / "job-settings.json").read_text()),
            "model": json.loads((Path(args.model) / "manifest.json").read_text()).get("checksum"),
            "host": meta.collect_host(),
            "versions": meta.collect_versions(),
            "git": meta.collect_git(),
            "files": {
                "samples": "samples.csv",
                "dead_letters": "dead_letters.jsonl",
                "logs": "logs/",
            },
        }
    )
    (results / "meta.json").write_text(json.dumps(meta_doc, indent=2, default=str) + "\n")
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
    if steal and steal["steal_s"] > 0:
        print(f"  the hypervisor took {steal['steal_pct']:.2f} % of CPU time while sending (steal)")
    if counts.accounted:
        print("  every record accounted for")
    else:
        print("  UNACCOUNTED RECORDS: " + "; ".join(counts.problems()))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        return run(args)
    except (RunError, ValueError, sched.SchedUnavailable, tuning.TuningError) as e:
        print(f"make run: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
