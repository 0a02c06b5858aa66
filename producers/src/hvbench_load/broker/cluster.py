"""Several nodes as one KRaft cluster (each node broker and controller, a static quorum of all
of them), with topics replicated on every node; and the topic checks both use."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource

from hvbench_load.broker.node import (
    HANG_S,
    KAFKA_VERSION,
    BrokerError,
    KafkaBroker,
    Quorum,
    Spawn,
    free_port,
    java_version,
    new_cluster_id,
)


class KafkaCluster:
    """`nodes` brokers on this machine as one KRaft cluster: each is broker and controller,
    topics are on `replication` nodes and a write with acks=all needs `min_insync` of them.
    Each node has its own work directory (node-1, node-2, ...) and its keeper; a node gone
    for good is the cluster's failure."""

    def __init__(
        self,
        libs: Path | str,
        work_dir: Path | str,
        nodes: int = 3,
        replication: int = 3,
        min_insync: int = 2,
        host: str = "127.0.0.1",
        spawn: Spawn | None = None,
    ) -> None:
        if not 1 <= min_insync <= replication <= nodes:
            raise BrokerError(
                f"need 1 <= min in-sync ({min_insync}) <= replication ({replication}) "
                f"<= nodes ({nodes})"
            )
        self.work_dir = Path(work_dir).resolve()
        controllers = {node: free_port(host) for node in range(1, nodes + 1)}
        voters = {node: f"{host}:{port}" for node, port in controllers.items()}
        cluster_id = new_cluster_id()
        self.brokers = [
            KafkaBroker(
                libs,
                self.work_dir / f"node-{node}",
                host=host,
                controller_port=port,
                quorum=Quorum(node, voters, cluster_id, replication, min_insync),
                spawn=spawn,
            )
            for node, port in controllers.items()
        ]
        self.created: list[str] = []  # the topics made here, which describe() waits for

    @property
    def bootstrap(self) -> str:
        return ",".join(b.bootstrap for b in self.brokers)

    @property
    def faults(self) -> list[dict]:
        return [
            {**fault, "part": f"broker {b.quorum.node_id}"}
            for b in self.brokers
            for fault in b.faults
        ]

    @property
    def failure(self) -> str | None:
        return next(
            (f"node {b.quorum.node_id}: {b.failure}" for b in self.brokers if b.failure), None
        )

    def pids(self) -> list[int]:
        return [pid for broker in self.brokers for pid in broker.pids()]

    @property
    def restarting(self) -> bool:
        return any(b.restarting for b in self.brokers)

    def start(self, timeout: float = 120.0) -> None:
        """Format every node, start them all (a controller waits for a majority of its
        quorum), then wait until each serves."""
        try:
            for broker in self.brokers:
                broker.format(timeout)
            for broker in self.brokers:
                broker.spawn()
            for broker in self.brokers:
                broker.serving(timeout)
        except BrokerError:
            self.stop()
            raise

    def create_topics(self, names: list[str], partitions: int = 1, timeout: float = 60) -> None:
        """Create the topics, then wait until every node knows them (wait_known)."""
        self.brokers[0].create_topics(names, partitions)
        self.created += names
        replicas = self.brokers[0].quorum.replication
        wait_known([b.bootstrap for b in self.brokers], names, replicas, timeout)

    def keep(self, restarts: int, poll_s: float = 0.5, hang_s: float = HANG_S) -> None:
        for broker in self.brokers:
            broker.keep(restarts, poll_s, hang_s)

    def stop(self, timeout: float = 20.0) -> list[dict]:
        """All nodes at once (none does a controlled shutdown: Quorum.properties). What each
        node's stop ended (KafkaBroker.stop)."""
        ended: list[dict] = []

        def stop_node(broker: KafkaBroker) -> None:
            ended.extend(broker.stop(timeout))

        stopping = [
            threading.Thread(target=stop_node, args=(broker,), name=f"stop-node-{i + 1}")
            for i, broker in enumerate(self.brokers)
        ]
        for thread in stopping:
            thread.start()
        for thread in stopping:
            thread.join()
        return ended

    def __enter__(self) -> KafkaCluster:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def describe(self) -> dict:
        """What ran, for meta.json: the nodes, and each topic as the cluster reads it back."""
        first = self.brokers[0]
        return {
            "version": KAFKA_VERSION,
            "bootstrap": self.bootstrap,
            "nodes": [b.describe() for b in self.brokers],
            "replication": first.quorum.replication,
            "min_insync": first.quorum.min_insync,
            "topics": read_topics(first.admin(), self.created),
            "java": java_version(first.java),
        }


def led(topic) -> bool:
    """A topic's metadata names it with partitions, each with a leader."""
    if topic is None or topic.error is not None or not topic.partitions:
        return False
    return all(p.leader >= 0 for p in topic.partitions.values())


def knows(bootstrap: str, names: list[str], replicas: int) -> bool:
    """The node at bootstrap has every partition of the topics with a leader and `replicas`
    in sync."""
    try:
        metadata = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=5)
    except KafkaException:
        return False
    for name in names:
        topic = metadata.topics.get(name)
        if not led(topic) or any(len(p.isrs) < replicas for p in topic.partitions.values()):
            return False
    return True


def wait_known(bootstraps: list[str], names: list[str], replicas: int, timeout: float) -> None:
    """Until every node knows each partition's leader and every replica is in sync: before
    that, a node answers for the topics with "unknown"."""
    deadline = time.monotonic() + timeout
    while not all(knows(b, names, replicas) for b in bootstraps):
        if time.monotonic() > deadline:
            raise BrokerError(f"topics {names} not on every node after {timeout:.0f} s")
        time.sleep(0.2)


def wait_registered(broker: KafkaBroker, count: int, timeout: float) -> None:
    """Until `count` brokers are registered with the cluster: a topic replicated on them
    cannot be created before (the other nodes may still be starting)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if len(broker.admin().list_topics(timeout=5).brokers) >= count:
                return
        except KafkaException:
            pass
        if time.monotonic() > deadline:
            raise BrokerError(f"fewer than {count} brokers registered after {timeout:.0f} s")
        time.sleep(0.5)


def read_topics(admin: AdminClient, created: list[str] | None = None, timeout: float = 60) -> dict:
    """Each topic's partitions (leader, replicas, in-sync) and min.insync.replicas, read back
    from the cluster. `created`: topics just made, read again until the answer has each with a
    leader for every partition. A new topic reaches the nodes one by one, and a client's
    request may be answered by any node it has learned of, not only the one it was given: once,
    under load, a cluster's description lacked a topic every node had been seen to know."""
    deadline = time.monotonic() + timeout
    while True:
        metadata = admin.list_topics(timeout=10)
        missing = [name for name in created or [] if not led(metadata.topics.get(name))]
        if not missing:
            break
        if time.monotonic() > deadline:
            raise BrokerError(f"topics {missing} not in the cluster's answer after {timeout:.0f} s")
        time.sleep(0.2)
    names = sorted(t for t in metadata.topics if not t.startswith("__"))
    resources = [ConfigResource(ConfigResource.Type.TOPIC, name) for name in names]
    configs = {r.name: f.result(timeout=30) for r, f in admin.describe_configs(resources).items()}
    return {
        name: {
            "min_insync_replicas": configs[name]["min.insync.replicas"].value,
            "partitions": [
                {"partition": p.id, "leader": p.leader, "replicas": p.replicas, "isr": p.isrs}
                for p in sorted(metadata.topics[name].partitions.values(), key=lambda p: p.id)
            ],
        }
        for name in names
    }
