"""The load's client pairs: CLIENTS pairs of a producers process and its own consumer.

The producer groups are dealt out to the pairs in turn: detector j is in group j mod
PRODUCERS (hvbench_load.producers), and group g in pair g mod CLIENTS. The job answers each
pair on an output topic of its own, so a consumer reads only its own groups' results and
every latency is two stamps of the machine its pair runs on. Pair 0 keeps the topic `output`
(and, alone, is the layout of one pair); it also reads the dead letters.
"""

from __future__ import annotations

OUTPUT = "output"
GROUPS = 6  # producer groups when PRODUCERS is not given (at most one per detector)


def groups(producers: int | None, detectors: int) -> int:
    """The producer groups: PRODUCERS, or six (fewer on a network with fewer detectors)."""
    return producers or min(GROUPS, detectors)


def client_of(index: int, groups: int, clients: int) -> int:
    """The pair of the detector at `index` in its network's order."""
    return index % groups % clients


def output_topic(client: int, base: str = OUTPUT) -> str:
    return base if client == 0 else f"{base}-{client}"


def output_topics(clients: int, base: str = OUTPUT) -> list[str]:
    return [output_topic(k, base) for k in range(clients)]


def clients_by_detector(keys: list[str], groups: int, clients: int) -> dict[str, int]:
    return {key: client_of(j, groups, clients) for j, key in enumerate(keys)}
