"""The readiness probe: is the Flink job's whole path running?

It sends a record the job must refuse and waits for it in the dead-letter topic: then the
source, the Python operator with its model and the sinks all run. The run starts its producers
only after this. The probe's text is probe_record(run id), so the harness knows the one dead
letter that is expected besides the injected malformed records.

    python -m hvbench_load.probe --bootstrap 192.168.123.10:40123 --run-id r1 --timeout 600
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable

from confluent_kafka import Consumer, Producer

from hvbench_load.consumer import CONSUMER_CONFIG
from hvbench_load.producers import PRODUCER_CONFIG

PROBE_PREFIX = "hvbench-readiness-probe:"


def probe_record(run_id: str) -> str:
    return PROBE_PREFIX + run_id


class ProbeError(RuntimeError):
    pass


def wait_for_job(
    bootstrap: str,
    timeout: float,
    run_id: str,
    input_topic: str = "input",
    dead_letter_topic: str = "dead-letter",
    job_gone: Callable[[], str | None] = lambda: None,
) -> float:
    """Seconds until the probe came back. `job_gone` returns why the job can no longer
    answer (it exited), or None while it runs."""
    probe = probe_record(run_id)
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"probe-{probe}", **CONSUMER_CONFIG}
    )
    consumer.subscribe([dead_letter_topic])
    producer = Producer({"bootstrap.servers": bootstrap, **PRODUCER_CONFIG})
    # one probe per input partition: on a cluster each partition is read by one of the
    # job's tasks, and every task must answer
    partitions = producer.list_topics(input_topic, timeout=10).topics[input_topic].partitions
    for partition in partitions:
        producer.produce(input_topic, probe.encode(), partition=partition)
    producer.flush(10)
    start, answered = time.monotonic(), 0
    try:
        while time.monotonic() - start < timeout:
            gone = job_gone()
            if gone:
                raise ProbeError(gone)
            msg = consumer.poll(0.5)
            if msg is not None and not msg.error() and answers(msg.value(), probe):
                answered += 1
                if answered == len(partitions):
                    return time.monotonic() - start
        raise ProbeError(
            f"the Flink job answered {answered} of {len(partitions)} probes within {timeout:.0f} s"
        )
    finally:
        consumer.close()


def answers(letter: bytes, probe: str) -> bool:
    try:
        return json.loads(letter).get("record") == probe
    except (ValueError, AttributeError):
        return False


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m hvbench_load.probe", description=__doc__.split("\n")[0]
    )
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--run-id", required=True)
    p.add_argument("--timeout", type=float, default=180.0)
    p.add_argument("--input", default="input")
    p.add_argument("--dead-letter", default="dead-letter")
    args = p.parse_args(argv)
    try:
        seconds = wait_for_job(
            args.bootstrap, args.timeout, args.run_id, args.input, args.dead_letter
        )
    except ProbeError as e:
        print(f"probe: {e}", file=sys.stderr)
        return 1
    print(f"{seconds:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
