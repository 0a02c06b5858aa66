"""A single-node Kafka broker (KRaft: broker and controller in one JVM), started and stopped here.

The jars come from Maven Central (`make kafka`, see producers/kafka/pom.xml). Each broker gets a
fresh work directory: its configuration, its data and its log live there, so a run starts from
empty topics and leaves its broker log behind for inspection.

`keep(restarts)` watches the broker while a run needs it: if it exits, it is started again on
the same ports and data (up to `restarts` times) and each exit is recorded in `faults`; past
that, `failure` says why and the run ends. A broker that still runs but is hung counts as one
that exited: its JVM stopped (SIGSTOP), or no answer to a metadata request (asked every
CHECK_S seconds) within `hang_s` seconds. It is continued and killed before its restart; with
no restart left, `failure` says "Kafka does not answer (hung)" and why.

`KafkaCluster` starts several such brokers as one KRaft cluster (each node broker and
controller, a static quorum of all of them), with topics replicated on every node.
"""

from hvbench_load.broker.cluster import (  # noqa: F401
    KafkaCluster,
    knows,
    led,
    read_topics,
    wait_known,
    wait_registered,
)
from hvbench_load.broker.node import (  # noqa: F401
    DEFAULT_JVM_OPTS,
    FORMAT_JVM_OPTS,
    HUNG,
    KAFKA_VERSION,
    LOG4J2,
    SERVE_STOP_S,
    BrokerError,
    KafkaBroker,
    Quorum,
    free_port,
    free_ports,
    is_stopped,
    java_version,
    new_cluster_id,
    replication_properties,
)
