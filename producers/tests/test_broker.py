import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient
from hvbench_agent import tether
from hvbench_load.broker import (
    HUNG,
    SERVE_STOP_S,
    BrokerError,
    KafkaBroker,
    KafkaCluster,
    is_stopped,
    new_cluster_id,
)

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
LIBS = REPO / "build" / "kafka" / "libs"


def test_cluster_ids_have_kafkas_format():
    # one in 64 base64url UUIDs starts with "-", which kafka-storage would read as an option
    ids = {new_cluster_id() for _ in range(2000)}
    assert len(ids) == 2000 and all(len(i) == 22 and "=" not in i for i in ids)
    assert not any(i.startswith("-") for i in ids)


def test_a_served_broker_kills_its_jvm_before_the_tether_would_kill_it():
    # the JVM has a session of its own: the tether's SIGKILL to main()'s group would miss it
    assert SERVE_STOP_S + 2 < tether.GRACE_S  # + main()'s half-second polls on the way


def test_missing_jars_are_named(tmp_path):
    with pytest.raises(BrokerError, match="make kafka"):
        KafkaBroker(tmp_path, tmp_path / "work")


def test_a_real_broker_starts_serves_and_stops(tmp_path):
    broker = KafkaBroker(LIBS, tmp_path / "kafka")
    with broker:
        assert broker.bootstrap.startswith("127.0.0.1:")
        broker.create_topics(["input", "output"])
        assert broker.topics() == ["input", "output"]
        with pytest.raises(BrokerError, match="already exists"):
            broker.create_topics(["input"])
        producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})
        for i in range(5):
            producer.produce("input", f"m{i}".encode())
        assert producer.flush(10) == 0
        consumer = Consumer(
            {
                "bootstrap.servers": broker.bootstrap,
                "group.id": "t",
                "auto.offset.reset": "earliest",
            }
        )
        consumer.subscribe(["input"])
        got = []
        for _ in range(100):
            msg = consumer.poll(0.5)
            if msg is not None and not msg.error():
                got.append(msg.value().decode())
            if len(got) == 5:
                break
        consumer.close()
        assert got == [f"m{i}" for i in range(5)]
        pid = broker.pid()
        assert Path(f"/proc/{pid}").exists()
    assert broker.pid() is None and not Path(f"/proc/{pid}").exists()
    assert (tmp_path / "kafka" / "broker.log").stat().st_size > 0


def consume(bootstrap: str, topic: str, count: int, group: str) -> list[str]:
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest"}
    )
    consumer.subscribe([topic])
    got = []
    for _ in range(200):
        msg = consumer.poll(0.5)
        if msg is not None and not msg.error():
            got.append(msg.value().decode())
        if len(got) == count:
            break
    consumer.close()
    return got


def wait_for(condition, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


@pytest.mark.slow  # make test-testbed's slow tier, for make test's budget (docs/testing.md)
def test_a_killed_broker_is_restarted_on_its_data_and_the_fault_recorded(tmp_path):
    broker = KafkaBroker(LIBS, tmp_path / "kafka")
    with broker:
        broker.create_topics(["t"])
        producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})
        producer.produce("t", b"before")
        assert producer.flush(10) == 0
        broker.keep(restarts=1, poll_s=0.2)
        first = broker.pid()
        os.kill(first, signal.SIGKILL)
        assert wait_for(lambda: broker.faults, 120)
        assert broker.failure is None and broker.pid() not in (None, first)
        [fault] = broker.faults
        assert fault["event"] == "restarted" and fault["exit_code"] == -signal.SIGKILL
        producer.produce("t", b"after")  # the same client, reconnected
        assert producer.flush(30) == 0
        assert consume(broker.bootstrap, "t", 2, "g") == ["before", "after"]
        # the second exit is one too many: the keeper gives up and says why
        os.kill(broker.pid(), signal.SIGKILL)
        assert wait_for(lambda: broker.failure, 30)
        assert "no restart left" in broker.failure and broker.faults[-1]["event"] == "exited"


def test_a_cluster_node_names_every_voter_and_replicates_every_topic(tmp_path):
    cluster = KafkaCluster(LIBS, tmp_path / "kafka", nodes=3, replication=3, min_insync=2)
    ids = [b.quorum.node_id for b in cluster.brokers]
    assert ids == [1, 2, 3]
    voters = {b.properties["controller.quorum.voters"] for b in cluster.brokers}
    assert len(voters) == 1  # every node names the same three controllers
    (voters,) = voters
    assert [v.split("@")[0] for v in voters.split(",")] == ["1", "2", "3"]
    assert len({b.quorum.cluster_id for b in cluster.brokers}) == 1
    for broker in cluster.brokers:
        props = broker.properties
        assert props["node.id"] == str(broker.quorum.node_id)
        assert props["default.replication.factor"] == "3" and props["min.insync.replicas"] == "2"
        assert props["offsets.topic.replication.factor"] == "3"
        assert broker.quorum.format_options() == []  # a static quorum: no --standalone
        assert broker.log_file.name == f"broker-{broker.quorum.node_id}.log"
    assert len(cluster.bootstrap.split(",")) == 3


@pytest.mark.slow  # make test-testbed's slow tier, for make test's budget (docs/testing.md)
def test_a_clusters_nodes_stopped_one_after_another_all_end_on_sigterm(tmp_path):
    """The last node stopped has no quorum left: with a controlled shutdown it waited for the
    quorum's approval until it was killed (SIGKILL, 30 s later); without, it ends at once."""
    with KafkaCluster(LIBS, tmp_path / "kafka", nodes=3, replication=3, min_insync=2) as cluster:
        cluster.create_topics(["input"], 2)
        for broker in cluster.brokers:  # the worst order: each one waits for the one before
            assert broker.properties["controlled.shutdown.enable"] == "false"
            assert [e["signal"] for e in broker.stop(timeout=30)] == ["SIGTERM"]


def test_a_single_broker_keeps_its_dynamic_quorum_of_one(tmp_path):
    broker = KafkaBroker(LIBS, tmp_path / "kafka")
    assert broker.properties["controller.quorum.bootstrap.servers"].endswith(
        str(broker.controller_port)
    )
    assert broker.quorum.format_options() == ["--standalone"]
    assert broker.properties["min.insync.replicas"] == "1"
    assert broker.log_file.name == "broker.log"


@pytest.mark.parametrize(("nodes", "replication", "min_insync"), [(3, 4, 2), (3, 3, 4), (3, 2, 0)])
def test_a_cluster_that_cannot_hold_its_replicas_is_refused(
    tmp_path, nodes, replication, min_insync
):
    with pytest.raises(BrokerError, match="min in-sync"):
        KafkaCluster(LIBS, tmp_path, nodes, replication, min_insync)


@pytest.mark.slow  # make test-testbed's slow tier, for make test's budget (docs/testing.md)
def test_a_stopped_broker_is_hung_continued_killed_restarted_then_given_up(tmp_path):
    broker = KafkaBroker(LIBS, tmp_path / "kafka")
    with broker:
        broker.create_topics(["t"])
        broker.keep(restarts=1, poll_s=0.2)
        first = broker.pid()
        os.kill(first, signal.SIGSTOP)
        assert wait_for(lambda: broker.faults, 120)
        [fault] = broker.faults
        assert fault["event"] == "restarted" and fault["exit_code"] == -signal.SIGKILL
        assert fault["detail"].startswith(f"{HUNG}: its JVM (pid {first}) is stopped")
        assert broker.failure is None and broker.pid() not in (None, first)
        assert not Path(f"/proc/{first}").exists()
        producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})
        producer.produce("t", b"after")  # it serves again
        assert producer.flush(30) == 0
        # stopped again, with no restart left: killed at once (its clients fail instead of
        # waiting), the failure says why, and stop() reports the kill
        second = broker.pid()
        os.kill(second, signal.SIGSTOP)
        assert wait_for(lambda: broker.failure, 30)
        assert broker.failure.startswith(f"{HUNG}: its JVM (pid {second}) is stopped")
        assert "no restart left (BROKER_RESTARTS=1)" in broker.failure
        assert broker.stop() == [
            {"pid": second, "process": "java", "signal": "SIGKILL", "was_stopped": True,
             "when": "hung"}
        ]  # fmt: skip
        assert broker.stop() == []  # reported once


def test_a_stopped_broker_is_continued_before_it_is_asked_to_stop(tmp_path):
    broker = KafkaBroker(LIBS, tmp_path / "kafka")
    broker.start()
    pid = broker.pid()
    os.kill(pid, signal.SIGSTOP)
    assert wait_for(lambda: is_stopped(pid), 10)  # every thread of the JVM has stopped
    [ended] = broker.stop(timeout=60)
    assert ended == {"pid": pid, "process": "java", "signal": "SIGTERM", "was_stopped": True}
    assert not Path(f"/proc/{pid}").exists()


def test_a_broker_that_does_not_answer_a_metadata_request_is_hung(tmp_path):
    """A listener that takes connections and never answers, as a hung broker does."""
    broker = KafkaBroker(LIBS, tmp_path / "kafka")
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{silent.getsockname()[1]}"})
        broker.process = subprocess.Popen(["sleep", "60"])  # running, not stopped
        broker._keeping.set()  # as while it is kept
        try:
            assert broker.hung(None, 1.0) is None  # not asked: only the state is read
            assert broker.hung(admin, 1.0) == "no answer to a metadata request within 1 s"
        finally:
            broker.process.kill()
            broker.process.wait()
