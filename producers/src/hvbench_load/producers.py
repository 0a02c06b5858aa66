"""Six open-loop producers, one per detector, each sending one record every `period`.

Open loop: record i of a detector is due at start + offset + i × period, whatever happened to
earlier records; a late send is sent at once, never skipped, and both the intended and the
actual send time (TSC ns) travel in the record, so queueing behind a stall shows up in the
latency from the intended time (no coordinated omission). The six schedules are staggered by
period/6 so the job sees evenly spaced records.

With a ramp (--ramp-s R) each producer's rate rises linearly from a tenth of the full rate to
the full rate over the first R seconds, then holds: at high rates this lets the JVMs' JIT
compilers warm up before the full load arrives instead of building a backlog that outlasts
the warm-up. The ramp belongs inside the warm-up; `send_offset_ns` is the schedule.

Each producer is its own Kafka client on its own thread. Records are the detector's real
windows (12 five-minute flows and the latest speed) taken in order from the data, skipping
windows that touch a missing value. Every record carries the run's id and the producer's own
sequence number, which name it exactly.

SIGTERM or Ctrl-C stops the sending; what was sent is written all the same (sent.csv, and the
injected malformed records' exact texts in --malformed-out), so a stopped run keeps its log.

    python -m hvbench_load.producers --bootstrap 127.0.0.1:9092 --data data/pems \\
        --calibration cal.json --run-id r1 --records 20000 --out sent.csv
"""

from __future__ import annotations

import argparse
import csv
import gc
import json
import math
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from confluent_kafka import Producer
from hvbench_job import detectors, pems
from hvbench_job.forecast import LOOKBACK

import tsc_timer

# librdkafka producer settings, chosen for latency and recorded in meta.json.
PRODUCER_CONFIG = {
    "linger.ms": 0,  # send at once, do not wait to batch
    "socket.nagle.disable": True,  # librdkafka leaves Nagle on by default
    "acks": "all",  # one broker: its own write; a cluster: min.insync.replicas of them
    "enable.idempotence": False,
    "compression.type": "none",
}

# Malformed records the producers can inject (--malformed K), one kind after another, to show
# the dead-letter path under load. Each carries the marker "<run id>:malformed-<i>", so its
# text is unique; the harness matches dead letters to these texts exactly. "oversized" is about
# 800 KB (the input topic takes 1 MiB) whose bad value grows when escaped.
MALFORMED_KINDS = ("bad-json", "missing-field", "wrong-length", "nan", "oversized")
OVERSIZED_BYTES = 800_000
# How long the producers wait for the broker's acknowledgements at the end (less when stopped).
FLUSH_S, FLUSH_WHEN_STOPPED_S = 30.0, 5.0


@dataclass
class Windows:
    """A detector's valid windows, in time order: flows (n, 12) and the speed at each end."""

    detector: str
    flows: np.ndarray
    speed: np.ndarray

    def record(self, i: int) -> tuple[list[float], float]:
        j = i % len(self.flows)
        return self.flows[j].tolist(), float(self.speed[j])


def load_windows(data_dir: Path | str) -> dict[str, Windows]:
    data = pems.load(data_dir, [d.station for d in detectors.DETECTORS])
    windows = {}
    for d in detectors.DETECTORS:
        if d.station not in data.reports:
            raise SystemExit(f"no data for detector {d.key} (station {d.station}) in {data_dir}")
        flow = data.series(d.station, "total_flow").to_numpy(dtype=float)
        speed = data.series(d.station, "avg_speed").to_numpy(dtype=float)
        ends = [
            end
            for end in range(LOOKBACK, len(flow) + 1)
            if np.isfinite(flow[end - LOOKBACK : end]).all() and math.isfinite(speed[end - 1])
        ]
        if not ends:
            raise SystemExit(f"detector {d.key} has no complete {LOOKBACK}-interval window")
        windows[d.key] = Windows(
            d.key,
            np.stack([flow[e - LOOKBACK : e] for e in ends]),
            np.array([speed[e - 1] for e in ends]),
        )
    return windows


def per_detector_counts(total: int, detector_keys: list[str]) -> dict[str, int]:
    """Split `total` records over the detectors as evenly as possible (first ones get the rest)."""
    n = len(detector_keys)
    return {k: total // n + (1 if i < total % n else 0) for i, k in enumerate(detector_keys)}


def malformed_record(run_id: str, i: int) -> str:
    kind = MALFORMED_KINDS[i % len(MALFORMED_KINDS)]
    marker = f"{run_id}:malformed-{i}"
    if kind == "bad-json":
        return f'{{"marker": {json.dumps(marker)}, "detector": '
    base = {
        "marker": marker,  # the harness knows them by their exact text, not by their key
        "run": run_id,
        "detector": detectors.DETECTORS[0].key,
        "seq": 0,
        "speed_mph": 60.0,
        "flows": [100.0] * LOOKBACK,
        "intended_ns": 0,
        "sent_ns": 0,
    }
    if kind == "missing-field":
        del base["flows"]
    elif kind == "wrong-length":
        base["flows"] = [100.0] * (LOOKBACK - 1)
    elif kind == "oversized":
        base["speed_mph"] = '"\\' * (OVERSIZED_BYTES // 4)  # 2 characters, 4 bytes escaped
    else:  # "nan": json.dumps writes NaN, which is not JSON
        base["flows"][3] = math.nan
    return json.dumps(base)


@dataclass
class SentLog:
    detector: str
    seq: list[int] = field(default_factory=list)
    intended_ns: list[int] = field(default_factory=list)
    sent_ns: list[int] = field(default_factory=list)
    delivered: list[bool] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


RAMP_START = 0.1  # fraction of the full rate at the start of a ramp


def send_offset_ns(i: int, period_ns: int, ramp_ns: int = 0) -> int:
    """When record i is due, from the producer's start: i × period, or on a linear ramp.

    On the ramp the rate is r(t) = (f + (1 − f)·t/R)/period, so the records due by t are
    N(t) = (f·t + (1 − f)·t²/2R)/period; record i is due where N(t) = i.
    """
    if ramp_ns <= 0:
        return i * period_ns
    f = RAMP_START
    on_ramp = (1 + f) / 2 * ramp_ns / period_ns  # records due during the ramp
    if i >= on_ramp:
        return round(ramp_ns + (i - on_ramp) * period_ns)
    a = (1 - f) / (2 * ramp_ns)
    return round((-f + math.sqrt(f * f + 4 * a * i * period_ns)) / (2 * a))


def run_producer(
    bootstrap: str,
    topic: str,
    run_id: str,
    windows: Windows,
    count: int,
    start_ns: int,
    period_ns: int,
    log: SentLog,
    stop: threading.Event,
    ramp_ns: int = 0,
    partition: int = 0,
) -> None:
    """One detector's records, to its own partition of the topic (keyed by detector)."""
    producer = Producer(
        {"bootstrap.servers": bootstrap, "client.id": windows.detector, **PRODUCER_CONFIG}
    )

    def delivered(index: int):
        def report(err, _msg) -> None:
            log.delivered[index] = err is None
            if err is not None:
                log.errors.append(f"seq {log.seq[index]}: {err}")

        return report

    for seq in range(count):
        if stop.is_set():
            break
        intended = start_ns + send_offset_ns(seq, period_ns, ramp_ns)
        wait = intended - tsc_timer.now_ns()
        if wait > 0:
            time.sleep(wait / 1e9)
        flows, speed = windows.record(seq)
        sent = tsc_timer.now_ns()
        value = (
            f'{{"run":{json.dumps(run_id)},"detector":"{windows.detector}","seq":{seq},'
            f'"speed_mph":{speed!r},'
            f'"flows":{json.dumps(flows)},"intended_ns":{intended},"sent_ns":{sent}}}'
        )
        log.seq.append(seq)
        log.intended_ns.append(intended)
        log.sent_ns.append(sent)
        log.delivered.append(False)
        producer.produce(
            topic, value.encode(), partition=partition, callback=delivered(len(log.seq) - 1)
        )
        producer.poll(0)  # serve delivery reports without waiting
    remaining = flush(producer, stop)
    if remaining:
        log.errors.append(f"{remaining} records still undelivered at the end")


def flush(producer: Producer, stop: threading.Event) -> int:
    """Wait for acknowledgements: FLUSH_S, or FLUSH_WHEN_STOPPED_S once asked to stop.
    Returns how many records are still unacknowledged."""
    started = time.monotonic()
    while producer.flush(0.5):
        limit = FLUSH_WHEN_STOPPED_S if stop.is_set() else FLUSH_S
        if time.monotonic() - started > limit:
            break
    return len(producer)


def send_malformed(bootstrap: str, topic: str, run_id: str, count: int, out: Path) -> None:
    """Inject `count` malformed records; their exact texts go to `out` (JSON lines)."""
    producer = Producer({"bootstrap.servers": bootstrap, **PRODUCER_CONFIG})
    with open(out, "w") as texts:
        for i in range(count):
            text = malformed_record(run_id, i)
            producer.produce(topic, text.encode())
            texts.write(json.dumps(text) + "\n")
    if producer.flush(30):
        raise SystemExit("malformed records could not be delivered")


def write_sent(path: Path, logs: list[SentLog]) -> int:
    rows = 0
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["detector", "seq", "intended_ns", "sent_ns", "delivered"])
        for log in logs:
            for i in range(len(log.seq)):
                w.writerow(
                    [
                        log.detector,
                        log.seq[i],
                        log.intended_ns[i],
                        log.sent_ns[i],
                        int(log.delivered[i]),
                    ]
                )
                rows += 1
    return rows


def topic_partitions(bootstrap: str, topic: str) -> int:
    metadata = Producer({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=10)
    return max(1, len(metadata.topics[topic].partitions))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m hvbench_load.producers", description=__doc__.split("\n")[0]
    )
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--topic", default="input")
    p.add_argument("--data", required=True, help="PeMS station 5-minute files")
    p.add_argument("--calibration", required=True, help="TSC calibration JSON of this run")
    p.add_argument("--run-id", required=True, help="carried in every record")
    p.add_argument("--records", type=int, default=20_000, help="in total, over all detectors")
    p.add_argument("--period-ms", type=float, default=100.0, help="per detector")
    p.add_argument("--ramp-s", type=float, default=0.0, help="rise to the full rate over this")
    p.add_argument("--malformed", type=int, default=0, help="malformed records to inject first")
    p.add_argument("--start-delay-ms", type=float, default=200.0)
    p.add_argument("--out", required=True, help="CSV of every record sent")
    p.add_argument("--malformed-out", help="JSON lines: the injected records' exact texts")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    tsc_timer.adopt(json.loads(Path(args.calibration).read_text()))
    windows = load_windows(args.data)
    keys = [d.key for d in detectors.DETECTORS]
    counts = per_detector_counts(args.records, keys)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    if args.malformed:
        out = Path(args.malformed_out or Path(args.out).with_name("malformed.jsonl"))
        send_malformed(args.bootstrap, args.topic, args.run_id, args.malformed, out)
    period_ns = round(args.period_ms * 1e6)
    start = tsc_timer.now_ns() + round(args.start_delay_ms * 1e6)
    logs = [SentLog(k) for k in keys]
    partitions = topic_partitions(args.bootstrap, args.topic)
    # Sending makes no reference cycles; a full collection over the growing logs would only
    # delay a send.
    gc.disable()
    threads = [
        threading.Thread(
            target=run_producer,
            name=f"producer-{k}",
            args=(
                args.bootstrap,
                args.topic,
                args.run_id,
                windows[k],
                counts[k],
                start + i * period_ns // len(keys),
                period_ns,
                logs[i],
                stop,
                round(args.ramp_s * 1e9),
                i % partitions,  # producer i to partition i: keyed by detector
            ),
        )
        for i, k in enumerate(keys)
    ]
    for t in threads:
        t.start()
    try:
        for t in threads:
            while t.is_alive():
                t.join(0.2)  # short joins: SIGTERM's handler runs between them
    except KeyboardInterrupt:
        stop.set()
        for t in threads:
            t.join()
    rows = write_sent(Path(args.out), logs)
    errors = [f"{log.detector} {e}" for log in logs for e in log.errors]
    for e in errors[:20]:
        print(f"producers: {e}", file=sys.stderr)
    if stop.is_set():
        print(f"producers: stopped after {rows} records", file=sys.stderr)
        return 1
    return 1 if errors or rows < args.records else 0


if __name__ == "__main__":
    sys.exit(main())
