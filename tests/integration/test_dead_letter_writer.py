"""The job's dead-letter writer against a real broker: a letter the broker refuses is counted
and logged, and writing goes on (a Flink KafkaSink would fail the job)."""

from __future__ import annotations

import pytest
from confluent_kafka.admin import NewTopic
from driver import REPO
from hvbench_job.dead_letters import LOST_PREFIX, DeadLetterWriter
from hvbench_load.broker import KafkaBroker

pytestmark = pytest.mark.integration


def test_a_refused_dead_letter_is_counted_and_logged_and_the_writer_goes_on(tmp_path, capfd):
    with KafkaBroker(REPO / "build/kafka/libs", tmp_path / "kafka") as broker:
        admin = broker.admin()
        small = NewTopic("dead-letter", 1, 1, config={"max.message.bytes": "300"})
        admin.create_topics([small])["dead-letter"].result(30)
        writer = DeadLetterWriter(broker.bootstrap, "dead-letter")
        writer.write('{"reason": "short"}')
        writer.write('{"reason": "' + "x" * 2000 + '"}')  # over the topic's limit
        writer.write('{"reason": "short again"}')
        writer.close()
    assert writer.written == 2 and writer.lost == 1
    err = capfd.readouterr().err
    assert f"{LOST_PREFIX} (1 so far): " in err and "too large" in err.lower()
