"""A run's workload started in order, each part through Parts on its machine: the Flink job
(and the readiness probe through it), then each client pair's consumer, once it has its
partitions, and its producers."""

from __future__ import annotations

import subprocess
import time

from hvbench_load.producers import send_offset_ns

from hvbench_harness import spec
from hvbench_harness.accounting import pair_file
from hvbench_harness.parts import (
    Parts,
    RunError,
    line_queue,
    log,
    next_line,
    stop_process,
    tail,
)
from hvbench_harness.targets import Target
from hvbench_harness.targets.common import CALIBRATION, TOPICS
from hvbench_harness.watch import watch


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
    """The readiness probe (hvbench_load.probe), run where the broker is, while the job is
    watched. Returns the seconds the probe took, as it measured them."""
    machine, work, timeout = target.messaging, parts.work, target.ready_timeout_s
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
            reason = target.part_gone(job)
            if reason:
                raise RunError(reason)
            time.sleep(0.5)
        out = prober.stdout.read().decode(errors="replace").strip()
        if prober.returncode != 0:
            raise RunError(f"{out}\n{tail(work / 'job.out')}")
        return float(out.splitlines()[-1])
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
    subscribed_by = time.monotonic() + target.subscribe_s
    while next_line(lines, 1.0) != "consumer: assigned":
        if consumer.poll() is not None or time.monotonic() > subscribed_by:
            err = tail(parts.work / pair_file("consumer.err", pair))
            raise RunError(f"the consumer got no partitions:\n{err}")
        watch(target, job)
    return consumer, lines


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
