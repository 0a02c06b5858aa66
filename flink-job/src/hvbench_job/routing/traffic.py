"""From a flow forecast and a measured speed to an expected speed: the traffic model.

We use Greenshields' fundamental diagram, q = k_j·v·(1 − v/v_f), whose capacity
q_max = k_j·v_f/4 is reached at the critical speed v_f/2. Solved for speed it has two branches,

    v = v_f/2 · (1 ± sqrt(1 − q/q_max)),

free flow (+) and congestion (−): the same flow occurs on an empty and on a jammed road. A flow
forecast alone therefore cannot give a speed, but the measured average speed tells which branch
the road is on (above or below v_f/2), and the forecast flow then places it on that branch.
This is why the model uses both inputs. It is the textbook diagram, it has one parameter per
detector besides capacity, and the generator draws its speeds from the same relation, so the
router's model and the data agree.

The expected speed is clamped to [MIN_SPEED_MPH, v_f]: never faster than free flow (which keeps
the routing heuristic admissible) and never zero (a jam still moves, and costs stay finite).
"""

from __future__ import annotations

import math

MPH_TO_MPS = 0.44704
MIN_SPEED_MPH = 5.0


def expected_speed_mph(
    measured_speed_mph: float,
    predicted_flow: float,
    free_flow_mph: float,
    capacity: float,
) -> float:
    """Expected speed over the next interval.

    `predicted_flow` and `capacity` share a unit (vehicles per 5 minutes for PeMS data). A
    missing measured speed (NaN) is taken as free flowing.
    """
    if not math.isfinite(predicted_flow) or predicted_flow < 0:
        raise ValueError(f"predicted flow must be finite and >= 0, got {predicted_flow!r}")
    if free_flow_mph <= 0 or capacity <= 0:
        raise ValueError("free-flow speed and capacity must be positive")
    critical = free_flow_mph / 2.0
    congested = measured_speed_mph < critical  # False for NaN
    root = math.sqrt(1.0 - min(predicted_flow / capacity, 1.0))
    speed = critical * (1.0 - root if congested else 1.0 + root)
    return min(max(speed, MIN_SPEED_MPH), free_flow_mph)


def greenshields_flow(speed_mph: float, free_flow_mph: float, capacity: float) -> float:
    """Flow at a given speed (the inverse of either branch), in the unit of `capacity`."""
    v = min(max(speed_mph, 0.0), free_flow_mph) / free_flow_mph
    return 4.0 * capacity * v * (1.0 - v)
