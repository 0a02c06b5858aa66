"""Open-loop producers: every detector of the network sends one record every `period`.

Open loop: record i of a detector is due at start + offset + i × period, whatever happened to
earlier records; a late send is sent at once, never skipped, and both the intended and the
actual send time (TSC ns) travel in the record, so queueing behind a stall shows up in the
latency from the intended time (no coordinated omission). The detectors' schedules are
staggered by period/n so the job sees evenly spaced records.

The detectors are dealt to `--producers` groups (detector j to group j mod G); each group is
one Kafka client on its own thread, sending its detectors' records in the order they fall
due. The six freeway detectors default to six groups of one, as the reference study ran them;
the 325 PEMS-BAY sensors (`--network bay`) to six groups of 54 or 55, each record with a
destination drawn from the sensors its own can reach (seeded by sensor: the same in every
run).

With `--messages group` a group's detectors report together, as the detectors behind one
roadside controller do: they share the group's place in the schedule (the groups are staggered
by period/G), and each round of the group is one Kafka message, a JSON array of its records.
No record waits for another: all of a message's records fall due at the same instant. Each
record keeps its own stamps and identity, so the latency is still per record; what a message
saves is the per-message work of every part (a Kafka request, a fetch, a hand-off into the
job's Python, one forecast call for the whole group). The default, `--messages record`, sends
each record as its own message.

With `--clients C`, the groups are dealt to C client pairs (group g to pair g mod C, see
hvbench_job.clients), each a producers process and its own consumer, on one machine each;
`--client k` sends pair k's groups only, each in its place in the staggered schedule (the pairs
start one after another, so the schedule holds within a pair, not to the nanosecond across
them).

With a ramp (--ramp-s R) each producer's rate rises linearly from a tenth of the full rate to
the full rate over the first R seconds, then holds: at high rates this lets the JVMs' JIT
compilers warm up before the full load arrives instead of building a backlog that outlasts
the warm-up. The ramp belongs inside the warm-up; `send_offset_ns` is the schedule.

Records are the detector's real windows (12 five-minute flows and the latest speed) taken in
order from the data, skipping windows that touch a missing value. Every record carries the
run's id and its detector's own sequence number, which name it exactly.

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
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from confluent_kafka import KafkaException, Producer
from hvbench_job import clients, networks, pems
from hvbench_job.forecast import LOOKBACK
from hvbench_job.networks import Network

import tsc_timer
from hvbench_load.stopping import stop_on_sigterm

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
MESSAGES = ("record", "group")  # --messages: what one Kafka message carries
SENDING = "producers: sending"  # printed once the data is loaded, before the first send
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


def load_windows(data_dir: Path | str, network: str = "freeway") -> dict[str, Windows]:
    net = networks.network(network)
    data = pems.load(data_dir, [d.station for d in net.detectors])
    windows = {}
    for d in net.detectors:
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
        "detector": networks.network("freeway").detectors[0].key,
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


@dataclass
class Source:
    """One detector within a producer group: its windows, how many records it sends, its
    place in the schedule, its partition, its log, and where its routes may go (None: the
    network's default route, no destination in the record)."""

    windows: Windows
    count: int
    offset_ns: int
    partition: int
    log: SentLog
    destinations: list[str] | None = None
    rng: np.random.Generator | None = None

    def record(self, run_id: str, seq: int, intended: int, sent: int) -> str:
        flows, speed = self.windows.record(seq)
        text = (
            f'{{"run":{json.dumps(run_id)},"detector":"{self.windows.detector}","seq":{seq},'
            f'"speed_mph":{speed!r},'
            f'"flows":{json.dumps(flows)},"intended_ns":{intended},"sent_ns":{sent}'
        )
        if self.destinations is not None:
            destination = self.destinations[int(self.rng.integers(len(self.destinations)))]
            text += f',"destination":"{destination}"'
        return text + "}"


def rounds(sources: list[Source]) -> Iterator[tuple[int, list[Source]]]:
    """(seq, sources) of the records that fall due at one instant, in time order."""
    due: list[Source] = []
    last = None
    for seq, source in schedule(sources):
        if due and (seq, source.offset_ns) != last:
            yield last[0], due
            due = []
        due.append(source)
        last = (seq, source.offset_ns)
    if due:
        yield last[0], due


def schedule(sources: list[Source]) -> Iterator[tuple[int, Source]]:
    """(seq, source) in the order the records fall due: by seq, then by offset. Offsets lie
    within one period and the ramp never shortens a gap below it, so this is time order."""
    ordered = sorted(sources, key=lambda s: s.offset_ns)
    most = max((s.count for s in sources), default=0)
    for seq in range(most):
        for s in ordered:
            if seq < s.count:
                yield seq, s


def run_producer(
    bootstrap: str,
    topic: str,
    run_id: str,
    sources: list[Source],
    start_ns: int,
    period_ns: int,
    stop: threading.Event,
    ramp_ns: int = 0,
    client_id: str = "producer",
    together: bool = False,
) -> None:
    """One group's records, each detector's to its own partition of the topic; `together`:
    each round of the group as one message (a JSON array), to the first detector's partition."""
    producer = Producer({"bootstrap.servers": bootstrap, "client.id": client_id, **PRODUCER_CONFIG})

    def delivered(reports: list[tuple[SentLog, int]]):
        def report(err, _msg) -> None:
            for log, index in reports:
                log.delivered[index] = err is None
                if err is not None:
                    log.errors.append(f"seq {log.seq[index]}: {err}")

        return report

    for seq, due in rounds(sources) if together else schedule_each(sources):
        if stop.is_set():
            break
        intended = start_ns + due[0].offset_ns + send_offset_ns(seq, period_ns, ramp_ns)
        wait = intended - tsc_timer.now_ns()
        if wait > 0:
            time.sleep(wait / 1e9)
        sent = tsc_timer.now_ns()
        values, reports = [], []
        for source in due:
            values.append(source.record(run_id, seq, intended, sent))
            log = source.log
            log.seq.append(seq)
            log.intended_ns.append(intended)
            log.sent_ns.append(sent)
            log.delivered.append(False)
            reports.append((log, len(log.seq) - 1))
        value = f"[{','.join(values)}]" if together else values[0]
        producer.produce(
            topic, value.encode(), partition=due[0].partition, callback=delivered(reports)
        )
        producer.poll(0)  # serve delivery reports without waiting
    remaining = flush(producer, stop)
    if remaining:
        sources[0].log.errors.append(f"{remaining} records of the group still undelivered")


def schedule_each(sources: list[Source]) -> Iterator[tuple[int, list[Source]]]:
    for seq, source in schedule(sources):
        yield seq, [source]


def sources_of(
    net: Network,
    windows: dict[str, Windows],
    records: int,
    period_ns: int,
    partitions: int,
    groups: int | None = None,
) -> list[Source]:
    """Every detector's Source: its share of the records, its offset in the staggered
    schedule, its partition (detector j to partition j mod partitions: keyed by detector).
    With `groups` (messages by group), detector j shares group j mod G's offset."""
    keys = [d.key for d in net.detectors]
    counts = per_detector_counts(records, keys)
    slots = groups or len(keys)
    return [
        Source(
            windows[k],
            counts[k],
            (j % slots) * period_ns // slots,
            j % partitions,
            SentLog(k),
            net.reachable(k) if net.record_destinations else None,
            np.random.default_rng([net.by_key[k].station]) if net.record_destinations else None,
        )
        for j, k in enumerate(keys)
    ]


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


def topic_partitions(
    bootstrap: str, topic: str, wait_s: float = 120.0, attempt_s: float = 10.0
) -> int:
    """The topic's partition count, asked again while the broker does not answer for up to
    wait_s: it may be restarting (BROKER_RESTARTS), which takes some 20 s."""
    client = Producer({"bootstrap.servers": bootstrap})
    deadline = time.monotonic() + wait_s
    while True:
        try:
            metadata = client.list_topics(topic, timeout=attempt_s)
            return max(1, len(metadata.topics[topic].partitions))
        except KafkaException:
            if time.monotonic() > deadline:
                raise
            time.sleep(1.0)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m hvbench_load.producers", description=__doc__.split("\n")[0]
    )
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--topic", default="input")
    p.add_argument("--data", required=True, help="PeMS station 5-minute files")
    p.add_argument("--calibration", required=True, help="TSC calibration JSON of this run")
    p.add_argument("--run-id", required=True, help="carried in every record")
    p.add_argument("--network", default="freeway", choices=networks.NAMES)
    p.add_argument("--producers", type=int, help="groups, one client each; default 6")
    p.add_argument(
        "--messages",
        default="record",
        choices=MESSAGES,
        help="what one Kafka message carries: one record, or a group's records due together",
    )
    p.add_argument("--clients", type=int, default=1, help="client pairs the groups are dealt to")
    p.add_argument("--client", type=int, default=0, help="this pair: its groups only")
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
    net = networks.network(args.network)
    groups = clients.groups(args.producers, len(net.detectors))
    if not 1 <= groups <= len(net.detectors):
        raise SystemExit(f"--producers must be 1..{len(net.detectors)} (got {groups})")
    if not 0 <= args.client < args.clients <= groups:
        raise SystemExit(f"need 0 <= --client < --clients <= groups ({groups})")
    windows = load_windows(args.data, args.network)
    stop = threading.Event()
    stop_on_sigterm(stop)
    if args.malformed:
        out = Path(args.malformed_out or Path(args.out).with_name("malformed.jsonl"))
        send_malformed(args.bootstrap, args.topic, args.run_id, args.malformed, out)
    period_ns = round(args.period_ms * 1e6)
    partitions = topic_partitions(args.bootstrap, args.topic)
    together = args.messages == "group"
    sources = sources_of(
        net, windows, args.records, period_ns, partitions, groups if together else None
    )
    # Sending makes no reference cycles; a full collection over the growing logs would only
    # delay a send.
    gc.disable()
    # the data is loaded: the harness counts the parts' CPU time per record from here
    print(SENDING, flush=True)
    start = tsc_timer.now_ns() + round(args.start_delay_ms * 1e6)
    own = [g for g in range(groups) if clients.client_of(g, groups, args.clients) == args.client]
    threads = [
        threading.Thread(
            target=run_producer,
            name=f"producer-{g}",
            args=(
                args.bootstrap,
                args.topic,
                args.run_id,
                sources[g::groups],
                start,
                period_ns,
                stop,
                round(args.ramp_s * 1e9),
                sources[g].log.detector if groups == len(sources) else f"producers-{g}",
                together,
            ),
        )
        for g in own
    ]
    run_all(threads, stop)
    mine = [s for j, s in enumerate(sources) if j % groups in own]  # the network's order
    return report_sent(Path(args.out), mine, stop)


def run_all(threads: list[threading.Thread], stop: threading.Event) -> None:
    """Every producer thread until it ends; Ctrl-C stops them all."""
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


def report_sent(out: Path, mine: list, stop: threading.Event) -> int:
    """sent.csv of these sources, their errors printed; the exit code."""
    logs = [s.log for s in mine]
    rows = write_sent(out, logs)
    errors = [f"{log.detector} {e}" for log in logs for e in log.errors]
    for e in errors[:20]:
        print(f"producers: {e}", file=sys.stderr)
    if stop.is_set():
        print(f"producers: stopped after {rows} records", file=sys.stderr)
        return 1
    return 1 if errors or rows < sum(s.count for s in mine) else 0


if __name__ == "__main__":
    sys.exit(main())
