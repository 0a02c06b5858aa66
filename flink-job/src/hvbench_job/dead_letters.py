"""The job's dead-letter writer: its own Kafka client, so that a dead letter the broker
refuses (or cannot take) is counted and logged, and the job goes on.

A Flink KafkaSink would fail the whole job on one refused record (with restart strategy none,
the run). Dead letters are rare and no result waits on them, so a plain client suits them.
Every letter lost is one line on the job's stderr, `hvbench-job: dead letter lost: ...`; the
harness counts those lines (counts.dead_letters_lost).
"""

from __future__ import annotations

import sys

from confluent_kafka import KafkaException, Producer

LOST_PREFIX = "hvbench-job: dead letter lost"
CONFIG = {
    "linger.ms": 0,
    "acks": 1,
    "socket.nagle.disable": True,
    "message.timeout.ms": 60_000,  # a letter not delivered in a minute is lost, and says so
    # one letter per batch: a letter the broker refuses takes no other letter down with it
    "batch.num.messages": 1,
}


class DeadLetterWriter:
    def __init__(self, bootstrap: str, topic: str) -> None:
        self.topic = topic
        self.producer = Producer({"bootstrap.servers": bootstrap, **CONFIG})
        self.written = 0
        self.lost = 0

    def write(self, letter: str) -> None:
        try:
            self.producer.produce(self.topic, letter.encode(), on_delivery=self._delivered)
        except (BufferError, KafkaException) as e:
            self._lose(str(e))
        self.producer.poll(0)

    def serve(self) -> None:
        """Take delivery reports of letters still in flight (cheap when there are none)."""
        if len(self.producer):
            self.producer.poll(0)

    def close(self, timeout_s: float = 10.0) -> None:
        left = self.producer.flush(timeout_s)
        for _ in range(left):
            self._lose(f"still in flight after {timeout_s:g} s at the job's end")

    def _delivered(self, err, _msg) -> None:
        if err is None:
            self.written += 1
        else:
            self._lose(err.str())

    def _lose(self, reason: str) -> None:
        self.lost += 1
        print(f"{LOST_PREFIX} ({self.lost} so far): {reason}", file=sys.stderr, flush=True)
