"""The consumer: stamps every result on receipt (TSC ns) and keeps every dead letter.

It reads the output and the dead-letter topics, stamps a message the moment poll() returns it,
and only then parses it. It stops when it has seen `--expect` distinct results, or on SIGTERM
(the harness sends it once the producers are done and the drain time has passed), and writes
what it received; progress goes to stdout once a second.

    python -m hvbench_load.consumer --bootstrap 127.0.0.1:9092 --calibration cal.json \\
        --expect 20000 --out received.csv --dead-letters dead_letters.jsonl
"""

from __future__ import annotations

import argparse
import csv
import gc
import json
import signal
import sys
import time
from pathlib import Path

from confluent_kafka import Consumer, KafkaError

import tsc_timer

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

FIELDS = [
    "detector",
    "seq",
    "intended_ns",
    "sent_ns",
    "received_ns",
    "predict_ns",
    "route_ns",
    "predicted_flow",
    "route_cost_s",
    "route",
]


class Receiver:
    def __init__(self, bootstrap: str, topics: list[str], group: str) -> None:
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
        self.output_topic = topics[0]
        self.results: list[tuple] = []  # (received_ns, raw bytes), parsed at the end
        self.dead_letters: list[tuple[int, bytes]] = []
        self.distinct: set[tuple[str, int]] = set()
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
            if msg.error().code() != KafkaError._PARTITION_EOF:
                self.errors.append(str(msg.error()))
        elif msg.topic() == self.output_topic:
            value = msg.value()
            self.results.append((received, value))
            # a cheap key for the stop condition; the full parse happens once, at the end
            record = json.loads(value)
            self.distinct.add((record["detector"], record["seq"]))
        else:
            self.dead_letters.append((received, msg.value()))

    def close(self) -> None:
        self.consumer.close()

    def write(self, received_csv: Path, dead_letters_jsonl: Path) -> None:
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
                        r.get("predicted_flow"),
                        r.get("route_cost_s"),
                        "/".join(r.get("route", [])),
                    ]
                )
        with open(dead_letters_jsonl, "w") as f:
            for received, value in self.dead_letters:
                letter = json.loads(value)
                letter["received_ns"] = received
                f.write(json.dumps(letter) + "\n")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m hvbench_load.consumer", description=__doc__.split("\n")[0]
    )
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--output-topic", default="output")
    p.add_argument("--dead-letter-topic", default="dead-letter")
    p.add_argument("--group", default="hvbench-consumer")
    p.add_argument("--calibration", required=True)
    p.add_argument("--expect", type=int, required=True, help="distinct results to wait for")
    p.add_argument("--out", required=True, help="CSV of every result received")
    p.add_argument("--dead-letters", required=True, help="JSON lines of every dead letter")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    tsc_timer.adopt(json.loads(Path(args.calibration).read_text()))
    stopping = False

    def stop(*_):
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    receiver = Receiver(args.bootstrap, [args.output_topic, args.dead_letter_topic], args.group)
    print("consumer: subscribed", flush=True)
    # The loop makes no reference cycles; a full collection over the results kept so far would
    # only delay a receipt stamp.
    gc.disable()
    last_report = time.monotonic()
    while not stopping and len(receiver.distinct) < args.expect:
        receiver.poll(0.1)
        if time.monotonic() - last_report >= 1.0:
            last_report = time.monotonic()
            print(
                f"consumer: received {len(receiver.distinct)}/{args.expect} "
                f"dead-letters {len(receiver.dead_letters)}",
                flush=True,
            )
    # results may still be in flight when the expected count is reached through duplicates: none
    # are lost by stopping here, they would be counted as duplicates at most
    receiver.close()
    receiver.write(Path(args.out), Path(args.dead_letters))
    print(
        f"consumer: done, {len(receiver.results)} results "
        f"({len(receiver.distinct)} distinct), {len(receiver.dead_letters)} dead letters",
        flush=True,
    )
    for e in receiver.errors[:20]:
        print(f"consumer: {e}", file=sys.stderr)
    return 1 if receiver.errors else 0


if __name__ == "__main__":
    sys.exit(main())
