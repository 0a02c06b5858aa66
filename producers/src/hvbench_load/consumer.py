"""The consumer: stamps every result on receipt (TSC ns) and keeps every dead letter.

It reads the output and the dead-letter topics, stamps a message the moment poll() returns it,
and only then parses it. A result is the run's own only if its `run` is the run's id, its
`detector` a JSON string, its `seq`, `intended_ns` and `sent_ns` JSON integers in their range
(0 <= value < 2**63, as hvbench_job.records checks them) and its other stamps, where present,
too; others are counted as foreign (never matched to a sent record, never written to the
received file, which holds 64-bit integers only). Dead letters are all kept: the harness
attributes them; a message on that topic that is not a JSON object is kept as text
(`not_a_letter`), a foreign dead letter. A null value (a tombstone) is an empty message.

With client pairs (`--clients`, hvbench_job.clients) it reads its own pair's output topic
only, and waits for its own detectors' share of `--expect`; the first pair's also reads the
dead letters.

It stops when it has seen `--expect` distinct results of its own, or on SIGTERM (the harness
sends it once the producers are done and the drain time has passed), and writes what it
received, and the foreign count in --summary; progress goes to stdout once a second.

    python -m hvbench_load.consumer --bootstrap 127.0.0.1:9092 --calibration cal.json \\
        --run-id r1 --expect 20000 --out received.csv --dead-letters dead_letters.jsonl
"""

from __future__ import annotations

import argparse
import csv
import gc
import json
import signal
import sys
import threading
import time
from pathlib import Path

from confluent_kafka import Consumer, KafkaError
from hvbench_job import clients, networks
from hvbench_job.records import INTEGER_LIMIT

import tsc_timer
from hvbench_load.live import LiveLatency
from hvbench_load.producers import per_detector_counts
from hvbench_load.stopping import stop_on_sigterm

# librdkafka consumer settings, chosen for latency and recorded in meta.json.
CONSUMER_CONFIG = {
    # A fetch returns as soon as one record is there: the broker completes a waiting fetch when
    # a record is appended, so the wait bounds only empty fetches. Measured: 5 ms gave the same
    # latency as 100 ms but cost the broker a third of a core in empty fetches.
    "fetch.min.bytes": 1,
    "fetch.wait.max.ms": 100,
    "socket.nagle.disable": True,
    "auto.offset.reset": "earliest",  # a fresh group reads everything the run wrote
    "enable.auto.commit": False,  # each run uses a fresh group and fresh topics
}

# Messages taken per consume() call. Under load several results are waiting at once; taking them
# together costs one call instead of one each; each is stamped when the call returns.
BATCH = 500

FOREIGN_EXAMPLES = 5  # foreign results kept as examples (cut to 300 characters each)

STAMPS = ("intended_ns", "sent_ns")  # a result's, with seq: each a 64-bit integer
JOB_STAMPS = ("predict_ns", "route_ns", "job_in_ns", "job_out_ns")  # the same, where present

FIELDS = [
    "detector",
    "seq",
    "intended_ns",
    "sent_ns",
    "received_ns",
    "predict_ns",
    "route_ns",
    "job_in_ns",
    "job_out_ns",
    "predicted_flow",
    "route_cost_s",
    "route",
]


def results_of(value: bytes) -> list[bytes]:
    """The results in one output message: itself, or each element of a JSON array (the job
    answers a group's message with one array); an array that is not JSON stays one value,
    to be counted as foreign."""
    if not value.startswith(b"["):
        return [value]
    try:
        elements = json.loads(value)
        return [json.dumps(e, separators=(",", ":")).encode() for e in elements]
    except (ValueError, RecursionError):
        return [value]


def own_result(value: bytes, run_id: str) -> dict | None:
    """A result of this run, checked with strict JSON types and ranges (what write() puts in
    the received file); else None."""
    try:
        record = json.loads(value)
    except (ValueError, RecursionError):
        return None
    if not isinstance(record, dict) or record.get("run") != run_id:
        return None
    integers = [record.get("seq"), *(record.get(k) for k in STAMPS)]
    if not isinstance(record.get("detector"), str) or not all(in_range(v) for v in integers):
        return None
    if not all(record.get(k) is None or in_range(record[k]) for k in JOB_STAMPS):
        return None
    route = record.get("route", [])
    if not isinstance(route, list) or not all(isinstance(x, str) for x in route):
        return None
    return record


def in_range(value: object) -> bool:
    """A JSON integer that fits the received file's 64-bit columns."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < INTEGER_LIMIT


def letter_line(value: bytes, received: int) -> str:
    """A message of the dead-letter topic as a line of the letters' file, with its receipt
    stamp; one that is not a JSON object (another writer's) is kept as text, to be counted as
    foreign."""
    try:
        letter = json.loads(value)
        if isinstance(letter, dict):
            return json.dumps({**letter, "received_ns": received})
    except (ValueError, RecursionError):
        pass
    text = value[:300].decode(errors="replace")
    return json.dumps({"not_a_letter": text, "bytes": len(value), "received_ns": received})


class Receiver:
    def __init__(
        self,
        bootstrap: str,
        topics: list[str],
        group: str,
        run_id: str,
        expect: int,
        network: str = "freeway",
        pair: tuple[int, int, int] = (6, 1, 0),
    ) -> None:
        """`expect`: the run's records in all; `pair`: (producer groups, client pairs, this
        pair), whose detectors' results are the ones this consumer waits for."""
        self.consumer = Consumer(
            {"bootstrap.servers": bootstrap, "group.id": group, **CONSUMER_CONFIG}
        )
        self.assigned = False

        def on_assign(_consumer, partitions) -> None:
            if not self.assigned:
                print(f"consumer: {len(partitions)} partitions", flush=True)
                print("consumer: assigned", flush=True)
            self.assigned = True

        self.consumer.subscribe(topics, on_assign=on_assign)
        self.output_topic, self.run_id = topics[0], run_id
        self.results: list[tuple] = []  # (received_ns, raw bytes), parsed at the end
        self.dead_letters: list[tuple[int, bytes]] = []
        self.distinct: set[tuple[str, int]] = set()  # of the keys the producers will send
        self.live = LiveLatency()
        keys = [d.key for d in networks.network(network).detectors]
        groups, pairs, this = pair
        own = {k for k, c in clients.clients_by_detector(keys, groups, pairs).items() if c == this}
        self.due = {k: n for k, n in per_detector_counts(expect, keys).items() if k in own}
        self.expected = sum(self.due.values())
        self.foreign = 0
        self.foreign_examples: list[str] = []
        self.errors: list[str] = []

    def poll(self, timeout: float) -> None:
        """Wait for a message, then take the ones already queued behind it (up to a batch)."""
        first = self.consumer.poll(timeout)
        if first is None:
            return
        self._take(first, tsc_timer.now_ns())
        # consume() waits until it has a full batch or the timeout: with 0 it takes what is there
        queued = self.consumer.consume(BATCH, 0)
        received = tsc_timer.now_ns()
        for msg in queued:
            self._take(msg, received)

    def _take(self, msg, received: int) -> None:
        if msg.error():
            error = msg.error()
            if error.fatal():
                self.errors.append(str(error))
            elif error.code() != KafkaError._PARTITION_EOF:
                # e.g. the broker restarting: the client reconnects by itself
                print(f"consumer: {error}", file=sys.stderr, flush=True)
        elif msg.topic() == self.output_topic:
            for result in results_of(msg.value() or b""):  # None: a tombstone
                self._take_result(result, received)
        else:
            self.dead_letters.append((received, msg.value() or b""))

    def _take_result(self, value: bytes, received: int) -> None:
        record = own_result(value, self.run_id)
        if record is None:
            self.foreign += 1
            if len(self.foreign_examples) < FOREIGN_EXAMPLES:
                self.foreign_examples.append(value[:300].decode(errors="replace"))
            return
        self.results.append((received, value))
        key = (record["detector"], record["seq"])
        # a look-alike's seq does not count; a copy counts once
        if key[1] < self.due.get(key[0], 0) and key not in self.distinct:
            self.distinct.add(key)
            self.live.add(received - record["sent_ns"])  # the progress line's latency so far

    def close(self) -> None:
        self.consumer.close()

    def write(self, received_csv: Path, dead_letters_jsonl: Path, summary_json: Path) -> None:
        with open(received_csv, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(FIELDS)
            for received, value in self.results:
                r = json.loads(value)
                w.writerow(
                    [
                        r["detector"],
                        r["seq"],
                        r["intended_ns"],
                        r["sent_ns"],
                        received,
                        r.get("predict_ns"),
                        r.get("route_ns"),
                        r.get("job_in_ns"),
                        r.get("job_out_ns"),
                        r.get("predicted_flow"),
                        r.get("route_cost_s"),
                        "/".join(r.get("route", [])),
                    ]
                )
        with open(dead_letters_jsonl, "w") as f:
            for received, value in self.dead_letters:
                f.write(letter_line(value, received) + "\n")
        summary = {"foreign_results": self.foreign, "foreign_examples": self.foreign_examples}
        summary_json.write_text(json.dumps(summary, indent=1) + "\n")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m hvbench_load.consumer", description=__doc__.split("\n")[0]
    )
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--output-topic", default="output")
    p.add_argument("--dead-letter-topic", default="dead-letter")
    p.add_argument("--group", default="hvbench-consumer")
    p.add_argument("--calibration", required=True)
    p.add_argument("--run-id", required=True, help="results of other runs are foreign")
    p.add_argument("--expect", type=int, required=True, help="the run's records, in all")
    p.add_argument("--producers", type=int, help="the run's producer groups (default 6)")
    p.add_argument("--clients", type=int, default=1, help="client pairs the groups are dealt to")
    p.add_argument("--client", type=int, default=0, help="this pair: its groups' results only")
    p.add_argument("--network", default="freeway", choices=networks.NAMES)
    p.add_argument("--out", required=True, help="CSV of every result received")
    p.add_argument("--dead-letters", required=True, help="JSON lines of every dead letter")
    p.add_argument("--summary", help="JSON: foreign results (default: next to --out)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    tsc_timer.adopt(json.loads(Path(args.calibration).read_text()))
    stopping = threading.Event()
    stop_on_sigterm(stopping, signal.SIGINT)
    # the first pair's consumer also keeps the dead letters
    topics = [clients.output_topic(args.client, args.output_topic)]
    topics += [args.dead_letter_topic] if args.client == 0 else []
    groups = clients.groups(args.producers, len(networks.network(args.network).detectors))
    pair = (groups, args.clients, args.client)
    group = args.group if args.client == 0 else f"{args.group}-{args.client}"  # a group each
    receiver = Receiver(args.bootstrap, topics, group, args.run_id, args.expect, args.network, pair)
    print("consumer: subscribed", flush=True)
    # The loop makes no reference cycles; a full collection over the results kept so far would
    # only delay a receipt stamp.
    gc.disable()
    last_report = time.monotonic()
    while not stopping.is_set() and len(receiver.distinct) < receiver.expected:
        receiver.poll(0.1)
        if time.monotonic() - last_report >= 1.0:
            last_report = time.monotonic()
            print(
                f"consumer: received {len(receiver.distinct)}/{receiver.expected} "
                f"dead-letters {len(receiver.dead_letters)}{receiver.live.text()}",
                flush=True,
            )
    # results may still be in flight when the expected count is reached through duplicates: none
    # are lost by stopping here, they would be counted as duplicates at most
    receiver.close()
    summary = Path(args.summary or Path(args.out).with_name("consumer.json"))
    receiver.write(Path(args.out), Path(args.dead_letters), summary)
    print(
        f"consumer: done, {len(receiver.results)} results "
        f"({len(receiver.distinct)} distinct), {len(receiver.dead_letters)} dead letters, "
        f"{receiver.foreign} foreign results",
        flush=True,
    )
    for e in receiver.errors[:20]:
        print(f"consumer: {e}", file=sys.stderr)
    return 1 if receiver.errors else 0


if __name__ == "__main__":
    sys.exit(main())
