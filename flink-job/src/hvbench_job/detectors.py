"""The six freeway detectors of the reference study and the freeway links between them.

Coordinates and freeways are the study's. Station ids, lane counts and the fundamental-diagram
parameters (free-flow speed, per-lane capacity) are ours: the generator writes data with them
and the router uses them to turn a flow forecast into a speed. Users with real PeMS data map
their own station ids with `Detector.station`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Detector:
    key: str  # short name used in records and on the command line
    name: str
    freeways: tuple[str, ...]  # freeway and direction, e.g. "405S"
    lat: float
    lon: float
    station: int  # PeMS station id written by the generator
    lanes: int
    free_flow_mph: float
    capacity_vphpl: float  # vehicles per hour per lane

    @property
    def freeway(self) -> int:
        """PeMS 'Freeway' field: the detector sits on its first listed freeway."""
        return int(self.freeways[0][:-1])

    @property
    def direction(self) -> str:
        """PeMS 'Direction' field (N, S, E or W)."""
        return self.freeways[0][-1]

    @property
    def capacity_per_5min(self) -> float:
        """Capacity of the whole cross-section in vehicles per 5 minutes (PeMS flow unit)."""
        return self.capacity_vphpl * self.lanes / 12.0


DETECTORS: tuple[Detector, ...] = (
    Detector(
        "el_segundo",
        "El Segundo",
        ("405S", "105E"),
        33.928621,
        -118.368522,
        717001,
        5,
        68.0,
        2000.0,
    ),
    Detector("wilmington", "Wilmington", ("405S",), 33.825757, -118.24005, 717002, 4, 67.0, 1950.0),
    Detector(
        "long_beach",
        "Long Beach",
        ("405S", "710S"),
        33.824173,
        -118.207084,
        717003,
        5,
        66.0,
        2000.0,
    ),
    Detector("athens", "Athens", ("105E", "110N"), 33.928478, -118.284031, 717004, 4, 70.0, 2100.0),
    Detector(
        "lynwood_gardens",
        "Lynwood Gardens",
        ("105E", "710S"),
        33.914156,
        -118.184451,
        717005,
        4,
        69.0,
        2050.0,
    ),
    Detector(
        "east_rancho_dominguez",
        "East Rancho Dominguez",
        ("710S",),
        33.877433,
        -118.192776,
        717006,
        4,
        65.0,
        1900.0,
    ),
)

BY_KEY: dict[str, Detector] = {d.key: d for d in DETECTORS}
BY_STATION: dict[int, Detector] = {d.station: d for d in DETECTORS}

# Directed links along the freeways that join the detectors, in driving direction:
# 405 south from El Segundo by Wilmington to Long Beach; 105 east from El Segundo by Athens to
# Lynwood Gardens; 710 south from Lynwood Gardens by East Rancho Dominguez to Long Beach.
FREEWAY_LINKS: tuple[tuple[str, str, str], ...] = (
    ("el_segundo", "wilmington", "405S"),
    ("wilmington", "long_beach", "405S"),
    ("el_segundo", "athens", "105E"),
    ("athens", "lynwood_gardens", "105E"),
    ("lynwood_gardens", "east_rancho_dominguez", "710S"),
    ("east_rancho_dominguez", "long_beach", "710S"),
)

# Along-freeway length = great-circle length × this factor. We have no road geometry offline;
# freeway runs between these interchanges are nearly straight, and a factor ≥ 1 keeps the
# great-circle distance a lower bound, as on a real road network.
ROAD_CIRCUITY = 1.1

DEFAULT_ORIGIN = "el_segundo"
DEFAULT_DESTINATION = "long_beach"


def detector(key: str) -> Detector:
    try:
        return BY_KEY[key]
    except KeyError:
        raise KeyError(f"unknown detector {key!r}; known: {', '.join(BY_KEY)}") from None
