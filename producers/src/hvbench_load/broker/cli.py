"""`python -m hvbench_load.broker`: a node (or a cluster's node) as a process of its own, as a
testbed starts it in a guest: it serves until stdin closes or SIGTERM, restarting as asked."""

from __future__ import annotations

import argparse
import gc
import json
import sys
import threading

from hvbench_load.broker.cluster import read_topics, wait_known, wait_registered
from hvbench_load.broker.node import (
    HANG_GUEST_S,
    SERVE_STOP_S,
    BrokerError,
    KafkaBroker,
    Quorum,
    free_ports,
)
from hvbench_load.stopping import stop_on_sigterm


def main(argv: list[str] | None = None) -> int:
    """Serve a broker for a run on another machine: start it, create the topics, print what
    runs (one JSON line), then one JSON line per fault ({"fault": {...}}), and {"restarting":
    true} when a restart begins; stop it on SIGTERM (see hvbench-agent tether). Exits 1 if the
    broker is gone for good (exited or hung, with no restart left).

    In a cluster over several machines (--voters) each node runs this with its own --node-id,
    ports and the cluster's id; the node given --topics creates them once it serves and waits
    until every node of --peers knows them. `--free-ports N` only prints N free ports of --host
    (the harness picks the nodes' ports before any starts)."""
    args = arguments().parse_args(argv)
    if args.free_ports:
        print(json.dumps(free_ports(args.host, args.free_ports)))
        return 0
    stop = threading.Event()
    stop_on_sigterm(stop)
    try:
        broker = node(args)
    except BrokerError as e:
        print(f"broker: {e}", file=sys.stderr)
        return 1
    try:
        broker.start(timeout=300)  # a JVM inside a slow guest takes its time
        described = {**broker.describe(), "node_id": broker.quorum.node_id}
        if args.topics:
            described["topics"] = create(broker, args.topics, args.peers)
        print(json.dumps(described), flush=True)
        # An admin client whose futures were used (the topics created and read back) stays in
        # a reference cycle until Python's collector finds it; librdkafka's destroy then runs
        # in the thread that happens to collect. Once that was this one while the cluster
        # stopped: the destroy waited on nodes already gone, SIGTERM went unanswered past the
        # harness's grace, this process was killed and its JVM left running. Collected now,
        # while every node serves.
        gc.collect()
        broker.keep(args.restarts, hang_s=args.hang_s)
        return serve(broker, stop)
    except BrokerError as e:
        print(f"broker: {e}", file=sys.stderr)
        return 1
    finally:
        broker.stop(SERVE_STOP_S)


def arguments() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m hvbench_load.broker", description=main.__doc__)
    p.add_argument("--libs", help="the Kafka jars")
    p.add_argument("--work", help="configuration, data and log")
    p.add_argument("--host", required=True, help="the address to listen on")
    p.add_argument("--topics", default="", help="comma-separated, each NAME or NAME:PARTITIONS")
    p.add_argument("--restarts", type=int, default=1, help="restarts allowed if it exits")
    p.add_argument(
        "--hang-s",
        type=float,
        default=HANG_GUEST_S,
        help="seconds without an answer to a metadata request that make the broker hung",
    )
    p.add_argument("--free-ports", type=int, default=0, help="print this many free ports")
    p.add_argument("--port", type=int, help="the client port (default: a free one)")
    p.add_argument("--controller-port", type=int, help="the controller port (default: free)")
    p.add_argument("--node-id", type=int, default=1)
    p.add_argument("--voters", help="a cluster's controllers: 1@HOST:PORT,2@HOST:PORT,...")
    p.add_argument("--cluster-id", help="a cluster's id (every node the same)")
    p.add_argument("--replication", type=int, default=1)
    p.add_argument("--min-insync", type=int, default=1)
    p.add_argument("--peers", default="", help="every node's HOST:PORT (with --topics)")
    return p


def node(args: argparse.Namespace) -> KafkaBroker:
    """The broker the command line asks for: alone, or one node of a cluster (--voters)."""
    if not args.libs or not args.work:
        raise BrokerError("--libs and --work are needed to serve a broker")
    quorum = None
    if args.voters:
        if not args.cluster_id or not args.controller_port:
            raise BrokerError("a cluster's node needs --cluster-id and --controller-port")
        voters = Quorum.parse_voters(args.voters)
        quorum = Quorum(args.node_id, voters, args.cluster_id, args.replication, args.min_insync)
    return KafkaBroker(
        args.libs,
        args.work,
        host=args.host,
        port=args.port,
        controller_port=args.controller_port,
        quorum=quorum,
    )


def create(broker: KafkaBroker, topics: str, peers: str) -> dict:
    """Create the topics (NAME or NAME:PARTITIONS); with peers, wait until every node knows
    them. Returns them as the cluster reads them back."""
    bootstraps = peers.split(",") if peers else [broker.bootstrap]
    wait_registered(broker, len(bootstraps), timeout=300)
    for item in topics.split(","):
        name, _, partitions = item.partition(":")
        broker.create_topics([name], int(partitions or 1))
    names = [item.partition(":")[0] for item in topics.split(",")]
    wait_known(bootstraps, names, broker.quorum.replication, timeout=120)
    return read_topics(broker.admin(), names)


def serve(broker: KafkaBroker, stop: threading.Event) -> int:
    """Report faults as they come until asked to stop (0) or the broker is gone (1); a
    restart under way as {"restarting": true} (its fault follows once it is over)."""
    told, restarting = 0, False
    while not stop.wait(0.5):
        if broker.restarting and not restarting:
            print(json.dumps({"restarting": True}), flush=True)
        restarting = broker.restarting
        for fault in broker.faults[told:]:
            print(json.dumps({"fault": fault}), flush=True)
        told = len(broker.faults)
        if broker.failure:
            print(f"broker: {broker.failure}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
